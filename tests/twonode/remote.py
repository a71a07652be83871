"""Where the two-node tests find their target, and the QP pair they build with it.

Environment:

- ``SOFTHCA_TARGET``: ``HOST:PORT`` of a running ``softhca serve`` (port 4791 when left
  out). Several, comma-separated, run every test against each; a DNS name stands for all
  of its IPv4 addresses (compose's ``--scale`` gives one name many addresses).
- ``SOFTHCA_TOKEN_FILE`` (trailing whitespace ignored, as ``serve --token-file``) or
  ``SOFTHCA_TOKEN``: the clients' token (the initiator's own daemon takes it too).
- ``SOFTHCA_PEER_TOKEN_FILE`` (or ``SOFTHCA_PEER_TOKEN``): the daemons' peer token, the
  target's ``serve --peer-token-file``; the initiator's daemon proves it on its wire
  link to the target and the target's on its link back. Unset: the clients' token.
- ``SOFTHCA_INITIATOR_ADDR``: the address the initiator's daemon binds and advertises to
  the target; by default the local address of the route to the target.
- ``SOFTHCA_CONNECT_TIMEOUT`` (s, default 5) bounds the connection and handshake;
  ``SOFTHCA_TWONODE_TIMEOUT`` (s, default 60) bounds each test. Nothing waits unbounded:
  a wrong address fails with the connection error, and the other tests of the run fail
  at once with the same message instead of waiting for it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import socket
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

import softhca.client as sh

from e2e import Pair, connect_pair, make_side

TARGET_ENV = "SOFTHCA_TARGET"
DEFAULT_PORT = 4791
CONNECT_TIMEOUT = float(os.environ.get("SOFTHCA_CONNECT_TIMEOUT", "5"))
TEST_TIMEOUT = float(os.environ.get("SOFTHCA_TWONODE_TIMEOUT", "60"))
SKIP_REASON = (f"{TARGET_ENV} is not set: the two-node tests need a running `softhca serve` "
               f"to act as the target, e.g. {TARGET_ENV}=10.200.0.1:4791 (docker/README.md)")

T = TypeVar("T")

# target address -> why it cannot be used; filled by the first test that tried.
_unusable: dict[str, str] = {}


def configured() -> str:
    return os.environ.get(TARGET_ENV, "").strip()


def split(address: str) -> tuple[str, int]:
    host, sep, port = address.strip().rpartition(":")
    if not sep or not port.isdigit():
        return address.strip().strip("[]"), DEFAULT_PORT
    return host.strip("[]"), int(port)


def join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _addresses(host: str) -> list[str]:
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return [host]       # left to the connection, which reports it
    return sorted({i[4][0] for i in infos}, key=ipaddress.ip_address)


def targets() -> list[str]:
    """Every target address of SOFTHCA_TARGET, names expanded to their addresses."""
    out: list[str] = []
    for item in configured().split(","):
        if not item.strip():
            continue
        host, port = split(item)
        for addr in _addresses(host):
            if join(addr, port) not in out:
                out.append(join(addr, port))
    return out


def token() -> bytes | None:
    path = os.environ.get("SOFTHCA_TOKEN_FILE", "").strip()
    if path:
        try:
            return Path(path).read_bytes().rstrip() or None
        except OSError as e:
            raise sh.RDMAError("EACCES", f"cannot read SOFTHCA_TOKEN_FILE {path}: "
                                         f"{e.strerror}") from None
    value = os.environ.get("SOFTHCA_TOKEN", "")
    return value.encode() if value else None


def peer_token() -> bytes | None:
    path = os.environ.get("SOFTHCA_PEER_TOKEN_FILE", "").strip()
    if path:
        try:
            return Path(path).read_bytes().rstrip() or None
        except OSError as e:
            raise sh.RDMAError("EACCES", f"cannot read SOFTHCA_PEER_TOKEN_FILE {path}: "
                                         f"{e.strerror}") from None
    value = os.environ.get("SOFTHCA_PEER_TOKEN", "")
    return value.encode() if value else token()


def initiator_address(target: str) -> str:
    """The local address packets to ``target`` leave from (SOFTHCA_INITIATOR_ADDR wins).

    A UDP connect sends nothing: it only asks the kernel for the route."""
    override = os.environ.get("SOFTHCA_INITIATOR_ADDR", "").strip()
    if override:
        return override
    host, port = split(target)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return s.getsockname()[0]
    except OSError as e:
        raise sh.RDMAError("ECONNRESET", f"cannot connect to {target}: no route from this "
                                         f"host ({e.strerror or e})") from None


async def within(aw: Awaitable[T], what: str, timeout: float = TEST_TIMEOUT) -> T:
    """``aw``, or ETIMEDOUT naming ``what`` once ``timeout`` seconds have passed."""
    try:
        return await asyncio.wait_for(aw, timeout)
    except asyncio.TimeoutError:
        raise sh.RDMAError("ETIMEDOUT", f"{what} did not finish within {timeout:g} s") \
            from None


@contextlib.asynccontextmanager
async def remote_two_nodes(target: str, *, mtu: int = sh.IBV_MTU_1024,
                           connect_kw: dict | None = None, **side_kw):
    """A control session with the target daemon, an embedded initiator daemon bound on
    the address that routes to it, and a connected RC QP pair between the two hosts
    (``connect_kw``: QP.connect's timeout, retry_cnt ...)."""
    reason = _unusable.get(target)
    if reason is not None:
        pytest.fail(reason, pytrace=False)
    tnode = None
    try:
        tok, peer = token(), peer_token()
        local = initiator_address(target)
        tnode = await sh.connect(target, token=tok, timeout=CONNECT_TIMEOUT)
    except sh.RDMAError as e:
        _unusable[target] = (f"cannot use the target daemon at {target} ({TARGET_ENV}): "
                             f"{e.errno_name}: {e.message}")
    if tnode is None:
        pytest.fail(_unusable[target], pytrace=False)
    try:
        async with sh.embedded(token=tok, host=local, peer_token=peer) as inode:
            async def setup() -> Pair:
                t = await make_side(tnode, **side_kw)
                i = await make_side(inode, **side_kw)
                await connect_pair(t, i, mtu=mtu, **(connect_kw or {}))
                return Pair(t, i)

            yield await within(setup(), f"setting up a QP pair {inode.address} <-> {target}")
    finally:
        await tnode.close()
