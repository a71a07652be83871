"""UD and UC through softhca's pyverbs, between two contexts of one device, as rdma-core's
tests/base.py sets them up (QPAttr with qkey, AHAttr with a GlobalRoute to the peer's
GID, SendWR.set_wr_ud). The GRH is checked against an IPv6 header packed here from the
GIDs query_gid gives (RFC 8200 layout; UDP 8 + BTH 12 + DETH 8 + payload + ICRC 4)."""

from __future__ import annotations

import errno
import struct

import pytest

import softhca.client.pyverbs.enums as e
from softhca.client.pyverbs.addr import AH, AHAttr, GlobalRoute
from softhca.client.pyverbs.cq import CQ
from softhca.client.pyverbs.device import Context
from softhca.client.pyverbs.mr import MR
from softhca.client.pyverbs.pd import PD
from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
from softhca.client.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from softhca.client.pyverbs.wr import SGE, RecvWR, SendWR

QKEY = 0x1EE7


def _poll(cq, n=1):
    got = []
    for _ in range(2000):
        k, wcs = cq.poll(n - len(got))
        got += wcs[:k]
        if len(got) >= n:
            return got
    raise AssertionError(f"{len(got)} of {n} completions")


def _player(ctx, qp_type):
    pd = PD(ctx)
    cq = CQ(ctx, 16, None, None, 0)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    attr = QPAttr(qkey=QKEY, port_num=1, qp_access_flags=e.IBV_ACCESS_REMOTE_WRITE)
    qp = QP(pd, QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, cap=QPCap(4, 4)), attr)
    return pd, cq, mr, qp


def _ah(pd, ctx, tclass=0, hop=1):
    gr = GlobalRoute(dgid=ctx.query_gid(1, 0), sgid_index=0, traffic_class=tclass,
                     hop_limit=hop)
    return AH(pd, attr=AHAttr(port_num=1, is_global=1, gr=gr))


def test_ud_ping_pong_through_pyverbs():
    a, b = Context(name="mlx5_0"), Context(name="mlx5_0")
    try:
        apd, acq, amr, aqp = _player(a, e.IBV_QPT_UD)
        bpd, bcq, bmr, bqp = _player(b, e.IBV_QPT_UD)
        assert aqp.qp_state == e.IBV_QPS_RTS       # pyverbs moves a UD QP to RTS
        ah = _ah(apd, b, tclass=0x10, hop=5)
        bqp.post_recv(RecvWR(wr_id=3, num_sge=1, sg=[SGE(bmr.buf, 40 + 64, bmr.lkey)]))
        amr.write(b"u" * 61, 61)
        wr = SendWR(wr_id=4, num_sge=1, sg=[SGE(amr.buf, 61, amr.lkey)])
        wr.set_wr_ud(ah, bqp.qp_num, QKEY)
        aqp.post_send(wr)
        (sw,) = _poll(acq)
        assert sw.status == e.IBV_WC_SUCCESS and sw.wr_id == 4
        (rw,) = _poll(bcq)
        assert rw.status == e.IBV_WC_SUCCESS and rw.byte_len == 101
        assert rw.src_qp == aqp.qp_num and rw.wc_flags & e.IBV_WC_GRH
        want = struct.pack(">IHBB", (6 << 28) | (0x10 << 20), 8 + 12 + 8 + 64 + 4, 17, 5) \
            + a.query_gid(1, 0).raw + b.query_gid(1, 0).raw
        assert bmr.read(101, 0) == want + b"u" * 61
        # The reply: AH(pd, wc=, grh=<the receive buffer's address>, port_num=).
        back = AH(bpd, wc=rw, grh=bmr.buf, port_num=1)
        aqp.post_recv(RecvWR(wr_id=5, num_sge=1, sg=[SGE(amr.buf + 1024, 64, amr.lkey)]))
        bmr.write(b"pong", 4, 2048)
        wr = SendWR(wr_id=6, num_sge=1, sg=[SGE(bmr.buf + 2048, 4, bmr.lkey)])
        wr.set_wr_ud(back, rw.src_qp, QKEY)
        bqp.post_send(wr)
        (pw,) = [w for w in _poll(acq) if w.wr_id == 5]
        assert pw.src_qp == bqp.qp_num and amr.read(4, 1024 + 40) == b"pong"
        ah.close()
        with pytest.raises(PyverbsRDMAError) as ex:
            aqp.post_send(wr)       # an AH of b's PD on a's QP
        assert ex.value.error_code in (errno.EINVAL, errno.ENOENT)
    finally:
        a.close()
        b.close()


def test_uc_write_through_pyverbs():
    a, b = Context(name="mlx5_0"), Context(name="mlx5_0")
    try:
        _, acq, amr, aqp = _player(a, e.IBV_QPT_UC)
        _, bcq, bmr, bqp = _player(b, e.IBV_QPT_UC)
        for ctx, qp, peer in ((a, aqp, bqp), (b, bqp, aqp)):
            attr = QPAttr(port_num=1, path_mtu=e.IBV_MTU_256,
                          qp_access_flags=e.IBV_ACCESS_REMOTE_WRITE)
            attr.ah_attr = AHAttr(is_global=1, port_num=1,
                                  gr=GlobalRoute(dgid=ctx.query_gid(1, 0)))
            attr.dest_qp_num, attr.rq_psn, attr.sq_psn = peer.qp_num, 0, 0
            qp.to_rts(attr)
        amr.write(bytes(range(256)) * 3, 768)
        wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(amr.buf, 700, amr.lkey)])
        wr.set_wr_rdma(bmr.rkey, bmr.buf + 100)
        aqp.post_send(wr)
        assert _poll(acq)[0].status == e.IBV_WC_SUCCESS
        for _ in range(200):
            if bmr.read(700, 100) == (bytes(range(256)) * 3)[:700]:
                break
        assert bmr.read(700, 100) == (bytes(range(256)) * 3)[:700]
    finally:
        a.close()
        b.close()
