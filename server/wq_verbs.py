"""A ring QP's work requests (server/wq_ring.py): the ring taken at ibv_create_qp, and
the ``doorbell`` handler, which reads the WQEs the program published into the engine's
posts, the same WR objects a post_send or post_recv request builds.

What a post request would have refused is now a WQE the daemon reads later, with
nobody waiting for an answer: as a device finds a malformed WQE when it executes it,
such a WR completes in error (signaled or not) after the WRs before it, the QP goes to
ERR, and the WRs after it flush (``RCQP.post_failed``). The status is the one mlx5 and
rxe give for the fault: IBV_WC_LOC_LEN_ERR for a message past the port's max_msg_sz,
IBV_WC_MW_BIND_ERR for a bind the window refuses, IBV_WC_LOC_QP_OP_ERR for the rest
(an opcode the QP does not take, an AH that is not one of the session's, a WQE its slot
cannot hold). A receive WQE its slot cannot hold completes IBV_WC_LOC_QP_OP_ERR after
the QP goes to ERR (flushing the receives before it).

A doorbell reads at most ``DRAIN_MAX`` WQEs; more go in later turns of the event loop,
so no doorbell holds the loop longer than a post request of as many WRs does.
"""

from __future__ import annotations

import asyncio

from ..engine.ud import UDQP
from ..protocol import control, wq_ring
from ..protocol.enums import EventType, QpState, WcOpcode, WcStatus, WrOpcode
from ..protocol.errors import RDMAError, einval
from ..protocol.records import SendWR
from .hosts import QPHost
from .logs import kv, log
from .mw_verbs import bind_objects
from .ud_verbs import resolve_ah
from .wq_ring import Malformed, QpRings, Queue, take_rings

__all__ = ["DRAIN_MAX", "HANDLERS", "ring_for", "rings_published"]

# WQEs one doorbell (or one later turn of the loop) reads: as many as a post request
# carries (control.MAX_WRS_PER_POST), a few milliseconds of the loop.
DRAIN_MAX = control.MAX_WRS_PER_POST

# The states in which each queue takes WRs (engine/qp_state.py VERBS, ERR flushing):
# in any other the WQEs wait in the ring, as a device reads none of a QP not ready.
_SQ_STATES = (QpState.RTS, QpState.SQD, QpState.ERR)
_RQ_STATES = (QpState.INIT, QpState.RTR, QpState.RTS, QpState.SQD, QpState.ERR)


def ring_for(v, r: control.CreateQp) -> QpRings | None:
    """The ring create_qp hands over, checked against the QP it is for; None without."""
    if r.ring is None:
        if r.ring_queues:
            raise einval("ibv_create_qp: ring_queues names queues but no ring is handed over")
        return None
    if r.srq and r.ring_queues & wq_ring.QUEUE_RECV:
        raise einval("ibv_create_qp: a QP taking its receives from an SRQ has no receive "
                     "ring (ibv_post_srq_recv posts them)")
    if r.send_ops_flags and r.ring_queues & wq_ring.QUEUE_SEND:
        raise einval("ibv_create_qp: a QP taking MKEY configure WRs posts its sends with "
                     "requests, not through a send ring")
    return take_rings(v, r, r.ring_queues)


def rings_published(qph: QPHost) -> None:
    """The consumer indices of ``qph``'s ring, if any, brought up to what its engine
    QP holds: called before its completions are delivered, so a program that sees a
    completion sees its WQE's slot free (rxe frees a WQE before it posts the CQE)."""
    if qph.wq is not None:
        qph.wq.publish(qph.rcqp)


def refuse_requests(qph: QPHost, recv: bool) -> None:
    """A post request to a queue that has a ring: EINVAL (its WRs come as WQEs, and the
    ring's consumer index counts the engine's queue as the ring's alone)."""
    q = qph.wq and (qph.wq.rq if recv else qph.wq.sq)
    if q is not None:
        raise einval(f"ibv_post_{'recv' if recv else 'send'}: the QP's "
                     f"{'receive' if recv else 'send'} queue is a ring shared with the "
                     "program: its WRs come as WQEs and doorbells")


def _broken(v, qph: QPHost, q: Queue, which: str) -> None:
    log.warning("ring broken %s", kv(event="wq_ring_broken", peer=v.peer, qp=qph.handle,
                                     queue=which, producer=q.producer(), read=q.drained,
                                     consumer=q.published, depth=q.slots))
    if qph.rcqp.state != QpState.ERR:
        qph.rcqp.modify_to_err()
    v.qp_event(qph, EventType.QP_FATAL)


def _resolve(v, qph: QPHost, wr: SendWR) -> SendWR:
    """What post_send's request checks beside the engine (server/post_wrs.py), for one
    WQE; RDMAError as the request would refuse it."""
    if wr.opcode == WrOpcode.BIND_MW:
        bind_objects(v, (wr,))
    size = sum(s.length for s in wr.sg) if wr.inline is None else len(wr.inline)
    if size > v.daemon.limits.max_msg_size:
        raise RDMAError("EMSGSIZE", f"it moves {size} bytes, the port's max_msg_sz is "
                                    f"{v.daemon.limits.max_msg_size}")
    return resolve_ah(v, qph, wr)


def _status(wr: SendWR, e: RDMAError) -> WcStatus:
    if e.errno_name == "EMSGSIZE":
        return WcStatus.LOC_LEN_ERR
    if wr.opcode == WrOpcode.BIND_MW:
        return WcStatus.MW_BIND_ERR
    return WcStatus.LOC_QP_OP_ERR


def _drain_send(v, qph: QPHost, q: Queue, n: int, now: float) -> None:
    qp = qph.rcqp
    ud = isinstance(qp, UDQP)
    for _ in range(n):
        try:
            wr = q.read_send(ud, qph.wq.max_inline)
        except Malformed as m:
            _failed(v, qph, SendWR(m.wr_id), WcStatus.LOC_QP_OP_ERR, str(m))
            continue
        try:
            qp.post_send(_resolve(v, qph, wr), now)
        except RDMAError as e:
            _failed(v, qph, wr, _status(wr, e), e.message)


def _failed(v, qph: QPHost, wr: SendWR, status: WcStatus, why: str) -> None:
    log.debug("ring WQE failed %s", kv(event="wqe_failed", peer=v.peer, qp=qph.handle,
                                       wr_id=wr.wr_id, status=status.name, reason=why))
    qph.rcqp.post_failed(wr, status)


def _drain_recv(v, qph: QPHost, q: Queue, n: int) -> None:
    qp = qph.rcqp
    for _ in range(n):
        try:
            wr = q.read_recv()
            qp.post_recv(wr)
        except (Malformed, RDMAError) as e:
            wr_id = e.wr_id if isinstance(e, Malformed) else wr.wr_id
            log.debug("ring WQE failed %s", kv(event="wqe_failed", peer=v.peer,
                                               qp=qph.handle, wr_id=wr_id, reason=str(e)))
            if qp.state != QpState.ERR:
                qp.enter_err()
            qp.complete_recv(wr_id, WcStatus.LOC_QP_OP_ERR, WcOpcode.RECV)


def drain(v, qph: QPHost, recv: bool) -> None:
    """The WQEs published in ``qph``'s send (receive) queue, DRAIN_MAX of them now and
    the rest in later turns of the loop, into the engine; its completions and consumer
    index follow (daemon.service)."""
    rings = qph.wq
    q = rings.rq if recv else rings.sq
    q.scheduled = False
    if q.broken or rings.closed or v.gone:
        return
    if qph.rcqp.state not in (_RQ_STATES if recv else _SQ_STATES):
        return
    rings.publish(qph.rcqp)
    pending = q.pending()
    if pending is None:
        _broken(v, qph, q, "receive" if recv else "send")
    elif pending:
        n = min(pending, DRAIN_MAX)
        if recv:
            _drain_recv(v, qph, q, n)
        else:
            _drain_send(v, qph, q, n, asyncio.get_running_loop().time())
        if pending > n:
            q.scheduled = True
            asyncio.get_running_loop().call_soon(_later, v, qph, rings, recv)
    v.daemon.service(qph)


def _later(v, qph: QPHost, rings: QpRings, recv: bool) -> None:
    # the QP may have gone, or been reset (its ring then starts over), meanwhile
    q = rings.rq if recv else rings.sq
    if qph.wq is rings and q.scheduled and not rings.closed:
        drain(v, qph, recv)


def kick(v, qph: QPHost) -> None:
    """After ibv_modify_qp: a reset QP's queues start over empty; one that now takes
    WRs reads those published while it did not."""
    rings = qph.wq
    if rings is None or rings.closed:
        return
    if qph.rcqp.state == QpState.RESET:
        rings.reset()
        return
    for recv, q in ((False, rings.sq), (True, rings.rq)):
        if q is not None and not q.scheduled and not q.broken \
                and q.producer() != q.drained:
            drain(v, qph, recv)


def op_doorbell(v, r: control.Doorbell, rid: int) -> dict | None:
    """The program published WQEs in a queue of a ring QP. Accepted, it has no reply."""
    qph: QPHost = v.get(r.qp, "qp")
    q = qph.wq and (qph.wq.rq if r.rq else qph.wq.sq)
    if q is None:
        raise einval(f"doorbell: QP {r.qp} has no {'receive' if r.rq else 'send'} ring")
    if not q.scheduled:
        drain(v, qph, r.rq)
    return None


HANDLERS = {
    control.Doorbell: op_doorbell,
}
