"""pyverbs.wr: scatter/gather entries and send/receive work requests."""

from __future__ import annotations

import sys

from ...protocol.attrs import SGE as _SGE
from .. import api
from . import enums as e
from .base import PyverbsObject
from .pyverbs_error import PyverbsUserError


def be32_field_to_host(raw: int) -> int:
    """The value of a ``__be32`` field whose memory holds ``raw`` as a host integer:
    pyverbs hands imm_data over as the C field's bits (the tests apply htonl/ntohl)."""
    return int.from_bytes((raw & 0xFFFFFFFF).to_bytes(4, sys.byteorder), "big")


def host_to_be32_field(value: int) -> int:
    return int.from_bytes((value & 0xFFFFFFFF).to_bytes(4, "big"), sys.byteorder)


class SGE(PyverbsObject):
    """struct ibv_sge"""

    def __init__(self, addr, length, lkey):
        super().__init__()
        self.addr, self.length, self.lkey = addr, length, lkey

    def _attr(self) -> _SGE:
        return _SGE(int(self.addr), int(self.length), int(self.lkey))

    def __str__(self):
        return f"SGE(addr={self.addr:#x}, length={self.length}, lkey={self.lkey:#x})"


def _sges(sg, num_sge, what):
    sg = list(sg or [])
    if num_sge > len(sg):
        raise PyverbsUserError(f"{what}: num_sge {num_sge} but {len(sg)} SGEs given")
    return sg


class RecvWR(PyverbsObject):
    """struct ibv_recv_wr (``next_wr`` chains several into one post)."""

    def __init__(self, wr_id=0, num_sge=0, sg=None, next_wr=None):
        super().__init__()
        self.wr_id = wr_id
        self.sg = _sges(sg, num_sge, "RecvWR")
        self.num_sge = num_sge
        self.next_wr = next_wr

    def _chain(self):
        wr = self
        while wr is not None:
            yield wr
            wr = wr.next_wr


def recv_wrs(wr, ctx) -> list[api.RecvWR]:
    """What ibv_post_recv and ibv_post_srq_recv post: ``wr`` (a RecvWR) and the WRs
    chained to it, each with its first ``num_sge`` SGEs, once ``ctx`` is open."""
    if not isinstance(wr, RecvWR):
        raise PyverbsUserError("post_recv takes a RecvWR")
    ctx._check()
    return [api.RecvWR(wr_id=w.wr_id, sg=[s._attr() for s in w.sg[:w.num_sge]])
            for w in wr._chain()]


class SendWR(PyverbsObject):
    """struct ibv_send_wr. ``imm_data`` is the C field's ``__be32`` bits; as in C it shares
    its storage with ``invalidate_rkey`` (LOCAL_INV and SEND_WITH_INV read it from there)."""

    def __init__(self, wr_id=0, opcode=e.IBV_WR_SEND, num_sge=0, imm_data=0, sg=None,
                 send_flags=e.IBV_SEND_SIGNALED, next_wr=None):
        super().__init__()
        self.wr_id = wr_id
        self.opcode = opcode
        self.sg = _sges(sg, num_sge, "SendWR")
        self.num_sge = num_sge
        self.imm_data = imm_data
        self.send_flags = send_flags
        self.next_wr = next_wr
        self.rkey = 0
        self.remote_addr = 0
        self.compare_add = 0
        self.swap = 0
        # wr.ud: the AH, remote QPN and remote Q_Key (set_wr_ud).
        self.ah = None
        self.remote_qpn = 0
        self.remote_qkey = 0
        self._unsupported = None
        self._bind = None

    @property
    def invalidate_rkey(self):
        return self.imm_data

    @invalidate_rkey.setter
    def invalidate_rkey(self, val):
        self.imm_data = val

    def set_wr_rdma(self, rkey, addr):
        self.rkey, self.remote_addr = rkey, addr

    def set_wr_atomic(self, rkey, addr, compare_add, swap=0):
        self.rkey, self.remote_addr, self.compare_add, self.swap = rkey, addr, compare_add, swap

    def set_wr_ud(self, ah, rqpn, rqkey=0):
        self.ah, self.remote_qpn, self.remote_qkey = ah, rqpn, rqkey

    def set_qp_type_xrc(self, remote_srqn):
        self._unsupported = "XRC work requests"

    def set_bind_wr(self, mw, bind_info):
        """bind_mw of an IBV_WR_BIND_MW: ``mw``, its new key ibv_inc_rkey(mw.rkey) (read
        back as ``rkey``), ``bind_info`` (an MWBindInfo)."""
        from .base import inc_rkey
        from .mw import bind_fields

        self._bind = bind_fields(mw, bind_info)
        self.rkey = inc_rkey(mw.rkey)

    def _chain(self):
        wr = self
        while wr is not None:
            yield wr
            wr = wr.next_wr
