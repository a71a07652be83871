"""MR re-registration, ODP prefetch, CQ resizing, RDMA atomic write, QP caps and the
CQ clean of a QP reset, through the async client. Expected values are the man pages'
(ibv_rereg_mr(3), ibv_advise_mr(3), ibv_resize_cq(3), ibv_create_qp(3)) and bytes
computed here (an 8-byte little-endian store)."""

from __future__ import annotations

import asyncio
import struct

import pytest

import softhca.client as sh
from softhca.server.hosts import Limits

from e2e import Pair, make_side, rdma, sge, two_nodes

S = sh.IBV_WC_SUCCESS
LW = sh.IBV_ACCESS_LOCAL_WRITE
RW = LW | sh.IBV_ACCESS_REMOTE_WRITE
ODP = 1 << 6     # IBV_ACCESS_ON_DEMAND


async def refused(coro, errno: str) -> str:
    with pytest.raises(sh.RDMAError) as e:
        await coro
    assert e.value.errno_name == errno, e.value
    return e.value.message


async def restate(p: Pair) -> None:
    for side in (p.target, p.initiator):
        await side.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RESET))
    await p.initiator.qp.connect(p.target.qp.info())
    await p.target.qp.connect(p.initiator.qp.info())


async def test_rereg_access_refused_then_allowed(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(bytes(32), LW)
    src = await pair.initiator.reg_mr(b"0123456789abcdef")
    assert (await pair.write([sge(src)], mr.rkey, mr.addr)).status == sh.IBV_WC_REM_ACCESS_ERR
    await restate(pair)
    keys = (mr.lkey, mr.rkey)
    await mr.rereg(sh.IBV_REREG_MR_CHANGE_ACCESS, access=RW)
    assert (mr.lkey, mr.rkey) == keys
    assert (await pair.write([sge(src)], mr.rkey, mr.addr + 8)).status == S
    assert await mr.read() == bytes(8) + b"0123456789abcdef" + bytes(8)
    # And taken away again: refused from the next access on.
    await mr.rereg(sh.IBV_REREG_MR_CHANGE_ACCESS, access=LW)
    assert (await pair.write([sge(src)], mr.rkey, mr.addr)).status == sh.IBV_WC_REM_ACCESS_ERR


async def test_rereg_errors_and_pd_and_translation(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(bytes(32), RW)
    await refused(mr.rereg(0), "EINVAL")
    await refused(mr.rereg(8), "EINVAL")
    await refused(mr.rereg(sh.IBV_REREG_MR_CHANGE_PD, access=RW), "EINVAL")
    await refused(mr.rereg(sh.IBV_REREG_MR_CHANGE_ACCESS, access=sh.IBV_ACCESS_REMOTE_WRITE),
                  "EINVAL")
    await refused(mr.rereg(sh.IBV_REREG_MR_CHANGE_TRANSLATION, length=0), "EINVAL")
    # Nothing of the refusals changed the MR.
    src = await pair.initiator.reg_mr(b"abcdefgh")
    assert (await pair.write([sge(src)], mr.rkey, mr.addr)).status == S
    # A new translation: fresh zeroed memory of the new length at a new address.
    old = mr.addr
    await mr.rereg(sh.IBV_REREG_MR_CHANGE_TRANSLATION, length=4096)
    assert mr.length == 4096 and mr.addr != old and await mr.read(16) == bytes(16)
    assert (await pair.write([sge(src)], mr.rkey, mr.addr + 4088)).status == S
    assert await mr.read(8, 4088) == b"abcdefgh"
    # Another PD: the QP's PD no longer holds it.
    other = await t.ctx.alloc_pd()
    await mr.rereg(sh.IBV_REREG_MR_CHANGE_PD, pd=other)
    assert (await pair.write([sge(src)], mr.rkey, mr.addr)).status == sh.IBV_WC_REM_ACCESS_ERR
    await restate(pair)
    await mr.rereg(sh.IBV_REREG_MR_CHANGE_PD, pd=t.pd)
    assert (await pair.write([sge(src)], mr.rkey, mr.addr)).status == S
    # A bound window pins the MR.
    bindable = await t.reg_mr(64, LW | sh.IBV_ACCESS_MW_BIND)
    mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_1)
    await t.qp.bind_mw(mw, bindable, bindable.addr, 64, sh.IBV_ACCESS_REMOTE_WRITE)
    await t.send_wc()
    await refused(bindable.rereg(sh.IBV_REREG_MR_CHANGE_ACCESS, access=LW), "EBUSY")


async def test_advise_mr_prefetch(pair: Pair):
    pd = pair.target.pd
    odp = await pd.reg_mr(4096, LW | ODP)
    plain = await pd.reg_mr(4096, LW)
    for advice in (0, 1, 2):        # PREFETCH, PREFETCH_WRITE, PREFETCH_NO_FAULT
        await pd.advise_mr(advice, 1, [sge(odp, 1024, 512)])
    await refused(pd.advise_mr(1, 0, [sge(plain)]), "EINVAL")
    await refused(pd.advise_mr(0, 0, [sh.SGE(odp.addr + 4000, 200, odp.lkey)]), "EFAULT")
    await refused(pd.advise_mr(0, 2, [sge(odp)]), "EINVAL")
    await refused(pd.advise_mr(0, 0, []), "EINVAL")
    await refused(pd.advise_mr(7, 0, [sge(odp)]), "EOPNOTSUPP")
    ro = await pd.reg_mr(4096, ODP)
    await refused(pd.advise_mr(1, 0, [sge(ro)]), "EPERM")
    other = await pair.initiator.pd.reg_mr(64, LW | ODP)
    await refused(pd.advise_mr(0, 0, [sge(other)]), "EFAULT")
    # An ODP MR works for RDMA like any other.
    tgt = await pair.target.reg_mr(16, RW | ODP)
    src = await pair.initiator.reg_mr(b"on-demand paging")
    assert (await pair.write([sge(src)], tgt.rkey, tgt.addr)).status == S
    assert await tgt.read() == b"on-demand paging"


async def test_resize_cq_grow_and_shrink(pair: Pair):
    t, i = pair.target, pair.initiator
    cq = await i.ctx.create_cq(4)
    cap = sh.QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
    qp = await i.pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap))
    peer = await t.pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=t.scq, rcq=t.rcq,
                                              cap=cap))
    await qp.connect(peer.info())
    await peer.connect(qp.info())
    assert await cq.resize(12) == 12 == cq.cqe
    tgt = await t.reg_mr(64, RW)
    src = await i.reg_mr(b"x" * 8)
    for n in range(10):
        await qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], tgt.rkey, tgt.addr, n,
                                send_flags=sh.IBV_SEND_SIGNALED))
    # 10 completions arrive; a CQ of 4 would have overrun.
    wcs = await cq.poll_n(3)
    for _ in range(500):            # until the other 7 have come (held, not polled)
        if i.node._conn.available(cq.handle) == 7:
            break
        await asyncio.sleep(0.01)
    await refused(cq.resize(6), "EINVAL")           # 7 are held
    assert await cq.resize(7) == 7
    wcs += await cq.poll_n(7)
    assert [w.wr_id for w in wcs] == list(range(10)) and all(w.status == S for w in wcs)
    assert await cq.resize(1) == 1
    await refused(cq.resize(0), "EINVAL")
    await refused(cq.resize((1 << 22) + 1), "EINVAL")


async def test_atomic_write(pair: Pair):
    t, i = pair.target, pair.initiator
    tgt = await t.reg_mr(bytes(24), RW)
    value = 0x1122334455667788
    wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_ATOMIC_WRITE)
    wr.set_wr_rdma(tgt.rkey, tgt.addr + 8)
    wr.compare_add = value
    await i.qp.post_send(wr)
    (wc,) = await i.send_wc()
    assert (wc.status, wc.opcode) == (S, sh.IBV_WC_ATOMIC_WRITE)
    assert await tgt.read() == bytes(8) + struct.pack("<Q", value) + bytes(8)
    # With ibv_post_send: one 8-byte SGE as the source.
    src = await i.reg_mr(b"ATOMIC!!")
    wr = rdma(sh.IBV_WR_ATOMIC_WRITE, [sge(src)], tgt.rkey, tgt.addr + 16, 2,
              send_flags=sh.IBV_SEND_SIGNALED)
    await i.qp.post_send(wr)
    assert (await i.send_wc())[0].status == S
    assert await tgt.read(8, 16) == b"ATOMIC!!"
    # An unaligned address or a longer source is refused at post.
    for bad in (rdma(sh.IBV_WR_ATOMIC_WRITE, [sge(src)], tgt.rkey, tgt.addr + 4),
                rdma(sh.IBV_WR_ATOMIC_WRITE, [sge(src, 4)], tgt.rkey, tgt.addr)):
        await refused(i.qp.post_send(bad), "EINVAL")
    # An rkey without REMOTE_WRITE: a remote access error.
    ro = await t.reg_mr(8, LW | sh.IBV_ACCESS_REMOTE_READ)
    await i.qp.post_send(rdma(sh.IBV_WR_ATOMIC_WRITE, [sge(src)], ro.rkey, ro.addr, 3))
    assert (await i.send_wc())[0].status == sh.IBV_WC_REM_ACCESS_ERR
    assert await ro.read() == bytes(8)


async def test_qp_caps_above_the_device_are_einval():
    async with sh.embedded(limits=Limits(max_qp_wr=64)) as node:
        side = await make_side(node, max_wr=64)
        for cap in (dict(max_send_wr=65), dict(max_recv_wr=1 << 20), dict(max_send_sge=33),
                    dict(max_recv_sge=1 << 31), dict(max_inline_data=(1 << 16) + 1)):
            base = dict(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
            base.update(cap)
            msg = await refused(side.pd.create_qp(sh.QPInitAttr(
                qp_type=sh.IBV_QPT_RC, scq=side.scq, rcq=side.rcq, cap=sh.QPCap(**base))),
                "EINVAL")
            assert next(iter(cap)) in msg


async def test_reset_cleans_the_qps_completions():
    async with two_nodes() as p:
        i = p.initiator
        buf = await i.reg_mr(64)
        for n in range(3):
            await i.qp.post_recv(sh.RecvWR(wr_id=n, sg=[sge(buf)]))
        await i.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR))
        await i.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RESET))
        # The three flush completions went with the reset (libmlx5's CQ clean).
        assert await i.rcq.poll(4, timeout=0.2) == []
        await i.qp.connect(p.target.qp.info())
        await p.target.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RESET))
        await p.target.qp.connect(i.qp.info())
        src = await p.target.reg_mr(b"fresh")
        wcs = await p.send(p.target, [sge(src)], i, [sge(buf)])
        assert [w.status for w in wcs] == [S, S] and await buf.read(5) == b"fresh"


async def test_process_memory_with_the_embedded_daemon():
    """ibv_reg_mr of this process's memory: a peer's RDMA WRITE lands in the caller's
    own buffer (an mmap here, read back without softhca); rereg to another buffer
    moves it; a session without the in-process proof, or an unmapped range, is
    refused."""
    import ctypes
    import mmap

    async with two_nodes() as p:
        t = p.target
        first, second = mmap.mmap(-1, 8192), mmap.mmap(-1, 4096)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(first)) + 4096
        mr = await t.pd.reg_process_mr(addr, 4096, RW)
        assert (mr.addr, mr.length) == (addr, 4096)
        src = await p.initiator.reg_mr(b"into the caller's own buffer")
        assert (await p.write([sge(src)], mr.rkey, addr + 100)).status == S
        assert first[4196:4196 + 28] == b"into the caller's own buffer"
        assert first[:4096] == bytes(4096)          # nothing outside the registration
        addr2 = ctypes.addressof(ctypes.c_char.from_buffer(second))
        await mr.rereg(sh.IBV_REREG_MR_CHANGE_TRANSLATION, length=4096, addr=addr2)
        assert (await p.write([sge(src)], mr.rkey, addr2)).status == S
        assert second[:28] == b"into the caller's own buffer"
        await refused(t.pd.reg_process_mr(4096, 4096, RW), "EFAULT")
        # a range past 2^64 is no address range at all: EINVAL, as the kernel says of a
        # registration that wraps, and the same for rereg's new translation
        msg = await refused(t.pd.reg_process_mr((1 << 64) - 4096, 8192, RW), "EINVAL")
        assert "passes 2^64" in msg, msg
        msg = await refused(mr.rereg(sh.IBV_REREG_MR_CHANGE_TRANSLATION, length=8192,
                                     addr=(1 << 64) - 4096), "EINVAL")
        assert "passes 2^64" in msg, msg
        # The initiator's daemon is another object: its secret is not this one's.
        await refused(p.initiator.pd.reg_process_mr(addr, 64, RW,
                                                    secret=t.node.daemon.process_secret),
                      "EOPNOTSUPP")
        await refused(t.pd.reg_process_mr(addr, 64, RW, secret=bytes(32)), "EOPNOTSUPP")
        await mr.close()
