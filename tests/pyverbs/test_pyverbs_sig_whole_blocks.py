"""The upstream T10-DIF and CRC MKEY tests' scenario (a wire domain of 520-byte T10-DIF
blocks, 516-byte CRC32 blocks) with whole blocks, through softhca's pyverbs: rdma-core's
own tests move 512 bytes, which softhca counts as wire bytes, so one partial block and
no PI; here two whole blocks move, and both PIs are judged.

- The PI that travels: an RDMA_WRITE from the signature MKEY puts data and a PI per block
  on the target; each PI is compared with crcmod's CRC of its block.
- The PI that is stripped: an RDMA_READ into the MKEY brings blocks and PIs that the test
  computed with crcmod; the initiator's memory gets the data alone and mkey_check finds no
  error. With one PI's guard changed, mkey_check reports that block's guard error with the
  guard crcmod computes as actual and the changed one as expected.

Expected values come from crcmod (CRC-16/T10-DIF, poly 0x8BB7, register seeded with bg;
CRC-32 FC-PH, poly 0x04C11DB7 MSB first, seed and final xor 0xFFFFFFFF), checked first
against their published check values of "123456789", and from docs/semantics.md's PI
layout (every field big-endian).
"""

from __future__ import annotations

import random

import crcmod
import pytest

import softhca.client.pyverbs.enums as e
import softhca.client.pyverbs.providers.mlx5.mlx5_enums as dve
from softhca.client.pyverbs.addr import AHAttr, GlobalRoute
from softhca.client.pyverbs.cq import CQ
from softhca.client.pyverbs.mr import MR
from softhca.client.pyverbs.pd import PD
from softhca.client.pyverbs.providers.mlx5.mlx5dv import (
    Mlx5Context,
    Mlx5DVContextAttr,
    Mlx5DVQPInitAttr,
    Mlx5QP,
)
from softhca.client.pyverbs.providers.mlx5.mlx5dv_mkey import (
    Mlx5Mkey,
    Mlx5MkeyConfAttr,
    Mlx5SigBlockAttr,
    Mlx5SigBlockDomain,
    Mlx5SigCrc,
    Mlx5SigT10Dif,
)
from softhca.client.pyverbs.qp import QPAttr, QPCap, QPInitAttrEx
from softhca.client.pyverbs.wr import SGE, SendWR

BLK, BLOCKS = 512, 2
BG, APP, REF = 0xFFFF, 0x5A5A, 0x0F0F0F0F
ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ

t10dif = crcmod.mkCrcFun(0x18BB7, initCrc=BG, rev=False, xorOut=0)
crc32 = crcmod.mkCrcFun(0x104C11DB7, initCrc=0, rev=False, xorOut=0xFFFFFFFF)


def test_crcmods_parameters_give_the_published_check_values():
    assert crcmod.mkCrcFun(0x18BB7, initCrc=0, rev=False, xorOut=0)(b"123456789") == 0xD0DB
    assert crc32(b"123456789") == 0xFC891918


def t10dif_pi(block: bytes, b: int) -> bytes:
    # REF_REMAP: the reference tag counts the blocks up from ref_tag.
    return t10dif(block).to_bytes(2, "big") + APP.to_bytes(2, "big") + \
        (REF + b & 0xFFFFFFFF).to_bytes(4, "big")


def crc32_pi(block: bytes, b: int) -> bytes:
    return crc32(block).to_bytes(4, "big")


CASES = {
    "t10dif-520": (8, t10dif_pi, lambda: Mlx5SigBlockDomain(
        sig_type=dve.MLX5DV_SIG_TYPE_T10DIF, block_size=dve.MLX5DV_BLOCK_SIZE_512,
        dif=Mlx5SigT10Dif(bg_type=dve.MLX5DV_SIG_T10DIF_CRC, bg=BG, app_tag=APP, ref_tag=REF,
                          flags=dve.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP)),
        dve.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD),
    "crc32-516": (4, crc32_pi, lambda: Mlx5SigBlockDomain(
        sig_type=dve.MLX5DV_SIG_TYPE_CRC, block_size=dve.MLX5DV_BLOCK_SIZE_512,
        crc=Mlx5SigCrc(crc_type=dve.MLX5DV_SIG_CRC_TYPE_CRC32, seed=0xFFFFFFFF)),
        dve.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD),
}


class Side:
    def __init__(self):
        self.ctx = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0")
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 16, None, None, 0)
        dv = Mlx5DVQPInitAttr(comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
                              send_ops_flags=dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)
        self.qp = Mlx5QP(self.ctx, QPInitAttrEx(
            qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, pd=self.pd, cap=QPCap(8, 8),
            comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            send_ops_flags=e.IBV_QP_EX_WITH_SEND | e.IBV_QP_EX_WITH_RDMA_WRITE
            | e.IBV_QP_EX_WITH_RDMA_READ), dv)
        self.qp.to_init(QPAttr(port_num=1, qp_access_flags=ACCESS))

    def connect(self, peer: Side) -> None:
        attr = QPAttr(port_num=1)
        attr.qp_access_flags, attr.path_mtu = ACCESS, e.IBV_MTU_1024
        attr.dest_qp_num, attr.rq_psn, attr.sq_psn = peer.qp.qp_num, 0, 0
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 12, 3, 7
        attr.ah_attr = AHAttr(is_global=1, port_num=1,
                              gr=GlobalRoute(dgid=peer.ctx.query_gid(1, 0), sgid_index=0))
        self.qp.to_rtr(attr)
        self.qp.to_rts(attr)

    def wait(self, what: str):
        for _ in range(100000):
            n, wcs = self.cq.poll()
            if n:
                assert wcs[0].status == e.IBV_WC_SUCCESS, (what, wcs[0].status)
                return wcs[0]
        raise AssertionError(f"no completion for {what}")

    def rdma(self, opcode, mkey, wire_len: int, mr) -> None:
        wr = SendWR(wr_id=9, opcode=opcode, num_sge=1, sg=[SGE(0, wire_len, mkey.lkey)],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(mr.rkey, mr.buf)
        self.qp.post_send(wr)
        self.wait(opcode)

    def close(self):
        for o in (self.qp, self.cq, self.pd, self.ctx):
            o.close()


@pytest.mark.parametrize("case", sorted(CASES))
def test_whole_blocks_carry_the_pi_and_have_it_stripped(case):
    pi_len, pi_of, wire_domain, bad_guard = CASES[case]
    data = random.Random(case).randbytes(BLOCKS * BLK)
    blocks = [data[b * BLK:(b + 1) * BLK] for b in range(BLOCKS)]
    wire = b"".join(blk + pi_of(blk, b) for b, blk in enumerate(blocks))
    assert len(wire) == BLOCKS * (BLK + pi_len)        # 2 x 520 or 2 x 516
    ini, tgt = Side(), Side()
    try:
        ini.connect(tgt)
        tgt.connect(ini)
        mem = MR(ini.pd, len(data), ACCESS)
        mem.write(data, len(data))
        far = MR(tgt.pd, len(wire), ACCESS)
        mkey = Mlx5Mkey(ini.pd, dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                        | dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 1)
        ini.qp.wr_start()
        ini.qp.wr_id, ini.qp.wr_flags = 1, e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
        ini.qp.wr_mkey_configure(mkey, 3, Mlx5MkeyConfAttr())
        ini.qp.wr_set_mkey_access_flags(ACCESS)
        ini.qp.wr_set_mkey_layout_list([SGE(mem.buf, len(data), mem.lkey)])
        ini.qp.wr_set_mkey_sig_block(Mlx5SigBlockAttr(mem=None, wire=wire_domain(),
                                                      check_mask=0xFF))
        ini.qp.wr_complete()
        ini.wait("configure")

        # The PI that travels: generated per whole block on the way out.
        ini.rdma(e.IBV_WR_RDMA_WRITE, mkey, len(wire), far)
        assert far.read(len(wire), 0) == wire
        assert mkey.mkey_check().err_type == dve.MLX5DV_MKEY_NO_ERR

        # The PI that is stripped: checked on the way in, the data alone lands.
        mem.write(bytes(len(data)), len(data))
        ini.rdma(e.IBV_WR_RDMA_READ, mkey, len(wire), far)
        assert mem.read(len(data), 0) == data
        assert mkey.mkey_check().err_type == dve.MLX5DV_MKEY_NO_ERR

        # A changed guard in block 1's PI is found, and named with both values.
        at = BLK + pi_len + BLK
        bad = bytearray(wire)
        bad[at] ^= 0x80
        far.write(bytes(bad), len(bad))
        ini.rdma(e.IBV_WR_RDMA_READ, mkey, len(wire), far)
        err = mkey.mkey_check()
        guard_len = 2 if pi_len == 8 else 4
        assert err.err_type == bad_guard
        # mlx5dv_wr_mkey_check(3): actual is "calculated from the transferred data",
        # expected is what "appears in the signature" (the changed PI).
        assert err.sig_err.actual_value == int.from_bytes(wire[at:at + guard_len], "big")
        assert err.sig_err.expected_value == int.from_bytes(bad[at:at + guard_len], "big")
        mkey.close()
        mem.close()
        far.close()
    finally:
        ini.close()
        tgt.close()
