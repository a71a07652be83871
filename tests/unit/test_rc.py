"""The RC QP state machine (engine/rc.py): two HCAs, two connected QPs, and a loop in
the test that carries packets between them on a fake clock, with seeded faults."""

from __future__ import annotations

import pytest

from softhca.engine.completion import Fault, TransferError
from softhca.engine.hca import HCA
from softhca.engine.mkey_configure import MkeyConfigureBuilder
from softhca.engine.rc import RCQP, Packet, RecvWR, Run, SendWR, psn_add, psn_diff
from softhca.protocol.attrs import SGE, SigBlockAttr, SigBlockDomain, SigCrc
from softhca.protocol.enums import (
    AccessFlags,
    BlockSize,
    MkeyErrType,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    Mtu,
    QpAttrMask,
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
from softhca.protocol.packets import split
from softhca.tools import oracle

ALL = (AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
       | AccessFlags.REMOTE_ATOMIC)
SIG = int(SendFlags.SIGNALED)
# PSNs start just below 2^24 so every test crosses the wrap.
A_PSN, B_PSN = 0xFFFFF0, 0xFFFFE0



def packets_of(qp: RCQP, now: float) -> list[Packet]:
    """What ``qp`` sends now, packet by packet (its runs cut into packets)."""
    return split(qp.poll_wire(now, False))


class Pair:
    """QP ``a`` on one HCA connected to QP ``b`` on another; ``run`` moves packets."""

    def __init__(self, mtu: Mtu = Mtu.MTU_1024, b_node=None, qp=None, **rts) -> None:
        self.ha = HCA("mlx5_0")
        self.pda = self.ha.alloc_pd()
        self.hb, self.pdb = (b_node.hca, b_node.pd) if b_node else (HCA("mlx5_1"), None)
        self.pdb = self.pdb or self.hb.alloc_pd()
        self.a = RCQP(self.pda, 0x11, sq_depth=256, rq_depth=256, **(qp or {}))
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
            out = packets_of(self.a, self.now) + packets_of(self.b, self.now)
            if fault is not None:
                out = fault(out)
            for p in out:
                self.delivered += 1
                qps[p.dest_qp].receive(Run.of(p), self.now)
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
    p = Pair(rnr_retry=2, rnr_timer_s=0.02048)        # IBTA's code 22
    src = p.mr(p.pda, rng.randbytes(3000))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 3000, src.lkey)], SIG), p.now)
    p.a.post_send(SendWR(2, WrOpcode.SEND, [SGE(src.addr, 10, src.lkey)]), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.RNR_RETRY_EXC_ERR),
                                          (2, WcStatus.WR_FLUSH_ERR)]
    assert p.now == pytest.approx(2 * 0.02048, abs=1e-3)
    # RNR is not an error on the responder: it stays usable.
    assert p.b.state == QpState.RTS and p.wcs["b_recv"] == []


@pytest.mark.parametrize("a_code,b_code", [(0, 12), (12, 0)])
def test_the_requester_waits_the_timer_the_responders_rnr_nak_carries(rng, a_code, b_code):
    """IBTA 9.7.5.2.8: the RNR NAK carries the responder's min_rnr_timer and the
    requester waits that long, whatever its own QP's min_rnr_timer (qperf lowers the
    passive side's to 12 so that its peer's waits are short). A sends to B, which has
    no receive; rnr_retry 1: one wait of B's timer, then RNR_RETRY_EXC_ERR."""
    from softhca.engine.qp_state import rnr_timer_s

    p = Pair(rnr_retry=1)
    for qp, code in ((p.a, a_code), (p.b, b_code)):
        qp.modify({"min_rnr_timer": code}, QpAttrMask.MIN_RNR_TIMER)
    src = p.mr(p.pda, rng.randbytes(100))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 100, src.lkey)], SIG), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.RNR_RETRY_EXC_ERR)]
    # IBTA's table: code 0 is 655.36 ms, code 12 0.64 ms
    assert rnr_timer_s(b_code) == {0: 0.65536, 12: 0.00064}[b_code]
    assert p.now == pytest.approx(rnr_timer_s(b_code), abs=1e-3)


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


# -- docs/semantics.md section 9 ---------------------------------------------------------

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
    assert mr.read() == oracle.protect_blocks(data, 512, pi)
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
        qp.post_send(SendWR(1, WrOpcode.TSO), 0.0)
    assert e.value.errno_name == "EOPNOTSUPP"
    with pytest.raises(RDMAError) as e:     # a bind names its window and MR
        qp.post_send(SendWR(1, WrOpcode.BIND_MW), 0.0)
    assert e.value.errno_name == "EINVAL"
    with pytest.raises(RDMAError) as e:     # an atomic needs one 8-byte SGE
        qp.post_send(SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD), 0.0)
    assert e.value.errno_name == "EINVAL"
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
    first, middle, last = packets_of(p.a, p.now)
    for pkt in (first, last, middle):    # LAST ahead of MIDDLE: one NAK, LAST dropped
        p.b.receive(Run.of(pkt), p.now)
    naks = packets_of(p.b, p.now)
    assert [(n.aeth[0], n.psn) for n in naks] == [("NAK_PSN_SEQ", middle.psn)]
    p.b.receive(Run.of(last), p.now)
    assert packets_of(p.b, p.now)[0].aeth == ("ACK", 1)
    for pkt in (first, middle, last):    # the whole message again: duplicates only
        p.b.receive(Run.of(pkt), p.now)
    acks = packets_of(p.b, p.now)
    assert [(a.aeth[0], a.psn) for a in acks] == [("ACK", last.psn)]
    for a in acks:
        p.a.receive(Run.of(a), p.now)
    assert status_of(p.a.poll_send_cq()) == [(1, WcStatus.SUCCESS)]
    assert status_of(p.b.poll_recv_cq()) == [(0, WcStatus.SUCCESS)]
    assert dst.read(600) == src.read() and p.a.next_deadline() is None


# -- atomics ----------------------------------------------------------------------------

U64 = 1 << 64
REMOTE_INV = MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.REMOTE_INVALIDATE


def u64_at(mr, off: int) -> int:
    return int.from_bytes(mr.read(8, off), "little")


def put_u64(mr, off: int, value: int) -> None:
    mr.write(value.to_bytes(8, "little"), off)


def mkey_over(hca, pd, mr, flags=MkeyInitAttrFlags.INDIRECT):
    """An MKEY of ``pd`` whose list layout is all of ``mr``, configured with all access."""
    mkey = hca.create_mkey(pd, flags, 4)
    MkeyConfigureBuilder(pd, Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE).post_configure(
        mkey, access=ALL, sges=[SGE(mr.addr, mr.length, mr.lkey)])
    return mkey


def atomic_wr(wr_id, op, local, off, remote, remote_off, compare_add=0, swap=0, flags=SIG):
    return SendWR(wr_id, op, [SGE(local.addr + off, 8, local.lkey)], flags,
                  rkey=remote.rkey, remote_addr=remote.addr + remote_off,
                  compare_add=compare_add, swap=swap)


def test_atomic_compare_and_swap_success_and_failure(rng):
    p = Pair()
    remote, local = p.mr(p.pdb, 64), p.mr(p.pda, 64)
    old, new, other = rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64)
    put_u64(remote, 8, old)
    p.a.post_send(atomic_wr(1, WrOpcode.ATOMIC_CMP_AND_SWP, local, 0, remote, 8,
                            compare_add=old, swap=new), p.now)
    # Compares against ``old`` again, but memory now holds ``new``: no swap.
    p.a.post_send(atomic_wr(2, WrOpcode.ATOMIC_CMP_AND_SWP, local, 8, remote, 8,
                            compare_add=old, swap=other), p.now)
    p.run()
    assert [(w.wr_id, w.status, w.opcode, w.byte_len) for w in p.wcs["a_send"]] == [
        (1, WcStatus.SUCCESS, WcOpcode.COMP_SWAP, 8), (2, WcStatus.SUCCESS, WcOpcode.COMP_SWAP, 8)]
    assert u64_at(local, 0) == old and u64_at(local, 8) == new
    assert u64_at(remote, 8) == new
    assert remote.read(8) == bytes(8) and remote.read(48, 16) == bytes(48)
    assert p.a.state == p.b.state == QpState.RTS


def test_atomic_fetch_and_add_wraps_at_64_bits():
    p = Pair()
    remote, local = p.mr(p.pdb, 16), p.mr(p.pda, 16)
    start, add1, add2 = U64 - 3, 5, U64 - 1
    put_u64(remote, 8, start)
    p.a.post_send(atomic_wr(1, WrOpcode.ATOMIC_FETCH_AND_ADD, local, 0, remote, 8, add1), p.now)
    p.a.post_send(atomic_wr(2, WrOpcode.ATOMIC_FETCH_AND_ADD, local, 8, remote, 8, add2), p.now)
    p.run()
    assert [(w.wr_id, w.status, w.opcode) for w in p.wcs["a_send"]] == [
        (1, WcStatus.SUCCESS, WcOpcode.FETCH_ADD), (2, WcStatus.SUCCESS, WcOpcode.FETCH_ADD)]
    after1 = (start + add1) % U64
    assert after1 == 2
    assert u64_at(local, 0) == start and u64_at(local, 8) == after1
    assert u64_at(remote, 8) == (after1 + add2) % U64 == 1


def test_misaligned_atomic_is_an_invalid_request():
    p = Pair()
    remote, local = p.mr(p.pdb, 32), p.mr(p.pda, 8)
    p.a.post_send(atomic_wr(1, WrOpcode.ATOMIC_FETCH_AND_ADD, local, 0, remote, 4, 1), p.now)
    p.a.post_send(atomic_wr(2, WrOpcode.ATOMIC_FETCH_AND_ADD, local, 0, remote, 8, 1), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.REM_INV_REQ_ERR),
                                          (2, WcStatus.WR_FLUSH_ERR)]
    assert p.a.state == p.b.state == QpState.ERR
    assert remote.read() == bytes(32)


def test_atomic_without_remote_atomic_access():
    p = Pair()
    remote = p.mr(p.pdb, 8, AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE
                  | AccessFlags.REMOTE_READ)
    local = p.mr(p.pda, 8)
    p.a.post_send(atomic_wr(1, WrOpcode.ATOMIC_CMP_AND_SWP, local, 0, remote, 0, 0, 7), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.REM_ACCESS_ERR)]
    assert remote.read() == bytes(8) and p.b.state == QpState.ERR


def test_atomics_through_mkeys(node):
    """A plain MKEY takes atomics at its offsets; a signature MKEY refuses them."""
    p = Pair(b_node=node)
    mr = node.reg_mr(32)
    mkey = mkey_over(node.hca, node.pd, mr)
    local = p.mr(p.pda, 8)
    put_u64(mr, 16, 40)
    p.a.post_send(SendWR(1, WrOpcode.ATOMIC_FETCH_AND_ADD, [SGE(local.addr, 8, local.lkey)], SIG,
                         rkey=mkey.rkey, remote_addr=16, compare_add=2), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    assert u64_at(local, 0) == 40 and u64_at(mr, 16) == 42
    crc32 = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, 0),
                           block_size=BlockSize.SIZE_512)
    _, sig_mkey = node.mkey_over(516, sig=SigBlockAttr(mem=crc32, wire=None,
                                                       check_mask=SigMask.CRC32))
    p.a.post_send(SendWR(2, WrOpcode.ATOMIC_FETCH_AND_ADD, [SGE(local.addr, 8, local.lkey)], SIG,
                         rkey=sig_mkey.rkey, remote_addr=0, compare_add=2), p.now)
    p.run()
    assert status_of(p.wcs["a_send"][1:]) == [(2, WcStatus.REM_INV_REQ_ERR)]


class Tap:
    """A fault hook that only looks (and may change the batch through ``edit``)."""

    def __init__(self, edit=None) -> None:
        self.held: list[Packet] = []
        self.seen: list[Packet] = []
        self.edit = edit

    def __call__(self, pkts: list[Packet]) -> list[Packet]:
        out = self.edit(pkts) if self.edit else pkts
        self.seen += out
        return out


def test_duplicated_atomic_request_is_executed_once(rng):
    p = Pair()
    remote, local = p.mr(p.pdb, 8), p.mr(p.pda, 8)
    start, add = rng.getrandbits(64), rng.getrandbits(64)
    put_u64(remote, 0, start)
    tap = Tap(lambda pkts: [c for q in pkts for c in ([q, q] if q.opcode == "FETCH_ADD" else [q])])
    p.a.post_send(atomic_wr(1, WrOpcode.ATOMIC_FETCH_AND_ADD, local, 0, remote, 0, add), p.now)
    p.run(tap)
    assert [q.opcode for q in tap.seen].count("FETCH_ADD") == 2
    acks = [q for q in tap.seen if q.opcode == "ATOMIC_ACKNOWLEDGE"]
    # The second answer comes from the saved result: the original, not start + add.
    assert [(q.psn, q.atomic_ack) for q in acks] == [(acks[0].psn, start)] * 2
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    assert u64_at(remote, 0) == (start + add) % U64 and u64_at(local, 0) == start
    assert p.a.state == p.b.state == QpState.RTS


def test_lost_atomic_ack_is_answered_again_from_the_saved_result(rng):
    p = Pair(timeout_s=0.01)
    remote, local = p.mr(p.pdb, 8), p.mr(p.pda, 8)
    old, new = rng.getrandbits(64), rng.getrandbits(64)
    put_u64(remote, 0, old)
    dropped = []

    def drop_first_ack(pkts):
        out = []
        for q in pkts:
            if q.opcode == "ATOMIC_ACKNOWLEDGE" and not dropped:
                dropped.append(q)
            else:
                out.append(q)
        return out
    tap = Tap(drop_first_ack)
    p.a.post_send(atomic_wr(1, WrOpcode.ATOMIC_CMP_AND_SWP, local, 0, remote, 0, old, new), p.now)
    p.run(tap)
    assert len(dropped) == 1 and [q.opcode for q in tap.seen].count("COMPARE_SWAP") == 2
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    # Executed again, the compare would fail and return ``new``.
    assert u64_at(local, 0) == old and u64_at(remote, 0) == new


# -- SEND_WITH_INV and LOCAL_INV --------------------------------------------------------

def test_send_with_inv_invalidates_a_remote_invalidate_mkey(rng):
    p = Pair(Mtu.MTU_256)
    target = p.mr(p.pdb, 512)
    mkey = mkey_over(p.hb, p.pdb, target, REMOTE_INV)
    src, rbuf = p.mr(p.pda, rng.randbytes(600)), p.mr(p.pdb, 600)
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 512, src.lkey)], SIG,
                         rkey=mkey.rkey, remote_addr=0), p.now)
    p.b.post_recv(RecvWR(7, [SGE(rbuf.addr, 600, rbuf.lkey)]))
    p.a.post_send(SendWR(2, WrOpcode.SEND_WITH_INV, [SGE(src.addr, 600, src.lkey)], SIG,
                         invalidate_rkey=mkey.rkey), p.now)
    tap = Tap()
    p.run(tap)
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS)]
    assert p.wcs["a_send"][1].opcode == WcOpcode.SEND
    assert target.read() == src.read(512) and rbuf.read() == src.read()
    [wc] = p.wcs["b_recv"]
    assert (wc.wr_id, wc.status, wc.opcode, wc.byte_len, wc.invalidated_rkey) == (
        7, WcStatus.SUCCESS, WcOpcode.RECV, 600, mkey.rkey)
    assert wc.wc_flags & WcFlags.WITH_INV and not wc.wc_flags & WcFlags.WITH_IMM
    sends = [(q.opcode, q.ieth) for q in tap.seen if q.opcode.startswith("SEND")]
    assert sends == [("SEND_FIRST", None), ("SEND_MIDDLE", None),
                     ("SEND_LAST_WITH_INV", mkey.rkey)]
    assert not mkey.valid
    p.a.post_send(SendWR(3, WrOpcode.RDMA_WRITE, [SGE(src.addr, 8, src.lkey)], SIG,
                         rkey=mkey.rkey, remote_addr=0), p.now)
    p.run()
    assert status_of(p.wcs["a_send"][2:]) == [(3, WcStatus.REM_ACCESS_ERR)]


@pytest.mark.parametrize("kind", ["mr", "mkey_without_flag", "unknown", "other_pd"])
def test_send_with_inv_of_a_key_that_may_not_be_invalidated(rng, kind):
    p = Pair()
    data = rng.randbytes(100)
    src, rbuf, mr = p.mr(p.pda, data), p.mr(p.pdb, 100), p.mr(p.pdb, 64)
    plain = mkey_over(p.hb, p.pdb, mr)
    other = p.hb.create_mkey(p.hb.alloc_pd(), REMOTE_INV, 1)
    key = {"mr": mr.rkey, "mkey_without_flag": plain.rkey, "unknown": 0x777742,
           "other_pd": other.rkey}[kind]
    p.b.post_recv(RecvWR(7, [SGE(rbuf.addr, 100, rbuf.lkey)]))
    p.b.post_recv(RecvWR(8, [SGE(rbuf.addr, 100, rbuf.lkey)]))
    p.a.post_send(SendWR(1, WrOpcode.SEND_WITH_INV, [SGE(src.addr, 100, src.lkey)],
                         invalidate_rkey=key), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.REM_INV_REQ_ERR)]
    assert status_of(p.wcs["b_recv"]) == [(7, WcStatus.REM_INV_REQ_ERR),
                                          (8, WcStatus.WR_FLUSH_ERR)]
    assert p.a.state == p.b.state == QpState.ERR
    assert mr.valid and plain.valid


def test_local_inv_then_local_use_fails(rng):
    p = Pair()
    data = rng.randbytes(64)
    src, dst = p.mr(p.pda, data), p.mr(p.pdb, 64)
    mkey = mkey_over(p.ha, p.pda, src)

    def write(wr_id):
        return SendWR(wr_id, WrOpcode.RDMA_WRITE, [SGE(0, 64, mkey.lkey)], SIG,
                      rkey=dst.rkey, remote_addr=dst.addr)
    p.a.post_send(write(1), p.now)
    p.a.post_send(SendWR(2, WrOpcode.LOCAL_INV, send_flags=SIG, invalidate_rkey=mkey.lkey),
                  p.now)
    # Posted behind the LOCAL_INV: it must see the key invalid, though the write
    # before the LOCAL_INV was still unacknowledged when it was posted.
    p.a.post_send(write(3), p.now)
    p.run()
    assert [(w.wr_id, w.status, w.opcode) for w in p.wcs["a_send"]] == [
        (1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE), (2, WcStatus.SUCCESS, WcOpcode.LOCAL_INV),
        (3, WcStatus.LOC_PROT_ERR, WcOpcode.RDMA_WRITE)]
    assert dst.read() == data and not mkey.valid and p.a.state == QpState.ERR


@pytest.mark.parametrize("kind", ["mr", "unknown"])
def test_local_inv_of_an_mr_or_unknown_key_fails(kind):
    p = Pair()
    mr = p.mr(p.pda, 64)
    key = mr.lkey if kind == "mr" else 0x777742
    p.a.post_send(SendWR(1, WrOpcode.LOCAL_INV, invalidate_rkey=key), p.now)
    p.a.post_send(SendWR(2, WrOpcode.SEND, [], SIG), p.now)
    p.run()
    assert [(w.wr_id, w.status, w.opcode) for w in p.wcs["a_send"]] == [
        (1, WcStatus.LOC_QP_OP_ERR, WcOpcode.LOCAL_INV), (2, WcStatus.WR_FLUSH_ERR, WcOpcode.SEND)]
    assert p.a.state == QpState.ERR and mr.valid


# -- local WRs (the MKEY configure's completion) ---------------------------------------

def test_post_local_completes_after_an_outstanding_write(rng):
    p = Pair()
    src, dst = p.mr(p.pda, rng.randbytes(3000)), p.mr(p.pdb, 3000)
    ran = []
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 3000, src.lkey)], SIG,
                         rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.a.post_local(2, True, WcOpcode.DRIVER1, action=lambda: ran.append(dst.read() == src.read()))
    pkts = packets_of(p.a, p.now)
    assert pkts and p.a.poll_send_cq() == [] and ran == []
    for q in pkts:
        p.b.receive(Run.of(q), p.now)
    p.run()
    assert [(w.wr_id, w.status, w.opcode) for w in p.wcs["a_send"]] == [
        (1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE), (2, WcStatus.SUCCESS, WcOpcode.DRIVER1)]
    assert ran == [True]


def test_unsignaled_post_local_gives_no_completion(rng):
    p = Pair()
    src, dst = p.mr(p.pda, rng.randbytes(64)), p.mr(p.pdb, 64)
    ran = []
    p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 64, src.lkey)], SIG,
                         rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.a.post_local(2, False, WcOpcode.DRIVER1, action=lambda: ran.append(2))
    p.a.post_local(3, False, WcOpcode.DRIVER1)
    p.a.post_send(SendWR(4, WrOpcode.RDMA_WRITE, [SGE(src.addr, 64, src.lkey)], SIG,
                         rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS), (4, WcStatus.SUCCESS)]
    assert ran == [2]


def test_post_local_action_error_and_flush():
    p = Pair()

    def fail():
        raise TransferError(Fault.ACCESS, "the configured layout is gone")
    p.a.post_local(1, False, WcOpcode.DRIVER1, action=fail)
    p.a.post_local(2, True, WcOpcode.DRIVER1)
    p.run()
    assert [(w.wr_id, w.status, w.opcode) for w in p.wcs["a_send"]] == [
        (1, WcStatus.LOC_PROT_ERR, WcOpcode.DRIVER1), (2, WcStatus.WR_FLUSH_ERR, WcOpcode.DRIVER1)]
    assert p.a.state == QpState.ERR
    p.a.post_local(3, False, WcOpcode.DRIVER1)
    assert status_of(p.a.poll_send_cq()) == [(3, WcStatus.WR_FLUSH_ERR)]


# -- inline data --------------------------------------------------------------------------

INLINE = int(SendFlags.INLINE)


@pytest.mark.parametrize("op", [WrOpcode.SEND, WrOpcode.RDMA_WRITE])
def test_inline_data_is_copied_at_post(rng, op):
    """The source buffer is overwritten before anything is transmitted: an inline WR
    delivers what was there at post time, a non-inline one what is there at transmission."""
    p = Pair(Mtu.MTU_256)
    first, second = rng.randbytes(200), rng.randbytes(200)
    src, dst = p.mr(p.pda, first), p.mr(p.pdb, 400)
    for i, flags in enumerate((SIG | INLINE, SIG)):
        p.b.post_recv(RecvWR(10 + i, [SGE(dst.addr + 200 * i, 200, dst.lkey)]))
        p.a.post_send(SendWR(i, op, [SGE(src.addr, 120, src.lkey),
                                     SGE(src.addr + 120, 80, src.lkey)], flags,
                             rkey=dst.rkey, remote_addr=dst.addr + 200 * i), p.now)
    src.write(second)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(0, WcStatus.SUCCESS), (1, WcStatus.SUCCESS)]
    assert dst.read(200) == first and dst.read(200, 200) == second


def test_inline_limits_are_einval(rng):
    p = Pair(qp={"max_inline_data": 64})
    src, dst = p.mr(p.pda, rng.randbytes(128)), p.mr(p.pdb, 128)
    with pytest.raises(RDMAError) as e:
        p.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(src.addr, 40, src.lkey),
                                                      SGE(src.addr + 40, 25, src.lkey)],
                             SIG | INLINE, rkey=dst.rkey, remote_addr=dst.addr), p.now)
    assert e.value.errno_name == "EINVAL"
    bad = [SendWR(2, WrOpcode.RDMA_READ, [SGE(src.addr, 8, src.lkey)], SIG | INLINE,
                  rkey=dst.rkey, remote_addr=dst.addr),
           atomic_wr(3, WrOpcode.ATOMIC_FETCH_AND_ADD, src, 0, dst, 0, 1, flags=SIG | INLINE),
           SendWR(4, WrOpcode.SEND, [SGE(src.addr + 100, 64, src.lkey)], SIG | INLINE)]
    for wr in bad:
        with pytest.raises(RDMAError) as e:
            p.a.post_send(wr, p.now)
        assert e.value.errno_name == "EINVAL", wr
    p.a.post_send(SendWR(5, WrOpcode.RDMA_WRITE, [SGE(src.addr, 64, src.lkey)], SIG | INLINE,
                         rkey=dst.rkey, remote_addr=dst.addr), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(5, WcStatus.SUCCESS)]
    assert dst.read(64) == src.read(64)


# -- max_rd_atomic --------------------------------------------------------------------------

class RdAtomicOnTheWire:
    """Passes every packet; counts READ and atomic requests sent and not yet answered, and
    notes how many had been answered when the RDMA_WRITE went."""

    def __init__(self) -> None:
        self.held: list[Packet] = []
        self.open: set[int] = set()
        self.most = 0
        self.answered = 0
        self.write_after: int | None = None

    def __call__(self, pkts: list[Packet]) -> list[Packet]:
        for q in pkts:
            if q.opcode in ("RDMA_READ_REQUEST", "FETCH_ADD"):
                self.open.add(q.psn)
                self.most = max(self.most, len(self.open))
            elif q.opcode in ("RDMA_READ_RESPONSE_ONLY", "ATOMIC_ACKNOWLEDGE"):
                self.open.discard(q.psn)
                self.answered += 1
            elif q.opcode == "RDMA_WRITE_ONLY" and self.write_after is None:
                self.write_after = self.answered
        return pkts


@pytest.mark.parametrize("limit, most, answered_before_write", [(2, 2, (3, 5)), (16, 5, (0, 0))])
def test_max_rd_atomic_throttles_reads_and_atomics(rng, limit, most, answered_before_write):
    p = Pair(qp={"max_rd_atomic": limit})
    slot = 128      # keeps every atomic's address 8-byte aligned
    remote, local = p.mr(p.pdb, rng.randbytes(6 * slot)), p.mr(p.pda, 6 * slot)
    ops = [WrOpcode.RDMA_READ, WrOpcode.ATOMIC_FETCH_AND_ADD] * 2 + [WrOpcode.RDMA_READ]
    for i, op in enumerate(ops):
        off = slot * i
        if op == WrOpcode.RDMA_READ:
            p.a.post_send(SendWR(i, op, [SGE(local.addr + off, slot, local.lkey)], SIG,
                                 rkey=remote.rkey, remote_addr=remote.addr + off), p.now)
        else:
            p.a.post_send(atomic_wr(i, op, local, off, remote, off, 1), p.now)
    p.a.post_send(SendWR(9, WrOpcode.RDMA_WRITE, [SGE(local.addr + 5 * slot, 8, local.lkey)],
                         SIG, rkey=remote.rkey, remote_addr=remote.addr + 5 * slot), p.now)
    wire = RdAtomicOnTheWire()
    p.run(wire)
    assert status_of(p.wcs["a_send"]) == [(i, WcStatus.SUCCESS) for i in (0, 1, 2, 3, 4, 9)]
    # Five requests, all answered; at most ``limit`` at once. With the limit at 2 the
    # fifth request waits for (at least) the third answer, and the WRITE behind it too;
    # without a binding limit the WRITE goes before any answer.
    assert wire.answered == 5 and not wire.open
    assert wire.most == most
    low, high = answered_before_write
    assert low <= wire.write_after <= high
    for i in (0, 2, 4):
        assert local.read(slot, slot * i) == remote.read(slot, slot * i)


def test_atomics_reads_writes_and_local_wrs_over_a_lossy_link(rng):
    """Drops, duplicates and reordering with max_rd_atomic 2: every atomic is executed
    exactly once and returns the original value, every WR completes once, in order."""
    p = Pair(Mtu.MTU_256, timeout_s=0.01, qp={"max_rd_atomic": 2})
    n, slot = 120, 64
    remote = p.mr(p.pdb, rng.randbytes(n * slot))
    before = remote.read()
    local, src = p.mr(p.pda, n * slot), p.mr(p.pda, rng.randbytes(n * slot))
    expect = {}
    for i in range(n):
        off = slot * i
        orig = int.from_bytes(before[off:off + 8], "little")
        op = rng.choice(["fadd", "cas", "read", "write", "local"])
        if op == "fadd":
            add = rng.getrandbits(64)
            expect[i] = ((orig + add) % U64, orig)
            p.a.post_send(atomic_wr(i, WrOpcode.ATOMIC_FETCH_AND_ADD, local, off, remote, off,
                                    add), p.now)
        elif op == "cas":
            new = rng.getrandbits(64)
            expect[i] = (new, orig)
            p.a.post_send(atomic_wr(i, WrOpcode.ATOMIC_CMP_AND_SWP, local, off, remote, off,
                                    orig, new), p.now)
        elif op == "read":
            expect[i] = "read"
            p.a.post_send(SendWR(i, WrOpcode.RDMA_READ, [SGE(local.addr + off, slot, local.lkey)],
                                 SIG, rkey=remote.rkey, remote_addr=remote.addr + off), p.now)
        elif op == "write":
            expect[i] = "write"
            flags = SIG | (INLINE if rng.random() < 0.5 else 0)
            p.a.post_send(SendWR(i, WrOpcode.RDMA_WRITE, [SGE(src.addr + off, slot, src.lkey)],
                                 flags, rkey=remote.rkey, remote_addr=remote.addr + off), p.now)
        else:
            p.a.post_local(i, True, WcOpcode.DRIVER1)
    faults = Faults(rng, drop=0.05, dup=0.05, reorder=0.05)
    p.run(faults)
    assert all(faults.fired.values())
    assert status_of(p.wcs["a_send"]) == [(i, WcStatus.SUCCESS) for i in range(n)]
    for i, e in expect.items():
        off = slot * i
        if e == "read":
            assert local.read(slot, off) == before[off:off + slot], i
        elif e == "write":
            assert remote.read(slot, off) == src.read(slot, off), i
        else:
            assert (u64_at(remote, off), u64_at(local, off)) == e, i
    assert p.a.state == p.b.state == QpState.RTS and p.a.next_deadline() is None
