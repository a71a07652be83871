"""The daemon CM's part for RDMA_PS_UDP ids (protocol/cm_sidr.py): SIDR_REQ and
SIDR_REP over the wire links, with the RC CM's checks (server/cm.py's ``receive``: the
origin the link proved, the communication ids) and its retransmission of an unanswered
request (then UNREACHABLE with -ETIMEDOUT, as rdma_cm reports a SIDR_REQ timeout).

As Linux's rdma_cm reports them: a SIDR_REP that accepts gives the active id
ESTABLISHED with the peer's QPN and Q_Key; one that does not (rdma_reject, no listener,
a full backlog) gives UNREACHABLE, its status the SIDR_REP's status. The passive side
gets no event after its rdma_accept: there is no RTU.
"""

from __future__ import annotations

from ..engine.cm import CMId, CMState
from ..engine.ud import UDQP
from ..protocol import cm as proto
from ..protocol import cm_sidr as sidr
from ..protocol.errors import RDMAError


def is_ud(cid: CMId) -> bool:
    return cid.ps == proto.PS_UDP


def connect(cm, cid: CMId, r: proto.CmConnect) -> None:
    cid.check("connect")
    data = proto.check_private_data("sidr_req", r.private_data)
    msg = {"ps": cid.ps, "port": cid.peer_port or 1, "sip": cm._src_ip(cid),
           "sport": cid.port, "dip": cid.peer_ip}
    cid.to(CMState.REQ_SENT)
    cm._send(cid, "sidr_req", msg, data, retry="unreachable")


def _rep(cm, cid: CMId, status: int, qpn: int, data: bytes) -> None:
    header = {"t": "cm", "m": "sidr_rep", "lcid": cid.handle, "rcid": cid.remote_cid,
              "dev": cid.dev, "status": status, "qpn": qpn, "qkey": sidr.RDMA_UDP_QKEY}
    cm._transmit(cid.peer, header, data)
    # Kept, not timed: a SIDR_REQ that comes again (our SIDR_REP was lost) gets it anew.
    cid.resend = {"header": header, "data": data, "fail": None}


def accept(cm, cid: CMId, r: proto.CmAccept) -> None:
    cid.check("accept")
    data = proto.check_private_data("sidr_rep", r.private_data)
    cm._check_qp(cid, r.qpn, "accept", UDQP)
    _rep(cm, cid, sidr.SIDR_SUCCESS, r.qpn, data)
    cm._unpend(cid)
    cid.to(CMState.ESTABLISHED)


def reject(cm, cid: CMId, private_data) -> None:
    cid.check("reject")
    data = proto.check_private_data("sidr_rep", private_data)
    _rep(cm, cid, sidr.SIDR_REJECT, 0, data)
    cm._unpend(cid)
    cid.to(CMState.DISCONNECTED)


def destroy_id(cm, cid: CMId) -> None:
    """A child never answered is rejected; a listener's pending children too."""
    if cid.state == CMState.REQ_RCVD:
        _rep(cm, cid, sidr.SIDR_REJECT, 0, b"")
    cm._forget(cid)
    for child in list(cid.pending):
        c = cm.ids.get(child)
        if c is not None:
            _rep(cm, c, sidr.SIDR_REJECT, 0, b"")
            cm._forget(c)


def _refuse_req(cm, peer, m: dict, status: int) -> None:
    cm._transmit(peer, {"t": "cm", "m": "sidr_rep", "lcid": 1, "rcid": m["lcid"],
                        "dev": 0, "status": status, "qpn": 0, "qkey": 0}, b"")


def on_req(cm, m: dict, origin) -> None:
    peer = cm._reply_to(origin)
    dup = cm.by_remote.get((origin, m["lcid"]))
    if dup is not None:
        c = cm.ids.get(dup)
        if c is not None and c.resend is not None:
            cm._transmit(c.peer, c.resend["header"], c.resend["data"])
        return
    parent, _ = cm.listener_for(m)
    if parent is None:
        _refuse_req(cm, peer, m, sidr.SIDR_UNSUPPORTED)
        return
    if len(parent.pending) >= parent.backlog:
        _refuse_req(cm, peer, m, sidr.SIDR_REJECT)
        return
    try:
        child = cm.create_id(parent.owner, parent.ps, listener=parent.handle)
    except RDMAError:
        _refuse_req(cm, peer, m, sidr.SIDR_REJECT)
        return
    addrs = cm._take_req(parent, child, peer, origin, m)
    cm._event(child, "connect_request", listen=parent.handle,
              _payload=proto.padded("sidr_req", m["private_data"]), **addrs)


def on_rep(cm, cid: CMId, m: dict) -> None:
    if cid.state != CMState.REQ_SENT:
        return      # a duplicate: the first one was taken
    cm._cancel(cid)
    cid.remote_cid, cid.peer_dev = m["lcid"], m["dev"]
    data = proto.padded("sidr_rep", m["private_data"])
    if m["status"] != sidr.SIDR_SUCCESS:
        cid.to(CMState.DISCONNECTED)
        cm._event(cid, "unreachable", status=m["status"], _payload=data)
        return
    cid.to(CMState.ESTABLISHED)
    cm._event(cid, "established", qpn=m["qpn"], qkey=m["qkey"], _payload=data,
              **cm._addrs(cid))


def wrong_kind(cid: CMId, kind: str) -> bool:
    """A message of the other family for this id (a REP for a UD id, a SIDR_REP for
    an RC one): refused, as a message for no connection of that daemon."""
    return is_ud(cid) != (kind == "sidr_rep")
