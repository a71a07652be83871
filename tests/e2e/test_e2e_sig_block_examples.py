"""The examples of mlx5dv_wr_set_mkey_sig_block(3), end to end between two daemons.

The target owns the MKEY, the initiator has plain MRs; every byte moves over the
daemons' TCP wire as the example's verb would move it, and every call goes through
softhca.client (tests/support/e2e.py). Expected images and PI values come from the oracle
(crcmod), the error report's fields from mlx5dv_mkey_check(3) and docs/semantics.md 7.
"""

from __future__ import annotations

import softhca.client as sh
from softhca.tools import oracle

from e2e import SIG_FLAGS, sge, whole

LOCAL = sh.IBV_ACCESS_LOCAL_WRITE
REMOTE = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_READ | sh.IBV_ACCESS_REMOTE_WRITE

# Example 1: "memory domain CRC32 (seed 0xFFFFFFFF) on 512-byte blocks, wire none".
CRC32_512 = sh.Mlx5SigBlockDomain(
    sig_type=sh.MLX5DV_SIG_TYPE_CRC,
    crc=sh.Mlx5SigCrc(crc_type=sh.MLX5DV_SIG_CRC_TYPE_CRC32, seed=0xFFFFFFFF),
    block_size=sh.MLX5DV_BLOCK_SIZE_512)
EXAMPLE_1 = sh.Mlx5SigBlockAttr(mem=CRC32_512, wire=None, check_mask=sh.MLX5DV_SIG_MASK_CRC32)

# Example 2: "memory none, wire T10DIF every 4K, bg 0xFFFF, app 0x5A5A, ref 0x1000, REF_REMAP".
DIF_4K = sh.Mlx5SigBlockDomain(
    sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
    dif=sh.Mlx5SigT10Dif(bg_type=sh.MLX5DV_SIG_T10DIF_CRC, bg=0xFFFF, app_tag=0x5A5A,
                         ref_tag=0x1000, flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
    block_size=sh.MLX5DV_BLOCK_SIZE_4096)
EXAMPLE_2 = sh.Mlx5SigBlockAttr(mem=None, wire=DIF_4K, check_mask=0xFF)


def crc32_pi(block: bytes, _b: int) -> bytes:
    return oracle.crc_pi(block, sh.MLX5DV_SIG_CRC_TYPE_CRC32, 0xFFFFFFFF)


def dif_pi(block: bytes, b: int) -> bytes:
    return oracle.t10dif_pi(block, bg=0xFFFF, app=0x5A5A, ref=0x1000 + b)


def mkey_sge(mkey: sh.MKey, length: int) -> list[sh.SGE]:
    """An SGE on the MKEY: zero-based, its length in wire bytes (docs/semantics.md 4, 5)."""
    return [sh.SGE(0, length, mkey.lkey)]


async def assert_no_err(mkey: sh.MKey) -> None:
    err = await mkey.mkey_check()
    assert err.err_type == sh.MLX5DV_MKEY_NO_ERR, err


async def test_e2e_sig_block_example_1(pair, rng):
    """SEND with the target's MKEY as lkey: each CRC32 validated, stripped, and only the
    512 data bytes of each block sent; the initiator's RECV gets the data alone."""
    t, i = pair.target, pair.initiator
    data = rng.randbytes(8 * 512)
    memory = oracle.protect_blocks(data, 512, crc32_pi)
    assert len(memory) == 8 * 516
    mr = await t.reg_mr(memory)
    mkey = await t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=EXAMPLE_1)
    dst = await i.reg_mr(len(data))

    swc, rwc = await pair.send(t, mkey_sge(mkey, len(data)), i, whole(dst))
    assert (swc.status, swc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_SEND), swc
    assert (rwc.status, rwc.opcode, rwc.byte_len) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RECV,
                                                      len(data)), rwc
    assert await dst.read() == data
    await assert_no_err(mkey)

    # "validate each CRC32": one stored CRC32 byte of block 3 wrong in target memory.
    b = 3
    bad = bytearray(memory)
    bad[b * 516 + 512] ^= 0x01
    await mr.write(bytes(bad))
    await dst.write(bytes(len(data)))
    swc, rwc = await pair.send(t, mkey_sge(mkey, len(data)), i, whole(dst))
    # A signature error is not a transport error: the data still moves.
    assert swc.status == sh.IBV_WC_SUCCESS, swc
    assert (rwc.status, rwc.byte_len) == (sh.IBV_WC_SUCCESS, len(data)), rwc
    assert await dst.read() == data
    err = await mkey.mkey_check()
    stored = int.from_bytes(bad[b * 516 + 512:b * 516 + 516], "big")
    computed = oracle.crc32_fcph(data[b * 512:(b + 1) * 512], 0xFFFFFFFF)
    assert err.err_type == sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD, err
    assert (err.sig_err.actual_value, err.sig_err.expected_value, err.sig_err.offset) == (
        computed, stored, b * 516), err
    # mkey_check clears the latched error.
    await assert_no_err(mkey)


async def test_e2e_sig_block_example_1_1(pair, rng):
    """SEND from the initiator's plain MR, RECV whose SGE is the target's MKEY: the data
    scattered with a CRC32 generated after every 512 bytes."""
    t, i = pair.target, pair.initiator
    data = rng.randbytes(8 * 512)
    mr = await t.reg_mr(8 * 516)
    mkey = await t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=EXAMPLE_1)
    src = await i.reg_mr(data)

    swc, rwc = await pair.send(i, whole(src), t, mkey_sge(mkey, len(data)))
    assert (swc.status, swc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_SEND), swc
    assert (rwc.status, rwc.opcode, rwc.byte_len) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RECV,
                                                      len(data)), rwc
    assert await mr.read() == oracle.protect_blocks(data, 512, crc32_pi)
    await assert_no_err(mkey)


async def test_e2e_sig_block_example_2(pair, rng):
    """The initiator RDMA_READs the target's MKEY: a T10DIF generated every 4K of data."""
    t, i = pair.target, pair.initiator
    data = rng.randbytes(4 * 4096)
    mr = await t.reg_mr(data)
    mkey = await t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=EXAMPLE_2)
    dst = await i.reg_mr(4 * 4104)

    wc = await pair.read(whole(dst), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_READ), wc
    assert await dst.read() == oracle.protect_blocks(data, 4096, dif_pi)
    # The target's memory is not changed by being read.
    assert await mr.read() == data
    await assert_no_err(mkey)


async def test_e2e_sig_block_example_2_1(pair, rng):
    """The initiator RDMA_WRITEs data+T10DIF to the target's MKEY: each T10DIF validated,
    stripped, and the data alone scattered; a bad guard is reported by the target."""
    t, i = pair.target, pair.initiator
    data = rng.randbytes(4 * 4096)
    image = oracle.protect_blocks(data, 4096, dif_pi)
    mr = await t.reg_mr(len(data))
    mkey = await t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=EXAMPLE_2)
    src = await i.reg_mr(image)

    wc = await pair.write(whole(src), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_WRITE), wc
    assert await mr.read() == data
    await assert_no_err(mkey)

    # "validate each T10DIF field": one guard byte of block 2 wrong on the wire.
    b = 2
    bad = bytearray(image)
    bad[b * 4104 + 4096] ^= 0x01
    await src.write(bytes(bad))
    await mr.write(bytes(len(data)))
    wc = await pair.write([sge(src)], mkey.rkey, 0)
    # The peer that wrote learns nothing from its completion (docs/semantics.md 7).
    assert wc.status == sh.IBV_WC_SUCCESS, wc
    assert await mr.read() == data
    err = await mkey.mkey_check()
    stored = int.from_bytes(bad[b * 4104 + 4096:b * 4104 + 4098], "big")
    computed = oracle.t10dif_crc(data[b * 4096:(b + 1) * 4096], 0xFFFF)
    assert err.err_type == sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD, err
    assert (err.sig_err.actual_value, err.sig_err.expected_value, err.sig_err.offset) == (
        computed, stored, b * 4104), err
    await assert_no_err(mkey)
