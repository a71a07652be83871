"""A post's reply folded into its pushed completion (server/post_reply.py): one signaled
WR of one packet posted to an idle send queue gets its reply in the same write as its
completion, so the application wakes once; every other post is answered at once. The
synchronous errors of ibv_post_send(3) stay exact, and no completion is lost or doubled.
"""

from __future__ import annotations

import asyncio

import softhca.client as sh

from e2e import rdma, two_nodes, whole


def available(side) -> int:
    """Completions of the side's send CQ the client holds and has not polled."""
    return side.node._conn.available(side.scq.handle)


async def test_the_completion_comes_with_the_reply_and_exactly_once():
    async with two_nodes() as pair:
        ini, tgt = pair.initiator, pair.target
        src, dst = await ini.reg_mr(64), await tgt.reg_mr(64)
        with_reply = 0
        for k in range(40):
            await ini.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr,
                                        wr_id=k, send_flags=sh.IBV_SEND_SIGNALED))
            # Held for at most HOLD_S, the reply normally leaves with the completion.
            with_reply += available(ini) == 1
            [wc] = await ini.scq.poll_n(1, 10.0)
            assert (wc.wr_id, wc.status) == (k, sh.IBV_WC_SUCCESS)
        # Without the fold none would be there yet: the reply left before the packet.
        assert with_reply >= 20, with_reply
        await asyncio.sleep(0.05)
        assert await ini.scq.poll(num_entries=16) == []


async def test_a_completion_that_is_late_does_not_hold_the_reply():
    # The peer QP does not exist: the WRITE is retried until RETRY_EXC_ERR (about 0.5 s
    # with timeout 14 and retry_cnt 2), far past the hold.
    async with two_nodes(connect=False) as pair:
        ini, tgt = pair.initiator, pair.target
        info = tgt.qp.info()
        ghost = sh.QPInfo(info.host, info.port, info.dev, (info.qp_num + 1) % (1 << 24),
                          info.psn)
        await ini.qp.connect(ghost, path_mtu=sh.IBV_MTU_1024, timeout=14, retry_cnt=2)
        src = await ini.reg_mr(64)
        await ini.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), 0x1234, 0, wr_id=9,
                                    send_flags=sh.IBV_SEND_SIGNALED))
        assert available(ini) == 0      # answered before its completion was made
        [wc] = await ini.scq.poll_n(1, 10.0)
        assert (wc.wr_id, wc.status) == (9, sh.IBV_WC_RETRY_EXC_ERR)
        await asyncio.sleep(0.05)
        assert await ini.scq.poll(num_entries=4) == []


async def test_a_refused_wr_still_fails_the_call_with_its_errno():
    async with two_nodes() as pair:
        ini, tgt = pair.initiator, pair.target
        src, dst = await ini.reg_mr(64), await tgt.reg_mr(64)
        nine = [sh.SGE(src.addr, 4, src.lkey)] * 9      # max_send_sge is 8
        try:
            await ini.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, nine, dst.rkey, dst.addr,
                                        wr_id=5, send_flags=sh.IBV_SEND_SIGNALED))
        except sh.RDMAError as e:
            assert e.errno_name == "EINVAL"
        else:
            raise AssertionError("a WR of 9 SGEs was posted")
        # Nothing was posted, so nothing completes; the QP goes on.
        await pair.write(whole(src), dst.rkey, dst.addr)
        await asyncio.sleep(0.05)
        assert await ini.scq.poll(num_entries=4) == []


async def test_a_wr_completed_at_once_is_there_when_the_post_returns():
    async with two_nodes() as pair:
        ini, tgt = pair.initiator, pair.target
        src, dst = await ini.reg_mr(64), await tgt.reg_mr(64)
        await ini.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR), sh.IBV_QP_STATE)
        await ini.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr,
                                    wr_id=6, send_flags=sh.IBV_SEND_SIGNALED))
        # In ERR the WR is flushed by the post itself: its completion was written first.
        assert available(ini) == 1
        [wc] = await ini.scq.poll(num_entries=4)
        assert (wc.wr_id, wc.status) == (6, sh.IBV_WC_WR_FLUSH_ERR)
        await asyncio.sleep(0.05)
        assert await ini.scq.poll(num_entries=4) == []
