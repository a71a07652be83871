"""The examples and the table of mlx5dv_wr_set_mkey_crypto(3), against the engine.

For every row A-J of the table: TX of the row's memory image gives exactly its
wire image, and RX of that wire image gives back the memory image. The images
are built with the oracle (crcmod guards, cryptography's own XTS per data unit).
"""

from __future__ import annotations

import os

import pytest

from softhca.engine import transfer
from softhca.protocol.attrs import CryptoAttr, SigBlockAttr
from softhca.protocol.enums import (
    MkeyErrType,
)
from softhca.tools import oracle
from softhca.tools.crypto_table import (
    DUS,
    TWEAK,
    prot,
    row_images,
    sig_pi,
)

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

N_BLOCKS = 6


def configure_row(node, row: str, key: bytes, data: bytes):
    memory, wire, mem, wire_sig, eot, order, unit = row_images(row, key, data)
    dek = node.create_dek(key)
    sig = None
    if mem or wire_sig:
        sig = SigBlockAttr(mem=mem, wire=wire_sig, check_mask=0xFF)
    crypto = CryptoAttr(encrypt_on_tx=eot, signature_crypto_order=order,
                        data_unit_size=DUS[unit], initial_tweak=TWEAK.to_bytes(16, "little"),
                        dek=dek)
    mr, mkey = node.mkey_over(memory, sig=sig, crypto=crypto)
    return memory, wire, mr, mkey


def run_row(node, row: str) -> None:
    key = os.urandom(64)
    data = os.urandom(N_BLOCKS * 512)
    memory, wire, mr, mkey = configure_row(node, row, key, data)
    assert transfer.tx(node.pd, mkey.lkey, 0, len(wire)) == wire, f"row {row} TX"
    mr.write(bytes(len(memory)))
    transfer.rx(node.pd, mkey.lkey, 0, wire)
    assert mr.read() == memory, f"row {row} RX"
    if mkey.sig is not None:
        assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR


def test_crypto_table_row_a(node): run_row(node, "A")
def test_crypto_table_row_b(node): run_row(node, "B")
def test_crypto_table_row_c(node): run_row(node, "C")
def test_crypto_table_row_d(node): run_row(node, "D")
def test_crypto_table_row_e(node): run_row(node, "E")
def test_crypto_table_row_f(node): run_row(node, "F")
def test_crypto_table_row_g(node): run_row(node, "G")
def test_crypto_table_row_h(node): run_row(node, "H")
def test_crypto_table_row_i(node): run_row(node, "I")
def test_crypto_table_row_j(node): run_row(node, "J")


def test_crypto_example_1(node):
    """Row F: memory encrypted, SEND decrypts it and transmits plaintext."""
    key, data = os.urandom(64), os.urandom(8 * 512)
    memory, wire, _, mkey = configure_row(node, "F", key, data)
    assert wire == data
    assert transfer.tx(node.pd, mkey.lkey, 0, len(data)) == data


def test_crypto_example_1_1(node):
    """Same MKEY, RECV: the plaintext from the wire is encrypted into memory."""
    key, data = os.urandom(32), os.urandom(8 * 512)
    memory, _, mr, mkey = configure_row(node, "F", key, data)
    mr.write(bytes(len(memory)))
    transfer.rx(node.pd, mkey.lkey, 0, data)
    assert mr.read() == oracle.xts(key, data, 512, TWEAK, encrypt=True)


def test_crypto_example_2(node):
    """Row C, RDMA_READ: T10DIF generated every 512 bytes, data and PI encrypted (520 units)."""
    key, data = os.urandom(64), os.urandom(8 * 512)
    _, wire, _, mkey = configure_row(node, "C", key, data)
    got = transfer.tx(node.pd, mkey.rkey, 0, 8 * 520, remote=True)
    assert got == oracle.xts(key, prot(data, sig_pi), 520, TWEAK, encrypt=True) == wire


def test_crypto_example_2_1(node):
    """Row C, RDMA_WRITE: decrypt, validate each T10DIF, strip, scatter the data alone."""
    key, data = os.urandom(64), os.urandom(8 * 512)
    _, wire, mr, mkey = configure_row(node, "C", key, data)
    mr.write(bytes(len(data)))
    transfer.rx(node.pd, mkey.rkey, 0, wire, remote=True)
    assert mr.read() == data
    assert mkey.mkey_check().err_type == MkeyErrType.NO_ERR
    # A ciphertext byte changed on the wire decrypts to garbage in that 520-byte unit:
    # the DIF check after decryption catches it at that block.
    bad = bytearray(wire)
    bad[5 * 520 + 17] ^= 0x80
    transfer.rx(node.pd, mkey.rkey, 0, bytes(bad), remote=True)
    err = mkey.mkey_check()
    assert (err.err_type, err.offset) == (MkeyErrType.BAD_GUARD, 5 * 520)
