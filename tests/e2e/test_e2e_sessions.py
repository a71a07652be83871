"""Sessions own their objects (docs/architecture.md, control plane).

A second session on the same daemon cannot name the first one's objects, cannot
use its lkeys, and reaches its memory only as a remote peer with a valid rkey
carrying the right access. When a session disconnects, its objects are destroyed,
as when a process exits, and the peers of its QPs see their WRs retried, then
RETRY_EXC_ERR and the rest flushed, as verbs say for a peer that went away.
"""

from __future__ import annotations

import asyncio

import pytest

import softhca.client as sh

from e2e import connect_pair, make_side, rdma, sge, whole


async def test_handles_are_per_session():
    async with sh.embedded() as a:
        ctx = await a.open_device()
        pd = await ctx.alloc_pd()
        mr = await pd.reg_mr(4096, sh.IBV_ACCESS_LOCAL_WRITE)
        await mr.write(b"secret")
        async with await sh.connect(a.address) as b:
            # b has created nothing: a's handle numbers name nothing in b's session.
            for verb, fields in [("mr_read", {"mr": mr.handle, "offset": 0, "length": 6}),
                                 ("alloc_pd", {"ctx": ctx.handle}),
                                 ("dereg_mr", {"mr": mr.handle})]:
                with pytest.raises(sh.RDMAError) as e:
                    await b.request(verb, **fields)
                assert e.value.errno_name == "ENOENT"
                assert "of this session" in e.value.message
        assert await mr.read(6) == b"secret", "a's MR survived b's attempts"


async def test_another_sessions_lkey_is_refused_loc_prot_err():
    async with sh.embedded() as a, sh.embedded() as peer:
        victim_ctx = await a.open_device()
        victim = await (await victim_ctx.alloc_pd()).reg_mr(4096, sh.IBV_ACCESS_LOCAL_WRITE)
        await victim.write(b"A" * 4096)
        async with await sh.connect(a.address) as b:
            sb, sp = await make_side(b), await make_side(peer)
            await connect_pair(sb, sp)
            dst = await sp.reg_mr(4096)
            await sp.qp.post_recv(sh.RecvWR(wr_id=1, sg=whole(dst)))
            # b names a's MR by its lkey in its own SEND: a key of another PD.
            await sb.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND,
                                            sg=[sh.SGE(victim.addr, 4096, victim.lkey)]))
            (wc,) = await sb.scq.poll_n(1, 10)
            assert wc.status == sh.IBV_WC_LOC_PROT_ERR
            assert await dst.read() == bytes(4096), "nothing of a's memory left the node"
            # And b cannot configure an MKEY over a's MR either.
            mkey = await sb.pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 1)
            with pytest.raises(sh.RDMAError) as e:
                await sb.configure(mkey, access=sh.IBV_ACCESS_LOCAL_WRITE,
                                   sges=[sh.SGE(victim.addr, 4096, victim.lkey)])
            assert e.value.errno_name == "EINVAL"


async def test_remote_access_only_through_a_valid_rkey_with_the_access():
    async with sh.embedded() as tnode, sh.embedded() as inode:
        t, i = await make_side(tnode), await make_side(inode)
        await connect_pair(t, i)
        readable = await t.reg_mr(b"R" * 256, sh.IBV_ACCESS_LOCAL_WRITE
                                  | sh.IBV_ACCESS_REMOTE_READ)
        dst = await i.reg_mr(256)
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_READ, whole(dst), readable.rkey,
                                  readable.addr, wr_id=1))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_SUCCESS and await dst.read() == b"R" * 256
        # The same rkey does not grant REMOTE_WRITE.
        src = await i.reg_mr(b"W" * 256)
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), readable.rkey,
                                  readable.addr, wr_id=2))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_REM_ACCESS_ERR
        assert await readable.read() == b"R" * 256


async def test_disconnected_session_objects_are_gone_and_peers_retry_then_fail():
    async with sh.embedded() as inode, sh.embedded() as host:
        if True:
            daemon = host.daemon
            hca = daemon.hcas["mlx5_0"]
            keys_before, qps_before = len(hca.keys), len(daemon.qps)
            t_session = await sh.connect(host.address)
            t, i = await make_side(t_session), await make_side(inode)
            await connect_pair(t, i, timeout=10, retry_cnt=3)   # 4 ms ACK timeout
            tmr = await t.reg_mr(8192)
            mkey = await t.pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 1)
            await t.configure(mkey, access=sh.IBV_ACCESS_REMOTE_WRITE, sges=whole(tmr))
            src = await i.reg_mr(b"x" * 8192)
            wc = (await _write(i, src, tmr.rkey, tmr.addr, 1))
            assert wc.status == sh.IBV_WC_SUCCESS
            assert len(hca.keys) == keys_before + 2 and len(daemon.qps) == qps_before + 1
            assert len(daemon.sessions) == 2

            await t_session.close()
            for _ in range(100):
                if len(daemon.sessions) == 1:
                    break
                await _sleep()
            assert len(daemon.sessions) == 1
            assert len(hca.keys) == keys_before, "the MR and the MKEY were destroyed"
            assert len(daemon.qps) == qps_before, "the QP was destroyed"
            assert tmr.rkey not in hca.keys and mkey.rkey not in hca.keys

            # The peer's WRs: retried per retry_cnt, then RETRY_EXC_ERR, the rest flushed.
            await i.qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, 100)], tmr.rkey,
                                       tmr.addr, wr_id=n) for n in (2, 3)])
            wcs = await i.scq.poll_n(2, 10)
            assert [(w.wr_id, w.status) for w in wcs] == [
                (2, sh.IBV_WC_RETRY_EXC_ERR), (3, sh.IBV_WC_WR_FLUSH_ERR)]
            assert daemon.counters["packets_unknown_qp"] >= 4, "1 try + 3 retries arrived"


async def _write(side, src, rkey, addr, wr_id):
    await side.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), rkey, addr, wr_id=wr_id))
    (wc,) = await side.scq.poll_n(1, 10)
    return wc


async def _sleep():
    await asyncio.sleep(0.01)


async def test_closing_a_daemon_ends_every_session():
    async with sh.embedded() as node:
        other = await sh.connect(node.address)
        assert len(node.daemon._conn_tasks) == 2
        await node.daemon.close()
        with pytest.raises(sh.RDMAError) as e:
            for _ in range(100):
                await other.open_device()
                await asyncio.sleep(0.01)
        assert e.value.errno_name == "ECONNRESET"
        await other.close()
