"""Pushed events: the packets a daemon sends and accepts, and every pipeline stage of
every transfer, streamed to subscribers; nothing is done for them without one."""

from __future__ import annotations

import os

import softhca.client as sh
from softhca.tools import oracle

from e2e import SIG_FLAGS, sge, two_nodes, whole

DIF_4K = sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
                               dif=sh.Mlx5SigT10Dif(bg=0xFFFF, app_tag=0x5A5A, ref_tag=0x1000,
                                                    flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
                               block_size=sh.MLX5DV_BLOCK_SIZE_4096)


async def drain(sub, until=None, timeout=0.3):
    out = []
    while True:
        ev = await sub.next(timeout)
        if ev is None:
            return out
        out.append(ev)


async def test_trace_of_sig_block_example_2_1_through_the_daemon():
    """Receive, validate the T10-DIF of each 4096-byte block, strip, scatter."""
    async with two_nodes() as p:
        data = os.urandom(2 * 4096)
        wire = oracle.protect_blocks(data, 4096, lambda blk, b: oracle.t10dif_pi(
            blk, bg=0xFFFF, app=0x5A5A, ref=0x1000 + b))
        mr = await p.target.reg_mr(len(data))
        mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr),
                                   sig=sh.Mlx5SigBlockAttr(wire=DIF_4K, check_mask=0xFF))
        src = await p.initiator.reg_mr(wire)
        assert not p.target.node.daemon.taps, "no subscriber: no tap"
        sub = await p.target.node.subscribe("trace")
        assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        evs = [e for e in await drain(sub) if e.kind == "trace"]
        assert [e.header["stage"] for e in evs] == ["wire", "check", "strip", "scatter"]
        assert {e.header["op"] for e in evs} == {"RDMA_WRITE"}
        assert evs[1].header["detail"]["results"] == [sh.MLX5DV_MKEY_NO_ERR] * 2
        assert evs[-1].data == data and evs[0].data == wire
        await p.target.node.unsubscribe()
        await p.write(whole(src), mkey.rkey, 0)
        assert await drain(sub, timeout=0.2) == []
        assert all(q.rcqp.trace is None for q in p.target.node.daemon.qps.values())


async def test_packet_events_show_what_crossed_the_wire():
    async with two_nodes(mtu=sh.IBV_MTU_1024) as p:
        src = await p.initiator.reg_mr(os.urandom(3000))
        dst = await p.target.reg_mr(3000)
        sub = await p.initiator.node.subscribe("packets")
        await p.write([sge(src)], dst.rkey, dst.addr)
        evs = await drain(sub)
        tx = [e.header["pkt"]["op"] for e in evs if e.header["dir"] == "tx"]
        rx = [e.header["pkt"]["op"] for e in evs if e.header["dir"] == "rx"]
        assert tx == ["RDMA_WRITE_FIRST", "RDMA_WRITE_MIDDLE", "RDMA_WRITE_LAST"]
        assert rx == ["ACKNOWLEDGE"]
        assert b"".join(e.data for e in evs if e.header["dir"] == "tx") == await src.read()
