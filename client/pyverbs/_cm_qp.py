"""The QP of a pyverbs rdma_cm id (mixed into cmid.CMID): rdma_create_qp(3), which gives
the id a QP of its port space's type (RC for RDMA_PS_TCP, UD for RDMA_PS_UDP) and moves
it as librdmacm does, rdma_init_qp_attr(3), rdma_set_option(3)'s ACK timeout, and the
QP's queries."""

from __future__ import annotations

import errno

from . import cm_enums as ce
from . import enums as e
from ._cm_ud import ready_ud_qp, ud_qp_attr
from .pyverbs_error import PyverbsRDMAError

# The RTR's min_rnr_timer: the kernel's IB CM gives rdma_cm QPs 0 (cm_init_qp_rtr_attr),
# IBTA's code for the longest RNR NAK timer, 655.36 ms
_RNR_TIMER = 0
# The IB CM's local ACK timeout for a RoCE path: rdma_cm's packet lifetime 16 plus one,
# raised by local_ca_ack_delay 16 to 18 (cm_ack_timeout): 4.096 us * 2^18, about 1.07 s.
_ACK_TIMEOUT = 18
# the port spaces modelled, and the QP type of each (rdma_create_id(3))
QP_TYPE = {ce.RDMA_PS_TCP: e.IBV_QPT_RC, ce.RDMA_PS_UDP: e.IBV_QPT_UD}


def _fail(what: str, err: int) -> PyverbsRDMAError:
    return PyverbsRDMAError(what, err)


class IdQP:
    """Needs the id's ``context``, ``pd``, ``_ps`` (port space), ``_qp`` and, for an RC
    id, what the REQ / REP exchange gave (``_peer_qpn``, ``_peer_psn``, ``_dgid``,
    ``_rr``, ``_depth``, ``_retry``, ``_rnr``, ``_my_psn``)."""

    def create_qp(self, qp_init_attr, pd=None):
        """rdma_create_qp(3): a QP of the id's type (RC, UD for RDMA_PS_UDP) on the id's
        session (its PD, else a PD of the id), with CQs of its own when the attributes
        name none; an RC QP moved to INIT, a UD one to RTS."""
        from .cq import CQ, CompChannel
        from .qp import QP

        if self._qp is not None:
            raise _fail("Failed to create QP: the id has one", errno.EINVAL)
        ctx = self.context
        dev = getattr(self, "_dev", 0)
        if dev != ctx._dev_index:
            # the id's session opened the daemon's first device: a QP there could not
            # be the connection's, whose device the daemon chose by the address
            raise _fail(f"Failed to create QP: the id is on the daemon's device {dev}; "
                        "pyverbs CM ids use its first", errno.EOPNOTSUPP)
        if pd is not None and pd._ctx is not ctx:
            raise _fail("Failed to create QP: the PD is not of the id's context "
                        "(make it on CMID.context)", errno.EINVAL)
        want = QP_TYPE[self._ps]
        if qp_init_attr.qp_type not in (0, want):
            # rdma_create_qp: a QP of another type than the port space's
            raise _fail(f"Failed to create QP: type {int(qp_init_attr.qp_type)} on an id "
                        f"whose QPs are of type {int(want)}", errno.EOPNOTSUPP)
        qp_init_attr.qp_type = want
        self._pd = pd if pd is not None else self.pd
        if qp_init_attr.scq is None or qp_init_attr.rcq is None:
            self._cc = CompChannel(ctx)
        if qp_init_attr.scq is None:
            self._scq = CQ(ctx, max(1, qp_init_attr.cap.max_send_wr), None, self._cc)
            qp_init_attr.scq = self._scq
        if qp_init_attr.rcq is None:
            self._rcq = CQ(ctx, max(1, qp_init_attr.cap.max_recv_wr), None, self._cc)
            qp_init_attr.rcq = self._rcq
        self._send_cq, self._recv_cq = qp_init_attr.scq, qp_init_attr.rcq
        self._qp = QP(self._pd, qp_init_attr)
        if self._ud:
            ready_ud_qp(self._qp)
        else:
            self._move("INIT")

    def init_qp_attr(self, qp_state):
        """rdma_init_qp_attr(3): the attributes and mask that move the id's QP (or one
        of the program's) to INIT, RTR or RTS, as the library moves its own."""
        from . import qp as q
        from .addr import GID, AHAttr, GlobalRoute

        if self._ud:
            return ud_qp_attr(qp_state)
        a = q.QPAttr()
        a.qp_state = qp_state
        if qp_state == e.IBV_QPS_INIT:
            a.pkey_index, a.port_num = 0, 1
            # The kernel's: no remote access before a connection (rdma_cm's own INIT);
            # once the REQ or REP is known, the IB CM's (cm_init_qp_init_attr): remote
            # WRITE always, remote READ and atomics only when this side has responder
            # resources, which the peer's READs and atomics take.
            a.qp_access_flags = 0
            if self._peer_qpn:
                a.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
                if self._rr:
                    a.qp_access_flags |= (e.IBV_ACCESS_REMOTE_READ
                                          | e.IBV_ACCESS_REMOTE_ATOMIC)
            return a, (e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                       | e.IBV_QP_ACCESS_FLAGS)
        if qp_state not in (e.IBV_QPS_RTR, e.IBV_QPS_RTS) or not self._peer_qpn:
            raise _fail("Failed to init QP attr: INIT, or RTR / RTS once the REQ or REP "
                        "came", errno.EINVAL)
        if qp_state == e.IBV_QPS_RTR:
            # the peer's QP number and PSN, and the responder resources agreed on
            gid = GID()
            gid.raw = self._dgid
            a.ah_attr = AHAttr(is_global=1, port_num=1,
                               gr=GlobalRoute(dgid=gid, sgid_index=0, hop_limit=64))
            a.path_mtu = self._mtu()
            a.dest_qp_num, a.rq_psn = self._peer_qpn, self._peer_psn
            a.max_dest_rd_atomic = self._rr
            a.min_rnr_timer = _RNR_TIMER
            return a, (e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU
                       | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
                       | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
        a.sq_psn = self._my_psn
        a.timeout = getattr(self, "_ack_timeout", _ACK_TIMEOUT)
        a.retry_cnt, a.rnr_retry = self._retry, self._rnr
        a.max_rd_atomic = self._depth
        mask = (e.IBV_QP_STATE | e.IBV_QP_SQ_PSN | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                | e.IBV_QP_RNR_RETRY)
        # an initiator depth of 0 says no READ or atomic will go: the QP keeps its own
        return a, mask | (e.IBV_QP_MAX_QP_RD_ATOMIC if self._depth else 0)

    def set_option(self, level, optname, optval, optlen=0):
        """rdma_set_option(3): RDMA_OPTION_ID_ACK_TIMEOUT (the RTS timeout); the other
        options are not modelled."""
        if level != ce.RDMA_OPTION_ID or optname != ce.RDMA_OPTION_ID_ACK_TIMEOUT:
            raise _fail(f"rdma_set_option {level}/{optname} is not modelled",
                        errno.EOPNOTSUPP)
        if not 0 <= int(optval) <= 31:
            raise _fail("RDMA_OPTION_ID_ACK_TIMEOUT: 0..31", errno.EINVAL)
        self._ack_timeout = int(optval)

    def query_qp(self, attr_mask):
        """ibv_query_qp(3) of the id's QP: (QPAttr, QPInitAttr)."""
        return self._need_qp().query(attr_mask)

    def set_local_ece(self, ece):
        raise _fail("rdma_set_local_ece: ECE is not modelled", errno.EOPNOTSUPP)

    def get_remote_ece(self):
        raise _fail("rdma_get_remote_ece: ECE is not modelled", errno.EOPNOTSUPP)

    @property
    def qpn(self):
        return self._qp.qp_num if self._qp is not None else 0

    def _move(self, state: str):
        # INIT again before RTR, as librdmacm does: the connection's access flags
        self._qp.modify(*self.init_qp_attr(e.IBV_QPS_INIT))
        if state == "INIT":
            return
        self._qp.modify(*self.init_qp_attr(e.IBV_QPS_RTR))
        self._qp.modify(*self.init_qp_attr(e.IBV_QPS_RTS))

    def _mtu(self):
        try:
            return self.context.query_port(1).active_mtu
        except PyverbsRDMAError:
            return e.IBV_MTU_1024
