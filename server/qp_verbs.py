"""The handlers of a session's CQ and QP requests: ibv_create_cq / ibv_destroy_cq, the
client's credits for pushed completions, ibv_poll_cq, ibv_create_qp / ibv_destroy_qp /
ibv_modify_qp / ibv_query_qp, ibv_post_send and ibv_post_recv.

Each is a function of the session's ``Verbs`` (server/verbs.py), the request and its id,
named in this module's ``HANDLERS`` as every handler module names its own.
"""

from __future__ import annotations

import asyncio

from ..engine import qp_state
from ..engine.hca import PD
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..engine.rc import RCQP
from ..protocol import control
from ..protocol.control import MAX_CQE
from ..protocol.enums import Mlx5dvQpCreateFlags, QpAttrMask, QpType
from ..protocol.errors import RDMAError, einval
from .cq_ring import take_event_socket, take_ring
from .hosts import CQHost, QPHost
from .mw_verbs import bind_objects, clean_on_reset
from .post_reply import reply_may_wait, send_queue_busy
from .post_wrs import post_each, post_sends
from .qp_caps import check_caps
from .srq_verbs import srq_of
from .ud_verbs import add_qp, create_datagram_qp, resolve_ah
from .wq_verbs import kick, refuse_requests, ring_for

# mlx5dv_create_qp(3) create_flags modelled: signature pipelining, and disabling
# scatter to CQE (softhca never scatters into a CQE, so there is nothing to disable).
QP_CREATE_FLAGS = int(Mlx5dvQpCreateFlags.SIG_PIPELINING
                      | Mlx5dvQpCreateFlags.DISABLE_SCATTER_TO_CQE)


# -- verbs: CQ and QP ---------------------------------------------------------------
def op_create_cq(v, r: control.CreateCq, rid: int) -> dict | None:
    v.get(r.ctx, "ctx")
    if not 1 <= r.cqe <= MAX_CQE:
        raise einval(f"ibv_create_cq cqe {r.cqe} is outside [1, max_cqe {MAX_CQE}]")
    cq = CQHost(0, r.cqe, r.ctx, r.push)
    if r.ring is not None:
        if not r.push:
            raise einval("ibv_create_cq: a completion ring is a pushed CQ's (push)")
        cq.ring = take_ring(v, r.ring, r.cqe, "ibv_create_cq")
    try:
        if (r.channel is None) != (r.event is None):
            raise einval("ibv_create_cq: a completion channel's handoff and its event "
                         "value come together")
        if r.channel is not None:
            if cq.ring is None:
                raise einval("ibv_create_cq: channel events are a ring CQ's (ring)")
            cq.events = take_event_socket(v, r.channel, r.event, "ibv_create_cq")
        cq.handle = v.add("cq", cq)
    except Exception:
        if cq.ring is not None:
            cq.ring.close()
        if cq.events is not None:
            cq.events.close()
        raise
    if cq.ring is not None:
        v.rings.append(cq.ring)
    return {"cq": cq.handle, "cqe": r.cqe, "push": cq.push_mode, "ring": cq.ring is not None}


def op_destroy_cq(v, r: control.DestroyCq, rid: int) -> dict | None:
    cq = v.get(r.cq, "cq")
    for kind, o in v.objects.values():
        if kind == "qp" and (o.scq is cq or o.rcq is cq):
            raise RDMAError("EBUSY", f"ibv_destroy_cq: CQ {r.cq} is used by QP "
                                     f"{o.rcqp.qp_num:#x}")
    return v.destroy_handle(r.cq, "cq")


def op_cq_credit(v, r: control.CqCredit, rid: int) -> dict | None:
    """The client polled pushed entries: give their room back. Checked whole before
    any is applied; accepted, it has no reply (the client does not wait for one)."""
    # r.credits holds one (handle, sum) per CQ (control.credits_from_wire).
    cqs = [(v.get(h, "cq"), n) for h, n in r.credits]
    for cq, n in cqs:
        if n > cq.pushed:
            cq.credit(n)        # raises EPROTO before anything is applied
    for cq, n in cqs:
        cq.credit(n)
    return None


def op_req_notify_cq(v, r: control.ReqNotifyCq, rid: int) -> dict | None:
    """ibv_req_notify_cq(3) of a ring CQ: the next entry written pushes a cq_event. One
    already there and not polled does so at once: the program may have looked at the
    ring before the entry was written and before this request came (ibv_req_notify_cq
    is a message here, not a doorbell), and would otherwise wait for a completion that
    came already. Solicited-only arming notifies on any completion, as the frame path
    does (more events than asked for, which ibv_req_notify_cq(3) allows). Accepted, it
    has no reply."""
    cq: CQHost = v.get(r.cq, "cq")
    if cq.ring is None:
        raise einval(f"req_notify_cq: CQ {r.cq} has no completion ring (a pushed CQ's "
                     "client arms it itself)")
    if cq.ring.unpolled():
        cq.armed = False
        v.cq_event(cq)
    else:
        cq.armed = True
    return None


def op_poll_cq(v, r: control.PollCq, rid: int) -> dict | None:
    cq: CQHost = v.get(r.cq, "cq")
    # A pushed CQ keeps no entries here (they went to the client as they came), so
    # on it poll_cq returns none: with a timeout it is the client's wait for the
    # next completion held here, bounded by max_waits like any other, and answered
    # (after the "wc" frame) when one comes.
    if cq.entries or r.timeout <= 0:
        return {"wcs": [w.to_wire() for w in cq.take(r.num)]}
    v.room_to_wait("ibv_poll_cq")

    async def wait() -> None:
        await cq.wait(float(r.timeout))
        if not v.gone:
            v.session.reply_to("poll_cq", rid, wcs=[w.to_wire() for w in cq.take(r.num)])

    v.start_wait(wait())
    return None


def op_create_qp(v, r: control.CreateQp, rid: int) -> dict | None:
    pd: PD = v.get(r.pd, "pd")
    scq = v.get(r.scq, "cq")
    rcq = v.get(r.rcq, "cq")
    if r.qp_type not in (QpType.RC, QpType.UC, QpType.UD):
        raise RDMAError("EOPNOTSUPP", f"qp_type {r.qp_type}: IBV_QPT_RC, UC and UD are "
                                      "modelled")
    check_caps(r, v.daemon.limits.max_qp_wr)
    rings = ring_for(v, r)
    try:
        reply = _create_qp(v, r, pd, scq, rcq, rings)
    except Exception:
        if rings is not None:
            rings.close()
        raise
    if rings is not None:
        reply["ring_queues"] = rings.queues
    return reply


def _create_qp(v, r: control.CreateQp, pd: PD, scq, rcq, rings) -> dict:
    if r.qp_type != QpType.RC:
        return add_qp(v, create_datagram_qp(v, r, pd, scq, rcq), r.pd, rings)
    create_flags = r.create_flags
    unmodelled = create_flags & ~QP_CREATE_FLAGS
    if unmodelled:
        names = [f.name for f in Mlx5dvQpCreateFlags if f & unmodelled] or [hex(unmodelled)]
        raise RDMAError("EOPNOTSUPP", "mlx5dv_create_qp: create_flags "
                                      f"{', '.join(names)} not modelled")
    srq = srq_of(v, r, pd)
    qpn = v.daemon.new_qpn()
    rcqp = RCQP(pd, qpn, sq_depth=r.max_send_wr, rq_depth=r.max_recv_wr,
                sq_sig_all=r.sq_sig_all, max_inline_data=r.max_inline_data,
                sig_pipelining=bool(create_flags & Mlx5dvQpCreateFlags.SIG_PIPELINING),
                srq=srq)
    if srq is not None:
        srq.qps += 1
    builder = MkeyConfigureBuilder(pd, r.send_ops_flags, r.sq_sig_all)
    return add_qp(v, QPHost(v.session, 0, pd.hca, pd, rcqp, scq, rcq,
                               r.max_send_sge, r.max_recv_sge, r.send_ops_flags, builder,
                               v.complete, v.qp_event), r.pd, rings)


def op_destroy_qp(v, r: control.DestroyQp, rid: int) -> dict | None:
    return v.destroy_handle(r.qp, "qp")


def op_modify_qp(v, r: control.ModifyQp, rid: int) -> dict | None:
    qph: QPHost = v.get(r.qp, "qp")
    attr = r.attr
    # No IBV_QP_STATE: a change within the current state, as mlx5 and rxe take it
    # (ib_modify_qp_is_ok); the engine checks it as the transition cur -> cur.
    if ("dest_host" in attr) != ("dest_port" in attr):
        raise einval("ibv_modify_qp: the peer's address (IBV_QP_AV) is dest_host and "
                     "dest_port together")
    # The mask's bits beside the fields sent (those that carry no value here); AV is
    # the peer's address, so only the address sets it.
    mask = r.mask & ~QpAttrMask.AV | qp_state.mask_of(attr)
    qph.rcqp.modify(attr, mask)
    if mask & QpAttrMask.AV:
        # The peer's daemon; this one when named by the address the session dialed.
        host, port = v.daemon.route(attr["dest_host"], attr["dest_port"],
                                       v.session.dialed)
        qph.dest = (host, port, attr.get("dest_dev", qph.hca.name))
        v.daemon.connect(qph, host, port)
    qph.attrs.update(attr)
    v.daemon.service(qph)
    clean_on_reset(qph)
    kick(v, qph)
    return {"state": int(qph.rcqp.state)}


def op_query_qp(v, r: control.QueryQp, rid: int) -> dict | None:
    qph: QPHost = v.get(r.qp, "qp")
    q = qph.rcqp
    return {"attr": {"qp_state": int(q.state), "qp_num": q.qp_num, "dest_qp_num": q.dest_qp,
                     "path_mtu": qph.attrs.get("path_mtu", 0),
                     "timeout": qph.attrs.get("timeout", 0),
                     "retry_cnt": q.retry_cnt, "rnr_retry": q.rnr_retry,
                     "sq_sig_all": q.sq_sig_all, "qkey": getattr(q, "qkey", 0),
                     "dest": list(qph.dest) if qph.dest else None}}


def op_post_send(v, r: control.PostSend, rid: int) -> dict | None:
    qph: QPHost = v.get(r.qp, "qp")
    refuse_requests(qph, recv=False)
    wrs = r.wrs
    now = asyncio.get_running_loop().time()
    bind_objects(v, wrs)
    busy = send_queue_busy(qph)
    try:
        post_sends(qph, wrs, r.wr_complete, now, v.daemon.limits.max_msg_size,
                   lambda q, wr: resolve_ah(v, q, wr))
    finally:
        v.daemon.service(qph)
    # The reply may go with the completion (server/post_reply.py).
    return {"_hold": True} if reply_may_wait(qph, wrs, busy) else {}


def op_post_recv(v, r: control.PostRecv, rid: int) -> dict | None:
    qph: QPHost = v.get(r.qp, "qp")
    refuse_requests(qph, recv=True)
    wrs = r.wrs

    def post(wr) -> None:
        if len(wr.sg) > qph.max_recv_sge:
            raise einval(f"it has {len(wr.sg)} SGEs, the QP's max_recv_sge is "
                         f"{qph.max_recv_sge}")
        qph.rcqp.post_recv(wr)
    try:
        post_each("ibv_post_recv", wrs, post)
    finally:
        v.daemon.service(qph)
    return {}


HANDLERS = {
    control.CreateCq: op_create_cq,
    control.DestroyCq: op_destroy_cq,
    control.CqCredit: op_cq_credit,
    control.ReqNotifyCq: op_req_notify_cq,
    control.PollCq: op_poll_cq,
    control.CreateQp: op_create_qp,
    control.DestroyQp: op_destroy_qp,
    control.ModifyQp: op_modify_qp,
    control.QueryQp: op_query_qp,
    control.PostSend: op_post_send,
    control.PostRecv: op_post_recv,
}
