"""A T10-DIF protected store: the target keeps data with PI, the initiator never sees PI.

The target's memory holds 512-byte blocks each followed by its 8-byte T10-DIF (guard,
app tag, ref tag). Its MKEY has a T10-DIF *memory domain* and no wire domain
(mlx5dv_wr_set_mkey_sig_block(3)), so:

- an RDMA_WRITE of plain data through the MKEY has the PI generated on the target;
- an RDMA_READ through it checks every block's PI (check_mask) and strips it;
- a bad block does not fail the READ: the error waits on the MKEY until the target
  calls mlx5dv_mkey_check(3), which names the block by its offset.

Run: python examples/t10dif_store.py
"""

from __future__ import annotations

import asyncio
import os
import sys

from _common import REMOTE, SIG_MKEY, T10DIF_ALL, Checks, rc_pair, t10dif_guard, t10dif_pi

import softhca.client as sh

BLOCK, PI = 512, 8
N_BLOCKS = 8
BG, APP_TAG, LBA = 0xFFFF, 0x5EED, 1000      # LBA: the ref tag of block 0

DIF = sh.Mlx5SigBlockDomain(
    sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
    # REF_REMAP: block b carries ref tag LBA + b, as a disk's logical block address.
    dif=sh.Mlx5SigT10Dif(bg_type=sh.MLX5DV_SIG_T10DIF_CRC, bg=BG, app_tag=APP_TAG,
                         ref_tag=LBA, flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
    block_size=sh.MLX5DV_BLOCK_SIZE_512)
SIG = sh.Mlx5SigBlockAttr(
    mem=DIF, wire=None,
    check_mask=T10DIF_ALL)


async def main() -> int:
    check = Checks()
    async with sh.embedded() as target_node, sh.embedded() as initiator_node:
        target, initiator = await rc_pair(target_node, initiator_node)

        # The target: memory for N blocks with their PI, and an MKEY over it.
        disk = await target.pd.reg_mr(N_BLOCKS * (BLOCK + PI), REMOTE)
        mkey = await target.pd.create_mkey(SIG_MKEY, max_entries=1)
        # mlx5dv_wr_mkey_configure(3), as its example posts it: one WR announcing three
        # setters, then the setters, then ibv_wr_complete. IBV_SEND_INLINE is required.
        qp = target.qp
        qp.wr_start()
        qp.wr_id, qp.wr_flags = 0, sh.IBV_SEND_INLINE
        qp.wr_mkey_configure(mkey, 3, sh.Mlx5MkeyConfAttr())
        qp.wr_set_mkey_access_flags(REMOTE)
        qp.wr_set_mkey_layout_list([sh.SGE(disk.addr, disk.length, disk.lkey)])
        qp.wr_set_mkey_sig_block(SIG)
        await qp.wr_complete()

        # The initiator writes plain data; lengths through the MKEY count wire bytes,
        # here the data alone.
        data = os.urandom(N_BLOCKS * BLOCK)
        src = await initiator.pd.reg_mr(len(data), sh.IBV_ACCESS_LOCAL_WRITE)
        await src.write(data)
        wc = await initiator.rdma_write(src, mkey.rkey)
        check("RDMA_WRITE of plain data completes", wc.status, sh.IBV_WC_SUCCESS)

        expected = b"".join(
            data[b * BLOCK:(b + 1) * BLOCK]
            + t10dif_pi(data[b * BLOCK:(b + 1) * BLOCK], bg=BG, app_tag=APP_TAG, ref_tag=LBA + b)
            for b in range(N_BLOCKS))
        check("target memory is each block followed by its T10-DIF (crcmod)",
              await disk.read(), expected)
        check("mkey_check after the write", (await mkey.mkey_check()).err_type,
              sh.MLX5DV_MKEY_NO_ERR)

        dst = await initiator.pd.reg_mr(len(data), sh.IBV_ACCESS_LOCAL_WRITE)
        wc = await initiator.rdma_read(dst, mkey.rkey)
        check("RDMA_READ back completes", wc.status, sh.IBV_WC_SUCCESS)
        check("the initiator reads the data alone, PI checked and stripped",
              await dst.read(), data)
        check("mkey_check after the read", (await mkey.mkey_check()).err_type,
              sh.MLX5DV_MKEY_NO_ERR)

        # Bit rot: one data byte of block 5 flips in the target's memory.
        bad_block, bad_byte = 5, 100
        at = bad_block * (BLOCK + PI) + bad_byte
        await disk.write(bytes([expected[at] ^ 0x40]), offset=at)
        wc = await initiator.rdma_read(dst, mkey.rkey)
        # A signature error is not a transport error: the READ still succeeds.
        check("RDMA_READ of the damaged store still completes", wc.status, sh.IBV_WC_SUCCESS)
        err = await mkey.mkey_check()
        damaged = bytearray(data[bad_block * BLOCK:(bad_block + 1) * BLOCK])
        damaged[bad_byte] ^= 0x40
        check("mkey_check reports a bad guard", err.err_type, sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD)
        # mlx5dv_mkey_check(3): actual is what the device computed, expected what the PI held;
        # the offset is the failing block's, in the checked (memory) stream.
        check("  actual_value is the guard of the damaged block",
              err.sig_err.actual_value, t10dif_guard(bytes(damaged), BG))
        check("  expected_value is the stored guard",
              err.sig_err.expected_value,
              t10dif_guard(data[bad_block * BLOCK:(bad_block + 1) * BLOCK], BG))
        check(f"  offset is block {bad_block}'s: {bad_block} * {BLOCK + PI}",
              err.sig_err.offset, bad_block * (BLOCK + PI))
        check("mkey_check cleared the error", (await mkey.mkey_check()).err_type,
              sh.MLX5DV_MKEY_NO_ERR)
    return check.status()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
