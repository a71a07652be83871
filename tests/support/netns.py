"""The compose topology (docker/compose.yaml) without Docker: two network namespaces.

``two_node_topology()`` builds what ``docker compose up`` builds, out of Linux network
namespaces and a veth pair:

    namespace shca-tgt-<pid>-<k>            namespace shca-ini-<pid>-<k>
      lo up                                   lo up
      shv<pid>t<k>  10.200.0.1/24  <-veth->   shv<pid>i<k>  10.200.0.2/24
      softhca serve --listen 10.200.0.1:4791  python -m pytest -m twonode tests/twonode
                    --token-file ...            (SOFTHCA_TARGET=10.200.0.1:4791)

Every name carries this process's id and a counter, so runs in parallel do not meet,
and teardown removes exactly these names: the daemon (and anything else still running
inside the two namespaces, all started here) is stopped by its pid, the veth pair
deleted, the namespaces deleted. It runs in a ``finally``, whatever the body raised.
``Topology.leftovers()`` says what, of all that, still exists (nothing, after teardown).

Needs root and a working ``ip netns`` (``unavailable()`` says why not, for a skip).
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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_ADDR = "10.200.0.1"
INITIATOR_ADDR = "10.200.0.2"
PREFIX_LEN = 24
PORT = 4791
READY_TIMEOUT = 20.0

_counter = itertools.count()


class NetnsError(RuntimeError):
    pass


def ip(*args: str, ns: str | None = None, check: bool = True,
       timeout: float = 10.0) -> subprocess.CompletedProcess:
    """One ``ip`` command (in namespace ``ns`` when given); NetnsError when it fails."""
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NetnsError(f"{' '.join(cmd)}: {e}") from None
    if check and r.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)}: {r.stderr.strip() or f'exit {r.returncode}'}")
    return r


def namespaces() -> set[str]:
    """Names ``ip netns list`` shows."""
    out = ip("netns", "list", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def unavailable() -> str | None:
    """Why the topology cannot be built here (a skip reason), or None when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return ("needs root for `ip netns add` and a veth pair (CI runs as root); "
                f"running as uid {os.geteuid()}")
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not installed"
    probe = f"shca-probe-{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except NetnsError as e:
        return f"`ip netns add` does not work here: {e}"
    try:
        ip("link", "add", "shcaprobe0", "type", "veth", "peer", "name", "shcaprobe1", ns=probe)
    except NetnsError as e:
        return f"cannot create a veth pair: {e}"
    finally:
        ip("netns", "del", probe, check=False)
    return None


@dataclass
class RunResult:
    argv: list[str]
    returncode: int
    output: str
    seconds: float


@dataclass
class Topology:
    target_ns: str
    initiator_ns: str
    target_veth: str
    initiator_veth: str
    workdir: Path
    port: int = PORT
    target_addr: str = TARGET_ADDR
    initiator_addr: str = INITIATOR_ADDR
    token_file: Path | None = None
    peer_token_file: Path | None = None
    daemon: subprocess.Popen | None = None
    daemon_log: Path | None = None
    pids: set[int] = field(default_factory=set)   # every process started in a namespace

    @property
    def target(self) -> str:
        return f"{self.target_addr}:{self.port}"

    def describe(self) -> str:
        return (f"target    {self.target_addr}/{PREFIX_LEN} on {self.target_veth} in netns "
                f"{self.target_ns}: softhca serve --listen {self.target}\n"
                f"initiator {self.initiator_addr}/{PREFIX_LEN} on {self.initiator_veth} in "
                f"netns {self.initiator_ns}: pytest -m twonode tests/twonode")

    def exec_argv(self, ns: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", ns, *argv]

    def run_twonode(self, target: str | None = None, *, args: Sequence[str] = (),
                    timeout: float = 120.0) -> RunResult:
        """The two-node tests inside the initiator's namespace against ``target`` (the
        daemon by default): their exit status, their output, how long they took."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("SOFTHCA_TOKEN", "SOFTHCA_INITIATOR_ADDR", "PYTEST_ADDOPTS")}
        env.update(SOFTHCA_TARGET=target or self.target, SOFTHCA_TOKEN_FILE=str(self.token_file),
                   SOFTHCA_PEER_TOKEN_FILE=str(self.peer_token_file),
                   PYTHONDONTWRITEBYTECODE="1")
        argv = self.exec_argv(self.initiator_ns, [
            sys.executable, "-m", "pytest", "-m", "twonode", "tests/twonode",
            "-p", "no:cacheprovider", "-v", "--color=no", "-rfEs", *args])
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.pids.add(proc.pid)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            output += f"\n[netns] killed: the run took over {timeout:g} s\n"
        return RunResult(argv, proc.returncode, output, time.monotonic() - start)

    def leftovers(self) -> list[str]:
        """What of this topology still exists: namespaces, veth ends, processes."""
        left = [f"netns {n}" for n in (self.target_ns, self.initiator_ns) if n in namespaces()]
        left += [f"veth {v} (root namespace)" for v in (self.target_veth, self.initiator_veth)
                 if Path("/sys/class/net", v).exists()]
        left += [f"process {pid}" for pid in sorted(self.pids) if _alive(pid)]
        return left


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pids_in(ns: str) -> set[int]:
    out = ip("netns", "pids", ns, check=False).stdout
    return {int(p) for p in out.split() if p.isdigit()}


@contextlib.contextmanager
def two_node_topology(workdir: Path, *, port: int = PORT,
                      daemon: bool = True) -> Iterator[Topology]:
    """The two namespaces, the veth pair, the addresses, and (unless ``daemon`` is
    False) a ready ``softhca serve`` in the target's namespace; all of it removed by
    name on the way out, even on an error."""
    pid, k = os.getpid(), next(_counter)
    topo = Topology(target_ns=f"shca-tgt-{pid}-{k}", initiator_ns=f"shca-ini-{pid}-{k}",
                    target_veth=f"shv{pid}t{k}", initiator_veth=f"shv{pid}i{k}",
                    workdir=workdir, port=port)
    try:
        _build(topo)
        if daemon:
            _start_daemon(topo)
        yield topo
    finally:
        _teardown(topo)


def _build(t: Topology) -> None:
    ip("netns", "add", t.target_ns)
    ip("netns", "add", t.initiator_ns)
    # Both ends are created inside their namespaces: nothing ever sits in the root one.
    ip("link", "add", t.target_veth, "netns", t.target_ns, "type", "veth",
       "peer", "name", t.initiator_veth, "netns", t.initiator_ns)
    for ns, dev, addr in ((t.target_ns, t.target_veth, t.target_addr),
                          (t.initiator_ns, t.initiator_veth, t.initiator_addr)):
        ip("addr", "add", f"{addr}/{PREFIX_LEN}", "dev", dev, ns=ns)
        ip("link", "set", dev, "up", ns=ns)
        ip("link", "set", "lo", "up", ns=ns)


def _start_daemon(t: Topology) -> None:
    t.workdir.mkdir(parents=True, exist_ok=True)
    t.token_file = t.workdir / "softhca_token"
    t.token_file.write_text(secrets.token_hex(16) + "\n")
    t.token_file.chmod(0o600)
    # The daemons' own credential, which the initiator's daemon proves on its wire link
    # (a client's token opens none).
    t.peer_token_file = t.workdir / "softhca_peer_token"
    t.peer_token_file.write_text(secrets.token_hex(16) + "\n")
    t.peer_token_file.chmod(0o600)
    ready = t.workdir / "ready"
    t.daemon_log = t.workdir / "daemon.log"
    argv = t.exec_argv(t.target_ns, [
        sys.executable, "-m", "softhca.tools.cli", "serve", "--listen", t.target,
        "--token-file", str(t.token_file), "--peer-token-file", str(t.peer_token_file),
        "--ready-file", str(ready)])
    with open(t.daemon_log, "wb") as log:
        # `ip netns exec` execs the command in place: this pid is the daemon's.
        t.daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
    t.pids.add(t.daemon.pid)
    deadline = time.monotonic() + READY_TIMEOUT
    while not (ready.exists() and ready.read_text().strip()):
        if t.daemon.poll() is not None or time.monotonic() > deadline:
            raise NetnsError(f"softhca serve in {t.target_ns} did not become ready "
                             f"(exit {t.daemon.poll()}): {t.daemon_log.read_text()}")
        time.sleep(0.05)


def _teardown(t: Topology) -> None:
    d = t.daemon
    if d is not None and d.poll() is None:
        d.send_signal(signal.SIGTERM)
        try:
            d.wait(5)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait(5)
    # Anything else still inside the two namespaces was started here (the daemon, a
    # test run): stop it by pid before the namespaces go.
    for ns in (t.target_ns, t.initiator_ns):
        for pid in _pids_in(ns):
            t.pids.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in t.pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    # Deleting one end of a veth pair deletes both; deleting a namespace deletes what
    # is left in it. Both are asked for, by name, whatever exists.
    ip("link", "del", t.target_veth, ns=t.target_ns, check=False)
    for ns in (t.target_ns, t.initiator_ns):
        ip("netns", "del", ns, check=False)


@contextlib.contextmanager
def one_host() -> Iterator[str]:
    """A network namespace with only ``lo`` up: one machine of its own, whose loopback
    addresses no other test's daemon holds (the README's two programs on one machine
    run there as on a fresh host). Yields its name; whatever runs in it is killed and
    the namespace deleted on the way out."""
    ns = f"shca-one-{os.getpid()}-{next(_counter)}"
    pids: set[int] = set()
    try:
        ip("netns", "add", ns)
        ip("link", "set", "lo", "up", ns=ns)
        yield ns
    finally:
        for pid in _pids_in(ns):
            pids.add(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        ip("netns", "del", ns, check=False)
