"""A QP's send and receive rings shared with a local program (server/wq_ring.py,
server/wq_verbs.py, protocol/wq_ring.py, provider/wq.c), spoken by hand: the program
writes WQEs into its memfd, stores the producer index and rings the doorbell; the daemon
reads them into the engine and stores the consumer index as the WRs retire. Attacked: a
producer index no program can store (past the depth, moved back), garbage WQEs (an
opcode out of range, num_sge past the slot, inline data past max_inline_data, an SGE
of another session's lkey), a memfd not sealed or too small, and the requests a ring
queue does not take. Each is a clear error or a completion in error; the daemon reads
nothing outside the ring and another session's QP goes on."""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import struct

import pytest
from rawclient import Raw
from test_unix_socket import PAGE, SEALS, unix_daemon

# The layout as docs/protocol.md ("Send and receive rings") states it, spelled here on
# its own: each queue a header (producer u64 at 0, consumer u64 at 64) of 128 bytes,
# then slots; a send slot's header of 104 bytes then SGEs of 16 bytes or inline data,
# the stride 104 + max(16 * max_send_sge, max_inline_data) rounded up to 64; a receive
# slot wr_id, num_sge, then the SGEs at 16, the stride 16 + 16 * max_recv_sge, rounded.
PRODUCER, CONSUMER, HEADER = 0, 64, 128
SEND = struct.Struct("<QIIIIQIIQQIIIIIIQQI")
SQ_DEPTH, SQ_SGE, INLINE = 8, 2, 64
RQ_DEPTH, RQ_SGE = 8, 1
SQ_STRIDE = 192         # 104 + max(32, 64) = 168, rounded up to 64
RQ_STRIDE = 64          # 16 + 16
SQ_BYTES = HEADER + SQ_DEPTH * SQ_STRIDE
RQ_BYTES = HEADER + RQ_DEPTH * RQ_STRIDE
# verbs.h: enum ibv_wr_opcode, enum ibv_send_flags, enum ibv_wc_status, IBV_QPT_RC,
# enum ibv_qp_state, IBV_EVENT_QP_FATAL, IBV_ACCESS_* (local write, remote write/read)
WRITE, SEND_OP, ATOMIC_FA = 0, 2, 6
SIGNALED, INLINE_FLAG = 2, 8
SUCCESS, LOC_LEN_ERR, LOC_QP_OP_ERR, LOC_PROT_ERR, WR_FLUSH_ERR = 0, 1, 2, 4, 5
RC = 2
RESET, INIT, RTR, RTS, ERR = 0, 1, 2, 3, 6
QP_FATAL = 1
ACCESS = 1 | 2 | 4


def ring_fd(size: int, seal: int = SEALS) -> int:
    fd = os.memfd_create("softhca-wq", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seal)
    return fd


class Rings:
    """The program's view of its QP's ring: the send queue, then the receive queue."""

    def __init__(self, size: int = SQ_BYTES + RQ_BYTES, seal: int = SEALS) -> None:
        self.size = -(-size // PAGE) * PAGE
        self.fd = ring_fd(self.size, seal)
        self.map = mmap.mmap(self.fd, self.size)
        self.prod = {0: 0, SQ_BYTES: 0}

    def index(self, q: int, at: int) -> int:
        return struct.unpack_from("<Q", self.map, q + at)[0]

    def set_producer(self, q: int, v: int) -> None:
        struct.pack_into("<Q", self.map, q + PRODUCER, v)

    def send(self, wr_id: int, opcode: int = WRITE, flags: int = SIGNALED, sges=(),
             num_sge: int | None = None, inline: bytes = b"", raddr: int = 0, rkey: int = 0,
             inline_len: int | None = None, compare_add: int = 0) -> None:
        """A send WQE in the next slot (the producer index not stored)."""
        at = HEADER + (self.prod[0] % SQ_DEPTH) * SQ_STRIDE
        SEND.pack_into(self.map, at, wr_id, opcode, flags, 0, 0, raddr, rkey,
                       len(sges) if num_sge is None else num_sge, compare_add, 0, 0, 0, 0,
                       len(inline) if inline_len is None else inline_len, 0, 0, 0, 0, 0)
        for i, (addr, length, lkey) in enumerate(sges):
            struct.pack_into("<QII", self.map, at + 104 + 16 * i, addr, length, lkey)
        self.map[at + 104:at + 104 + len(inline)] = inline
        self.prod[0] += 1

    def recv(self, wr_id: int, sges=(), num_sge: int | None = None) -> None:
        at = SQ_BYTES + HEADER + (self.prod[SQ_BYTES] % RQ_DEPTH) * RQ_STRIDE
        struct.pack_into("<QI", self.map, at, wr_id, len(sges) if num_sge is None else num_sge)
        for i, (addr, length, lkey) in enumerate(sges):
            struct.pack_into("<QII", self.map, at + 16 + 16 * i, addr, length, lkey)
        self.prod[SQ_BYTES] += 1

    def publish(self, q: int = 0) -> None:
        self.set_producer(q, self.prod[q])

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


class Session:
    """A session with a PD, a polled CQ, an MR of 4 KiB and, when given a ring, an RC QP
    connected to itself in RTS whose queues are that ring."""

    @classmethod
    async def open(cls, d, u, rings: Rings | None = None, seq: int = 1,
                   queues: int = 3) -> Session:
        s = cls()
        s.raw = raw = await Raw.open_unix(u.path)
        s.ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        s.pd = (await raw.call("alloc_pd", ctx=s.ctx))["pd"]
        s.cq = (await raw.call("create_cq", ctx=s.ctx, cqe=256))["cq"]
        mr = await raw.call("reg_mr", pd=s.pd, length=4096, access=ACCESS)
        s.mr, s.lkey, s.rkey, s.addr = mr["mr"], mr["lkey"], mr["rkey"], mr["addr"]
        s.rings = rings
        fields = {}
        if rings is not None:
            assert (await raw.hand_over([rings.fd], seq))["t"] == "welcome"
            fields = {"ring": seq, "ring_queues": queues}
        r = await raw.call("create_qp", pd=s.pd, scq=s.cq, rcq=s.cq, qp_type=RC,
                           max_send_wr=SQ_DEPTH, max_recv_wr=RQ_DEPTH, max_send_sge=SQ_SGE,
                           max_recv_sge=RQ_SGE, max_inline_data=INLINE, sq_sig_all=False,
                           send_ops_flags=0, **fields)
        s.qp, s.qpn = r["qp"], r["qp_num"]
        if rings is not None:
            assert r["ring_queues"] == queues, r
        host, port = d.address.rsplit(":", 1)
        await s.modify(INIT, qp_access_flags=ACCESS)
        await s.modify(RTR, path_mtu=3, dest_qp_num=s.qpn, rq_psn=0, dest_host=host,
                       dest_port=int(port))
        await s.modify(RTS, sq_psn=0)
        return s

    async def modify(self, state: int, **attr) -> None:
        await self.raw.call("modify_qp", qp=self.qp, mask=1, attr={"qp_state": state, **attr})

    async def doorbell(self, rq: bool = False) -> None:
        # no reply: query_qp's answers that the daemon has read the doorbell before it
        self.raw.writer.write(self.raw.frame("doorbell", qp=self.qp, rq=rq))

    async def state(self) -> int:
        return (await self.raw.call("query_qp", qp=self.qp))["attr"]["qp_state"]

    async def wcs(self, n: int, timeout: float = 10.0) -> list[tuple[int, int]]:
        """(wr_id, status) of the next n completions, waiting for them."""
        out: list[tuple[int, int]] = []
        end = asyncio.get_running_loop().time() + timeout
        while len(out) < n:
            left = end - asyncio.get_running_loop().time()
            assert left > 0, f"{len(out)} of {n} completions came: {out}"
            got = await self.raw.call("poll_cq", cq=self.cq, num=n - len(out),
                                      timeout=min(left, 1.0))
            out += [(w[0], w[1]) for w in got["wcs"]]
        return out

    async def quiet(self) -> None:
        got = await self.raw.call("poll_cq", cq=self.cq, num=16, timeout=0.2)
        assert got["wcs"] == [], got

    def write(self, wr_id: int, offset: int, length: int = 8, flags: int = SIGNALED,
              **kw) -> None:
        """An RDMA WRITE of the MR's first bytes to ``offset`` in it (to itself)."""
        self.rings.send(wr_id, WRITE, flags, sges=[(self.addr, length, self.lkey)],
                        raddr=self.addr + offset, rkey=self.rkey, **kw)


@pytest.fixture
def rings():
    r = Rings()
    yield r
    r.close()


async def test_wqes_are_read_and_the_consumer_index_returns_the_room(tmp_path, rings):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings)
        s.write(1, 1024)
        s.write(2, 2048, flags=0)          # unsignaled: retired with no completion
        s.write(3, 3072)
        rings.publish()
        await s.doorbell()
        assert await s.wcs(2) == [(1, SUCCESS), (3, SUCCESS)]
        await s.quiet()
        assert rings.index(0, CONSUMER) == 3
        # the queue's depth, as the room: 8 more fit after 3 retired
        for i in range(8):
            s.write(10 + i, 256 + 8 * i)
        rings.publish()
        await s.doorbell()
        assert await s.wcs(8) == [(10 + i, SUCCESS) for i in range(8)]
        assert rings.index(0, CONSUMER) == 11 and await s.state() == RTS


async def test_inline_data_lands_as_written(tmp_path, rings):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings)
        data = bytes(range(40, 40 + INLINE))
        # no SGE, no lkey: the bytes are in the slot (ibv_post_send(3): inline data
        # names no memory the lkey must cover)
        rings.send(7, WRITE, SIGNALED | INLINE_FLAG, inline=data, raddr=s.addr + 512,
                   rkey=s.rkey)
        rings.publish()
        await s.doorbell()
        assert await s.wcs(1) == [(7, SUCCESS)]
        s.raw.writer.write(s.raw.frame("mr_read", mr=s.mr, offset=512, length=INLINE))
        fr = await s.raw.next()
        assert fr.header["t"] == "ok" and bytes(fr.payload) == data, fr.header


@pytest.mark.parametrize("producer", [
    pytest.param(lambda p: p + SQ_DEPTH + 1, id="past-the-depth"),
    pytest.param(lambda p: 2**64 - 1, id="to-the-top"),
    pytest.param(lambda p: p - 1, id="moved-back"),
])
async def test_a_producer_index_no_program_stores_breaks_the_queue(tmp_path, rings, producer):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings)
        other = await Session.open(d, u, Rings(), seq=2)
        try:
            s.write(1, 1024)
            s.write(2, 2048)
            rings.publish()
            await s.doorbell()
            assert await s.wcs(2) == [(1, SUCCESS), (2, SUCCESS)]
            rings.set_producer(0, producer(2))
            await s.doorbell()
            ev = (await s.raw.call("get_async_event", ctx=s.ctx, timeout=5))["event"]
            assert ev["event_type"] == QP_FATAL and ev["qp"] == s.qp, ev
            assert await s.state() == ERR
            assert rings.index(0, CONSUMER) == 2
            await s.quiet()
            # the daemon and another session's QP go on
            other.write(5, 1024)
            other.rings.publish()
            await other.doorbell()
            assert await other.wcs(1) == [(5, SUCCESS)]
            # reset, the queue starts over and is read again
            await s.modify(RESET)
            assert rings.index(0, CONSUMER) == 0
            rings.prod[0] = 0
            rings.set_producer(0, 0)
            host, port = d.address.rsplit(":", 1)
            await s.modify(INIT, qp_access_flags=ACCESS)
            await s.modify(RTR, path_mtu=3, dest_qp_num=s.qpn, rq_psn=0, dest_host=host,
                           dest_port=int(port))
            await s.modify(RTS, sq_psn=0)
            s.write(9, 1024)
            rings.publish()
            await s.doorbell()
            assert await s.wcs(1) == [(9, SUCCESS)]
            assert rings.index(0, CONSUMER) == 1
        finally:
            other.rings.close()


def _bad_opcode(s: Session) -> None:
    s.rings.send(2, 99)


def _num_sge_huge(s: Session) -> None:
    s.rings.send(2, WRITE, SIGNALED, num_sge=1000, raddr=s.addr, rkey=s.rkey)


def _inline_huge(s: Session) -> None:
    s.rings.send(2, WRITE, SIGNALED | INLINE_FLAG, inline_len=100000, raddr=s.addr,
                 rkey=s.rkey)


def _atomic_of_4_bytes(s: Session) -> None:
    s.rings.send(2, ATOMIC_FA, SIGNALED, sges=[(s.addr, 4, s.lkey)], raddr=s.addr,
                 rkey=s.rkey)


def _past_max_msg(s: Session) -> None:
    s.rings.send(2, SEND_OP, SIGNALED, sges=[(s.addr, 2**31, s.lkey), (s.addr, 8, s.lkey)])


@pytest.mark.parametrize("spoil, status", [
    pytest.param(_bad_opcode, LOC_QP_OP_ERR, id="opcode-out-of-range"),
    pytest.param(_num_sge_huge, LOC_QP_OP_ERR, id="num_sge-huge"),
    pytest.param(_inline_huge, LOC_QP_OP_ERR, id="inline-past-max_inline_data"),
    pytest.param(_atomic_of_4_bytes, LOC_QP_OP_ERR, id="atomic-of-4-bytes"),
    pytest.param(_past_max_msg, LOC_LEN_ERR, id="past-max_msg_sz"),
])
async def test_a_garbage_wqe_completes_in_error_and_the_rest_flush(tmp_path, rings, spoil,
                                                                   status):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings)
        s.write(1, 1024)
        spoil(s)
        s.write(3, 2048, flags=0)      # flushed: an error completes signaled or not
        rings.publish()
        await s.doorbell()
        assert await s.wcs(3) == [(1, SUCCESS), (2, status), (3, WR_FLUSH_ERR)]
        assert await s.state() == ERR
        assert rings.index(0, CONSUMER) == 3


async def test_an_sge_of_another_sessions_lkey_is_a_protection_error(tmp_path, rings):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings)
        other = await Session.open(d, u)
        s.rings.send(1, WRITE, SIGNALED, sges=[(other.addr, 8, other.lkey)],
                     raddr=s.addr, rkey=s.rkey)
        s.write(2, 1024)
        rings.publish()
        await s.doorbell()
        assert await s.wcs(2) == [(1, LOC_PROT_ERR), (2, WR_FLUSH_ERR)]
        # both sessions go on
        s.raw.writer.write(s.raw.frame("mr_read", mr=s.mr, offset=0, length=8))
        assert (await s.raw.next()).header["t"] == "ok"
        assert (await other.raw.call("query_device", ctx=other.ctx))["attr"]


async def test_a_receive_wqe_past_its_slot_completes_in_error(tmp_path, rings):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings)
        rings.recv(1, [(s.addr, 64, s.lkey)])
        rings.recv(2, num_sge=1 << 30)
        rings.recv(3, [(s.addr, 64, s.lkey)])
        rings.publish(SQ_BYTES)
        await s.doorbell(rq=True)
        assert await s.wcs(3) == [(1, WR_FLUSH_ERR), (2, LOC_QP_OP_ERR), (3, WR_FLUSH_ERR)]
        assert rings.index(SQ_BYTES, CONSUMER) == 3


async def test_receives_are_consumed_and_retired(tmp_path, rings):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings)
        for i in range(3):
            rings.recv(10 + i, [(s.addr + 1024 + 64 * i, 64, s.lkey)])
        rings.publish(SQ_BYTES)
        await s.doorbell(rq=True)
        await s.quiet()
        assert rings.index(SQ_BYTES, CONSUMER) == 0     # posted, none consumed
        s.rings.send(1, SEND_OP, SIGNALED, sges=[(s.addr, 16, s.lkey)])
        rings.publish()
        await s.doorbell()
        got = sorted(await s.wcs(2))
        assert got == [(1, SUCCESS), (10, SUCCESS)], got
        assert rings.index(SQ_BYTES, CONSUMER) == 1


async def test_wqes_of_a_qp_not_ready_wait_for_it(tmp_path, rings):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
        cq = (await raw.call("create_cq", ctx=ctx, cqe=16))["cq"]
        assert (await raw.hand_over([rings.fd], 1))["t"] == "welcome"
        qp = (await raw.call("create_qp", pd=pd, scq=cq, rcq=cq, qp_type=RC,
                             max_send_wr=SQ_DEPTH, max_recv_wr=RQ_DEPTH,
                             max_send_sge=SQ_SGE, max_recv_sge=RQ_SGE,
                             max_inline_data=INLINE, sq_sig_all=False, send_ops_flags=0,
                             ring=1, ring_queues=3))["qp"]
        rings.recv(1)
        rings.publish(SQ_BYTES)
        raw.writer.write(raw.frame("doorbell", qp=qp, rq=True))
        await raw.call("modify_qp", qp=qp, mask=1, attr={"qp_state": INIT})
        # read once the QP takes receives: to ERR, it flushes
        await raw.call("modify_qp", qp=qp, mask=1, attr={"qp_state": ERR})
        got = await raw.call("poll_cq", cq=cq, num=4, timeout=2)
        assert [(w[0], w[1]) for w in got["wcs"]] == [(1, WR_FLUSH_ERR)], got


async def test_a_doorbell_reads_a_full_deep_queue_in_bounded_steps(tmp_path):
    depth = 2048
    size = HEADER + depth * SQ_STRIDE + HEADER + RQ_DEPTH * RQ_STRIDE
    r = Rings(size)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
            pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
            cq = (await raw.call("create_cq", ctx=ctx, cqe=4096))["cq"]
            assert (await raw.hand_over([r.fd], 1))["t"] == "welcome"
            qp = (await raw.call("create_qp", pd=pd, scq=cq, rcq=cq, qp_type=RC,
                                 max_send_wr=depth, max_recv_wr=RQ_DEPTH,
                                 max_send_sge=SQ_SGE, max_recv_sge=RQ_SGE,
                                 max_inline_data=INLINE, sq_sig_all=False,
                                 send_ops_flags=0, ring=1, ring_queues=1))["qp"]
            await raw.call("modify_qp", qp=qp, mask=1, attr={"qp_state": INIT})
            await raw.call("modify_qp", qp=qp, mask=1, attr={"qp_state": ERR})
            for i in range(depth):
                at = HEADER + i * SQ_STRIDE
                SEND.pack_into(r.map, at, i, WRITE, 0, *([0] * 16))
            r.set_producer(0, depth)
            raw.writer.write(raw.frame("doorbell", qp=qp))
            got: list = []
            while len(got) < depth:
                got += (await raw.call("poll_cq", cq=cq, num=depth, timeout=5))["wcs"]
            assert [w[0] for w in got] == list(range(depth))
            assert {w[1] for w in got} == {WR_FLUSH_ERR}
            assert r.index(0, CONSUMER) == depth
    finally:
        r.close()


@pytest.mark.parametrize("size, seal, words", [
    pytest.param(SQ_BYTES + RQ_BYTES - 64, SEALS, "needs", id="too-small"),
    pytest.param(PAGE * 4, 0, "F_SEAL_SHRINK", id="not-sealed"),
])
async def test_a_memfd_the_qp_cannot_trust_is_refused(tmp_path, size, seal, words):
    fd = ring_fd(size, seal)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
            pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
            cq = (await raw.call("create_cq", ctx=ctx, cqe=16))["cq"]
            assert (await raw.hand_over([fd], 1))["t"] == "welcome"
            h = await raw.refused("create_qp", pd=pd, scq=cq, rcq=cq, qp_type=RC,
                                  max_send_wr=SQ_DEPTH, max_recv_wr=RQ_DEPTH,
                                  max_send_sge=SQ_SGE, max_recv_sge=RQ_SGE,
                                  max_inline_data=INLINE, sq_sig_all=False,
                                  send_ops_flags=0, ring=1, ring_queues=3)
            assert h["errno"] == "EINVAL" and words in h["msg"], h
            # nothing was made: the session's QP count is as before
            assert (await raw.call("query_device", ctx=ctx))["attr"]
    finally:
        os.close(fd)


async def test_a_ring_queue_takes_no_post_request_and_a_doorbell_needs_a_ring(tmp_path,
                                                                            rings):
    async with unix_daemon(tmp_path) as (d, u):
        s = await Session.open(d, u, rings, queues=1)
        h = await s.raw.refused("post_send", qp=s.qp, wrs=[
            {"wr_id": 1, "opcode": WRITE, "sg": [], "send_flags": 0, "rkey": 0,
             "remote_addr": 0, "compare_add": 0, "swap": 0, "invalidate_rkey": 0}])
        assert h["errno"] == "EINVAL" and "ring" in h["msg"], h
        # its receive queue has no ring: requests post to it, a doorbell is refused
        await s.raw.call("post_recv", qp=s.qp, wrs=[{"wr_id": 1, "sg": []}])
        h = await s.raw.refused("doorbell", qp=s.qp, rq=True)
        assert h["errno"] == "EINVAL" and "no receive ring" in h["msg"], h
        h = await s.raw.refused("doorbell", qp=12345)
        assert h["errno"] == "ENOENT", h


async def test_a_ring_over_tcp_is_not_supported(tmp_path):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open(d.address)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
        cq = (await raw.call("create_cq", ctx=ctx, cqe=16))["cq"]
        h = await raw.refused("create_qp", pd=pd, scq=cq, rcq=cq, qp_type=RC,
                              max_send_wr=SQ_DEPTH, max_recv_wr=RQ_DEPTH,
                              max_send_sge=SQ_SGE, max_recv_sge=RQ_SGE,
                              max_inline_data=INLINE, sq_sig_all=False, send_ops_flags=0,
                              ring=1, ring_queues=3)
        assert h["errno"] == "EOPNOTSUPP", h


# mlx5dv.h: MLX5DV_QP_EX_WITH_MKEY_CONFIGURE
MKEY_CONFIGURE = 4


@pytest.mark.parametrize("case", ["srq-with-a-receive-ring", "mkey-builders-with-a-send-ring",
                                  "queues-without-a-ring"])
async def test_a_ring_the_qp_cannot_take_is_refused(tmp_path, rings, case):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
        cq = (await raw.call("create_cq", ctx=ctx, cqe=16))["cq"]
        fields = {"ring": 1, "ring_queues": 3}
        if case == "srq-with-a-receive-ring":
            fields["srq"] = (await raw.call("create_srq", pd=pd, max_wr=8, max_sge=1))["srq"]
            words = "SRQ"
        elif case == "mkey-builders-with-a-send-ring":
            fields["send_ops_flags"] = MKEY_CONFIGURE
            words = "MKEY configure"
        else:
            fields = {"ring_queues": 1}
            words = "no ring"
        if "ring" in fields:
            assert (await raw.hand_over([rings.fd], 1))["t"] == "welcome"
        h = await raw.refused("create_qp", **{
            "pd": pd, "scq": cq, "rcq": cq, "qp_type": RC, "max_send_wr": SQ_DEPTH,
            "max_recv_wr": RQ_DEPTH, "max_send_sge": SQ_SGE, "max_recv_sge": RQ_SGE,
            "max_inline_data": INLINE, "sq_sig_all": False, "send_ops_flags": 0, **fields})
        assert h["errno"] == "EINVAL" and words in h["msg"], h
