"""The examples of mlx5dv_wr_set_mkey_sig_block(3), one test each, against the engine.

Each test builds the memory image or the wire image the man page describes with
the independent oracle, moves it through the engine as the example's operation
would (SEND/RECV with the MKEY as lkey, RDMA_READ/RDMA_WRITE from a remote node
through it as rkey), and compares with what the page says comes out.
"""

from __future__ import annotations

import pytest

from softhca.engine import transfer
from softhca.protocol.attrs import SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from softhca.protocol.enums import (
    BlockSize,
    MkeyErrType,
    SigCrcType,
    SigMask,
    SigT10difFlags,
    SigType,
)
from softhca.tools import oracle

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

CRC32_512 = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, 0xFFFFFFFF),
                           block_size=BlockSize.SIZE_512)
DIF = SigT10dif(bg=0xFFFF, app_tag=0x5A5A, ref_tag=0x1000, flags=SigT10difFlags.REF_REMAP)
T10DIF_4K = SigBlockDomain(sig_type=SigType.T10DIF, dif=DIF, block_size=BlockSize.SIZE_4096)

EXAMPLE_1 = SigBlockAttr(mem=CRC32_512, wire=None, check_mask=SigMask.CRC32)
EXAMPLE_2 = SigBlockAttr(mem=None, wire=T10DIF_4K, check_mask=0xFF)


def crc32_pi(block: bytes, _b: int) -> bytes:
    return oracle.crc_pi(block, SigCrcType.CRC32, 0xFFFFFFFF)


def dif_pi(block: bytes, b: int) -> bytes:
    return oracle.t10dif_pi(block, bg=0xFFFF, app=0x5A5A, ref=0x1000 + b)


def test_sig_block_example_1(node, rng):
    """SEND through the MKEY: validate each CRC32, strip it, transmit 512 bytes a block."""
    data = rng.randbytes(8 * 512)
    memory = oracle.protect_blocks(data, 512, crc32_pi)
    _, mkey = node.mkey_over(memory, sig=EXAMPLE_1)
    wire = transfer.tx(node.pd, mkey.lkey, 0, len(data))
    assert wire == data
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_sig_block_example_1_1(node, rng):
    """RECV through the MKEY: scatter, generating a CRC32 after every 512 bytes."""
    data = rng.randbytes(8 * 512)
    mr, mkey = node.mkey_over(8 * 516, sig=EXAMPLE_1)
    transfer.rx(node.pd, mkey.lkey, 0, data)
    assert mr.read() == oracle.protect_blocks(data, 512, crc32_pi)
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_sig_block_example_2(node, rng):
    """A remote RDMA_READ of the MKEY: a T10DIF generated every 4K of data."""
    data = rng.randbytes(4 * 4096)
    _, mkey = node.mkey_over(data, sig=EXAMPLE_2)
    wire = transfer.tx(node.pd, mkey.rkey, 0, 4 * 4104, remote=True)
    assert wire == oracle.protect_blocks(data, 4096, dif_pi)


def test_sig_block_example_2_1(node, rng):
    """A remote RDMA_WRITE to the MKEY: each T10DIF validated, stripped, data scattered."""
    data = rng.randbytes(4 * 4096)
    wire = oracle.protect_blocks(data, 4096, dif_pi)
    mr, mkey = node.mkey_over(len(data), sig=EXAMPLE_2)
    transfer.rx(node.pd, mkey.rkey, 0, wire, remote=True)
    assert mr.read() == data
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR
    # The validation is real: the same write with one guard byte wrong is caught.
    bad = bytearray(wire)
    bad[2 * 4104 + 4096] ^= 0x01
    transfer.rx(node.pd, mkey.rkey, 0, bytes(bad), remote=True)
    err = mkey.mkey_check()
    assert (err.err_type, err.offset) == (MkeyErrType.BAD_GUARD, 2 * 4104)
