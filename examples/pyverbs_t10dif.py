"""A T10-DIF target written in rdma-core's pyverbs, as it would be for an mlx5 device.

The program below the path line is plain pyverbs: the same imports, classes and calls
as on real hardware (rdma-core 44 and later), synchronous. softhca's pyverbs answers
them, with an embedded daemon and its device ``mlx5_0`` when ``SOFTHCA_TARGET`` is not
set. Outside this example you would put ``$(softhca pyverbs path)`` first on PYTHONPATH
instead of the two lines that do it here.

mlx5dv_wr_set_mkey_sig_block(3): the target's MKEY has a T10-DIF *wire domain* of
512-byte blocks and no memory domain. The initiator RDMA_WRITEs each block followed by
its 8-byte PI; the target checks every block, strips the PI and stores the data alone.
A second write carries one corrupted guard: the WRITE still completes (a signature error
is not a transport error) and mlx5dv_mkey_check(3) reports it, with the block's offset
in the wire stream.

Run: python examples/pyverbs_t10dif.py
"""

from __future__ import annotations

import os
import sys

from _common import Checks, t10dif_guard, t10dif_pi

from softhca.tools.pyverbs import path as softhca_pyverbs_path

sys.path.insert(0, str(softhca_pyverbs_path()))     # = PYTHONPATH=$(softhca pyverbs path)

# -- from here on, pyverbs as rdma-core ships it ------------------------------------------
import pyverbs.enums as e  # noqa: E402
import pyverbs.providers.mlx5.mlx5_enums as dve  # noqa: E402
from pyverbs.addr import AHAttr, GlobalRoute  # noqa: E402
from pyverbs.cq import CQ  # noqa: E402
from pyverbs.device import Context  # noqa: E402
from pyverbs.mr import MR  # noqa: E402
from pyverbs.pd import PD  # noqa: E402
from pyverbs.providers.mlx5.mlx5dv import (  # noqa: E402
    Mlx5Context,
    Mlx5DVContextAttr,
    Mlx5DVQPInitAttr,
    Mlx5QP,
)
from pyverbs.providers.mlx5.mlx5dv_mkey import (  # noqa: E402
    Mlx5Mkey,
    Mlx5MkeyConfAttr,
    Mlx5SigBlockAttr,
    Mlx5SigBlockDomain,
    Mlx5SigT10Dif,
)
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr, QPInitAttrEx  # noqa: E402
from pyverbs.wr import SGE, SendWR  # noqa: E402

BLOCK, PI, N_BLOCKS = 512, 8, 8
BG, APP_TAG, REF_TAG = 0xFFFF, 0x5A5A, 0x1000      # the man page's example values
BAD_BLOCK = 5
REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def connect(ctx, qp, remote) -> None:
    """RESET -> INIT -> RTR -> RTS towards ``remote``: its QP number, and the GID of
    port 1 (both QPs are on one device here, so the local GID is the remote one)."""
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = REMOTE
    attr.ah_attr = AHAttr(is_global=1, port_num=1,
                          gr=GlobalRoute(dgid=ctx.query_gid(1, 0), sgid_index=0))
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = remote.qp_num, 0, 0
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 12
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
    qp.to_rts(attr)


def wait(cq):
    """Busy-poll one completion, as pyverbs' tests do (cq.poll returns (n, wcs))."""
    for _ in range(10_000):
        n, wcs = cq.poll()
        if n:
            return wcs[0]
    raise TimeoutError("no completion")


def main() -> int:
    check = Checks()
    target, initiator = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0"), Context(name="mlx5_0")
    try:
        # The target: its QP may post configure WRs only if created with
        # MLX5DV_QP_EX_WITH_MKEY_CONFIGURE (mlx5dv_wr_mkey_configure(3)).
        tpd, tcq = PD(target), CQ(target, 16, None, None, 0)
        disk = MR(tpd, N_BLOCKS * BLOCK, REMOTE)
        dv = Mlx5DVQPInitAttr(comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
                              send_ops_flags=dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)
        tqp = Mlx5QP(target, QPInitAttrEx(
            qp_type=e.IBV_QPT_RC, scq=tcq, rcq=tcq, pd=tpd, cap=QPCap(8, 8),
            comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            send_ops_flags=e.IBV_QP_EX_WITH_SEND), dv)
        tqp.to_init(QPAttr(port_num=1, qp_access_flags=REMOTE))

        ipd, icq = PD(initiator), CQ(initiator, 16, None, None, 0)
        src = MR(ipd, N_BLOCKS * (BLOCK + PI), e.IBV_ACCESS_LOCAL_WRITE)
        iqp = QP(ipd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=icq, rcq=icq, cap=QPCap(8, 8)),
                 QPAttr(port_num=1, qp_access_flags=REMOTE))
        connect(target, tqp, iqp)
        connect(initiator, iqp, tqp)

        # mlx5dv_create_mkey with BLOCK_SIGNATURE, then one configure WR: access flags,
        # the layout (the whole MR) and the signature, three setters.
        mkey = Mlx5Mkey(tpd, dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                        | dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1)
        wire = Mlx5SigBlockDomain(
            sig_type=dve.MLX5DV_SIG_TYPE_T10DIF, block_size=dve.MLX5DV_BLOCK_SIZE_512,
            dif=Mlx5SigT10Dif(bg_type=dve.MLX5DV_SIG_T10DIF_CRC, bg=BG, app_tag=APP_TAG,
                              ref_tag=REF_TAG, flags=dve.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP))
        tqp.wr_start()
        tqp.wr_id, tqp.wr_flags = 1, e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
        tqp.wr_mkey_configure(mkey, 3, Mlx5MkeyConfAttr())
        tqp.wr_set_mkey_access_flags(REMOTE)
        tqp.wr_set_mkey_layout_list([SGE(disk.buf, N_BLOCKS * BLOCK, disk.lkey)])
        tqp.wr_set_mkey_sig_block(Mlx5SigBlockAttr(
            mem=None, wire=wire, check_mask=dve.MLX5DV_SIG_MASK_T10DIF_GUARD
            | dve.MLX5DV_SIG_MASK_T10DIF_APPTAG | dve.MLX5DV_SIG_MASK_T10DIF_REFTAG))
        tqp.wr_complete()
        wc = wait(tcq)
        # A configure WR completes as a UMR: MLX5DV_WC_UMR, mlx5dv.h's IBV_WC_DRIVER1.
        check("the configure WR completes (MLX5DV_WC_UMR)", (wc.status, wc.opcode),
              (e.IBV_WC_SUCCESS, dve.MLX5DV_WC_UMR))

        # What the initiator sends: each block, then its PI (crcmod's CRC-16/T10-DIF
        # seeded with bg; ref tag REF_TAG + block, as REF_REMAP increments it).
        data = os.urandom(N_BLOCKS * BLOCK)
        blocks = [data[b * BLOCK:(b + 1) * BLOCK] for b in range(N_BLOCKS)]
        image = b"".join(blk + t10dif_pi(blk, bg=BG, app_tag=APP_TAG, ref_tag=REF_TAG + b)
                         for b, blk in enumerate(blocks))

        def write(wire_image: bytes):
            src.write(wire_image, len(wire_image))
            wr = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                        sg=[SGE(src.buf, len(wire_image), src.lkey)])
            wr.set_wr_rdma(mkey.rkey, 0)
            iqp.post_send(wr)
            return wait(icq)

        check("RDMA_WRITE of data and PI completes", write(image).status, e.IBV_WC_SUCCESS)
        check("the target's memory holds the data alone, PI stripped",
              disk.read(N_BLOCKS * BLOCK, 0), data)
        check("mkey_check after a clean write", mkey.mkey_check().err_type,
              dve.MLX5DV_MKEY_NO_ERR)

        # Block BAD_BLOCK's guard with one bit flipped.
        at = BAD_BLOCK * (BLOCK + PI) + BLOCK
        bad = bytearray(image)
        bad[at] ^= 0x01
        check("RDMA_WRITE with a corrupted guard still completes", write(bytes(bad)).status,
              e.IBV_WC_SUCCESS)
        err = mkey.mkey_check()
        check("mkey_check reports a bad guard", err.err_type,
              dve.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD)
        check("  actual_value is the guard of the block's data", err.sig_err.actual_value,
              t10dif_guard(blocks[BAD_BLOCK], BG))
        check("  expected_value is the guard that arrived",
              err.sig_err.expected_value, int.from_bytes(bad[at:at + 2], "big"))
        check(f"  offset is block {BAD_BLOCK}'s in the wire stream: {BAD_BLOCK} * 520",
              err.sig_err.offset, BAD_BLOCK * (BLOCK + PI))
    finally:
        initiator.close()
        target.close()
    return check.status()


if __name__ == "__main__":
    sys.exit(main())
