"""A CQ's completion ring shared with a local program (server/cq_ring.py,
protocol/cq_ring.py, provider/cq.c), spoken by hand: the daemon writes each completion
into the program's memfd and publishes the producer index, and reads the consumer
index for the room. Attacked: a memfd too small for the CQ, an fd that is no memfd, a
memfd not sealed against shrinking, and a consumer index the program moves where no
poll can put it, forward past the producer or backward past the ring. None may make
the daemon write outside the ring; a broken index puts the CQ in error
(IBV_EVENT_CQ_ERR), as an overrun does."""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
import tempfile

import pytest
from rawclient import Raw
from test_unix_socket import PAGE, SEALS, unix_daemon

# The ring's layout as docs/native.md states it, spelled here on its own: two 8-byte
# indices, each on a 64-byte line, then 64-byte entries (wr_id u64, then u32 status,
# opcode, byte_len, imm_data, qp_num, wc_flags, vendor_err, invalidated_rkey, src_qp).
PRODUCER, CONSUMER, HEADER, ENTRY = 0, 64, 128, 64
# verbs.h: IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV; IBV_EVENT_CQ_ERR
WR_FLUSH_ERR, WC_RECV, EVENT_CQ_ERR = 5, 128, 0
# IBV_QPT_RC; IBV_QPS_INIT, IBV_QPS_ERR; IBV_QP_STATE | IBV_QP_ACCESS_FLAGS
RC, INIT, ERR, INIT_MASK = 2, 1, 6, 1 | 8


def ring_fd(size: int, seal: int = SEALS) -> int:
    fd = os.memfd_create("softhca-cq", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seal)
    return fd


class Ring:
    """The program's view of its ring: its own mapping of the memfd."""

    def __init__(self, slots: int) -> None:
        self.fd = ring_fd(max(PAGE, HEADER + slots * ENTRY))
        self.map = mmap.mmap(self.fd, max(PAGE, HEADER + slots * ENTRY))
        self.slots = slots

    def index(self, at: int) -> int:
        return struct.unpack_from("<Q", self.map, at)[0]

    def set_consumer(self, v: int) -> None:
        struct.pack_into("<Q", self.map, CONSUMER, v)

    def entry(self, i: int) -> tuple:
        return struct.unpack_from("<QIIIIIIIII", self.map, HEADER + (i % self.slots) * ENTRY)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


async def add_qp(raw: Raw, pd: int, cq: int) -> int:
    """An RC QP in INIT on ``cq``, to flush receives into it."""
    qp = (await raw.call("create_qp", pd=pd, scq=cq, rcq=cq, qp_type=RC, max_send_wr=4,
                         max_recv_wr=16, max_send_sge=1, max_recv_sge=1, max_inline_data=0,
                         sq_sig_all=False, send_ops_flags=0))["qp"]
    await raw.call("modify_qp", qp=qp, mask=INIT_MASK,
                   attr={"qp_state": INIT, "qp_access_flags": 0})
    return qp


async def ring_session(u, cqe: int, ring: Ring, seq: int = 1):
    """A session with a ring CQ of cqe entries on ring: (raw, ctx, pd, cq)."""
    raw = await Raw.open_unix(u.path)
    ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
    pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
    assert (await raw.hand_over([ring.fd], seq))["t"] == "welcome"
    r = await raw.call("create_cq", ctx=ctx, cqe=cqe, push=True, ring=seq)
    assert r["ring"] is True, r
    return raw, ctx, pd, r["cq"]


async def flush(raw: Raw, pd: int, cq: int, wr_ids: list[int]) -> None:
    """Receives posted on a new QP, then the QP to ERR: one IBV_WC_WR_FLUSH_ERR each."""
    qp = await add_qp(raw, pd, cq)
    await raw.call("post_recv", qp=qp, wrs=[{"wr_id": w, "sg": []} for w in wr_ids])
    await raw.call("modify_qp", qp=qp, mask=1, attr={"qp_state": ERR})


@pytest.fixture
def ring():
    r = Ring(8)
    yield r
    r.close()


async def test_completions_are_written_into_the_ring_and_published(tmp_path, ring):
    async with unix_daemon(tmp_path) as (d, u):
        raw, _, pd, cq = await ring_session(u, 8, ring)
        assert ring.index(PRODUCER) == 0
        await flush(raw, pd, cq, [0x1111, 0xFFFF_FFFF_0000_0001, 3])
        assert ring.index(PRODUCER) == 3
        got = [ring.entry(i) for i in range(3)]
        assert [e[0] for e in got] == [0x1111, 0xFFFF_FFFF_0000_0001, 3]
        assert {(e[1], e[2]) for e in got} == {(WR_FLUSH_ERR, WC_RECV)}
        assert ring.map[HEADER + 3 * ENTRY:HEADER + 8 * ENTRY] == bytes(5 * ENTRY)
        # cq_credit is not a ring CQ's: its consumer index is
        h = await raw.refused("cq_credit", credits=[[cq, 1]])
        assert h["errno"] == "EPROTO" and "consumer index" in h["msg"], h


async def test_the_consumer_index_returns_the_room(tmp_path):
    ring = Ring(4)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw, ctx, pd, cq = await ring_session(u, 4, ring)
            await flush(raw, pd, cq, [1, 2, 3, 4])
            assert ring.index(PRODUCER) == 4
            ring.set_consumer(3)            # three polled: room for three more
            await flush(raw, pd, cq, [5, 6, 7])
            assert ring.index(PRODUCER) == 7
            # entry i in slot i % 4
            assert [ring.entry(i)[0] for i in range(3, 7)] == [4, 5, 6, 7]
            ev = await raw.call("get_async_event", ctx=ctx, timeout=0)
            assert ev.get("event") is None, ev
    finally:
        ring.close()


async def cq_err_raised(raw: Raw, ctx: int, cq: int) -> None:
    ev = (await raw.call("get_async_event", ctx=ctx, timeout=5))["event"]
    assert ev["event_type"] == EVENT_CQ_ERR and ev["cq"] == cq, ev


@pytest.mark.parametrize("consumer", [
    pytest.param(lambda p: p + 1, id="forward-past-the-producer"),
    pytest.param(lambda p: 2**64 - 1, id="forward-to-the-top"),
    pytest.param(lambda p: 0, id="backward-past-the-ring"),
])
async def test_a_consumer_index_no_poll_gives_errors_the_cq(tmp_path, ring, consumer):
    async with unix_daemon(tmp_path) as (d, u):
        raw, ctx, pd, cq = await ring_session(u, 8, ring)
        await flush(raw, pd, cq, list(range(1, 9)))
        ring.set_consumer(8)            # all polled
        await flush(raw, pd, cq, list(range(9, 17)))
        assert ring.index(PRODUCER) == 16
        ring.set_consumer(consumer(16))
        before = bytes(ring.map)
        await flush(raw, pd, cq, [99])
        await cq_err_raised(raw, ctx, cq)
        # nothing written: not the entry, not the producer
        assert bytes(ring.map) == before


async def test_a_consumer_moved_back_within_the_ring_only_shrinks_the_room(tmp_path, ring):
    async with unix_daemon(tmp_path) as (d, u):
        raw, ctx, pd, cq = await ring_session(u, 8, ring)
        await flush(raw, pd, cq, [1, 2, 3, 4, 5, 6])
        ring.set_consumer(6)
        ring.set_consumer(0)            # "unpolls" six: room for two only
        await flush(raw, pd, cq, [7, 8, 9])    # three: an overrun, as today's
        await cq_err_raised(raw, ctx, cq)
        assert ring.index(PRODUCER) == 8    # the two that fit, no more
        assert [ring.entry(i)[0] for i in range(8)] == [1, 2, 3, 4, 5, 6, 7, 8]


async def refused_ring(u, fd: int) -> dict:
    raw = await Raw.open_unix(u.path)
    ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
    assert (await raw.hand_over([fd], 4))["t"] == "welcome"
    return await raw.refused("create_cq", ctx=ctx, cqe=64, push=True, ring=4)


async def test_a_memfd_too_small_for_the_cq_is_refused(tmp_path):
    fd = ring_fd(HEADER + 63 * ENTRY)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            h = await refused_ring(u, fd)
            assert h["errno"] == "EINVAL" and "needs" in h["msg"], h
    finally:
        os.close(fd)


async def test_a_memfd_not_sealed_against_shrinking_is_refused(tmp_path):
    fd = ring_fd(PAGE * 2, seal=0)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            h = await refused_ring(u, fd)
            assert h["errno"] == "EINVAL" and "F_SEAL_SHRINK" in h["msg"], h
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["file", "pipe"])
async def test_an_fd_that_is_no_memfd_is_refused(tmp_path, kind):
    if kind == "file":
        f = tempfile.TemporaryFile(dir=tmp_path)
        f.truncate(PAGE * 4)
        fd, other = os.dup(f.fileno()), None
        f.close()
    else:
        fd, other = os.pipe()
    try:
        async with unix_daemon(tmp_path) as (d, u):
            h = await refused_ring(u, fd)
            assert h["errno"] == "EINVAL" and "not a memfd" in h["msg"], h
    finally:
        os.close(fd)
        if other is not None:
            os.close(other)


async def test_a_ring_over_tcp_is_not_supported(tmp_path):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open(d.address)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        h = await raw.refused("create_cq", ctx=ctx, cqe=8, push=True, ring=1)
        assert h["errno"] == "EOPNOTSUPP", h


async def frames_until_ok(raw: Raw, verb: str, **fields) -> list[tuple]:
    """Sends a request; the (kind, cq) of every frame up to its reply, the reply's too."""
    raw.writer.write(raw.frame(verb, **fields))
    got = []
    while not got or got[-1][0] != "ok":
        h = (await raw.next()).header
        assert h["t"] != "err", h
        got.append((h["t"], h.get("cq")))
    return got


async def test_arming_pushes_one_event_at_the_next_entry(tmp_path, ring):
    async with unix_daemon(tmp_path) as (d, u):
        raw, ctx, pd, cq = await ring_session(u, 8, ring)
        qp = await add_qp(raw, pd, cq)
        # arming has no reply: the next frame is the post's
        raw.writer.write(raw.frame("req_notify_cq", cq=cq))
        assert await frames_until_ok(raw, "post_recv", qp=qp, wrs=[
            {"wr_id": 1, "sg": []}, {"wr_id": 2, "sg": []}]) == [("ok", None)]
        # the flush writes two entries: one event, before the reply
        got = await frames_until_ok(raw, "modify_qp", qp=qp, mask=1, attr={"qp_state": ERR})
        assert got == [("cq_event", cq), ("ok", None)], got
        assert ring.index(PRODUCER) == 2
        # armed again with the two unpolled: the event at once
        raw.writer.write(raw.frame("req_notify_cq", cq=cq))
        fr = await raw.next()
        assert (fr.header["t"], fr.header["cq"]) == ("cq_event", cq), fr.header
        # polled, armed: nothing until the next entry
        ring.set_consumer(2)
        raw.writer.write(raw.frame("req_notify_cq", cq=cq))
        assert await frames_until_ok(raw, "query_qp", qp=qp) == [("ok", None)]


async def test_resize_moves_the_unpolled_entries_to_the_new_ring(tmp_path, ring):
    big = Ring(32)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw, ctx, pd, cq = await ring_session(u, 8, ring)
            await flush(raw, pd, cq, [1, 2, 3, 4, 5])
            ring.set_consumer(2)
            small = Ring(2)
            assert (await raw.hand_over([small.fd], 7))["t"] == "welcome"
            h = await raw.refused("resize_cq", cq=cq, cqe=2, ring=7)
            assert h["errno"] == "EINVAL" and "3 completions not polled" in h["msg"], h
            small.close()
            assert (await raw.hand_over([big.fd], 8))["t"] == "welcome"
            assert (await raw.call("resize_cq", cq=cq, cqe=32, ring=8))["cqe"] == 32
            assert big.index(PRODUCER) == 3
            assert [big.entry(i)[0] for i in range(3)] == [3, 4, 5]
            ring.set_consumer(0)        # the old ring is no longer read
            await flush(raw, pd, cq, [6])
            assert big.index(PRODUCER) == 4 and big.entry(3)[0] == 6
    finally:
        big.close()
