"""The RC responder: the receive side of an RC QP (engine/rc.py), as rxe's rxe_resp.c
is for Linux.

It takes requests as runs (protocol/packets.py ``Run``; a single packet is a run of
one) through named steps, as rxe's responder walks its states: ``_chk_psn`` (a
duplicate is answered again and not applied, a PSN ahead gets one sequence-error NAK),
then ``_chk_op_valid``, ``_chk_op_seq``, ``_chk_resource``, ``_chk_rkey`` and
``_chk_length``, each of which either passes the run or names the fault of its first
packet, and ``_execute``: SEND and RDMA WRITE messages are reassembled and applied at
their last packet, READ requests answered, atomics executed, ACKs and NAKs sent back.
A run of several packets is taken in one step when every step passes it; otherwise its
packets are taken one by one, through the same steps. Its state is the responder's
alone: the receive queue, the expected PSN, the MSN, the message being reassembled and
the saved atomic results. Everything it shares with the requester (the QP's state,
attributes and CQs) it reads from the QP.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..protocol.enums import AccessFlags, WcFlags, WcOpcode, WcStatus
from ..protocol.errors import RDMAError
from ..protocol.opcodes import (
    ACKNOWLEDGE,
    ATOMIC_ACKNOWLEDGE,
    FLAGS,
    RDMA_ATOMIC_WRITE,
    RDMA_READ_REQUEST,
    Op,
    rnr_syndrome,
    with_flags,
)
from ..protocol.packets import Packet, Run
from . import qp_state, transfer
from .completion import Fault, TransferError
from .rc_common import PSN_MOD, QPContext, psn_add, psn_diff, scatter

if TYPE_CHECKING:
    from ..protocol.records import RecvWR
    from .srq import SRQ

# The responder ACKs at least this often within a long message.
ACK_EVERY = 16
# The most READ response packets one run holds: a READ's responses are all sent at
# once (no window holds them back), and one run for all of them lets the requester
# scatter straight from the frame. 1 MiB at MTU 4096; measured 1.7 times the goodput of
# 64 for a 1 MiB READ (docs/performance.md, "Packet trains").
READ_RESPONSE_RUN_MAX = 256
_U64 = 1 << 64

# The atomic request opcodes, which are also their runs' kinds.
_ATOMICS = with_flags(Op.ATOMIC)

# The qp_access_flags bit each remote operation needs (ibv_modify_qp(3)
# qp_access_flags: "Mask of enabled remote access operations"), by run kind; SENDs
# need none.
# (Plain ints: ``int & IntFlag`` goes through enum's Python-level operator, per run.)
_ACCESS_NEEDED = {
    "RDMA_WRITE": int(AccessFlags.REMOTE_WRITE),
    RDMA_READ_REQUEST: int(AccessFlags.REMOTE_READ),
    RDMA_ATOMIC_WRITE: int(AccessFlags.REMOTE_WRITE),
    **dict.fromkeys(_ATOMICS, int(AccessFlags.REMOTE_ATOMIC)),
}

# Each opcode's flags as a plain int, and the two a message's last packet is tested
# for: ``Op & Op`` goes through enum's Python-level operator, a cost paid per message.
_FLAG_BITS = {name: int(f) for name, f in FLAGS.items()}
_WITH_IMM = int(Op.WITH_IMM)
_WITH_INV = int(Op.WITH_INV)

# A SEND_WITH_INV whose IETH key the responder may not invalidate: IBTA responder error
# class J, as rxe_resp.c implements it (RESPST_ERR_INVALIDATE_RKEY): the receive
# completes IB_WC_REM_INV_REQ_ERR and the QP goes to ERR; the requester gets NAK
# Invalid Request, REM_INV_REQ_ERR.
REMOTE_INV_FAILED = WcStatus.REM_INV_REQ_ERR

# The responder's NAK for a fault on its own key (docs/semantics.md section 9): the
# requester turns it back into TransferError.status(remote=True).
_FAULT_NAK = {Fault.ACCESS: "NAK_REM_ACCESS", Fault.LENGTH: "NAK_INV_REQ",
              Fault.CRYPTO: "NAK_REM_OP"}

# What a failed check does to the run's first packet; None: the check passed.
Verdict = Callable[[], None] | None


@dataclass(eq=False)
class _Inbound:
    """The message the responder is reassembling."""

    kind: str                 # "SEND" or "RDMA_WRITE"
    recv: RecvWR | None
    reth: tuple | None
    buf: bytearray = field(default_factory=bytearray)


class Responder:
    """The receive queue side of ``qp``."""

    def __init__(self, qp: QPContext) -> None:
        self.qp = qp
        # Its own receive queue, or the SRQ it was created with (engine/srq.py): the
        # same interface, so a receive is taken the same way from either.
        self.rq: deque[RecvWR] | SRQ = qp.srq if qp.srq is not None else deque()
        self._epsn = 0
        self._msn = 0
        self._msg: _Inbound | None = None
        self._nak_pending = False
        self._unacked = 0
        # ACKs, NAKs and READ responses (runs of several packets), in the order they go.
        self._resp_out: list[Packet | Run] = []
        # The ACK owed after everything in _resp_out, as (PSN, MSN), not yet a packet:
        # ACKs are cumulative (IBTA 9.7.5.1), so each message's ACK replaces the one
        # before it until something else must go out after it (a NAK, a READ response,
        # an atomic ACK: ``_out``) or the QP is polled (``take_packets``), and the many
        # messages of one read of the wire make one ACK packet, not one each.
        self._ack_due: tuple[int, int] | None = None
        # PSN -> (original value, MSN) of the atomics executed most recently.
        self._atomic_results: OrderedDict[int, tuple[int, int]] = OrderedDict()
        # First PSN -> (packets, rkey, va, length, MSN) of the READs answered most
        # recently: a duplicate READ is answered only from these (rxe_resp.c's read
        # resources), never with whatever RETH it carries.
        self._read_records: OrderedDict[int, tuple[int, int, int, int, int]] = OrderedDict()
        # Receives refused with an RNR NAK before the receive queue is looked at
        # (fault injection: "answer the next N messages with RNR").
        self.refuse_rnr = 0
        self._checks = (self._chk_op_valid, self._chk_op_seq, self._chk_resource,
                        self._chk_rkey, self._chk_length)

    def post_recv(self, wr: RecvWR) -> None:
        if self.qp.srq is not None:
            raise RDMAError("EINVAL", "the QP takes its receives from an SRQ: "
                                      "ibv_post_srq_recv posts them")
        if not qp_state.require("ibv_post_recv", self.qp.state):
            self.qp.complete_recv(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
            return
        if len(self.rq) >= self.qp.rq_depth:
            raise RDMAError("ENOMEM", f"receive queue full ({self.qp.rq_depth} WRs posted)")
        self.rq.append(wr)

    def flush(self) -> None:
        """ERR: every posted receive completes WR_FLUSH_ERR; a message half received is
        dropped."""
        self._msg = None
        while self.rq and self.qp.srq is None:
            self.qp.complete_recv(self.rq.popleft().wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)

    def take_packets(self) -> list[Packet | Run]:
        """The ACKs, NAKs and responses owed (READ responses as runs)."""
        if self._ack_due is not None:
            self._ack_out()
        out, self._resp_out = self._resp_out, []
        return out

    def _queue_ack(self, psn: int) -> None:
        self._unacked = 0
        # ACKs are cumulative: a newer one makes a queued older one useless.
        self._ack_due = (psn, self._msn)

    def _ack_out(self) -> None:
        """The owed ACK becomes a packet, after everything queued before it."""
        psn, msn = self._ack_due
        self._ack_due = None
        self._resp_out.append(Packet(self.qp.dest_qp, psn, ACKNOWLEDGE, aeth=("ACK", msn)))

    def _out(self, p: Packet | Run) -> None:
        """Queue a NAK or a response behind the ACK owed before it (their order is the
        order they were decided in)."""
        if self._ack_due is not None:
            self._ack_out()
        self._resp_out.append(p)

    def _nak(self, psn: int, syndrome: str) -> None:
        self._out(Packet(self.qp.dest_qp, psn, ACKNOWLEDGE, aeth=(syndrome, self._msn)))

    def _nak_fatal(self, psn: int, syndrome: str) -> None:
        self._nak(psn, syndrome)
        self.qp.enter_err()

    def _accept(self, n: int = 1) -> None:
        self._epsn = psn_add(self._epsn, n)
        self._nak_pending = False

    # -- the steps ---------------------------------------------------------------------
    def receive(self, run: Run) -> bool:
        """A run of requests arrives. False (nothing done) when its packets must be taken
        one by one: a run of several is taken in one step only where that is what its
        packets one by one would do. A run of one is always taken."""
        d = psn_diff(run.psn, self._epsn)
        if d:
            return self._chk_psn(run, d)
        for check in self._checks:
            fault = check(run)
            if fault is not None:
                if run.n > 1:
                    return False
                fault()
                return True
        self._execute(run)
        return True

    def _chk_psn(self, run: Run, d: int) -> bool:
        """A run not at the expected PSN: a duplicate is answered again, nothing of it
        applied (IBTA); one ahead gets one sequence-error NAK per gap, and later packets
        of the gap are dropped silently; each in O(1), whatever the run's length. A run
        partly duplicate is answered for its duplicate part and its new part taken as
        a run of its own."""
        if d < 0 < d + run.n:
            # The duplicate part first (answered as one), then the new part, as its
            # packets one by one would be taken.
            self._chk_psn(run.sub(0, -d), d)
            rest = run.sub(-d, run.n)
            if not self.receive(rest):
                for one in rest.one_by_one():
                    self.receive(one)
            return True
        if d > 0:
            self.qp.stats["out_of_window_discarded"] += run.n
            if not self._nak_pending:
                self._nak_pending = True
                self.qp.stats["psn_seq_naks_sent"] += 1
                self._nak(self._epsn, "NAK_PSN_SEQ")
            return True
        self.qp.stats["duplicates_discarded"] += run.n
        if run.n > 1:
            self.qp.stats["duplicate_runs_discarded"] += 1
        if run.kind == RDMA_READ_REQUEST:
            _replay_read(self, run)
        elif run.kind in _ATOMICS:
            self._replay_atomic(run)
        else:
            self._queue_ack(psn_add(self._epsn, -1))
        return True

    def _chk_op_valid(self, run: Run) -> Verdict:
        """The QP's qp_access_flags must enable the remote operation: if not, rxe's
        check_op_valid answers NAK Invalid Request and the QP goes to ERR."""
        need = _ACCESS_NEEDED.get(run.kind)
        if need is not None and not self.qp.qp_access_flags & need:
            return lambda: self._nak_fatal(run.psn, "NAK_INV_REQ")
        return None

    def _chk_op_seq(self, run: Run) -> Verdict:
        """A READ, an atomic or a message's first packet may not come inside another
        message, nor a later packet outside its own: an opcode sequence error."""
        m = self._msg
        if run.kind in ("SEND", "RDMA_WRITE") and not run.first:
            bad = m is None or m.kind != run.kind
        else:
            bad = m is not None
        return (lambda: self._nak_fatal(run.psn, "NAK_INV_REQ")) if bad else None

    def _chk_resource(self, run: Run) -> Verdict:
        """A SEND takes a receive at its first packet, an RDMA WRITE with immediate at
        its last (IBTA): without one (or while fault injection refuses), RNR NAK and
        nothing of the packet is taken; the requester retries it."""
        if run.kind == "SEND" and run.first and (not self.rq or self.refuse_rnr):
            def refuse() -> None:
                if self.rq:
                    self.refuse_rnr -= 1
                self._rnr(run.psn)
            return refuse
        if run.kind == "RDMA_WRITE" and run.last and run.imm is not None and not self.rq:
            return lambda: self._rnr(run.psn)
        return None

    def _chk_rkey(self, run: Run) -> Verdict:
        """An RDMA WRITE's RETH, at its first packet: the rkey must allow the whole range.
        A zero-length one names no memory and is not required to carry a valid R_Key or
        address (IBTA C9-88; rxe's check_rkey skips it): nothing is checked."""
        if run.kind != "RDMA_WRITE" or not run.first:
            return None
        rkey, addr, dma_len = run.reth
        if not dma_len:
            return None
        try:
            transfer.check_rx(self.qp.pd, rkey, addr, dma_len, remote=True,
                              qp_num=self.qp.qp_num)
        except TransferError as err:
            syndrome = _FAULT_NAK[err.fault]
            return lambda: self._nak_fatal(run.psn, syndrome)
        return None

    def _chk_length(self, run: Run) -> Verdict:
        """A SEND may not outgrow its receive (LOC_LEN_ERR, NAK Invalid Request); an RDMA
        WRITE may not outgrow its RETH's length, and must fill it by its last packet."""
        m = self._msg
        size = len(run.payload) + (len(m.buf) if m is not None else 0)
        if run.kind == "SEND":
            recv = m.recv if m is not None else self.rq[0]
            if size <= sum(s.length for s in recv.sg):
                return None

            def too_long() -> None:
                self._fail_recv(self.rq.popleft() if m is None else recv,
                                WcStatus.LOC_LEN_ERR, run.psn, "NAK_INV_REQ")
            return too_long
        if run.kind == "RDMA_WRITE":
            dma_len = (m.reth if m is not None else run.reth)[2]
            if size > dma_len or run.last and size != dma_len:
                return lambda: self._nak_fatal(run.psn, "NAK_INV_REQ")
        return None

    def _execute(self, run: Run) -> None:
        if run.kind == RDMA_READ_REQUEST:
            self._answer_read(run, first_time=True)
        elif run.kind in _ATOMICS:
            _execute_atomic(self, run)
        elif run.kind == RDMA_ATOMIC_WRITE:
            _atomic_write(self, run)
        else:
            self._take_message(run)

    # -- EXECUTE: SEND and RDMA WRITE ----------------------------------------------------
    def _take_message(self, run: Run) -> None:
        """The run's packets accepted: buffered, ACKed every ACK_EVERY, and its last
        packet, if it ends the message, completes it."""
        body = run.n - 1 if run.last else run.n
        whole = run.first and run.last
        m = self._msg
        if run.first and not whole:
            m = self._msg = _Inbound(run.kind, self.rq.popleft() if run.kind == "SEND"
                                     else None, run.reth)
        if not whole:
            m.buf += run.payload
        self._accept(body)
        self._ack_run(run.psn, body)
        if not run.last:
            return
        psn = run.end_psn
        self._accept()
        data = run.payload if whole else memoryview(m.buf)
        self._msg = None
        op = _FLAG_BITS[run.opcode(run.n - 1)]
        if run.kind == "SEND":
            recv = self.rq.popleft() if whole else m.recv
            ok = self._finish_send(recv, data, psn, op, run.imm, run.ieth)
        else:
            ok = self._finish_write(run.reth if whole else m.reth, data, psn,
                                    op & _WITH_IMM, run.imm)
        if ok:
            self._after_packet(psn, True)

    def _ack_run(self, psn: int, k: int) -> None:
        """``k`` accepted packets from ``psn`` none of which ends its message: an ACK is
        due at every ACK_EVERY-th, and the queued ones coalesce (``_queue_ack``), so
        only the last one due is queued."""
        total = self._unacked + k
        if total >= ACK_EVERY:
            self._queue_ack(psn_add(psn, k - total % ACK_EVERY - 1))
            self._unacked = total % ACK_EVERY
        else:
            self._unacked = total

    def _rnr(self, psn: int) -> None:
        # The NAK carries this QP's min_rnr_timer: the requester waits that long.
        self._nak(psn, rnr_syndrome(qp_state.rnr_timer_code(self.qp.rnr_timer_s)))
        # Packets behind the refused one are dropped, not NAKed, until it is retried.
        self._nak_pending = True

    def _after_packet(self, psn: int, last: bool) -> None:
        self._unacked += 1
        if last:
            self._msn = (self._msn + 1) % PSN_MOD
        if last or self._unacked >= ACK_EVERY:
            self._queue_ack(psn)


    def _finish_send(self, recv: RecvWR, data, psn: int, kind: int, imm_data, ieth) -> bool:
        """The last packet (PSN ``psn``, opcode flags ``kind``) of a SEND completed
        ``data``: scatter it over the receive, invalidate, complete; False when that
        failed (the QP went to ERR)."""
        try:
            scatter(self.qp.pd, recv.sg, data,
                    self.qp.trace_for(role="responder", wr_id=recv.wr_id, op="RECV"))
        except TransferError as err:
            # The fault is on the responder's own lkey: a remote operational error
            # for the requester, except a length fault (docs/semantics.md section 9).
            self._fail_recv(recv, err.status(remote=False), psn,
                            "NAK_INV_REQ" if err.fault == Fault.LENGTH else "NAK_REM_OP")
            return False
        imm = kind & _WITH_IMM
        inv = kind & _WITH_INV
        # The data is placed first, then the key invalidated (as rxe's execute()
        # does); a key we may not invalidate fails the receive after all.
        if inv and not self.qp.invalidate(ieth, remote=True):
            self._fail_recv(recv, REMOTE_INV_FAILED, psn, "NAK_INV_REQ")
            return False
        flags = (WcFlags.WITH_IMM if imm else 0) | (WcFlags.WITH_INV if inv else 0)
        self.qp.complete_recv(recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV, len(data),
                              imm_data if imm else None, int(flags), ieth if inv else 0)
        return True

    def _fail_recv(self, recv: RecvWR, status: WcStatus, psn: int, syndrome: str) -> None:
        self._msg = None
        self.qp.complete_recv(recv.wr_id, status, WcOpcode.RECV)
        self._nak_fatal(psn, syndrome)

    def _finish_write(self, reth: tuple, data, psn: int, imm, imm_data) -> bool:
        """The last packet (PSN ``psn``) of an RDMA WRITE completed ``data``: one
        transfer over the whole RETH range, then the receive of WRITE_WITH_IMM; False
        when the transfer failed (the QP went to ERR)."""
        rkey, addr, length = reth
        try:
            if length:      # zero-length: no memory, no R_Key (_chk_rkey)
                transfer.rx(self.qp.pd, rkey, addr, data, remote=True, qp_num=self.qp.qp_num,
                            trace=self.qp.trace_for(role="responder", psn=psn,
                                                    op="RDMA_WRITE"))
        except TransferError as err:
            self._nak_fatal(psn, _FAULT_NAK[err.fault])
            return False
        if imm:
            recv = self.rq.popleft()
            self.qp.complete_recv(recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM,
                                  len(data), imm_data, int(WcFlags.WITH_IMM))
        return True

    def _answer_read(self, pkt: Run, first_time: bool, reth: tuple | None = None,
                     msn: int | None = None, skip: int = 0) -> None:
        """The responses to READ ``pkt`` (over ``reth``, default its own); ``skip``: the
        first responses of the transfer left out, the rest sent from ``pkt``'s PSN on
        (a re-request of the READ's remainder, ``_replay_read``)."""
        rkey, addr, length = reth or pkt.reth
        try:
            # A view of an MR's memory, not a copy: the responses are read as the link
            # sends them, so a READ costs no second copy of what it reads.
            # A zero-length READ reads no memory: no R_Key check, one empty response
            # (IBTA C9-88, as rxe).
            # A duplicate READ answered again is the same transfer: traced once, the
            # first time (the trace lists each transfer once).
            data = b"" if not length else transfer.tx(
                self.qp.pd, rkey, addr, length, remote=True, view=True,
                qp_num=self.qp.qp_num,
                trace=self.qp.trace_for(role="responder", psn=pkt.psn, op="RDMA_READ")
                if first_time else None)
        except TransferError as err:
            self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
            return
        mtu = self.qp.mtu
        n = max(1, -(-len(data) // mtu))
        if first_time:
            self._accept(n)
            self._msn = (self._msn + 1) % PSN_MOD
            self._unacked = 0
            self._record_read(pkt.psn, n, rkey, addr, length)
        aeth = ("ACK", self._msn if msn is None else msn)
        # The responses as runs over one view of the data: at most READ_RESPONSE_RUN_MAX
        # packets each, never across the PSN wrap; a run of one goes as its packet.
        view = memoryview(data)
        a = skip
        while a < n:
            psn = psn_add(pkt.psn, a - skip)
            k = min(n - a, READ_RESPONSE_RUN_MAX, PSN_MOD - psn)
            t = Run(self.qp.dest_qp, psn, k, "RDMA_READ_RESPONSE", a == skip, a + k == n, mtu,
                    view[a * mtu:(a + k) * mtu], aeth=aeth)
            self._out(t if k > 1 else t.packet(0))
            a += k

    def _record_read(self, psn: int, n: int, rkey: int, addr: int, length: int) -> None:
        """Keep what a READ asked for, for its duplicates: max_dest_rd_atomic records
        (the responder's resources for incoming READs and atomics, ibv_modify_qp(3)), the
        oldest forgotten first, as rxe reuses its read resources."""
        self._read_records[psn] = (n, rkey, addr, length, self._msn)
        while len(self._read_records) > max(1, self.qp.max_dest_rd_atomic):
            self._read_records.popitem(last=False)

    def _replay_atomic(self, pkt: Run) -> None:
        saved = self._atomic_results.get(pkt.psn)
        if saved is None:
            # Not among the saved results: IBTA leaves it to the responder; rxe drops it
            # ("Resource not found. Class D error"), and the requester retries or fails.
            return
        self._send_atomic_ack(pkt.psn, *saved)

    def _send_atomic_ack(self, psn: int, original: int, msn: int) -> None:
        self._out(Packet(self.qp.dest_qp, psn, ATOMIC_ACKNOWLEDGE, aeth=("ACK", msn),
                         atomic_ack=original))


def _replay_read(self: Responder, pkt: Run) -> None:
    """A duplicate READ request, answered only from the record of the READ it
    repeats, as rxe_resp.c does: its PSN within that READ's responses, its rkey the
    same, and its range within the original range (the requester re-requests the
    rest of a READ from the first response it lacks). Anything else is dropped and
    counted: a READ request is never answered twice with a RETH it did not have."""
    for first, (n, rkey, addr, length, msn) in self._read_records.items():
        off = psn_diff(pkt.psn, first)
        if not 0 <= off < n:
            continue
        p_rkey, p_addr, p_len = pkt.reth
        if (p_rkey == rkey and addr <= p_addr and p_len <= length
                and p_addr + p_len <= addr + length):
            self.qp.stats["duplicate_reads_answered"] += 1
            if off and p_addr - addr == off * self.qp.mtu and p_addr + p_len == addr + length:
                # The rest of the READ from its off-th response, as the requester
                # asks for it after a lost response: the original transfer's
                # responses from there. Not a new transfer from the middle: through
                # a signature or crypto MKEY one cannot start inside a protection
                # block or data unit (a path MTU is seldom a multiple of one), and
                # the original's bytes are what the requester is missing.
                self._answer_read(pkt, first_time=False, reth=(rkey, addr, length),
                                  msn=msn, skip=off)
            else:
                self._answer_read(pkt, first_time=False, reth=(p_rkey, p_addr, p_len),
                                  msn=msn)
            return
        break
    self.qp.stats["duplicate_reads_dropped"] += 1


def _execute_atomic(self: Responder, pkt: Run) -> None:
    """A compare-and-swap or fetch-and-add: executed once, its result kept for its
    duplicates and sent back in an atomic ACK."""
    if pkt.atomic is None:
        self._nak_fatal(pkt.psn, "NAK_INV_REQ")     # an atomic opcode without AtomicETH
        return
    rkey, addr, swap_add, compare = pkt.atomic
    if pkt.kind == "COMPARE_SWAP":
        def update(old: int) -> int:
            return swap_add if old == compare else old
    else:
        def update(old: int) -> int:
            return (old + swap_add) % _U64
    try:
        # REMOTE_ATOMIC on the rkey, then 8-byte alignment (IBTA 9.4.5; rxe checks
        # in this order: check_rkey, then atomic_reply's alignment): Invalid Request.
        original = transfer.atomic(self.qp.pd, rkey, addr, update, qp_num=self.qp.qp_num)
    except TransferError as err:
        self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
        return
    self._accept()
    self._msn = (self._msn + 1) % PSN_MOD
    self._unacked = 0
    self._atomic_results[pkt.psn] = (original, self._msn)
    # The results kept for answering duplicate atomics (IBTA: a duplicate atomic is
    # answered from the saved result, never executed again) are the responder's
    # resources for incoming atomics, max_dest_rd_atomic of them (ibv_modify_qp(3));
    # rxe sizes its replay resources so.
    while len(self._atomic_results) > self.qp.max_dest_rd_atomic:
        self._atomic_results.popitem(last=False)
    self._send_atomic_ack(pkt.psn, original, self._msn)


def _atomic_write(self: Responder, pkt: Run) -> None:
    """RDMA ATOMIC WRITE: its 8 bytes stored as one 64-bit value through the RETH's
    rkey, which needs REMOTE_WRITE (rxe's check_rkey), at an 8-byte aligned address;
    acknowledged as a WRITE. A duplicate is re-ACKed, never applied again."""
    rkey, addr, length = pkt.reth
    value = bytes(pkt.payload)
    if length != 8 or len(value) != 8:
        self._nak_fatal(pkt.psn, "NAK_INV_REQ")
        return
    try:
        transfer.atomic(self.qp.pd, rkey, addr,
                        lambda _old: int.from_bytes(value, "little"),
                        qp_num=self.qp.qp_num, access=AccessFlags.REMOTE_WRITE)
    except TransferError as err:
        self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
        return
    self._accept()
    self._after_packet(pkt.psn, True)
