"""A ring CQ's completion channel, spoken by hand: the program hands the daemon the write
end of the channel's event socket and the 8 bytes an event is (the CQ's user handle,
what ibv_get_cq_event reads back), and the daemon writes each event there itself, as
the kernel writes into a channel's file (server/cq_ring.py EventSocket). Attacked: an
fd that is no UNIX stream socket, a handoff without its value and the reverse, a
channel on a CQ with no ring, and a program that reads no events until its socket is
full, where the event must still come (as a frame) and the daemon never block."""

from __future__ import annotations

import os
import socket
import struct

import pytest
from rawclient import Raw
from test_cq_ring_attacks import ERR, PRODUCER, Ring, add_qp, frames_until_ok, ring_fd
from test_unix_socket import PAGE, unix_daemon

# any u64: the daemon must hand it back unchanged, byte for byte (little-endian, as a
# struct ib_uverbs_comp_event_desc's cq_handle is on x86-64)
HANDLE = 0x1122334455667788


@pytest.fixture
def ring():
    r = Ring(8)
    yield r
    r.close()


@pytest.fixture
def pair():
    read_end, write_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read_end.setblocking(False)
    yield read_end, write_end
    read_end.close()
    write_end.close()


async def channel_session(u, ring: Ring, write_end: socket.socket):
    """A session with a ring CQ of 8 entries bound to a channel: (raw, pd, cq)."""
    raw = await Raw.open_unix(u.path)
    ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
    pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
    assert (await raw.hand_over([ring.fd], 1))["t"] == "welcome"
    assert (await raw.hand_over([write_end.fileno()], 2))["t"] == "welcome"
    cq = (await raw.call("create_cq", ctx=ctx, cqe=8, push=True, ring=1, channel=2,
                         event=HANDLE))["cq"]
    return raw, pd, cq


async def test_the_event_is_written_into_the_channel_not_sent_as_a_frame(tmp_path, ring,
                                                                          pair):
    read_end, write_end = pair
    async with unix_daemon(tmp_path) as (d, u):
        raw, pd, cq = await channel_session(u, ring, write_end)
        qp = await add_qp(raw, pd, cq)
        raw.writer.write(raw.frame("req_notify_cq", cq=cq))
        await raw.call("post_recv", qp=qp, wrs=[{"wr_id": 1, "sg": []}])
        # the flush writes an entry: no cq_event frame, the 8 bytes in the socket
        got = await frames_until_ok(raw, "modify_qp", qp=qp, mask=1, attr={"qp_state": ERR})
        assert got == [("ok", None)], got
        assert ring.index(PRODUCER) == 1
        assert read_end.recv(64) == struct.pack("<Q", HANDLE)
        # armed again with the entry unpolled: at once, once
        raw.writer.write(raw.frame("req_notify_cq", cq=cq))
        assert await frames_until_ok(raw, "query_qp", qp=qp) == [("ok", None)]
        assert read_end.recv(64) == struct.pack("<Q", HANDLE)
        with pytest.raises(BlockingIOError):
            read_end.recv(64)


async def test_a_full_channel_gets_its_event_as_a_frame_and_the_daemon_goes_on(tmp_path, ring,
                                                                               pair):
    read_end, write_end = pair
    async with unix_daemon(tmp_path) as (d, u):
        raw, pd, cq = await channel_session(u, ring, write_end)
        qp = await add_qp(raw, pd, cq)
        # a program that reads no events: its socket full to the last byte
        write_end.setblocking(False)
        filled = 0
        while True:
            try:
                filled += write_end.send(b"\0" * 4096)
            except BlockingIOError:
                break
        raw.writer.write(raw.frame("req_notify_cq", cq=cq))
        await raw.call("post_recv", qp=qp, wrs=[{"wr_id": 1, "sg": []}])
        got = await frames_until_ok(raw, "modify_qp", qp=qp, mask=1, attr={"qp_state": ERR})
        assert got == [("cq_event", cq), ("ok", None)], got
        # nothing of the daemon's got into the stream: only what the test wrote
        drained = 0
        while True:
            try:
                data = read_end.recv(1 << 16)
            except BlockingIOError:
                break
            assert data.count(0) == len(data)
            drained += len(data)
        assert drained == filled


async def test_destroying_the_cq_closes_the_daemons_end(tmp_path, ring, pair):
    read_end, write_end = pair
    async with unix_daemon(tmp_path) as (d, u):
        raw, pd, cq = await channel_session(u, ring, write_end)
        await raw.call("destroy_cq", cq=cq)
        # with the test's own end closed too, no writer is left: the read end sees EOF
        write_end.close()
        read_end.setblocking(True)
        read_end.settimeout(5)
        assert read_end.recv(64) == b""


async def refused_channel(u, rg: Ring, fd: int, **fields) -> dict:
    raw = await Raw.open_unix(u.path)
    ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
    assert (await raw.hand_over([rg.fd], 1))["t"] == "welcome"
    assert (await raw.hand_over([fd], 2))["t"] == "welcome"
    return await raw.refused("create_cq", ctx=ctx, cqe=8, push=True, **fields)


@pytest.mark.parametrize("kind", ["memfd", "pipe", "datagram"])
async def test_a_channel_fd_that_is_no_unix_stream_socket_is_refused(tmp_path, ring, kind):
    others = []
    if kind == "memfd":
        fd = ring_fd(PAGE)
    elif kind == "pipe":
        fd, w = os.pipe()
        others.append(w)
    else:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        fd = a.detach()
        others.append(b.detach())
    try:
        async with unix_daemon(tmp_path) as (d, u):
            h = await refused_channel(u, ring, fd, ring=1, channel=2, event=HANDLE)
            assert h["errno"] == "EINVAL" and "socket" in h["msg"], h
            # the daemon is unharmed: the same session shape works with a good fd
            read_end, write_end = socket.socketpair()
            try:
                raw, pd, cq = await channel_session(u, Ring(8), write_end)
                assert cq
            finally:
                read_end.close()
                write_end.close()
    finally:
        for x in [fd, *others]:
            os.close(x)


@pytest.mark.parametrize("fields", [
    {"ring": 1, "channel": 2},                    # no event value
    {"ring": 1, "event": HANDLE},                 # a value and no channel
    {"channel": 2, "event": HANDLE},              # a channel on a CQ without a ring
])
async def test_a_channel_without_its_parts_is_refused(tmp_path, ring, pair, fields):
    async with unix_daemon(tmp_path) as (d, u):
        h = await refused_channel(u, ring, pair[1].fileno(), **fields)
        assert h["errno"] == "EINVAL", h


async def test_an_event_value_no_u64_is_refused(tmp_path, ring, pair):
    # msgpack carries at most a u64 and a negative int: the latter is the one to refuse
    async with unix_daemon(tmp_path) as (d, u):
        h = await refused_channel(u, ring, pair[1].fileno(), ring=1, channel=2, event=-1)
        assert h["errno"] in ("EINVAL", "EPROTO"), h
