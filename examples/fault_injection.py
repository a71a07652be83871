"""Fault injection from Python: a corrupted wire block, then a lossy link.

``node.faults.add(...)`` installs a rule on that node's daemon (the fields of
``softhca faults add``); the rule acts on packets the daemon sends (direction "out",
the default) or accepts ("in").

1. The target's MKEY has a T10-DIF *wire domain* (mlx5dv_wr_set_mkey_sig_block(3)
   example 2.1): the initiator sends each 512-byte block with its PI, the target checks
   and strips it. A rule on the initiator's daemon flips one bit of block 2's guard on
   the wire, the packet's integrity check recomputed, so the link delivers it and only
   the target's signature check notices. The WRITE still succeeds; the target's
   mkey_check reports the block.
2. A rule drops packets at random (seeded): RC retransmits, and the data arrives whole.

Run: python examples/fault_injection.py
"""

from __future__ import annotations

import asyncio
import os
import sys

from _common import REMOTE, Checks, rc_pair, t10dif_guard, t10dif_pi

import softhca.client as sh

BLOCK, PI = 512, 8
N_BLOCKS = 4

SIG = sh.Mlx5SigBlockAttr(
    mem=None,
    wire=sh.Mlx5SigBlockDomain(
        sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
        dif=sh.Mlx5SigT10Dif(bg_type=sh.MLX5DV_SIG_T10DIF_CRC, bg=0xFFFF, app_tag=0),
        block_size=sh.MLX5DV_BLOCK_SIZE_512),
    check_mask=sh.MLX5DV_SIG_MASK_T10DIF_GUARD)


async def main() -> int:
    check = Checks()
    async with sh.embedded() as target_node, sh.embedded() as initiator_node:
        target, initiator = await rc_pair(target_node, initiator_node)

        # -- 1. one corrupted guard ---------------------------------------------------
        disk, mkey = await target.mkey_over(N_BLOCKS * BLOCK, sig=SIG)

        data = os.urandom(N_BLOCKS * BLOCK)
        blocks = [data[b * BLOCK:(b + 1) * BLOCK] for b in range(N_BLOCKS)]
        # The initiator's memory is what goes on the wire: each block and its T10-DIF
        # (ref tag 0 for every block: no REF_REMAP).
        image = b"".join(blk + t10dif_pi(blk, bg=0xFFFF, app_tag=0, ref_tag=0)
                         for blk in blocks)
        src = await initiator.pd.reg_mr(len(image), sh.IBV_ACCESS_LOCAL_WRITE)
        await src.write(image)

        rule = await initiator_node.faults.add(
            action="corrupt", opcode="RDMA_WRITE", block=2, block_size=BLOCK + PI,
            field="guard", xor=0x0001, count=1)
        print(f"rule {rule['id']} on the initiator's daemon: flip bit 0 of block 2's guard")
        wc = await initiator.rdma_write(src, mkey.rkey)
        check("the RDMA_WRITE succeeds (a signature error is not a transport error)",
              wc.status, sh.IBV_WC_SUCCESS)
        check("the target's memory has the data, PI stripped", await disk.read(), data)
        err = await mkey.mkey_check()
        check("the target's mkey_check reports a bad guard", err.err_type,
              sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD)
        good = t10dif_guard(blocks[2], 0xFFFF)
        check("  actual_value: the guard of block 2's data", err.sig_err.actual_value, good)
        check("  expected_value: what arrived, the guard with bit 0 flipped",
              err.sig_err.expected_value, good ^ 0x0001)
        check(f"  offset: block 2 of the wire stream, 2 * {BLOCK + PI}",
              err.sig_err.offset, 2 * (BLOCK + PI))
        (listed,) = await initiator_node.faults.list()
        check("the rule fired once", listed["fired"], 1)
        await initiator_node.faults.clear()

        # -- 2. a lossy link ----------------------------------------------------------
        payload = os.urandom(64 * 1024)
        src2 = await initiator.pd.reg_mr(len(payload), sh.IBV_ACCESS_LOCAL_WRITE)
        dst2 = await target.pd.reg_mr(len(payload), REMOTE)
        await src2.write(payload)
        before = (await initiator_node.counters())["retransmissions"]
        await initiator_node.faults.add(action="drop", opcode="RDMA_WRITE", probability=0.1,
                                        seed=1, count=3)
        print("rule on the initiator's daemon: drop RDMA_WRITE packets with probability "
              "0.1 (seed 1), at most 3")
        wc = await initiator.rdma_write(src2, dst2.rkey, dst2.addr)
        check("a 64 KiB RDMA_WRITE over the lossy link succeeds", wc.status, sh.IBV_WC_SUCCESS)
        check("  and the target has every byte", await dst2.read(), payload)
        counters = await initiator_node.counters()
        check("  the initiator retransmitted", counters["retransmissions"] > before, True)
        print(f"      (retransmissions {counters['retransmissions']}, retransmitted packets "
              f"{counters['retransmitted_packets']})")
    return check.status()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
