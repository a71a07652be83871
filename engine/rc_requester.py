"""The RC requester: the send queue of an RC QP (engine/rc.py), as rxe's rxe_req.c is
for Linux; what comes back for it (ACKs, READ responses, atomic ACKs) is the
completer's (engine/rc_completer.py), as rxe_comp.c is.

It segments each send WR into request packets of the path MTU under the IBTA opcodes
(protocol/opcodes.py), keeps a window of them on the wire as runs (protocol/packets.py
``Run``), and retransmits go-back-N on an ACK timeout, a sequence-error NAK or after an
RNR NAK's wait. Its state is the send queue's: the queue, the next PSN, the
retransmission and RNR timers, the retry count, and how it drains in SQD: a signature
pipelining stop, whether IBV_EVENT_SQ_DRAINED is owed, and canceled WRs
(mlx5dv_qp_cancel_posted_send_wrs(3)). Everything it shares with the responder (the
QP's state, attributes and CQs) it reads from the QP.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from ..protocol.attrs import SGE
from ..protocol.enums import EventType, QpState, SendFlags, WcOpcode, WcStatus, WrOpcode
from ..protocol.errors import RDMAError, einval, eopnotsupp
from ..protocol.opcodes import (
    FLAGS,
    RDMA_ATOMIC_WRITE,
    RDMA_READ_REQUEST,
    WR_OPCODES,
    Op,
    WrInfo,
    opcode_for,
)
from ..protocol.packets import Packet, Run
from . import qp_state, transfer
from .completion import TransferError
from .hca import MR
from .mw import check_bind_wr, run_bind_wr
from .qp_state import SENDING
from .rc_common import PSN_MOD, QPContext, SendRequest, psn_add

if TYPE_CHECKING:
    from ..protocol.records import SendWR

def run_max(window: int) -> int:
    """The most request packets of one WR that go as one run (RCQP.poll_wire): a quarter
    of the window, so that the responder's ACK of one run comes back while the next three
    are in flight (the window alone would allow one run of all of it)."""
    return max(1, window // 4)


_U64 = 1 << 64

# A LOCAL_INV whose key cannot be invalidated (unknown, an MR, another PD's): the
# verbs pages name no status; Linux rxe (rxe_req.c, rxe_do_local_ops) completes it
# IB_WC_LOC_QP_OP_ERR, and so do we. A choice, kept here to change in one place.
LOCAL_INV_FAILED = WcStatus.LOC_QP_OP_ERR

# The send flags as plain ints: ``int & IntFlag`` goes through enum's Python-level
# operator (IntFlag.__rand__), a cost paid per posted WR.
_INLINE = int(SendFlags.INLINE)
_SIGNALED = int(SendFlags.SIGNALED)


def _wr_name(wr: SendWR) -> str:
    """The WR's opcode as its error messages name it (only built for an error)."""
    return WrOpcode(wr.opcode).name


def _checked_wr(wr: SendWR) -> WrInfo:
    """What ``wr``'s opcode is to the requester (``WR_OPCODES``), after the checks
    ibv_post_send(3) makes of a WR before it is queued: EOPNOTSUPP for an opcode not
    modelled, EINVAL for a WR its opcode's rules refuse."""
    info = WR_OPCODES.get(wr.opcode)
    if info is None or not info.supported:
        raise eopnotsupp(f"{WrOpcode(wr.opcode).name} is not modelled on this RC QP")
    if info.imm and wr.imm_data is None:
        raise einval(f"{_wr_name(wr)} needs imm_data")
    if info.atomic is not None:
        # IBTA atomics operate on one 64-bit value: the original comes back into
        # one 8-byte buffer.
        if len(wr.sg) != 1 or wr.sg[0].length != 8:
            raise einval(f"{_wr_name(wr)} needs exactly one SGE of 8 bytes")
        if not (0 <= wr.compare_add < _U64 and 0 <= wr.swap < _U64):
            raise einval(f"{_wr_name(wr)} compare_add and swap are 64-bit unsigned values")
    if wr.opcode == WrOpcode.ATOMIC_WRITE and (len(wr.sg) > 1 or wr.sg and wr.sg[0].length != 8
                                               or wr.remote_addr % 8):
        # ibv_wr_atomic_write(3): 8 bytes to an 8-byte aligned remote address (the
        # value in the WR, or one SGE of 8 bytes when posted with ibv_post_send).
        raise einval(f"{_wr_name(wr)} writes 8 bytes (no SGE or one of 8) to an 8-byte aligned "
                     "remote_addr")
    if wr.opcode in (WrOpcode.SEND_WITH_INV, WrOpcode.LOCAL_INV) \
            and not 0 <= wr.invalidate_rkey < 1 << 32:
        raise einval(f"{_wr_name(wr)} invalidate_rkey {wr.invalidate_rkey:#x} is not a 32-bit key")
    return info


def gather_inline(qp: QPContext, sges: list[SGE], copied: bytes | None = None) -> bytes:
    """IBV_SEND_INLINE on ``qp``: the bytes are copied now, so the buffer may be reused
    as soon as ibv_post_send returns (ibv_post_send(3)); "The L_Key will not be
    checked". ``copied``: the bytes the poster copied already (a send ring's WQE)."""
    total = sum(s.length for s in sges) if copied is None else len(copied)
    # ibv_post_send(3) fails with EINVAL when the inline data exceeds the QP's
    # max_inline_data (ibv_create_qp(3) cap).
    if total > qp.max_inline_data:
        raise einval(f"{total} bytes of inline data exceed max_inline_data "
                     f"{qp.max_inline_data}")
    if copied is not None:
        return copied
    parts = []
    for s in sges:
        if s.length == 0:
            continue
        # Verbs reads inline data from the virtual address; here memory exists only
        # inside MRs, so the lkey is used to find it, but not checked for access or
        # validity. An address that no MR of this PD holds is unreadable memory.
        mr = qp.pd.hca.keys.get(s.lkey)
        if not isinstance(mr, MR) or mr.pd is not qp.pd or s.length < 0 \
                or s.addr < mr.addr or s.addr + s.length > mr.addr + mr.length:
            raise einval(f"inline SGE [{s.addr:#x}, +{s.length}) with lkey {s.lkey:#x} "
                         "is not memory of an MR of this PD")
        start = s.addr - mr.addr
        parts.append(mr.buf[start:start + s.length].tobytes())
    return b"".join(parts)


class Requester:
    """The send queue side of ``qp``."""

    def __init__(self, qp: QPContext) -> None:
        self.qp = qp
        self.window, self.run_max = qp.rc_window, run_max(qp.rc_window)
        # Posted WRs in order; the completer (engine/rc_completer.py) retires them.
        self.queue: deque[SendRequest] = deque()
        self.next_psn = 0
        self._timer: float | None = None
        self.rnr_until: float | None = None
        self._retries = 0
        # A signature error in a pipelining QP's transfer: SQD before the next fenced WR.
        self.sig_stop = False
        # SQD: whether IBV_EVENT_SQ_DRAINED is owed (en_sqd_async_notify, or a pipelining
        # stop) and whether it was raised.
        self._sqd_notify = False
        self._drained_raised = False

    def post_send(self, wr: SendWR) -> None:
        self._enqueue(self._request(wr))

    def prepare_send(self, wr: SendWR, ahead: int) -> Callable[[], None]:
        """RCQP.prepare_send: what ``post_send(wr)`` checks, made as if ``ahead`` WRs
        of the same posting were on the queue before it, posting nothing; the call
        returned posts it."""
        req = self._request(wr)
        if qp_state.require("ibv_post_send", self.qp.state):
            self._check_room(ahead)
        return partial(self._enqueue, req)

    def _request(self, wr: SendWR) -> SendRequest:
        """The send queue's entry for ``wr``, or the errno post_send refuses it with."""
        info = _checked_wr(wr)
        inline = None
        if wr.send_flags & _INLINE and wr.opcode != WrOpcode.LOCAL_INV:
            if not info.inline:
                raise einval(f"IBV_SEND_INLINE is valid only for SEND and RDMA_WRITE, not {_wr_name(wr)}")
            inline = gather_inline(self.qp, wr.sg, wr.inline)
        signaled = self.qp.sq_sig_all or bool(wr.send_flags & _SIGNALED)
        req = SendRequest(wr, info, signaled, sum(s.length for s in wr.sg), info.wc_opcode,
                          inline=inline)
        if wr.opcode in (WrOpcode.LOCAL_INV, WrOpcode.BIND_MW):
            if wr.opcode == WrOpcode.BIND_MW:
                check_bind_wr(wr)
            req.local = req.built = True
        return req

    def post_failed(self, wr: SendWR, status: WcStatus) -> None:
        """RCQP.post_failed: ``wr`` completes ``status`` at the head of the queue, nothing
        after it goes before (as a gather error does); in ERR it flushes."""
        info = WR_OPCODES.get(wr.opcode) or WR_OPCODES[WrOpcode.SEND]
        req = SendRequest(wr, info, True, 0, info.wc_opcode, built=True, error=status)
        if self.qp.state not in SENDING:
            self.complete(req, WcStatus.WR_FLUSH_ERR if self.qp.state == QpState.ERR
                          else status)
            return
        self.queue.append(req)

    def post_local(self, wr: SendWR, signaled: bool, opcode: WcOpcode,
                   action: Callable[[], None] | None = None) -> None:
        """RCQP.post_local: a WR that sends nothing, run at the head of the queue."""
        req = SendRequest(wr, WR_OPCODES[WrOpcode(wr.opcode)],
                          self.qp.sq_sig_all or bool(signaled), 0, WcOpcode(opcode),
                          built=True, local=True, action=action)
        self._enqueue(req)

    def _enqueue(self, req: SendRequest) -> None:
        if not qp_state.require("ibv_post_send", self.qp.state):
            self.complete(req, WcStatus.WR_FLUSH_ERR)
            return
        self._check_room(0)
        self.queue.append(req)

    def _check_room(self, ahead: int) -> None:
        """ENOMEM unless the queue holds a WR more after ``ahead`` more are posted: it
        holds max_send_wr WRs posted and not completed (ibv_create_qp(3))."""
        if len(self.queue) + ahead >= self.qp.sq_depth:
            if not ahead:
                raise RDMAError("ENOMEM", f"send queue full ({self.qp.sq_depth} WRs outstanding)")
            raise RDMAError("ENOMEM", f"the send queue holds {self.qp.sq_depth} WRs, "
                                      f"{len(self.queue)} outstanding and {ahead} of this "
                                      "posting before this one")

    def next_deadline(self) -> float | None:
        """When a timer (retransmission or RNR wait) wants ``poll_wire``; packets owed
        because of a post or a receive, and local WRs that reached the head of the send
        queue, are dealt with as soon as ``poll_wire`` is called."""
        times = [t for t in (self._timer, self.rnr_until) if t is not None]
        return min(times) if times else None

    def poll(self, out: list, now: float, runs: bool = False) -> None:
        """Timers first, then what may go: retransmissions, new WRs, local WRs at the
        head; with ``runs``, a WR's packets as runs of several."""
        if self.qp.state in SENDING:
            self._run_timers(now)
        if self.qp.state in SENDING and self.rnr_until is None:
            # Local WRs at the head run first, so that WRs behind them see their effect.
            self.retire_head()
            if self.qp.state in SENDING:
                self._transmit(out, now, runs)
                self.retire_head()
        self._raise_drained()

    def drain(self, notify: bool) -> None:
        """The QP entered SQD (RCQP.enter_sqd): IBV_EVENT_SQ_DRAINED is owed, if
        ``notify``, once nothing started is outstanding."""
        self._sqd_notify = notify
        self._drained_raised = False

    def resume(self) -> None:
        """SQD -> RTS: the send queue resumes after a signature pipelining stop."""
        self.sig_stop = False

    def _raise_drained(self) -> None:
        if (self.qp.state == QpState.SQD and self._sqd_notify and not self._drained_raised
                and not any(r.built and not r.local for r in self.queue)):
            self._drained_raised = True
            self.qp.events.append(EventType.SQ_DRAINED)

    def cancel(self, wr_id: int) -> int:
        """RCQP.cancel_posted_send_wrs, the QP in SQD: the WRs with ``wr_id`` that have
        not started become NOPs; the number canceled."""
        # Not started: never built, or a local WR (those run, and leave, at the head).
        pending = [r for r in self.queue if r.wr.wr_id == wr_id and (not r.built or r.local)]
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
        self._timer = self.rnr_until = None
        while self.queue:
            self.complete(self.queue.popleft(), WcStatus.WR_FLUSH_ERR)

    def _run_timers(self, now: float) -> None:
        if self.rnr_until is not None:
            if now >= self.rnr_until:
                self.rnr_until = None
                self.go_back()
            return
        if self._timer is not None and now >= self._timer:
            self._timer = None
            self._retries += 1
            self.qp.stats["ack_timeouts"] += 1
            if self._retries > self.qp.retry_cnt:
                self.fail_head(WcStatus.RETRY_EXC_ERR)
                return
            self.qp.stats["retransmissions"] += 1
            self.go_back()

    def _outstanding(self) -> tuple[int, int]:
        """The packets in flight and the READs and atomics outstanding. Only the built
        WRs can have either, and they are the queue's head (WRs are built in order), so
        the walk stops at the first unbuilt one: a deep send queue costs nothing here."""
        n = rd_atomic = 0
        for r in self.queue:
            if not r.built:
                break
            if r.info.responded:
                if r.sent:
                    n += r.npsn - r.acked
                    rd_atomic += not r.local
            else:
                n += r.sent - r.acked
        return n, rd_atomic

    def _transmit(self, out: list, now: float, runs: bool = False) -> None:
        inflight, rd_atomic = self._outstanding()
        sent_any = False
        for r in self.queue:
            if r.local:
                if r.barrier:
                    break       # not at the head yet: later WRs wait for its effect
                continue
            if not r.built and not self._start(r, inflight):
                break
            if r.error is not None:
                break
            if r.info.responded:
                if r.sent:
                    continue
                # ibv_modify_qp(3) max_rd_atomic: the READs and atomics the requester
                # may have outstanding; the send queue waits in order.
                if rd_atomic >= self.qp.max_rd_atomic:
                    break
                self._send_request(r, out)
                inflight += r.npsn - r.acked
                rd_atomic += 1
                sent_any = True
                continue
            if r.sent >= r.npsn:
                continue        # all sent, waiting for its ACK
            k = self._send_runs(r, out, inflight, runs)
            inflight += k
            sent_any = sent_any or k > 0
            if r.sent < r.npsn:
                break
        if sent_any and self._timer is None:
            self._timer = now + self.qp.timeout_s

    def _start(self, r: SendRequest, inflight: int) -> bool:
        """Build WR ``r`` if it may start now; False when the send queue waits."""
        if inflight >= self.window or self.qp.state != QpState.RTS:
            return False        # the window is full, or SQD: no new WR starts
        if self.sig_stop and r.wr.send_flags & SendFlags.FENCE:
            # mlx5dv_qp_cancel_posted_send_wrs(3): a pipelining QP "will stop after a
            # transfer operation that failed signature validation in SQD state", at the
            # latest before the next fenced WR.
            self.qp.enter_sqd(notify=True)
            return False
        self._build(r)
        return True

    def _send_request(self, r: SendRequest, out: list) -> None:
        """The one request packet of READ or atomic ``r``."""
        out.append(self._read_request(r) if r.wr.opcode == WrOpcode.RDMA_READ else r.pkts[0])
        if r.high:
            self.qp.stats["retransmitted_packets"] += 1
        r.sent = r.high = 1

    def _send_runs(self, r: SendRequest, out: list, inflight: int, runs: bool) -> int:
        """SEND / WRITE ``r``'s packets that the window lets go; how many."""
        sent = 0
        window = self.window
        while r.sent < r.npsn and inflight + sent < window:
            # With runs, the packets the window allows go as one run (a view of the
            # gathered bytes: a one-packet message too), up to run_max, never across the
            # PSN wrap; counted per packet. An ATOMIC WRITE is a packet, never a run.
            if runs and r.pkts is None:
                k = min(r.npsn - r.sent, window - inflight - sent, self.run_max,
                        PSN_MOD - psn_add(r.psn, r.sent))
                out.append(self._run(r, r.sent, k))
            else:
                k = 1
                out.append(self._packet(r, r.sent))
            if r.sent < r.high:
                self.qp.stats["retransmitted_packets"] += min(k, r.high - r.sent)
            r.sent += k
            r.high = max(r.high, r.sent)
            sent += k
        return sent

    def _build(self, r: SendRequest) -> None:
        wr = r.wr
        r.built = True
        r.psn = self.next_psn
        if wr.opcode == WrOpcode.RDMA_READ:
            r.npsn = max(1, -(-r.length // self.qp.mtu))
        elif r.info.atomic is not None:
            # AtomicETH: CMP_AND_SWP carries (swap, compare), FETCH_AND_ADD (add, -).
            cas = wr.opcode == WrOpcode.ATOMIC_CMP_AND_SWP
            ateth = (wr.rkey, wr.remote_addr, wr.swap if cas else wr.compare_add,
                     wr.compare_add if cas else 0)
            r.pkts = [Packet(self.qp.dest_qp, r.psn, r.info.atomic, atomic=ateth)]
            r.npsn = 1
        else:
            data = r.inline if r.inline is not None else self._gather(r)
            if data is None:
                return
            if wr.opcode == WrOpcode.ATOMIC_WRITE:
                data = data if wr.sg else wr.compare_add.to_bytes(8, "little")
                r.pkts = [Packet(self.qp.dest_qp, r.psn, RDMA_ATOMIC_WRITE, data,
                                 reth=(wr.rkey, wr.remote_addr, 8))]
            r.data = data
            # The path MTU cuts the message; an empty message is one empty packet.
            r.npsn = max(1, -(-len(data) // self.qp.mtu))
        self.next_psn = psn_add(r.psn, r.npsn)

    def _gather(self, r: SendRequest) -> bytes | None:
        """The payload of SEND / WRITE ``r``, one transfer.tx per SGE; None (and the
        WR's error set) on a local fault."""
        wr = r.wr
        try:
            t = self.qp.trace_for(role="requester", wr_id=wr.wr_id, op=WrOpcode(wr.opcode).name)
            errs: list | None = [] if self.qp.sig_pipelining else None
            data = gather(self.qp.pd, wr.sg, t, errs)
            if errs:
                self.sig_stop = True
        except TransferError as err:
            r.error = err.status(remote=False)
            return None
        return data

    def _run(self, r: SendRequest, a: int, k: int) -> Run:
        """Packets [a, a+k) of SEND / WRITE ``r`` as one run over its gathered bytes
        (a view: no copy). Each header where its end packets' opcodes carry it (IBTA
        9.2): the RETH on an RDMA WRITE's first packet, ImmDt and IETH on the last."""
        wr, mtu, send = r.wr, self.qp.mtu, r.info.send
        first, last = a == 0, a + k == r.npsn
        return Run(self.qp.dest_qp, psn_add(r.psn, a), k, "SEND" if send else "RDMA_WRITE",
                   first, last, mtu, memoryview(r.data)[a * mtu:(a + k) * mtu],
                   (wr.rkey, wr.remote_addr, len(r.data)) if first and not send else None,
                   None, wr.imm_data if last and r.info.imm else None,
                   wr.invalidate_rkey if last and wr.opcode == WrOpcode.SEND_WITH_INV
                   else None)

    def _packet(self, r: SendRequest, i: int) -> Packet:
        """Packet ``i`` of SEND / WRITE ``r``, cut from its gathered bytes when it goes."""
        wr, mtu = r.wr, self.qp.mtu
        if r.pkts is not None:
            return r.pkts[i]        # a message of its own opcode (RDMA ATOMIC WRITE)
        name = opcode_for(Op.SEND if r.info.send else Op.WRITE, i == 0,
                          i == r.npsn - 1, r.info.imm, wr.opcode == WrOpcode.SEND_WITH_INV)
        # Each header where the opcode carries it (IBTA 9.2): the RETH on an RDMA
        # WRITE's first packet, ImmDt and IETH on the last.
        flags = FLAGS[name]
        # bytes: a packet's payload is bytes wherever packets are observed (a capture
        # appends it to its headers), and the gathered message may be a view.
        return Packet(self.qp.dest_qp, psn_add(r.psn, i), name,
                      bytes(r.data[i * mtu:(i + 1) * mtu]),
                      (wr.rkey, wr.remote_addr, len(r.data)) if flags & Op.RETH else None,
                      None, wr.imm_data if flags & Op.IMMDT else None,
                      wr.invalidate_rkey if flags & Op.IETH else None)

    def _read_request(self, r: SendRequest) -> Packet:
        # A retried READ asks only for what has not arrived, at that response's PSN
        # (IBTA RC read retry), so responses already scattered are not asked for again.
        done = r.acked * self.qp.mtu
        return Packet(self.qp.dest_qp, psn_add(r.psn, r.acked), RDMA_READ_REQUEST,
                      reth=(r.wr.rkey, r.wr.remote_addr + done, r.length - done))

    # -- what the completer asks of the send queue --------------------------------------
    def go_back(self) -> None:
        """Go-back-N: every started WR sends again from its oldest unacknowledged PSN."""
        for r in self.queue:
            if not r.built:
                break
            r.sent = 0 if r.info.responded else r.acked

    def progress(self, now: float) -> None:
        """Something was acknowledged: the retries start over and the retransmission
        timer restarts while anything sent is unacknowledged."""
        self._retries = 0
        self._timer = now + self.qp.timeout_s if any(r.sent for r in self.queue) else None

    def rnr_wait(self, now: float, wait_s: float) -> None:
        """An RNR NAK: nothing goes for the timer it carries, then go-back-N."""
        self.rnr_until = now + wait_s
        self._timer = None

    def complete(self, r: SendRequest, status: WcStatus) -> None:
        # An error always produces a completion, even for an unsignaled WR.
        if status == WcStatus.SUCCESS and not r.signaled:
            return
        # ibv_poll_cq(3) defines byte_len for a successful completion only; an errored
        # one reports 0, as mlx5 leaves it (never the length the WR asked for).
        byte_len = (r.length if status == WcStatus.SUCCESS and r.info.responded
                    and not r.local else 0)
        self.qp.complete_send(r.wr.wr_id, status, r.wc_opcode, byte_len)

    def fail_head(self, status: WcStatus) -> None:
        self.complete(self.queue.popleft(), status)
        self.qp.enter_err()

    def retire_head(self) -> None:
        """What waits only for every WR before it to complete: a gather error, completed
        in order, and local WRs, run in order."""
        while self.qp.state in SENDING and self.queue:
            r = self.queue[0]
            if r.error is not None:
                self.fail_head(r.error)
                return
            if not r.local or self.qp.state != QpState.RTS:
                return      # SQD starts no WR, local ones included
            self.run_local()

    def run_local(self) -> None:
        """The local WR at the head runs and completes."""
        r = self.queue.popleft()
        status = WcStatus.SUCCESS
        if r.canceled:
            pass        # a NOP: completes as the WR was signaled, with its opcode
        elif r.wr.opcode == WrOpcode.LOCAL_INV:
            if not self.qp.invalidate(r.wr.invalidate_rkey, remote=False):
                status = LOCAL_INV_FAILED
        elif r.wr.opcode == WrOpcode.BIND_MW:
            status = run_bind_wr(r.wr, self.qp.pd, self.qp.qp_num)
        elif r.action is not None:
            try:
                r.action()
            except TransferError as err:
                status = err.status(remote=False)
        self.complete(r, status)
        if status != WcStatus.SUCCESS:
            self.qp.enter_err()


def gather(pd, sges: list[SGE], trace, errs: list | None):
    """A SEND's or WRITE's message, one transfer.tx per SGE. One SGE of an MR is a view
    of its memory, read as the packets go (and again by a retransmission), as an HCA
    DMAs it: ibv_post_send(3) says the buffer stays untouched until the WR completes.
    Through an MKEY the transform makes the bytes anyway."""
    if len(sges) == 1:
        s = sges[0]
        return transfer.tx(pd, s.lkey, s.addr, s.length, trace=trace, sig_errors=errs,
                           view=True)
    return b"".join(transfer.tx(pd, s.lkey, s.addr, s.length, trace=trace, sig_errors=errs)
                    for s in sges)
