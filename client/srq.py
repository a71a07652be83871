"""ibv_srq for the async client: a shared receive queue of a PD (``await
pd.create_srq(max_wr)``); QPs created with ``QPInitAttr(srq=srq)`` take their receives
from it, in the order posted."""

from __future__ import annotations

from collections.abc import Iterable

from ..protocol.control import MAX_WRS_PER_POST
from .records import RecvWR

IBV_SRQ_MAX_WR = 1
IBV_SRQ_LIMIT = 2


class SRQ:
    """ibv_srq. Attributes: ``pd``, ``handle``, ``max_wr``, ``max_sge``."""

    def __init__(self, pd, handle: int, max_wr: int, max_sge: int) -> None:
        self.pd, self.handle, self.max_wr, self.max_sge = pd, handle, max_wr, max_sge
        pd.ctx._srqs[handle] = self

    @property
    def node(self):
        """The Node (control session) the SRQ belongs to."""
        return self.pd.ctx.node

    async def post_recv(self, wr: RecvWR | Iterable[RecvWR]) -> None:
        """ibv_post_srq_recv(3): one RecvWR or a list, in order (those before a refused
        one are posted).

        Errors: EINVAL for a WR with more SGEs than ``max_sge``; ENOMEM when the SRQ
        holds ``max_wr`` WRs; EPROTO for a malformed WR or more than 4096 in one call;
        ENOENT after ``srq.close()``."""
        wrs = [w.to_wire() for w in ([wr] if isinstance(wr, RecvWR) else list(wr))]
        for i in range(0, max(len(wrs), 1), MAX_WRS_PER_POST):
            await self.node.request("post_srq_recv", srq=self.handle,
                                    wrs=wrs[i:i + MAX_WRS_PER_POST])

    async def modify(self, max_wr: int | None = None, srq_limit: int | None = None) -> None:
        """ibv_modify_srq(3): resize to ``max_wr`` (IBV_SRQ_MAX_WR) and / or arm the
        limit event at ``srq_limit`` (IBV_SRQ_LIMIT): IBV_EVENT_SRQ_LIMIT_REACHED comes
        once, on the context, when fewer than ``srq_limit`` WRs remain posted.

        Errors: EINVAL for a max_wr below the WRs posted or above the device's
        max_srq_wr, or a srq_limit not below max_wr."""
        mask = (IBV_SRQ_MAX_WR if max_wr is not None else 0) \
            | (IBV_SRQ_LIMIT if srq_limit is not None else 0)
        await self.node.request("modify_srq", srq=self.handle, mask=mask,
                                max_wr=max_wr or 0, srq_limit=srq_limit or 0)
        if max_wr is not None:
            self.max_wr = max_wr

    async def query(self) -> dict:
        """ibv_query_srq(3): ``max_wr``, ``max_sge``, ``srq_limit`` (0 once the limit
        event fired, until armed again)."""
        h, _ = await self.node.request("query_srq", srq=self.handle)
        return h["attr"]

    async def close(self) -> None:
        """ibv_destroy_srq(3).

        Errors: EBUSY while a QP created with it exists; ENOENT when already destroyed."""
        await self.node.request("destroy_srq", srq=self.handle)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
