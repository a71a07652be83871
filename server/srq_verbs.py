"""The shared receive queue requests of a control session (ibv_create_srq(3),
ibv_modify_srq(3), ibv_query_srq(3), ibv_destroy_srq(3), ibv_post_srq_recv(3)).

An SRQ is an object of the session that created it, found by its handle in that
session's table only: another session's SRQ handle names nothing here (ENOENT), so no
connection posts to, drains or watches another's SRQ. Its depth is bounded by the
device's max_srq_wr (the daemon's ``--max-qp-wr``), checked before anything is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..engine.srq import SRQ
from ..protocol import control
from ..protocol.enums import EventType
from ..protocol.errors import RDMAError, einval
from .post_wrs import post_each

IBV_SRQ_MAX_WR = 1
IBV_SRQ_LIMIT = 2


def _srq_event(v, handle: int, ctx: int) -> Callable[[], None]:
    def fire() -> None:
        v.async_events.push(ctx, EventType.SRQ_LIMIT_REACHED, srq=handle)
    return fire


def op_create_srq(v, r: control.CreateSrq, rid: int) -> dict:
    pd = v.get(r.pd, "pd")
    srq = SRQ(pd, r.max_wr, r.max_sge, v.daemon.limits.max_qp_wr)
    if r.srq_limit:
        srq.modify(None, r.srq_limit)
    handle = v.add("srq", srq)
    srq.on_limit = _srq_event(v, handle, v.ctx_of_pd.get(r.pd, 0))
    return {"srq": handle, "max_wr": srq.max_wr, "max_sge": srq.max_sge}


def op_modify_srq(v, r: control.ModifySrq, rid: int) -> dict:
    srq: SRQ = v.get(r.srq, "srq")
    srq.modify(r.max_wr if r.mask & IBV_SRQ_MAX_WR else None,
               r.srq_limit if r.mask & IBV_SRQ_LIMIT else None)
    return {}


def op_query_srq(v, r: control.QuerySrq, rid: int) -> dict:
    return {"attr": v.get(r.srq, "srq").query()}


def op_destroy_srq(v, r: control.DestroySrq, rid: int) -> dict:
    srq: SRQ = v.get(r.srq, "srq")
    if srq.qps:
        raise RDMAError("EBUSY", f"ibv_destroy_srq: {srq.qps} QPs still take receives from it")
    return v.destroy_handle(r.srq, "srq")


def op_post_srq_recv(v, r: control.PostSrqRecv, rid: int) -> dict:
    srq: SRQ = v.get(r.srq, "srq")
    post_each("ibv_post_srq_recv", r.wrs, srq.post)
    # A QP that answered RNR retries on its requester's timer: nothing to wake here.
    return {}


def srq_of(v, r: control.CreateQp, pd) -> SRQ | None:
    """The SRQ a CreateQp names (0: none): this session's, of the QP's PD."""
    if not r.srq:
        return None
    srq: SRQ = v.get(r.srq, "srq")
    if srq.pd is not pd:
        raise einval("ibv_create_qp: the SRQ belongs to another PD")
    return srq


HANDLERS: dict[type, Callable[[Any, Any, int], dict | None]] = {
    control.CreateSrq: op_create_srq,
    control.ModifySrq: op_modify_srq,
    control.QuerySrq: op_query_srq,
    control.DestroySrq: op_destroy_srq,
    control.PostSrqRecv: op_post_srq_recv,
}
