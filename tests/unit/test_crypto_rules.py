"""AES-XTS on an MKEY (docs/semantics.md section 8): data units counted from the MKEY's
offset 0, job sizes, keytags, and the completions their failures give."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from softhca.engine import transfer
from softhca.engine.completion import Fault, TransferError
from softhca.protocol.attrs import CryptoAttr
from softhca.protocol.enums import BlockSize, WcStatus
from softhca.tools import oracle

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

KEY = bytes(range(64))
TWEAK = 5


def crypto_mkey(node, length, dus=BlockSize.SIZE_512, keytag=None, attr_keytag=bytes(8)):
    kw = {"has_keytag": True, "keytag": keytag} if keytag else {}
    dek = node.create_dek(KEY, **kw)
    attr = CryptoAttr(encrypt_on_tx=True, data_unit_size=dus, dek=dek, keytag=attr_keytag,
                      initial_tweak=TWEAK.to_bytes(16, "little"))
    mr, mkey = node.mkey_over(length, crypto=attr)
    return mr, mkey, dek


def test_data_units_count_from_mkey_offset_zero(node):
    data = os.urandom(8 * 512)
    mr, mkey, _ = crypto_mkey(node, len(data))
    mr.write(data)
    # Units 3..5: tweaks 5+3 .. 5+5.
    wire = transfer.tx(node.pd, mkey.lkey, 3 * 512, 3 * 512)
    assert wire == oracle.xts(KEY, data[3 * 512:6 * 512], 512, TWEAK + 3, encrypt=True)


def test_a_short_last_unit(node):
    """J % 16 == 0 and J % dus <= dus - 16: the last unit is XTS over its own length."""
    data = os.urandom(2 * 512 + 48)
    mr, mkey, _ = crypto_mkey(node, len(data))
    mr.write(data)
    wire = transfer.tx(node.pd, mkey.lkey, 0, len(data))
    assert wire == oracle.xts(KEY, data, 512, TWEAK, encrypt=True)
    mr.write(bytes(len(data)))
    transfer.rx(node.pd, mkey.lkey, 0, wire)
    assert mr.read() == data


@pytest.mark.parametrize("dus,length", [(BlockSize.SIZE_520, 520 * 3), (BlockSize.SIZE_4160, 4160),
                                        (BlockSize.SIZE_4048, 4048 * 2)])
def test_ciphertext_stealing_units(node, dus, length):
    data = os.urandom(length)
    mr, mkey, _ = crypto_mkey(node, length, dus)
    mr.write(data)
    unit = {BlockSize.SIZE_520: 520, BlockSize.SIZE_4160: 4160, BlockSize.SIZE_4048: 4048}[dus]
    assert transfer.tx(node.pd, mkey.lkey, 0, length) == \
        oracle.xts(KEY, data, unit, TWEAK, encrypt=True)


@pytest.mark.parametrize("offset,length,fault", [
    (16, 512, Fault.LENGTH),                 # not on a data unit boundary
    (0, 512 + 8, Fault.CRYPTO),              # not a multiple of 16
    (0, 512 + 500, Fault.CRYPTO),            # a multiple of 4 only
])
def test_bad_xts_jobs(node, offset, length, fault):
    mr, mkey, _ = crypto_mkey(node, 4096)
    with pytest.raises(TransferError) as info:
        transfer.tx(node.pd, mkey.lkey, offset, length)
    assert info.value.fault is fault
    with pytest.raises(TransferError):
        transfer.rx(node.pd, mkey.lkey, offset, bytes(length))
    assert mr.read() == bytes(4096)          # nothing scattered


def test_crypto_failures_map_to_completions():
    err = TransferError(Fault.CRYPTO, "x")
    assert err.status(remote=False) == WcStatus.LOC_PROT_ERR
    assert err.status(remote=True) == WcStatus.REM_OP_ERR


def test_keytag(node):
    tag = b"TAG-0001"
    mr, mkey, _ = crypto_mkey(node, 1024, keytag=tag, attr_keytag=b"TAG-0002")
    with pytest.raises(TransferError) as info:
        transfer.tx(node.pd, mkey.lkey, 0, 512)
    assert info.value.fault is Fault.CRYPTO and "keytag" in info.value.message
    mr2, mkey2, _ = crypto_mkey(node, 1024, keytag=tag, attr_keytag=tag)
    assert len(transfer.tx(node.pd, mkey2.lkey, 0, 512)) == 512


def test_destroyed_dek_fails_traffic(node):
    mr, mkey, dek = crypto_mkey(node, 1024)
    node.hca.destroy_dek(dek)
    with pytest.raises(TransferError) as info:
        transfer.tx(node.pd, mkey.lkey, 0, 512)
    assert info.value.fault is Fault.CRYPTO


def test_aes_128_xts(node):
    key = os.urandom(32)
    dek = node.create_dek(key)
    data = os.urandom(4096)
    mr, mkey = node.mkey_over(data, crypto=CryptoAttr(encrypt_on_tx=True, dek=dek,
                                                      data_unit_size=BlockSize.SIZE_4096))
    assert transfer.tx(node.pd, mkey.lkey, 0, 4096) == oracle.xts(key, data, 4096, 0, True)


def _ieee_vectors():
    path = Path(__file__).parent.parent / "data" / "xts_ieee1619.json"
    vectors = json.loads(path.read_text())["vectors"]
    def halves_differ(v):
        key = bytes.fromhex(v["key_hex"])
        return key[:len(key) // 2] != key[len(key) // 2:]
    return [v for v in vectors if halves_differ(v)]


@pytest.mark.parametrize("vector", _ieee_vectors(), ids=lambda v: f"vector{v['vector']}")
def test_ieee1619_vectors_through_a_dek(node, vector):
    """IEEE 1619 vectors with distinct key halves, through a DEK and an MKEY: the data
    unit sequence number is the initial_tweak, the plaintext one data unit (or a short
    last unit of a 512-byte data unit size)."""
    key = bytes.fromhex(vector["key_hex"])
    pt, ct = bytes.fromhex(vector["plaintext_hex"]), bytes.fromhex(vector["ciphertext_hex"])
    dek = node.create_dek(key)
    attr = CryptoAttr(encrypt_on_tx=True, data_unit_size=BlockSize.SIZE_512, dek=dek,
                      initial_tweak=bytes.fromhex(vector["tweak_le_hex"]))
    mr, mkey = node.mkey_over(pt, crypto=attr)
    assert transfer.tx(node.pd, mkey.lkey, 0, len(pt)) == ct
    transfer.rx(node.pd, mkey.lkey, 0, ct)
    assert mr.read() == pt
