"""``softhca serve`` processes and other helper processes, started on loopback and always
ended: the daemons the bench and the soak drive, and the ready files they announce their
ports in."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time

READY_TIMEOUT = 30.0


# The processes a command starts are ended by it (stop_all, in a ``finally``), never by
# the terminal: in a session of their own, a Ctrl-C reaches the command alone, which
# prints its one line and stops them, instead of each child answering with a traceback.
OWN_SESSION = {"start_new_session": True}


class ProcessError(RuntimeError):
    """A process did not start (it exited early, or was not ready in time)."""


def wait_file(path: str, procs: list[subprocess.Popen], what: str,
               timeout: float = READY_TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                text = f.read()
            if text.endswith("\n"):
                return text.strip()
        except FileNotFoundError:
            pass
        for p in procs:
            if p.poll() is not None:
                raise ProcessError(f"{what} exited with status {p.returncode} before it was ready")
        time.sleep(0.02)
    raise ProcessError(f"{what} was not ready within {timeout:g} s")


def stop_all(procs: list[subprocess.Popen]) -> None:
    """End the processes this bench started: SIGTERM, then SIGKILL after a grace period."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait()



class Daemons:
    """``softhca serve`` processes on loopback port 0 (``with Daemons(2, dir) as addrs``);
    leaving the block ends them, whatever happened inside."""

    def __init__(self, n: int, workdir: str, extra: tuple[str, ...] = (),
                 unix: bool = False) -> None:
        self.n, self.workdir, self.extra = n, workdir, extra
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        # With ``unix``, daemon i also serves local programs on workdir/daemonI.sock.
        self.sockets = [os.path.join(workdir, f"daemon{i}.sock") for i in range(n)] \
            if unix else []

    def __enter__(self) -> list[str]:
        try:
            # One peer token for the daemons started here, so that they link to each
            # other (a daemon given none makes its own and takes no other's links).
            peer = os.path.join(self.workdir, "peer_token")
            fd = os.open(peer, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            addresses = []
            for i in range(self.n):
                ready = os.path.join(self.workdir, f"daemon{i}.ready")
                log_path = os.path.join(self.workdir, f"daemon{i}.log")
                self.logs.append(log_path)
                with open(log_path, "wb") as log_file:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-m", "softhca.tools.cli", "serve",
                         "--listen", "127.0.0.1:0", "--ready-file", ready,
                         "--log-level", "warning", "--peer-token-file", peer,
                         *(("--unix", self.sockets[i]) if self.sockets else ()), *self.extra],
                        stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                        **OWN_SESSION))
                addresses.append(wait_file(ready, self.procs[-1:], f"daemon {i}"))
            return addresses
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        stop_all(self.procs)

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 5) -> str:
        out = []
        for path in self.logs:
            with contextlib.suppress(OSError), open(path, errors="replace") as f:
                out += [f"{os.path.basename(path)}: {line.rstrip()}"
                        for line in f.readlines()[-lines:]]
        return "\n".join(out)


