"""End-to-end harness: two daemons over TCP, driven through softhca.client only.

``two_nodes()`` starts two embedded daemons (each on its own loopback port, each
reached by its own control session), a *target* and an *initiator*, and connects one
RC QP pair between them. Every verb below is a client call; nothing here touches the
engine, so what a test sees is what an application on two hosts would see.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import softhca.client as sh

ALL = (sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_REMOTE_READ
       | sh.IBV_ACCESS_REMOTE_ATOMIC)
SIG_FLAGS = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE
SIG_CRYPTO_FLAGS = SIG_FLAGS | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO
TIMEOUT = 10.0


@dataclass
class Side:
    """One node's view: its session, device, PD, CQs and QP."""

    node: sh.Node
    ctx: sh.Context
    pd: sh.PD
    scq: sh.CQ
    rcq: sh.CQ
    qp: sh.QP

    async def reg_mr(self, data: bytes | int, access: int = ALL) -> sh.MR:
        mr = await self.pd.reg_mr(data if isinstance(data, int) else len(data), access)
        if not isinstance(data, int):
            await mr.write(data)
        return mr

    async def dek(self, key: bytes, **kw) -> sh.DEK:
        size = sh.MLX5DV_CRYPTO_KEY_SIZE_256 if len(key) == 64 else sh.MLX5DV_CRYPTO_KEY_SIZE_128
        return await self.ctx.create_dek(sh.Mlx5DEKInitAttr(pd=self.pd, key_size=size, key=key,
                                                            **kw))

    async def mkey(self, flags: int = SIG_FLAGS, *, access: int = ALL, max_entries: int = 4,
                   sges=None, interleaved=None, sig=None, crypto=None) -> sh.MKey:
        """mlx5dv_create_mkey, then one configure WR on this side's QP as the man page
        posts it: IBV_SEND_INLINE, one setter per attribute given."""
        mkey = await self.pd.create_mkey(flags, max_entries)
        await self.configure(mkey, access=access, sges=sges, interleaved=interleaved, sig=sig,
                             crypto=crypto)
        return mkey

    async def configure(self, mkey, *, access=None, sges=None, interleaved=None, sig=None,
                        crypto=None, conf_flags=0, wr_flags=sh.IBV_SEND_INLINE, wr_id=0):
        await self.qp.post_mkey_configure(mkey, access=access, sges=sges,
                                          interleaved=interleaved, sig=sig, crypto=crypto,
                                          conf_flags=conf_flags, wr_id=wr_id, wr_flags=wr_flags)

    async def send_wc(self, n: int = 1) -> list[sh.WC]:
        return await self.scq.poll_n(n, TIMEOUT)

    async def recv_wc(self, n: int = 1) -> list[sh.WC]:
        return await self.rcq.poll_n(n, TIMEOUT)


async def make_side(node: sh.Node, *, sq_sig_all: bool = False, max_wr: int = 256,
                    max_inline: int = 256) -> Side:
    ctx = await node.open_device("mlx5_0")
    pd = await ctx.alloc_pd()
    scq, rcq = await ctx.create_cq(4096), await ctx.create_cq(4096)
    qp = await pd.create_qp(sh.QPInitAttr(
        qp_type=sh.IBV_QPT_RC, scq=scq, rcq=rcq,
        cap=sh.QPCap(max_send_wr=max_wr, max_recv_wr=max_wr, max_send_sge=8, max_recv_sge=8,
                     max_inline_data=max_inline),
        sq_sig_all=sq_sig_all, send_ops_flags=sh.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE))
    return Side(node, ctx, pd, scq, rcq, qp)


async def connect_pair(a: Side, b: Side, *, mtu: int = sh.IBV_MTU_1024, **kw) -> None:
    await a.qp.connect(b.qp.info(), path_mtu=mtu, **kw)
    await b.qp.connect(a.qp.info(), path_mtu=mtu, **kw)


def sge(mr: sh.MR, length: int | None = None, offset: int = 0) -> sh.SGE:
    return sh.SGE(mr.addr + offset, mr.length - offset if length is None else length, mr.lkey)


def whole(mr: sh.MR) -> list[sh.SGE]:
    return [sge(mr)]


def rdma(opcode: int, local: list[sh.SGE], rkey: int, remote_addr: int, wr_id: int = 0,
         **kw) -> sh.SendWR:
    wr = sh.SendWR(wr_id=wr_id, opcode=opcode, sg=local, **kw)
    wr.set_wr_rdma(rkey, remote_addr)
    return wr


@dataclass
class Pair:
    target: Side
    initiator: Side

    async def send(self, src: Side, local: list[sh.SGE], dst: Side, recv: list[sh.SGE],
                   **kw) -> tuple[sh.WC, sh.WC]:
        """A RECV posted on ``dst`` and a SEND from ``src``; both completions."""
        await dst.qp.post_recv(sh.RecvWR(wr_id=1, sg=recv))
        await src.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND, sg=local, **kw))
        return (await src.send_wc())[0], (await dst.recv_wc())[0]

    async def write(self, local: list[sh.SGE], rkey: int, remote_addr: int) -> sh.WC:
        """RDMA_WRITE from the initiator to the target."""
        await self.initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, local, rkey, remote_addr, 3))
        return (await self.initiator.send_wc())[0]

    async def read(self, local: list[sh.SGE], rkey: int, remote_addr: int) -> sh.WC:
        """RDMA_READ by the initiator from the target."""
        await self.initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_READ, local, rkey, remote_addr, 4))
        return (await self.initiator.send_wc())[0]


@contextlib.asynccontextmanager
async def two_nodes(*, mtu: int = sh.IBV_MTU_1024, connect: bool = True, **kw):
    """Two embedded daemons, a target and an initiator, with a connected QP pair."""
    async with sh.embedded() as tnode, sh.embedded() as inode:
        target = await make_side(tnode, **kw)
        initiator = await make_side(inode, **kw)
        if connect:
            await connect_pair(target, initiator, mtu=mtu)
        yield Pair(target, initiator)


@contextlib.contextmanager
def serve(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """A ``softhca serve`` subprocess on a loopback port of its choosing (``args`` added
    to its command line): (the process, the address its ready file names); terminated
    (killed after 10 s) at the end."""
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                             "127.0.0.1:0", "--ready-file", str(ready), *args],
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "serve did not start"
            time.sleep(0.05)
        yield proc, ready.read_text().strip()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def pd_and_cq(address: str, cqe: int = 16) -> tuple[sh.Node, sh.PD, sh.CQ]:
    """A session with the daemon at ``address``, its device opened: (the node, a PD, a CQ
    of ``cqe`` entries)."""
    node = await sh.connect(address)
    ctx = await node.open_device()
    return node, await ctx.alloc_pd(), await ctx.create_cq(cqe)
