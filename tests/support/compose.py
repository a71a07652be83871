"""docker/compose.yaml driven from the host: the engine check, the compose command, the
image build, and the lines the container tests leave in pytest's summary.

The container tests print what CI's log must show (which base image the build used,
``docker-compose ps`` with both addresses, the in-container run's ``N passed``, each
node-loss test's measured times, and what is left after teardown) through
``pytest_terminal_summary`` (tests/conftest.py), so a passing run shows them once, at
the end, instead of in the middle of the dots.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker" / "compose.yaml"
TOKEN_FILE = ROOT / "docker" / "token.example"
PEER_TOKEN_FILE = ROOT / "docker" / "peer-token.example"
# SOFTHCA_USER_DIR of the tests' containers: what a test builds there is /mnt/user in
# both nodes (docker/compose.yaml mounts it read-only).
USER_DIR = ROOT / "build" / "compose-user"


@dataclass(frozen=True)
class Names:
    """What two checkouts on one engine must not share, each its environment variable's
    (the Makefile's SOFTHCA_IMAGE, SOFTHCA_SUBNET, SOFTHCA_PROJECT; docker/compose.yaml
    and docker/build-images.sh read the same): the images' repository (its tags
    ``:daemon`` and ``:tests``), the compose network's /24 (its first three octets) and
    the compose project."""

    image: str = "softhca"
    subnet: str = "10.200.0"
    project: str = "softhca-twonode"

    @classmethod
    def from_env(cls, env=None) -> Names:
        env = os.environ if env is None else env
        d = cls()
        return cls(env.get("SOFTHCA_IMAGE") or d.image, env.get("SOFTHCA_SUBNET") or d.subnet,
                   env.get("SOFTHCA_PROJECT") or d.project)

    def env(self) -> dict[str, str]:
        return {"SOFTHCA_IMAGE": self.image, "SOFTHCA_SUBNET": self.subnet,
                "SOFTHCA_PROJECT": self.project}

    @property
    def target_ip(self) -> str:
        return f"{self.subnet}.1"

    @property
    def initiator_ip(self) -> str:
        return f"{self.subnet}.2"


NAMES = Names.from_env()
PROJECT = NAMES.project
TARGET_IP, INITIATOR_IP = NAMES.target_ip, NAMES.initiator_ip
TARGET = f"{TARGET_IP}:4791"

# Lines for pytest's terminal summary, section "containers".
REPORT: list[str] = []


def report(line: str) -> None:
    REPORT.append(line)


def run(argv: list[str], *, timeout: float = 120, check: bool = False, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {r.returncode}:\n{r.stdout[-3000:]}\n"
                             f"{r.stderr[-3000:]}")
    return r


@functools.lru_cache(maxsize=1)
def compose_command() -> tuple[str, ...] | None:
    """``docker compose`` (v2) when the CLI has it, else ``docker-compose`` (v1)."""
    if shutil.which("docker") and run(["docker", "compose", "version"], timeout=20).returncode == 0:
        return ("docker", "compose")
    if shutil.which("docker-compose"):
        return ("docker-compose",)
    return None


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why the container tests cannot run here, or None."""
    if shutil.which("docker") is None:
        return "no docker command on this machine (the network-namespace run covers two nodes)"
    try:
        r = run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=20)
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer `docker info` within 20 s"
    if r.returncode != 0 or not r.stdout.strip():
        return f"no Docker engine answers: {(r.stderr or r.stdout).strip()[:200]}"
    if compose_command() is None:
        return "the Docker engine answers, but there is no compose tool (docker compose or docker-compose)"
    if os.geteuid() != 0 and shutil.which("debootstrap") is None:
        return "building the base image offline needs debootstrap, and root to install it"
    return None


def _lock_path(what: str) -> Path:
    return Path(tempfile.gettempdir()) / f"softhca-compose-{what}.lock"


def _image_lock(names: Names) -> str:
    return f"image-{names.image}".replace("/", "_")


@contextlib.contextmanager
def machine_lock(names: Names = NAMES):
    """One compose topology per project name, per subnet and per image repository on the
    machine: a second test run on the same engine (another checkout) that shares any of
    them with this one waits its turn; one with names of its own (SOFTHCA_IMAGE,
    SOFTHCA_SUBNET, SOFTHCA_PROJECT) runs beside it."""
    # This run's own background build holds the image lock, or is about to take it (its
    # flock may not have run yet): waiting for it first, not for the lock, is what keeps
    # the two from waiting on each other.
    _wait_early_build()
    paths = [_lock_path(what) for what in sorted(
        {f"project-{names.project}", f"subnet-{names.subnet}", _image_lock(names)})]
    if names == Names():
        # the one lock of checkouts from before the names were choosable, which use them
        paths.insert(0, Path(tempfile.gettempdir()) / "softhca-compose.lock")
    with contextlib.ExitStack() as stack:
        for path in paths:
            f = stack.enter_context(open(path, "w"))
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def compose(*args: str, timeout: float = 300, check: bool = True,
            env: dict[str, str] | None = None, names: Names = NAMES
            ) -> subprocess.CompletedProcess:
    argv = [*compose_command(), "-p", names.project, "-f", str(COMPOSE_FILE), *args]
    # made here, by this user: Docker would make a missing source as root
    USER_DIR.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "SOFTHCA_TOKEN_SECRET": str(TOKEN_FILE),
                "SOFTHCA_PEER_TOKEN_SECRET": str(PEER_TOKEN_FILE),
                "SOFTHCA_USER_DIR": str(USER_DIR),
                "SOFTHCA_TARGET": f"{names.target_ip}:4791", **names.env(), **(env or {})}
    return run(argv, timeout=timeout, check=check, env=full_env)


# The image build, started in the background as the run begins (start_early_build, from
# tests/conftest.py, when the run holds a container test): on a fresh machine it is
# several minutes of debootstrap, apt and pip, mostly waiting on the package archive and on
# the storage driver, which the other folders' tests (run first) leave room for. It holds
# the image repository's lock (as machine_lock does) and runs at a lower CPU priority;
# build_images waits for it, then runs the build again, which only checks.
_EARLY: dict = {}
EARLY_LOG = ROOT / "build" / "images-early.log"


def _build_env() -> dict[str, str]:
    return {**os.environ, "PY": sys.executable, **NAMES.env()}


def start_early_build() -> bool:
    """Start docker/build-images.sh in the background, unless one is running, there is no
    engine, or SOFTHCA_EARLY_IMAGES=0 asks for the build in the first container test."""
    if _EARLY or os.environ.get("SOFTHCA_EARLY_IMAGES", "1") == "0" or unavailable():
        return False
    if shutil.which("flock") is None:
        return False
    EARLY_LOG.parent.mkdir(parents=True, exist_ok=True)
    log = open(EARLY_LOG, "w")
    argv = ["nice", "-n", "10", "flock", str(_lock_path(_image_lock(NAMES))),
            "bash", str(ROOT / "docker" / "build-images.sh")]
    _EARLY["proc"] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                      env=_build_env(), stdin=subprocess.DEVNULL,
                                      start_new_session=True)
    _EARLY["log"], _EARLY["start"] = log, time.time()
    return True


def stop_early_build() -> None:
    """End a background build the run no longer waits for (a run stopped early)."""
    proc = _EARLY.get("proc")
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def _wait_early_build() -> None:
    """Wait for the background build, if one was started, and say what it did."""
    proc = _EARLY.pop("proc", None)
    if proc is None:
        return
    waited = time.monotonic()
    try:
        rc = proc.wait(timeout=1200)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        rc = "killed after 1200 s"
    _EARLY["log"].close()
    text = EARLY_LOG.read_text(errors="replace")
    for line in text.splitlines():
        if line.startswith("images:"):
            report(f"{line} [in the background, from the run's start]")
    # its log's last write: when it ended, however long before it was waited for
    took = EARLY_LOG.stat().st_mtime - _EARLY["start"]
    report(f"images: the background build took {took:.0f} s (exit {rc}); the first "
           f"container test waited {time.monotonic() - waited:.0f} s for it")
    if rc != 0:
        report("images: the background build failed, its last lines: "
               + " | ".join(text.splitlines()[-5:]) + "; building again here")


def build_images() -> None:
    _wait_early_build()
    start = time.monotonic()
    r = run(["bash", str(ROOT / "docker" / "build-images.sh")], timeout=1200, check=True,
            env=_build_env())
    for line in r.stdout.splitlines():
        if line.startswith("images:"):
            report(line)
    report(f"images: ready in {time.monotonic() - start:.0f} s")


def container_ids(*services: str, all_states: bool = True, names: Names = NAMES) -> list[str]:
    argv = ["docker", "ps", "-q", "--filter",
            f"label=com.docker.compose.project={names.project}"]
    if all_states:
        argv.insert(2, "-a")
    ids = run(argv, check=True).stdout.split()
    if not services:
        return ids
    keep = []
    for cid in ids:
        svc = run(["docker", "inspect", "-f",
                   '{{ index .Config.Labels "com.docker.compose.service" }}', cid]).stdout.strip()
        if svc in services:
            keep.append(cid)
    return keep


def addresses() -> list[str]:
    """name, state and configured IPv4 address of each container of ours."""
    out = []
    for cid in container_ids():
        out.append(run(["docker", "inspect", "-f",
                        "{{.Name}} {{.State.Status}} "
                        "{{range .NetworkSettings.Networks}}{{if .IPAMConfig}}"
                        "{{.IPAMConfig.IPv4Address}}{{end}} {{.IPAddress}}{{end}}", cid]
                       ).stdout.strip())
    return out


def wait_healthy(cids: list[str], timeout: float = 60) -> float:
    """Seconds until every container's HEALTHCHECK reports healthy."""
    start = time.monotonic()
    while True:
        states = [run(["docker", "inspect", "-f", "{{.State.Health.Status}}", c]).stdout.strip()
                  for c in cids]
        if states and all(s == "healthy" for s in states):
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not healthy within {timeout} s: {states}")
        time.sleep(0.3)


def network_name(names: Names = NAMES) -> str:
    return f"{names.project}_rdma"


def leftovers() -> tuple[list[str], list[str]]:
    """Containers and networks of ours that still exist (images may stay)."""
    containers = run(["docker", "ps", "-a", "--format", "{{.Names}}",
                      "--filter", f"label=com.docker.compose.project={PROJECT}"]).stdout.split()
    networks = run(["docker", "network", "ls", "--format", "{{.Name}}",
                    "--filter", f"label=com.docker.compose.project={PROJECT}"]).stdout.split()
    volumes = run(["docker", "volume", "ls", "-q",
                   "--filter", f"label=com.docker.compose.project={PROJECT}"]).stdout.split()
    return containers + volumes, networks


# -- two nodes for unmodified programs: the target container and the initiator run as a node --

# The initiator image run with softhca-node as its entrypoint (``verbs_nodes``): a daemon on
# 10.200.0.2 and its UNIX socket, the device node and the sysfs tree.
NODE = f"{PROJECT}-node2"


def exec_output(cid: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    return run(["docker", "exec", cid, *argv], timeout=timeout)


def wait_device(cid: str, timeout: float = 60) -> str:
    """``ibv_devices`` in the container once its softhca-node has written the tree."""
    deadline = time.monotonic() + timeout
    while True:
        r = exec_output(cid, ["ibv_devices"])
        if r.returncode == 0 and "mlx5_0" in r.stdout:
            return r.stdout
        if time.monotonic() > deadline:
            logs = run(["docker", "logs", cid]).stdout
            raise AssertionError(f"no device in {cid}: {r.stdout}{r.stderr}\n{logs}")
        time.sleep(0.5)


def listening(cid: str, port: int, timeout: float = 30) -> None:
    """Returns once a TCP socket of the container listens on ``port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = exec_output(cid, ["cat", "/proc/net/tcp", "/proc/net/tcp6"])
        for line in r.stdout.splitlines()[1:]:
            f = line.split()
            if len(f) > 3 and f[3] == "0A" and f[1].rsplit(":", 1)[-1] == f"{port:04X}":
                return
        time.sleep(0.3)
    raise AssertionError(f"nothing listens on port {port} in {cid}")


def exec_pair(target: str, node: str, program: list[str], port: int,
              client: list[str] | None = None, timeout: float = 300):
    """``program`` as the server in the target container, then, once it listens on TCP
    ``port``, ``client`` (by default ``program`` naming the target's address) in the
    initiator's; both waited for. ((rc, output) of the server, (rc, output) of the
    client.)"""
    srv = subprocess.Popen(["docker", "exec", target, *program], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        listening(target, port)
        cli = exec_output(node, client or [*program, TARGET_IP], timeout=timeout)
        out, _ = srv.communicate(timeout=120)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    return (srv.returncode, out), (cli.returncode, cli.stdout + cli.stderr)


def target_running() -> str:
    """The target container up and healthy (started again if a test stopped it)."""
    compose("up", "-d", "target")
    (cid,) = container_ids("target")
    if run(["docker", "inspect", "-f", "{{.State.Status}}", cid]).stdout.strip() != "running":
        run(["docker", "start", cid], check=True)
    wait_healthy([cid])
    return cid


@contextlib.contextmanager
def verbs_nodes():
    """The target container, and the initiator run as a node (its image's softhca-node:
    a daemon on its own address and UNIX socket, the device node and sysfs tree), each
    ready for a plain ``docker exec`` of a verbs program: (target, node)."""
    target = target_running()
    run(["docker", "rm", "-f", NODE])
    compose("run", "-d", "--name", NODE, "--entrypoint", "softhca-node", "initiator",
            "--token-file", "/run/secrets/softhca_token",
            "--peer-token-file", "/run/secrets/softhca_peer_token",
            "--allow-readable-token")
    try:
        wait_device(target)
        wait_device(NODE)
        yield target, NODE
    finally:
        run(["docker", "rm", "-f", NODE])
