"""Two network namespaces joined by a veth pair, for ``softhca bench --c``.

    namespace shcb-srv-<pid>-<k>                  namespace shcb-cli-<pid>-<k>
      lo up                                         lo up
      shb<pid>s<k>  10.201.0.1/24  <---- veth ---->  shb<pid>c<k>  10.201.0.2/24

Each side's programs run as ``ip netns exec NS softhca run --listen ADDR:4791 -- PROG``:
its own embedded daemon on the side's address, both on one wire port as rdma_cm needs
(an address names the daemon on this daemon's own port). The same namespaces carry the
kernel TCP ceilings. Every name carries this process's id and a counter; on the way out
(whatever the body raised) each process started is killed by its process group, then
anything still in the two namespaces by pid, then the namespaces are deleted by name.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SERVER_ADDR = "10.201.0.1"
CLIENT_ADDR = "10.201.0.2"
PREFIX_LEN = 24
# Both daemons' wire port: RoCE's UDP port number, one port per fabric as rdma_cm needs.
WIRE_PORT = 4791
LISTEN_TIMEOUT = 30.0

_counter = itertools.count()


class NamespaceError(RuntimeError):
    """The namespaces, or a program in them, could not be set up; the message says why."""


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NamespaceError(f"{' '.join(cmd)}: {e}") from None
    if check and r.returncode:
        raise NamespaceError(f"{' '.join(cmd)}: {r.stderr.strip() or f'exit {r.returncode}'}")
    return r


def unavailable() -> str | None:
    """Why the two namespaces cannot be made here, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root (network namespaces, and softhca run's mount namespace)"
    missing = [p for p in ("ip", "unshare") if shutil.which(p) is None]
    return f"{', '.join(missing)} not installed" if missing else None


@dataclass
class Finished:
    argv: list[str]
    returncode: int
    output: str


@dataclass
class Pair:
    """The two namespaces: ``server`` and ``client`` (name, address) and the peer token
    both daemons prove on their wire link."""

    server: tuple[str, str]
    client: tuple[str, str]
    token: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def argv(self, side: tuple[str, str], program: Sequence[str]) -> list[str]:
        ns, addr = side
        return ["ip", "netns", "exec", ns, sys.executable, "-m", "softhca.tools.cli", "run",
                "--listen", f"{addr}:{WIRE_PORT}", "--peer-token-file", str(self.token),
                "--", *program]

    def start(self, side: tuple[str, str], program: Sequence[str]) -> subprocess.Popen:
        # A process group of its own: ip netns exec, softhca run and the program under it
        # all end with one killpg.
        proc = subprocess.Popen(self.argv(side, program), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, start_new_session=True)
        self.procs.append(proc)
        return proc


def finish(proc: subprocess.Popen, timeout: float) -> Finished:
    """``proc``'s output and status once it ends; killed after ``timeout`` seconds."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, _ = proc.communicate()
        out += f"\n[killed: it ran over {timeout:g} s]\n"
    return Finished(proc.args, proc.returncode, out)


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def listening(pid: int, port: int) -> bool:
    """A socket of ``pid``'s network namespace listens on TCP ``port``."""
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        if any(f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port
               for f in (line.split() for line in lines)):
            return True
    return False


def wait_listening(proc: subprocess.Popen, port: int) -> None:
    deadline = time.monotonic() + LISTEN_TIMEOUT
    while not listening(proc.pid, port):
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill(proc)
            out = proc.communicate()[0]
            raise NamespaceError(f"{proc.args[-1] if proc.args else 'the server'} did not "
                                 f"listen on {port} (exit {proc.returncode}): {out[-400:]}")
        time.sleep(0.05)


def wait_file(proc: subprocess.Popen, path: Path) -> None:
    """Until ``path`` exists (a script's sign that it is set up), while ``proc`` runs."""
    deadline = time.monotonic() + LISTEN_TIMEOUT
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill(proc)
            out = proc.communicate()[0]
            raise NamespaceError(f"the server side did not make {path.name} (exit "
                                 f"{proc.returncode}): {out[-400:]}")
        time.sleep(0.05)


def _pids_in(ns: str) -> list[int]:
    out = ip("netns", "pids", ns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


@contextlib.contextmanager
def two_namespaces() -> Iterator[Pair]:
    """The namespaces, the veth pair and a peer token; all removed on the way out."""
    pid, k = os.getpid(), next(_counter)
    names = (f"shcb-srv-{pid}-{k}", f"shcb-cli-{pid}-{k}")
    veths = (f"shb{pid}s{k}", f"shb{pid}c{k}")
    with tempfile.TemporaryDirectory(prefix="softhca-bench-c-") as tmp:
        token = Path(tmp) / "peer-token"
        token.write_text(secrets.token_hex(32) + "\n")
        token.chmod(0o600)
        pair = Pair((names[0], SERVER_ADDR), (names[1], CLIENT_ADDR), token)
        try:
            _build(names, veths)
            yield pair
        finally:
            _teardown(pair, names)


def _build(names: tuple[str, str], veths: tuple[str, str]) -> None:
    for ns in names:
        ip("netns", "add", ns)
    # Both ends made inside their namespaces: nothing ever sits in the root one.
    ip("link", "add", veths[0], "netns", names[0], "type", "veth", "peer", "name", veths[1],
       "netns", names[1])
    for ns, dev, addr in zip(names, veths, (SERVER_ADDR, CLIENT_ADDR), strict=True):
        ip("addr", "add", f"{addr}/{PREFIX_LEN}", "dev", dev, ns=ns)
        ip("link", "set", dev, "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)


def _teardown(pair: Pair, names: tuple[str, str]) -> None:
    for proc in pair.procs:
        if proc.poll() is None:
            _kill(proc)
        with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
            proc.communicate(timeout=10)
    # Whatever is left inside the two namespaces was started here.
    for ns in names:
        for p in _pids_in(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    for ns in names:
        ip("netns", "del", ns, check=False)
