"""Packet trains (docs/protocol.md, "Packet trains"): a run of one message's packets as
one frame must change nothing an application, a capture or a counter can see.

- The train codec: a train cut into packets is the packets the QP sends one by one;
  the frame round-trips; hostile train headers are refused (EPROTO) before anything is
  allocated for the packets they claim.
- Engine level (two RCQPs and a link in the test, on a fake clock): the same traffic
  with trains and packet by packet gives the same memory images, completions, RC
  statistics, packets and capture bytes, under drop / duplicate / reorder faults that
  cut the trains at random packets (hypothesis); and the train cases one by one:
  duplicate, partly duplicate, ahead of ePSN, go-back-N inside a train, RNR on a SEND
  train, over-MTU.
- Daemon level: two daemon pairs, trains on and off, the same data and completions;
  trains really go on the wire when nothing needs packets, and never when a capture,
  a packet subscriber or a fault rule does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import tempfile
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import softhca.client as sh
from softhca.engine.hca import DEFAULT_RC_WINDOW, HCA, RC_WINDOW_MAX, RC_WINDOW_MIN
from softhca.engine.rc import RCQP, Packet, RecvWR, Run, SendWR
from softhca.engine.rc_requester import run_max
from softhca.protocol.attrs import SGE
from softhca.protocol.enums import AccessFlags, Mtu, SendFlags, WcStatus, WrOpcode
from softhca.protocol.errors import RDMAError
from softhca.protocol.frames import FrameDecoder, FrameError, frame_bytes
from softhca.protocol.packets import (
    FRAME_RUN_MAX,
    IntegrityError,
    count,
    decode,
    packet_header,
    split,
    train_header,
)
from softhca.protocol.roce import Endpoint, packet_record
from softhca.server import daemon as daemon_mod
from softhca.server.capture import PcapWriter

from e2e import connect_pair, make_side, sge

ALL = (AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
       | AccessFlags.REMOTE_ATOMIC)
SIG = int(SendFlags.SIGNALED)
# PSNs just below 2^24, so that runs cross the wrap (where a train is cut).
A_PSN, B_PSN = 0xFFFFA0, 0xFFFF80
# These links use rxe's window (RXE_MAX_UNACKED_PSNS, ``serve --rc-window 128``): the
# PSN-wrap and go-back-N cases below are laid out on its runs of 32 packets.
WINDOW = 128
REQUEST_RUN_MAX = run_max(WINDOW)
MTUS = {256: Mtu.MTU_256, 512: Mtu.MTU_512, 1024: Mtu.MTU_1024, 2048: Mtu.MTU_2048,
        4096: Mtu.MTU_4096}
SETTINGS = settings(max_examples=int(os.environ.get("SOFTHCA_PROPERTY_EXAMPLES", "250")),
                    deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- an engine pair and a link that cuts trains where a fault hits a packet ---------------

class Link:
    """Two connected RCQPs and the link between them, on a fake clock.

    ``trains``: the QPs hand the link trains (RCQP.poll_wire), else packets. ``rules``:
    (direction, n, action): the n-th packet (from 0) that direction carries is dropped,
    duplicated or held back behind the rest of the round (reordered). The decisions are
    per packet, so the packets delivered are the same with and without trains; a train
    hit at packet i goes on as the sub-trains around it (a cut at a random point)."""

    def __init__(self, mtu: int, trains: bool, rules=(), capture: bool = False,
                 window: int = WINDOW) -> None:
        self.ha, self.hb = HCA("mlx5_0", rc_window=window), HCA("mlx5_1", rc_window=window)
        self.pda, self.pdb = self.ha.alloc_pd(), self.hb.alloc_pd()
        self.a = RCQP(self.pda, 0x11, sq_depth=512, rq_depth=512)
        self.b = RCQP(self.pdb, 0x22, sq_depth=512, rq_depth=512)
        for qp, peer, rq, sq in ((self.a, self.b, B_PSN, A_PSN), (self.b, self.a, A_PSN, B_PSN)):
            qp.modify_to_init()
            qp.modify_to_rtr(peer.qp_num, rq, MTUS[mtu])
            qp.modify_to_rts(sq, timeout_s=0.01, rnr_timer_s=0.001)
        self.trains = trains
        self.rules: dict[tuple[str, int], str] = {(d, n): act for d, n, act in rules}
        self.seen = {"ab": 0, "ba": 0}
        self.held: dict[str, list] = {"ab": [], "ba": []}
        self.now = 0.0
        self.wcs: list[tuple] = []
        self.train_items = 0
        self.delivered: list[Packet] = []
        self.pcap_path = None
        self.pcap = None
        if capture:
            fd, self.pcap_path = tempfile.mkstemp(suffix=".pcap")
            os.close(fd)
            self.pcap = PcapWriter(self.pcap_path)
        self.rounds = 0
        self.keys: dict[int, int] = {}

    def _poll(self, qp: RCQP) -> list:
        return qp.poll_wire(self.now, True) if self.trains else split(qp.poll_wire(self.now, False))

    def _fault(self, direction: str, items: list) -> list:
        """The items after the rules, regrouped: runs of packets of one train stay one."""
        refs: list[tuple] = list(self.held[direction])      # held ones go first
        self.held[direction] = []
        for x in items:
            n = x.n if type(x) is Run else 1
            for i in range(n):
                k = self.seen[direction]
                self.seen[direction] += 1
                act = self.rules.get((direction, k))
                if act == "drop":
                    continue
                if act == "reorder":
                    self.held[direction].append((x, i, k))
                    continue
                refs.append((x, i, k))
                if act == "duplicate":
                    refs.append((x, i, -1))
        out: list = []
        j = 0
        while j < len(refs):
            x, i, _ = refs[j]
            if type(x) is not Run:
                out.append(x)
                j += 1
                continue
            e = j + 1
            while e < len(refs) and refs[e][0] is x and refs[e][1] == refs[e - 1][1] + 1:
                e += 1
            out.append(x.sub(i, i + e - j))
            j = e
        return out

    def _deliver(self, qp: RCQP, items: list) -> None:
        for x in items:
            if type(x) is Run:
                self.train_items += 1
                qp.receive(x, self.now)
            else:
                qp.receive(Run.of(x), self.now)

    def _record(self, direction: str, items: list) -> None:
        # Keys are random per HCA: each is named by the order it first appears, so that
        # two runs compare.
        pkts = [p if p.reth is None else dataclasses.replace(
            p, reth=(self.keys.setdefault(p.reth[0], len(self.keys)), *p.reth[1:]))
            for p in split(items)]
        self.delivered += pkts
        if self.pcap is not None:
            here, there = Endpoint("10.0.0.1", 4791), Endpoint("10.0.0.2", 4791)
            if direction == "ba":
                here, there = there, here
            for p in pkts:
                self.pcap.write(self.rounds * 1e-3, packet_record(
                    "tx", ("mlx5_0", p), local=here, peer=there, ident=self.pcap.count))

    def pcap_bytes(self) -> bytes | None:
        if self.pcap is None:
            return None
        self.pcap.close()
        with open(self.pcap_path, "rb") as f:
            data = f.read()
        os.unlink(self.pcap_path)
        return data

    def collect(self) -> None:
        for side, qp in (("a", self.a), ("b", self.b)):
            for wc in qp.poll_cq():
                self.wcs.append((side, wc.wr_id, int(wc.status), int(wc.opcode), wc.byte_len,
                                 wc.imm_data, int(wc.wc_flags)))

    def run(self, hook=None, max_rounds: int = 20_000) -> None:
        for _ in range(max_rounds):
            self.rounds += 1
            if hook is not None:
                hook(self)
            ab = self._fault("ab", self._poll(self.a))
            ba = self._fault("ba", self._poll(self.b))
            self._record("ab", ab)
            self._record("ba", ba)
            self._deliver(self.b, ab)
            self._deliver(self.a, ba)
            self.collect()
            if ab or ba or self.held["ab"] or self.held["ba"]:
                self.now += 1e-5
                continue
            deadlines = [d for d in (self.a.next_deadline(), self.b.next_deadline())
                         if d is not None]
            if not deadlines:
                return
            self.now = max(self.now, min(deadlines))
        raise AssertionError("the QPs did not settle")


# -- a random workload ----------------------------------------------------------------------

OPS = (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.SEND,
       WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_READ)


def run_workload(mtu: int, ops: list[tuple[int, int]], trains: bool, rules=(),
                 capture: bool = False, late_recvs: int = 0, seed: int = 0) -> dict:
    """Post ``ops`` [(opcode, size)] on QP a, with the receives they need on b (the last
    ``late_recvs`` of them only after some rounds: RNR first), run to quiescence;
    everything a comparison needs."""
    link = Link(mtu, trains, rules, capture)
    # A trace subscriber sees transfers, not packets: the same events either way.
    traces: list = []
    for qp in (link.a, link.b):
        qp.trace = lambda ctx, ev: traces.append((tuple(sorted(ctx.items())), ev.direction,
                                                  ev.stage, ev.stream, ev.offset,
                                                  bytes(ev.data)))
    rng = random.Random(seed)
    total = sum(s for _, s in ops) or 1
    src = rng.randbytes(total)
    bsrc = rng.randbytes(total)
    a_src = link.ha.reg_mr(link.pda, total, ALL)
    a_src.write(src)
    a_dst = link.ha.reg_mr(link.pda, total, ALL)
    b_src = link.hb.reg_mr(link.pdb, total, ALL)
    b_src.write(bsrc)
    b_dst = link.hb.reg_mr(link.pdb, total, ALL)
    b_rcv = link.hb.reg_mr(link.pdb, total, ALL)
    want_a, want_dst, want_rcv = bytearray(total), bytearray(total), bytearray(total)
    recvs = []
    off = 0
    for wr_id, (op, size) in enumerate(ops, 1):
        sg = [SGE(a_src.addr + off, size, a_src.lkey)]
        if op == WrOpcode.RDMA_READ:
            sg = [SGE(a_dst.addr + off, size, a_dst.lkey)]
            wr = SendWR(wr_id, op, sg, SIG, rkey=b_src.rkey, remote_addr=b_src.addr + off)
            want_a[off:off + size] = bsrc[off:off + size]
        elif op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM):
            wr = SendWR(wr_id, op, sg, SIG, imm_data=wr_id if op == WrOpcode.SEND_WITH_IMM
                        else None)
            recvs.append(RecvWR(1000 + wr_id, [SGE(b_rcv.addr + off, size, b_rcv.lkey)]))
            want_rcv[off:off + size] = src[off:off + size]
        else:
            imm = op == WrOpcode.RDMA_WRITE_WITH_IMM
            wr = SendWR(wr_id, op, sg, SIG, imm_data=wr_id if imm else None,
                        rkey=b_dst.rkey, remote_addr=b_dst.addr + off)
            if imm:
                recvs.append(RecvWR(1000 + wr_id, [SGE(b_rcv.addr, 0, b_rcv.lkey)]))
            want_dst[off:off + size] = src[off:off + size]
        link.a.post_send(wr, 0.0)
        off += size
    early = recvs[:len(recvs) - late_recvs] if late_recvs else recvs
    for r in early:
        link.b.post_recv(r)
    late = recvs[len(early):]

    def hook(lk: Link) -> None:
        if late and lk.rounds == 40:
            for r in late:
                lk.b.post_recv(r)

    link.run(hook)
    b_mem = bytes(b_dst.read()[:total]), bytes(b_rcv.read()[:total])
    return {"a_mem": bytes(a_dst.read()[:total]), "b_mem": b_mem,
            "wcs": link.wcs, "stats": (_per_packet(link.a.stats), _per_packet(link.b.stats)),
            "packets": link.delivered, "pcap": link.pcap_bytes(),
            "trains": link.train_items,
            "want": (bytes(want_a), (bytes(want_dst), bytes(want_rcv))),
            "states": (int(link.a.state), int(link.b.state)), "traces": traces}


def assert_same(on: dict, off: dict) -> None:
    for k in ("a_mem", "b_mem", "wcs", "stats", "packets", "pcap", "states", "traces"):
        assert on[k] == off[k], k


@st.composite
def workloads(draw):
    mtu = draw(st.sampled_from(sorted(MTUS)))
    sizes = st.one_of(st.integers(0, 3 * mtu), st.integers(3 * mtu, 70 * mtu))
    ops = draw(st.lists(st.tuples(st.sampled_from(OPS), sizes), min_size=1, max_size=6))
    n_packets = sum(max(1, -(-s // mtu)) for _, s in ops)
    rules = draw(st.lists(st.tuples(st.sampled_from(["ab", "ba"]),
                                    st.integers(0, n_packets + 10),
                                    st.sampled_from(["drop", "duplicate", "reorder"])),
                          max_size=6))
    return mtu, ops, rules, draw(st.booleans()), draw(st.integers(0, 2))


@SETTINGS
@given(workloads())
def test_trains_and_packets_give_identical_results(w):
    mtu, ops, rules, capture, late = w
    late = min(late, sum(1 for op, _ in ops if op in (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM,
                                                        WrOpcode.RDMA_WRITE_WITH_IMM)))
    on = run_workload(mtu, ops, True, rules, capture, late)
    off = run_workload(mtu, ops, False, rules, capture, late)
    assert_same(on, off)
    # And both are right: every WR completed SUCCESS, every byte where it belongs
    # (the images built by this test, not by the engine).
    assert all(wc[2] == WcStatus.SUCCESS for wc in off["wcs"])
    assert (on["a_mem"], on["b_mem"]) == on["want"]
    assert sum(1 for wc in on["wcs"] if wc[0] == "a") == len(ops)


def test_trains_are_really_used_and_cut_at_random_points():
    """The property above compares something: with trains, multi-packet runs go as
    trains (many fewer items than packets), and a fault in the middle of one cuts it."""
    ops = [(WrOpcode.RDMA_WRITE, 40 * 1024), (WrOpcode.SEND, 20 * 1024),
           (WrOpcode.RDMA_READ, 30 * 1024)]
    clean = run_workload(1024, ops, True)
    assert 0 < clean["trains"] < count(clean["packets"]) // 8
    # The trace is compared too: per WR one gather on the sending side and a wire and a
    # scatter on the receiving side (MRs have no other stages), 3 WRs.
    assert len(clean["traces"]) == 9
    faulty = run_workload(1024, ops, True, [("ab", 7, "drop"), ("ab", 30, "duplicate"),
                                            ("ba", 12, "reorder"), ("ba", 3, "drop")])
    off = run_workload(1024, ops, False, [("ab", 7, "drop"), ("ab", 30, "duplicate"),
                                          ("ba", 12, "reorder"), ("ba", 3, "drop")])
    assert_same(faulty, off)
    assert faulty["stats"][0]["retransmissions"] > 0
    assert faulty["stats"][1]["duplicates_discarded"] > 0
    assert faulty["a_mem"] == faulty["want"][0]


# -- the train cases one by one --------------------------------------------------------------

def write_pair(mtu: int = 1024, size: int = 8 * 1024):
    link = Link(mtu, True)
    src = os.urandom(size)
    a_mr = link.ha.reg_mr(link.pda, size, ALL)
    a_mr.write(src)
    b_mr = link.hb.reg_mr(link.pdb, size, ALL)
    link.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(a_mr.addr, size, a_mr.lkey)], SIG,
                            rkey=b_mr.rkey, remote_addr=b_mr.addr), 0.0)
    items = link.a.poll_wire(0.0)
    assert len(items) == 1 and type(items[0]) is Run and items[0].n == size // mtu
    return link, src, b_mr, items[0]


def test_a_train_equals_its_packets():
    link, src, _, t = write_pair()
    # The same WR's packets, one by one, from a second pair that never makes trains.
    other = Link(1024, False)
    mr = other.ha.reg_mr(other.pda, len(src), ALL)
    mr.write(src)
    other.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(mr.addr, len(src), mr.lkey)], SIG,
                             rkey=t.reth[0], remote_addr=t.reth[1]), 0.0)
    pkts = split(other.a.poll_wire(0.0, False))
    assert t.packets() == pkts
    assert [p.opcode for p in pkts] == ["RDMA_WRITE_FIRST"] + ["RDMA_WRITE_MIDDLE"] * 6 + [
        "RDMA_WRITE_LAST"]
    assert b"".join(p.payload for p in pkts) == src


def test_a_one_packet_message_goes_as_a_train_of_one():
    """A WRITE of one MTU is a run of one on the wire (a ``train`` frame of n 1): its
    packet is the RDMA_WRITE_ONLY the no-trains path sends, its frame decodes back to
    it, and the responder takes it in one step with its ACK."""
    link, src, b_mr, t = write_pair(1024, 1024)
    assert (t.n, t.first, t.last) == (1, True, True)
    other = Link(1024, False)
    mr = other.ha.reg_mr(other.pda, len(src), ALL)
    mr.write(src)
    other.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(mr.addr, len(src), mr.lkey)], SIG,
                             rkey=t.reth[0], remote_addr=t.reth[1]), 0.0)
    pkts = other.a.poll_wire(0.0, False)
    assert [type(p) for p in pkts] == [Packet] and t.packets() == pkts
    assert pkts[0].opcode == "RDMA_WRITE_ONLY"
    fr = _frame(t)
    assert fr.header["t"] == "train" and (fr.header["n"], fr.header["pos"]) == (1, 3)
    dev, back = decode(fr.header, fr.payload)
    assert back.packets() == pkts
    link.b.receive(back, 0.0)
    assert bytes(b_mr.read()) == src
    out = split(link.b.poll_wire(0.0, False))
    assert [(p.opcode, p.psn, p.aeth) for p in out] == [("ACKNOWLEDGE", t.psn, ("ACK", 1))]


def test_a_train_is_applied_in_one_step_with_one_ack():
    link, src, b_mr, t = write_pair()
    link.b.receive(t, 0.0)
    assert bytes(b_mr.read()) == src
    out = split(link.b.poll_wire(0.0, False))
    assert [(p.opcode, p.psn, p.aeth) for p in out] == [("ACKNOWLEDGE", t.end_psn, ("ACK", 1))]


def test_a_duplicate_train_is_re_acked_not_applied():
    link, src, b_mr, t = write_pair()
    link.b.receive(t, 0.0)
    split(link.b.poll_wire(0.0, False))
    b_mr.write(b"\0" * len(src))
    link.b.receive(t, 0.0)
    assert bytes(b_mr.read()) == b"\0" * len(src)       # not applied again
    assert link.b.stats["duplicates_discarded"] == t.n
    out = split(link.b.poll_wire(0.0, False))
    assert [(p.opcode, p.psn) for p in out] == [("ACKNOWLEDGE", t.end_psn)]


def test_a_partly_duplicate_train_applies_only_its_new_packets():
    link, src, b_mr, t = write_pair()
    link.b.receive(t.sub(0, 3), 0.0)
    link.b.receive(t.sub(1, t.n), 0.0)            # packets 1, 2 again, then 3..7
    assert link.b.stats["duplicates_discarded"] == 2
    assert bytes(b_mr.read()) == src


def test_a_train_ahead_of_epsn_gets_one_sequence_nak():
    link, src, b_mr, t = write_pair()
    link.b.receive(t.sub(2, t.n), 0.0)            # packets 0 and 1 lost
    out = split(link.b.poll_wire(0.0, False))
    assert [(p.opcode, p.psn, p.aeth[0]) for p in out] == [
        ("ACKNOWLEDGE", t.psn, "NAK_PSN_SEQ")]
    assert link.b.stats["psn_seq_naks_sent"] == 1
    assert bytes(b_mr.read()) == b"\0" * len(src)


def test_go_back_n_restarts_inside_a_train():
    # 30 packets: one train (REQUEST_RUN_MAX is 32 at rxe's window).
    link, src, b_mr, t = write_pair(size=30 * 1024)
    # Packets 0..19 arrive, 20 is lost, the rest is ahead: one NAK names PSN +20.
    link.b.receive(t.sub(0, 20), 0.0)
    link.b.receive(t.sub(21, t.n), 0.0)
    for p in split(link.b.poll_wire(0.0, False)):
        link.a.receive(Run.of(p), 0.0)
    again = link.a.poll_wire(0.0)
    assert len(again) == 1 and type(again[0]) is Run
    assert again[0].psn == (t.psn + 20) % (1 << 24) and again[0].n == 10
    assert not again[0].first and again[0].last and again[0].reth is None
    assert link.a.stats["retransmitted_packets"] == 10
    link.b.receive(again[0], 0.0)
    assert bytes(b_mr.read()) == src


def test_rnr_on_a_send_train_and_its_retry():
    link = Link(1024, True)
    src = os.urandom(5000)
    a_mr = link.ha.reg_mr(link.pda, len(src), ALL)
    a_mr.write(src)
    b_mr = link.hb.reg_mr(link.pdb, len(src), ALL)
    link.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(a_mr.addr, len(src), a_mr.lkey)], SIG), 0.0)
    (t,) = link.a.poll_wire(0.0)
    link.b.receive(t, 0.0)                        # no receive posted
    out = split(link.b.poll_wire(0.0, False))
    # the NAK carries B's RNR timer: its 1 ms as IBTA's code 14 (1.28 ms, the shortest
    # of the table's times that is at least 1 ms; code 13 is 0.96 ms)
    assert [(p.opcode, p.psn, p.aeth[0]) for p in out] == [("ACKNOWLEDGE", t.psn, "RNR_14")]
    for p in out:
        link.a.receive(Run.of(p), 0.0)
    link.b.post_recv(RecvWR(7, [SGE(b_mr.addr, len(src), b_mr.lkey)]))
    link.run()
    assert bytes(b_mr.read()) == src
    assert link.a.stats["rnr_retries"] == 1
    assert [(w[0], w[1], w[2]) for w in link.wcs] == [("b", 7, WcStatus.SUCCESS),
                                                       ("a", 1, WcStatus.SUCCESS)]


def test_a_read_is_answered_with_trains_and_taken_in_one_step():
    link = Link(1024, True)
    data = os.urandom(100 * 1024 + 17)
    b_mr = link.hb.reg_mr(link.pdb, len(data), ALL)
    b_mr.write(data)
    a_mr = link.ha.reg_mr(link.pda, len(data), ALL)
    link.a.post_send(SendWR(1, WrOpcode.RDMA_READ, [SGE(a_mr.addr, len(data), a_mr.lkey)], SIG,
                            rkey=b_mr.rkey, remote_addr=b_mr.addr), 0.0)
    link.run()
    assert bytes(a_mr.read()) == data
    # 101 responses from A_PSN, 0x60 below the wrap: 96 up to the wrap, then 5.
    assert link.train_items == 2
    assert link.wcs == [("a", 1, WcStatus.SUCCESS, int(link.wcs[0][3]), len(data), None, 0)]


def test_trains_never_span_the_psn_wrap():
    link = Link(256, True)
    size = 200 * 256
    mr = link.ha.reg_mr(link.pda, size, ALL)
    # A first WR of 10 packets moves the big one's trains off the window's multiples:
    # from A_PSN + 10 (0x56 below the wrap) they go 32, 32, then 22 up to the wrap.
    for wr_id, n in ((1, 10 * 256), (2, size)):
        link.a.post_send(SendWR(wr_id, WrOpcode.RDMA_WRITE, [SGE(mr.addr, n, mr.lkey)], SIG,
                                rkey=1, remote_addr=0), 0.0)
    items = link.a.poll_wire(0.0)
    assert items[0].psn == A_PSN
    assert all(t.psn + t.n <= 1 << 24 for t in items)
    ends = [t for t in items if t.psn + t.n == 1 << 24]
    assert len(ends) == 1 and ends[0].n == 0x56 - 64 < REQUEST_RUN_MAX
    assert items[items.index(ends[0]) + 1].psn == 0
    assert count(items) == WINDOW


@pytest.mark.parametrize("window", [RC_WINDOW_MIN, 21, 128, DEFAULT_RC_WINDOW])
def test_the_window_bounds_the_packets_in_flight(window):
    """A device's rc_window: the requester sends that many packets and no more until an
    ACK comes, in runs of at most a quarter of it; then the message completes intact."""
    link = Link(256, True, window=window)
    n = window + 300                        # one WR of more packets than the window
    src = os.urandom(n * 256)
    a_mr = link.ha.reg_mr(link.pda, len(src), ALL)
    a_mr.write(src)
    b_mr = link.hb.reg_mr(link.pdb, len(src), ALL)
    link.a.post_send(SendWR(1, WrOpcode.RDMA_WRITE, [SGE(a_mr.addr, len(src), a_mr.lkey)],
                            SIG, rkey=b_mr.rkey, remote_addr=b_mr.addr), 0.0)
    items = link.a.poll_wire(0.0)
    assert count(items) == window
    assert max(t.n for t in items) == max(1, window // 4)
    assert link.a.poll_wire(0.0) == []      # the window is full: nothing more goes
    link.run()
    assert bytes(b_mr.read()) == src
    assert [w[:3] for w in link.wcs] == [("a", 1, WcStatus.SUCCESS)]


@pytest.mark.parametrize("window", [0, -1, RC_WINDOW_MIN - 1, RC_WINDOW_MAX + 1, 1 << 23])
def test_a_window_outside_its_bounds_is_refused(window):
    with pytest.raises(RDMAError) as e:
        HCA("mlx5_0", rc_window=window)
    assert e.value.errno_name == "EINVAL" and "rc_window" in str(e.value)


# -- the frame ------------------------------------------------------------------------------

def _frame(t: Run, dev: str = "mlx5_0"):
    dec = FrameDecoder()
    (fr,) = dec.feed(frame_bytes(train_header(dev, t), t.payload))
    return fr


def test_a_train_frame_round_trips():
    _, _, _, t = write_pair()
    fr = _frame(t)
    dev, back = decode(fr.header, fr.payload)
    assert dev == "mlx5_0" and back.packets() == t.packets()


@pytest.mark.parametrize("change, why", [
    ({"n": FRAME_RUN_MAX + 1}, "field 'n'"),
    ({"n": 0}, "field 'n'"),
    ({"n": "8"}, "field 'n'"),
    ({"n": 9}, "payload bytes are not 9 packets"),
    ({"n": 7}, "payload bytes are not 7 packets"),
    ({"mtu": 1000}, "not an IBTA path MTU"),
    ({"mtu": 8192}, "field 'mtu'"),
    ({"psn": (1 << 24) - 3}, "wrap"),
    ({"kind": "RDMA_READ_REQUEST"}, "kind must be"),
    ({"pos": 4}, "field 'pos'"),
    ({"pos": 0}, "must carry"),                 # a MIDDLE run with a RETH
    ({"pos": 1, "imm": 5}, "must carry"),       # ImmDt on a run that ends no message
    ({"ieth": 5}, "no RDMA_WRITE opcode ends a message with IETH"),
    ({"kind": "SEND"}, "must carry"),           # a SEND with a RETH
    ({"reth": None}, "field 'reth'"),
    ({"dev": ""}, "field 'dev'"),
    ({"qp": 1 << 24}, "field 'qp'"),
    # Exact types: a bool is no int, wherever the fast path reads one.
    ({"n": True}, "field 'n'"),
    ({"pos": True}, "field 'pos'"),
    ({"psn": False}, "field 'psn'"),
    ({"chk": True}, "field 'chk'"),
    ({"reth": [True, 0, 8192]}, "reth[0]"),
    ({"reth": (1, 0, 8192)}, "field 'reth'"),
    ({"reth": [1, -1, 8192]}, "reth[1]"),
    ({"reth": [1, 1 << 64, 8192]}, "reth[1]"),
])
def test_hostile_train_headers_are_refused(change, why):
    _, _, _, t = write_pair()
    fr = _frame(t)
    header = {**fr.header, **change}
    with pytest.raises(FrameError) as e:
        decode(header, fr.payload)
    assert e.value.errno_name == "EPROTO" and why in str(e.value), str(e.value)
    assert not isinstance(e.value, IntegrityError)


def test_a_train_header_of_another_train_fails_its_check():
    _, _, _, t = write_pair()
    fr = _frame(t)
    with pytest.raises(IntegrityError):
        decode({**fr.header, "psn": (t.psn + 1) % (1 << 24)}, fr.payload)
    with pytest.raises(IntegrityError):
        decode({**fr.header, "reth": [t.reth[0] ^ 1, t.reth[1], t.reth[2]]}, fr.payload)


def test_imm_and_ieth_together_are_refused():
    t = Run(0x22, 5, 1, "SEND", True, True, 1024, b"x", imm=1, ieth=2)
    with pytest.raises(FrameError, match="no SEND opcode ends a message with ImmDt and IETH"):
        decode({"t": "train", "dev": "d", "qp": 0x22, "psn": 5, "n": 1, "kind": "SEND",
                      "pos": 3, "mtu": 1024, "imm": 1, "ieth": 2, "chk": 0}, t.payload)


def test_a_claimed_count_allocates_nothing_per_packet():
    """A train claiming FRAME_RUN_MAX packets with a payload for one is refused before any
    per-packet work, and a refused train costs the same whatever n it claims."""
    _, _, _, t = write_pair()
    fr = _frame(t)
    tracemalloc.start()
    try:
        for n in (FRAME_RUN_MAX, 1 << 30):
            before = tracemalloc.get_traced_memory()[0]
            with pytest.raises(FrameError):
                decode({**fr.header, "n": n}, fr.payload[:10])
            assert tracemalloc.get_traced_memory()[0] - before < 4096
    finally:
        tracemalloc.stop()


# -- daemons ------------------------------------------------------------------------------

async def _daemon_run(trains: bool, *, capture: bool = False, fault: dict | None = None,
                      watch: list | None = None, mtu: int = sh.IBV_MTU_1024) -> dict:
    sent_trains = []
    real_send = daemon_mod.WireLink.send

    def spy(self, dev, pkts, *a, **kw):
        sent_trains.extend(self.daemon for p in pkts if type(p) is Run)
        return real_send(self, dev, pkts, *a, **kw)

    daemon_mod.WireLink.send = spy
    taps: list = []
    try:
        async with sh.embedded(trains=trains) as tnode, sh.embedded(trains=trains) as inode:
            if capture:
                for k, node in enumerate((tnode, inode)):
                    node.daemon.taps.append(lambda d, dev, p, _k=k: taps.append((_k, d, dev, p)))
            t = await make_side(tnode)
            i = await make_side(inode)
            await connect_pair(t, i, mtu=mtu)
            if fault is not None:
                await i.node.faults.add(fault)
            rng = random.Random(5)
            size = 256 * 1024
            src, tsrc = rng.randbytes(size), rng.randbytes(size)
            imr, tmr = await i.reg_mr(src), await t.reg_mr(tsrc)
            idst, tdst, trcv = await i.reg_mr(size), await t.reg_mr(size), await t.reg_mr(size)
            await t.qp.post_recv(sh.RecvWR(wr_id=50, sg=[sge(trcv, 70 * 1024)]))
            await t.qp.post_recv(sh.RecvWR(wr_id=51, sg=[sge(trcv, 0)]))
            wrs = []
            for wr_id, (op, n, off) in enumerate([
                    (sh.IBV_WR_RDMA_WRITE, 150 * 1024, 0), (sh.IBV_WR_SEND, 70 * 1024, 150 * 1024),
                    (sh.IBV_WR_RDMA_READ, 180 * 1024, 0),
                    (sh.IBV_WR_RDMA_WRITE_WITH_IMM, 33 * 1024 + 5, 150 * 1024)], 1):
                wr = sh.SendWR(wr_id=wr_id, opcode=op, send_flags=sh.IBV_SEND_SIGNALED,
                               imm_data=7 if op == sh.IBV_WR_RDMA_WRITE_WITH_IMM else None,
                               sg=[sge(idst if op == sh.IBV_WR_RDMA_READ else imr, n,
                                       0 if op == sh.IBV_WR_RDMA_READ else off)])
                if op != sh.IBV_WR_SEND:
                    wr.set_wr_rdma(tmr.rkey if op == sh.IBV_WR_RDMA_READ else tdst.rkey,
                                   (tmr if op == sh.IBV_WR_RDMA_READ else tdst).addr + off)
                wrs.append(wr)
            await i.qp.post_send(wrs)
            swc = await i.send_wc(4)
            rwc = await t.recv_wc(2)
            return {"mem": (await idst.read(), await tdst.read(), await trcv.read()),
                    "want": (tsrc[:180 * 1024], src[:150 * 1024] + src[150 * 1024:183 * 1024 + 5],
                             src[150 * 1024:220 * 1024]),
                    "wcs": [(w.wr_id, w.status, w.opcode, w.byte_len, w.imm_data)
                            for w in swc + rwc],
                    "trains": len(sent_trains),
                    "initiator_trains": sum(d is inode.daemon for d in sent_trains),
                    "bad_icrc": tnode.daemon.counters["packets_bad_icrc"],
                    "data_pkts": [x for x in taps if x[3].opcode != "ACKNOWLEDGE"]}
    finally:
        daemon_mod.WireLink.send = real_send


async def test_daemons_with_and_without_trains_agree():
    on = await _daemon_run(True)
    off = await _daemon_run(False)
    assert on["trains"] > 0 and off["trains"] == 0
    for r in (on, off):
        img_i, img_t, rcv = r["mem"]
        want_i, want_t, want_rcv = r["want"]
        assert img_i[:len(want_i)] == want_i
        assert img_t[:len(want_t)] == want_t
        assert rcv[:len(want_rcv)] == want_rcv
        assert all(w[1] == sh.IBV_WC_SUCCESS for w in r["wcs"])
    assert on["wcs"] == off["wcs"] and on["mem"] == off["mem"]


def _per_packet(stats: dict) -> dict:
    """The statistics that count packets and messages, the same with trains or without;
    duplicate_runs_discarded counts trains, which packets one by one do not have."""
    return {k: v for k, v in stats.items() if k != "duplicate_runs_discarded"}


def _streams(r: dict) -> dict:
    """The data packets each daemon's tap saw, per (daemon, direction), with QP numbers
    and keys (random per daemon) named by the order they first appear, and PSNs (random
    per QP) counted from each QP's first."""
    names: dict[int, int] = {}
    first_psn: dict[int, int] = {}
    out: dict = {}
    for node, d, dev, p in r["data_pkts"]:
        base = first_psn.setdefault(p.dest_qp, p.psn)
        p = dataclasses.replace(p, dest_qp=names.setdefault(("qp", p.dest_qp), len(names)),
                                psn=(p.psn - base) % (1 << 24))
        if p.reth is not None:
            p = dataclasses.replace(p, reth=(names.setdefault(("key", p.reth[0]), len(names)),
                                             0, p.reth[2]))
        out.setdefault((node, d), []).append((dev, p))
    return out


async def test_a_capture_sees_the_same_packets_with_trains():
    """A tap (what a capture writes) needs packets: trains are cut before it, so it
    sees the packets it saw without trains, in the same order, and the RoCEv2 frames
    of a capture are the same bytes."""
    on = await _daemon_run(True, capture=True)
    off = await _daemon_run(False, capture=True)
    assert on["trains"] == 0
    s_on, s_off = _streams(on), _streams(off)
    assert s_on == s_off and len(s_on) == 4
    here, there = Endpoint("10.0.0.1", 1), Endpoint("10.0.0.2", 2)

    def frames(streams):
        return {k: [packet_record(k[1], item, local=here, peer=there, ident=0)
                    for item in v] for k, v in streams.items()}
    assert frames(s_on) == frames(s_off)
    assert on["mem"] == off["mem"] and on["wcs"] == off["wcs"]


async def test_a_fault_rule_cuts_trains_and_icrc_stale_still_drops():
    """With a fault rule installed no train goes (every rule sees packets), and a
    stale-icrc packet is dropped and counted at the receiver as without trains."""
    rule = {"action": "corrupt", "block": 3, "block_size": 512, "icrc": "stale",
            "opcode": "RDMA_WRITE", "count": 1}
    on = await _daemon_run(True, fault=rule)
    # The rule is the initiator's: its requests go as packets; the target, with no
    # rule, still answers the READ with trains.
    assert on["initiator_trains"] == 0 and on["trains"] > 0
    img_i, img_t, rcv = on["mem"]
    assert img_t[:150 * 1024] == on["want"][1][:150 * 1024]
    assert on["bad_icrc"] == 1 and all(w[1] == sh.IBV_WC_SUCCESS for w in on["wcs"])


async def test_over_mtu_trains_are_dropped_per_packet():
    """A train whose packets exceed the receiving QP's path MTU is dropped as its
    packets would be (IBTA 9.6.3), counted per packet; the requester never completes."""
    async with sh.embedded() as tnode, sh.embedded() as inode:
        t = await make_side(tnode)
        i = await make_side(inode)
        await t.qp.connect(i.qp.info(), path_mtu=sh.IBV_MTU_256)
        await i.qp.connect(t.qp.info(), path_mtu=sh.IBV_MTU_4096, timeout=8, retry_cnt=1)
        imr, tmr = await i.reg_mr(os.urandom(64 * 1024)), await t.reg_mr(64 * 1024)
        wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_RDMA_WRITE, sg=[sge(imr)],
                       send_flags=sh.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(tmr.rkey, tmr.addr)
        await i.qp.post_send([wr])
        for _ in range(200):
            if tnode.daemon.counters["packets_over_mtu"] >= 16:
                break
            await asyncio.sleep(0.01)
        c = tnode.daemon.counters
        assert c["packets_over_mtu"] >= 16 and c["packets_over_mtu"] % 16 == 0
        assert c["packets_received"] == c["packets_over_mtu"]
        assert await tmr.read() == b"\0" * (64 * 1024)


# -- hostile peers at a daemon ------------------------------------------------------------

async def test_a_forged_train_is_dropped_per_packet_and_a_malformed_one_disconnects():
    """A train from a link that is not the QP's peer is dropped and counted as its n
    packets (packets_wrong_peer), and writes nothing; a train header claiming more
    packets than its payload holds is EPROTO: the wire peer gets an error frame and is
    disconnected (wire_protocol_errors), the daemon keeps serving."""
    from test_hardening_peers import wait_counter, wire_link

    async with sh.embedded() as inode, sh.embedded() as tnode:
        i, t = await make_side(inode), await make_side(tnode)
        await connect_pair(i, t)
        victim = await t.reg_mr(b"\x00" * 8192)
        data = os.urandom(8192)
        forged = Run(t.qp.qp_num, 0, 8, "RDMA_WRITE", True, True, 1024, data,
                       reth=(victim.rkey, victim.addr, 8192))
        h = train_header("mlx5_0", forged)
        h["sqp"] = i.qp.qp_num
        w = await wire_link(tnode.address, None)
        w.write(frame_bytes(h, data))
        await w.drain()
        c = await wait_counter(tnode, "packets_wrong_peer", 8)
        assert c["packets_wrong_peer"] == 8 and c["packets_received"] == 8
        assert await victim.read() == b"\x00" * 8192
        # n = 4000 with 8 packets' bytes: refused on the header, the link closed.
        w.write(frame_bytes({**h, "n": 4000}, data))
        await w.drain()
        c = await wait_counter(tnode, "wire_protocol_errors", 1)
        assert c["wire_protocol_errors"] == 1
        w.close()
        # The real peer's write still lands.
        src = await i.reg_mr(data)
        await i.qp.post_send(_write_wr(src, victim))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_SUCCESS
        assert await victim.read() == data


def _write_wr(src, dst) -> sh.SendWR:
    wr = sh.SendWR(wr_id=3, opcode=sh.IBV_WR_RDMA_WRITE, sg=[sge(src)],
                   send_flags=sh.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(dst.rkey, dst.addr)
    return wr


async def test_trains_larger_than_the_peers_max_frame_go_as_packets():
    """A peer daemon that takes frames of at most 64 KiB (serve --max-frame) is sent a
    64-packet train of 4096-byte packets (256 KiB) as its packets: the WRITE lands, and
    the link is never closed for an oversized frame."""
    async with sh.embedded(max_frame=64 << 10) as tnode, sh.embedded() as inode:
        i, t = await make_side(inode), await make_side(tnode)
        await connect_pair(i, t, mtu=sh.IBV_MTU_4096)
        data = os.urandom(600 << 10)
        src, dst = await i.reg_mr(data), await t.reg_mr(len(data))
        await i.qp.post_send(_write_wr(src, dst))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_SUCCESS
        assert await dst.read() == data
        c = await tnode.counters()
        assert c["wire_protocol_errors"] == 0 and c["retransmissions"] == 0
        assert c["packets_received"] >= 150


def test_either_frame_form_decodes_to_a_run():
    """One decoder for the wire: a ``pkt`` frame is a run of one that is its packet, a
    ``train`` frame the run it carries; any other frame kind is EPROTO."""
    _, _, _, t = write_pair()
    fr = _frame(t)
    assert decode(fr.header, fr.payload)[1].packets() == t.packets()
    for p in t.packets()[:2] + [Packet(0x22, 9, "ACKNOWLEDGE", aeth=("NAK_PSN_SEQ", 3)),
                                Packet(0x22, 9, "FETCH_ADD", atomic=(1, 2, 3, 0))]:
        dev, run = decode(packet_header("mlx5_0", p), p.payload)
        assert dev == "mlx5_0" and run.n == 1 and run.packets() == [p] and run == Run.of(p)
    with pytest.raises(IntegrityError) as e:
        decode({**fr.header, "psn": (t.psn + 1) % (1 << 24)}, fr.payload)
    assert e.value.packets == t.n
    with pytest.raises(FrameError, match="unexpected 'hello' frame on a wire link"):
        decode({**fr.header, "t": "hello"}, fr.payload)
