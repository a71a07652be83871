"""The RDMA_PS_UDP part of pyverbs' rdma_cm ids: UD QPs connected by SIDR.

An id of the UDP port space (rdma_create_id(3)) has a UD QP, which rdma_create_qp moves
straight to RTS with the Q_Key the port space uses (RDMA_UDP_QKEY): there is no
connection to wait for. rdma_connect sends a SIDR_REQ (the daemon's CM,
server/cm_sidr.py, carries it); the passive side's rdma_accept answers with a SIDR_REP
naming its UD QP, and gets no event after it (no RTU). The active side's
RDMA_CM_EVENT_ESTABLISHED carries, in its param.ud, the peer's QP number and Q_Key and
an address vector towards it, which ``UDParam`` reads; a rejected or unanswered
SIDR_REQ is RDMA_CM_EVENT_UNREACHABLE.
"""

from __future__ import annotations

import errno

from ...protocol.cm_sidr import RDMA_UDP_QKEY
from . import enums as e
from .base import PyverbsObject
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

# librdmacm's route to the peer: the GRH's hop limit it gives an AH of param.ud
_HOP_LIMIT = 64


class UDParam(PyverbsObject):
    """struct rdma_ud_param of a CMEvent: ``qp_num`` and ``qkey`` of the peer's UD QP
    and ``ah_attr`` (an AHAttr for AH(pd, attr=)). Of an event that is not a UD id's
    ESTABLISHED, all are zero, as the union's ud member holds nothing then."""

    def __init__(self, cm_event):
        super().__init__()
        if not hasattr(cm_event, "event_type"):
            raise PyverbsUserError("UDParam is made from a CMEvent")
        ud = getattr(cm_event, "_ud", None) or {}
        self._qpn = int(ud.get("qpn", 0))
        self._qkey = int(ud.get("qkey", 0))
        self._dgid = bytes(ud.get("dgid", bytes(16)))
        self._port = int(ud.get("port", 1))

    @property
    def qp_num(self):
        return self._qpn

    @property
    def qkey(self):
        return self._qkey

    @property
    def ah_attr(self):
        from .addr import GID, AHAttr, GlobalRoute

        gid = GID()
        gid.raw = self._dgid
        # a global route to the peer's GID: RoCE has no LIDs (is_global, as librdmacm
        # fills ah_attr for a RoCE port)
        return AHAttr(is_global=1 if self._qpn else 0, port_num=self._port,
                      gr=GlobalRoute(dgid=gid, sgid_index=0, hop_limit=_HOP_LIMIT))


def ud_event(h: dict) -> dict:
    """param.ud of a UD id's ESTABLISHED event, from the daemon's event frame."""
    return {"qpn": int(h.get("qpn", 0)), "qkey": int(h.get("qkey", 0)),
            "dgid": bytes(h.get("dgid") or bytes(16)), "port": 1}


def ud_qp_attr(qp_state):
    """rdma_init_qp_attr(3) for a UD id: INIT with the port space's Q_Key, RTR with
    nothing more, RTS with a send PSN of 0 (what a UD QP needs, as librdmacm moves its
    own). Other states are EINVAL."""
    from . import qp as q

    a = q.QPAttr()
    a.qp_state = qp_state
    if qp_state == e.IBV_QPS_INIT:
        a.pkey_index, a.port_num, a.qkey = 0, 1, RDMA_UDP_QKEY
        return a, (e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY)
    if qp_state == e.IBV_QPS_RTR:
        return a, e.IBV_QP_STATE
    if qp_state == e.IBV_QPS_RTS:
        a.sq_psn = 0
        return a, e.IBV_QP_STATE | e.IBV_QP_SQ_PSN
    raise PyverbsRDMAError("Failed to init QP attr: a UD id's QP goes to INIT, RTR or "
                           "RTS", errno.EINVAL)


def ready_ud_qp(qp) -> None:
    """rdma_create_qp(3) of a UD id: the new QP straight to RTS."""
    for state in (e.IBV_QPS_INIT, e.IBV_QPS_RTR, e.IBV_QPS_RTS):
        qp.modify(*ud_qp_attr(state))
