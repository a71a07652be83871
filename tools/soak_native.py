"""The soak's C pair: unmodified C verbs programs on the soak's daemons, through the
libibverbs provider, each started with ``softhca run --target <the daemon's UNIX socket>``
(tools/native.py), in turn, for as long as the soak runs:

- ``ibv_rc_pingpong -g 0 -c``: its server on the target daemon, its client on the
  initiator's, so their RC traffic crosses the daemons' wire link beside the soak's
  Python pair; each side must exit 0, print the byte and iteration counts its
  arguments give (2 x size x iters bytes), and ``-c`` must find no invalid page;
- ``memcheck transfer`` (provider/tests/memcheck.c) on the target daemon: two processes
  RDMA_WRITE, SEND and RDMA_READ between malloc'ed buffers and check every byte, and
  the bytes around each target; the bytes it says it checked (``N bytes ... (0
  differ)``) are what the report counts as checked.

Every program started is killed (its process group) and reaped on every way out: its
hang past ``RUN_TIMEOUT``, the soak's end or cancellation, an error; and it gets SIGKILL
when the soak's process dies (PR_SET_PDEATHSIG), which softhca run passes on to its
program.

``softhca run`` makes a mount namespace, so this needs root and a built provider; when
either is missing ``unavailable`` says why and the soak runs without the pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
from dataclasses import dataclass, field

from .native import PROVIDER_DIR, PROVIDER_LIB, die_with_parent

MEMCHECK = PROVIDER_DIR / "memcheck"
PINGPONG_SIZE, PINGPONG_ITERS = 4096, 200
# A program that takes longer than this has hung: counted as a failure and killed.
RUN_TIMEOUT = 60.0
# How long a killed program's process group may take to be reaped.
REAP_TIMEOUT = 10.0
_BYTES = re.compile(r"^(\d+) bytes in [\d.]+ seconds", re.M)
_CHECKED = re.compile(r"^memcheck: ok: .*?(\d+) bytes.*\(0 differ\)$", re.M)


@dataclass
class CPairReport:
    runs: dict[str, int] = field(default_factory=dict)     # program -> runs
    failures: list[str] = field(default_factory=list)
    bytes_checked: int = 0
    bytes_moved: int = 0
    skipped: str = ""

    @property
    def total(self) -> int:
        return sum(self.runs.values())

    def as_dict(self) -> dict:
        return {"runs": dict(self.runs), "total": self.total, "failures": self.failures,
                "bytes_checked": self.bytes_checked, "bytes_moved": self.bytes_moved,
                "skipped": self.skipped}

    def text(self) -> str:
        if self.skipped:
            return f"C pair: skipped ({self.skipped})"
        each = ", ".join(f"{k} {v}" for k, v in sorted(self.runs.items()))
        return (f"C pair: {self.total} runs ({each}), {len(self.failures)} failed, "
                f"{self.bytes_checked} bytes checked by memcheck, {self.bytes_moved} bytes "
                "moved by ibv_rc_pingpong")


def unavailable() -> str:
    """Why the C pair cannot run here ("" when it can)."""
    if os.geteuid() != 0:
        return "softhca run needs root for its mount namespace"
    if not (PROVIDER_DIR / PROVIDER_LIB).is_file() or not MEMCHECK.is_file():
        return f"the provider is not built ({PROVIDER_DIR}): make provider"
    for prog in ("unshare", "ibv_rc_pingpong"):
        if shutil.which(prog) is None:
            return f"{prog} is not installed"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    """Whether a TCP socket listens on ``port`` (/proc/net/tcp): asked without connecting,
    which would take the one connection ibv_rc_pingpong's server accepts."""
    want = f":{port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            return any(line.split()[1].endswith(want) and line.split()[3] == "0A"
                       for line in f.readlines()[1:])
    except OSError:
        return False


class CPair:
    """Runs the programs in turn on ``sockets`` (the target's, then the initiator's)."""

    def __init__(self, sockets: list[str], report: CPairReport,
                 start_lock: asyncio.Lock) -> None:
        self.target_sock, self.initiator_sock = sockets
        self.report = report
        # Held while a program runs (when it connects is its own business); an attack
        # that would evict a connection before its HELLO (a flood of idle ones) holds
        # it meanwhile.
        self.start_lock = start_lock
        self.live: set[asyncio.subprocess.Process] = set()     # started, not yet reaped

    def command(self, sock: str, argv: tuple[str, ...]) -> list[str]:
        """The command line that runs ``argv`` on the daemon at ``sock``."""
        return [sys.executable, "-m", "softhca.tools.cli", "run", "--target", sock, "--",
                *argv]

    async def _start(self, sock: str, *argv: str) -> asyncio.subprocess.Process:
        # A session of its own (the process group _kill signals), and SIGKILL when the
        # soak dies, however it dies (softhca run takes its program down with it): a
        # soak killed by its caller's timeout left a pingpong spinning on CQs of daemons
        # long gone.
        proc = await asyncio.create_subprocess_exec(
            *self.command(sock, argv),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent)
        self.live.add(proc)
        return proc

    def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """SIGKILL to ``proc``'s process group, unless it has been reaped."""
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    async def _reap(self, proc: asyncio.subprocess.Process) -> None:
        """``proc`` killed (if still running) and waited for."""
        self._kill(proc)
        try:
            await asyncio.wait_for(proc.wait(), REAP_TIMEOUT)
        finally:
            self.live.discard(proc)

    async def _finish(self, proc: asyncio.subprocess.Process) -> tuple[int, str]:
        """Its exit status and output; on every way out (a hang past RUN_TIMEOUT, the
        soak's cancellation, an error) it is killed and reaped."""
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
        except asyncio.TimeoutError:
            self._kill(proc)
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), REAP_TIMEOUT)
            except asyncio.TimeoutError:
                out = b""
            return -1, out.decode(errors="replace") + f"\n(killed after {RUN_TIMEOUT:g} s)"
        finally:
            await self._reap(proc)
        return proc.returncode, out.decode(errors="replace")

    async def pingpong(self) -> None:
        r = self.report
        port = _free_port()
        common = ["ibv_rc_pingpong", "-g", "0", "-c", "-p", str(port), "-s",
                  str(PINGPONG_SIZE), "-n", str(PINGPONG_ITERS)]
        async with self.start_lock:
            server = await self._start(self.target_sock, *common)
            try:
                loop = asyncio.get_running_loop()
                end = loop.time() + 20
                while not _listening(port) and server.returncode is None \
                        and loop.time() < end:
                    await asyncio.sleep(0.05)
                client = await self._start(self.initiator_sock, *common, "127.0.0.1")
                (src, sout), (crc, cout) = await asyncio.gather(self._finish(server),
                                                                self._finish(client))
            finally:
                # the server when the client never started (no _finish reaps it)
                if server in self.live:
                    await self._reap(server)
        want = 2 * PINGPONG_SIZE * PINGPONG_ITERS
        r.runs["ibv_rc_pingpong"] = r.runs.get("ibv_rc_pingpong", 0) + 1
        for who, rc, out in (("server", src, sout), ("client", crc, cout)):
            m = _BYTES.search(out)
            if rc != 0 or not m or int(m.group(1)) != want or "invalid data" in out:
                r.failures.append(f"ibv_rc_pingpong {who} exit {rc}: "
                                  f"{out.strip().splitlines()[-3:]}")
                return
        r.bytes_moved += want

    async def memcheck(self) -> None:
        r = self.report
        async with self.start_lock:
            proc = await self._start(self.target_sock, str(MEMCHECK), "transfer")
            rc, out = await self._finish(proc)
        r.runs["memcheck"] = r.runs.get("memcheck", 0) + 1
        checked = [int(n) for n in _CHECKED.findall(out)]
        # Three transfers, each with the bytes around its target: six checks.
        if rc != 0 or len(checked) != 6:
            r.failures.append(f"memcheck transfer exit {rc}: {out.strip().splitlines()[-3:]}")
            return
        r.bytes_checked += sum(checked)

    async def loop(self, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        k = 0
        try:
            # Past the deadline until each program has run once (a loaded machine too).
            while loop.time() < deadline or k < 2:
                await (self.pingpong() if k % 2 == 0 else self.memcheck())
                k += 1
                await asyncio.sleep(0.2)
        finally:
            for proc in list(self.live):
                self._kill(proc)
            for proc in list(self.live):
                await self._reap(proc)


__all__ = ["CPair", "CPairReport", "unavailable"]
