"""open_link: the connecting side of the HELLO exchange, shared by clients and wire links."""

from __future__ import annotations

import asyncio
import socket

import pytest

from softhca.protocol.errors import RDMAError
from softhca.protocol.frames import encode_frame
from softhca.protocol.handshake import make_challenge
from softhca.server.daemon import Daemon
from softhca.server.link import open_link, read_frames

MAX = 1 << 20


async def _server(handler):
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("role", ["control", "wire"])
async def test_both_roles_are_welcomed(role):
    # Clients prove the token, wire links the peer token.
    d = Daemon(("mlx5_0", "mlx5_1"), token=b"tok", peer_token=b"tok")
    await d.start()
    try:
        link = await open_link(d.host, d.port, role, b"tok", timeout=5, max_frame=MAX)
        assert link.welcome["t"] == "welcome" and link.welcome["role"] == role
        assert link.welcome["devices"] == ["mlx5_0", "mlx5_1"] and link.rest == []
        link.writer.close()
        with pytest.raises(RDMAError) as e:
            await open_link(d.host, d.port, role, b"wrong", timeout=5, max_frame=MAX)
        assert e.value.errno_name == "EACCES"
    finally:
        await d.close()


async def test_nothing_listening_is_econnrefused():
    # The errno that happened names the cause (a refused connect is ECONNREFUSED).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RDMAError) as e:
        await open_link("127.0.0.1", port, "wire", None, timeout=5, max_frame=MAX)
    assert e.value.errno_name == "ECONNREFUSED" and f"cannot connect to 127.0.0.1:{port}" \
        in e.value.message


async def test_a_silent_peer_times_out_and_a_closing_one_resets():
    async def silent(reader, writer):
        await reader.read()

    async def closing(reader, writer):
        writer.close()

    server, port = await _server(silent)
    async with server:
        with pytest.raises(RDMAError) as e:
            await open_link("127.0.0.1", port, "control", None, timeout=0.2, max_frame=MAX)
        assert e.value.errno_name == "ETIMEDOUT" and "did not complete the handshake" \
            in e.value.message
    server, port = await _server(closing)
    async with server:
        with pytest.raises(RDMAError) as e:
            await open_link("127.0.0.1", port, "control", None, timeout=5, max_frame=MAX)
        assert e.value.errno_name == "ECONNRESET" and "during the handshake" in e.value.message


async def test_anything_but_welcome_is_eproto_and_frames_after_it_are_kept():
    answer = {}

    async def peer(reader, writer):
        challenge, _ = make_challenge(False)
        writer.writelines(encode_frame(challenge))
        await reader.read(1 << 16)
        writer.writelines(encode_frame(answer["first"]))
        writer.writelines(encode_frame({"t": "event", "kind": "x"}, b"abc"))
        await reader.read()

    server, port = await _server(peer)
    async with server:
        answer["first"] = {"t": "ok", "id": 1}
        with pytest.raises(RDMAError) as e:
            await open_link("127.0.0.1", port, "control", None, timeout=5, max_frame=MAX)
        assert e.value.errno_name == "EPROTO" and "expected 'welcome'" in e.value.message
        answer["first"] = {"t": "welcome", "role": "control"}
        link = await open_link("127.0.0.1", port, "control", None, timeout=5, max_frame=MAX)
        rest = link.rest or await read_frames(link.reader, link.decoder)   # same read or next
        assert rest[0].header["t"] == "event" and bytes(rest[0].payload) == b"abc"
        link.writer.close()

