"""Shared receive queues through the async client: one SRQ feeding four RC QPs, its
limit event, its bounds, and another session's SRQ out of reach.

Expected values come from ibv_create_srq(3) / ibv_modify_srq(3) / ibv_post_srq_recv(3):
receives are taken in the order posted, whichever QP a message arrives on; the limit
event comes once, when fewer WRs than the limit remain, and disarms the limit (query
answers 0); a QP created with an SRQ has no receive queue of its own.
"""

from __future__ import annotations

import pytest

import softhca.client as sh
from softhca.protocol.errors import RDMAError

from e2e import TIMEOUT, make_side

SLOT = 64           # bytes of each receive buffer
POSTED = 16         # receives posted on the SRQ
LIMIT = 10          # the armed limit
QPS = 4
PER_QP = 3          # messages each initiator QP sends


async def _srq_side(node: sh.Node, srq_max_wr: int = POSTED):
    ctx = await node.open_device("mlx5_0")
    pd = await ctx.alloc_pd()
    cq = await ctx.create_cq(256)
    srq = await pd.create_srq(max_wr=srq_max_wr, max_sge=1)
    qps = [await pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq,
                                            cap=sh.QPCap(max_send_wr=4, max_recv_wr=1)))
           for _ in range(QPS)]
    return ctx, pd, cq, srq, qps


async def test_an_srq_shared_by_four_qps_and_its_limit_event():
    async with sh.embedded() as tnode, sh.embedded() as inode:
        ctx, pd, cq, srq, tqps = await _srq_side(tnode)
        mr = await pd.reg_mr(POSTED * SLOT, sh.IBV_ACCESS_LOCAL_WRITE)
        await srq.post_recv([sh.RecvWR(wr_id=i, sg=[sh.SGE(mr.addr + i * SLOT, SLOT, mr.lkey)])
                             for i in range(POSTED)])
        senders = [await make_side(inode) for _ in range(QPS)]
        for s, qp in zip(senders, tqps, strict=True):
            await s.qp.connect(qp.info())
            await qp.connect(s.qp.info())
        await srq.modify(srq_limit=LIMIT)
        assert (await srq.query()) == {"max_wr": POSTED, "max_sge": 1, "srq_limit": LIMIT}

        # Messages round-robin over the four QPs; each is waited for, so the n-th message
        # takes the n-th receive posted (wr_id n) whichever QP it came on.
        sent = []
        for n in range(QPS * PER_QP):
            k = n % QPS
            msg = f"message {n} on QP {k}".encode()
            src = await senders[k].reg_mr(msg)
            await senders[k].qp.post_send(sh.SendWR(
                wr_id=n, opcode=sh.IBV_WR_SEND, send_flags=sh.IBV_SEND_SIGNALED,
                sg=[sh.SGE(src.addr, len(msg), src.lkey)]))
            assert (await senders[k].send_wc())[0].status == sh.IBV_WC_SUCCESS
            wc = (await cq.poll_n(1, TIMEOUT))[0]
            assert (wc.status, wc.wr_id, wc.qp_num, wc.byte_len) == \
                (sh.IBV_WC_SUCCESS, n, tqps[k].qp_num, len(msg))
            sent.append(msg)
            left = POSTED - (n + 1)
            ev = await ctx.get_async_event(timeout=0.2 if left == LIMIT - 1 else 0)
            if left == LIMIT - 1:
                # The first take that left fewer than LIMIT: the event, once.
                assert ev is not None and ev.event_type == sh.IBV_EVENT_SRQ_LIMIT_REACHED
                assert ev.srq is srq and ev.qp is None
                await ev.ack()
                assert (await srq.query())["srq_limit"] == 0
            else:
                assert ev is None, (n, ev)
        data = await mr.read()
        for n, msg in enumerate(sent):
            assert data[n * SLOT:n * SLOT + len(msg)] == msg

        # A QP of an SRQ has no receive queue of its own; the SRQ outlives no QP of it.
        with pytest.raises(RDMAError) as e:
            await tqps[0].post_recv(sh.RecvWR(wr_id=99, sg=[sh.SGE(mr.addr, SLOT, mr.lkey)]))
        assert e.value.errno_name == "EINVAL"
        with pytest.raises(RDMAError) as e:
            await srq.close()
        assert e.value.errno_name == "EBUSY"
        for qp in tqps:
            await qp.close()
        await srq.close()


async def test_srq_bounds_are_refused_before_anything_changes():
    async with sh.embedded() as node:
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        max_srq_wr = (await ctx.query_device())["max_srq_wr"]
        for max_wr, errno_name in ((max_srq_wr + 1, "EINVAL"), (0, "EPROTO"),
                                   ((1 << 16) + 1, "EPROTO")):
            with pytest.raises(RDMAError) as e:
                await pd.create_srq(max_wr=max_wr)
            assert e.value.errno_name == errno_name, max_wr
        srq = await pd.create_srq(max_wr=4)
        mr = await pd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE)
        wr = sh.RecvWR(wr_id=1, sg=[sh.SGE(mr.addr, 64, mr.lkey)])
        await srq.post_recv([wr] * 3)
        for kw in ({"srq_limit": 4}, {"max_wr": 2}, {"max_wr": max_srq_wr + 1},
                   {"max_wr": 8, "srq_limit": 8}):
            with pytest.raises(RDMAError) as e:
                await srq.modify(**kw)
            assert e.value.errno_name == "EINVAL", kw
        assert await srq.query() == {"max_wr": 4, "max_sge": 1, "srq_limit": 0}
        await srq.post_recv(wr)
        with pytest.raises(RDMAError) as e:
            await srq.post_recv(wr)
        assert e.value.errno_name == "ENOMEM"
        await srq.modify(max_wr=6)
        await srq.post_recv([wr, wr])
        with pytest.raises(RDMAError) as e:
            await srq.post_recv(sh.RecvWR(wr_id=2, sg=[sh.SGE(mr.addr, 32, mr.lkey)] * 2))
        assert e.value.errno_name == "EINVAL"


async def test_another_sessions_srq_is_out_of_reach():
    async with sh.embedded() as a:
        ctx = await a.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        srq = await pd.create_srq(max_wr=4)
        async with await sh.connect(a.daemon.address) as b:
            bctx = await b.open_device("mlx5_0")
            bpd = await bctx.alloc_pd()
            cq = await bctx.create_cq(16)
            for verb, kw in (("post_srq_recv", {"wrs": [{"wr_id": 1, "sg": []}]}),
                             ("query_srq", {}), ("modify_srq", {"mask": 2, "srq_limit": 1}),
                             ("destroy_srq", {})):
                with pytest.raises(RDMAError) as e:
                    await b.request(verb, srq=srq.handle, **kw)
                assert e.value.errno_name == "ENOENT", verb
            with pytest.raises(RDMAError) as e:
                await bpd.create_qp(sh.QPInitAttr(scq=cq, rcq=cq, srq=srq))
            assert e.value.errno_name == "ENOENT"
        assert await srq.query() == {"max_wr": 4, "max_sge": 1, "srq_limit": 0}


async def test_an_srq_qp_needs_no_receive_caps_and_datagram_qps_take_none():
    # ibv_create_qp(3): with an SRQ, cap.max_recv_wr and max_recv_sge are ignored (0 is
    # fine); a UC or UD QP on an SRQ is not modelled here, so it is EOPNOTSUPP, never a
    # QP that silently receives on a queue of its own.
    async with sh.embedded() as node:
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(16)
        srq = await pd.create_srq(max_wr=4)
        qp = await pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq,
                                              cap=sh.QPCap(max_send_wr=4, max_recv_wr=0,
                                                           max_recv_sge=0)))
        await qp.close()
        for qp_type in (sh.IBV_QPT_UC, sh.IBV_QPT_UD):
            with pytest.raises(RDMAError) as ex:
                await pd.create_qp(sh.QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, srq=srq,
                                                 cap=sh.QPCap(max_send_wr=4)))
            assert ex.value.errno_name == "EOPNOTSUPP", ex.value
