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
from ..protocol.opcodes import FLAGS, Op, with_flags
from ..protocol.packets import Packet, Train
from . import transfer
from .completion import Fault, TransferError
from .rc_common import PSN_MOD, psn_add, psn_diff, scatter

if TYPE_CHECKING:
    from ..protocol.records import RecvWR
    from .rc import RCQP

# The responder ACKs at least this often within a long message.
ACK_EVERY = 16
# The most READ response packets one train holds: a READ's responses are all sent at
# once (no window holds them back), and one train for all of them lets the requester
# scatter straight from the frame. 1 MiB at MTU 4096; measured 1.7 times the goodput of
# 64 for a 1 MiB READ (docs/performance.md, "Packet trains").
TRAIN_MAX = 256
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
        # Packets and trains of READ responses, in the order they go.
        self._resp_out: list[Packet | Train] = []
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

    def take_packets(self) -> list[Packet | Train]:
        """The ACKs, NAKs and responses owed (READ responses as trains)."""
        out, self._resp_out = self._resp_out, []
        return out

    def _queue_ack(self, psn: int) -> None:
        self._unacked = 0
        pkt = Packet(self.qp.dest_qp, psn, ACK, aeth=("ACK", self._msn))
        # ACKs are cumulative: a newer one makes a queued older one useless.
        last = self._resp_out[-1] if self._resp_out else None
        if type(last) is Packet and last.opcode == ACK and last.aeth[0] == "ACK":
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

    # -- trains ------------------------------------------------------------------------
    def receive_train(self, t: Train) -> bool:
        """A train of SEND or RDMA WRITE packets taken in one step, when that is what its
        packets one by one would do: it starts at the expected PSN, continues (or begins)
        the message in progress, the checks its packets would make all pass (access, the
        RETH, the receive, the lengths), and at most its last packet completes the
        message. False (nothing done) otherwise: the caller gives its packets to
        ``receive`` one by one, which decides every other case (duplicates, a PSN
        ahead, opcode sequence errors, RNR, errors mid-message) as it always has."""
        if psn_diff(t.psn, self._epsn) != 0 or (t.kind == "RDMA_WRITE"
                                                and not self.qp.qp_access_flags
                                                & AccessFlags.REMOTE_WRITE):
            return False
        m = self._msg
        if t.first != (m is None) or m is not None and m.kind != t.kind:
            return False
        size = len(t.payload) + (len(m.buf) if m is not None else 0)
        if t.kind == "SEND":
            if t.first and (not self._rq or self.refuse_rnr):
                return False
            recv = m.recv if m is not None else self._rq[0]
            if size > sum(s.length for s in recv.sg):
                return False
        else:
            reth = m.reth if m is not None else t.reth
            if size > reth[2] or t.last and size != reth[2]:
                return False
            # WRITE_WITH_IMM takes a receive at its last packet, or is refused with RNR.
            if t.last and t.imm is not None and not self._rq:
                return False
            if t.first:
                try:
                    transfer.check_rx(self.qp.pd, reth[0], reth[1], reth[2], remote=True)
                except TransferError:
                    return False
        # Every packet but the last: accepted and buffered, ACKed every ACK_EVERY.
        body = t.n - 1 if t.last else t.n
        whole = t.first and t.last
        if t.first and not whole:
            m = self._msg = _Inbound(t.kind, self._rq.popleft() if t.kind == "SEND" else None,
                                     t.reth)
        if not whole:
            m.buf += t.payload
        self._accept(body)
        self._ack_run(t.psn, body)
        if not t.last:
            return True
        # The last packet completes the message, as _recv_send / _recv_write do.
        psn = t.end_psn
        self._accept()
        data = t.payload if whole else memoryview(m.buf)
        self._msg = None
        op = FLAGS[t.opcode(t.n - 1)]
        if t.kind == "SEND":
            recv = self._rq.popleft() if whole else m.recv
            ok = self._finish_send(recv, data, psn, op, t.imm, t.ieth)
        else:
            ok = self._finish_write(t.reth if whole else m.reth, data, psn,
                                    op & Op.WITH_IMM, t.imm)
        if ok:
            self._after_packet(psn, True)
        return True

    def _ack_run(self, psn: int, k: int) -> None:
        """``_after_packet`` for ``k`` accepted packets from ``psn`` none of which ends
        its message: an ACK is due at every ACK_EVERY-th, and the queued ones coalesce
        (``_queue_ack``), so only the last one due is queued."""
        total = self._unacked + k
        if total >= ACK_EVERY:
            self._queue_ack(psn_add(psn, k - total % ACK_EVERY - 1))
            self._unacked = total % ACK_EVERY
        else:
            self._unacked = total

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
            if not self._finish_send(m.recv, memoryview(m.buf), pkt.psn, kind, pkt.imm,
                                     pkt.ieth):
                return
        self._after_packet(pkt.psn, last)

    def _finish_send(self, recv: RecvWR, data, psn: int, kind: Op, imm_data, ieth) -> bool:
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
        imm = kind & Op.WITH_IMM
        inv = kind & Op.WITH_INV
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
            if not self._finish_write(m.reth, memoryview(m.buf), pkt.psn, imm, pkt.imm):
                return
        self._after_packet(pkt.psn, last)

    def _finish_write(self, reth: tuple, data, psn: int, imm, imm_data) -> bool:
        """The last packet (PSN ``psn``) of an RDMA WRITE completed ``data``: one
        transfer over the whole RETH range, then the receive of WRITE_WITH_IMM; False
        when the transfer failed (the QP went to ERR)."""
        rkey, addr, _ = reth
        try:
            transfer.rx(self.qp.pd, rkey, addr, data, remote=True,
                        trace=self.qp.trace_for(role="responder", psn=psn, op="RDMA_WRITE"))
        except TransferError as err:
            self._nak_fatal(psn, _FAULT_NAK[err.fault])
            return False
        if imm:
            recv = self._rq.popleft()
            self.qp.complete_recv(recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM,
                                  len(data), imm_data, int(WcFlags.WITH_IMM))
        return True

    def _answer_read(self, pkt: Packet, first_time: bool) -> None:
        rkey, addr, length = pkt.reth
        try:
            data = transfer.tx(self.qp.pd, rkey, addr, length, remote=True,
                               trace=self.qp.trace_for(role="responder", psn=pkt.psn, op="RDMA_READ"))
        except TransferError as err:
            self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
            return
        mtu = self.qp.mtu
        n = max(1, -(-len(data) // mtu))
        if first_time:
            self._accept(n)
            self._msn = (self._msn + 1) % PSN_MOD
            self._unacked = 0
        # The responses as trains over one view of the data (RCQP.poll_packets cuts them
        # into packets for a caller that takes packets): at most TRAIN_MAX packets each,
        # never across the PSN wrap.
        view = memoryview(data)
        a = 0
        while a < n:
            psn = psn_add(pkt.psn, a)
            k = min(n - a, TRAIN_MAX, PSN_MOD - psn)
            t = Train(self.qp.dest_qp, psn, k, "RDMA_READ_RESPONSE", a == 0, a + k == n, mtu,
                      view[a * mtu:(a + k) * mtu], aeth=("ACK", self._msn))
            self._resp_out.append(t if k > 1 else t.packet(0))
            a += k

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
