"""The RC QP as a sans-I/O state machine: work requests and packets in, packets and
completions out. No sockets, no clock: the caller passes ``now`` (seconds) and moves
the packets; ``next_deadline()`` says when the timers want ``poll_packets`` again.

One RCQP is both a requester (its send queue) and a responder (its receive queue),
as an IBTA RC QP is. Completions go to two CQs, as with ibv_create_qp's send_cq and
recv_cq: ``poll_send_cq()`` and ``poll_recv_cq()``; ``poll_cq()`` returns both
(send completions first).

Modelled:

- ibv_modify_qp as ``modify(attr, attr_mask)``, by the transition table of
  engine/qp_state.py: RESET, INIT, RTR, RTS, SQD and ERR, the attributes each
  transition requires and allows, timeout and min_rnr_timer as IBTA codes. An illegal
  transition, attribute or value raises EINVAL and changes nothing. In SQD the
  requester finishes the messages it has started and starts no new WR (local ones
  included) until SQD -> RTS; with en_sqd_async_notify, IBV_EVENT_SQ_DRAINED is raised
  (``take_events``) once nothing it started is outstanding. RESET empties both queues
  without completions. ERR
  flushes every outstanding WR with WR_FLUSH_ERR, and a WR posted in ERR completes at
  once with WR_FLUSH_ERR.
- SEND, SEND_WITH_IMM, SEND_WITH_INV, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ,
  segmented to the path MTU with the IBTA BTH opcodes; 24-bit PSNs modulo 2^24; a READ of
  n response packets takes n PSNs of the requester's sequence, as in the IBTA RC transport.
- ATOMIC_CMP_AND_SWP and ATOMIC_FETCH_AND_ADD: one request packet and one PSN; the
  responder checks REMOTE_ATOMIC, 8-byte alignment and that the key is an MR or a plain
  MKEY, applies the 64-bit little-endian operation and answers ATOMIC_ACKNOWLEDGE with
  the original value, which the requester scatters into its one 8-byte SGE. A duplicate
  atomic request is answered from the last ``ATOMIC_RESULTS`` results, never executed
  again. READs and atomics are completed only by their own responses, in order, and
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
  transmits it and keeps those bytes for retransmission; a READ's responses are
  reassembled and scattered (one transfer.rx per SGE) when the last one arrives.
- A window of ``WINDOW`` unacknowledged packets; cumulative ACKs, implicit
  acknowledgement of earlier requests by READ responses, atomic ACKs and NAKs.
- Go-back-N from the oldest unacknowledged PSN on timeout, on NAK(PSN sequence error),
  and after an RNR NAK's rnr_timer; retry_cnt and rnr_retry (7 = forever) exhaustion
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
- Alternate paths and path migration (EOPNOTSUPP), the responder's max_dest_rd_atomic
  (kept, but its atomic result cache is a fixed ``ATOMIC_RESULTS``; a duplicate atomic
  older than that is dropped, as IBTA allows for a request outside the responder's
  resources), qp_access_flags (kept and reported, not checked: a memory key's access
  decides), the responder's RNR timer value carried in the NAK (the requester waits
  its own min_rnr_timer), and MSN checking by the requester.
- Packet integrity is the daemon's: it checks each packet's ICRC stand-in
  (protocol/packets.py ``packet_check``) and drops a bad one before it reaches the QP.
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

from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..protocol.attrs import SGE
from ..protocol.enums import (
    EventType,
    MkeyInitAttrFlags,
    Mtu,
    QpAttrMask,
    QpState,
    SendFlags,
    WcFlags,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from ..protocol.errors import RDMAError, einval, eopnotsupp
from ..protocol.opcodes import FLAGS, Op, opcode_for, with_any, with_flags
from ..protocol.packets import Packet
from ..protocol.records import WC, RecvWR, SendWR
from . import qp_state, transfer
from .completion import Fault, TransferError
from .hca import MR, PD
from .mkey import MKey

PSN_MOD = 1 << 24
_HALF = 1 << 23

# Unacknowledged packets the requester may have on the wire.
WINDOW = 64
# The responder ACKs at least this often within a long message.
ACK_EVERY = 16
# ibv_modify_qp(3): rnr_retry 7 means retry forever.
RNR_RETRY_FOREVER = 7

# Atomic results the responder keeps for answering duplicate atomic requests (IBTA:
# a duplicate atomic is answered from the saved result, never executed again); as many
# as the default max_rd_atomic, so a requester within that limit always finds its own.
ATOMIC_RESULTS = 16
_U64 = 1 << 64

ACK = "ACKNOWLEDGE"
ATOMIC_ACK = "ATOMIC_ACKNOWLEDGE"
READ_REQUEST = "RDMA_READ_REQUEST"
# By the IBTA opcode table (protocol/opcodes.py): what goes to the requester, and what
# the responder dispatches on.
_RESPONSES = with_any(Op.RESPONSE)
_READ_RESPONSES = with_flags(Op.READ_RESPONSE)
_SEND_PACKETS = with_flags(Op.SEND)
_WRITE_PACKETS = with_flags(Op.WRITE)
_ATOMIC_REQUESTS = with_flags(Op.ATOMIC)

SUPPORTED = (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.SEND_WITH_INV,
             WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM, WrOpcode.RDMA_READ,
             WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD, WrOpcode.LOCAL_INV)
WITH_IMM = (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
SENDS = (WrOpcode.SEND, WrOpcode.SEND_WITH_IMM, WrOpcode.SEND_WITH_INV)
ATOMICS = {WrOpcode.ATOMIC_CMP_AND_SWP: "COMPARE_SWAP", WrOpcode.ATOMIC_FETCH_AND_ADD: "FETCH_ADD"}
# Requests answered by responses of their own, which alone complete them; what
# max_rd_atomic counts (ibv_modify_qp(3)).
RESPONDED = (WrOpcode.RDMA_READ, *ATOMICS)
# ibv_post_send(3): IBV_SEND_INLINE is "valid only for Send and RDMA Write".
INLINE_OK = (*SENDS, WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)

_WC_OPCODE = {
    WrOpcode.SEND: WcOpcode.SEND, WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
    WrOpcode.SEND_WITH_INV: WcOpcode.SEND,
    WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE,
    WrOpcode.RDMA_READ: WcOpcode.RDMA_READ,
    WrOpcode.ATOMIC_CMP_AND_SWP: WcOpcode.COMP_SWAP,
    WrOpcode.ATOMIC_FETCH_AND_ADD: WcOpcode.FETCH_ADD,
    WrOpcode.LOCAL_INV: WcOpcode.LOCAL_INV,
}

# A LOCAL_INV whose key cannot be invalidated (unknown, an MR, another PD's): the
# verbs pages name no status; Linux rxe (rxe_req.c, rxe_do_local_ops) completes it
# IB_WC_LOC_QP_OP_ERR, and so do we. A choice, kept here to change in one place.
LOCAL_INV_FAILED = WcStatus.LOC_QP_OP_ERR
# A SEND_WITH_INV whose IETH key the responder may not invalidate: IBTA responder error
# class J, as rxe_resp.c implements it (RESPST_ERR_INVALIDATE_RKEY): the receive
# completes IB_WC_REM_INV_REQ_ERR and the QP goes to ERR; the requester gets NAK
# Invalid Request, REM_INV_REQ_ERR.
REMOTE_INV_FAILED = WcStatus.REM_INV_REQ_ERR

# The responder's NAK for a fault on its own key (docs/semantics.md section 9): the
# requester turns it back into TransferError.status(remote=True).
_FAULT_NAK = {Fault.ACCESS: "NAK_REM_ACCESS", Fault.LENGTH: "NAK_INV_REQ",
              Fault.CRYPTO: "NAK_REM_OP"}
_NAK_STATUS = {"NAK_REM_ACCESS": WcStatus.REM_ACCESS_ERR,
               "NAK_INV_REQ": WcStatus.REM_INV_REQ_ERR,
               "NAK_REM_OP": WcStatus.REM_OP_ERR}


# The attributes RCQP.modify applies (the others it checks and refuses or ignores: AV is
# the daemon's, P_Key index and port have one value each).
_APPLIED = (QpAttrMask.STATE | QpAttrMask.CUR_STATE | QpAttrMask.PATH_MTU
            | QpAttrMask.DEST_QPN | QpAttrMask.RQ_PSN | QpAttrMask.SQ_PSN
            | QpAttrMask.TIMEOUT | QpAttrMask.RETRY_CNT | QpAttrMask.RNR_RETRY
            | QpAttrMask.MIN_RNR_TIMER | QpAttrMask.MAX_QP_RD_ATOMIC
            | QpAttrMask.MAX_DEST_RD_ATOMIC | QpAttrMask.ACCESS_FLAGS
            | QpAttrMask.PKEY_INDEX | QpAttrMask.PORT)


def _uint(bits: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << bits


def _is_mtu(v) -> bool:
    try:
        Mtu(v)
    except ValueError:
        return False
    return True


# Each attribute's value rule (ibv_modify_qp(3); IBTA field widths) and its words.
_CHECKS = {
    QpAttrMask.PATH_MTU: _is_mtu, QpAttrMask.DEST_QPN: _uint(24),
    QpAttrMask.RQ_PSN: _uint(24), QpAttrMask.SQ_PSN: _uint(24),
    QpAttrMask.TIMEOUT: _uint(5), QpAttrMask.MIN_RNR_TIMER: _uint(5),
    QpAttrMask.RETRY_CNT: _uint(3), QpAttrMask.RNR_RETRY: _uint(3),
    # Zero would let no READ or atomic ever go: the WR would wait forever.
    QpAttrMask.MAX_QP_RD_ATOMIC: lambda v: _uint(8)(v) and v >= 1,
    QpAttrMask.MAX_DEST_RD_ATOMIC: _uint(8), QpAttrMask.ACCESS_FLAGS: _uint(32),
    # One port, one P_Key.
    QpAttrMask.PKEY_INDEX: lambda v: v == 0, QpAttrMask.PORT: lambda v: v == 1,
    QpAttrMask.EN_SQD_ASYNC_NOTIFY: _uint(1),
}
_RULES = {
    QpAttrMask.PATH_MTU: "is not an enum ibv_mtu value", QpAttrMask.DEST_QPN: "is not a QP number",
    QpAttrMask.RQ_PSN: "is not a 24-bit PSN", QpAttrMask.SQ_PSN: "is not a 24-bit PSN",
    QpAttrMask.TIMEOUT: "is not a 5-bit code", QpAttrMask.MIN_RNR_TIMER: "is not a 5-bit code",
    QpAttrMask.RETRY_CNT: "must be 0..7", QpAttrMask.RNR_RETRY: "must be 0..7",
    QpAttrMask.MAX_QP_RD_ATOMIC: "must be 1..255", QpAttrMask.MAX_DEST_RD_ATOMIC: "must be 0..255",
    QpAttrMask.ACCESS_FLAGS: "is not an access flags word",
    QpAttrMask.PKEY_INDEX: "must be 0 (one P_Key)", QpAttrMask.PORT: "must be 1 (one port)",
    QpAttrMask.EN_SQD_ASYNC_NOTIFY: "must be 0 or 1",
}


# Where RCQP.modify keeps each attribute, in the model's units (IBTA codes to seconds).
_SETTERS = {
    QpAttrMask.PATH_MTU: ("mtu", lambda v: Mtu(v).nbytes),
    QpAttrMask.DEST_QPN: ("dest_qp", None),
    QpAttrMask.RQ_PSN: ("_epsn", None),
    QpAttrMask.SQ_PSN: ("_next_psn", None),
    QpAttrMask.TIMEOUT: ("timeout_s", qp_state.ack_timeout_s),
    QpAttrMask.RETRY_CNT: ("retry_cnt", None),
    QpAttrMask.RNR_RETRY: ("rnr_retry", None),
    QpAttrMask.MIN_RNR_TIMER: ("rnr_timer_s", qp_state.rnr_timer_s),
    QpAttrMask.MAX_QP_RD_ATOMIC: ("max_rd_atomic", None),
    QpAttrMask.MAX_DEST_RD_ATOMIC: ("max_dest_rd_atomic", None),
    QpAttrMask.ACCESS_FLAGS: ("qp_access_flags", None),
}

# The states in which the requester works (SQD: it finishes what it started), and in
# which packets are accepted at all.
_SENDING = (QpState.RTS, QpState.SQD)
_RECEIVING = (QpState.RTR, QpState.RTS, QpState.SQD)


def psn_add(psn: int, n: int) -> int:
    return (psn + n) % PSN_MOD


def psn_diff(a: int, b: int) -> int:
    """a - b in the 24-bit PSN space, as a signed number in [-2^23, 2^23)."""
    return (a - b + _HALF) % PSN_MOD - _HALF


@dataclass(eq=False)
class _Request:
    """A posted send WR as the requester tracks it."""

    wr: SendWR
    signaled: bool
    length: int
    wc_opcode: WcOpcode
    built: bool = False
    psn: int = 0
    npsn: int = 0
    pkts: list[Packet] | None = None
    # PSNs of this WR acknowledged (READ: response packets received, in order).
    acked: int = 0
    # Packets of this WR transmitted since the last go-back (READ: 1 once the request went).
    sent: int = 0
    # The most packets of this WR ever transmitted: below it, a transmission is a resend.
    high: int = 0
    # READ: the response count it was last re-requested from on a gap (-1: never).
    rerequested: int = -1
    # A local error found while gathering: completed when the WR reaches the head.
    error: WcStatus | None = None
    read_buf: bytearray = field(default_factory=bytearray)
    # IBV_SEND_INLINE: the payload copied at post time.
    inline: bytes | None = None
    # A local WR: sends nothing, runs ``action`` (or its LOCAL_INV) at the SQ head.
    local: bool = False
    action: Callable[[], None] | None = None
    # mlx5dv_qp_cancel_posted_send_wrs(3): replaced by a NOP (local, no effect).
    canceled: bool = False

    @property
    def barrier(self) -> bool:
        """A local WR with an effect, which later WRs must see before they are built."""
        return self.local and (self.action is not None
                               or self.wr.opcode == WrOpcode.LOCAL_INV)


@dataclass(eq=False)
class _Inbound:
    """The message the responder is reassembling."""

    kind: str                 # "SEND" or "RDMA_WRITE"
    recv: RecvWR | None
    reth: tuple | None
    buf: bytearray = field(default_factory=bytearray)


def _chunks(data: bytes, mtu: int) -> list[bytes]:
    return [data[i:i + mtu] for i in range(0, len(data), mtu)] or [b""]


def _scatter(pd: PD, sges: list[SGE], data: bytes, trace=None,
             sig_errors: list | None = None) -> None:
    """docs/semantics.md section 5: the arriving bytes over the SGEs in order, one transfer each."""
    off = 0
    for s in sges:
        if off >= len(data):
            break
        chunk = data[off:off + s.length]
        transfer.rx(pd, s.lkey, s.addr, chunk, trace=trace, sig_errors=sig_errors)
        off += len(chunk)


class RCQP:
    """An RC QP of ``pd``: post WRs, exchange packets, poll completions."""

    def __init__(self, pd: PD, qp_num: int, sq_depth: int = 128, rq_depth: int = 128,
                 sq_sig_all: bool = False, max_inline_data: int = 256,
                 max_rd_atomic: int = 16, sig_pipelining: bool = False) -> None:
        if max_inline_data < 0:
            raise einval(f"max_inline_data {max_inline_data} must not be negative")
        # Zero would let no READ or atomic ever go: the WR would wait forever.
        if max_rd_atomic < 1:
            raise einval(f"max_rd_atomic {max_rd_atomic} must be at least 1")
        self.pd = pd
        self.qp_num = qp_num
        self.sq_depth = sq_depth
        self.rq_depth = rq_depth
        self.sq_sig_all = sq_sig_all
        self.max_inline_data = max_inline_data
        self.max_rd_atomic = max_rd_atomic
        self.state = QpState.RESET
        # mlx5dv_create_qp(3) MLX5DV_QP_CREATE_SIG_PIPELINING: a signature error stops
        # the send queue in SQD before the next WR with IBV_SEND_FENCE.
        self.sig_pipelining = sig_pipelining
        self._sig_stop = False
        # SQD: whether IBV_EVENT_SQ_DRAINED is owed (en_sqd_async_notify, or a pipelining
        # stop) and whether it was raised.
        self._sqd_notify = False
        self._drained_raised = False
        # Asynchronous events (enum ibv_event_type) for the QP's context, oldest first.
        self.events: list[EventType] = []
        self.dest_qp = 0
        self.mtu = Mtu.MTU_1024.nbytes
        self.timeout_s = qp_state.ack_timeout_s(qp_state.DEFAULT_TIMEOUT)
        self.retry_cnt = 7
        self.rnr_retry = 7
        self.rnr_timer_s = qp_state.rnr_timer_s(qp_state.DEFAULT_MIN_RNR_TIMER)
        self.max_dest_rd_atomic = max_rd_atomic
        self.qp_access_flags = 0
        self._sq: deque[_Request] = deque()
        self._rq: deque[RecvWR] = deque()
        self._scq: list[WC] = []
        self._rcq: list[WC] = []
        # requester
        self._next_psn = 0
        self._timer: float | None = None
        self._rnr_until: float | None = None
        self._retries = 0
        self._rnr_count = 0
        # responder
        self._epsn = 0
        self._msn = 0
        self._msg: _Inbound | None = None
        self._nak_pending = False
        self._unacked = 0
        self._resp_out: list[Packet] = []
        # What a link-level observer counts (the daemon sums them per daemon): go-back-N
        # retransmissions (after an ACK timeout or a sequence-error NAK) and the packets
        # they sent again, ACK timeouts, RNR NAKs acted on, duplicate requests
        # the responder answered without applying, sequence-error NAKs sent.
        self.stats = {"retransmissions": 0, "retransmitted_packets": 0, "ack_timeouts": 0, "rnr_retries": 0,
                      "duplicates_discarded": 0, "psn_seq_naks_sent": 0, "read_rerequests": 0}
        # Receives the responder refuses with an RNR NAK before looking at its receive
        # queue (fault injection: "answer the next N messages with RNR").
        self.refuse_rnr = 0
        # A subscriber to the pipeline's trace: called with (context, TraceEvent), the
        # context naming the QP, the WR or PSN and the operation. None: no trace work.
        self.trace: Callable[[dict, transfer.TraceEvent], None] | None = None
        # PSN -> (original value, MSN) of the atomics executed most recently.
        self._atomic_results: OrderedDict[int, tuple[int, int]] = OrderedDict()

    def _t(self, **ctx):
        if self.trace is None:
            return None
        trace, ctx = self.trace, {"qp": self.qp_num, **ctx}
        return lambda ev: trace(ctx, ev)

    # -- state machine -------------------------------------------------------
    def _require(self, verb: str, *states: QpState) -> None:
        if self.state not in states:
            raise einval(f"{verb} needs the QP in {'/'.join(s.name for s in states)}, "
                         f"it is in {QpState(self.state).name}")

    def modify(self, attr: dict, attr_mask: int) -> None:
        """ibv_modify_qp: apply the fields of ``attr`` (struct ibv_qp_attr field names,
        IBTA codes for timeout and min_rnr_timer) that ``attr_mask`` names, and move to
        ``attr["qp_state"]`` if it names IBV_QP_STATE, by the transition table of
        engine/qp_state.py. ibv_modify_qp(3): "If any of the modify attributes or the
        modify mask are invalid, none of the attributes will be modified (including the
        QP state)": everything is checked before anything changes."""
        mask = QpAttrMask(attr_mask)
        cur = QpState(self.state)
        values = {bit: attr[name] for bit, name in qp_state.FIELDS.items()
                  if mask & bit and name in attr}
        lacking = [qp_state.FIELDS[bit] for bit in _APPLIED if mask & bit and bit not in values]
        if lacking:
            raise einval(f"ibv_modify_qp: attr_mask names {', '.join(lacking)} but attr has "
                         "no value for it")
        if mask & QpAttrMask.CUR_STATE and values[QpAttrMask.CUR_STATE] != cur:
            raise einval(f"ibv_modify_qp: cur_qp_state {values[QpAttrMask.CUR_STATE]} is not "
                         f"the QP's state {cur.name}")
        try:
            nxt = QpState(values[QpAttrMask.STATE]) if mask & QpAttrMask.STATE else cur
        except ValueError:
            raise einval(f"ibv_modify_qp: qp_state {values[QpAttrMask.STATE]!r} is not an "
                         "enum ibv_qp_state value") from None
        step = f"ibv_modify_qp {cur.name} -> {nxt.name}"
        t = qp_state.TRANSITIONS.get((cur, nxt))
        if t is None:
            raise einval(f"{step} is not a transition of an RC QP (ibv_modify_qp(3))")
        given = mask & ~QpAttrMask.STATE
        missing = t.required & ~given & ~qp_state.KEPT_IF_ABSENT
        if missing:
            raise einval(f"{step} needs {qp_state.names(missing)}")
        extra = given & ~(t.required | t.optional)
        if extra:
            raise einval(f"{step} does not take {qp_state.names(extra)}")
        if given & qp_state.NOT_MODELLED:
            raise eopnotsupp(f"{step}: {qp_state.names(given & qp_state.NOT_MODELLED)} "
                             "not modelled")
        for bit, value in values.items():
            check = _CHECKS.get(bit)
            if check is not None and not check(value):
                raise einval(f"{step}: {qp_state.FIELDS[bit]} {value!r} {_RULES[bit]}")
        self._apply(values)
        if nxt == QpState.ERR:
            self._enter_err()
        elif nxt == QpState.RESET:
            self._reset()
        else:
            if nxt == QpState.SQD and cur != QpState.SQD:
                self._enter_sqd(bool(values.get(QpAttrMask.EN_SQD_ASYNC_NOTIFY, 0)))
            elif cur == QpState.SQD and nxt == QpState.RTS:
                # mlx5dv_qp_cancel_posted_send_wrs(3) step 4: back to RTS, the send
                # queue resumes (canceled WRs complete as NOPs).
                self._sig_stop = False
            self.state = nxt

    def _enter_sqd(self, notify: bool) -> None:
        """The send queue drains: started WRs finish, none starts; IBV_EVENT_SQ_DRAINED
        is raised once nothing started is outstanding, if ``notify``."""
        self.state = QpState.SQD
        self._sqd_notify = notify
        self._drained_raised = False

    def _raise_drained(self) -> None:
        if (self.state == QpState.SQD and self._sqd_notify and not self._drained_raised
                and not any(r.built and not r.local for r in self._sq)):
            self._drained_raised = True
            self.events.append(EventType.SQ_DRAINED)

    def take_events(self) -> list[EventType]:
        out, self.events = self.events, []
        return out

    def cancel_posted_send_wrs(self, wr_id: int) -> int:
        """mlx5dv_qp_cancel_posted_send_wrs(3): in SQD, every WR with ``wr_id`` that has
        not started becomes a NOP that completes as it was signaled, with its own opcode
        (or is flushed if the QP goes to ERR); the number canceled. libmlx5 counts a WR
        canceled twice twice, and so does this."""
        if self.state != QpState.SQD:
            raise einval(f"mlx5dv_qp_cancel_posted_send_wrs needs the QP in SQD, it is in "
                         f"{QpState(self.state).name}")
        # Not started: never built, or a local WR (those run, and leave, at the head).
        pending = [r for r in self._sq if r.wr.wr_id == wr_id and (not r.built or r.local)]
        if any(r.local and not r.canceled for r in pending):
            # An MKEY configure or LOCAL_INV here takes effect at post, not at execution:
            # replacing it with a NOP cannot undo it.
            raise eopnotsupp(f"wr_id {wr_id} names a pending local WR (MKEY configure or "
                             "LOCAL_INV); canceling one is not modelled")
        for r in pending:
            r.canceled = r.local = r.built = True
        return len(pending)

    def _apply(self, values: dict) -> None:
        for bit, value in values.items():
            setter = _SETTERS.get(bit)
            if setter is not None:
                name, convert = setter
                setattr(self, name, value if convert is None else convert(value))

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
        self._sq.clear()
        self._rq.clear()
        self._scq.clear()
        self._rcq.clear()
        self._resp_out.clear()
        self._atomic_results.clear()
        self.dest_qp = self._next_psn = self._epsn = self._msn = 0
        self._timer = self._rnr_until = None
        self._retries = self._rnr_count = self._unacked = 0
        self._msg = None
        self._nak_pending = False
        self._sig_stop = self._sqd_notify = self._drained_raised = False

    def _enter_err(self) -> None:
        """Every outstanding WR completes WR_FLUSH_ERR (docs/semantics.md section 9)."""
        self.state = QpState.ERR
        self._timer = self._rnr_until = None
        self._msg = None
        while self._sq:
            self._complete(self._sq.popleft(), WcStatus.WR_FLUSH_ERR)
        while self._rq:
            self._rcq.append(WC(self._rq.popleft().wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV,
                                0, self.qp_num))

    # -- verbs ---------------------------------------------------------------
    def post_send(self, wr: SendWR, now: float) -> None:
        if wr.opcode not in SUPPORTED:
            raise eopnotsupp(f"{WrOpcode(wr.opcode).name} is not modelled on this RC QP")
        name = WrOpcode(wr.opcode).name
        if wr.opcode in WITH_IMM and wr.imm_data is None:
            raise einval(f"{name} needs imm_data")
        if wr.opcode in ATOMICS:
            # IBTA atomics operate on one 64-bit value: the original comes back into
            # one 8-byte buffer.
            if len(wr.sg) != 1 or wr.sg[0].length != 8:
                raise einval(f"{name} needs exactly one SGE of 8 bytes")
            if not (0 <= wr.compare_add < _U64 and 0 <= wr.swap < _U64):
                raise einval(f"{name} compare_add and swap are 64-bit unsigned values")
        if wr.opcode in (WrOpcode.SEND_WITH_INV, WrOpcode.LOCAL_INV) \
                and not 0 <= wr.invalidate_rkey < 1 << 32:
            raise einval(f"{name} invalidate_rkey {wr.invalidate_rkey:#x} is not a 32-bit key")
        inline = None
        if wr.send_flags & SendFlags.INLINE and wr.opcode != WrOpcode.LOCAL_INV:
            if wr.opcode not in INLINE_OK:
                raise einval(f"IBV_SEND_INLINE is valid only for SEND and RDMA_WRITE, not {name}")
            inline = self._gather_inline(wr.sg)
        signaled = self.sq_sig_all or bool(wr.send_flags & SendFlags.SIGNALED)
        req = _Request(wr, signaled, sum(s.length for s in wr.sg), _WC_OPCODE[wr.opcode],
                       inline=inline)
        if wr.opcode == WrOpcode.LOCAL_INV:
            req.local = req.built = True
        self._enqueue(req)

    def post_local(self, wr_id: int, signaled: bool, opcode: WcOpcode,
                   action: Callable[[], None] | None = None, now: float = 0.0) -> None:
        """A WR that sends nothing: ``action`` (if any) runs when it reaches the head of
        the send queue, every earlier WR completed; it then completes SUCCESS with
        ``opcode`` (signaled or sq_sig_all), or, if the action raises TransferError,
        with that error's local status, and the QP goes to ERR. The MKEY configure
        (opcode DRIVER1) uses it for its in-order completion; its effect is applied at
        post time by the caller (docs/semantics.md section 4)."""
        req = _Request(SendWR(wr_id, WrOpcode.DRIVER1), self.sq_sig_all or bool(signaled), 0,
                       WcOpcode(opcode), built=True, local=True, action=action)
        self._enqueue(req)

    def _enqueue(self, req: _Request) -> None:
        if self.state == QpState.ERR:
            self._complete(req, WcStatus.WR_FLUSH_ERR)
            return
        self._require("ibv_post_send", QpState.RTS, QpState.SQD)
        if len(self._sq) >= self.sq_depth:
            raise RDMAError("ENOMEM", f"send queue full ({self.sq_depth} WRs outstanding)")
        self._sq.append(req)

    def _gather_inline(self, sges: list[SGE]) -> bytes:
        """IBV_SEND_INLINE: the bytes are copied now, so the buffer may be reused as soon
        as ibv_post_send returns (ibv_post_send(3)); "The L_Key will not be checked"."""
        total = sum(s.length for s in sges)
        # ibv_post_send(3) fails with EINVAL when the inline data exceeds the QP's
        # max_inline_data (ibv_create_qp(3) cap).
        if total > self.max_inline_data:
            raise einval(f"{total} bytes of inline data exceed max_inline_data "
                         f"{self.max_inline_data}")
        parts = []
        for s in sges:
            if s.length == 0:
                continue
            # Verbs reads inline data from the virtual address; here memory exists only
            # inside MRs, so the lkey is used to find it, but not checked for access or
            # validity. An address that no MR of this PD holds is unreadable memory.
            mr = self.pd.hca.keys.get(s.lkey)
            if not isinstance(mr, MR) or mr.pd is not self.pd or s.length < 0 \
                    or s.addr < mr.addr or s.addr + s.length > mr.addr + mr.length:
                raise einval(f"inline SGE [{s.addr:#x}, +{s.length}) with lkey {s.lkey:#x} "
                             "is not memory of an MR of this PD")
            start = s.addr - mr.addr
            parts.append(mr.buf[start:start + s.length].tobytes())
        return b"".join(parts)

    def post_recv(self, wr: RecvWR) -> None:
        if self.state == QpState.ERR:
            self._rcq.append(WC(wr.wr_id, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV, 0, self.qp_num))
            return
        self._require("ibv_post_recv", QpState.INIT, QpState.RTR, QpState.RTS, QpState.SQD)
        if len(self._rq) >= self.rq_depth:
            raise RDMAError("ENOMEM", f"receive queue full ({self.rq_depth} WRs posted)")
        self._rq.append(wr)

    def poll_send_cq(self) -> list[WC]:
        out, self._scq = self._scq, []
        return out

    def poll_recv_cq(self) -> list[WC]:
        out, self._rcq = self._rcq, []
        return out

    def poll_cq(self) -> list[WC]:
        return self.poll_send_cq() + self.poll_recv_cq()

    def next_deadline(self) -> float | None:
        """When a timer (retransmission or RNR wait) wants ``poll_packets``; packets owed
        because of a post or a receive, and local WRs that reached the head of the send
        queue, are dealt with as soon as ``poll_packets`` is called."""
        times = [t for t in (self._timer, self._rnr_until) if t is not None]
        return min(times) if times else None

    # -- packets out -----------------------------------------------------------
    def poll_packets(self, now: float) -> list[Packet]:
        # The responder's answers go out even from ERR: the NAK that caused it is owed.
        out, self._resp_out = self._resp_out, []
        if self.state in _SENDING:
            self._run_timers(now)
        if self.state in _SENDING and self._rnr_until is None:
            # Local WRs at the head run first, so that WRs behind them see their effect.
            self._retire_head()
            if self.state in _SENDING:
                self._transmit(out, now)
                self._retire_head()
        self._raise_drained()
        return out

    def _run_timers(self, now: float) -> None:
        if self._rnr_until is not None:
            if now >= self._rnr_until:
                self._rnr_until = None
                self._go_back()
            return
        if self._timer is not None and now >= self._timer:
            self._timer = None
            self._retries += 1
            self.stats["ack_timeouts"] += 1
            if self._retries > self.retry_cnt:
                self._fail_head(WcStatus.RETRY_EXC_ERR)
                return
            self.stats["retransmissions"] += 1
            self._go_back()

    def _inflight(self) -> int:
        n = 0
        for r in self._sq:
            if not r.built:
                break
            if r.wr.opcode in RESPONDED:
                n += (r.npsn - r.acked) if r.sent else 0
            else:
                n += r.sent - r.acked
        return n

    def _rd_atomic_outstanding(self) -> int:
        return sum(1 for r in self._sq if r.sent and not r.local and r.wr.opcode in RESPONDED)

    def _transmit(self, out: list[Packet], now: float) -> None:
        inflight = self._inflight()
        rd_atomic = self._rd_atomic_outstanding()
        sent_any = False
        for r in self._sq:
            if r.local:
                if r.barrier:
                    break       # not at the head yet: later WRs wait for its effect
                continue
            if not r.built:
                if inflight >= WINDOW or self.state != QpState.RTS:
                    break       # the window is full, or SQD: no new WR starts
                if self._sig_stop and r.wr.send_flags & SendFlags.FENCE:
                    # mlx5dv_qp_cancel_posted_send_wrs(3): a pipelining QP "will stop
                    # after a transfer operation that failed signature validation in
                    # SQD state", at the latest before the next fenced WR.
                    self._enter_sqd(notify=True)
                    break
                self._build(r)
            if r.error is not None:
                break
            if r.wr.opcode in RESPONDED:
                if not r.sent:
                    # ibv_modify_qp(3) max_rd_atomic: the READs and atomics the
                    # requester may have outstanding; the send queue waits in order.
                    if rd_atomic >= self.max_rd_atomic:
                        break
                    out.append(self._read_request(r) if r.wr.opcode == WrOpcode.RDMA_READ
                               else r.pkts[0])
                    if r.high:
                        self.stats["retransmitted_packets"] += 1
                    r.sent = r.high = 1
                    inflight += r.npsn - r.acked
                    rd_atomic += 1
                    sent_any = True
                continue
            while r.sent < r.npsn and inflight < WINDOW:
                out.append(r.pkts[r.sent])
                if r.sent < r.high:
                    self.stats["retransmitted_packets"] += 1
                r.sent += 1
                r.high = max(r.high, r.sent)
                inflight += 1
                sent_any = True
            if r.sent < r.npsn:
                break
        if sent_any and self._timer is None:
            self._timer = now + self.timeout_s

    def _build(self, r: _Request) -> None:
        wr = r.wr
        r.built = True
        r.psn = self._next_psn
        if wr.opcode == WrOpcode.RDMA_READ:
            r.npsn = max(1, -(-r.length // self.mtu))
        elif wr.opcode in ATOMICS:
            # AtomicETH: CMP_AND_SWP carries (swap, compare), FETCH_AND_ADD (add, -).
            cas = wr.opcode == WrOpcode.ATOMIC_CMP_AND_SWP
            ateth = (wr.rkey, wr.remote_addr, wr.swap if cas else wr.compare_add,
                     wr.compare_add if cas else 0)
            r.pkts = [Packet(self.dest_qp, r.psn, ATOMICS[wr.opcode], atomic=ateth)]
            r.npsn = 1
        else:
            if r.inline is not None:
                data = r.inline
            else:
                try:
                    t = self._t(role="requester", wr_id=wr.wr_id,
                                op=WrOpcode(wr.opcode).name)
                    errs: list | None = [] if self.sig_pipelining else None
                    data = b"".join(transfer.tx(self.pd, s.lkey, s.addr, s.length, trace=t,
                                                sig_errors=errs) for s in wr.sg)
                    if errs:
                        self._sig_stop = True
                except TransferError as err:
                    r.error = err.status(remote=False)
                    return
            r.pkts = self._segment(wr, data, r.psn)
            r.npsn = len(r.pkts)
        self._next_psn = psn_add(r.psn, r.npsn)

    def _segment(self, wr: SendWR, data: bytes, psn: int) -> list[Packet]:
        kind = Op.SEND if wr.opcode in SENDS else Op.WRITE
        imm = wr.opcode in WITH_IMM
        inv = wr.opcode == WrOpcode.SEND_WITH_INV
        chunks = _chunks(data, self.mtu)
        n = len(chunks)
        pkts = []
        for i, chunk in enumerate(chunks):
            name = opcode_for(kind, i == 0, i == n - 1, imm, inv)
            # Each header where the opcode carries it (IBTA 9.2): the RETH on an RDMA
            # WRITE's first packet, ImmDt and IETH on the last.
            flags = FLAGS[name]
            pkts.append(Packet(self.dest_qp, psn_add(psn, i), name, chunk,
                               (wr.rkey, wr.remote_addr, len(data)) if flags & Op.RETH
                               else None, None,
                               wr.imm_data if flags & Op.IMMDT else None,
                               wr.invalidate_rkey if flags & Op.IETH else None))
        return pkts

    def _read_request(self, r: _Request) -> Packet:
        # A retried READ asks only for what has not arrived, at that response's PSN
        # (IBTA RC read retry), so responses already scattered are not asked for again.
        done = r.acked * self.mtu
        return Packet(self.dest_qp, psn_add(r.psn, r.acked), READ_REQUEST,
                      reth=(r.wr.rkey, r.wr.remote_addr + done, r.length - done))

    def _go_back(self) -> None:
        for r in self._sq:
            if not r.built:
                break
            r.sent = 0 if r.wr.opcode in RESPONDED else r.acked

    # -- requester: completions ------------------------------------------------
    def _complete(self, r: _Request, status: WcStatus) -> None:
        # An error always produces a completion, even for an unsignaled WR.
        if status == WcStatus.SUCCESS and not r.signaled:
            return
        # ibv_poll_cq(3) defines byte_len for a successful completion only; an errored
        # one reports 0, as mlx5 leaves it (never the length the WR asked for).
        byte_len = (r.length if status == WcStatus.SUCCESS and r.wr.opcode in RESPONDED
                    and not r.local else 0)
        self._scq.append(WC(r.wr.wr_id, status, r.wc_opcode, byte_len, self.qp_num))

    def _fail_head(self, status: WcStatus) -> None:
        self._complete(self._sq.popleft(), status)
        self._enter_err()

    def _retire_head(self) -> None:
        """What waits only for every WR before it to complete: a gather error, completed
        in order, and local WRs, run in order."""
        while self.state in _SENDING and self._sq:
            r = self._sq[0]
            if r.error is not None:
                self._fail_head(r.error)
                return
            if not r.local or self.state != QpState.RTS:
                return      # SQD starts no WR, local ones included
            self._run_local()

    def _run_local(self) -> None:
        r = self._sq.popleft()
        status = WcStatus.SUCCESS
        if r.canceled:
            pass        # a NOP: completes as the WR was signaled, with its opcode
        elif r.wr.opcode == WrOpcode.LOCAL_INV:
            if not self._invalidate(r.wr.invalidate_rkey, remote=False):
                status = LOCAL_INV_FAILED
        elif r.action is not None:
            try:
                r.action()
            except TransferError as err:
                status = err.status(remote=False)
        self._complete(r, status)
        if status != WcStatus.SUCCESS:
            self._enter_err()

    def _invalidate(self, key: int | None, remote: bool) -> bool:
        """Invalidate MKEY ``key`` of this QP's PD; False when it may not be. Only MKEYs
        are invalidated here: an MR is registered, not fast-registered, and rxe, too,
        refuses to invalidate one (rxe_invalidate_mr: type != IB_MR_TYPE_MEM_REG).
        Remotely, mlx5dv_create_mkey(3) allows it only for an MKEY created with
        MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE. An already invalid MKEY stays so."""
        obj = self.pd.hca.keys.get(key) if key is not None else None
        if not isinstance(obj, MKey) or obj.pd is not self.pd:
            return False
        if remote and not obj.create_flags & MkeyInitAttrFlags.REMOTE_INVALIDATE:
            return False
        obj.invalidate()
        return True

    def _progress(self, now: float) -> None:
        self._retries = 0
        self._timer = now + self.timeout_s if any(r.sent for r in self._sq) else None

    def _ack(self, psn: int, now: float) -> bool:
        """Everything up to ``psn`` is acknowledged; True when that was news."""
        if psn_diff(psn, self._next_psn) >= 0:
            return False        # never sent: not an answer to us
        progress = False
        while self._sq and self.state in _SENDING:
            r = self._sq[0]
            if r.local:
                if self.state != QpState.RTS:
                    break       # SQD starts no WR, local ones included
                self._run_local()   # every WR before it has completed
                continue
            if not r.built or r.error is not None or psn_diff(psn, r.psn) < 0:
                break
            if r.wr.opcode in RESPONDED:
                break           # only its own response completes a READ or an atomic
            if psn_diff(psn, psn_add(r.psn, r.npsn - 1)) >= 0:
                self._sq.popleft()
                self._complete(r, WcStatus.SUCCESS)
                progress = True
                continue
            n = psn_diff(psn, r.psn) + 1
            if n > r.acked:
                r.acked = n
                r.sent = max(r.sent, n)
                progress = True
            break
        if progress:
            self._progress(now)
        self._retire_head()
        return progress

    def _head_holds(self, psn: int) -> _Request | None:
        if not self._sq:
            return None
        r = self._sq[0]
        if r.built and r.error is None and 0 <= psn_diff(psn, r.psn) < r.npsn:
            return r
        return None

    # -- packets in ------------------------------------------------------------
    def receive(self, pkt: Packet, now: float) -> None:
        if pkt.dest_qp != self.qp_num or self.state not in _RECEIVING:
            return      # IBTA: a QP not in RTR/RTS/SQD silently drops what arrives
        if pkt.opcode in _RESPONSES:
            if self.state in _SENDING:
                self._requester_receive(pkt, now)
        else:
            self._responder_receive(pkt)

    def _requester_receive(self, pkt: Packet, now: float) -> None:
        if pkt.opcode in _READ_RESPONSES:
            self._read_response(pkt, now)
            return
        if pkt.opcode == ATOMIC_ACK:
            self._atomic_ack(pkt, now)
            return
        syndrome = pkt.aeth[0]
        if syndrome == "ACK":
            if self._ack(pkt.psn, now):
                self._rnr_count = 0
            return
        # A NAK acknowledges every PSN before the one it names (IBTA: NAKs are cumulative).
        self._ack(psn_add(pkt.psn, -1), now)
        if self.state not in _SENDING or self._head_holds(pkt.psn) is None:
            return      # stale: about a PSN already dealt with
        if syndrome == "NAK_PSN_SEQ":
            self.stats["retransmissions"] += 1
            self._go_back()
        elif syndrome == "RNR":
            if self._rnr_until is not None:
                return  # a second RNR NAK for the same wait (a duplicated request)
            self._rnr_count += 1
            self.stats["rnr_retries"] += 1
            if self.rnr_retry != RNR_RETRY_FOREVER and self._rnr_count > self.rnr_retry:
                self._fail_head(WcStatus.RNR_RETRY_EXC_ERR)
                return
            self._rnr_until = now + self.rnr_timer_s
            self._timer = None
        else:
            self._fail_head(_NAK_STATUS.get(syndrome, WcStatus.BAD_RESP_ERR))

    def _read_response(self, pkt: Packet, now: float) -> None:
        owner = next((r for r in self._sq if r.built and r.error is None
                      and r.wr.opcode == WrOpcode.RDMA_READ
                      and 0 <= psn_diff(pkt.psn, r.psn) < r.npsn), None)
        if owner is None:
            return
        # A READ response acknowledges every request before the READ (IBTA implicit ACK).
        if self._sq[0] is not owner:
            self._ack(psn_add(owner.psn, -1), now)
            if not self._sq or self._sq[0] is not owner:
                return
        ahead = psn_diff(pkt.psn, owner.psn) - owner.acked
        if ahead:
            if ahead > 0 and owner.rerequested != owner.acked:
                # A response past a missing one: ask again from the first missing PSN
                # now rather than after an ACK timeout (the IBA lets a requester
                # re-issue a READ for the responses it lacks; rxe's completer retries at
                # once on such a gap). Once per gap, not per response behind it.
                owner.rerequested = owner.acked
                owner.sent = 0
                self.stats["read_rerequests"] += 1
            return      # a duplicate, or behind a gap: dropped

        owner.read_buf += pkt.payload
        owner.acked += 1
        self._rnr_count = 0
        if owner.acked < owner.npsn:
            self._progress(now)
            return
        self._sq.popleft()
        self._progress(now)
        if len(owner.read_buf) != owner.length:
            self._complete(owner, WcStatus.BAD_RESP_ERR)
            self._enter_err()
            return
        errs: list | None = [] if self.sig_pipelining else None
        try:
            _scatter(self.pd, owner.wr.sg, bytes(owner.read_buf),
                     self._t(role="requester", wr_id=owner.wr.wr_id, op="RDMA_READ"), errs)
            if errs:
                self._sig_stop = True
        except TransferError as err:
            self._complete(owner, err.status(remote=False))
            self._enter_err()
            return
        self._complete(owner, WcStatus.SUCCESS)
        self._retire_head()

    def _atomic_ack(self, pkt: Packet, now: float) -> None:
        owner = next((r for r in self._sq if r.built and r.error is None and not r.local
                      and r.wr.opcode in ATOMICS and r.psn == pkt.psn), None)
        if owner is None or pkt.atomic_ack is None:
            return      # a second answer to a duplicated request, already completed
        # Like a READ response, it acknowledges every request before the atomic (IBTA).
        if self._sq[0] is not owner:
            self._ack(psn_add(owner.psn, -1), now)
            if not self._sq or self._sq[0] is not owner:
                return
        self._sq.popleft()
        self._rnr_count = 0
        self._progress(now)
        sge = owner.wr.sg[0]
        try:
            transfer.rx(self.pd, sge.lkey, sge.addr, pkt.atomic_ack.to_bytes(8, "little"))
        except TransferError as err:
            self._complete(owner, err.status(remote=False))
            self._enter_err()
            return
        self._complete(owner, WcStatus.SUCCESS)
        self._retire_head()

    # -- responder -------------------------------------------------------------
    def _queue_ack(self, psn: int) -> None:
        self._unacked = 0
        pkt = Packet(self.dest_qp, psn, ACK, aeth=("ACK", self._msn))
        # ACKs are cumulative: a newer one makes a queued older one useless.
        if self._resp_out and self._resp_out[-1].opcode == ACK \
                and self._resp_out[-1].aeth[0] == "ACK":
            self._resp_out[-1] = pkt
        else:
            self._resp_out.append(pkt)

    def _nak(self, psn: int, syndrome: str) -> None:
        self._resp_out.append(Packet(self.dest_qp, psn, ACK, aeth=(syndrome, self._msn)))

    def _nak_fatal(self, psn: int, syndrome: str) -> None:
        self._nak(psn, syndrome)
        self._enter_err()

    def _accept(self, n: int = 1) -> None:
        self._epsn = psn_add(self._epsn, n)
        self._nak_pending = False

    def _responder_receive(self, pkt: Packet) -> None:
        d = psn_diff(pkt.psn, self._epsn)
        if d < 0:
            # IBTA duplicate request: answer again, apply nothing.
            self.stats["duplicates_discarded"] += 1
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
                self.stats["psn_seq_naks_sent"] += 1
                self._nak(self._epsn, "NAK_PSN_SEQ")
            return
        op = pkt.opcode
        if op == READ_REQUEST or op in _ATOMIC_REQUESTS:
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
                _scatter(self.pd, m.recv.sg, bytes(m.buf),
                         self._t(role="responder", wr_id=m.recv.wr_id, op="RECV"))
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
            if inv and not self._invalidate(pkt.ieth, remote=True):
                self._fail_recv(m.recv, REMOTE_INV_FAILED, pkt.psn, "NAK_INV_REQ")
                return
            flags = (WcFlags.WITH_IMM if imm else 0) | (WcFlags.WITH_INV if inv else 0)
            self._rcq.append(WC(m.recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV, len(m.buf),
                                self.qp_num, pkt.imm if imm else None, int(flags),
                                pkt.ieth if inv else 0))
        self._after_packet(pkt.psn, last)

    def _fail_recv(self, recv: RecvWR, status: WcStatus, psn: int, syndrome: str) -> None:
        self._msg = None
        self._rcq.append(WC(recv.wr_id, status, WcOpcode.RECV, 0, self.qp_num))
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
                transfer.check_rx(self.pd, rkey, addr, dma_len, remote=True)
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
                transfer.rx(self.pd, rkey, addr, bytes(m.buf), remote=True,
                            trace=self._t(role="responder", psn=pkt.psn, op="RDMA_WRITE"))
            except TransferError as err:
                self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
                return
            if imm:
                recv = self._rq.popleft()
                self._rcq.append(WC(recv.wr_id, WcStatus.SUCCESS, WcOpcode.RECV_RDMA_WITH_IMM,
                                    len(m.buf), self.qp_num, pkt.imm, int(WcFlags.WITH_IMM)))
        self._after_packet(pkt.psn, last)

    def _answer_read(self, pkt: Packet, first_time: bool) -> None:
        rkey, addr, length = pkt.reth
        try:
            data = transfer.tx(self.pd, rkey, addr, length, remote=True,
                               trace=self._t(role="responder", psn=pkt.psn, op="RDMA_READ"))
        except TransferError as err:
            self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
            return
        chunks = _chunks(data, self.mtu)
        if first_time:
            self._accept(len(chunks))
            self._msn = (self._msn + 1) % PSN_MOD
            self._unacked = 0
        n = len(chunks)
        for i, chunk in enumerate(chunks):
            op = opcode_for(Op.READ_RESPONSE, i == 0, i == n - 1)
            aeth = ("ACK", self._msn) if FLAGS[op] & Op.AETH else None
            self._resp_out.append(Packet(self.dest_qp, psn_add(pkt.psn, i), op, chunk,
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
            original = transfer.atomic(self.pd, rkey, addr, update)
        except TransferError as err:
            self._nak_fatal(pkt.psn, _FAULT_NAK[err.fault])
            return
        self._accept()
        self._msn = (self._msn + 1) % PSN_MOD
        self._unacked = 0
        self._atomic_results[pkt.psn] = (original, self._msn)
        while len(self._atomic_results) > ATOMIC_RESULTS:
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
        self._resp_out.append(Packet(self.dest_qp, psn, ATOMIC_ACK, aeth=("ACK", msn),
                                     atomic_ack=original))
