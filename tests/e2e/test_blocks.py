"""Transfers and layouts that are not whole protection blocks (docs/blocks.md).

By default (docs/semantics.md section 5) a trailing partial block is plain data: the
transfer succeeds and the layout is accepted; each is counted on its MKEY, in the
daemon's counters and in the trace. With ``strict_blocks`` (``softhca serve
--strict-blocks``, ``embedded(strict_blocks=True)``) such a layout is EINVAL at
configure, and such a transfer fails as a transfer with a misaligned start does, on
the node that owns the MKEY. Expected PI come from crcmod here, not from softhca.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal

import crcmod
import pytest
from test_serve import start
from test_trace_cli import TraceProcess

import softhca.client as sh

from e2e import SIG_FLAGS, TIMEOUT, connect_pair, make_side, rdma, sge, whole

REMOTE = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_READ | sh.IBV_ACCESS_REMOTE_WRITE
# A T10-DIF memory domain on 512-byte blocks, no wire domain: 520 memory bytes per
# block, 512 wire bytes.
MEM_DIF = sh.Mlx5SigBlockAttr(
    mem=sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
                              dif=sh.Mlx5SigT10Dif(bg=0xFFFF, app_tag=0x0102, ref_tag=0x10),
                              block_size=sh.MLX5DV_BLOCK_SIZE_512),
    wire=None, check_mask=0xFF)
_crc16_t10dif = crcmod.mkCrcFun(0x18BB7, initCrc=0xFFFF, rev=False, xorOut=0)


def pi(block: bytes) -> bytes:
    """MEM_DIF's PI of a block: guard, app tag 0x0102, ref tag 0x10 (no REF_REMAP)."""
    return _crc16_t10dif(block).to_bytes(2, "big") + bytes([1, 2, 0, 0, 0, 0x10])


@contextlib.asynccontextmanager
async def nodes(strict: bool):
    """A target (owns the MKEYs; strict_blocks as given) and an initiator, connected."""
    async with sh.embedded(strict_blocks=strict) as tnode, sh.embedded() as inode:
        target, initiator = await make_side(tnode), await make_side(inode)
        await connect_pair(target, initiator)
        yield target, initiator


async def fresh_qps(t, i):
    """Another connected QP pair in the same PDs and CQs: a failed transfer moves its
    QPs to the error state, the MKEY and MRs stay."""
    sides = []
    for side in (t, i):
        qp = await side.pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=side.scq, rcq=side.rcq,
            cap=sh.QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)))
        sides.append(dataclasses.replace(side, qp=qp))
    await connect_pair(*sides)
    return sides


async def dif_mkey(side, memory_bytes: int):
    mr = await side.reg_mr(memory_bytes)
    return mr, await side.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=MEM_DIF)


async def write(initiator, src: sh.MR, length: int, rkey: int, remote_addr: int) -> sh.WC:
    await initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, length)], rkey,
                                      remote_addr, wr_id=length))
    return (await initiator.send_wc())[0]


def partial_counts(counters: dict) -> dict:
    return {k: v for k, v in counters.items() if k.startswith("partial_block")}


async def test_default_counts_a_partial_transfer_and_layout(rng):
    async with nodes(strict=False) as (t, i):
        mr, mkey = await dif_mkey(t, 4 * 520)
        # mlx5dv_mkey_configure accepts a 4000-byte layout of 520-byte blocks: 7 blocks
        # and 360 bytes.
        _, odd = await dif_mkey(t, 4000)
        data = rng.randbytes(1000)
        src = await i.reg_mr(data)
        wc = await write(i, src, 1000, mkey.rkey, 0)
        assert wc.status == sh.IBV_WC_SUCCESS, wc
        # One whole block with its PI generated, then 488 bytes of plain data.
        assert await mr.read(1008) == data[:512] + pi(data[:512]) + data[512:]
        assert (await mkey.mkey_check()).err_type == sh.MLX5DV_MKEY_NO_ERR
        dev = t.node.devices[0]
        assert partial_counts(await t.node.counters()) == {
            "partial_block_layouts": 1, "partial_block_transfers": 1,
            f"partial_block_layouts[{dev}:{odd.lkey:#x}]": 1,
            f"partial_block_transfers[{dev}:{mkey.lkey:#x}]": 1}
        # A whole-block transfer is not counted; a second partial one is.
        assert (await write(i, src, 512, mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        assert (await write(i, src, 100, mkey.rkey, 1024)).status == sh.IBV_WC_SUCCESS
        counters = await t.node.counters()
        assert counters["partial_block_transfers"] == 2
        assert counters[f"partial_block_transfers[{dev}:{mkey.lkey:#x}]"] == 2
        # The initiator's daemon moved plain MRs only.
        assert partial_counts(await i.node.counters()) == {"partial_block_layouts": 0,
                                                           "partial_block_transfers": 0}
        # Counters never go backwards: the MKEY's own line goes with it, the total stays.
        await mkey.close()
        counters = partial_counts(await t.node.counters())
        assert counters["partial_block_transfers"] == 2
        assert f"partial_block_transfers[{dev}:{mkey.lkey:#x}]" not in counters


async def test_trace_shows_a_partial_transfer(rng):
    async with nodes(strict=False) as (t, i):
        mr, mkey = await dif_mkey(t, 4 * 520)
        src = await i.reg_mr(rng.randbytes(1000))
        sub = await t.node.subscribe("trace")
        async with TraceProcess(t.node.address, "--count", "3", "--no-color") as tr:
            assert (await write(i, src, 1000, mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
            rc, out, err = await tr.finish()
        events = []
        while (ev := await sub.next(1.0)) is not None:
            events.append(ev)
    assert rc == 0, err
    scatter = [ev.header for ev in events if ev.header["stage"] == "scatter"]
    assert [h["detail"] for h in scatter] == [{"partial_block": 488,
                                               "partial_block_transfers": 1}]
    (line,) = [ln for ln in out.splitlines() if ln.lstrip().startswith("scatter")]
    assert ("not whole blocks: the last 488B are a partial block, plain data "
            "(partial-block transfer #1 on this MKEY)") in line, out


async def test_strict_refuses_a_partial_layout_at_configure():
    async with nodes(strict=True) as (t, i):
        mr = await t.reg_mr(4000)
        mkey = await t.pd.create_mkey(SIG_FLAGS, 4)
        with pytest.raises(sh.RDMAError) as e:
            await t.configure(mkey, access=REMOTE, sges=whole(mr), sig=MEM_DIF)
        assert e.value.errno_name == "EINVAL"
        assert ("layout of 4000 bytes is not a whole number of 520-byte protection blocks"
                in e.value.message)
        # Nothing of the refused configure was applied: the MKEY is still not usable.
        src = await i.reg_mr(512)
        wc = await write(i, src, 512, mkey.rkey, 0)
        assert wc.status == sh.IBV_WC_REM_ACCESS_ERR, wc
        # The same layout in whole blocks is accepted, in the same session.
        ok = await t.reg_mr(4160)
        good = await t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(ok), sig=MEM_DIF)
        assert (await good.mkey_check()).err_type == sh.MLX5DV_MKEY_NO_ERR
        # A layout set without signature, then a signature that makes it partial.
        plain = await t.pd.create_mkey(SIG_FLAGS, 4)
        await t.configure(plain, access=REMOTE, sges=whole(mr))
        with pytest.raises(sh.RDMAError, match="EINVAL|not a whole number"):
            await t.configure(plain, sig=MEM_DIF)
        assert partial_counts(await t.node.counters())["partial_block_layouts"] == 0


async def test_strict_fails_a_partial_transfer_as_a_misaligned_start(rng):
    async with nodes(strict=True) as (t, i):
        mr, mkey = await dif_mkey(t, 4 * 520)
        src = await i.reg_mr(rng.randbytes(2048))
        dst = await i.reg_mr(2048)

        # The status of a misaligned start today (docs/semantics.md section 5), for each
        # way a transfer reaches the MKEY: the peer's WRITE and READ.
        async def status(op: int, length: int, remote_addr: int) -> int:
            _, ii = await fresh_qps(t, i)
            local = [sge(src if op == sh.IBV_WR_RDMA_WRITE else dst, length)]
            await ii.qp.post_send(rdma(op, local, mkey.rkey, remote_addr))
            return (await ii.send_wc())[0].status

        for op in (sh.IBV_WR_RDMA_WRITE, sh.IBV_WR_RDMA_READ):
            misaligned = await status(op, 512, 100)
            assert misaligned == sh.IBV_WC_REM_INV_REQ_ERR
            assert await status(op, 1000, 0) == misaligned
            assert await status(op, 1024, 0) == sh.IBV_WC_SUCCESS
        # The refused WRITE left the target's memory as the whole one wrote it.
        data = await src.read(1024)
        assert await mr.read(1040) == (data[:512] + pi(data[:512]) + data[512:1024]
                                       + pi(data[512:1024]))

        # The MKEY's owner as the requester: a SEND gathering through the MKEY.
        async def send_status(length: int, offset: int) -> int:
            ti, ii = await fresh_qps(t, i)
            await ii.qp.post_recv(sh.RecvWR(wr_id=1, sg=[sge(dst)]))
            await ti.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND,
                                            sg=[sh.SGE(offset, length, mkey.lkey)]))
            return (await ti.scq.poll_n(1, TIMEOUT))[0].status

        misaligned = await send_status(512, 100)
        assert misaligned == sh.IBV_WC_LOC_LEN_ERR
        assert await send_status(1000, 0) == misaligned
        assert await send_status(1024, 0) == sh.IBV_WC_SUCCESS
        assert partial_counts(await t.node.counters())["partial_block_transfers"] == 0


async def test_serve_strict_blocks(tmp_path):
    proc, address = await asyncio.to_thread(start, tmp_path, "--strict-blocks")
    try:
        async with await sh.connect(address) as node:
            side, peer = await make_side(node), await make_side(node)
            await connect_pair(side, peer)
            mr = await side.reg_mr(4000)
            mkey = await side.pd.create_mkey(SIG_FLAGS, 4)
            with pytest.raises(sh.RDMAError, match="strict blocks"):
                await side.configure(mkey, access=REMOTE, sges=whole(mr), sig=MEM_DIF)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 10) == 0
