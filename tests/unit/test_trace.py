"""The pipeline's trace: the stages each man page example describes, in order."""

from __future__ import annotations

import os

import pytest

from softhca.engine import transfer
from softhca.protocol.attrs import CryptoAttr, SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from softhca.protocol.enums import (
    BlockSize,
    MkeyErrType,
    SigCrcType,
    SignatureCryptoOrder,
    SigType,
)

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

DIF_4K = SigBlockDomain(sig_type=SigType.T10DIF, dif=SigT10dif(), block_size=BlockSize.SIZE_4096)
DIF_512 = SigBlockDomain(sig_type=SigType.T10DIF, dif=SigT10dif(), block_size=BlockSize.SIZE_512)
CRC32_512 = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, 0),
                           block_size=BlockSize.SIZE_512)


def stages(fn, *args, **kw):
    events = []
    fn(*args, trace=events.append, **kw)
    return events


def test_sig_block_example_1_stages(node):
    """Gather with the CRC32 fields, validate each, strip, transmit."""
    mr, mkey = node.mkey_over(2 * 516, sig=SigBlockAttr(mem=CRC32_512, check_mask=0xF0))
    transfer.rx(node.pd, mkey.lkey, 0, bytes(1024))
    ev = stages(transfer.tx, node.pd, mkey.lkey, 0, 1024)
    assert [e.stage for e in ev] == ["gather", "check", "strip", "wire"]
    assert ev[1].detail["results"] == [MkeyErrType.NO_ERR] * 2


def test_sig_block_example_2_1_stages(node):
    """Receive, validate the T10-DIF of each 4096-byte block, strip, scatter."""
    data = os.urandom(2 * 4096)
    src, src_key = node.mkey_over(data, sig=SigBlockAttr(wire=DIF_4K))
    wire = transfer.tx(node.pd, src_key.lkey, 0, 2 * 4104)
    mr, mkey = node.mkey_over(len(data), sig=SigBlockAttr(wire=DIF_4K, check_mask=0xFF))
    ev = stages(transfer.rx, node.pd, mkey.rkey, 0, wire, remote=True)
    assert [e.stage for e in ev] == ["wire", "check", "strip", "scatter"]
    assert ev[-1].data == data


def test_crypto_example_2_stages(node):
    """Gather, generate a T10DIF every 512 bytes, encrypt data and PI, transmit."""
    dek = node.create_dek(os.urandom(64))
    _, mkey = node.mkey_over(os.urandom(1024), sig=SigBlockAttr(wire=DIF_512), crypto=CryptoAttr(
        encrypt_on_tx=True, data_unit_size=BlockSize.SIZE_520, dek=dek,
        signature_crypto_order=SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX))
    ev = stages(transfer.tx, node.pd, mkey.rkey, 0, 1040, remote=True)
    assert [e.stage for e in ev] == ["gather", "generate", "encrypt", "wire"]
    assert ev[2].detail["data_unit_size"] == 520
