"""The handlers of a session's rdma_cm requests (protocol/cm.py), over the daemon's
connection manager (server/cm.py). Each answers at once; what happens later (address
and route resolved, a peer's REQ, REP, REJ, DREQ) comes as events pushed to the
session (``{"t": "event", "cm": KIND, "cmid": ...}``), which the library queues on the
id's event channel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..protocol import cm as proto


def _cm(v):
    return v.daemon.cm


def op_create_id(v, r: proto.CmCreateId, rid: int) -> dict:
    return {"cmid": _cm(v).create_id(v.session, r.ps).handle}


def op_destroy_id(v, r: proto.CmDestroyId, rid: int) -> dict:
    cm = _cm(v)
    cm.destroy_id(cm.get(v.session, r.cmid))
    return {}


def op_bind(v, r: proto.CmBind, rid: int) -> dict:
    cm = _cm(v)
    return {"port": cm.bind(cm.get(v.session, r.cmid), r.ip, r.port, r.reuse,
                            r.afonly)}


def op_resolve_addr(v, r: proto.CmResolveAddr, rid: int) -> dict:
    cm = _cm(v)
    cm.resolve_addr(cm.get(v.session, r.cmid), r.ip, r.port, r.timeout_ms)
    return {}


def op_resolve_route(v, r: proto.CmResolveRoute, rid: int) -> dict:
    cm = _cm(v)
    cm.resolve_route(cm.get(v.session, r.cmid), r.timeout_ms)
    return {}


def op_listen(v, r: proto.CmListen, rid: int) -> dict:
    cm = _cm(v)
    cm.listen(cm.get(v.session, r.cmid), r.backlog)
    return {}


def op_connect(v, r: proto.CmConnect, rid: int) -> dict:
    cm = _cm(v)
    cm.connect(cm.get(v.session, r.cmid), r)
    return {}


def op_accept(v, r: proto.CmAccept, rid: int) -> dict:
    cm = _cm(v)
    cm.accept(cm.get(v.session, r.cmid), r)
    return {}


def op_reject(v, r: proto.CmReject, rid: int) -> dict:
    cm = _cm(v)
    cm.reject(cm.get(v.session, r.cmid), r.private_data)
    return {}


def op_establish(v, r: proto.CmEstablish, rid: int) -> dict:
    cm = _cm(v)
    cm.establish(cm.get(v.session, r.cmid))
    return {}


def op_disconnect(v, r: proto.CmDisconnect, rid: int) -> dict:
    cm = _cm(v)
    cm.disconnect(cm.get(v.session, r.cmid))
    return {}


def op_counts(v, r: proto.CmCounts, rid: int) -> dict:
    return {"session": _cm(v).counts(v.session), "daemon": _cm(v).counts()}


HANDLERS: dict[type, Callable[[Any, Any, int], dict | None]] = {
    proto.CmCreateId: op_create_id, proto.CmDestroyId: op_destroy_id,
    proto.CmBind: op_bind, proto.CmResolveAddr: op_resolve_addr,
    proto.CmResolveRoute: op_resolve_route, proto.CmListen: op_listen,
    proto.CmConnect: op_connect, proto.CmAccept: op_accept, proto.CmReject: op_reject,
    proto.CmEstablish: op_establish, proto.CmDisconnect: op_disconnect,
    proto.CmCounts: op_counts,
}
