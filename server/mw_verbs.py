"""The control requests of memory windows, MR re-registration and CQ resizing, and the
binds of a post_send (a session's handle of a window, made its object).

Each handler takes the session's ``Verbs`` (server/verbs.py), the decoded request and
its id, and returns the reply's fields, as the handlers there do.
"""

from __future__ import annotations

from collections import deque

from ..engine import mr_rereg, mw, odp
from ..engine.hca import MR
from ..protocol import control
from ..protocol.enums import QpState, WrOpcode
from ..protocol.errors import einval
from .cq_ring import take_ring
from .process_mr import process_buffer


def op_alloc_mw(verbs, r: control.AllocMw, rid: int) -> dict:
    pd = verbs.get(r.pd, "pd")
    window = mw.alloc_mw(pd.hca, pd, r.type)
    return {"mw": verbs.add("mw", window), "rkey": window.rkey}


def op_dealloc_mw(verbs, r: control.DeallocMw, rid: int) -> dict:
    return verbs.destroy_handle(r.mw, "mw")


def bind_objects(verbs, wrs) -> None:
    """The BIND_MW WRs of a post_send name their window by the session's handle: each is
    made the window object (ENOENT for a handle that is not a window of this session),
    before anything is posted."""
    for i, wr in enumerate(wrs):
        if wr.opcode != WrOpcode.BIND_MW:
            continue
        if wr.bind is None:
            raise einval(f"ibv_post_send: WR {i} is IBV_WR_BIND_MW without bind_mw")
        window = verbs.get(wr.bind[0], "mw")
        wr.bind = (window, *wr.bind[1:])


def refuse_bound(mr: MR) -> None:
    """ibv_dereg_mr(3) "fails if any memory window is still bound to this MR": EINVAL,
    as rxe answers."""
    if mr.bound_mws:
        raise einval(f"ibv_dereg_mr: {mr.bound_mws} memory window(s) are bound to it")


def mr_reply(verbs, handle: int, mr: MR) -> dict:
    return {"mr": handle, "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
            "length": mr.length}


def op_rereg_mr(verbs, r: control.ReregMr, rid: int) -> dict:
    """ibv_rereg_mr(3). A new translation is fresh memory of the daemon, or with an
    address the program's own memory (the embedded daemon's process only), charged to
    the session as a registration is, the old released once the new one is in place."""
    mr: MR = verbs.get(r.mr, "mr")
    pd = verbs.get(r.pd, "pd") if r.flags & mr_rereg.CHANGE_PD else None
    at = None
    if r.flags & mr_rereg.CHANGE_TRANSLATION:
        if r.addr:
            # The program's own memory: the embedded daemon's process only.
            at = (r.addr, process_buffer(verbs, r.secret, r.addr, r.length))
        grow = r.length - mr.length
        if grow > 0:
            verbs.charge_registration(grow)
    old = mr.length
    mr_rereg.rereg(mr, r.flags, pd, r.length, r.access, at)
    delta = mr.length - old
    verbs.registered_bytes += delta
    verbs.daemon.registered_bytes += delta
    return mr_reply(verbs, r.mr, mr)


def op_advise_mr(verbs, r: control.AdviseMr, rid: int) -> dict:
    odp.advise(verbs.get(r.pd, "pd"), r.advice, r.flags, list(r.sg))
    return {}


def op_resize_cq(verbs, r: control.ResizeCq, rid: int) -> dict:
    """ibv_resize_cq(3): at least ``cqe`` entries, and never fewer than the completions
    the CQ holds (EINVAL, as a device answers: they would be lost)."""
    cq = verbs.get(r.cq, "cq")
    if not 1 <= r.cqe <= control.MAX_CQE:
        raise einval(f"ibv_resize_cq cqe {r.cqe} is outside [1, max_cqe {control.MAX_CQE}]")
    if (r.ring is None) != (cq.ring is None):
        raise einval(f"ibv_resize_cq: CQ {r.cq} " + ("has a completion ring: a new one "
                     "is named" if cq.ring else "has no completion ring to replace"))
    if cq.ring is not None:
        return _resize_ring(verbs, cq, r)
    held = len(cq.entries) + cq.pushed
    if r.cqe < held:
        raise einval(f"ibv_resize_cq to {r.cqe} entries: the CQ holds {held} completions "
                     "not polled yet")
    cq.cqe = r.cqe
    return {"cqe": r.cqe}


def _resize_ring(verbs, cq, r: control.ResizeCq) -> dict:
    """A ring CQ's resize: its unpolled entries move to the new ring (the program polls
    neither meanwhile), which replaces the old one."""
    new = take_ring(verbs, r.ring, r.cqe, "ibv_resize_cq")
    held = cq.ring.unpolled()
    if held is None or r.cqe < held:
        new.close()
        raise einval(f"ibv_resize_cq to {r.cqe} entries: the CQ holds "
                     + (f"{held} completions not polled yet" if held is not None else
                        "a consumer index its ring cannot have"))
    cq.ring.move_to(new)
    verbs.rings[verbs.rings.index(cq.ring)] = new
    cq.ring.close()
    cq.ring = new
    cq.pushed = held
    cq.cqe = r.cqe
    return {"cqe": r.cqe}


def clean_on_reset(qph) -> None:
    """A QP moved to RESET: its completions still in its CQs go, as libmlx5 cleans the
    CQs of a QP it resets (mlx5_cq_clean), so a QP restarted from ERR does not hand
    its earlier flush completions to the next poll. A pushed CQ's entries are the
    client's, which drops them itself on the reply (client/objects.py QP.modify)."""
    if qph.rcqp.state != QpState.RESET:
        return
    for cq in {qph.scq, qph.rcq}:
        if cq.entries:
            cq.entries = deque(w for w in cq.entries if w.qp_num != qph.rcqp.qp_num)


HANDLERS = {
    control.AllocMw: op_alloc_mw,
    control.DeallocMw: op_dealloc_mw,
    control.ReregMr: op_rereg_mr,
    control.ResizeCq: op_resize_cq,
    control.AdviseMr: op_advise_mr,
}
