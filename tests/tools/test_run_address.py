"""``softhca run``'s default ``--listen 127.0.0.1:0``: the daemon takes an address of its
own, the first 127.0.0.N whose wire port is free, so that several ``softhca run``s on
one machine share one port at distinct addresses (rdma_cm names a daemon by its
address on the shared port). tools/native.py ``start_on_own_loopback``; the programs
themselves are in tests/native/test_one_machine.py."""

from __future__ import annotations

import asyncio
import logging
import socket

from softhca.server.daemon import Daemon
from softhca.tools.native import start_on_own_loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hold(host: str, port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen()
    return s


async def test_the_first_free_loopback_address_on_the_shared_port():
    port = _free_port()
    held = [_hold("127.0.0.1", port), _hold("127.0.0.2", port)]
    daemon = Daemon(("mlx5_0",), "127.0.0.1", 0)
    try:
        await start_on_own_loopback(daemon, port)
        assert (daemon.host, daemon.port) == ("127.0.0.3", port)
        # It answers there.
        _, w = await asyncio.open_connection("127.0.0.3", port)
        w.close()
    finally:
        await daemon.close()
        for s in held:
            s.close()


async def test_no_address_free_on_the_port_falls_back_and_says_so(caplog):
    port = _free_port()
    held = _hold("0.0.0.0", port)       # a wildcard listener takes the port on every address
    daemon = Daemon(("mlx5_0",), "127.0.0.1", 0)
    try:
        with caplog.at_level(logging.WARNING, logger="softhca.server"):
            await start_on_own_loopback(daemon, port)
        assert daemon.host == "127.0.0.1" and daemon.port not in (0, port)
        said = [r.getMessage() for r in caplog.records if "listen_fallback" in r.getMessage()]
        assert len(said) == 1 and f"port {port} is taken on every 127.0.0.N" in said[0], said
        assert "rdma_cm programs of other daemons cannot" in said[0]
    finally:
        await daemon.close()
        held.close()
