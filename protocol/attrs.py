"""The attribute structs of the verbs calls, as frozen records.

They mirror the C structs of mlx5dv_wr_mkey_configure(3), mlx5dv_wr_set_mkey_sig_block(3)
and mlx5dv_wr_set_mkey_crypto(3) field for field, with pyverbs' names, so that the
same record is what a user builds, what crosses the control plane and what the
engine validates. Validation of values is the engine's (it reports the errno the
man pages give); these records only carry them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .enums import (
    CRC_PI_BYTES,
    T10DIF_PI_BYTES,
    BlockSize,
    CryptoKeySize,
    CryptoStandard,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difBgType,
    SigType,
)

__all__ = ["SGE", "CryptoAttr", "DEKInitAttr", "MkeyConfAttr", "MrInterleaved", "SigBlockAttr",
           "SigBlockDomain", "SigCrc", "SigT10dif"]


@dataclass(frozen=True)
class SGE:
    """struct ibv_sge: on an MKEY, ``addr`` is an offset (MKEYs are zero-based)."""

    addr: int
    length: int
    lkey: int


@dataclass(frozen=True)
class MrInterleaved:
    """struct mlx5dv_mr_interleaved"""

    addr: int
    bytes_count: int
    bytes_skip: int
    lkey: int


@dataclass(frozen=True)
class MkeyConfAttr:
    """struct mlx5dv_mkey_conf_attr"""

    conf_flags: int = 0
    comp_mask: int = 0


@dataclass(frozen=True)
class SigT10dif:
    """struct mlx5dv_sig_t10dif"""

    bg_type: int = SigT10difBgType.CRC
    bg: int = 0
    app_tag: int = 0
    ref_tag: int = 0
    flags: int = 0


@dataclass(frozen=True)
class SigCrc:
    """struct mlx5dv_sig_crc"""

    crc_type: int = SigCrcType.CRC32
    seed: int = 0


@dataclass(frozen=True)
class SigBlockDomain:
    """struct mlx5dv_sig_block_domain: ``dif`` for T10DIF, ``crc`` for CRC."""

    sig_type: int = SigType.T10DIF
    dif: SigT10dif | None = None
    crc: SigCrc | None = None
    block_size: int = BlockSize.SIZE_512
    comp_mask: int = 0


def pi_size(d: SigBlockDomain | None) -> int:
    """The PI bytes after each block of domain ``d`` (0 without a signature): the
    struct's fields say which signature, mlx5dv_wr_set_mkey_sig_block(3) its size."""
    if d is None:
        return 0
    if d.sig_type == SigType.T10DIF:
        return T10DIF_PI_BYTES
    return CRC_PI_BYTES[d.crc.crc_type]


# The T10-DIF PI after each block, big-endian: guard (2 bytes), app tag (2), ref tag (4).
# [start, end) of each field within the PI; check_mask / copy_mask bit 7 is PI byte 0.
T10DIF_PI_FIELDS = {"guard": (0, 2), "app_tag": (2, 4), "ref_tag": (4, 8)}


def t10dif_pi_field(pi: bytes, name: str) -> int:
    """The value of the T10-DIF PI field ``name`` ("guard", "app_tag", "ref_tag") in
    ``pi``, the PI's bytes."""
    lo, hi = T10DIF_PI_FIELDS[name]
    return int.from_bytes(pi[lo:hi], "big")


@dataclass(frozen=True)
class SigBlockAttr:
    """struct mlx5dv_sig_block_attr: ``mem`` / ``wire`` None means no signature there."""

    mem: SigBlockDomain | None = None
    wire: SigBlockDomain | None = None
    flags: int = 0
    check_mask: int = 0
    copy_mask: int = 0
    comp_mask: int = 0


@dataclass(frozen=True)
class CryptoAttr:
    """struct mlx5dv_crypto_attr; ``dek`` is the DEK object or its handle.

    ``initial_tweak`` is IEEE 1619's data unit sequence number as 16 **little-endian**
    bytes: data unit k of the MKEY's crypto stream, counted from the MKEY's offset 0
    (not from the start of a transfer), is processed with tweak initial_tweak + k
    (mod 2^128), i.e. ``cryptography``'s ``modes.XTS(((int.from_bytes(tweak, "little")
    + k) % 2**128).to_bytes(16, "little"))`` with the DEK's key; docs/api.md ("First
    things to know") checks it in three lines, semantics section 8.3 has the rule.
    """

    crypto_standard: int = CryptoStandard.AES_XTS
    encrypt_on_tx: bool = False
    signature_crypto_order: int = SignatureCryptoOrder.SIGNATURE_AFTER_CRYPTO_ON_TX
    data_unit_size: int = BlockSize.SIZE_512
    initial_tweak: bytes = bytes(16)
    dek: Any = None
    keytag: bytes = bytes(8)
    comp_mask: int = 0


@dataclass(frozen=True)
class DEKInitAttr:
    """struct mlx5dv_dek_init_attr (key_purpose AES_XTS only)."""

    key_size: int = CryptoKeySize.SIZE_256
    key: bytes = b""
    has_keytag: bool = False
    keytag: bytes = bytes(8)
    key_purpose: int = 0
    pd: Any = None
    opaque: bytes = field(default=bytes(8))
    comp_mask: int = 0
    # With MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN in comp_mask: the crypto login object the
    # DEK is imported wrapped under, or None for a plaintext DEK (mlx5dv_dek_create(3)).
    crypto_login: Any = None
