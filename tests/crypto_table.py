"""The ten rows of mlx5dv_wr_set_mkey_crypto(3)'s table as images, from the oracle.

One definition for the engine-level and the end-to-end tests: each row's memory image,
its wire image, the two signature domains, encrypt_on_tx, the signature/crypto order
and the XTS data unit. SIG (and SIG2) is a T10DIF on 512-byte blocks; SIG1 is a
CRC64_XP10, a different 8-byte PI, so that rows E and I really convert one signature
into another.
"""

from __future__ import annotations

from softhca.protocol.attrs import SigBlockDomain, SigCrc, SigT10dif
from softhca.protocol.enums import (
    BlockSize,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difFlags,
    SigType,
)

import oracle

AFTER = SignatureCryptoOrder.SIGNATURE_AFTER_CRYPTO_ON_TX
BEFORE = SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX
# "normally the LBA of the first block": any 16 bytes do; all bytes distinct show order bugs.
TWEAK = 0x1122334455667788_99AABBCCDDEEFF00
DUS = {512: BlockSize.SIZE_512, 520: BlockSize.SIZE_520}

SIG = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_512,
                     dif=SigT10dif(bg=0, app_tag=0xBEEF, ref_tag=0x2000,
                                   flags=SigT10difFlags.REF_REMAP))
SIG1 = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_512,
                      crc=SigCrc(SigCrcType.CRC64_XP10, 0xFFFFFFFFFFFFFFFF))


def sig_pi(block: bytes, b: int) -> bytes:
    return oracle.t10dif_pi(block, app=0xBEEF, ref=0x2000 + b)


def sig1_pi(block: bytes, _b: int) -> bytes:
    return oracle.crc_pi(block, SigCrcType.CRC64_XP10, 0xFFFFFFFFFFFFFFFF)


def enc(key: bytes, data: bytes, unit: int) -> bytes:
    return oracle.xts(key, data, unit, TWEAK, encrypt=True)


def dec(key: bytes, data: bytes, unit: int) -> bytes:
    return oracle.xts(key, data, unit, TWEAK, encrypt=False)


def prot(data: bytes, pi) -> bytes:
    return oracle.protect(data, 512, pi)


def row_images(row: str, key: bytes, data: bytes):
    """(memory image, wire image, mem sig, wire sig, encrypt_on_tx, order, data unit)"""
    return {
        "A": (data, enc(key, data, 512), None, None, True, AFTER, 512),
        "B": (data, prot(enc(key, data, 512), sig_pi), None, SIG, True, AFTER, 512),
        "C": (data, enc(key, prot(data, sig_pi), 520), None, SIG, True, BEFORE, 520),
        "D": (prot(data, sig_pi), enc(key, data, 512), SIG, None, True, BEFORE, 512),
        "E": (prot(data, sig1_pi), enc(key, prot(data, sig_pi), 520), SIG1, SIG, True, BEFORE,
              520),
        "F": (enc(key, data, 512), data, None, None, False, BEFORE, 512),
        "G": (enc(key, data, 512), prot(data, sig_pi), None, SIG, False, AFTER, 512),
        "H": (enc(key, prot(data, sig_pi), 520), data, SIG, None, False, AFTER, 520),
        "I": (enc(key, prot(data, sig1_pi), 520), prot(data, sig_pi), SIG1, SIG, False, AFTER,
              520),
        "J": (prot(enc(key, data, 512), sig_pi), data, SIG, None, False, BEFORE, 512),
    }[row]
