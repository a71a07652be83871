"""The RC responder: the receive side of an RC QP (engine/rc.py), as rxe's rxe_resp.c
is for Linux.

It checks each request's PSN against the expected one (a duplicate is answered again
and not applied, a PSN ahead gets one sequence-error NAK), reassembles SEND and RDMA
WRITE messages and applies them at their last packet, answers READ requests and
executes atomics, and sends ACKs, NAKs and responses back. Its state is the
responder's alone: the receive queue, the expected PSN, the MSN, the message being
reassembled and the saved atomic results. Everything it shares with the requester
(the QP's state, attributes and CQs) it reads from the QP.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..protocol.enums import AccessFlags, QpState, WcFlags, WcOpcode, WcStatus
from ..protocol.errors import RDMAError
from ..protocol.opcodes import FLAGS, Op, opcode_for, with_flags
from ..protocol.packets import Packet
from . import transfer
from .completion import Fault, TransferError
from .rc_common import PSN_MOD, chunks, psn_add, psn_diff, scatter

if TYPE_CHECKING:
    from ..protocol.records import RecvWR
    from .rc import RCQP

# The responder ACKs at least this often within a long message.
ACK_EVERY = 16
_U64 = 1 << 64

ACK = "ACKNOWLEDGE"
ATOMIC_ACK = "ATOMIC_ACKNOWLEDGE"
READ_REQUEST = "RDMA_READ_REQUEST"
_SEND_PACKETS = with_flags(Op.SEND)
_WRITE_PACKETS = with_flags(Op.WRITE)
_ATOMIC_REQUESTS = with_flags(Op.ATOMIC)

# The qp_access_flags bit each remote operation needs (ibv_modify_qp(3)
# qp_access_flags: "Mask of enabled remote access operations"); SENDs need none.
_ACCESS_NEEDED = {
    **dict.fromkeys(with_flags(Op.WRITE), AccessFlags.REMOTE_WRITE),
    READ_REQUEST: AccessFlags.REMOTE_READ,
    **dict.fromkeys(with_flags(Op.ATOMIC), AccessFlags.REMOTE_ATOMIC),
}

# A SEND_WITH_INV whose IETH key the responder may not invalidate: IBTA responder error
# class J, as rxe_resp.c implements it (RESPST_ERR_INVALIDATE_RKEY): the receive
# completes IB_WC_REM_INV_REQ_ERR and the QP goes to ERR; the requester gets NAK
# Invalid Request, REM_INV_REQ_ERR.
REMOTE_INV_FAILED = WcStatus.REM_INV_REQ_ERR

# The responder's NAK for a fault on its own key (docs/semantics.md section 9): the
# requester turns it back into TransferError.status(remote=True).
_FAULT_NAK = {Fault.ACCESS: "NAK_REM_ACCESS", Fault.LENGTH: "NAK_INV_REQ",
              Fault.CRYPTO: "NAK_REM_OP"}


@dataclass(eq=False)
class _Inbound:
    """The message the responder is reassembling."""

    kind: str                 # "SEND" or "RDMA_WRITE"
    recv: RecvWR | None
    reth: tuple | None
    buf: bytearray = field(default_factory=bytearray)


class Responder:
    """The receive queue side of ``qp``."""

    def __init__(self, qp: RCQP) -> None:
        self.qp = qp
        self._rq: deque[RecvWR] = deque()
        self._epsn = 0
        self._msn = 0
        self._msg: _Inbound | None = None
        self._nak_pending = False
        self._unacked = 0
        self._resp_out: list[Packet] = []
        # PSN -> (original value, MSN) of the atomics executed most recently.
        self._atomic_results: OrderedDict[int, tuple[int, int]] = OrderedDict()
        # Receives refused with an RNR NAK before the receive queue is looked at
        # (fault injection: "answer the next N messages with RNR").
        self.refuse_rnr = 0

    def post_recv(self, wr: RecvWR) -> None:
        if self.qp.state == QpState.ERR:
            self.qp.complete_recv(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
            return
        self.qp.require("ibv_post_recv", QpState.INIT, QpState.RTR, QpState.RTS, QpState.SQD)
        if len(self._rq) >= self.qp.rq_depth:
            raise RDMAError("ENOMEM", f"receive queue full ({self.qp.rq_depth} WRs posted)")
        self._rq.append(wr)

    def flush(self) -> None:
        """ERR: every posted receive completes WR_FLUSH_ERR; a message half received is
        dropped."""
        self._msg = None
        while self._rq:
            self.qp.complete_recv(self._rq.popleft().wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)

    def take_packets(self) -> list[Packet]:
        """The ACKs, NAKs and responses owed."""
        out, self._resp_out = self._resp_out, []
        return out

    def _queue_ack(self, psn: int) -> None:
        self._unacked = 0
        pkt = Packet(self.qp.dest_qp, psn, ACK, aeth=("ACK", self._msn))
        # ACKs are cumulative: a newer one makes a queued older one useless.
        if self._resp_out and self._resp_out[-1].opcode == ACK \
                and self._resp_out[-1].aeth[0] == "ACK":
            self._resp_out[-1] = pkt
        else:
            self._resp_out.append(pkt)

    def _nak(self, psn: int, syndrome: str) -> None:
        self._resp_out.append(Packet(self.qp.dest_qp, psn, ACK, aeth=(syndrome, self._msn)))

    def _nak_fatal(self, psn: int, syndrome: str) -> None:
        self._nak(psn, syndrome)
        self.qp.enter_err()

    def _accept(self, n: int = 1) -> None:
        self._epsn = psn_add(self._epsn, n)
        self._nak_pending = False

    def receive(self, pkt: Packet) -> None:
        d = psn_diff(pkt.psn, self._epsn)
        if d < 0:
            # IBTA duplicate request: answer again, apply nothing.
            self.qp.stats["duplicates_discarded"] += 1
            if pkt.opcode == READ_REQUEST:
                self._answer_read(pkt, first_time=False)
            elif pkt.opcode in _ATOMIC_REQUESTS:
                self._replay_atomic(pkt)
            else:
                self._queue_ack(psn_add(self._epsn, -1))
            return
        if d > 0:
            # One sequence-error NAK per gap; later packets of it are dropped silently.
            if not self._nak_pending:
                self._nak_pending = True
                self.qp.stats["psn_seq_naks_sent"] += 1
                self._nak(self._epsn, "NAK_PSN_SEQ")
            return
        op = pkt.opcode
        need = _ACCESS_NEEDED.get(op)
        if need is not None and not self.qp.qp_access_flags & need:
            # The QP's qp_access_flags do not enable this remote operation: rxe's
            # check_op_valid answers NAK Invalid Request and the QP goes to ERR.
            self._nak_fatal(pkt.psn, "NAK_INV_REQ")
        elif op == READ_REQUEST or op in _ATOMIC_REQUESTS:
            if self._msg is not None:
                self._nak_fatal(pkt.psn, "NAK_INV_REQ")    # inside another message
            elif op == READ_REQUEST:
                self._answer_read(pkt, first_time=True)
            else:
                self._execute_atomic(pkt)
        elif op in _SEND_PACKETS:
            self._recv_send(pkt)
        elif op in _WRITE_PACKETS:
            self._recv_write(pkt)
        else:
            self._nak_fatal(pkt.psn, "NAK_INV_REQ")

    def _rnr(self, psn: int) -> None:
        self._nak(psn, "RNR")
        # Packets behind the refused one are dropped, not NAKed, until it is retried.
        self._nak_pending = True

    def _after_packet(self, psn: int, last: bool) -> None:
        self._unacked += 1
        if last:
            self._msn = (self._msn + 1) % PSN_MOD
        if last or self._unacked >= ACK_EVERY:
            self._queue_ack(psn)

    def _recv_send(self, pkt: Packet) -> None:
        kind = FLAGS[pkt.opcode]
        first, last = kind & Op.FIRST, kind & Op.LAST
        if first:
            if self._msg is not None:
                self._nak_fatal(pkt.psn, "NAK_INV_REQ")
                return
            if not self._rq or self.refuse_rnr:
                if self._rq:
                    self.refuse_rnr -= 1
                self._rnr(pkt.psn)
                return
            self._msg = _Inbound("SEND", self._rq.popleft(), None)
        elif self._msg is None or self._msg.kind != "SEND":
            self._nak_fatal(pkt.psn, "NAK_INV_REQ")   # opcode sequence error
            return
        m = self._msg
        m.buf += pkt.payload
        if len(m.buf) > sum(s.length for s in m.recv.sg):
            self._fail_recv(m.recv, WcStatus.LOC_LEN_ERR, pkt.psn, "NAK_INV_REQ")
            return
        self._accept()
        if last:
            self._msg = None
            try:
                scatter(self.qp.pd, m.recv.sg, bytes(m.buf),
                         self.qp.trace_for(role="responder", wr_id=m.recv.wr_id, op="RECV"))
            except TransferError as err:
                # The fault is on the responder's own lkey: a remote operational error
                # for the requester, except a length fault (docs/semantics.md section 9).
                self._fail_recv(m.recv, err.status(remote=False), pkt.psn,
                                "NAK_INV_REQ" if err.fault == Fault.LENGTH else "NAK_REM_OP")
                return
            imm = kind & Op.WITH_IMM
            inv = kind & Op.WITH_INV
            # The data is placed first, then the key invalidated (as rxe's execute()
            # does); a key we may not invalidate fails the receive after all.
            if inv and not self.qp.invalidate(pkt.ieth, remote=True):
                self._fail_recv(m.recv, REMOTE_INV_FAILED, pkt.psn, "NAK_INV_REQ")
                return
            flags = (WcFlags.WITH_IMM if imm else 0) | (WcFlags.WITH_INV if inv else 0)
            self.qp.complete_recv(m.recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV, len(m.buf),
                                  pkt.imm if imm else None, int(flags), pkt.ieth if inv else 0)
        self._after_packet(pkt.psn, last)

    def _fail_recv(self, recv: RecvWR, status: WcStatus, psn: int, syndrome: str) -> None:
        self._msg = None
        self.qp.complete_recv(recv.wr_id, status, WcOpcode.RECV)
        self._nak_fatal(psn, syndrome)

    def _recv_write(self, pkt: Packet) -> None:
        flags = FLAGS[pkt.opcode]
        first, last, imm = flags & Op.FIRST, flags & Op.LAST, flags & Op.WITH_IMM
        if first and self._msg is not None or not first and (
                self._msg is None or self._msg.kind != "RDMA_WRITE"):
            self._nak_fatal(pkt.psn, "NAK_INV_REQ")   # opcode sequence error
            return
        # WRITE_WITH_IMM consumes a receive at its last packet (IBTA): without
        # one nothing of that packet is taken, and the requester retries it.
        if imm and not self._rq:
            self._rnr(pkt.psn)
            return
        if first:
            rkey, addr, dma_len = pkt.reth
            try:
                transfer.check_rx(self.qp.pd, rkey, addr, dma_len, remote=True)
            except TransferError as err:
                self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
                return
            self._msg = _Inbound("RDMA_WRITE", None, pkt.reth)
        m = self._msg
        m.buf += pkt.payload
        rkey, addr, dma_len = m.reth
        if len(m.buf) > dma_len or last and len(m.buf) != dma_len:
            self._msg = None
            self._nak_fatal(pkt.psn, "NAK_INV_REQ")
            return
        self._accept()
        if last:
            self._msg = None
            try:
                transfer.rx(self.qp.pd, rkey, addr, bytes(m.buf), remote=True,
                            trace=self.qp.trace_for(role="responder", psn=pkt.psn, op="RDMA_WRITE"))
            except TransferError as err:
                self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
                return
            if imm:
                recv = self._rq.popleft()
                self.qp.complete_recv(recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM,
                                      len(m.buf), pkt.imm, int(WcFlags.WITH_IMM))
        self._after_packet(pkt.psn, last)

    def _answer_read(self, pkt: Packet, first_time: bool) -> None:
        rkey, addr, length = pkt.reth
        try:
            data = transfer.tx(self.qp.pd, rkey, addr, length, remote=True,
                               trace=self.qp.trace_for(role="responder", psn=pkt.psn, op="RDMA_READ"))
        except TransferError as err:
            self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
            return
        pieces = chunks(data, self.qp.mtu)
        if first_time:
            self._accept(len(pieces))
            self._msn = (self._msn + 1) % PSN_MOD
            self._unacked = 0
        n = len(pieces)
        for i, chunk in enumerate(pieces):
            op = opcode_for(Op.READ_RESPONSE, i == 0, i == n - 1)
            aeth = ("ACK", self._msn) if FLAGS[op] & Op.AETH else None
            self._resp_out.append(Packet(self.qp.dest_qp, psn_add(pkt.psn, i), op, chunk,
                                         aeth=aeth))

    def _execute_atomic(self, pkt: Packet) -> None:
        if pkt.atomic is None:
            self._nak_fatal(pkt.psn, "NAK_INV_REQ")     # an atomic opcode without AtomicETH
            return
        rkey, addr, swap_add, compare = pkt.atomic
        if pkt.opcode == "COMPARE_SWAP":
            def update(old: int) -> int:
                return swap_add if old == compare else old
        else:
            def update(old: int) -> int:
                return (old + swap_add) % _U64
        try:
            # REMOTE_ATOMIC on the rkey, then 8-byte alignment (IBTA 9.4.5; rxe checks
            # in this order: check_rkey, then atomic_reply's alignment): Invalid Request.
            original = transfer.atomic(self.qp.pd, rkey, addr, update)
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

    def _replay_atomic(self, pkt: Packet) -> None:
        saved = self._atomic_results.get(pkt.psn)
        if saved is None:
            # Not among the saved results: IBTA leaves it to the responder; rxe drops it
            # ("Resource not found. Class D error"), and the requester retries or fails.
            return
        self._send_atomic_ack(pkt.psn, *saved)

    def _send_atomic_ack(self, psn: int, original: int, msn: int) -> None:
        self._resp_out.append(Packet(self.qp.dest_qp, psn, ATOMIC_ACK, aeth=("ACK", msn),
                                     atomic_ack=original))
