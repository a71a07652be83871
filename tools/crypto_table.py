"""The table of mlx5dv_wr_set_mkey_crypto(3), rows A to J, defined once.

Each row as the page prints it (Memory, Op1, Op2, Op3, Wire, encrypt_on_tx,
signature_crypto_order), the configuration that realises it (the two signature
domains, encrypt_on_tx, the order and the XTS data unit), and its memory and wire
images built by the oracle. The demo runs the rows, ``softhca explain --row`` derives
their pipelines from the configurations, and the tests check the engine and the
daemons against the images. Like the oracle, nothing here imports softhca.engine.

SIG (and SIG2) is a T10DIF on 512-byte blocks; SIG1 is a CRC64_XP10, a different
8-byte PI, so that rows E and I really convert one signature into another. Where
crypto covers data and PI, the data unit is 520 bytes: one data unit per block.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from ..protocol.attrs import CryptoAttr, SigBlockDomain, SigCrc, SigT10dif
from ..protocol.enums import (
    BlockSize,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difFlags,
    SigType,
)
from . import oracle

PAGE = "mlx5dv_wr_set_mkey_crypto(3)"
AFTER = SignatureCryptoOrder.SIGNATURE_AFTER_CRYPTO_ON_TX
BEFORE = SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX
# mlx5dv_wr_set_mkey_crypto(3): initial_tweak is "normally the LBA of the first
# block"; any 16 bytes do, and a value with every byte distinct shows byte order bugs.
TWEAK = 0x1122334455667788_99AABBCCDDEEFF00
DUS = {512: BlockSize.SIZE_512, 520: BlockSize.SIZE_520}

SIG = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_512,
                     dif=SigT10dif(bg=0, app_tag=0xBEEF, ref_tag=0x2000,
                                   flags=SigT10difFlags.REF_REMAP))
SIG1 = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_512,
                      crc=SigCrc(SigCrcType.CRC64_XP10, oracle.M64))


class Row(NamedTuple):
    """One row as printed (capitalisation as printed: "Encrypt On TX" in B)."""

    memory: str
    op1: str
    op2: str
    op3: str
    wire: str
    encrypt_on_tx: bool
    order: str


TABLE: dict[str, Row] = {
    "A": Row("data", "Encrypt on TX", "SIG.mem = none", "SIG.wire = none", "enc(data)", True,
             "Doesn't matter"),
    "B": Row("data", "Encrypt On TX", "SIG.mem = none", "SIG.wire = SIG", "enc(data)+SIG", True,
             "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "C": Row("data", "SIG.mem = none", "SIG.wire = SIG", "Encrypt on TX", "enc(data+SIG)", True,
             "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "D": Row("data+SIG", "SIG.mem = SIG", "SIG.wire = none", "Encrypt on TX", "enc(data)", True,
             "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "E": Row("data+SIG1", "SIG.mem = SIG1", "SIG.wire = SIG2", "Encrypt on TX",
             "enc(data+SIG2)", True, "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "F": Row("enc(data)", "Decrypt on TX", "SIG.mem = none", "SIG.wire = none", "data", False,
             "Doesn't matter"),
    "G": Row("enc(data)", "Decrypt on TX", "SIG.mem = none", "SIG.wire = SIG", "data+SIG", False,
             "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "H": Row("enc(data+SIG)", "Decrypt on TX", "SIG.mem = SIG", "SIG.wire = none", "data", False,
             "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "I": Row("enc(data+SIG1)", "Decrypt on TX", "SIG.mem = SIG1", "SIG.wire = SIG2",
             "data+SIG2", False, "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "J": Row("enc(data)+SIG", "SIG.mem = SIG", "SIG.wire = none", "Decrypt on TX", "data", False,
             "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
}


class RowConfig(NamedTuple):
    """The attributes that realise a row. Where the page says "Doesn't matter", A takes
    SIGNATURE_AFTER_CRYPTO_ON_TX and F SIGNATURE_BEFORE_CRYPTO_ON_TX."""

    mem_sig: SigBlockDomain | None
    wire_sig: SigBlockDomain | None
    encrypt_on_tx: bool
    order: int
    unit: int


CONFIGS: dict[str, RowConfig] = {
    "A": RowConfig(None, None, True, AFTER, 512),
    "B": RowConfig(None, SIG, True, AFTER, 512),
    "C": RowConfig(None, SIG, True, BEFORE, 520),
    "D": RowConfig(SIG, None, True, BEFORE, 512),
    "E": RowConfig(SIG1, SIG, True, BEFORE, 520),
    "F": RowConfig(None, None, False, BEFORE, 512),
    "G": RowConfig(None, SIG, False, AFTER, 512),
    "H": RowConfig(SIG, None, False, AFTER, 520),
    "I": RowConfig(SIG1, SIG, False, AFTER, 520),
    "J": RowConfig(SIG, None, False, BEFORE, 512),
}


def enc(key: bytes, data: bytes, unit: int) -> bytes:
    return oracle.xts(key, data, unit, TWEAK, encrypt=True)


def dec(key: bytes, data: bytes, unit: int) -> bytes:
    return oracle.xts(key, data, unit, TWEAK, encrypt=False)


def sig_pi(block: bytes, b: int) -> bytes:
    """SIG's PI of block b: T10DIF CRC guard seed 0, app 0xbeef, ref 0x2000 + b."""
    return oracle.pi_of(SIG, block, b)


def prot(data: bytes, pi) -> bytes:
    return oracle.protect_blocks(data, 512, pi)


class RowImages(NamedTuple):
    """(memory image, wire image, memory SIG, wire SIG, encrypt_on_tx, order, data unit)"""

    memory: bytes
    wire: bytes
    mem_sig: SigBlockDomain | None
    wire_sig: SigBlockDomain | None
    encrypt_on_tx: bool
    order: int
    unit: int


def row_images(row: str, key: bytes, data: bytes) -> RowImages:
    """The memory and wire images row ``row`` names for ``data``, by the oracle."""
    cfg = CONFIGS[row]
    p = {"data+SIG": oracle.protect(data, SIG), "data+SIG1": oracle.protect(data, SIG1)}
    images = {
        "data": lambda: data,
        "data+SIG": lambda: p["data+SIG"],
        "data+SIG1": lambda: p["data+SIG1"],
        "data+SIG2": lambda: p["data+SIG"],
        "enc(data)": lambda: enc(key, data, 512),
        "enc(data+SIG)": lambda: enc(key, p["data+SIG"], 520),
        "enc(data+SIG1)": lambda: enc(key, p["data+SIG1"], 520),
        "enc(data+SIG2)": lambda: enc(key, p["data+SIG"], 520),
        "enc(data)+SIG": lambda: oracle.protect(enc(key, data, 512), SIG),
    }
    t = TABLE[row]
    return RowImages(images[t.memory](), images[t.wire](), *cfg)


def new_key(rng: random.Random, size: int) -> bytes:
    """A DEK of ``size`` bytes. mlx5dv_dek_create refuses equal key halves
    (docs/semantics.md 8): draw until they differ."""
    while True:
        key = rng.randbytes(size)
        if key[:size // 2] != key[size // 2:]:
            return key


def crypto_attr(dek, encrypt_on_tx: bool, order: int, unit: int) -> CryptoAttr:
    """struct mlx5dv_crypto_attr for a row: AES-XTS, initial_tweak TWEAK."""
    return CryptoAttr(encrypt_on_tx=encrypt_on_tx, signature_crypto_order=order,
                      data_unit_size=DUS[unit], initial_tweak=TWEAK.to_bytes(16, "little"),
                      dek=dek)
