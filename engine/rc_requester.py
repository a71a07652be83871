"""The RC requester: the send queue of an RC QP (engine/rc.py), as rxe's rxe_req.c and
rxe_comp.c are for Linux.

It segments each send WR into request packets of the path MTU under the IBTA opcodes
(protocol/opcodes.py), keeps a window of them on the wire, retransmits go-back-N on an
ACK timeout, a sequence-error NAK or after an RNR NAK's wait, and completes WRs in order
as ACKs, READ responses and atomic ACKs arrive. Its state is the requester's alone:
the send queue, the next PSN, the retransmission and RNR timers, the retry counts,
and how it drains in SQD: a signature pipelining stop, whether IBV_EVENT_SQ_DRAINED is
owed, and canceled WRs (mlx5dv_qp_cancel_posted_send_wrs(3)).
Everything it shares with the responder (the QP's state, attributes and CQs) it reads
from the QP.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..protocol.attrs import SGE
from ..protocol.enums import EventType, QpState, SendFlags, WcOpcode, WcStatus, WrOpcode
from ..protocol.errors import RDMAError, einval, eopnotsupp
from ..protocol.opcodes import FLAGS, Op, opcode_for, with_flags
from ..protocol.packets import Packet, Train
from . import transfer
from .completion import TransferError
from .hca import MR
from .rc_common import PSN_MOD, SENDING, psn_add, psn_diff, scatter

if TYPE_CHECKING:
    from ..protocol.records import SendWR
    from .rc import RCQP

# Unacknowledged packets the requester may have on the wire: 128, rxe's
# RXE_MAX_UNACKED_PSNS. With packet trains a window of 64 (256 KiB at MTU 4096) held one
# train in flight, so each waited for the ACK of the one before: measured on a quiet
# machine, 1 MiB RDMA_WRITEs streamed at 200-212 MB/s with 64, 363-368 with 128
# (docs/performance.md, "Packet trains").
WINDOW = 128
# The most packets of one WR that go as one train (RCQP.poll_wire): a quarter of the
# window, so that the responder's ACK of one train comes back while the next three are
# in flight (the window alone would allow one train of all of it).
TRAIN_MAX = 32
# ibv_modify_qp(3): rnr_retry 7 means retry forever.
RNR_RETRY_FOREVER = 7
_U64 = 1 << 64

ATOMIC_ACK = "ATOMIC_ACKNOWLEDGE"
READ_REQUEST = "RDMA_READ_REQUEST"
_READ_RESPONSES = with_flags(Op.READ_RESPONSE)

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

# The responder's NAK for a fault on its key, back into the requester's completion
# status (docs/semantics.md section 9).
_NAK_STATUS = {"NAK_REM_ACCESS": WcStatus.REM_ACCESS_ERR,
               "NAK_INV_REQ": WcStatus.REM_INV_REQ_ERR,
               "NAK_REM_OP": WcStatus.REM_OP_ERR}


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
    # An atomic's one request packet; a SEND's or WRITE's gathered payload, from which
    # its packets (or trains of them) are cut when they go (never kept as packets).
    pkts: list[Packet] | None = None
    data: bytes | None = None
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


class Requester:
    """The send queue side of ``qp``."""

    def __init__(self, qp: RCQP) -> None:
        self.qp = qp
        self._sq: deque[_Request] = deque()
        self._next_psn = 0
        self._timer: float | None = None
        self._rnr_until: float | None = None
        self._retries = 0
        self._rnr_count = 0
        # A signature error in a pipelining QP's transfer: SQD before the next fenced WR.
        self._sig_stop = False
        # SQD: whether IBV_EVENT_SQ_DRAINED is owed (en_sqd_async_notify, or a pipelining
        # stop) and whether it was raised.
        self._sqd_notify = False
        self._drained_raised = False

    def post_send(self, wr: SendWR) -> None:
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
        signaled = self.qp.sq_sig_all or bool(wr.send_flags & SendFlags.SIGNALED)
        req = _Request(wr, signaled, sum(s.length for s in wr.sg), _WC_OPCODE[wr.opcode],
                       inline=inline)
        if wr.opcode == WrOpcode.LOCAL_INV:
            req.local = req.built = True
        self._enqueue(req)

    def post_local(self, wr: SendWR, signaled: bool, opcode: WcOpcode,
                   action: Callable[[], None] | None = None) -> None:
        """RCQP.post_local: a WR that sends nothing, run at the head of the queue."""
        req = _Request(wr, self.qp.sq_sig_all or bool(signaled), 0,
                       WcOpcode(opcode), built=True, local=True, action=action)
        self._enqueue(req)

    def _enqueue(self, req: _Request) -> None:
        if self.qp.state == QpState.ERR:
            self._complete(req, WcStatus.WR_FLUSH_ERR)
            return
        self.qp.require("ibv_post_send", QpState.RTS, QpState.SQD)
        if len(self._sq) >= self.qp.sq_depth:
            raise RDMAError("ENOMEM", f"send queue full ({self.qp.sq_depth} WRs outstanding)")
        self._sq.append(req)

    def _gather_inline(self, sges: list[SGE]) -> bytes:
        """IBV_SEND_INLINE: the bytes are copied now, so the buffer may be reused as soon
        as ibv_post_send returns (ibv_post_send(3)); "The L_Key will not be checked"."""
        total = sum(s.length for s in sges)
        # ibv_post_send(3) fails with EINVAL when the inline data exceeds the QP's
        # max_inline_data (ibv_create_qp(3) cap).
        if total > self.qp.max_inline_data:
            raise einval(f"{total} bytes of inline data exceed max_inline_data "
                         f"{self.qp.max_inline_data}")
        parts = []
        for s in sges:
            if s.length == 0:
                continue
            # Verbs reads inline data from the virtual address; here memory exists only
            # inside MRs, so the lkey is used to find it, but not checked for access or
            # validity. An address that no MR of this PD holds is unreadable memory.
            mr = self.qp.pd.hca.keys.get(s.lkey)
            if not isinstance(mr, MR) or mr.pd is not self.qp.pd or s.length < 0 \
                    or s.addr < mr.addr or s.addr + s.length > mr.addr + mr.length:
                raise einval(f"inline SGE [{s.addr:#x}, +{s.length}) with lkey {s.lkey:#x} "
                             "is not memory of an MR of this PD")
            start = s.addr - mr.addr
            parts.append(mr.buf[start:start + s.length].tobytes())
        return b"".join(parts)

    def next_deadline(self) -> float | None:
        """When a timer (retransmission or RNR wait) wants ``poll_packets``; packets owed
        because of a post or a receive, and local WRs that reached the head of the send
        queue, are dealt with as soon as ``poll_packets`` is called."""
        times = [t for t in (self._timer, self._rnr_until) if t is not None]
        return min(times) if times else None

    def poll(self, out: list, now: float, trains: bool = False) -> None:
        """Timers first, then what may go: retransmissions, new WRs, local WRs at the
        head; with ``trains``, runs of a WR's packets as trains."""
        if self.qp.state in SENDING:
            self._run_timers(now)
        if self.qp.state in SENDING and self._rnr_until is None:
            # Local WRs at the head run first, so that WRs behind them see their effect.
            self._retire_head()
            if self.qp.state in SENDING:
                self._transmit(out, now, trains)
                self._retire_head()
        self._raise_drained()

    def drain(self, notify: bool) -> None:
        """The QP entered SQD (RCQP.enter_sqd): IBV_EVENT_SQ_DRAINED is owed, if
        ``notify``, once nothing started is outstanding."""
        self._sqd_notify = notify
        self._drained_raised = False

    def resume(self) -> None:
        """SQD -> RTS: the send queue resumes after a signature pipelining stop."""
        self._sig_stop = False

    def _raise_drained(self) -> None:
        if (self.qp.state == QpState.SQD and self._sqd_notify and not self._drained_raised
                and not any(r.built and not r.local for r in self._sq)):
            self._drained_raised = True
            self.qp.events.append(EventType.SQ_DRAINED)

    def cancel(self, wr_id: int) -> int:
        """RCQP.cancel_posted_send_wrs, the QP in SQD: the WRs with ``wr_id`` that have
        not started become NOPs; the number canceled."""
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

    def flush(self) -> None:
        """ERR: every outstanding send WR completes WR_FLUSH_ERR; the timers stop."""
        self._timer = self._rnr_until = None
        while self._sq:
            self._complete(self._sq.popleft(), WcStatus.WR_FLUSH_ERR)

    def _run_timers(self, now: float) -> None:
        if self._rnr_until is not None:
            if now >= self._rnr_until:
                self._rnr_until = None
                self._go_back()
            return
        if self._timer is not None and now >= self._timer:
            self._timer = None
            self._retries += 1
            self.qp.stats["ack_timeouts"] += 1
            if self._retries > self.qp.retry_cnt:
                self._fail_head(WcStatus.RETRY_EXC_ERR)
                return
            self.qp.stats["retransmissions"] += 1
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

    def _transmit(self, out: list, now: float, trains: bool = False) -> None:
        inflight = self._inflight()
        rd_atomic = self._rd_atomic_outstanding()
        sent_any = False
        for r in self._sq:
            if r.local:
                if r.barrier:
                    break       # not at the head yet: later WRs wait for its effect
                continue
            if not r.built:
                if inflight >= WINDOW or self.qp.state != QpState.RTS:
                    break       # the window is full, or SQD: no new WR starts
                if self._sig_stop and r.wr.send_flags & SendFlags.FENCE:
                    # mlx5dv_qp_cancel_posted_send_wrs(3): a pipelining QP "will stop
                    # after a transfer operation that failed signature validation in
                    # SQD state", at the latest before the next fenced WR.
                    self.qp.enter_sqd(notify=True)
                    break
                self._build(r)
            if r.error is not None:
                break
            if r.wr.opcode in RESPONDED:
                if not r.sent:
                    # ibv_modify_qp(3) max_rd_atomic: the READs and atomics the
                    # requester may have outstanding; the send queue waits in order.
                    if rd_atomic >= self.qp.max_rd_atomic:
                        break
                    out.append(self._read_request(r) if r.wr.opcode == WrOpcode.RDMA_READ
                               else r.pkts[0])
                    if r.high:
                        self.qp.stats["retransmitted_packets"] += 1
                    r.sent = r.high = 1
                    inflight += r.npsn - r.acked
                    rd_atomic += 1
                    sent_any = True
                continue
            while r.sent < r.npsn and inflight < WINDOW:
                # A run of packets goes as one train when the caller takes trains: as
                # many as the window allows, up to TRAIN_MAX, never across the PSN
                # wrap (a train's PSNs are one interval). Counted per packet.
                k = 1
                if trains:
                    first = psn_add(r.psn, r.sent)
                    k = min(r.npsn - r.sent, WINDOW - inflight, TRAIN_MAX, PSN_MOD - first)
                out.append(self._train(r, r.sent, k) if k > 1 else self._packet(r, r.sent))
                if r.sent < r.high:
                    self.qp.stats["retransmitted_packets"] += min(k, r.high - r.sent)
                r.sent += k
                r.high = max(r.high, r.sent)
                inflight += k
                sent_any = True
            if r.sent < r.npsn:
                break
        if sent_any and self._timer is None:
            self._timer = now + self.qp.timeout_s

    def _build(self, r: _Request) -> None:
        wr = r.wr
        r.built = True
        r.psn = self._next_psn
        if wr.opcode == WrOpcode.RDMA_READ:
            r.npsn = max(1, -(-r.length // self.qp.mtu))
        elif wr.opcode in ATOMICS:
            # AtomicETH: CMP_AND_SWP carries (swap, compare), FETCH_AND_ADD (add, -).
            cas = wr.opcode == WrOpcode.ATOMIC_CMP_AND_SWP
            ateth = (wr.rkey, wr.remote_addr, wr.swap if cas else wr.compare_add,
                     wr.compare_add if cas else 0)
            r.pkts = [Packet(self.qp.dest_qp, r.psn, ATOMICS[wr.opcode], atomic=ateth)]
            r.npsn = 1
        else:
            if r.inline is not None:
                data = r.inline
            else:
                try:
                    t = self.qp.trace_for(role="requester", wr_id=wr.wr_id,
                                op=WrOpcode(wr.opcode).name)
                    errs: list | None = [] if self.qp.sig_pipelining else None
                    data = b"".join(transfer.tx(self.qp.pd, s.lkey, s.addr, s.length, trace=t,
                                                sig_errors=errs) for s in wr.sg)
                    if errs:
                        self._sig_stop = True
                except TransferError as err:
                    r.error = err.status(remote=False)
                    return
            r.data = data
            # The path MTU cuts the message; an empty message is one empty packet.
            r.npsn = max(1, -(-len(data) // self.qp.mtu))
        self._next_psn = psn_add(r.psn, r.npsn)

    def _train(self, r: _Request, a: int, k: int) -> Train:
        """Packets [a, a+k) of SEND / WRITE ``r`` as one train over its gathered bytes
        (a view: no copy). Each header where its end packets' opcodes carry it (IBTA
        9.2): the RETH on an RDMA WRITE's first packet, ImmDt and IETH on the last."""
        wr, mtu = r.wr, self.qp.mtu
        first, last = a == 0, a + k == r.npsn
        return Train(self.qp.dest_qp, psn_add(r.psn, a), k,
                     "SEND" if wr.opcode in SENDS else "RDMA_WRITE", first, last, mtu,
                     memoryview(r.data)[a * mtu:(a + k) * mtu],
                     (wr.rkey, wr.remote_addr, len(r.data))
                     if first and wr.opcode not in SENDS else None, None,
                     wr.imm_data if last and wr.opcode in WITH_IMM else None,
                     wr.invalidate_rkey if last and wr.opcode == WrOpcode.SEND_WITH_INV
                     else None)

    def _packet(self, r: _Request, i: int) -> Packet:
        """Packet ``i`` of SEND / WRITE ``r``, cut from its gathered bytes when it goes."""
        wr, mtu = r.wr, self.qp.mtu
        name = opcode_for(Op.SEND if wr.opcode in SENDS else Op.WRITE, i == 0,
                          i == r.npsn - 1, wr.opcode in WITH_IMM,
                          wr.opcode == WrOpcode.SEND_WITH_INV)
        # Each header where the opcode carries it (IBTA 9.2): the RETH on an RDMA
        # WRITE's first packet, ImmDt and IETH on the last.
        flags = FLAGS[name]
        return Packet(self.qp.dest_qp, psn_add(r.psn, i), name, r.data[i * mtu:(i + 1) * mtu],
                      (wr.rkey, wr.remote_addr, len(r.data)) if flags & Op.RETH else None,
                      None, wr.imm_data if flags & Op.IMMDT else None,
                      wr.invalidate_rkey if flags & Op.IETH else None)

    def _read_request(self, r: _Request) -> Packet:
        # A retried READ asks only for what has not arrived, at that response's PSN
        # (IBTA RC read retry), so responses already scattered are not asked for again.
        done = r.acked * self.qp.mtu
        return Packet(self.qp.dest_qp, psn_add(r.psn, r.acked), READ_REQUEST,
                      reth=(r.wr.rkey, r.wr.remote_addr + done, r.length - done))

    def _go_back(self) -> None:
        for r in self._sq:
            if not r.built:
                break
            r.sent = 0 if r.wr.opcode in RESPONDED else r.acked

    def _complete(self, r: _Request, status: WcStatus) -> None:
        # An error always produces a completion, even for an unsignaled WR.
        if status == WcStatus.SUCCESS and not r.signaled:
            return
        # ibv_poll_cq(3) defines byte_len for a successful completion only; an errored
        # one reports 0, as mlx5 leaves it (never the length the WR asked for).
        byte_len = (r.length if status == WcStatus.SUCCESS and r.wr.opcode in RESPONDED
                    and not r.local else 0)
        self.qp.complete_send(r.wr.wr_id, status, r.wc_opcode, byte_len)

    def _fail_head(self, status: WcStatus) -> None:
        self._complete(self._sq.popleft(), status)
        self.qp.enter_err()

    def _retire_head(self) -> None:
        """What waits only for every WR before it to complete: a gather error, completed
        in order, and local WRs, run in order."""
        while self.qp.state in SENDING and self._sq:
            r = self._sq[0]
            if r.error is not None:
                self._fail_head(r.error)
                return
            if not r.local or self.qp.state != QpState.RTS:
                return      # SQD starts no WR, local ones included
            self._run_local()

    def _run_local(self) -> None:
        r = self._sq.popleft()
        status = WcStatus.SUCCESS
        if r.canceled:
            pass        # a NOP: completes as the WR was signaled, with its opcode
        elif r.wr.opcode == WrOpcode.LOCAL_INV:
            if not self.qp.invalidate(r.wr.invalidate_rkey, remote=False):
                status = LOCAL_INV_FAILED
        elif r.action is not None:
            try:
                r.action()
            except TransferError as err:
                status = err.status(remote=False)
        self._complete(r, status)
        if status != WcStatus.SUCCESS:
            self.qp.enter_err()

    def _progress(self, now: float) -> None:
        self._retries = 0
        self._timer = now + self.qp.timeout_s if any(r.sent for r in self._sq) else None

    def _ack(self, psn: int, now: float) -> bool:
        """Everything up to ``psn`` is acknowledged; True when that was news."""
        if psn_diff(psn, self._next_psn) >= 0:
            return False        # never sent: not an answer to us
        progress = False
        while self._sq and self.qp.state in SENDING:
            r = self._sq[0]
            if r.local:
                if self.qp.state != QpState.RTS:
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

    def receive(self, pkt: Packet, now: float) -> None:
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
        if self.qp.state not in SENDING or self._head_holds(pkt.psn) is None:
            return      # stale: about a PSN already dealt with
        if syndrome == "NAK_PSN_SEQ":
            self.qp.stats["retransmissions"] += 1
            self._go_back()
        elif syndrome == "RNR":
            if self._rnr_until is not None:
                return  # a second RNR NAK for the same wait (a duplicated request)
            self._rnr_count += 1
            self.qp.stats["rnr_retries"] += 1
            if self.qp.rnr_retry != RNR_RETRY_FOREVER and self._rnr_count > self.qp.rnr_retry:
                self._fail_head(WcStatus.RNR_RETRY_EXC_ERR)
                return
            self._rnr_until = now + self.qp.rnr_timer_s
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
                self.qp.stats["read_rerequests"] += 1
            return      # a duplicate, or behind a gap: dropped
        owner.read_buf += pkt.payload
        owner.acked += 1
        self._rnr_count = 0
        if owner.acked < owner.npsn:
            self._progress(now)
            return
        self._sq.popleft()
        self._progress(now)
        self._finish_read(owner, memoryview(owner.read_buf))

    def receive_train(self, t: Train, now: float) -> bool:
        """A train of READ responses taken in one step, when it is exactly the next run
        the READ at the head expects; False (nothing done) otherwise, and the caller
        gives its packets to ``receive`` one by one, which decides every other case
        (a duplicate, a gap, a train of a READ not at the head) as it always has."""
        owner = self._sq[0] if self._sq else None
        if (owner is None or owner.wr.opcode != WrOpcode.RDMA_READ or not owner.built
                or owner.error is not None or owner.local
                or psn_diff(t.psn, owner.psn) != owner.acked
                or owner.acked + t.n > owner.npsn):
            return False
        whole = owner.acked == 0 and t.n == owner.npsn
        if not whole:
            owner.read_buf += t.payload
        owner.acked += t.n
        self._rnr_count = 0
        self._progress(now)
        if owner.acked < owner.npsn:
            return True
        self._sq.popleft()
        self._progress(now)
        data = t.payload if whole else memoryview(owner.read_buf)
        self._finish_read(owner, data)
        return True

    def _finish_read(self, owner: _Request, data) -> None:
        """Every response of READ ``owner`` is in: scatter ``data`` over its SGEs."""
        if len(data) != owner.length:
            self._complete(owner, WcStatus.BAD_RESP_ERR)
            self.qp.enter_err()
            return
        trace = self.qp.trace_for(role="requester", wr_id=owner.wr.wr_id, op="RDMA_READ")
        errs: list | None = [] if self.qp.sig_pipelining else None

        def place() -> None:
            scatter(self.qp.pd, owner.wr.sg, data, trace, errs)
            if errs:
                self._sig_stop = True
        self._place_response(owner, place)

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
        self._place_response(owner, lambda: transfer.rx(
            self.qp.pd, sge.lkey, sge.addr, pkt.atomic_ack.to_bytes(8, "little")))

    def _place_response(self, owner: _Request, place: Callable[[], None]) -> None:
        """Complete a READ or an atomic by placing what came back into its local memory;
        a fault on the local key fails it, and the QP goes to ERR."""
        try:
            place()
        except TransferError as err:
            self._complete(owner, err.status(remote=False))
            self.qp.enter_err()
            return
        self._complete(owner, WcStatus.SUCCESS)
        self._retire_head()
