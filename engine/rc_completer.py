"""The RC completer: what comes back to the send queue of an RC QP (engine/rc.py), as
rxe's rxe_comp.c is for Linux, beside the requester (engine/rc_requester.py, rxe_req.c).

It takes ACKs, NAKs, READ responses and atomic ACKs as runs (protocol/packets.py
``Run``): it completes send WRs in order as they are acknowledged (READs and atomics by
their own responses only, which implicitly acknowledge every request before them),
reassembles and scatters READ responses, places atomics' original values, and turns a
NAK into a go-back-N, an RNR wait (as long as the responder's min_rnr_timer, which its
RNR NAK carries) or an errored completion. Its own state is the RNR retry count; the send
queue and its timers are the requester's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..protocol.enums import QpState, WcStatus, WrOpcode
from ..protocol.opcodes import ATOMIC_ACKNOWLEDGE, RNR_SYNDROMES
from ..protocol.packets import Run
from . import qp_state, transfer
from .completion import TransferError
from .qp_state import SENDING
from .rc_common import QPContext, SendRequest, psn_add, psn_diff, scatter

if TYPE_CHECKING:
    from .rc_requester import Requester

# ibv_modify_qp(3): rnr_retry 7 means retry forever.
RNR_RETRY_FOREVER = 7

# The responder's NAK for a fault on its key, back into the requester's completion
# status (docs/semantics.md section 9).
_NAK_STATUS = {"NAK_REM_ACCESS": WcStatus.REM_ACCESS_ERR,
               "NAK_INV_REQ": WcStatus.REM_INV_REQ_ERR,
               "NAK_REM_OP": WcStatus.REM_OP_ERR}


class Completer:
    """The completion side of ``qp``'s send queue."""

    def __init__(self, qp: QPContext) -> None:
        self.qp = qp
        self._rnr_count = 0
        # The PSN the last sequence-error NAK rewound the send queue to, until the
        # acknowledgements pass it: a NAK for it or an older PSN meanwhile is the
        # responder's answer to packets sent before the rewind, and is not acted on
        # again (IBTA: go-back-N once per outstanding window; rxe's completer likewise
        # ignores NAKs while a retry it started is under way).
        self._rewound_to: int | None = None

    @property
    def _req(self) -> Requester:
        return self.qp.requester

    def receive(self, run: Run, now: float) -> bool:
        """A run of responses arrives; False (nothing done) when its packets must be taken
        one by one: a run of READ responses is taken in one step only where that is what
        its packets one by one would do (every other case, a duplicate, a gap, a run of a
        READ not at the head, is decided per packet). A run of one is always taken."""
        if run.kind == "RDMA_READ_RESPONSE":
            return self._read_responses(run, now)
        if run.kind == ATOMIC_ACKNOWLEDGE:
            self._atomic_ack(run, now)
        else:
            self._acknowledge(run, now)
        return True

    # -- ACKNOWLEDGE ------------------------------------------------------------------
    def _acknowledge(self, run: Run, now: float) -> None:
        syndrome = run.aeth[0]
        if syndrome == "ACK":
            if self._ack(run.psn, now):
                self._rnr_count = 0
            return
        # A NAK acknowledges every PSN before the one it names (IBTA: NAKs are cumulative).
        self._ack(psn_add(run.psn, -1), now)
        if self.qp.state not in SENDING or self._head_holds(run.psn) is None:
            return      # stale: about a PSN already dealt with
        if syndrome == "NAK_PSN_SEQ":
            if self._rewound_to is not None and psn_diff(run.psn, self._rewound_to) <= 0:
                self.qp.stats["psn_seq_naks_ignored"] += 1
                return
            self._rewound_to = run.psn
            self.qp.stats["retransmissions"] += 1
            self._req.go_back()
        elif syndrome in RNR_SYNDROMES:
            # The wait is the responder's min_rnr_timer, which its NAK carries.
            self._rnr(now, qp_state.rnr_timer_s(RNR_SYNDROMES[syndrome]))
        else:
            self._req.fail_head(_NAK_STATUS.get(syndrome, WcStatus.BAD_RESP_ERR))

    def _rnr(self, now: float, wait_s: float) -> None:
        if self._req.rnr_until is not None:
            return  # a second RNR NAK for the same wait (a duplicated request)
        self._rnr_count += 1
        self.qp.stats["rnr_retries"] += 1
        if self.qp.rnr_retry != RNR_RETRY_FOREVER and self._rnr_count > self.qp.rnr_retry:
            self._req.fail_head(WcStatus.RNR_RETRY_EXC_ERR)
            return
        self._req.rnr_wait(now, wait_s)

    def _ack(self, psn: int, now: float) -> bool:
        """Everything up to ``psn`` is acknowledged; True when that was news."""
        req = self._req
        if psn_diff(psn, req.next_psn) >= 0:
            return False        # never sent: not an answer to us
        progress = False
        sq = req.queue
        while sq and self.qp.state in SENDING:
            r = sq[0]
            if r.local:
                if self.qp.state != QpState.RTS:
                    break       # SQD starts no WR, local ones included
                req.run_local()   # every WR before it has completed
                continue
            if not r.live or psn_diff(psn, r.psn) < 0:
                break
            if r.info.responded:
                break           # only its own response completes a READ or an atomic
            if psn_diff(psn, psn_add(r.psn, r.npsn - 1)) >= 0:
                sq.popleft()
                req.complete(r, WcStatus.SUCCESS)
                progress = True
                continue
            n = psn_diff(psn, r.psn) + 1
            if n > r.acked:
                r.acked = n
                r.sent = max(r.sent, n)
                progress = True
            break
        if progress:
            req.progress(now)
            if self._rewound_to is not None and psn_diff(psn, self._rewound_to) >= 0:
                self._rewound_to = None     # the rewind's first packet is acknowledged
        req.retire_head()
        return progress

    def _head_holds(self, psn: int) -> SendRequest | None:
        sq = self._req.queue
        if not sq:
            return None
        r = sq[0]
        if r.live and 0 <= psn_diff(psn, r.psn) < r.npsn:
            return r
        return None

    def _at_head(self, owner: SendRequest, now: float) -> bool:
        """A response to ``owner`` acknowledges every request before it (IBTA implicit
        ACK); whether ``owner`` is then at the head of the send queue."""
        sq = self._req.queue
        if sq[0] is not owner:
            self._ack(psn_add(owner.psn, -1), now)
            if not sq or sq[0] is not owner:
                return False
        return True

    # -- RDMA READ responses ------------------------------------------------------------
    def _read_owner(self, run: Run) -> SendRequest | None:
        """The READ whose responses the run's first packet is."""
        return next((r for r in self._req.queue if r.live and r.wr.opcode == WrOpcode.RDMA_READ
                     and 0 <= psn_diff(run.psn, r.psn) < r.npsn), None)

    def _read_responses(self, run: Run, now: float) -> bool:
        owner = self._read_owner(run)
        if run.n > 1 and (owner is None or owner is not self._req.queue[0]
                          or psn_diff(run.psn, owner.psn) != owner.acked
                          or owner.acked + run.n > owner.npsn):
            return self._read_run_off_head(run, owner, now)
        if owner is None or not self._at_head(owner, now):
            return True
        ahead = psn_diff(run.psn, owner.psn) - owner.acked
        if ahead:
            if ahead > 0 and owner.rerequested != owner.acked:
                # A response past a missing one: ask again from the first missing PSN
                # now rather than after an ACK timeout (the IBA lets a requester
                # re-issue a READ for the responses it lacks; rxe's completer retries at
                # once on such a gap). Once per gap, not per response behind it.
                owner.rerequested = owner.acked
                owner.sent = 0
                self.qp.stats["read_rerequests"] += 1
            return True     # a duplicate, or behind a gap: dropped
        # The run is exactly the next responses of the READ at the head.
        whole = owner.acked == 0 and run.n == owner.npsn
        if not whole:
            owner.read_buf += run.payload
        owner.acked += run.n
        self._rnr_count = 0
        self._req.progress(now)
        if owner.acked < owner.npsn:
            return True
        self._req.queue.popleft()
        self._req.progress(now)
        self._finish_read(owner, run.payload if whole else memoryview(owner.read_buf))
        return True

    def _read_run_off_head(self, run: Run, owner: SendRequest | None, now: float) -> bool:
        """A run of several READ responses that is not exactly the next ones of the READ
        at the head: decided in O(1) where its packets one by one would all be dropped
        or all but one (a duplicate run, a run behind a gap, one for no READ), the new
        part of a run partly duplicate taken as a run; False (one by one) otherwise."""
        if owner is None:
            if self._read_owner(run.sub(run.n - 1, run.n)) is None:
                self.qp.stats["duplicate_runs_discarded"] += 1
                return True     # every packet is for no READ: each would be dropped
            return False
        if owner is not self._req.queue[0]:
            return False
        off = psn_diff(run.psn, owner.psn)
        end = off + run.n
        if end > owner.npsn:
            return False
        if end <= owner.acked:
            self.qp.stats["duplicate_runs_discarded"] += 1
            return True         # all duplicates
        if off < owner.acked:
            # Partly duplicate: the new part is the next responses.
            self.qp.stats["duplicate_runs_discarded"] += 1
            return self._read_responses(run.sub(owner.acked - off, run.n), now) or False
        # Behind a gap: its first packet asks again for the missing ones (once), the
        # rest are dropped as each would be.
        self._read_responses(run.sub(0, 1), now)
        return True

    def _finish_read(self, owner: SendRequest, data) -> None:
        """Every response of READ ``owner`` is in: scatter ``data`` over its SGEs."""
        if len(data) != owner.length:
            self._req.complete(owner, WcStatus.BAD_RESP_ERR)
            self.qp.enter_err()
            return
        trace = self.qp.trace_for(role="requester", wr_id=owner.wr.wr_id, op="RDMA_READ")
        errs: list | None = [] if self.qp.sig_pipelining else None

        def place() -> None:
            scatter(self.qp.pd, owner.wr.sg, data, trace, errs)
            if errs:
                self._req.sig_stop = True
        self._place_response(owner, place)

    # -- ATOMIC ACKNOWLEDGE -------------------------------------------------------------
    def _atomic_ack(self, run: Run, now: float) -> None:
        owner = next((r for r in self._req.queue if r.live and not r.local
                      and r.info.atomic is not None and r.psn == run.psn), None)
        if owner is None or run.atomic_ack is None:
            return      # a second answer to a duplicated request, already completed
        # Like a READ response, it acknowledges every request before the atomic (IBTA).
        if not self._at_head(owner, now):
            return
        self._req.queue.popleft()
        self._rnr_count = 0
        self._req.progress(now)
        sge = owner.wr.sg[0]
        original = run.atomic_ack.to_bytes(8, "little")
        self._place_response(owner, lambda: transfer.rx(self.qp.pd, sge.lkey, sge.addr,
                                                        original))

    def _place_response(self, owner: SendRequest, place: Callable[[], None]) -> None:
        """Complete a READ or an atomic by placing what came back into its local memory;
        a fault on the local key fails it, and the QP goes to ERR."""
        try:
            place()
        except TransferError as err:
            self._req.complete(owner, err.status(remote=False))
            self.qp.enter_err()
            return
        self._req.complete(owner, WcStatus.SUCCESS)
        self._req.retire_head()
