"""Memory windows, rereg_mr, resize_cq, atomic write, the GID table and
query_data_in_order through softhca's pyverbs (the shapes rdma-core's pyverbs gives:
MW, MWBind, MWBindInfo, SendWR.set_bind_wr, QPEx.wr_atomic_write)."""

from __future__ import annotations

import errno
import struct

import pytest
from pyverbs_rc import to_rts

import softhca.client.pyverbs.enums as e
from softhca.client.pyverbs.base import inc_rkey
from softhca.client.pyverbs.cq import CQ
from softhca.client.pyverbs.device import Context
from softhca.client.pyverbs.mr import MR, MW, MWBind, MWBindInfo
from softhca.client.pyverbs.pd import PD
from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
from softhca.client.pyverbs.qp import QP, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from softhca.client.pyverbs.wr import SGE, SendWR

ALL_REMOTE = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
              | e.IBV_ACCESS_REMOTE_ATOMIC)


def _qp(ctx, pd, cq, ex=False):
    if ex:
        ops = e.IBV_QP_EX_WITH_RDMA_WRITE | e.IBV_QP_EX_WITH_ATOMIC_WRITE \
            | e.IBV_QP_EX_WITH_BIND_MW
        attr = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8), pd=pd,
                            comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                            send_ops_flags=ops)
        qp = QPEx(ctx, attr)
    else:
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)))
    return qp


def _wait(cq):
    for _ in range(2000):
        n, wcs = cq.poll()
        if n:
            return wcs[0]
    raise AssertionError("no completion")


@pytest.fixture
def players():
    a, b = Context(name="mlx5_0"), Context(name="mlx5_0")
    try:
        apd, bpd = PD(a), PD(b)
        acq, bcq = CQ(a, 32, None, None, 0), CQ(b, 32, None, None, 0)
        aqp, bqp = _qp(a, apd, acq, ex=True), _qp(b, bpd, bcq)
        to_rts(a, aqp, bqp, ALL_REMOTE)
        to_rts(b, bqp, aqp, ALL_REMOTE)
        yield (a, apd, acq, aqp), (b, bpd, bcq, bqp)
    finally:
        a.close()
        b.close()


def _write(qp, cq, src, rkey, addr):
    wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                sg=[SGE(src.buf, src.length, src.lkey)])
    wr.set_wr_rdma(rkey, addr)
    qp.post_send(wr)
    return _wait(cq).status


def test_type2_window_through_pyverbs(players):
    (a, apd, acq, aqp), (b, bpd, bcq, bqp) = players
    mr = MR(bpd, 64, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND)
    mw = MW(bpd, e.IBV_MW_TYPE_2)
    wr = SendWR(opcode=e.IBV_WR_BIND_MW)
    wr.set_bind_wr(mw, MWBindInfo(mr, mr.buf + 16, 32, e.IBV_ACCESS_REMOTE_WRITE))
    assert wr.rkey == inc_rkey(mw.rkey) == (mw.rkey & ~0xFF) | ((mw.rkey + 1) & 0xFF)
    bqp.post_send(wr)
    wc = _wait(bcq)
    assert (wc.status, wc.opcode) == (e.IBV_WC_SUCCESS, e.IBV_WC_BIND_MW)
    src = MR(apd, 8, e.IBV_ACCESS_LOCAL_WRITE)
    src.write(b"windowed", 8)
    assert _write(aqp, acq, src, wr.rkey, mr.buf + 24) == e.IBV_WC_SUCCESS
    assert mr.read(64, 0) == bytes(24) + b"windowed" + bytes(32)
    mw.close()
    assert _write(aqp, acq, src, wr.rkey, mr.buf + 24) == e.IBV_WC_REM_ACCESS_ERR


def test_type1_bind_mw_and_the_builders(players):
    (a, apd, acq, aqp), (b, bpd, bcq, bqp) = players
    mr = MR(apd, 64, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_MW_BIND)
    mw = MW(apd, e.IBV_MW_TYPE_1)
    first = mw.rkey
    aqp.bind_mw(mw, MWBind(MWBindInfo(mr, mr.buf, 64, e.IBV_ACCESS_REMOTE_WRITE),
                           e.IBV_SEND_SIGNALED, wr_id=9))
    assert mw.rkey == inc_rkey(first)
    wc = _wait(acq)
    assert (wc.status, wc.wr_id) == (e.IBV_WC_SUCCESS, 9)
    # QPEx builders: a type 2 bind whose new key is the consumer's, and an atomic write.
    mw2 = MW(apd, e.IBV_MW_TYPE_2)
    key = (mw2.rkey & ~0xFF) | 0xC3
    aqp.wr_start()
    aqp.wr_id, aqp.wr_flags = 4, e.IBV_SEND_SIGNALED
    aqp.wr_bind_mw(mw2, key, MWBindInfo(mr, mr.buf, 8, e.IBV_ACCESS_REMOTE_READ))
    aqp.wr_complete()
    assert _wait(acq).status == e.IBV_WC_SUCCESS
    target = MR(bpd, 16, ALL_REMOTE)
    aqp.wr_start()
    aqp.wr_id, aqp.wr_flags = 5, e.IBV_SEND_SIGNALED
    aqp.wr_atomic_write(target.rkey, target.buf + 8, struct.pack("<Q", 0xDEADBEEF01020304))
    aqp.wr_complete()
    wc = _wait(acq)
    assert (wc.status, wc.opcode) == (e.IBV_WC_SUCCESS, e.IBV_WC_ATOMIC_WRITE)
    assert target.read(16, 0) == bytes(8) + (0xDEADBEEF01020304).to_bytes(8, "little")
    with pytest.raises(PyverbsRDMAError) as ex:
        MW(apd, 3)
    assert ex.value.error_code == errno.EINVAL


def test_rereg_resize_and_data_in_order(players):
    (a, apd, acq, aqp), (b, bpd, bcq, bqp) = players
    tgt = MR(bpd, 16, e.IBV_ACCESS_LOCAL_WRITE)
    src = MR(apd, 8, e.IBV_ACCESS_LOCAL_WRITE)
    tgt.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, access=e.IBV_ACCESS_LOCAL_WRITE
              | e.IBV_ACCESS_REMOTE_WRITE)
    src.write(b"reregged", 8)
    assert _write(aqp, acq, src, tgt.rkey, tgt.buf) == e.IBV_WC_SUCCESS
    assert tgt.read(8, 0) == b"reregged"
    # A translation to an address that is not memory of this process.
    with pytest.raises(PyverbsRDMAError) as ex:
        tgt.rereg(e.IBV_REREG_MR_CHANGE_TRANSLATION, addr=0x1000, length=16)
    assert ex.value.error_code == errno.EFAULT
    acq.resize(64)
    assert acq.cqe == 64
    # libibverbs' answer when the provider has no query_qp_data_in_order op.
    assert aqp.query_data_in_order(e.IBV_WR_RDMA_WRITE) == 0


def test_gid_table():
    with Context(name="mlx5_0") as ctx:
        size = ctx.query_port(1).gid_tbl_len
        entries = ctx.query_gid_table(size)
        assert size == 16 and 2 <= len(entries) < size
        raws = [ctx.query_gid(1, i).raw for i in range(size)]
        # The last populated entry is ::ffff:127.0.0.1 (the embedded daemon's address).
        assert raws[len(entries) - 1] == bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
        assert raws[len(entries):] == [bytes(16)] * (size - len(entries))
        assert [x.gid_index for x in entries] == list(range(len(entries)))
        assert all(x.gid_type == e.IBV_GID_TYPE_ROCE_V2 for x in entries)
        for index, code in ((len(entries), errno.ENODATA), (size, errno.EINVAL)):
            with pytest.raises(PyverbsRDMAError) as ex:
                ctx.query_gid_ex(1, index)
            assert ex.value.error_code == code
        assert ctx.query_gid_ex(1, 1).gid_index == 1


def test_mr_of_process_memory(players):
    """MR(pd, length, access, address=) with the embedded daemon: the peer's WRITE is
    read back from the process's buffer with ctypes, not through softhca."""
    import ctypes

    from softhca.client.pyverbs.mem_alloc import free, posix_memalign

    (a, apd, acq, aqp), (b, bpd, bcq, bqp) = players
    addr = posix_memalign(4096, 4096)
    try:
        mr = MR(bpd, 4096, ALL_REMOTE, address=addr)
        assert mr.buf == addr
        src = MR(apd, 8, e.IBV_ACCESS_LOCAL_WRITE)
        src.write(b"process!", 8)
        assert _write(aqp, acq, src, mr.rkey, addr + 64) == e.IBV_WC_SUCCESS
        assert ctypes.string_at(addr + 64, 8) == b"process!"
        mr.close()
    finally:
        free(addr)
