"""Fixtures: an engine node (one simulated HCA, a PD and a QP's WR builder) and an
end-to-end pair of daemons driven through the client; each test marked with its kind,
the folder it lives in (``pytest -m unit``, ``-m e2e``, ...)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from engine_backends import engine_backend  # noqa: F401  (the fixture, for tests/unit)
from hypothesis import HealthCheck, settings

from softhca.engine.hca import HCA
from softhca.engine.mkey_configure import MkeyConfigureBuilder
from softhca.protocol.attrs import SGE, DEKInitAttr
from softhca.protocol.enums import (
    AccessFlags,
    CryptoKeySize,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    SendFlags,
)

# Several tests send SIGINT to a child (Ctrl-C of a command, of the pyverbs bridge, of
# `softhca trace` and `capture`) and expect KeyboardInterrupt there. A suite started in
# the background of a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, an
# ignored disposition survives exec, and every child would ignore the signal: those tests
# would fail for the way the suite was started, not for the code. A handled signal is
# reset to the default on exec, so installing Python's own handler here gives the
# children the disposition a terminal gives them.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The property tests judge behaviour, not speed. On a loaded machine generating examples can
# be slow, and hypothesis' too_slow health check (or a per-example deadline) would fail a
# correct run; tests that set their own settings inherit this.


def hypothesis_home(cwd: Path) -> Path | None:
    """Where hypothesis keeps its example database and caches: its default, ``.hypothesis``
    in the working directory, when that can be written; else (the initiator container
    runs the tests from /src, read-only for its uid 10001) a directory of this user's own
    in the system's temporary directory. None: keep the default."""
    import tempfile

    default = cwd / ".hypothesis"
    if os.access(default if default.exists() else cwd, os.W_OK | os.X_OK):
        return None
    return Path(tempfile.gettempdir()) / f"softhca-hypothesis-{os.getuid()}"


_home = hypothesis_home(Path.cwd())
if _home is not None:
    from hypothesis.configuration import set_hypothesis_home_dir

    _home.mkdir(mode=0o700, exist_ok=True)
    set_hypothesis_home_dir(_home)

settings.register_profile("softhca", suppress_health_check=[HealthCheck.too_slow],
                          deadline=None)
settings.load_profile("softhca")

ALL_ACCESS = (AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
              | AccessFlags.REMOTE_ATOMIC)
SIG_ONLY = MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.BLOCK_SIGNATURE
SIG_CRYPTO = SIG_ONLY | MkeyInitAttrFlags.CRYPTO


class EngineNode:
    """What a test does with an HCA, in the verbs calls' words."""

    def __init__(self) -> None:
        self.hca = HCA("mlx5_0")
        self.pd = self.hca.alloc_pd()
        self.qp = MkeyConfigureBuilder(self.pd, Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE)

    def reg_mr(self, data: bytes | int, access: int = ALL_ACCESS):
        length = data if isinstance(data, int) else len(data)
        mr = self.hca.reg_mr(self.pd, length, access)
        if not isinstance(data, int):
            mr.write(data)
        return mr

    def create_mkey(self, flags: int = SIG_ONLY, max_entries: int = 4):
        return self.hca.create_mkey(self.pd, flags, max_entries)

    def create_dek(self, key: bytes, **kw):
        size = CryptoKeySize.SIZE_256 if len(key) == 64 else CryptoKeySize.SIZE_128
        return self.hca.create_dek(DEKInitAttr(pd=self.pd, key_size=size, key=key, **kw))

    def configure(self, mkey, *, access=ALL_ACCESS, sges=None, interleaved=None, sig=None,
                  crypto=None, conf_flags=0, wr_flags=SendFlags.INLINE):
        """One MKEY configure WR with the setters for the arguments given."""
        return self.qp.post_configure(mkey, access=access, sges=sges, interleaved=interleaved,
                                      sig=sig, crypto=crypto, conf_flags=conf_flags,
                                      wr_id=1, wr_flags=wr_flags)

    def mkey_over(self, data: bytes | int, **kw):
        """An MR holding ``data`` and an MKEY whose list layout covers all of it."""
        mr = self.reg_mr(data)
        default = SIG_CRYPTO if kw.get("crypto") else SIG_ONLY
        mkey = self.create_mkey(kw.pop("flags", default))
        self.configure(mkey, sges=[SGE(mr.addr, mr.length, mr.lkey)], **kw)
        return mr, mkey


HERE = Path(__file__).resolve().parent
# The folders of tests/, one per kind of test; each is also the marker of its tests
# (registered in pyproject.toml), so `pytest -m e2e` selects what `pytest tests/e2e` runs.
KINDS = ("unit", "e2e", "hardening", "tools", "pyverbs", "twonode", "containers", "native")


def _kind(item) -> str | None:
    path = Path(item.path).resolve()
    if HERE in path.parents:
        kind = path.relative_to(HERE).parts[0]
        if kind in KINDS:
            return kind
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        kind = _kind(item)
        if kind is not None:
            item.add_marker(kind)
    # The container tests last (a stable sort: each folder keeps its order), so that the
    # image build started in the background as the run begins (pytest_collection_finish)
    # has the other folders' time to finish in.
    items.sort(key=lambda item: _kind(item) == "containers")


def pytest_collection_finish(session):
    """A run that holds a container test starts building the images now, in the
    background (tests/support/compose.py, start_early_build)."""
    if session.config.option.collectonly:
        return
    if any(_kind(item) == "containers" for item in session.items):
        import compose

        compose.start_early_build()


def pytest_sessionfinish(session):
    import sys

    compose = sys.modules.get("compose")
    if compose is not None:
        compose.stop_early_build()


@pytest.fixture
def node() -> EngineNode:
    return EngineNode()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(int(os.environ.get("SOFTHCA_TEST_SEED", "1619")))


@pytest.fixture
async def pair():
    """Two embedded daemons over TCP, a target and an initiator with a connected RC QP
    pair, driven through softhca.client only (tests/support/e2e.py)."""
    from e2e import two_nodes

    async with two_nodes() as p:
        yield p


def pytest_terminal_summary(terminalreporter):
    """What the upstream pyverbs run, the container tests and the differential test
    measured (tests/pyverbs/test_upstream_pyverbs.py, tests/support/compose.py,
    tests/e2e/test_differential.py), once, after the run."""
    import sys

    for module, title in (("test_upstream_pyverbs", "upstream pyverbs"),
                          ("compose", "containers"), ("test_differential", "differential")):
        found = sys.modules.get(module)
        if found is not None and getattr(found, "REPORT", None):
            terminalreporter.section(title)
            for line in found.REPORT:
                terminalreporter.write_line(line)


@pytest.fixture
def wrong_demo_oracle(monkeypatch):
    """softhca demo's oracle one bit off: the T10DIF images of DIF_4K (sig_block 2) get
    block 1's ref tag 0x00001001 where the page says 0x00001000, so a demo judged by it
    must FAIL there."""
    from softhca.tools import demo

    real = demo.protect

    def wrong(data, d):
        out = bytearray(real(data, d))
        if d is demo.DIF_4K:
            out[4104 + 4096 + 7] ^= 0x01
        return bytes(out)

    monkeypatch.setattr(demo, "protect", wrong)


@pytest.fixture(scope="session")
def tshark() -> str:
    """tshark from Debian's ``tshark`` package: installed once when missing and root, so
    that every test decoding a capture runs in CI whatever runs first."""
    path = shutil.which("tshark")
    if path is not None:
        return path
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("tshark is not installed (Debian package 'tshark') and this test is not "
                    "root with apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=300,
                       check=True)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "tshark"],
                       env=env, capture_output=True, timeout=300, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"could not install Debian package 'tshark': {e}")
    path = shutil.which("tshark")
    if path is None:
        pytest.skip("Debian package 'tshark' installed but no tshark on PATH")
    return path
