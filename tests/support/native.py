"""Running Debian's unmodified verbs programs on softhca (``softhca run``), one per side,
each with its own embedded daemon: in two network namespaces joined by a veth pair
(tests/support/netns.py) where they can be made, else both on loopback.

``unavailable()`` says why these tests cannot run here (a skip reason): they need root
(a mount namespace for the device nodes), the provider built by ``make provider``, and
the Debian programs (the Makefile installs them when root).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import netns
import pytest

REPO = Path(__file__).resolve().parents[2]
PROVIDER = REPO / "provider" / "build" / "libsofthca-rdmav34.so"
MEMCHECK = REPO / "provider" / "build" / "memcheck"
MWCHECK = REPO / "provider" / "build" / "mwcheck"
POSTCHECK = REPO / "provider" / "build" / "postcheck"
WQCHECK = REPO / "provider" / "build" / "wqcheck"
DVCHECK = REPO / "provider" / "build" / "dvcheck"
LIBMLX5 = REPO / "provider" / "build" / "libmlx5.so.1"
PROGRAM_TIMEOUT = 120.0


def free_port() -> int:
    """A TCP port free here (and so in a new network namespace too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unavailable(*programs: str) -> str | None:
    if not sys.platform.startswith("linux"):
        return "the provider is for Linux's libibverbs"
    if os.geteuid() != 0:
        return ("needs root: softhca run makes the device nodes in a private mount "
                f"namespace (CI runs as root); running as uid {os.geteuid()}")
    if shutil.which("unshare") is None:
        return "util-linux's unshare is not installed"
    if not PROVIDER.is_file():
        return f"the provider is not built ({PROVIDER}): `make provider` builds it"
    missing = [p for p in programs if shutil.which(p) is None]
    if missing:
        return (f"{', '.join(missing)} not installed (Debian packages of the Makefile's "
                "NATIVE_PKGS: `make provider` installs them as root)")
    return None


@dataclass
class Side:
    """Where one program runs: a network namespace (or None: this one) and the address
    its daemon listens on, which its GID carries."""

    ns: str | None
    addr: str


@dataclass
class Done:
    argv: list[str]
    returncode: int
    output: str


class Place:
    """Two sides: ``server`` and ``client`` (the client reaches the server's programs at
    ``server.addr``)."""

    def __init__(self, server: Side, client: Side, kind: str, peer_token_file: Path) -> None:
        self.server, self.client, self.kind = server, client, kind
        # Both sides' daemons prove this token on their wire links (softhca run
        # --peer-token-file): a daemon's own generated one would refuse the other.
        self.peer_token_file = peer_token_file

    @staticmethod
    def exec_argv(side: Side, argv: Sequence[str]) -> list[str]:
        """``argv`` run on ``side``'s network namespace."""
        return ["ip", "netns", "exec", side.ns, *argv] if side.ns else list(argv)

    def argv(self, side: Side, program: Sequence[str], *, run_args: Sequence[str] = (),
             port: int = 0) -> list[str]:
        cmd = [sys.executable, "-m", "softhca.tools.cli", "run", "--listen",
               f"{side.addr}:{port}", "--peer-token-file", str(self.peer_token_file),
               *run_args, "--", *program]
        return self.exec_argv(side, cmd)

    def run(self, side: Side, program: Sequence[str], *, run_args: Sequence[str] = (),
            port: int = 0, timeout: float = PROGRAM_TIMEOUT) -> Done:
        argv = self.argv(side, program, run_args=run_args, port=port)
        proc = _start(argv, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            _reap(proc)
        return Done(argv, proc.returncode, out + err)

    def pair(self, server_prog: Sequence[str], client_prog: Sequence[str], tcp_port: int, *,
             server_run_args: Sequence[str] = (), client_run_args: Sequence[str] = (),
             timeout: float = PROGRAM_TIMEOUT,
             on_listening: Callable[[], None] | None = None,
             wire_port: int = 0) -> tuple[Done, Done]:
        """The server program, then, once it listens on ``tcp_port`` for its peer's
        address exchange (and ``on_listening`` has looked at it), the client; both
        waited for. ``wire_port``: both daemons' wire port, which rdma_cm programs need
        (an address names the daemon on this daemon's own port); 0, one each.

        The client's ``softhca run`` (its start-up, its daemon, its namespace: a second
        or more on a loaded machine) starts beside the server's; only its program waits,
        under it, for the line this sends once the server listens (GATE)."""
        argv = self.argv(self.server, server_prog, run_args=server_run_args, port=wire_port)
        srv = _start(argv, stderr=subprocess.STDOUT)
        cli = None
        try:
            cli = self.gated(self.client, client_prog, run_args=client_run_args,
                             port=wire_port)
            wait_listening(srv, tcp_port, timeout=30)
            if on_listening is not None:
                on_listening()
            done = self.release(cli, timeout)
            out, _ = srv.communicate(timeout=timeout)
        finally:
            if cli is not None:
                _reap(cli)
            _reap(srv)
        return Done(argv, srv.returncode, out), done

    def gated(self, side: Side, program: Sequence[str], *, run_args: Sequence[str] = (),
              port: int = 0) -> subprocess.Popen:
        """``program``'s ``softhca run`` on ``side``, started now, its program waiting
        under it (GATE) until ``release``: the start-up of a client's softhca run goes
        on while its server's comes up, instead of after it."""
        argv = self.argv(side, [*GATE, *program], run_args=run_args, port=port)
        return _start(argv, stderr=subprocess.PIPE, stdin=subprocess.PIPE)

    @staticmethod
    def release(proc: subprocess.Popen, timeout: float) -> Done:
        """Lets a ``gated`` program run; its exit and output (collected, not reaped: the
        caller's ``_reap`` ends what is left of it)."""
        out, err = proc.communicate(input="go\n", timeout=timeout)
        return Done(list(proc.args), proc.returncode, out + (err or ""))


# A client program's gate (Place.pair): the shell reads one line from its stdin, which
# softhca run passes on to the program, then becomes the program (exec: same process,
# same argv from then on); a closed stdin without the line (the test gave up) ends it.
GATE = ["sh", "-c", 'read -r _ || exit 125; exec "$@"', "gate"]


def processes_of(program: str, *args: str) -> list[int]:
    """The pids of the running processes whose argv is ``program`` followed by ``args``
    among its arguments (a program under ``softhca run``, found by its command line)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if words and Path(words[0]).name == program and all(a in words for a in args):
            pids.append(int(d.name))
    return pids


def _start(argv: list[str], *, stderr: int, stdin: int | None = None) -> subprocess.Popen:
    """``argv`` in a process group of its own, so that ``_reap`` ends everything it
    started: ``ip netns exec``, ``softhca run`` and the program under it."""
    return subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr,
                            text=True, cwd=REPO, start_new_session=True)


def _reap(proc: subprocess.Popen) -> None:
    """Kill what is left of ``proc``'s process group and collect it. A program that
    outlived its parent would otherwise hold the output pipe open, and the test would
    wait on it for good instead of failing."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired, ValueError):
        proc.communicate(timeout=10)


def _listening(pid: int, port: int) -> bool:
    """True when a socket in ``pid``'s network namespace listens on TCP ``port``."""
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


def wait_listening(proc: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _listening(proc.pid, port):
        if proc.poll() is not None:
            out, _ = proc.communicate()
            raise AssertionError(f"the server exited ({proc.returncode}) before listening "
                                 f"on {port}:\n{out}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not listen on {port} within {timeout} s")
        time.sleep(0.05)


@contextlib.contextmanager
def place(workdir: Path) -> Iterator[Place]:
    """Two network namespaces when they can be made here, else loopback."""
    token = workdir / "peer-token"
    token.write_bytes(secrets.token_hex(32).encode() + b"\n")
    token.chmod(0o600)
    if netns.unavailable() is None:
        with netns.two_node_topology(workdir, daemon=False) as t:
            yield Place(Side(t.target_ns, t.target_addr), Side(t.initiator_ns, t.initiator_addr),
                        "netns", token)
    else:
        yield Place(Side(None, "127.0.0.1"), Side(None, "127.0.0.1"), "loopback", token)


@contextlib.contextmanager
def cm_place(workdir: Path, *programs: str) -> Iterator[Place]:
    """Two network namespaces for rdma_cm programs, whose two daemons listen on one wire
    port, which two daemons on loopback cannot; the test is skipped, saying why, where
    they cannot be made or ``programs`` are missing."""
    why = unavailable(*programs)
    if why:
        pytest.skip(why)
    with place(workdir) as p:
        if p.kind != "netns":
            pytest.skip("needs two network namespaces: both daemons listen on one wire "
                        "port, which two daemons on loopback cannot")
        yield p


def line_tool(name: str, *, needs: Sequence[tuple[Path, str]] = ()) -> Callable[[list[str]], list[str]]:
    """Builds provider/tests/<name>.c (``make -C provider build/<name>``) and gives a
    function: lines of commands in, lines of answers out, one run of the program, one
    answer a command. Skips when make or cc is missing, or a path in ``needs`` (path,
    reason) is."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip(f"no make or cc: provider/tests/{name}.c cannot be built")
    for path, reason in needs:
        if not path.exists():
            pytest.skip(reason)
    built = subprocess.run(["make", "-s", "-C", str(REPO / "provider"), f"build/{name}"],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    program = REPO / "provider" / "build" / name

    def run(commands: list[str]) -> list[str]:
        done = subprocess.run([str(program)], input="\n".join(commands) + "\n",
                              capture_output=True, text=True, timeout=120,
                              env={"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0",
                                   "UBSAN_OPTIONS": "print_stacktrace=1"})
        assert done.returncode == 0, done.stderr[-3000:]
        out = done.stdout.splitlines()
        assert len(out) == len(commands), done.stderr[-3000:]
        return out

    return run


def read_until(proc: subprocess.Popen, marker: str, timeout: float) -> str:
    """The process's output up to the line ``marker`` (or its exit, or the time-out)."""
    seen = ""
    deadline = time.monotonic() + timeout
    while marker not in seen and proc.poll() is None and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
            if not chunk:
                break
            seen += chunk
    return seen


def crc16_t10dif(data: bytes, seed: int) -> int:
    """CRC-16/T10-DIF bit by bit (polynomial 0x8BB7, MSB first, no reflection, no final
    xor), the register starting at ``seed`` (mlx5dv_sig_t10dif's bg): written out here,
    apart from crcmod and from anything of softhca's, to check the PIs programs print."""
    crc = seed
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8BB7) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc
