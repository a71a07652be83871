"""The verbs of UD and UC QPs: address handles (ibv_create_ah(3), ibv_destroy_ah) and
the creation of a UD or UC QP (engine/ud.py, engine/uc.py).

An AH is an object of the session that created it, in one of its PDs, named by a
handle drawn at random (a co-tenant cannot guess another session's AH from its own,
and a handle is only ever looked up in its own session's table anyway). A UD send
WR names its AH by handle; ``resolve_ah`` swaps the handle for the AH before the
engine sees the WR, refusing one of another session (ENOENT) or of another PD than
the QP's (EINVAL).
"""

from __future__ import annotations

import dataclasses
import secrets

from ..engine.datagram import DatagramQP
from ..engine.hca import PD
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..engine.uc import UCQP
from ..engine.ud import UDQP, AddressHandle
from ..protocol import control
from ..protocol.enums import QpType
from ..protocol.errors import RDMAError, einval
from ..protocol.records import SendWR
from .hosts import QPHost

_HANDLE_BITS = 31


def add_qp(v, qph: QPHost, pd_handle: int, rings=None) -> dict:
    """A QP created (of any type): the session's handle, the daemon's table; ``rings``
    its send and receive rings (server/wq_ring.py), if any."""
    qph.handle = v.add("qp", qph)
    qph.wq = rings
    qph.ctx = v.ctx_of_pd.get(pd_handle, 0)
    v.daemon.add_qp(qph)
    return {"qp": qph.handle, "qp_num": qph.rcqp.qp_num}


def op_create_ah(v, r: control.CreateAh, rid: int) -> dict | None:
    pd: PD = v.get(r.pd, "pd")
    host, port = v.daemon.route(r.dest_host, r.dest_port, v.session.dialed)
    ah = AddressHandle(pd, r.sgid, r.dgid, r.traffic_class, r.hop_limit, r.flow_label,
                       (host, port, r.dest_dev))
    handle = secrets.randbelow((1 << _HANDLE_BITS) - 1) + 1
    while handle in v.objects:
        handle = secrets.randbelow((1 << _HANDLE_BITS) - 1) + 1
    return {"ah": v.add("ah", ah, handle)}


def op_destroy_ah(v, r: control.DestroyAh, rid: int) -> dict | None:
    return v.destroy_handle(r.ah, "ah")


def resolve_ah(v, qph: QPHost, wr: SendWR) -> SendWR:
    """A UD WR with its AH object in place of the handle (the engine checks it)."""
    if not isinstance(qph.rcqp, UDQP):
        return wr
    if wr.ah is None:
        raise einval("a UD send WR needs wr.ud.ah")
    ah = v.get(wr.ah, "ah")
    if ah.pd is not qph.pd:
        raise einval(f"AH {wr.ah} is of another PD than the QP's")
    return dataclasses.replace(wr, ah=ah)


def create_datagram_qp(v, r: control.CreateQp, pd: PD, scq, rcq) -> QPHost:
    """A UD or UC QP (``r.qp_type``); EOPNOTSUPP for the mlx5dv create flags and an SRQ."""
    if r.create_flags or r.send_ops_flags:
        raise RDMAError("EOPNOTSUPP", "mlx5dv_create_qp create_flags and send_ops_flags "
                                      "are modelled on RC QPs only")
    if r.srq:
        raise RDMAError("EOPNOTSUPP", "ibv_create_qp: a UC or UD QP taking its receives "
                                      "from an SRQ is not modelled")
    cls: type[DatagramQP] = UDQP if r.qp_type == QpType.UD else UCQP
    qp = cls(pd, v.daemon.new_qpn(), sq_depth=r.max_send_wr, rq_depth=r.max_recv_wr,
             sq_sig_all=r.sq_sig_all, max_inline_data=r.max_inline_data)
    builder = MkeyConfigureBuilder(pd, 0, r.sq_sig_all)
    return QPHost(v.session, 0, pd.hca, pd, qp, scq, rcq, r.max_send_sge,
                  r.max_recv_sge, 0, builder, v.complete, v.qp_event)


HANDLERS = {
    control.CreateAh: op_create_ah,
    control.DestroyAh: op_destroy_ah,
}
