"""A shared receive queue (ibv_create_srq(3)): receive WRs that any QP created with it
takes, in the order they were posted, with the limit event of ibv_modify_srq(3).

The responder of an RC QP reads its receives through the same small interface from its
own queue (a deque) or from an SRQ: truth (is one posted), ``[0]`` (the next one, to
check its length) and ``popleft()`` (take it). So a QP of any transport takes a receive
the same way from either; only ``flush`` differs, because an SRQ's WRs belong to the SRQ
and outlive a QP that goes to ERR (rxe: a QP flushes only its own receive queue).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..protocol.errors import RDMAError, einval
from ..protocol.records import RecvWR


class SRQ:
    """ibv_srq: ``max_wr`` receives of at most ``max_sge`` SGEs, armed by ``modify`` with
    a ``srq_limit``: when taking a WR leaves fewer than the limit posted,
    ``on_limit`` is called once (IBV_EVENT_SRQ_LIMIT_REACHED) and the limit goes back to
    0 (disarmed), as ibv_modify_srq(3) says and rxe does."""

    def __init__(self, pd, max_wr: int, max_sge: int, device_max_wr: int,
                 on_limit: Callable[[], None] | None = None) -> None:
        if not 1 <= max_wr <= device_max_wr:
            raise einval(f"ibv_create_srq: max_wr {max_wr} outside 1..{device_max_wr} "
                         "(the device's max_srq_wr)")
        self.pd = pd
        self.max_wr = max_wr
        self.max_sge = max_sge
        self.device_max_wr = device_max_wr
        self.srq_limit = 0
        self.on_limit = on_limit
        self._wrs: deque[RecvWR] = deque()
        # QPs created with this SRQ (ibv_destroy_srq is EBUSY while any exists).
        self.qps = 0

    # -- the receive-queue interface the responder uses ---------------------------------
    def __len__(self) -> int:
        return len(self._wrs)

    def __getitem__(self, i: int) -> RecvWR:
        return self._wrs[i]

    def popleft(self) -> RecvWR:
        wr = self._wrs.popleft()
        if self.srq_limit and len(self._wrs) < self.srq_limit:
            self.srq_limit = 0
            if self.on_limit is not None:
                self.on_limit()
        return wr

    # -- verbs ------------------------------------------------------------------------
    def post(self, wr: RecvWR) -> None:
        """ibv_post_srq_recv(3) of one WR."""
        if len(wr.sg) > self.max_sge:
            raise einval(f"recv WR has {len(wr.sg)} SGEs, the SRQ's max_sge is {self.max_sge}")
        if len(self._wrs) >= self.max_wr:
            raise RDMAError("ENOMEM", f"SRQ full ({self.max_wr} WRs posted)")
        self._wrs.append(wr)

    def modify(self, max_wr: int | None, srq_limit: int | None) -> None:
        """ibv_modify_srq(3): IBV_SRQ_MAX_WR resizes (not below the WRs posted, not past
        the device's max_srq_wr), IBV_SRQ_LIMIT arms the limit event (below max_wr).
        All is checked before anything changes."""
        new_max = self.max_wr if max_wr is None else max_wr
        if max_wr is not None and not len(self._wrs) <= max_wr <= self.device_max_wr \
                or new_max < 1:
            raise einval(f"ibv_modify_srq: max_wr {max_wr} outside {max(len(self._wrs), 1)}"
                         f"..{self.device_max_wr} (WRs posted .. the device's max_srq_wr)")
        if srq_limit is not None and not 0 <= srq_limit < new_max:
            raise einval(f"ibv_modify_srq: srq_limit {srq_limit} must be below max_wr {new_max}")
        self.max_wr = new_max
        if srq_limit is not None:
            self.srq_limit = srq_limit

    def query(self) -> dict:
        """ibv_query_srq(3): max_wr, max_sge, srq_limit (0 once the event fired)."""
        return {"max_wr": self.max_wr, "max_sge": self.max_sge, "srq_limit": self.srq_limit}
