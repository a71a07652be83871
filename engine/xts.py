"""Batched AES-XTS (IEEE Std 1619) with one tweak per data unit.

An mlx5 crypto MKEY encrypts a buffer as a run of XTS data units, and per
mlx5dv_wr_set_mkey_crypto(3) "The tweak is incremented after each
data_unit_size": unit k is processed with data unit sequence number
``initial_tweak + first_unit + k``. A wire-speed simulator sees thousands of
512-byte units per request, and a cryptography ``modes.XTS`` context per unit
costs far more than the AES work itself. XTS is only ECB wrapped in
tweak-derived masks, so this module does the whole buffer with a handful of
AES-ECB calls and computes the masks with numpy, vectorised across units.

IEEE 1619 fixes every byte order used here: the sequence number is a 128-bit
little-endian integer, and GF(2^128) elements are 128-bit little-endian
integers reduced by x^128 + x^7 + x^2 + x + 1. Blocks are held as pairs of
little-endian uint64 words, ``[low, high]``.
"""

from __future__ import annotations

import operator

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

__all__ = ["XtsError", "xts_transform"]

_BLOCK = 16
_U64 = np.dtype("<u8")
_U8 = np.dtype(np.uint8)
_MOD_128 = 1 << 128
_MASK_64 = (1 << 64) - 1
# Multiplying by alpha^k is a k-bit shift plus folding the k bits that leave
# bit 127 back in as (bits * 0x87). With k <= 56 that fold, (bits << 7) at
# most, still fits in the low 64-bit word, so no second reduction is needed.
_MAX_ALPHA_SHIFT = 56
# Data bytes per batch of units; see xts_transform. Tuned on 512-byte units.
_BATCH_BYTES = 32 * 1024

Buffer = bytes | bytearray | memoryview | npt.NDArray[np.uint8]


class XtsError(ValueError):
    """Key or data unit that IEEE 1619 XTS cannot process."""


def xts_transform(
    key: bytes,
    data: Buffer,
    unit_size: int,
    first_unit: int,
    initial_tweak: int,
    encrypt: bool,
) -> bytes:
    """AES-XTS over `data` cut into data units of `unit_size` bytes.

    Unit k of `data` (counted from its start) uses the data unit sequence
    number ``(initial_tweak + first_unit + k) mod 2**128``. `key` is
    key1 || key2, 32 bytes for AES-128-XTS or 64 for AES-256-XTS. Equal
    halves are accepted: IEEE 1619-2007 (and its test vector 1) allows them,
    so refusing them is left to callers that implement a stricter policy.

    A trailing remainder of ``len(data) % unit_size`` bytes is one shorter
    data unit. Units whose length is not a multiple of 16 bytes use
    ciphertext stealing; every unit must be at least 16 bytes long.
    """
    key = bytes(key)
    if len(key) not in (32, 64):
        raise XtsError(f"XTS key must be 32 or 64 bytes (key1||key2), got {len(key)}")
    unit_size = operator.index(unit_size)
    if unit_size < _BLOCK:
        raise XtsError(f"XTS data unit must be at least {_BLOCK} bytes, got {unit_size}")

    src = _as_uint8(data)
    n_full, tail = divmod(src.size, unit_size)
    if 0 < tail < _BLOCK:
        raise XtsError(f"trailing XTS data unit of {tail} bytes is shorter than {_BLOCK}")

    half = len(key) // 2
    aes = Cipher(algorithms.AES(key[:half]), modes.ECB())
    ecb = aes.encryptor() if encrypt else aes.decryptor()
    tweak_ecb = Cipher(algorithms.AES(key[half:]), modes.ECB()).encryptor()
    first_dusn = initial_tweak + first_unit

    # Batches are bounded so that the mask and block temporaries stay in cache
    # and get recycled by the allocator: multi-MiB temporaries are fresh
    # pages on every call, and the page faults cost more than the AES.
    per_batch = max(1, _BATCH_BYTES // unit_size)
    pieces = []
    for start in range(0, n_full, per_batch):
        count = min(per_batch, n_full - start)
        units = src[start * unit_size : (start + count) * unit_size].reshape(count, unit_size)
        pieces.append(_transform_units(ecb, tweak_ecb, units, first_dusn + start, encrypt))
    if tail:
        units = src[n_full * unit_size :].reshape(1, tail)
        pieces.append(_transform_units(ecb, tweak_ecb, units, first_dusn + n_full, encrypt))
    return b"".join(pieces)


def _as_uint8(data: Buffer) -> npt.NDArray[np.uint8]:
    if isinstance(data, np.ndarray):
        if data.dtype != _U8 or data.ndim != 1:
            raise TypeError(f"expected a 1-D uint8 array, got {data.ndim}-D {data.dtype}")
        return np.ascontiguousarray(data)
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return np.frombuffer(view, dtype=_U8)


def _transform_units(
    ecb: CipherContext,
    tweak_ecb: CipherContext,
    src: npt.NDArray[np.uint8],
    first_dusn: int,
    encrypt: bool,
) -> npt.NDArray[np.uint8]:
    """XTS over n equal-length data units, the rows of `src`."""
    n, length = src.shape
    m, r = divmod(length, _BLOCK)
    masks = _block_masks(tweak_ecb, first_dusn, n, m + (r != 0)).view(_U8)

    head = src[:, : m * _BLOCK].reshape(n, m, _BLOCK)
    x = np.bitwise_xor(head, masks[:, :m])
    if r and not encrypt:
        # IEEE 1619 5.4.2: decryption with stealing undoes the last full
        # ciphertext block under T_m, the mask it was encrypted with.
        x[:, m - 1] = head[:, m - 1] ^ masks[:, m]
    y = _ecb(ecb, x)
    if not r:
        y ^= masks
        return y.reshape(n, length)

    out = np.empty((n, length), dtype=_U8)
    out_head = out[:, : (m - 1) * _BLOCK].reshape(n, m - 1, _BLOCK)
    np.bitwise_xor(y[:, : m - 1], masks[:, : m - 1], out=out_head)

    # IEEE 1619 5.3.2 / 5.4.2: block m-1's result (CC when encrypting, PP
    # when decrypting) gives its first r bytes to the short last block and
    # lends the rest to pad the partial input block, which is then processed
    # under the other of the two last masks.
    first_mask, second_mask = (m - 1, m) if encrypt else (m, m - 1)
    stolen_from = y[:, m - 1] ^ masks[:, first_mask]
    padded = np.concatenate((src[:, m * _BLOCK :], stolen_from[:, r:]), axis=1)
    padded ^= masks[:, second_mask]
    np.bitwise_xor(
        _ecb(ecb, padded),
        masks[:, second_mask],
        out=out[:, (m - 1) * _BLOCK : m * _BLOCK],
    )
    out[:, m * _BLOCK :] = stolen_from[:, :r]
    return out


def _ecb(ctx: CipherContext, blocks: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    # ECB is stateless on whole blocks, so one context serves several calls.
    # update_into() gives a writable result to unmask in place (update()
    # returns immutable bytes); it insists on block_size - 1 spare bytes.
    out = np.empty(blocks.size + _BLOCK - 1, dtype=_U8)
    written = ctx.update_into(blocks, out)
    return out[:written].reshape(blocks.shape)


def _block_masks(
    tweak_ecb: CipherContext, first_dusn: int, n_units: int, n_blocks: int
) -> npt.NDArray[np.uint64]:
    """T_j = E_key2(dusn) * alpha^j for every unit and block j, shape (n, n_blocks, 2)."""
    first = first_dusn % _MOD_128
    base_low = np.uint64(first & _MASK_64)
    low = base_low + np.arange(n_units, dtype=_U64)  # wraps mod 2**64
    high = np.uint64(first >> 64) + (low < base_low).astype(_U64)  # carry; wraps mod 2**128
    dusns = np.stack((low, high), axis=1).astype(_U64, copy=False)

    # The alpha powers are a sequential chain per unit. Split j = q*span + i:
    # a short loop walks the few T_{q*span} anchors, then one broadcast pass
    # yields every T_{q*span + i} with long vectorised rows instead of one
    # numpy pass per block.
    n_anchors = -(-n_blocks // _MAX_ALPHA_SHIFT)
    span = -(-n_blocks // n_anchors)
    anchors = np.empty((n_units, n_anchors, 2), dtype=_U64)
    anchors[:, 0] = _ecb(tweak_ecb, dusns.view(_U8)).view(_U64)
    for q in range(1, n_anchors):
        _mul_alpha_pow(anchors[:, q - 1], np.uint64(span), anchors[:, q])

    masks = np.empty((n_units, n_anchors, span, 2), dtype=_U64)
    _mul_alpha_pow(anchors[:, :, np.newaxis], np.arange(span, dtype=_U64), masks)
    return masks.reshape(n_units, n_anchors * span, 2)[:, :n_blocks]


def _mul_alpha_pow(
    src: npt.NDArray[np.uint64], k: np.uint64 | npt.NDArray[np.uint64], out: npt.NDArray[np.uint64]
) -> None:
    """out = src * alpha^k in GF(2^128) for 0 <= k <= _MAX_ALPHA_SHIFT; k broadcasts."""
    low, high = src[..., 0], src[..., 1]
    back = np.uint64(63) - k  # shift by 64 - k in two steps so k == 0 stays defined
    one = np.uint64(1)
    spill = (high >> one) >> back
    np.left_shift(high, k, out=out[..., 1])
    out[..., 1] |= (low >> one) >> back
    out_low = out[..., 0]
    np.left_shift(low, k, out=out_low)
    # Fold the spilled bits back in: spill * (x^7 + x^2 + x + 1), carry-less.
    out_low ^= spill
    for shift in (1, 1, 5):
        spill <<= np.uint64(shift)
        out_low ^= spill
