"""When a ``post_send``'s reply may wait for the completion it causes, to go with it.

A latency-bound program posts one signaled WR to an idle send queue and then waits for
its completion: the reply (a frame of its own) wakes the program once for nothing, and
the pushed completion wakes it again. For such a post the reply is held back, at most
HOLD_S, and leaves in the same write as the next frame the session sends, which is the
completion when it comes in time (docs/performance.md, "Pushed completions"); for a CQ
whose completions go into a ring shared with the program (server/cq_ring.py) it leaves
as the completion is written there (server/verbs.py ``complete``). Nothing
about the reply changes: it is decided (and any error raised) when the request runs; a
refused WR is never held, an error reply never waits, and a completion is still written
before or with the reply, never instead of it.
"""

from __future__ import annotations

from ..protocol.enums import SendFlags
from .hosts import QPHost

# The longest a reply waits for its completion: a few round trips between daemons on a
# loaded machine. Past it the reply goes alone, as before.
HOLD_S = 0.003
# As a plain int: an int & an IntFlag member goes through enum's Python __and__.
_SIGNALED = int(SendFlags.SIGNALED)


def send_queue_busy(qph: QPHost) -> int | None:
    """The WRs ``qph``'s send queue holds (posted, not completed); None for a QP whose
    send queue is not an RC requester's (its posts are answered at once)."""
    requester = getattr(qph.rcqp, "requester", None)
    queue = getattr(requester, "queue", None)
    return None if queue is None else len(queue)


def reply_may_wait(qph: QPHost, wrs: list, busy_before: int | None) -> bool:
    """Whether the reply of a post of ``wrs`` (which succeeded) to ``qph``, whose send
    queue held ``busy_before`` WRs before it, may wait for the completion: one signaled
    WR of at most one packet, posted to an idle send queue of a QP whose send CQ is
    pushed to the session, still outstanding now (a WR that completed at once, flushed
    or local, already pushed its completion ahead of the reply)."""
    if len(wrs) != 1 or busy_before != 0 or not qph.scq.push_mode:
        return False
    wr = wrs[0]
    q = qph.rcqp
    if not (getattr(q, "sq_sig_all", False) or wr.send_flags & _SIGNALED):
        return False
    return (send_queue_busy(qph) == 1
            and sum(s.length for s in wr.sg) <= getattr(q, "mtu", 0))
