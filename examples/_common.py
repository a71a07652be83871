"""What the examples share: one node's verbs objects, an RC QP pair between two
nodes, and the expected values computed without softhca.

Only the public API is used (``import softhca.client as sh``). The expected PI and
ciphertexts come from crcmod and from cryptography's own AES-XTS, straight from the
definitions in the man pages, so that an example checks softhca instead of quoting it.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

import crcmod
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

import softhca.client as sh

LOCAL = sh.IBV_ACCESS_LOCAL_WRITE
REMOTE = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_READ | sh.IBV_ACCESS_REMOTE_WRITE
# mlx5dv_create_mkey(3): an MKEY that a configure WR may give a layout (INDIRECT) and
# block signature attributes (BLOCK_SIGNATURE) or crypto attributes (CRYPTO).
SIG_MKEY = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE
CRYPTO_MKEY = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO
# check_mask selecting every field of a T10-DIF: guard, app tag, ref tag.
T10DIF_ALL = (sh.MLX5DV_SIG_MASK_T10DIF_GUARD | sh.MLX5DV_SIG_MASK_T10DIF_APPTAG
              | sh.MLX5DV_SIG_MASK_T10DIF_REFTAG)


@dataclass
class Node:
    """One node's verbs objects: device context, PD, one CQ for everything, an RC QP."""

    ctx: sh.Context
    pd: sh.PD
    cq: sh.CQ
    qp: sh.QP

    async def mkey_over(self, length: int, *, sig: sh.Mlx5SigBlockAttr | None = None,
                        crypto: sh.Mlx5CryptoAttr | None = None) -> tuple[sh.MR, sh.MKey]:
        """``length`` bytes of memory and an MKEY over them that peers may read and write,
        given ``sig`` and/or ``crypto`` by one configure WR on this node's QP."""
        mr = await self.pd.reg_mr(length, REMOTE)
        flags = SIG_MKEY if sig is not None else 0
        flags |= CRYPTO_MKEY if crypto is not None else 0
        mkey = await self.pd.create_mkey(flags, max_entries=1)
        # post_mkey_configure: ibv_wr_start, mlx5dv_wr_mkey_configure with one setter per
        # argument, the setters, ibv_wr_complete (t10dif_store.py spells them out).
        await self.qp.post_mkey_configure(
            mkey, access=REMOTE, sges=[sh.SGE(mr.addr, mr.length, mr.lkey)], sig=sig,
            crypto=crypto)
        return mr, mkey

    async def post_and_wait(self, wr: sh.SendWR) -> sh.WC:
        await self.qp.post_send(wr)
        (wc,) = await self.cq.poll_n(1, timeout=10.0)
        return wc

    async def rdma_write(self, src: sh.MR, rkey: int, remote_addr: int = 0) -> sh.WC:
        wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_RDMA_WRITE,
                       sg=[sh.SGE(src.addr, src.length, src.lkey)])
        wr.set_wr_rdma(rkey, remote_addr)
        return await self.post_and_wait(wr)

    async def rdma_read(self, dst: sh.MR, rkey: int, remote_addr: int = 0) -> sh.WC:
        wr = sh.SendWR(wr_id=2, opcode=sh.IBV_WR_RDMA_READ,
                       sg=[sh.SGE(dst.addr, dst.length, dst.lkey)])
        wr.set_wr_rdma(rkey, remote_addr)
        return await self.post_and_wait(wr)


async def open_node(session: sh.Node) -> Node:
    ctx = await session.open_device("mlx5_0")
    pd = await ctx.alloc_pd()
    cq = await ctx.create_cq(64)
    # Only a QP created with MLX5DV_QP_EX_WITH_MKEY_CONFIGURE may post configure WRs
    # (mlx5dv_wr_mkey_configure(3)); the node that owns the MKEYs needs it.
    qp = await pd.create_qp(sh.QPInitAttr(
        qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
        cap=sh.QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=4, max_recv_sge=4),
        send_ops_flags=sh.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE))
    return Node(ctx, pd, cq, qp)


async def rc_pair(target_session: sh.Node, initiator_session: sh.Node) -> tuple[Node, Node]:
    """The target (owns the protected memory) and the initiator, their QPs connected."""
    target = await open_node(target_session)
    initiator = await open_node(initiator_session)
    await target.qp.connect(initiator.qp.info())
    await initiator.qp.connect(target.qp.info())
    return target, initiator


# -- expected values, computed independently -------------------------------------------

# T10-DIF guard: CRC-16/T10-DIF, polynomial 0x8BB7, not reflected, the register seeded with
# bg (mlx5dv_sig_t10dif's "bg"). crcmod wants the polynomial with its x^16 term.
def t10dif_guard(block: bytes, bg: int) -> int:
    return crcmod.mkCrcFun(0x18BB7, initCrc=bg, rev=False, xorOut=0)(block)


def t10dif_pi(block: bytes, *, bg: int, app_tag: int, ref_tag: int) -> bytes:
    """The 8-byte PI: guard, app tag, ref tag, big-endian as T10 stores them."""
    return (t10dif_guard(block, bg).to_bytes(2, "big") + app_tag.to_bytes(2, "big")
            + (ref_tag & 0xFFFFFFFF).to_bytes(4, "big"))


def xts(key: bytes, data: bytes, data_unit_size: int, initial_tweak: int,
        encrypt: bool) -> bytes:
    """AES-XTS per data unit: unit k takes the tweak initial_tweak + k as 16 little-endian
    bytes (mlx5dv_wr_set_mkey_crypto(3)); one cryptography context per unit."""
    out = b""
    for k in range(0, len(data), data_unit_size):
        tweak = (initial_tweak + k // data_unit_size).to_bytes(16, "little")
        cipher = Cipher(algorithms.AES(key), modes.XTS(tweak))
        op = cipher.encryptor() if encrypt else cipher.decryptor()
        out += op.update(data[k:k + data_unit_size]) + op.finalize()
    return out


# -- what an example prints ---------------------------------------------------------------

class Checks:
    """Each check prints one line, ``ok`` or ``FAIL``; ``status()`` is the exit status."""

    def __init__(self) -> None:
        self.failed = 0

    def __call__(self, what: str, got, expected) -> None:
        if got == expected:
            print(f"ok    {what}")
        else:
            self.failed += 1
            print(f"FAIL  {what}: got {_short(got)}, expected {_short(expected)}")

    def status(self) -> int:
        print("all checks passed" if not self.failed else f"{self.failed} check(s) failed")
        sys.stdout.flush()
        return 1 if self.failed else 0


def _short(value) -> str:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes) and len(value) > 16:
        return f"{len(value)} bytes {value[:8].hex()}..."
    return repr(value)
