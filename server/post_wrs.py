"""A post's WRs: taken in order (``post_send``, ``post_recv``, ``post_srq_recv``), or
all or none (the ``post_send`` of an ``ibv_wr_complete``).

``post_each``: each WR goes to its queue in turn; the first one refused stops the post,
and its error names it twice: in words (its index and wr_id) and as ``bad_wr``, its
index in the request, which the ``err`` reply carries so that a client's ``bad_wr`` is
that WR and the WRs before it, already on the queue, are known posted
(``ibv_post_send(3)``).

``post_all``: ibv_wr_complete has no bad_wr: by ibv_wr_post(3) none of a posting
reaches the queue unless ibv_wr_complete succeeds, and a failure aborts all of it.
Every WR is checked first, each as if those before it were posted (the queue's room
for all of them included), and only then are they posted; a refused one is named in
words, and the error has no ``bad_wr``: nothing was posted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..protocol.errors import RDMAError, einval


def post_each(verb: str, wrs: Iterable[Any], post: Callable[[Any], None]) -> None:
    """``post(wr)`` for each of ``wrs`` in order; the first RDMAError is raised again
    naming the WR (``verb`` leads its message) with ``bad_wr`` its index."""
    for i, wr in enumerate(wrs):
        try:
            post(wr)
        except RDMAError as e:
            raise RDMAError(e.errno_name, f"{verb}: WR {i} (wr_id {wr.wr_id}): {e.message}",
                            bad_wr=i) from None


def post_all(verb: str, wrs: Sequence[Any],
             prepare: Callable[[Any, int], Callable[[], None]]) -> None:
    """``prepare(wr, i)`` for each of ``wrs`` in order (the checks of WR ``i`` with the
    ``i`` before it counted as posted, returning the call that posts it), then those
    calls; the first RDMAError is raised again naming the WR, with nothing posted. The
    work is bounded by the request's size (control.MAX_WRS_PER_POST WRs)."""
    posts = []
    for i, wr in enumerate(wrs):
        try:
            posts.append(prepare(wr, i))
        except RDMAError as e:
            raise RDMAError(e.errno_name, f"{verb}: WR {i} (wr_id {wr.wr_id}): {e.message}"
                            "; nothing was posted") from None
    for post in posts:
        post()


def post_sends(qph, wrs: Sequence[Any], all_or_none: bool, now: float, max_msg: int,
               resolve_ah: Callable[[Any, Any], Any]) -> None:
    """A post_send's WRs on ``qph``: ibv_wr_complete's all or none (``all_or_none``),
    else ibv_post_send's in order; each WR checked by the daemon (its SGEs against
    max_send_sge, its length against the port's ``max_msg`` and, on a UD QP, its AH
    made the object by ``resolve_ah``) and then by the QP."""
    def check(wr):
        if len(wr.sg) > qph.max_send_sge:
            raise einval(f"it has {len(wr.sg)} SGEs, the QP's max_send_sge is "
                         f"{qph.max_send_sge}")
        size = sum(s.length for s in wr.sg)
        if size > max_msg:
            raise einval(f"it moves {size} bytes, the port's max_msg_sz is {max_msg}")
        return resolve_ah(qph, wr)

    qp = qph.rcqp
    if all_or_none:
        post_all("ibv_wr_complete", wrs, lambda wr, i: qp.prepare_send(check(wr), now, i))
    else:
        post_each("ibv_post_send", wrs, lambda wr: qp.post_send(check(wr), now))
