"""An inbound wire link read without a stream reader (server/wire_in.py): a peer that
sends its packets before its welcome came loses none of them when the link's transport
changes hands, and a frame that breaks the framing still closes the link, counted."""

from __future__ import annotations

import asyncio

from test_hardening import read_frames
from test_hardening_amplify import PEER_TOKEN, peer_token_file

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, frame_bytes
from softhca.protocol.handshake import make_hello
from softhca.protocol.packets import Packet, packet_header
from softhca.tools.daemons import Daemons

N = 6000


async def counters_until(node: sh.Node, name: str, want: int, timeout: float = 20.0) -> int:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        got = (await node.counters()).get(name, 0)
        if got >= want or loop.time() > deadline:
            return got
        await asyncio.sleep(0.05)


async def test_packets_sent_before_the_welcome_are_all_taken(tmp_path):
    daemons = Daemons(1, str(tmp_path), ("--peer-token-file", str(peer_token_file(tmp_path))))
    with daemons as (address,):
        node = await sh.connect(address)
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        dec = FrameDecoder(1 << 20)
        (challenge,) = await read_frames(reader, dec)
        # Hello and N packets for no QP in one write, some 600 KB: more than one read of
        # the daemon's (256 KiB), so part of it waits in the stream reader or the socket
        # when the link is handed over.
        pkt = packet_header("mlx5_0", Packet(0x77, 0, "ACKNOWLEDGE", b"", aeth=("ACK", 0)))
        pkt["sqp"] = 0x55
        writer.write(frame_bytes(make_hello(challenge.header, "wire", PEER_TOKEN,
                                            "127.0.0.1:1")) + frame_bytes(pkt) * N)
        (welcome,) = await read_frames(reader, dec)
        assert welcome.header["t"] == "welcome"
        assert await counters_until(node, "packets_unknown_qp", N) == N
        # Then a frame announcing more than the daemon takes: refused, counted, closed.
        writer.write((1 << 30).to_bytes(4, "big") + b"\0" * 8)
        assert await counters_until(node, "wire_protocol_errors", 1) == 1
        assert await asyncio.wait_for(reader.read(), 10) is not None
        writer.close()
        await node.close()


def _into(buf: bytearray, data: bytes) -> int:
    buf[:len(data)] = data
    return len(data)


async def test_a_read_buffer_is_reused_only_when_no_frame_looks_at_it():
    """The loop reads into the link's own buffer (BufferedProtocol); the frames are views
    of it. A payload still held when the next read comes keeps its bytes: that read gets
    a fresh buffer. Once nothing holds a view, the buffer is read into again."""
    from softhca.server.wire_in import WireIn

    kept: list = []
    errors: list = []
    link = WireIn(FrameDecoder(1 << 20), lambda frames: kept.extend(frames) or 0,
                  lambda waste: 0.0, errors.append)
    one = frame_bytes({"t": "cm", "n": 1}, b"A" * 1000)
    two = frame_bytes({"t": "cm", "n": 2}, b"B" * 1000)
    first = link.get_buffer(-1)
    link.buffer_updated(_into(first, one))
    assert [bytes(f.payload) for f in kept] == [b"A" * 1000]
    second = link.get_buffer(-1)
    assert second is not first and link.fresh_buffers == 1
    # A frame cut by the end of a read is completed from the next one.
    link.buffer_updated(_into(second, two[:500]))
    third = link.get_buffer(-1)
    link.buffer_updated(_into(third, two[500:]))
    assert [bytes(f.payload) for f in kept] == [b"A" * 1000, b"B" * 1000]
    assert not errors
    kept.clear()
    assert link.get_buffer(-1) is third and link.fresh_buffers == 1
