"""DIX: data and protection information in separate buffers, one MKEY over both.

Storage stacks often keep the 8-byte T10-DIF of each 512-byte block in a separate
buffer (DIX) rather than after each block (DIF). An interleaved layout
(mlx5dv_wr_set_mkey_layout_interleaved(3)) makes the MKEY's memory domain look like
DIF anyway: for each of repeat_count rounds, 512 bytes from the data buffer, then 8
bytes from the PI buffer. The signature attributes then treat it as 520-byte blocks.

The initiator RDMA_WRITEs plain data; the target's data buffer gets the data and its PI
buffer the generated T10-DIFs, packed. A damaged PI is found on the next read.

Run: python examples/dix_layout.py
"""

from __future__ import annotations

import asyncio
import os
import sys

from _common import REMOTE, SIG_MKEY, T10DIF_ALL, Checks, rc_pair, t10dif_pi

import softhca.client as sh

BLOCK, PI = 512, 8
N_BLOCKS = 16
APP_TAG, LBA = 0x0D1C, 7

SIG = sh.Mlx5SigBlockAttr(
    mem=sh.Mlx5SigBlockDomain(
        sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
        dif=sh.Mlx5SigT10Dif(bg_type=sh.MLX5DV_SIG_T10DIF_CRC, bg=0, app_tag=APP_TAG,
                             ref_tag=LBA, flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
        block_size=sh.MLX5DV_BLOCK_SIZE_512),
    wire=None,
    check_mask=T10DIF_ALL)


async def main() -> int:
    check = Checks()
    async with sh.embedded() as target_node, sh.embedded() as initiator_node:
        target, initiator = await rc_pair(target_node, initiator_node)

        data_buf = await target.pd.reg_mr(N_BLOCKS * BLOCK, REMOTE)
        pi_buf = await target.pd.reg_mr(N_BLOCKS * PI, REMOTE)
        # An interleaved layout takes one more entry than it has pieces (its header).
        mkey = await target.pd.create_mkey(SIG_MKEY, max_entries=3)
        layout = (N_BLOCKS, [
            sh.Mlx5MrInterleaved(addr=data_buf.addr, bytes_count=BLOCK, bytes_skip=0,
                                 lkey=data_buf.lkey),
            sh.Mlx5MrInterleaved(addr=pi_buf.addr, bytes_count=PI, bytes_skip=0,
                                 lkey=pi_buf.lkey),
        ])
        await target.qp.post_mkey_configure(mkey, access=REMOTE, interleaved=layout, sig=SIG)

        data = os.urandom(N_BLOCKS * BLOCK)
        src = await initiator.pd.reg_mr(len(data), sh.IBV_ACCESS_LOCAL_WRITE)
        await src.write(data)
        wc = await initiator.rdma_write(src, mkey.rkey)
        check("RDMA_WRITE of plain data completes", wc.status, sh.IBV_WC_SUCCESS)
        check("the data buffer holds the data alone", await data_buf.read(), data)
        pis = [t10dif_pi(data[b * BLOCK:(b + 1) * BLOCK], bg=0, app_tag=APP_TAG,
                         ref_tag=LBA + b) for b in range(N_BLOCKS)]
        check("the PI buffer holds each block's T10-DIF, packed (crcmod)",
              await pi_buf.read(), b"".join(pis))

        dst = await initiator.pd.reg_mr(len(data), sh.IBV_ACCESS_LOCAL_WRITE)
        wc = await initiator.rdma_read(dst, mkey.rkey)
        check("RDMA_READ back completes", wc.status, sh.IBV_WC_SUCCESS)
        check("the data comes back, PI checked and stripped", await dst.read(), data)
        check("mkey_check", (await mkey.mkey_check()).err_type, sh.MLX5DV_MKEY_NO_ERR)

        # Overwrite block 9's ref tag (PI bytes 4..7) in the PI buffer.
        b = 9
        await pi_buf.write((0xBAD).to_bytes(4, "big"), offset=b * PI + 4)
        wc = await initiator.rdma_read(dst, mkey.rkey)
        check("RDMA_READ with a damaged PI still completes", wc.status, sh.IBV_WC_SUCCESS)
        err = await mkey.mkey_check()
        check("mkey_check reports a bad ref tag", err.err_type,
              sh.MLX5DV_MKEY_SIG_BLOCK_BAD_REFTAG)
        check("  actual_value is the expected ref tag, LBA + 9",
              err.sig_err.actual_value, LBA + b)
        check("  expected_value is what the PI buffer held", err.sig_err.expected_value, 0xBAD)
        # The offset counts the MKEY's memory stream, where each block is 520 bytes.
        check(f"  offset is block {b}'s in the memory stream: {b} * {BLOCK + PI}",
              err.sig_err.offset, b * (BLOCK + PI))
    return check.status()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
