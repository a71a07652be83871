"""Signature processing per block (docs/semantics.md sections 5-7), with expected PI
computed by the oracle: masks, escapes, REF_REMAP, seeds, CSUM, block sizes,
tails, offsets, and the errors mkey_check reports."""

from __future__ import annotations

import pytest

from softhca.engine import transfer
from softhca.engine.completion import Fault, TransferError
from softhca.protocol.attrs import SGE, SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from softhca.protocol.enums import (
    BLOCK_SIZE_BYTES,
    BlockSize,
    MkeyErrType,
    SigBlockAttrFlags,
    SigCrcType,
    SigT10difBgType,
    SigT10difFlags,
    SigType,
)
from softhca.tools import oracle

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

ESC = SigT10difFlags


def dif_domain(bs=BlockSize.SIZE_512, **kw) -> SigBlockDomain:
    return SigBlockDomain(sig_type=SigType.T10DIF, dif=SigT10dif(**kw), block_size=bs)


def crc_domain(crc_type, seed, bs=BlockSize.SIZE_512) -> SigBlockDomain:
    return SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(crc_type, seed), block_size=bs)


def dif_pi_fn(*, csum=False, bg=0, app=0, ref=0, remap=False, first=0):
    def pi(block, b):
        return oracle.t10dif_pi(block, csum=csum, bg=bg, app=app,
                                ref=ref + (first + b if remap else 0))
    return pi


def wire_dif_mkey(node, n_blocks, **dif_kw):
    """An MKEY with plain memory and a T10DIF wire domain: RX checks wire PI."""
    check_mask = dif_kw.pop("check_mask", 0xFF)
    mr, mkey = node.mkey_over(n_blocks * 512, sig=SigBlockAttr(
        mem=None, wire=dif_domain(**dif_kw), check_mask=check_mask))
    return mr, mkey


# -- generation: both seeds of every guard, CSUM, every block size -------------------------

@pytest.mark.parametrize("bs", list(BlockSize))
@pytest.mark.parametrize("bg_type,bg", [(SigT10difBgType.CRC, 0), (SigT10difBgType.CRC, 0xFFFF),
                                        (SigT10difBgType.CSUM, 0), (SigT10difBgType.CSUM, 0xFFFF)])
def test_t10dif_generation_every_guard_and_block_size(node, rng, bs, bg_type, bg):
    size = BLOCK_SIZE_BYTES[bs]
    data = rng.randbytes(3 * size)
    _, mkey = node.mkey_over(data, sig=SigBlockAttr(
        wire=dif_domain(bs, bg_type=bg_type, bg=bg, app_tag=0x1357, ref_tag=0xFFFFFFFE,
                        flags=ESC.REF_REMAP)))
    wire = transfer.tx(node.pd, mkey.lkey, 0, 3 * (size + 8))
    pi = dif_pi_fn(csum=bg_type == SigT10difBgType.CSUM, bg=bg, app=0x1357, ref=0xFFFFFFFE,
                   remap=True)
    # REF_REMAP wraps modulo 2^32: 0xFFFFFFFE, 0xFFFFFFFF, 0.
    assert wire == oracle.protect_blocks(data, size, pi)


@pytest.mark.parametrize("crc_type", list(SigCrcType))
@pytest.mark.parametrize("all_ones", [False, True])
@pytest.mark.parametrize("bs", [BlockSize.SIZE_512, BlockSize.SIZE_4048, BlockSize.SIZE_4160])
def test_crc_generation_both_seeds(node, rng, crc_type, all_ones, bs):
    size = BLOCK_SIZE_BYTES[bs]
    seed = (0xFFFFFFFFFFFFFFFF if crc_type == SigCrcType.CRC64_XP10 else 0xFFFFFFFF) \
        if all_ones else 0
    data = rng.randbytes(2 * size)
    mr, mkey = node.mkey_over(len(data) + 16, sig=SigBlockAttr(
        mem=crc_domain(crc_type, seed, bs), check_mask=0xFF))
    transfer.rx(node.pd, mkey.lkey, 0, data)
    expect = oracle.protect_blocks(data, size, lambda blk, b: oracle.crc_pi(blk, crc_type, seed))
    assert mr.read(len(expect)) == expect
    # TX checks what RX generated, and strips it.
    assert transfer.tx(node.pd, mkey.lkey, 0, len(data)) == data
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


# -- checks, masks and escapes ---------------------------------------------------------------

def test_half_checked_app_tag(node, rng):
    """mlx5dv_wr_set_mkey_sig_block(3): "check_mask allows validating a part of the
    application tag". Bit 5 is APP[1], the app tag's first (high) byte."""
    data = rng.randbytes(4 * 512)
    wire = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn(app=0xAB00)))
    wire[520 + 512 + 3] = 0xCD            # block 1: low app byte differs (unchecked)
    mr, mkey = wire_dif_mkey(node, 4, app_tag=0xAB00, check_mask=0xC0 | 0x20)
    transfer.rx(node.pd, mkey.lkey, 0, bytes(wire))
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR
    wire[2 * 520 + 512 + 2] = 0xAC        # block 2: high app byte differs (checked)
    transfer.rx(node.pd, mkey.lkey, 0, bytes(wire))
    err = mkey.mkey_check()
    assert (err.err_type, err.offset, err.actual_value, err.expected_value) == \
        (MkeyErrType.BAD_APPTAG, 2 * 520, 0xAB00, 0xAC00)
    assert mr.read() == data              # the data moves even when a check fails


def test_check_mask_without_guard_ignores_corrupt_data(node, rng):
    data = rng.randbytes(2 * 512)
    wire = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn(ref=7)))
    wire[100] ^= 0xFF
    _, mkey = wire_dif_mkey(node, 2, ref_tag=7, check_mask=0x3F)
    transfer.rx(node.pd, mkey.lkey, 0, bytes(wire))
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


@pytest.mark.parametrize("flags,app,ref,escaped", [
    (ESC.APP_ESCAPE, 0xFFFF, 0x1234, True),
    (ESC.APP_ESCAPE, 0xFFFE, 0x1234, False),
    (ESC.APP_REF_ESCAPE, 0xFFFF, 0x1234, False),
    (ESC.APP_REF_ESCAPE, 0xFFFF, 0xFFFFFFFF, True),
    (ESC.APP_ESCAPE | ESC.APP_REF_ESCAPE, 0xFFFF, 0x1234, False),   # only APP_REF_ESCAPE applies
    (ESC.APP_ESCAPE | ESC.APP_REF_ESCAPE, 0xFFFF, 0xFFFFFFFF, True),
    (0, 0xFFFF, 0xFFFFFFFF, False),
])
def test_escapes(node, rng, flags, app, ref, escaped):
    data = rng.randbytes(3 * 512)
    wire = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn()))
    # Block 1 carries the escape tags and a wrong guard.
    wire[520 + 512:520 + 520] = bytes(2) + app.to_bytes(2, "big") + ref.to_bytes(4, "big")
    _, mkey = wire_dif_mkey(node, 3, flags=flags)
    transfer.rx(node.pd, mkey.lkey, 0, bytes(wire))
    err = mkey.mkey_check()
    if escaped:
        assert err.err_type == MkeyErrType.NO_ERR
    else:
        assert (err.err_type, err.offset) == (MkeyErrType.BAD_GUARD, 520)


def test_ref_remap_checks_the_block_index_from_mkey_offset(node, rng):
    """B = X // W + b: a transfer that starts at block 3 expects ref_tag + 3 first."""
    data = rng.randbytes(8 * 512)
    wire = oracle.protect_blocks(data, 512, dif_pi_fn(ref=100, remap=True))
    mr, mkey = wire_dif_mkey(node, 8, ref_tag=100, flags=ESC.REF_REMAP)
    transfer.rx(node.pd, mkey.lkey, 3 * 520, wire[3 * 520:6 * 520])
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR
    assert mr.read(3 * 512, 3 * 512) == data[3 * 512:6 * 512]
    # The same bytes written at block 4 carry the wrong ref tags.
    transfer.rx(node.pd, mkey.lkey, 4 * 520, wire[3 * 520:6 * 520])
    err = mkey.mkey_check()
    assert (err.err_type, err.actual_value, err.expected_value, err.offset) == \
        (MkeyErrType.BAD_REFTAG, 104, 103, 0)


def test_ref_without_remap_is_constant(node, rng):
    data = rng.randbytes(3 * 512)
    _, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=dif_domain(ref_tag=0xCAFE)))
    assert transfer.tx(node.pd, mkey.lkey, 520, 2 * 520) == \
        oracle.protect_blocks(data[512:], 512, dif_pi_fn(ref=0xCAFE))


# -- copy masks ---------------------------------------------------------------------------------

def test_automatic_copy_mask_copies_only_matching_parts(node, rng):
    """Memory and wire T10DIF with the same bg but different app and ref tags: the guard
    is copied (even a wrong one, unchecked), app and ref are generated."""
    data = rng.randbytes(2 * 512)
    memory = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn(app=1, ref=2)))
    memory[512:514] = b"\x12\x34"          # block 0's guard, wrong but not checked
    _, mkey = node.mkey_over(bytes(memory), sig=SigBlockAttr(
        mem=dif_domain(app_tag=1, ref_tag=2), wire=dif_domain(app_tag=9, ref_tag=8),
        check_mask=0x3F))
    wire = transfer.tx(node.pd, mkey.lkey, 0, 2 * 520)
    expect = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn(app=9, ref=8)))
    expect[512:514] = b"\x12\x34"
    assert wire == bytes(expect)
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_automatic_copy_mask_is_empty_for_different_guards(node, rng):
    data = rng.randbytes(2 * 512)
    memory = oracle.protect_blocks(data, 512, dif_pi_fn())
    _, mkey = node.mkey_over(memory, sig=SigBlockAttr(
        mem=dif_domain(), wire=dif_domain(bg_type=SigT10difBgType.CSUM), check_mask=0xFF))
    assert transfer.tx(node.pd, mkey.lkey, 0, 2 * 520) == \
        oracle.protect_blocks(data, 512, dif_pi_fn(csum=True))


def test_explicit_copy_mask_overrides(node, rng):
    """COPY_MASK: keep the app tag bytes the application stored (unknown in advance, so
    unchecked), generate the rest even though the configs match."""
    data = rng.randbytes(2 * 512)
    memory = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn(app=5, ref=6)))
    memory[512 + 2:512 + 4] = b"\x0A\x0B"
    memory[520 + 512 + 2:520 + 512 + 4] = b"\x0C\x0D"
    _, mkey = node.mkey_over(bytes(memory), sig=SigBlockAttr(
        mem=dif_domain(app_tag=5, ref_tag=6), wire=dif_domain(app_tag=5, ref_tag=6),
        flags=SigBlockAttrFlags.COPY_MASK, copy_mask=0x30, check_mask=0xCF))
    wire = transfer.tx(node.pd, mkey.lkey, 0, 2 * 520)
    expect = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn(app=5, ref=6)))
    expect[512 + 2:512 + 4] = b"\x0A\x0B"
    expect[520 + 512 + 2:520 + 512 + 4] = b"\x0C\x0D"
    assert wire == bytes(expect)
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_crc_to_crc_copy_of_matching_types(node, rng):
    data = rng.randbytes(2 * 512)
    memory = bytearray(oracle.protect_blocks(data, 512,
                                      lambda b, i: oracle.crc_pi(b, SigCrcType.CRC32C, 0)))
    memory[512] ^= 0xFF                    # copied as is: the check_mask is empty
    _, mkey = node.mkey_over(bytes(memory), sig=SigBlockAttr(
        mem=crc_domain(SigCrcType.CRC32C, 0), wire=crc_domain(SigCrcType.CRC32C, 0xFFFFFFFF),
        check_mask=0))
    assert transfer.tx(node.pd, mkey.lkey, 0, 2 * 516) == bytes(memory)


# -- lengths and offsets (docs/semantics.md section 5) ------------------------------------------

def test_trailing_partial_block_is_plain_data(node, rng):
    """rdma-core's own tests move 512 bytes through a 520-byte protected block."""
    data = rng.randbytes(2 * 512 + 300)
    mr, mkey = node.mkey_over(3 * 520, sig=SigBlockAttr(mem=dif_domain(app_tag=3),
                                                        check_mask=0xFF))
    transfer.rx(node.pd, mkey.lkey, 0, data)
    expect = oracle.protect_blocks(data, 512, dif_pi_fn(app=3))
    assert mr.read(len(expect)) == expect
    assert transfer.tx(node.pd, mkey.lkey, 0, len(data)) == data
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_a_tail_that_splits_pi_is_a_length_error(node):
    mr, mkey = node.mkey_over(4 * 512, sig=SigBlockAttr(wire=dif_domain()))
    with pytest.raises(TransferError) as info:
        transfer.tx(node.pd, mkey.lkey, 0, 520 + 515)
    assert info.value.fault is Fault.LENGTH
    assert info.value.status(remote=False).name == "LOC_LEN_ERR"
    assert info.value.status(remote=True).name == "REM_INV_REQ_ERR"


def test_misaligned_start_is_a_length_error(node):
    mr, mkey = node.mkey_over(4 * 512, sig=SigBlockAttr(wire=dif_domain()))
    with pytest.raises(TransferError) as info:
        transfer.rx(node.pd, mkey.lkey, 512, bytes(520))
    assert info.value.fault is Fault.LENGTH
    assert mr.read() == bytes(4 * 512)


def test_offsets_mid_mkey_across_layout_pieces(node, rng):
    """An MKEY over three MRs, signature in memory; a transfer starting at block 2."""
    mrs = [node.reg_mr(3 * 520) for _ in range(3)]
    mkey = node.create_mkey(max_entries=4)
    # Pieces deliberately not block-aligned: 700 + 1000 + 2980 bytes.
    node.configure(mkey, sges=[SGE(mrs[0].addr + 10, 700, mrs[0].lkey),
                               SGE(mrs[1].addr, 1000, mrs[1].lkey),
                               SGE(mrs[2].addr + 100, 1000, mrs[2].lkey)],
                   sig=SigBlockAttr(mem=dif_domain(ref_tag=50, flags=ESC.REF_REMAP),
                                    check_mask=0xFF))
    data = rng.randbytes(3 * 512)
    transfer.rx(node.pd, mkey.lkey, 2 * 512, data)
    memory = oracle.protect_blocks(data, 512, dif_pi_fn(ref=50, remap=True, first=2))
    concat = mrs[0].read(700, 10) + mrs[1].read(1000) + mrs[2].read(1000, 100)
    assert concat[2 * 520:5 * 520] == memory
    assert concat[:2 * 520] == bytes(2 * 520)
    assert transfer.tx(node.pd, mkey.lkey, 3 * 512, 2 * 512) == data[512:]
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_access_beyond_the_mkey(node):
    mr, mkey = node.mkey_over(4 * 512, sig=SigBlockAttr(wire=dif_domain()))
    with pytest.raises(TransferError) as info:
        transfer.tx(node.pd, mkey.lkey, 2 * 520, 3 * 520)
    assert info.value.fault is Fault.ACCESS
    assert info.value.status(remote=True).name == "REM_ACCESS_ERR"


# -- signature errors (docs/semantics.md section 7) -----------------------------------------------

N = 8


def corrupted_wire(rng, field: str, k: int):
    data = rng.randbytes(N * 512)
    wire = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn(app=0x4242, ref=0x10, remap=True)))
    at = {"guard": 512, "app": 514, "ref": 516, "data": 77}[field]
    wire[k * 520 + at] ^= 0x01
    return data, bytes(wire)


@pytest.mark.parametrize("k", [0, 5, N - 1])
@pytest.mark.parametrize("field,err_type", [("guard", MkeyErrType.BAD_GUARD),
                                            ("app", MkeyErrType.BAD_APPTAG),
                                            ("ref", MkeyErrType.BAD_REFTAG),
                                            ("data", MkeyErrType.BAD_GUARD)])
def test_corruption_in_block_k(node, rng, field, err_type, k):
    data, wire = corrupted_wire(rng, field, k)
    mr, mkey = wire_dif_mkey(node, N, app_tag=0x4242, ref_tag=0x10, flags=ESC.REF_REMAP)
    transfer.rx(node.pd, mkey.rkey, 0, wire, remote=True)
    err = mkey.mkey_check()
    block = wire[k * 520:k * 520 + 512]
    stored = wire[k * 520 + 512:(k + 1) * 520]
    actual, expected = {
        MkeyErrType.BAD_GUARD: (oracle.t10dif_crc(block, 0), int.from_bytes(stored[:2], "big")),
        MkeyErrType.BAD_APPTAG: (0x4242, int.from_bytes(stored[2:4], "big")),
        MkeyErrType.BAD_REFTAG: (0x10 + k, int.from_bytes(stored[4:], "big")),
    }[err_type]
    assert (err.err_type, err.actual_value, err.expected_value, err.offset) == \
        (err_type, actual, expected, k * 520)
    assert actual != expected
    # mkey_check clears the latched error.
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR
    # The data moved anyway: a signature error is not a transport error.
    if field != "data":
        assert mr.read() == data


def test_only_the_first_error_is_kept(node, rng):
    data = rng.randbytes(N * 512)
    wire = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn()))
    wire[2 * 520 + 515] ^= 1               # block 2 app tag
    wire[6 * 520 + 512] ^= 1               # block 6 guard
    _, mkey = wire_dif_mkey(node, N)
    transfer.rx(node.pd, mkey.lkey, 0, bytes(wire))
    # A second transfer with its own error does not replace the latched one.
    transfer.rx(node.pd, mkey.lkey, 6 * 520, bytes(wire[6 * 520:]))
    err = mkey.mkey_check()
    assert (err.err_type, err.offset) == (MkeyErrType.BAD_APPTAG, 2 * 520)
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_first_failing_field_in_order_guard_app_ref(node, rng):
    data = rng.randbytes(2 * 512)
    wire = bytearray(oracle.protect_blocks(data, 512, dif_pi_fn()))
    wire[520 + 513] ^= 1                   # guard, app and ref of block 1 all wrong
    wire[520 + 515] ^= 1
    wire[520 + 519] ^= 1
    _, mkey = wire_dif_mkey(node, 2)
    transfer.rx(node.pd, mkey.lkey, 0, bytes(wire))
    assert mkey.mkey_check().err_type == MkeyErrType.BAD_GUARD


@pytest.mark.parametrize("crc_type", list(SigCrcType))
def test_crc_error_values_and_memory_domain_offset(node, rng, crc_type):
    """On TX the input is the memory domain: offset counts memory bytes, b * (bs + PI)."""
    seed = 0
    size = 4 if crc_type != SigCrcType.CRC64_XP10 else 8
    data = rng.randbytes(4 * 512)
    memory = bytearray(oracle.protect_blocks(data, 512, lambda b, i: oracle.crc_pi(b, crc_type, seed)))
    memory[3 * (512 + size) + 5] ^= 0x10
    _, mkey = node.mkey_over(bytes(memory), sig=SigBlockAttr(
        mem=crc_domain(crc_type, seed), check_mask=0xFF))
    transfer.tx(node.pd, mkey.lkey, 0, len(data))
    err = mkey.mkey_check()
    block = bytes(memory[3 * (512 + size):3 * (512 + size) + 512])
    stored = int.from_bytes(memory[3 * (512 + size) + 512:4 * (512 + size)], "big")
    assert (err.err_type, err.offset, err.expected_value) == \
        (MkeyErrType.BAD_GUARD, 3 * (512 + size), stored)
    assert err.actual_value == oracle.CRC_FUNCS[crc_type][0](block, seed)
