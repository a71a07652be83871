"""An inbound wire link read without a stream reader (server/wire_in.py): a peer that
sends its packets before its welcome came loses none of them when the link's transport
changes hands, and a frame that breaks the framing still closes the link, counted."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hardening import read_frames
from test_hardening_amplify import PEER_TOKEN, peer_token_file

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, FrameError, frame_bytes
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


# -- a frame larger than a read, continued in place ---------------------------------------

def _read_like_the_loop(link, stream: bytes, sizes) -> int:
    """Feed ``stream`` to ``link`` as the loop's reads would: each read asks get_buffer,
    fills at most the buffer it got and at most the next size; returns the reads made."""
    pos = reads = 0
    k = 0
    while pos < len(stream):
        buf = link.get_buffer(-1)
        n = min(len(buf), sizes[k % len(sizes)], len(stream) - pos)
        buf[:n] = stream[pos:pos + n]
        link.buffer_updated(n)
        pos, reads, k = pos + n, reads + 1, k + 1
    return reads


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3 << 20), min_size=1, max_size=6),
       st.lists(st.integers(1, 1 << 20), min_size=1, max_size=8))
def test_frames_larger_than_a_read_arrive_whole_and_unchanged(payload_sizes, read_sizes):
    """Frames of up to 3 MiB read in reads of random sizes: every frame comes out once,
    in order, with its header and its payload's bytes; the ones much larger than a read
    are continued in place (their reads went straight into their own buffer)."""
    from softhca.server.wire_in import DIRECT_MIN, WireIn

    rng = random.Random(len(payload_sizes) * 7 + sum(read_sizes))
    payloads = [rng.randbytes(n) for n in payload_sizes]
    stream = b"".join(frame_bytes({"t": "cm", "n": k}, p) for k, p in enumerate(payloads))
    # At most some 4,000 reads a stream: a read is never smaller than 1/4096 of it (reads
    # of a few bytes for small streams; megabytes in one-byte reads are millions of
    # Python calls, which say nothing more).
    read_sizes = [max(n, len(stream) >> 12) for n in read_sizes]
    kept: list = []
    errors: list = []

    async def read():       # WireIn belongs to a running loop (its ``done`` future)
        link = WireIn(FrameDecoder(4 << 20), lambda frames: kept.extend(frames) or 0,
                      lambda waste: 0.0, errors.append)
        _read_like_the_loop(link, stream, read_sizes)
        return link

    link = asyncio.run(read())
    assert not errors
    assert [f.header["n"] for f in kept] == list(range(len(payloads)))
    assert [bytes(f.payload) for f in kept] == payloads
    assert link.decoder.buffered == 0
    if max(payload_sizes) >= 8 * DIRECT_MIN and min(read_sizes) >= DIRECT_MIN:
        assert link.direct_reads > 0


def test_a_stalled_large_frame_holds_at_most_eight_times_what_arrived():
    """A prefix announcing a 16 MiB frame, then 64 KiB of it: the decoder holds what came
    (no buffer of the frame's size is made); once an eighth has come it may make one."""
    dec = FrameDecoder(32 << 20)
    dec.direct_min = 1 << 16
    frame = frame_bytes({"t": "cm"}, bytes(16 << 20))
    assert dec.feed(frame[:64 << 10]) == []
    assert dec.recv_buffer() is None and dec.buffered == 64 << 10
    assert len(dec._whole) == 0
    arrived = (2 << 20) + 4096          # an eighth of the frame, and a page more
    assert dec.feed(frame[64 << 10:arrived]) == []
    view = dec.recv_buffer()
    assert view is not None and len(view) == len(frame) - arrived
    assert dec.buffered == arrived and len(dec._whole) == len(frame)
    view[:] = frame[arrived:]
    (got,) = dec.filled(len(view))
    assert bytes(got.payload) == bytes(16 << 20) and dec.buffered == 0


def test_a_frame_continued_in_place_is_checked_as_any_other():
    """A bad header found when the in-place frame completes is a FrameError from
    ``filled``; the decoder stops there, as after any framing error."""
    dec = FrameDecoder(4 << 20)
    dec.direct_min = 1 << 10
    body = b"\xc1" * 16 + bytes(1 << 20)           # 0xc1: never valid msgpack
    frame = (4 + len(body)).to_bytes(4, "big") + (16).to_bytes(4, "big") + body
    assert dec.feed(frame[:300 << 10]) == []
    view = dec.recv_buffer()
    view[:] = frame[300 << 10:]
    with pytest.raises(FrameError) as e:
        dec.filled(len(view))
    assert e.value.errno_name == "EPROTO"
    with pytest.raises(FrameError):
        dec.feed(frame_bytes({"t": "cm"}))


def test_a_payload_kept_past_its_frame_keeps_its_bytes():
    """The in-place buffer is used again for the next large frame only when no payload
    of the last one is still looked at: a payload kept is never written over."""
    dec = FrameDecoder(4 << 20)
    dec.direct_min = 1 << 10
    a = frame_bytes({"t": "cm"}, b"A" * (1 << 20))
    b = frame_bytes({"t": "cm"}, b"B" * (1 << 20))
    kept = []
    for frame in (a, b):
        assert dec.feed(frame[:200 << 10]) == []
        view = dec.recv_buffer()
        view[:] = frame[200 << 10:]
        kept += dec.filled(len(view))
        del view
    assert bytes(kept[0].payload) == b"A" * (1 << 20)
    assert bytes(kept[1].payload) == b"B" * (1 << 20)
    whole = dec._whole
    kept.clear()
    assert dec.feed(a[:200 << 10]) == []
    assert dec._whole is whole      # nothing looks at it now: used again
