"""A post's WRs taken in order (``post_send``, ``post_recv``, ``post_srq_recv``).

Each WR goes to its queue in turn; the first one refused stops the post, and its error
names it twice: in words (its index and wr_id) and as ``bad_wr``, its index in the
request, which the ``err`` reply carries so that a client's ``bad_wr`` is that WR and
the WRs before it, already on the queue, are known posted (``ibv_post_send(3)``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..protocol.errors import RDMAError


def post_each(verb: str, wrs: Iterable[Any], post: Callable[[Any], None]) -> None:
    """``post(wr)`` for each of ``wrs`` in order; the first RDMAError is raised again
    naming the WR (``verb`` leads its message) with ``bad_wr`` its index."""
    for i, wr in enumerate(wrs):
        try:
            post(wr)
        except RDMAError as e:
            raise RDMAError(e.errno_name, f"{verb}: WR {i} (wr_id {wr.wr_id}): {e.message}",
                            bad_wr=i) from None
