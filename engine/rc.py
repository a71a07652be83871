"""The RC QP as a sans-I/O state machine: work requests and packets in, packets and
completions out. No sockets, no clock: the caller passes ``now`` (seconds) and moves
the packets; ``next_deadline()`` says when the timers want ``poll_wire`` again.

One RCQP is a requester (its send queue, engine/rc_requester.py), a completer (what
comes back for the send queue, engine/rc_completer.py) and a responder (its receive
queue, engine/rc_responder.py), as an IBTA RC QP is and as rxe splits it; the QP holds
what they share: its state (engine/qp_state.py), attributes, CQs and
asynchronous events (``take_events``). The WR and WC records are protocol/records.py's.
Completions go to two CQs, as with ibv_create_qp's send_cq and recv_cq:
``poll_send_cq()`` and ``poll_recv_cq()``; ``poll_cq()`` returns both (send
completions first).

Modelled:

- ibv_modify_qp as ``modify(attr, attr_mask)``, by the transition table of
  engine/qp_state.py: RESET, INIT, RTR, RTS, SQD and ERR, the attributes each
  transition requires and allows, timeout and min_rnr_timer as IBTA codes. An illegal
  transition, attribute or value raises EINVAL and changes nothing. In SQD the
  requester finishes the messages it has started and starts no new WR (local ones
  included) until SQD -> RTS; with en_sqd_async_notify, IBV_EVENT_SQ_DRAINED is raised
  (``take_events``) once nothing it started is outstanding. RESET empties both queues
  without completions. ERR flushes every outstanding WR with WR_FLUSH_ERR, and a WR
  posted in ERR completes at once with WR_FLUSH_ERR.
- SEND, SEND_WITH_IMM, SEND_WITH_INV, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ,
  segmented to the path MTU with the IBTA BTH opcodes; 24-bit PSNs modulo 2^24; a READ of
  n response packets takes n PSNs of the requester's sequence, as in the IBTA RC transport.
- ATOMIC_CMP_AND_SWP and ATOMIC_FETCH_AND_ADD: one request packet and one PSN; the
  responder checks REMOTE_ATOMIC, 8-byte alignment and that the key is an MR or a plain
  MKEY, applies the 64-bit little-endian operation and answers ATOMIC_ACKNOWLEDGE with
  the original value, which the requester scatters into its one 8-byte SGE. A duplicate
  atomic request is answered from the last max_dest_rd_atomic results, never executed
  again; one older than that is dropped, as IBTA allows for a request outside the
  responder's resources. READs and atomics are completed only by their own responses, in order, and
  implicitly acknowledge the requests before them.
- ``max_rd_atomic`` READ and atomic requests unanswered at once; WRs after one that
  would exceed it wait (ibv_modify_qp(3) max_rd_atomic).
- SEND_WITH_INV: after the data is placed the responder invalidates the IETH key, which
  must be an MKEY of its PD created with MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE;
  the receive completes with IBV_WC_WITH_INV and ``invalidated_rkey``. Any other key
  (unknown, an MR, another PD's, an MKEY without the flag) fails the receive with
  ``REMOTE_INV_FAILED`` and NAKs Invalid Request (requester REM_INV_REQ_ERR); both QPs
  go to ERR.
- Local WRs, which send nothing and run when they reach the head of the send queue
  (every earlier WR completed): LOCAL_INV of an MKEY of the QP's PD, and ``post_local``
  (the MKEY configure's in-order DRIVER1 completion, with an optional action). One that
  has an effect (LOCAL_INV, or an action) holds back the transmission of later WRs,
  which must see that effect. A LOCAL_INV of anything but an MKEY of the PD completes
  ``LOCAL_INV_FAILED``, an action's TransferError its local status; the QP goes to ERR.
- IBV_SEND_INLINE on SEND / SEND_WITH_IMM / SEND_WITH_INV / RDMA_WRITE(_WITH_IMM): the
  payload is copied at post time, up to ``max_inline_data`` bytes.
- The requester gathers a WR's payload (one transfer.tx per SGE) when it first
  transmits it and keeps those bytes for retransmission, cutting its packets (or
  runs) from them as they go; a READ's responses are reassembled and scattered (one
  transfer.rx per SGE) when the last one arrives, straight from a run that holds
  them all.
- Runs (protocol/packets.py ``Run``; on the wire, docs/protocol.md "Packet trains"):
  ``poll_wire`` gives runs of one message's packets (a SEND's or WRITE's packets as the
  window lets them go, a READ's responses) and single packets; ``receive`` takes a run
  (a single packet is a run of one) in one step where that is what its packets one by
  one would do, and its packets one by one otherwise.
- A window of the device's ``rc_window`` unacknowledged packets; cumulative ACKs, implicit
  acknowledgement of earlier requests by READ responses, atomic ACKs and NAKs.
- Go-back-N from the oldest unacknowledged PSN on timeout, on NAK(PSN sequence error),
  and after an RNR NAK's timer (the responder's min_rnr_timer, which the NAK carries,
  IBTA 9.7.5.2.8); retry_cnt and rnr_retry (7 = forever) exhaustion
  give RETRY_EXC_ERR / RNR_RETRY_EXC_ERR.
- The responder's expected PSN: a duplicate is re-ACKed and not applied again (a
  duplicate READ request is answered again from its own RETH, a duplicate atomic from
  the saved result); a PSN ahead gets one NAK(PSN sequence error) until the gap is filled.
- SEND and RDMA_WRITE payloads are reassembled and applied at the message's last
  packet with one transfer per SGE (SEND) or one transfer.rx over the whole RETH range
  (WRITE), so a signature or crypto MKEY sees whole, aligned transfers.
- docs/semantics.md section 9: SEND larger than the receive, rkey faults, PI-splitting
  lengths and crypto faults on the responder's key, each NAKed with the syndrome the
  requester maps to its completion status; the responder moves to ERR.
- ACK coalescing: the last packet of a message, and every ``ACK_EVERY`` packets.
- qp_access_flags: an RDMA WRITE, READ or atomic the QP does not enable (REMOTE_WRITE,
  REMOTE_READ, REMOTE_ATOMIC) is NAKed Invalid Request and the responder goes to ERR,
  as rxe's check_op_valid does; a QP never given the flags enables all three.
- Signature pipelining (mlx5dv_create_qp(3) MLX5DV_QP_CREATE_SIG_PIPELINING,
  mlx5dv_qp_cancel_posted_send_wrs(3)): a signature error in a transfer of the
  requester (its gather, or a READ response's scatter) makes the QP stop in SQD before
  the next WR with IBV_SEND_FENCE starts; IBV_EVENT_SQ_DRAINED follows once nothing it
  started is outstanding. ``cancel_posted_send_wrs`` turns the unstarted WRs with a
  wr_id into NOPs; SQD -> RTS resumes.

Not modelled yet:

- BIND_MW, TSO and memory windows: posting them raises EOPNOTSUPP. IBV_SEND_SOLICITED
  is accepted and has no effect (no solicited events); IBV_SEND_FENCE only where
  signature pipelining gives it one (above), no fence wait otherwise.
- Alternate paths and path migration (EOPNOTSUPP), max_dest_rd_atomic as a limit on
  the READs and atomics in flight towards the responder (it sizes the saved atomic
  results only), and MSN checking by the requester.
- Packet integrity is the daemon's: it checks each frame's ICRC stand-in
  (protocol/packets.py ``decode``) and drops a bad one before it reaches the QP.
- Atomics are atomic with respect to this model only (one thread); the MKEY-configure
  WR's effect is applied by its caller at post time, ``post_local`` only orders its
  completion.
- The requester resends the bytes gathered at first transmission; hardware gathers
  again from memory.
- Inline data is read through its SGE's lkey, which must name an MR of the QP's PD
  that holds the range (verbs does not check the lkey of inline data, but memory here
  is reachable only through an MR); anything else is EINVAL at post.
- byte_len is reported for receive completions, RDMA_READ and atomics; it is 0 on the
  other send-side completions (ibv_poll_cq(3) defines it for receives only) and on every
  errored completion.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol.enums import (
    AccessFlags,
    EventType,
    MkeyInitAttrFlags,
    Mtu,
    QpAttrMask,
    QpState,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from ..protocol.errors import einval
from ..protocol.opcodes import ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE
from ..protocol.packets import Packet, Run
from ..protocol.records import WC, RecvWR, SendWR
from . import mw, qp_state, transfer
from .completion import CompletionLists
from .hca import PD
from .mkey import MKey
from .mw import MW
from .qp_state import RECEIVING, SENDING
from .rc_common import PSN_MOD, psn_add, psn_diff
from .rc_completer import Completer
from .rc_requester import Requester
from .rc_responder import Responder

__all__ = ["PSN_MOD", "RCQP", "WC", "Packet", "RecvWR", "Run", "SendWR", "psn_add",
           "psn_diff"]

# Runs for the completer (ACKs and READ responses); the rest are requests.
_RESPONSES = frozenset(("RDMA_READ_RESPONSE", ACKNOWLEDGE, ATOMIC_ACKNOWLEDGE))

# Where RCQP.modify keeps each attribute, in the model's units (IBTA codes to seconds).
_SETTERS = {
    QpAttrMask.PATH_MTU: ("mtu", lambda v: Mtu(v).nbytes),
    QpAttrMask.DEST_QPN: ("dest_qp", None),
    QpAttrMask.RQ_PSN: ("responder._epsn", None),
    QpAttrMask.SQ_PSN: ("requester.next_psn", None),
    QpAttrMask.TIMEOUT: ("timeout_s", qp_state.ack_timeout_s),
    QpAttrMask.RETRY_CNT: ("retry_cnt", None),
    QpAttrMask.RNR_RETRY: ("rnr_retry", None),
    QpAttrMask.MIN_RNR_TIMER: ("rnr_timer_s", qp_state.rnr_timer_s),
    QpAttrMask.MAX_QP_RD_ATOMIC: ("max_rd_atomic", None),
    QpAttrMask.MAX_DEST_RD_ATOMIC: ("max_dest_rd_atomic", None),
    QpAttrMask.ACCESS_FLAGS: ("qp_access_flags", None),
}


class RCQP(CompletionLists):
    """An RC QP of ``pd``: post WRs, exchange packets, poll completions."""

    # It takes packets only from the QP its address vector names (UD: from anyone).
    connected = True

    def __init__(self, pd: PD, qp_num: int, sq_depth: int = 128, rq_depth: int = 128,
                 sq_sig_all: bool = False, max_inline_data: int = 256,
                 max_rd_atomic: int = 16, sig_pipelining: bool = False, srq=None) -> None:
        if max_inline_data < 0:
            raise einval(f"max_inline_data {max_inline_data} must not be negative")
        # Zero would let no READ or atomic ever go: the WR would wait forever.
        if max_rd_atomic < 1:
            raise einval(f"max_rd_atomic {max_rd_atomic} must be at least 1")
        self.pd = pd
        self.qp_num = qp_num
        self.sq_depth = sq_depth
        self.rq_depth = rq_depth
        # The SRQ its receives come from (engine/srq.py), or None: its own queue.
        self.srq = srq
        self.sq_sig_all = sq_sig_all
        self.max_inline_data = max_inline_data
        self.max_rd_atomic = max_rd_atomic
        self.state = QpState.RESET
        # mlx5dv_create_qp(3) MLX5DV_QP_CREATE_SIG_PIPELINING: a signature error stops
        # the send queue in SQD before the next WR with IBV_SEND_FENCE (the requester's).
        self.sig_pipelining = sig_pipelining
        # Asynchronous events (enum ibv_event_type) for the QP's context, oldest first.
        self.events: list[EventType] = []
        self.dest_qp = 0
        self.mtu = Mtu.MTU_1024.nbytes
        self.timeout_s = qp_state.ack_timeout_s(qp_state.DEFAULT_TIMEOUT)
        self.retry_cnt = 7
        self.rnr_retry = 7
        self.rnr_timer_s = qp_state.rnr_timer_s(qp_state.DEFAULT_MIN_RNR_TIMER)
        self.max_dest_rd_atomic = max_rd_atomic
        # RESET -> INIT requires qp_access_flags, but softhca's client sends none: a QP
        # never given them enables every remote operation, as it did before they were
        # checked (engine/qp_state.py KEPT_IF_ABSENT).
        self.qp_access_flags = int(AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
                                   | AccessFlags.REMOTE_ATOMIC)
        self._init_completions()
        # What a link-level observer counts (the daemon sums them per daemon): go-back-N
        # retransmissions (after an ACK timeout or a sequence-error NAK) and the packets
        # they sent again, ACK timeouts, RNR NAKs acted on, duplicate requests
        # the responder answered without applying, sequence-error NAKs sent.
        self.stats = {"retransmissions": 0, "retransmitted_packets": 0, "ack_timeouts": 0, "rnr_retries": 0,
                      "duplicates_discarded": 0, "psn_seq_naks_sent": 0, "read_rerequests": 0,
                      "duplicate_reads_answered": 0, "duplicate_reads_dropped": 0,
                      "duplicate_runs_discarded": 0, "out_of_window_discarded": 0,
                      "psn_seq_naks_ignored": 0}
        # A subscriber to the pipeline's trace: called with (context, TraceEvent), the
        # context naming the QP, the WR or PSN and the operation. None: no trace work.
        self.trace: Callable[[dict, transfer.TraceEvent], None] | None = None
        # The device's RC window (engine/hca.py DEFAULT_RC_WINDOW), read by the requester.
        self.rc_window = pd.hca.rc_window
        self.requester = Requester(self)
        self.completer = Completer(self)
        self.responder = Responder(self)

    @property
    def refuse_rnr(self) -> int:
        """Receives the responder refuses with an RNR NAK before looking at its receive
        queue (fault injection: "answer the next N messages with RNR")."""
        return self.responder.refuse_rnr

    @refuse_rnr.setter
    def refuse_rnr(self, n: int) -> None:
        self.responder.refuse_rnr = n

    def trace_for(self, **ctx):
        """The trace callback for one operation of this QP, or None when nobody listens."""
        if self.trace is None:
            return None
        trace, ctx = self.trace, {"qp": self.qp_num, **ctx}
        return lambda ev: trace(ctx, ev)

    # -- state machine -------------------------------------------------------
    def modify(self, attr: dict, attr_mask: int) -> None:
        """ibv_modify_qp: apply the fields of ``attr`` (struct ibv_qp_attr field names,
        IBTA codes for timeout and min_rnr_timer) that ``attr_mask`` names, and move to
        ``attr["qp_state"]`` if it names IBV_QP_STATE, by the transition table of
        engine/qp_state.py. ibv_modify_qp(3): "If any of the modify attributes or the
        modify mask are invalid, none of the attributes will be modified (including the
        QP state)": everything is checked before anything changes."""
        cur = QpState(self.state)
        nxt, values = qp_state.check(cur, attr, attr_mask)
        self._apply(values)
        if nxt == QpState.ERR:
            self.enter_err()
        elif nxt == QpState.RESET:
            self._reset()
        else:
            if nxt == QpState.SQD and cur != QpState.SQD:
                self.enter_sqd(bool(values.get(QpAttrMask.EN_SQD_ASYNC_NOTIFY, 0)))
            elif cur == QpState.SQD and nxt == QpState.RTS:
                # mlx5dv_qp_cancel_posted_send_wrs(3) step 4: back to RTS, the send
                # queue resumes (canceled WRs complete as NOPs).
                self.requester.resume()
            self.state = nxt

    def enter_sqd(self, notify: bool) -> None:
        """The send queue drains: started WRs finish, none starts; IBV_EVENT_SQ_DRAINED
        is raised once nothing started is outstanding, if ``notify``."""
        self.state = QpState.SQD
        self.requester.drain(notify)

    def take_events(self) -> list[EventType]:
        out, self.events = self.events, []
        return out

    def cancel_posted_send_wrs(self, wr_id: int) -> int:
        """mlx5dv_qp_cancel_posted_send_wrs(3): in SQD, every WR with ``wr_id`` that has
        not started becomes a NOP that completes as it was signaled, with its own opcode
        (or is flushed if the QP goes to ERR); the number canceled. libmlx5 counts a WR
        canceled twice twice, and so does this."""
        qp_state.require("mlx5dv_qp_cancel_posted_send_wrs", self.state)
        return self.requester.cancel(wr_id)

    def _apply(self, values: dict) -> None:
        for bit, value in values.items():
            setter = _SETTERS.get(bit)
            if setter is not None:
                path, convert = setter
                role, _, name = path.rpartition(".")
                setattr(getattr(self, role) if role else self, name,
                        value if convert is None else convert(value))

    # Engine-side conveniences for a fake clock: seconds, not IBTA codes, for the timers.
    def modify_to_init(self) -> None:
        self.modify({"qp_state": QpState.INIT}, QpAttrMask.STATE)

    def modify_to_rtr(self, dest_qp: int, rq_psn: int, path_mtu: Mtu) -> None:
        self.modify({"qp_state": QpState.RTR, "dest_qp_num": dest_qp, "rq_psn": rq_psn,
                     "path_mtu": path_mtu},
                    QpAttrMask.STATE | QpAttrMask.AV | QpAttrMask.DEST_QPN
                    | QpAttrMask.RQ_PSN | QpAttrMask.PATH_MTU)

    def modify_to_rts(self, sq_psn: int, timeout_s: float = 0.1, retry_cnt: int = 7,
                      rnr_retry: int = 7, rnr_timer_s: float = 0.01) -> None:
        if timeout_s <= 0 or rnr_timer_s < 0:
            raise einval("timeout_s must be positive and rnr_timer_s not negative")
        self.modify({"qp_state": QpState.RTS, "sq_psn": sq_psn, "retry_cnt": retry_cnt,
                     "rnr_retry": rnr_retry},
                    QpAttrMask.STATE | QpAttrMask.SQ_PSN | QpAttrMask.RETRY_CNT
                    | QpAttrMask.RNR_RETRY)
        self.timeout_s = timeout_s
        self.rnr_timer_s = rnr_timer_s

    def modify_to_err(self) -> None:
        self.modify({"qp_state": QpState.ERR}, QpAttrMask.STATE)

    def _reset(self) -> None:
        """ibv_modify_qp to RESET: the queues are emptied without completions and the
        QP's PSNs and connection forgotten, as after ibv_create_qp."""
        self.state = QpState.RESET
        self.dest_qp = 0
        self._clear_completions()
        self.requester = Requester(self)
        self.completer = Completer(self)
        self.responder = Responder(self)

    def enter_err(self) -> None:
        """Every outstanding WR completes WR_FLUSH_ERR (docs/semantics.md section 9)."""
        self.state = QpState.ERR
        self.requester.flush()
        self.responder.flush()

    def invalidate(self, key: int | None, remote: bool) -> bool:
        """Invalidate MKEY or type 2 memory window ``key`` of this QP's PD (engine/mw.py
        for windows); False when it may not be. Of the other keys, only MKEYs
        are invalidated here: an MR is registered, not fast-registered, and rxe, too,
        refuses to invalidate one (rxe_invalidate_mr: type != IB_MR_TYPE_MEM_REG).
        Remotely, mlx5dv_create_mkey(3) allows it only for an MKEY created with
        MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE. An already invalid MKEY stays so."""
        obj = self.pd.hca.keys.get(key) if key is not None else None
        if isinstance(obj, MW):
            return mw.invalidate(obj, self.pd)
        if not isinstance(obj, MKey) or obj.pd is not self.pd:
            return False
        if remote and not obj.create_flags & MkeyInitAttrFlags.REMOTE_INVALIDATE:
            return False
        obj.invalidate()
        return True

    # -- verbs ---------------------------------------------------------------
    def post_send(self, wr: SendWR, now: float) -> None:
        self.requester.post_send(wr)

    def prepare_send(self, wr: SendWR, now: float, ahead: int) -> Callable[[], None]:
        """ibv_wr_complete's half of post_send (ibv_wr_post(3): nothing is posted unless
        it succeeds): the checks ``post_send(wr, now)`` makes, as if ``ahead`` WRs of
        the same posting were posted before it, raising what it would raise and
        posting nothing. The call returned posts ``wr``; it cannot fail as long as
        nothing else reaches the QP in between (the caller makes the calls of a whole
        posting at once, after preparing all of it)."""
        return self.requester.prepare_send(wr, ahead)

    def post_local(self, wr_id: int, signaled: bool, opcode: WcOpcode,
                   action: Callable[[], None] | None = None, now: float = 0.0) -> None:
        """A WR that sends nothing: ``action`` (if any) runs when it reaches the head of
        the send queue, every earlier WR completed; it then completes SUCCESS with
        ``opcode`` (signaled or sq_sig_all), or, if the action raises TransferError,
        with that error's local status, and the QP goes to ERR. The MKEY configure
        (opcode DRIVER1) uses it for its in-order completion; its effect is applied at
        post time by the caller (docs/semantics.md section 4)."""
        self.requester.post_local(SendWR(wr_id, WrOpcode.DRIVER1), signaled, opcode, action)

    def post_failed(self, wr: SendWR, status: WcStatus) -> None:
        """A send WR taken from a send ring (server/wq_ring.py) that ibv_post_send would
        have refused: as a device finds a malformed WQE when it executes it, the WRs
        before it complete, it completes ``status`` (signaled or not) and the QP goes to
        ERR, flushing the rest; in ERR it flushes."""
        self.requester.post_failed(wr, status)

    def post_recv(self, wr: RecvWR) -> None:
        self.responder.post_recv(wr)

    def sq_outstanding(self) -> int:
        """Send WRs posted and not yet retired (their completion made or not owed)."""
        return len(self.requester.queue)

    def rq_outstanding(self) -> int:
        """Receive WRs of its own queue posted and not yet consumed or flushed."""
        return 0 if self.srq is not None else len(self.responder.rq)

    def complete_send(self, wr_id: int, status: WcStatus, opcode: WcOpcode,
                      byte_len: int = 0) -> None:
        self._scq.append(WC(wr_id, status, opcode, byte_len, self.qp_num))

    def complete_recv(self, wr_id: int, status: WcStatus, opcode: WcOpcode, byte_len: int = 0,
                      imm_data: int | None = None, wc_flags: int = 0,
                      invalidated_rkey: int = 0) -> None:
        self._rcq.append(WC(wr_id, status, opcode, byte_len, self.qp_num, imm_data, wc_flags,
                            invalidated_rkey))

    def next_deadline(self) -> float | None:
        """When a timer (retransmission or RNR wait) wants ``poll_wire``; packets owed
        because of a post or a receive, and local WRs that reached the head of the send
        queue, are dealt with as soon as ``poll_wire`` is called."""
        return self.requester.next_deadline()

    # -- packets ---------------------------------------------------------------
    def poll_wire(self, now: float, runs: bool = True) -> list[Packet | Run]:
        """What the QP sends now: packets, and runs of several of one message's packets
        (READ responses always; a WR's request packets when ``runs``). Cutting the runs
        into packets (protocol/packets.py ``split``) gives the packets one by one."""
        # The responder's answers go out even from ERR: the NAK that caused it is owed.
        out = self.responder.take_packets()
        self.requester.poll(out, now, runs)
        return out

    def receive(self, run: Run, now: float) -> None:
        """A run arrives (a single packet: ``Run.of``): the same as its packets arriving
        one by one, in one step where the completer or responder can take it so."""
        if run.dest_qp != self.qp_num or self.state not in RECEIVING:
            return      # IBTA: a QP not in RTR/RTS/SQD silently drops what arrives
        if run.kind in _RESPONSES:
            if self.state not in SENDING or self.completer.receive(run, now):
                return
        elif self.responder.receive(run):
            return
        for one in run.one_by_one():
            self.receive(one, now)
