"""rdma_verbs.h's helpers on an rdma_cm id (pyverbs' CMID methods): memory registered on
the id's PD, single-SGE work requests posted on its QP, and the blocking wait for the
next completion of its send or receive CQ."""

from __future__ import annotations

import errno

from ...protocol.cm_sidr import RDMA_UDP_QKEY
from . import enums as e
from .pyverbs_error import PyverbsRDMAError


class RdmaVerbs:
    """Mixed into CMID: needs ``pd``, ``_qp``, ``_send_cq`` and ``_recv_cq``."""

    def reg_msgs(self, size):
        return self._reg(size, e.IBV_ACCESS_LOCAL_WRITE)

    def reg_read(self, size):
        return self._reg(size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)

    def reg_write(self, size):
        return self._reg(size, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)

    def _reg(self, size, access):
        from .mr import MR

        return MR(self.pd, size, access)

    def post_recv(self, mr, length=None):
        from .wr import SGE, RecvWR

        sge = SGE(mr.buf, mr.length if length is None else length, mr.lkey)
        self._need_qp().post_recv(RecvWR(wr_id=0, num_sge=1, sg=[sge]))

    def _send(self, mr, length, opcode, flags, remote=None):
        from .wr import SGE, SendWR

        sge = SGE(mr.buf, mr.length if length is None else length, mr.lkey)
        wr = SendWR(wr_id=0, opcode=opcode, num_sge=1, sg=[sge], send_flags=flags)
        if remote is not None:
            wr.set_wr_rdma(remote[1], remote[0])
        self._need_qp().post_send(wr)

    def post_send(self, mr, flags=e.IBV_SEND_SIGNALED, length=None):
        self._send(mr, length, e.IBV_WR_SEND, flags)

    def post_read(self, mr, length, remote_addr, rkey, flags=e.IBV_SEND_SIGNALED):
        self._send(mr, length, e.IBV_WR_RDMA_READ, flags, (remote_addr, rkey))

    def post_write(self, mr, length, remote_addr, rkey, flags=e.IBV_SEND_SIGNALED):
        self._send(mr, length, e.IBV_WR_RDMA_WRITE, flags, (remote_addr, rkey))

    def post_ud_send(self, mr, ah, rqpn=0, flags=e.IBV_SEND_SIGNALED, length=None):
        """rdma_post_ud_send: a SEND on the id's UD QP to QP ``rqpn`` through ``ah``,
        with the Q_Key of the UDP port space (RDMA_UDP_QKEY), as librdmacm's does."""
        from .wr import SGE, SendWR

        qp = self._need_qp()
        if qp.qp_type != e.IBV_QPT_UD:
            raise PyverbsRDMAError("rdma_post_ud_send: the id's QP is not UD",
                                   errno.EINVAL)
        sge = SGE(mr.buf, length or mr.length, mr.lkey)
        wr = SendWR(wr_id=0, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags)
        wr.set_wr_ud(ah, rqpn, RDMA_UDP_QKEY)
        qp.post_send(wr)

    def _need_qp(self):
        if self._qp is None:
            raise PyverbsRDMAError("the id has no QP (create_qp)", errno.EINVAL)
        return self._qp

    def get_send_comp(self):
        return self._comp(self._send_cq)

    def get_recv_comp(self):
        return self._comp(self._recv_cq)

    def _comp(self, cq):
        """rdma_get_send_comp / rdma_get_recv_comp: poll, else arm and wait for the
        CQ's event, then poll again."""
        self._need_qp()
        while True:
            n, wcs = cq.poll()
            if n:
                return wcs[0]
            if cq.comp_channel is None:
                continue
            cq.req_notify()
            n, wcs = cq.poll()
            if n:
                return wcs[0]
            cq.comp_channel.get_cq_event(cq)
            cq.ack_events(1)
