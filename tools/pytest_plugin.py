"""softhca's pytest plugin, registered by the ``pytest11`` entry point ``softhca``: a
project that installs softhca gets these fixtures in its own tests (README, "Install
and use softhca in your project").

- ``softhca_target``: a Node (``softhca.client``) on the target daemon: the
  ``softhca serve`` named by ``--softhca-target HOST:PORT`` (or the environment's
  ``SOFTHCA_TARGET``), with the token of ``--softhca-token-file`` (or
  ``SOFTHCA_TOKEN_FILE``); without one, a daemon embedded in the test's process.
- ``softhca_initiator``: a Node on a second daemon, embedded in the test's process.
  Against a remote target it listens on this host's address on the route to it
  (``sh.embedded(peer=...)``) and proves the peer token of ``--softhca-peer-token-file``
  (default: the token file; the target must have been started with
  ``--peer-token-file`` naming the same token).
- ``softhca_rc_pair``: an ``RCPair``: on each daemon a context of its first device, a
  PD, a CQ and an RC QP, the two QPs connected to each other (RTS).
- ``softhca_pyverbs``: ``import pyverbs`` made softhca's for the test (its directory
  first on ``sys.path``, the target's address and token in the environment when
  ``--softhca-target`` is given); the fixture's value is the ``pyverbs`` module.
- ``softhca_pyverbs_path``: the directory itself (``softhca.pyverbs_path()``).

The async fixtures need pytest-asyncio (``pip install softhca[test]`` has it); a test
using them is ``async def`` (marked ``@pytest.mark.asyncio`` unless the project sets
``asyncio_mode = "auto"``). Importing this module loads neither the daemon nor the
client: pytest loads it for every run of every project softhca is installed in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ..client.token_file import TokenFileError, read_token

try:
    import pytest_asyncio
except ImportError:             # the async fixtures then say what is missing
    pytest_asyncio = None

TARGET_ENV, TOKEN_ENV = "SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("softhca", "softhca's fixtures (softhca_target, softhca_rc_pair, ...)")
    group.addoption("--softhca-target", metavar="HOST:PORT", default=None,
                    help="the softhca serve the softhca_target fixture uses (default: "
                    "$SOFTHCA_TARGET, else a daemon embedded in the test's process)")
    group.addoption("--softhca-token-file", metavar="FILE", default=None,
                    help="the target's token (default: $SOFTHCA_TOKEN_FILE)")
    group.addoption("--softhca-peer-token-file", metavar="FILE", default=None,
                    help="the peer token the embedded initiator proves to the target's "
                    "wire plane (default: the token file)")


@dataclass
class Side:
    """One end of an ``RCPair``: the daemon's Node and the verbs objects on it."""

    node: Any
    ctx: Any
    pd: Any
    cq: Any
    qp: Any


@dataclass
class RCPair:
    """``softhca_rc_pair``: ``target`` and ``initiator``, their RC QPs connected."""

    target: Side
    initiator: Side


@dataclass(frozen=True)
class _Config:
    target: str | None
    token: bytes | None
    peer_token: bytes | None


def _read(path: str | None, what: str) -> bytes | None:
    """The token in ``path`` read as ``softhca serve --token-file`` reads it; a file that
    cannot be read is a usage error naming the option ``what``."""
    try:
        return read_token(path)
    except TokenFileError as e:
        raise pytest.UsageError(f"softhca: {what}: {e}") from None


def _config(config: pytest.Config) -> _Config:
    target = config.getoption("softhca_target") or os.environ.get(TARGET_ENV) or None
    token_file = config.getoption("softhca_token_file") or os.environ.get(TOKEN_ENV)
    token = _read(token_file, "--softhca-token-file")
    peer_file = config.getoption("softhca_peer_token_file")
    peer = _read(peer_file, "--softhca-peer-token-file") if peer_file else token
    return _Config(target, token, peer)


def _async_fixture(fn):
    """An async fixture through pytest-asyncio, or, without it, a fixture that fails the
    test saying so (rather than an un-awaited coroutine)."""
    if pytest_asyncio is not None:
        return pytest_asyncio.fixture(fn)

    @pytest.fixture(name=fn.__name__)
    def missing():
        pytest.fail(f"{fn.__name__} is an async fixture: install pytest-asyncio "
                    "(pip install 'softhca[test]')")

    return missing


@_async_fixture
async def softhca_target(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    from .. import client as sh

    cfg = _config(request.config)
    if cfg.target:
        async with await sh.connect(cfg.target, token=cfg.token) as node:
            yield node
    else:
        async with sh.embedded() as node:
            yield node


@_async_fixture
async def softhca_initiator(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    from .. import client as sh

    cfg = _config(request.config)
    if cfg.target:
        # Where the target can connect back: this host's address on the route to it.
        options = {"peer_token": cfg.peer_token} if cfg.peer_token is not None else {}
        async with sh.embedded(peer=cfg.target, **options) as node:
            yield node
    else:
        async with sh.embedded() as node:
            yield node


async def _side(node: Any) -> Side:
    from .. import client as sh

    ctx = await node.open_device(node.devices[0])
    pd = await ctx.alloc_pd()
    cq = await ctx.create_cq(256)
    qp = await pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                                          cap=sh.QPCap(max_send_wr=64, max_recv_wr=64)))
    return Side(node, ctx, pd, cq, qp)


@_async_fixture
async def softhca_rc_pair(softhca_target: Any, softhca_initiator: Any) -> RCPair:
    target, initiator = await _side(softhca_target), await _side(softhca_initiator)
    await target.qp.connect(initiator.qp.info())
    await initiator.qp.connect(target.qp.info())
    return RCPair(target, initiator)


@pytest.fixture(scope="session")
def softhca_pyverbs_path() -> str:
    from .. import pyverbs_path

    return pyverbs_path()


@pytest.fixture
def softhca_pyverbs(request: pytest.FixtureRequest, softhca_pyverbs_path: str,
                    monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    cfg = _config(request.config)
    if cfg.target:
        monkeypatch.setenv(TARGET_ENV, cfg.target)
        token_file = request.config.getoption("softhca_token_file")
        if token_file:
            monkeypatch.setenv(TOKEN_ENV, token_file)
    monkeypatch.syspath_prepend(softhca_pyverbs_path)
    loaded = sys.modules.get("pyverbs")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(
            softhca_pyverbs_path):
        pytest.fail(f"another pyverbs is already imported ({loaded.__file__}): softhca's "
                    "must be the first one imported in this process")
    import pyverbs

    yield pyverbs
