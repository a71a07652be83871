"""AES-XTS crypto on an MKEY: the crypto setter's rules and the XTS job of a transfer.

mlx5dv_wr_set_mkey_crypto(3) and docs/semantics.md section 8: data units of
``data_unit_size`` bytes counted from the MKEY's offset 0 in the stream crypto
runs on, unit k using the tweak initial_tweak + k ("The tweak is incremented
after each data_unit_size"). Which stream that is (memory or wire) is decided by
the transfer pipeline from signature_crypto_order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.attrs import CryptoAttr
from ..protocol.enums import (
    BLOCK_SIZE_BYTES,
    CryptoStandard,
    DekState,
    SignatureCryptoOrder,
)
from ..protocol.errors import einval
from .completion import Fault, TransferError
from .hca import DEK, PD

# The AES block: XTS processes data units in 16-byte blocks, stealing for the rest.
XTS_BLOCK = 16


@dataclass(frozen=True)
class CryptoConfig:
    dek: DEK
    encrypt_on_tx: bool
    order: int
    data_unit_size: int      # bytes
    initial_tweak: int       # the 16 bytes of initial_tweak, little-endian
    keytag: bytes
    attr: CryptoAttr


def validate_crypto_attr(attr: CryptoAttr, pd: PD) -> CryptoConfig:
    """Every rule of the crypto setter; RDMAError(EINVAL) naming the broken one."""
    if attr.comp_mask:
        raise einval(f"crypto_attr comp_mask {attr.comp_mask:#x} must be 0")
    if attr.crypto_standard != CryptoStandard.AES_XTS:
        raise einval(f"crypto_standard {attr.crypto_standard} is not "
                     "MLX5DV_CRYPTO_STANDARD_AES_XTS")
    if attr.signature_crypto_order not in tuple(SignatureCryptoOrder):
        raise einval(f"signature_crypto_order {attr.signature_crypto_order} is out of range")
    if attr.data_unit_size not in BLOCK_SIZE_BYTES:
        raise einval(f"data_unit_size {attr.data_unit_size} is not an mlx5dv_block_size (0..4)")
    if len(attr.initial_tweak) != 16:
        raise einval("initial_tweak is 16 bytes")
    if len(attr.keytag) != 8:
        raise einval("keytag is 8 bytes")
    dek = pd.hca.deks.get(getattr(attr.dek, "handle", attr.dek))
    if dek is None:
        raise einval(f"DEK {getattr(attr.dek, 'handle', attr.dek)!r} is unknown")
    if dek.state != DekState.READY:
        raise einval(f"DEK {dek.handle} is not MLX5DV_DEK_STATE_READY")
    if dek.pd is not pd:
        raise einval(f"DEK {dek.handle} belongs to another PD than the MKEY")
    return CryptoConfig(dek, bool(attr.encrypt_on_tx), int(attr.signature_crypto_order),
                        BLOCK_SIZE_BYTES[attr.data_unit_size],
                        int.from_bytes(attr.initial_tweak, "little"), bytes(attr.keytag), attr)


def check_xts_job(cfg: CryptoConfig, stream_offset: int, length: int) -> None:
    """Refuse, before any byte moves, a job the device would fail (docs/semantics.md 8, 9)."""
    if cfg.dek.state != DekState.READY:
        raise TransferError(Fault.CRYPTO, f"DEK {cfg.dek.handle} is no longer ready")
    if cfg.dek.has_keytag and cfg.keytag != cfg.dek.keytag:
        raise TransferError(Fault.CRYPTO, "crypto keytag does not match the DEK's keytag")
    dus = cfg.data_unit_size
    if stream_offset % dus:
        raise TransferError(Fault.LENGTH, f"crypto stream offset {stream_offset} is not on a "
                            f"{dus}-byte data unit boundary")
    partial = length % dus
    if partial and not (length % XTS_BLOCK == 0 and partial <= dus - XTS_BLOCK):
        raise TransferError(Fault.CRYPTO, f"XTS job of {length} bytes with {dus}-byte data "
                            "units: the length must be a multiple of the data unit, or of 16 "
                            "with a last unit at most data_unit_size - 16")
    if 0 < partial < XTS_BLOCK:
        # IEEE 1619 needs at least one 16-byte block per data unit; docs/semantics.md's
        # length rule alone would admit an 8-byte last unit with 520-byte units.
        raise TransferError(Fault.CRYPTO, f"XTS job of {length} bytes leaves a last data unit "
                            f"of {partial} bytes; XTS needs at least 16")
