"""What the unacknowledged QPs, UD (engine/ud.py) and UC (engine/uc.py), share: their
ibv_modify_qp tables, a send queue that completes a WR once its packets are sent (no
ACK ever comes back), a receive queue, the CQs and the state machine.

Linux rxe runs UC and UD through the same requester and responder as RC, skipping
what needs ACKs (rxe_req.c, rxe_resp.c by ``qp_type``); here RC's roles are kept for
RC alone (engine/rc.py) and the two unacknowledged transports share this base:

- A send WR is gathered and sent at once when the QP polls (no window, no timers,
  no retransmission), and completes SUCCESS then, signaled or with sq_sig_all: lost
  packets are simply lost. A local fault (an lkey that does not hold the range)
  completes the WR with the local status and moves the QP to ERR, as rxe's completer
  does for any errored WR.
- A message that cannot be taken (no receive posted, a receive too small, a bad rkey)
  is dropped silently and counted (``datagrams_dropped``): responder error classes D
  and E of rxe_resp.c for a QP without an SRQ, which keep the receive WR posted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial

from ..protocol.attrs import SGE
from ..protocol.enums import QpAttrMask as M
from ..protocol.enums import QpState as S
from ..protocol.enums import SendFlags, WcOpcode, WcStatus, WrOpcode
from ..protocol.errors import RDMAError, einval, eopnotsupp
from ..protocol.packets import Packet, Run
from ..protocol.records import WC, RecvWR, SendWR
from . import qp_state, transfer
from .completion import CompletionLists, TransferError
from .hca import MR, PD
from .qp_state import Transition
from .rc_common import PSN_MOD

# ibv_modify_qp(3)'s required attributes for IBV_QPT_UD and IBV_QPT_UC; the optional
# ones are the kernel's qp_state_table (ib_modify_qp_is_ok). SQD and SQE are not
# modelled for them: their send queues never stop.
_TO_ANY = {**{(s, S.RESET): Transition(M(0)) for s in S},
           **{(s, S.ERR): Transition(M(0)) for s in S}}
UD_TRANSITIONS: dict[tuple[S, S], Transition] = {
    (S.RESET, S.INIT): Transition(M.PKEY_INDEX | M.PORT | M.QKEY),
    (S.INIT, S.INIT): Transition(M(0), M.PKEY_INDEX | M.PORT | M.QKEY),
    (S.INIT, S.RTR): Transition(M(0), M.PKEY_INDEX | M.QKEY),
    (S.RTR, S.RTS): Transition(M.SQ_PSN, M.CUR_STATE | M.QKEY),
    (S.RTS, S.RTS): Transition(M(0), M.CUR_STATE | M.QKEY),
    **_TO_ANY,
}
UC_TRANSITIONS: dict[tuple[S, S], Transition] = {
    (S.RESET, S.INIT): Transition(M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
    (S.INIT, S.INIT): Transition(M(0), M.PKEY_INDEX | M.PORT | M.ACCESS_FLAGS),
    (S.INIT, S.RTR): Transition(M.AV | M.PATH_MTU | M.DEST_QPN | M.RQ_PSN,
                                M.ACCESS_FLAGS | M.PKEY_INDEX),
    (S.RTR, S.RTS): Transition(M.SQ_PSN, M.CUR_STATE | M.ACCESS_FLAGS),
    (S.RTS, S.RTS): Transition(M(0), M.CUR_STATE | M.ACCESS_FLAGS),
    **_TO_ANY,
}
# As for RC (engine/qp_state.py KEPT_IF_ABSENT): one port and one P_Key exist, and
# sq_psn is 0 unless given; the Q_Key and the UC path are required as the man page says.
KEPT_IF_ABSENT = M.PKEY_INDEX | M.PORT | M.SQ_PSN | M.ACCESS_FLAGS

_SETTERS = {M.DEST_QPN: "dest_qp", M.RQ_PSN: "epsn", M.SQ_PSN: "next_psn", M.QKEY: "qkey",
            M.ACCESS_FLAGS: "qp_access_flags"}


class DatagramQP(CompletionLists):
    """The base of UDQP and UCQP: state, queues, completions, and the interface the
    daemon drives a QP through (the same as engine/rc.py's RCQP)."""

    # Set by the subclass: its ibv_modify_qp table, its name in messages, the send WR
    # opcodes it takes (others are EINVAL at post, as rxe's wr_opcode_mask answers).
    TRANSITIONS: dict = {}
    TYPE = ""
    OPCODES: dict[WrOpcode, WcOpcode] = {}
    # Whether it takes packets only from the QP its address vector names.
    connected = True
    # Nothing is retried (ibv_query_qp answers 0).
    retry_cnt = 0
    rnr_retry = 0

    def __init__(self, pd: PD, qp_num: int, sq_depth: int = 128, rq_depth: int = 128,
                 sq_sig_all: bool = False, max_inline_data: int = 256) -> None:
        if max_inline_data < 0:
            raise einval(f"max_inline_data {max_inline_data} must not be negative")
        self.pd, self.qp_num = pd, qp_num
        self.sq_depth, self.rq_depth = sq_depth, rq_depth
        self.sq_sig_all, self.max_inline_data = sq_sig_all, max_inline_data
        self.state = S.RESET
        self.events: list = []
        self.dest_qp = 0
        self.qkey = 0
        self.next_psn = 0
        self.epsn = 0
        self.qp_access_flags = 0
        self.mtu = 4096
        # Counted like RC's (the daemon sums every QP's); datagrams_dropped: messages
        # the receiver could not take, dropped silently.
        self.stats = {"retransmissions": 0, "retransmitted_packets": 0, "ack_timeouts": 0,
                      "rnr_retries": 0, "duplicates_discarded": 0, "psn_seq_naks_sent": 0,
                      "read_rerequests": 0, "duplicate_reads_answered": 0,
                      "duplicate_reads_dropped": 0, "duplicate_runs_discarded": 0,
                      "out_of_window_discarded": 0, "psn_seq_naks_ignored": 0,
                      "datagrams_dropped": 0}
        self.trace: Callable | None = None
        # The wire plane's RNR fault rule sets it; UC and UD have no RNR NAK.
        self.refuse_rnr = 0
        # (WR, signaled, inline bytes, the status of a WR taken only to fail, or None)
        self._sq: deque[tuple[SendWR, bool, bytes | None, WcStatus | None]] = deque()
        self._rq: deque[RecvWR] = deque()
        self._init_completions()

    # -- state machine ---------------------------------------------------------------
    def modify(self, attr: dict, attr_mask: int) -> None:
        """ibv_modify_qp with this type's table; checked whole before anything changes."""
        nxt, values = qp_state.check(S(self.state), attr, attr_mask, self.TRANSITIONS,
                                     KEPT_IF_ABSENT, self.TYPE)
        for bit, value in values.items():
            if bit in _SETTERS:
                setattr(self, _SETTERS[bit], value)
        self._apply(values)
        if nxt == S.ERR:
            self.enter_err()
        elif nxt == S.RESET:
            self._reset()
        else:
            self.state = nxt

    def _apply(self, values: dict) -> None:
        """A subclass's own attributes (UC's path MTU)."""

    def modify_to_err(self) -> None:
        self.modify({"qp_state": S.ERR}, M.STATE)

    def enter_err(self) -> None:
        """Every posted WR completes WR_FLUSH_ERR (docs/semantics.md section 9)."""
        self.state = S.ERR
        while self._sq:
            wr, *_ = self._sq.popleft()
            self._complete_send(wr, WcStatus.WR_FLUSH_ERR, True)
        while self._rq:
            self.complete_recv(self._rq.popleft().wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)

    def _reset(self) -> None:
        self.state = S.RESET
        self.dest_qp = self.next_psn = self.epsn = 0
        self._sq.clear()
        self._rq.clear()
        self._clear_completions()

    def take_events(self) -> list:
        out, self.events = self.events, []
        return out

    def trace_for(self, **ctx):
        if self.trace is None:
            return None
        trace, ctx = self.trace, {"qp": self.qp_num, **ctx}
        return lambda ev: trace(ctx, ev)

    # -- verbs -----------------------------------------------------------------------
    def post_send(self, wr: SendWR, now: float = 0.0) -> None:
        self.prepare_send(wr, now, 0)()

    def prepare_send(self, wr: SendWR, now: float = 0.0, ahead: int = 0) -> Callable[[], None]:
        """RCQP.prepare_send's rule for this QP: the checks of a post of ``wr`` with
        ``ahead`` WRs of the same posting before it, posting nothing; the call returned
        posts it (a WR on a QP in ERR completes WR_FLUSH_ERR then)."""
        if wr.opcode not in self.OPCODES:
            raise einval(f"{WrOpcode(wr.opcode).name} is not a WR opcode of {self.TYPE} QP")
        if wr.opcode in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM) \
                and wr.imm_data is None:
            raise einval(f"{WrOpcode(wr.opcode).name} needs imm_data")
        self.check_wr(wr)
        signaled = self.sq_sig_all or bool(wr.send_flags & SendFlags.SIGNALED)
        if not qp_state.require("ibv_post_send", self.state):
            return partial(self._complete_send, wr, WcStatus.WR_FLUSH_ERR, signaled)
        if len(self._sq) + ahead >= self.sq_depth:
            raise RDMAError("ENOMEM", f"send queue full ({self.sq_depth} WRs outstanding)"
                            if not ahead else
                            f"the send queue holds {self.sq_depth} WRs, {len(self._sq)} "
                            f"outstanding and {ahead} of this posting before this one")
        inline = (self._gather_inline(wr.sg, wr.inline) if wr.send_flags & SendFlags.INLINE
                  else None)
        return partial(self._sq.append, (wr, signaled, inline, None))

    def post_failed(self, wr: SendWR, status: WcStatus) -> None:
        """RCQP.post_failed's rule: the WRs before ``wr`` go, it completes ``status`` and
        the QP goes to ERR; in ERR it flushes."""
        if self.state == S.ERR:
            self._complete_send(wr, WcStatus.WR_FLUSH_ERR, True)
        elif self.state in qp_state.SENDING:
            self._sq.append((wr, True, None, status))
        else:
            self._complete_send(wr, status, True)

    def sq_outstanding(self) -> int:
        return len(self._sq)

    def rq_outstanding(self) -> int:
        return len(self._rq)

    def check_wr(self, wr: SendWR) -> None:
        """A subclass's own checks of a WR at post (UD's address handle)."""

    def post_local(self, *args, **kwargs) -> None:
        raise eopnotsupp(f"the MKEY configure WR on {self.TYPE} QP is not modelled")

    def cancel_posted_send_wrs(self, wr_id: int) -> int:
        raise eopnotsupp(f"mlx5dv_qp_cancel_posted_send_wrs on {self.TYPE} QP is not "
                         "modelled (its send queue has no SQD state here)")

    def invalidate(self, key, remote: bool) -> bool:
        return False

    def post_recv(self, wr: RecvWR) -> None:
        if not qp_state.require("ibv_post_recv", self.state):
            self.complete_recv(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV)
            return
        if len(self._rq) >= self.rq_depth:
            raise RDMAError("ENOMEM", f"receive queue full ({self.rq_depth} WRs posted)")
        self._rq.append(wr)

    def _gather_inline(self, sges: list[SGE], copied: bytes | None = None) -> bytes:
        """IBV_SEND_INLINE: copied at post, through an MR of the PD (engine/rc.py's rule),
        or by the poster already (``copied``, a send ring's WQE)."""
        total = sum(s.length for s in sges) if copied is None else len(copied)
        if total > self.max_inline_data:
            raise einval(f"inline data exceeds max_inline_data {self.max_inline_data}")
        if copied is not None:
            return copied
        parts = []
        for s in sges:
            mr = self.pd.hca.keys.get(s.lkey)
            if not isinstance(mr, MR) or mr.pd is not self.pd or s.addr < mr.addr \
                    or s.addr + s.length > mr.addr + mr.length:
                raise einval(f"inline SGE [{s.addr:#x}, +{s.length}) with lkey {s.lkey:#x} "
                             "is not memory of an MR of this PD")
            parts.append(mr.buf[s.addr - mr.addr:s.addr - mr.addr + s.length].tobytes())
        return b"".join(parts)

    # -- completions -----------------------------------------------------------------
    def _complete_send(self, wr: SendWR, status: WcStatus, signaled: bool) -> None:
        if signaled or status != WcStatus.SUCCESS:
            self._scq.append(WC(wr.wr_id, status, self.OPCODES.get(wr.opcode, WcOpcode.SEND),
                                0, self.qp_num))

    def complete_recv(self, wr_id: int, status: WcStatus, opcode: WcOpcode, byte_len: int = 0,
                      imm_data: int | None = None, wc_flags: int = 0, src_qp: int = 0) -> None:
        self._rcq.append(WC(wr_id, status, opcode, byte_len, self.qp_num, imm_data, wc_flags,
                            src_qp=src_qp))

    def next_deadline(self) -> float | None:
        return None     # no timers: nothing is retransmitted

    # -- packets ---------------------------------------------------------------------
    def poll_wire(self, now: float, runs: bool = True) -> list:
        """Every queued WR, gathered and sent now; each completes as it goes."""
        out: list = []
        while self._sq and self.state == S.RTS:
            wr, signaled, inline, failed = self._sq.popleft()
            if failed is not None:
                self._complete_send(wr, failed, True)
                self.enter_err()
                break
            try:
                data = inline if inline is not None else self._gather(wr)
            except TransferError as err:
                self._complete_send(wr, err.status(remote=False), signaled)
                self.enter_err()
                break
            self.emit(wr, data, out)
            self._complete_send(wr, WcStatus.SUCCESS, signaled)
        return out

    def _gather(self, wr: SendWR) -> bytes:
        t = self.trace_for(role="requester", wr_id=wr.wr_id, op=WrOpcode(wr.opcode).name)
        return b"".join(transfer.tx(self.pd, s.lkey, s.addr, s.length, trace=t)
                        for s in wr.sg)

    def take_psns(self, n: int) -> int:
        """The first of ``n`` PSNs of the next message."""
        psn = self.next_psn
        self.next_psn = (psn + n) % PSN_MOD
        return psn

    def emit(self, wr: SendWR, data: bytes, out: list) -> None:
        raise NotImplementedError

    def receive(self, run: Run, now: float) -> None:
        """A packet arrives (always a run of one for these transports)."""
        if run.dest_qp != self.qp_num or self.state not in qp_state.RECEIVING:
            return      # a QP not in RTR/RTS silently drops what arrives
        for i in range(run.n):
            self.take(run.packet(i))

    def take(self, p: Packet) -> None:
        raise NotImplementedError

    def drop(self) -> None:
        self.stats["datagrams_dropped"] += 1

    def deliver(self, data: bytes, opcode: WcOpcode, byte_len: int, imm: int | None = None,
                flags: int = 0, src_qp: int = 0, psn: int | None = None) -> None:
        """A message for the head receive: its bytes over the receive's SGEs and its
        completion. A receive too small drops the message and stays posted (rxe_resp.c
        class D); one whose key cannot take the bytes completes IBV_WC_LOC_QP_OP_ERR and
        the QP goes to ERR (class A, RESPST_ERR_MALFORMED_WQE)."""
        wr = self._rq[0]
        if len(data) > sum(s.length for s in wr.sg):
            self.drop()
            return
        t = self.trace_for(role="responder", op=opcode.name, psn=psn)
        off = 0
        try:
            for s in wr.sg:
                chunk = data[off:off + s.length]
                if chunk:
                    transfer.rx(self.pd, s.lkey, s.addr, chunk, trace=t)
                off += len(chunk)
        except TransferError:
            self._rq.popleft()
            self.complete_recv(wr.wr_id, WcStatus.LOC_QP_OP_ERR, opcode)
            self.enter_err()
            return
        self._rq.popleft()
        self.complete_recv(wr.wr_id, WcStatus.SUCCESS, opcode, byte_len, imm, flags, src_qp)
