"""The RC QP state machine (engine/rc.py): two HCAs, two connected QPs, and a loop in
the test that carries packets between them on a fake clock, with seeded faults."""

from __future__ import annotations

import pytest

from softhca.engine.hca import HCA
from softhca.engine.rc import RCQP, Packet, RecvWR, SendWR, psn_add, psn_diff
from softhca.protocol.attrs import SGE, SigBlockAttr, SigBlockDomain, SigCrc
from softhca.protocol.enums import (
    AccessFlags,
    BlockSize,
    MkeyErrType,
    Mtu,
    QpState,
    SendFlags,
    SigCrcType,
    SigMask,
    SigType,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from softhca.protocol.errors import RDMAError

import oracle

ALL = (AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
       | AccessFlags.REMOTE_ATOMIC)
SIG = int(SendFlags.SIGNALED)
# PSNs start just below 2^24 so every test crosses the wrap.
A_PSN, B_PSN = 0xFFFFF0, 0xFFFFE0


class Pair:
    """QP ``a`` on one HCA connected to QP ``b`` on another; ``run`` moves packets."""

    def __init__(self, mtu: Mtu = Mtu.MTU_1024, b_node=None, **rts) -> None:
        self.ha = HCA("mlx5_0")
        self.pda = self.ha.alloc_pd()
        self.hb, self.pdb = (b_node.hca, b_node.pd) if b_node else (HCA("mlx5_1"), None)
        self.pdb = self.pdb or self.hb.alloc_pd()
        self.a = RCQP(self.pda, 0x11, sq_depth=256, rq_depth=256)
        self.b = RCQP(self.pdb, 0x22, sq_depth=256, rq_depth=256)
        for qp, peer, rq, sq in ((self.a, self.b, B_PSN, A_PSN), (self.b, self.a, A_PSN, B_PSN)):
            qp.modify_to_init()
            qp.modify_to_rtr(peer.qp_num, rq, mtu)
            qp.modify_to_rts(sq, **rts)
        self.now = 0.0
        self.wcs = {"a_send": [], "a_recv": [], "b_send": [], "b_recv": []}
        self.delivered = 0

    def mr(self, pd, data: bytes | int, access=ALL):
        mr = (self.ha if pd is self.pda else self.hb).reg_mr(
            pd, data if isinstance(data, int) else max(1, len(data)), access)
        if not isinstance(data, int):
            mr.write(data)
        return mr

    def _collect(self) -> None:
        self.wcs["a_send"] += self.a.poll_send_cq()
        self.wcs["a_recv"] += self.a.poll_recv_cq()
        self.wcs["b_send"] += self.b.poll_send_cq()
        self.wcs["b_recv"] += self.b.poll_recv_cq()

    def run(self, fault=None, done=None, max_rounds: int = 100_000) -> None:
        qps = {self.a.qp_num: self.a, self.b.qp_num: self.b}
        for _ in range(max_rounds):
            out = self.a.poll_packets(self.now) + self.b.poll_packets(self.now)
            if fault is not None:
                out = fault(out)
            for p in out:
                self.delivered += 1
                qps[p.dest_qp].receive(p, self.now)
            self._collect()
            if done is not None and done():
                return
            if out or (fault is not None and fault.held):
                self.now += 1e-5
                continue
            deadlines = [d for d in (self.a.next_deadline(), self.b.next_deadline())
                         if d is not None]
            if not deadlines:
                return
            self.now = max(self.now, min(deadlines))
        raise AssertionError("the QPs did not settle")


class Faults:
    """Drop, duplicate and hold back (reorder) packets, deterministic given the rng."""

    def __init__(self, rng, drop=0.0, dup=0.0, reorder=0.0) -> None:
        self.rng, self.drop, self.dup, self.reorder = rng, drop, dup, reorder
        self.held: list[Packet] = []
        self.fired = {"drop": 0, "dup": 0, "reorder": 0}

    def __call__(self, pkts: list[Packet]) -> list[Packet]:
        out, self.held = self.held, []
        for p in pkts:
            r = self.rng.random()
            if r < self.drop:
                self.fired["drop"] += 1
                continue
            copies = [p, p] if r < self.drop + self.dup else [p]
            self.fired["dup"] += len(copies) - 1
            for c in copies:
                if self.rng.random() < self.reorder:
                    self.fired["reorder"] += 1
                    self.held.append(c)
                else:
                    out.append(c)
        # Held packets overtake nothing: they go out behind the next batch.
        return out


def status_of(wcs):
    return [(w.wr_id, w.status) for w in wcs]


# -- data paths -------------------------------------------------------------------

def test_send_recv_small(rng):
    p = Pair()
    data = rng.randbytes(100)
    src, dst = p.mr(p.pda, data), p.mr(p.pdb, 256)
    p.b.post_recv(RecvWR(7, [SGE(dst.addr, 256, dst.lkey)]))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 100, src.lkey)], SIG), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    [wc] = p.wcs["b_recv"]
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.qp_num) == (
        7, WcStatus.SUCCESS, WcOpcode.RECV, 100, p.b.qp_num)
    assert dst.read(100) == data and dst.read(156, 100) == bytes(156)


@pytest.mark.parametrize("mtu", [Mtu.MTU_256, Mtu.MTU_1024, Mtu.MTU_4096])
@pytest.mark.parametrize("size", [0, 1, 256, 4096, 10_001])
def test_send_recv_multi_packet_scatter_gather(rng, mtu, size):
    """Gathered over two SGEs, scattered over three, across packet boundaries."""
    p = Pair(mtu)
    data = rng.randbytes(size)
    src = p.mr(p.pda, data + bytes(8))
    h = size // 3
    dst = p.mr(p.pdb, size + 300)
    p.b.post_recv(RecvWR(9, [SGE(dst.addr, 100, dst.lkey), SGE(dst.addr + 200, h, dst.lkey),
                             SGE(dst.addr + 300 + h, size, dst.lkey)]))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, h, src.lkey),
                                            SGE(src.addr + h, size - h, src.lkey)], SIG), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    assert [(w.status, w.byte_len) for w in p.wcs["b_recv"]] == [(WcStatus.SUCCESS, size)]
    got = dst.read(min(100, size)) + dst.read(max(0, min(h, size - 100)), 200)
    got += dst.read(max(0, size - 100 - h), 300 + h)
    assert got == data


@pytest.mark.parametrize("mtu", [Mtu.MTU_256, Mtu.MTU_4096])
def test_rdma_write(rng, mtu):
    p = Pair(mtu)
    data = rng.randbytes(9000)
    src, dst = p.mr(p.pda, data), p.mr(p.pdb, 10_000)
    p.a.post_send(SendWR(3, WrOpcode.RDMA_WRITE, [SGE(src.addr, 9000, src.lkey)], SIG,
                         rkey=dst.rkey, remote_addr=dst.addr + 500), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(3, WcStatus.SUCCESS)]
    assert p.wcs["a_send"][0].opcode == WcOpcode.RDMA_WRITE
    assert dst.read(9000, 500) == data and dst.read(500) == bytes(500)
    assert p.wcs["b_recv"] == []      # a WRITE without immediate consumes no receive


@pytest.mark.parametrize("mtu", [Mtu.MTU_256, Mtu.MTU_2048])
def test_rdma_read(rng, mtu):
    p = Pair(mtu)
    data = rng.randbytes(7000)
    remote, local = p.mr(p.pdb, data), p.mr(p.pda, 8000)
    p.a.post_send(SendWR(4, WrOpcode.RDMA_READ, [SGE(local.addr, 3000, local.lkey),
                                                 SGE(local.addr + 4000, 4000, local.lkey)],
                         SIG, rkey=remote.rkey, remote_addr=remote.addr), p.now)
    p.run()
    [wc] = p.wcs["a_send"]
    assert (wc.status, wc.opcode, wc.byte_len) == (WcStatus.SUCCESS, WcOpcode.RDMA_READ, 7000)
    assert local.read(3000) + local.read(4000, 4000) == data
    assert local.read(1000, 3000) == bytes(1000)


def test_write_with_imm_and_send_with_imm(rng):
    p = Pair(Mtu.MTU_512)
    data = rng.randbytes(3000)
    src, dst, rbuf = p.mr(p.pda, data), p.mr(p.pdb, 3000), p.mr(p.pdb, 3000)
    p.b.post_recv(RecvWR(10, []))
    p.b.post_recv(RecvWR(11, [SGE(rbuf.addr, 3000, rbuf.lkey)]))
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE_WITH_IMM, [SGE(src.addr, 3000, src.lkey)],
                         SIG, imm_data=0xCAFE, rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.a.post_send(SendWR(2, WrOpcode.SEND_WITH_IMM, [SGE(src.addr, 1234, src.lkey)], SIG,
                         imm_data=0xBEEF), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS)]
    w, s = p.wcs["b_recv"]
    assert (w.wr_id, w.opcode, w.imm_data, w.byte_len) == (
        10, WcOpcode.RECV_RDMA_WITH_IMM, 0xCAFE, 3000)
    assert (s.wr_id, s.opcode, s.imm_data, s.byte_len) == (11, WcOpcode.RECV, 0xBEEF, 1234)
    assert w.wc_flags & WcFlags.WITH_IMM and s.wc_flags & WcFlags.WITH_IMM
    assert dst.read() == data and rbuf.read(1234) == data[:1234]


def test_unsignaled_wrs_do_not_complete_but_errors_do(rng):
    p = Pair()
    data = rng.randbytes(2000)
    src, dst = p.mr(p.pda, data), p.mr(p.pdb, 2000)
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 2000, src.lkey)],
                         rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.run()
    assert p.wcs["a_send"] == [] and dst.read() == data
    p.a.post_send(SendWR(2, WrOpcode.RDMA_WRITE, [SGE(src.addr, 2000, src.lkey)],
                         rkey=0x999942, remote_addr=dst.addr), p.now)
    p.a.post_send(SendWR(3, WrOpcode.RDMA_WRITE, [SGE(src.addr, 2000, src.lkey)],
                         rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(2, WcStatus.REM_ACCESS_ERR),
                                          (3, WcStatus.WR_FLUSH_ERR)]
    assert p.a.state == p.b.state == QpState.ERR


def test_sq_sig_all_signals_every_wr(rng):
    p = Pair()
    p.a.sq_sig_all = True
    src, dst = p.mr(p.pda, rng.randbytes(64)), p.mr(p.pdb, 64)
    for i in range(3):
        p.a.post_send(SendWR(i, WrOpcode.RDMA_WRITE, [SGE(src.addr, 64, src.lkey)],
                             rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(i, WcStatus.SUCCESS) for i in range(3)]


# -- reliability ------------------------------------------------------------------

@pytest.mark.parametrize("mtu", [Mtu.MTU_256, Mtu.MTU_1024])
def test_200_mixed_messages_over_a_lossy_link(rng, mtu):
    """5% drops, 5% duplicates, reordering: every byte lands once, every signaled WR
    completes exactly once and in order, unsignaled ones never."""
    p = Pair(mtu, timeout_s=0.01)
    n, slot = 200, 2048
    a_src = p.mr(p.pda, rng.randbytes(n * slot))
    a_dst = p.mr(p.pda, n * slot)
    b_src = p.mr(p.pdb, rng.randbytes(n * slot))
    b_dst = p.mr(p.pdb, n * slot)
    b_rcv = p.mr(p.pdb, n * slot)
    ops = [WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE,
           WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ]
    expect_send, expect_recv, sizes = [], [], []
    for i in range(n):
        op = rng.choice(ops)
        size = rng.randrange(0, slot + 1)
        sizes.append((op, size))
        off = i * slot
        signaled = rng.random() < 0.7
        imm = i if op in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM) else None
        if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM):
            p.b.post_recv(RecvWR(1000 + i, [SGE(b_rcv.addr + off, slot, b_rcv.lkey)]))
            expect_recv.append((1000 + i, size, imm))
        elif op == WrOpcode.RDMA_WRITE_WITH_IMM:
            p.b.post_recv(RecvWR(1000 + i, []))
            expect_recv.append((1000 + i, size, imm))
        if op == WrOpcode.RDMA_READ:
            wr = SendWR(i, op, [SGE(a_dst.addr + off, size, a_dst.lkey)],
                        SIG if signaled else 0, rkey=b_src.rkey, remote_addr=b_src.addr + off)
        else:
            wr = SendWR(i, op, [SGE(a_src.addr + off, size, a_src.lkey)],
                        SIG if signaled else 0, imm, b_dst.rkey, b_dst.addr + off)
        p.a.post_send(wr, p.now)
        if signaled:
            expect_send.append(i)
    faults = Faults(rng, drop=0.05, dup=0.05, reorder=0.05)
    p.run(faults)
    assert all(faults.fired.values())
    assert [(w.wr_id, w.status) for w in p.wcs["a_send"]] == [
        (i, WcStatus.SUCCESS) for i in expect_send]
    assert [(w.wr_id, w.status, w.byte_len, w.imm_data) for w in p.wcs["b_recv"]] == [
        (r, WcStatus.SUCCESS, s, imm) for r, s, imm in expect_recv]
    for i, (op, size) in enumerate(sizes):
        off = i * slot
        if op == WrOpcode.RDMA_READ:
            assert a_dst.read(size, off) == b_src.read(size, off), i
        elif op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM):
            assert b_rcv.read(size, off) == a_src.read(size, off), i
        else:
            assert b_dst.read(size, off) == a_src.read(size, off), i
    assert p.a.state == p.b.state == QpState.RTS
    assert p.a.next_deadline() is None


def test_all_packets_dropped_retry_exceeded_then_flush(rng):
    p = Pair(timeout_s=0.05, retry_cnt=3)
    src, dst = p.mr(p.pda, rng.randbytes(100)), p.mr(p.pdb, 100)
    for i in range(4):
        p.a.post_send(SendWR(i, WrOpcode.RDMA_WRITE, [SGE(src.addr, 100, src.lkey)],
                             SIG if i != 2 else 0, rkey=dst.rkey, remote_addr=dst.addr), p.now)
    sent = []

    def drop_all(pkts):
        sent.extend(pkts)
        return []
    drop_all.held = []
    p.run(drop_all)
    assert status_of(p.wcs["a_send"]) == [(0, WcStatus.RETRY_EXC_ERR), (1, WcStatus.WR_FLUSH_ERR),
                                          (2, WcStatus.WR_FLUSH_ERR), (3, WcStatus.WR_FLUSH_ERR)]
    # The first transmission and retry_cnt go-back-N retransmissions of all four WRs.
    assert len(sent) == 4 * (1 + 3)
    assert p.now == pytest.approx(4 * 0.05, rel=0.01)
    assert p.a.state == QpState.ERR and p.a.next_deadline() is None
    p.a.post_send(SendWR(9, WrOpcode.SEND, [], SIG), p.now)
    assert status_of(p.a.poll_send_cq()) == [(9, WcStatus.WR_FLUSH_ERR)]


def test_no_receive_posted_rnr_retry_exceeded(rng):
    p = Pair(rnr_retry=2, rnr_timer_s=0.02)
    src = p.mr(p.pda, rng.randbytes(3000))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 3000, src.lkey)], SIG), p.now)
    p.a.post_send(SendWR(2, WrOpcode.SEND, [SGE(src.addr, 10, src.lkey)]), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.RNR_RETRY_EXC_ERR),
                                          (2, WcStatus.WR_FLUSH_ERR)]
    assert p.now == pytest.approx(2 * 0.02, abs=1e-3)
    # RNR is not an error on the responder: it stays usable.
    assert p.b.state == QpState.RTS and p.wcs["b_recv"] == []


def test_rnr_then_receive_posted_delivers_once(rng):
    p = Pair(Mtu.MTU_256, rnr_retry=7, rnr_timer_s=0.01)
    data = rng.randbytes(1000)
    src, dst = p.mr(p.pda, data), p.mr(p.pdb, 1000)
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 1000, src.lkey)], SIG), p.now)
    p.run(done=lambda: p.now > 0.1)        # rnr_retry 7: still retrying after 10 waits
    assert p.wcs["a_send"] == []
    p.b.post_recv(RecvWR(5, [SGE(dst.addr, 1000, dst.lkey)]))
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    assert status_of(p.wcs["b_recv"]) == [(5, WcStatus.SUCCESS)] and dst.read() == data


# -- SEMANTICS.md section 9 ---------------------------------------------------------

def test_send_larger_than_receive(rng):
    p = Pair(Mtu.MTU_256)
    src, dst = p.mr(p.pda, rng.randbytes(1000)), p.mr(p.pdb, 1000)
    p.b.post_recv(RecvWR(5, [SGE(dst.addr, 600, dst.lkey)]))
    p.b.post_recv(RecvWR(6, [SGE(dst.addr, 600, dst.lkey)]))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 1000, src.lkey)]), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.REM_INV_REQ_ERR)]
    assert status_of(p.wcs["b_recv"]) == [(5, WcStatus.LOC_LEN_ERR), (6, WcStatus.WR_FLUSH_ERR)]
    assert p.a.state == p.b.state == QpState.ERR
    assert dst.read() == bytes(1000)


def test_rdma_write_unknown_rkey(rng):
    p = Pair(Mtu.MTU_256)
    src, dst = p.mr(p.pda, rng.randbytes(1000)), p.mr(p.pdb, 1000)
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 1000, src.lkey)], SIG,
                         rkey=dst.rkey + 0x100, remote_addr=dst.addr), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.REM_ACCESS_ERR)]
    assert p.b.state == QpState.ERR and dst.read() == bytes(1000)


def test_rdma_read_without_remote_read_access(rng):
    p = Pair()
    remote = p.mr(p.pdb, rng.randbytes(100), AccessFlags.LOCAL_WRITE)
    local = p.mr(p.pda, 100)
    p.a.post_send(SendWR(1, WrOpcode.RDMA_READ, [SGE(local.addr, 100, local.lkey)],
                         rkey=remote.rkey, remote_addr=remote.addr), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.REM_ACCESS_ERR)]


def test_local_gather_error_completes_in_order(rng):
    p = Pair()
    src, dst = p.mr(p.pda, rng.randbytes(100)), p.mr(p.pdb, 100)
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 100, src.lkey)], SIG,
                         rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.a.post_send(SendWR(2, WrOpcode.SEND, [SGE(src.addr, 200, src.lkey)]), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS), (2, WcStatus.LOC_PROT_ERR)]
    assert p.a.state == QpState.ERR and p.b.state == QpState.RTS


def test_rdma_write_through_signature_mkey_generates_pi(node, rng):
    """mlx5dv_wr_set_mkey_sig_block(3) example 1.1 reached by a remote multi-packet
    RDMA_WRITE: a CRC32 generated after every 512 bytes landing in memory."""
    crc32 = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, 0xFFFFFFFF),
                           block_size=BlockSize.SIZE_512)
    attr = SigBlockAttr(mem=crc32, wire=None, check_mask=SigMask.CRC32)
    p = Pair(Mtu.MTU_1024, b_node=node)
    data = rng.randbytes(8 * 512)
    mr, mkey = node.mkey_over(8 * 516, sig=attr)
    src = p.mr(p.pda, data)
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, len(data), src.lkey)], SIG,
                         rkey=mkey.rkey, remote_addr=0), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    pi = lambda block, _b: oracle.crc_pi(block, SigCrcType.CRC32, 0xFFFFFFFF)  # noqa: E731
    assert mr.read() == oracle.protect(data, 512, pi)
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_rdma_write_splitting_a_pi_on_the_responder_mkey(node, rng):
    crc32 = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, 0),
                           block_size=BlockSize.SIZE_512)
    p = Pair(b_node=node)
    _, mkey = node.mkey_over(4 * 516, sig=SigBlockAttr(mem=None, wire=crc32,
                                                        check_mask=SigMask.CRC32))
    src = p.mr(p.pda, rng.randbytes(514))
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 514, src.lkey)], SIG,
                         rkey=mkey.rkey, remote_addr=0), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.REM_INV_REQ_ERR)]


# -- state machine and PSNs ----------------------------------------------------------

def test_illegal_transitions_and_posts_raise_einval():
    hca = HCA()
    qp = RCQP(hca.alloc_pd(), 1)
    with pytest.raises(RDMAError) as e:
        qp.modify_to_rtr(2, 0, Mtu.MTU_1024)
    assert e.value.errno_name == "EINVAL"
    with pytest.raises(RDMAError):
        qp.modify_to_rts(0)
    with pytest.raises(RDMAError):
        qp.post_recv(RecvWR(1, []))
    qp.modify_to_init()
    qp.post_recv(RecvWR(1, []))
    with pytest.raises(RDMAError):
        qp.post_send(SendWR(1, WrOpcode.SEND), 0.0)
    with pytest.raises(RDMAError):
        qp.modify_to_rtr(2, 1 << 24, Mtu.MTU_1024)
    qp.modify_to_rtr(2, 0, Mtu.MTU_1024)
    with pytest.raises(RDMAError):
        qp.modify_to_rts(0, retry_cnt=8)
    qp.modify_to_rts(0)
    with pytest.raises(RDMAError) as e:
        qp.post_send(SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD), 0.0)
    assert e.value.errno_name == "EOPNOTSUPP"
    qp.modify_to_err()
    assert status_of(qp.poll_recv_cq()) == [(1, WcStatus.WR_FLUSH_ERR)]
    qp.post_recv(RecvWR(2, []))
    assert status_of(qp.poll_cq()) == [(2, WcStatus.WR_FLUSH_ERR)]
    with pytest.raises(RDMAError):
        qp.modify_to_init()


def test_psn_arithmetic_wraps_at_24_bits():
    assert psn_add(0xFFFFFF, 1) == 0
    assert psn_diff(0, 0xFFFFFF) == 1 and psn_diff(0xFFFFFF, 0) == -1
    assert psn_diff(5, 5) == 0


def test_duplicate_and_ahead_packets_at_the_responder(rng):
    """A duplicate SEND is re-ACKed and not delivered twice; a PSN ahead gets one
    NAK(PSN sequence error) until the gap is filled."""
    p = Pair(Mtu.MTU_256)
    src, dst = p.mr(p.pda, rng.randbytes(600)), p.mr(p.pdb, 2000)
    for i in range(3):
        p.b.post_recv(RecvWR(i, [SGE(dst.addr + 600 * i, 600, dst.lkey)]))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 600, src.lkey)], SIG), p.now)
    first, middle, last = p.a.poll_packets(p.now)
    for pkt in (first, last, middle):    # LAST ahead of MIDDLE: one NAK, LAST dropped
        p.b.receive(pkt, p.now)
    naks = p.b.poll_packets(p.now)
    assert [(n.aeth[0], n.psn) for n in naks] == [("NAK_PSN_SEQ", middle.psn)]
    p.b.receive(last, p.now)
    assert p.b.poll_packets(p.now)[0].aeth == ("ACK", 1)
    for pkt in (first, middle, last):    # the whole message again: duplicates only
        p.b.receive(pkt, p.now)
    acks = p.b.poll_packets(p.now)
    assert [(a.aeth[0], a.psn) for a in acks] == [("ACK", last.psn)]
    for a in acks:
        p.a.receive(a, p.now)
    assert status_of(p.a.poll_send_cq()) == [(1, WcStatus.SUCCESS)]
    assert status_of(p.b.poll_recv_cq()) == [(0, WcStatus.SUCCESS)]
    assert dst.read(600) == src.read() and p.a.next_deadline() is None
