"""Batched AES-XTS (IEEE Std 1619) with one tweak per data unit.

An mlx5 crypto MKEY encrypts a buffer as a run of XTS data units, and per
mlx5dv_wr_set_mkey_crypto(3) "The tweak is incremented after each
data_unit_size": unit k is processed with data unit sequence number
``initial_tweak + first_unit + k``. A simulator sees thousands of 512-byte
units per request, and a cryptography ``modes.XTS`` context per unit costs far
more than the AES work itself. XTS is ECB wrapped in tweak-derived masks, so
this module covers a whole buffer with a handful of AES-ECB calls and builds
the masks with numpy, vectorised across units.

IEEE 1619 fixes every byte order used here: the sequence number is a 128-bit
little-endian integer, and GF(2^128) elements are 128-bit little-endian
integers reduced by x^128 + x^7 + x^2 + x + 1. Blocks are held as pairs of
little-endian uint64 words, ``[low, high]``.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms, modes

__all__ = ["XtsCipher", "XtsError", "as_uint8", "xts_transform"]

_BLOCK = 16
_LANE = 8  # bytes in a uint64 lane
_U64 = np.dtype("<u8")
_U8 = np.dtype(np.uint8)
_MOD_128 = 1 << 128
_MASK_64 = (1 << 64) - 1
# Multiplying by alpha^k is a k-bit shift plus folding the k bits that leave
# bit 127 back in as (bits * 0x87). With k <= 56 that fold, (bits << 7) at
# most, still fits in the low 64-bit word, so no second reduction is needed.
_MAX_ALPHA_SHIFT = 56
# Units are processed in batches of about this many bytes, through scratch
# buffers allocated once per call. Whole-buffer temporaries are fresh pages on
# every call, and faulting them in cost more than the AES and numpy work put
# together; small batches instead pay numpy's per-call overhead more often.
_BATCH_BYTES = 256 * 1024

# Distinct unit lengths whose scratch an XtsCipher keeps (full units plus short tails).
_MAX_SCRATCH_LENGTHS = 8

Buffer = bytes | bytearray | memoryview | npt.NDArray[np.uint8]
_U8Array = npt.NDArray[np.uint8]
_U64Array = npt.NDArray[np.uint64]


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
    src = as_uint8(data)
    out = np.empty(src.size, dtype=_U8)
    XtsCipher(key).transform_into(src, unit_size, first_unit, initial_tweak, encrypt, out)
    return out.tobytes()


class XtsCipher:
    """One XTS key, ready for any number of transforms.

    The three AES-ECB contexts (key1 both ways, key2 for the tweaks) are made
    once: ECB keeps no state between blocks, so a context that is only ever
    fed whole 16-byte blocks and never finalized can serve every later call.
    Scratch for the masks of a batch of units is kept per unit length, shared
    by all keys (_ScratchStore), so a steady stream of transfers allocates (and
    page-faults) nothing new.
    """

    def __init__(self, key: bytes) -> None:
        key = bytes(key)
        if len(key) not in (32, 64):
            raise XtsError(f"XTS key must be 32 or 64 bytes (key1||key2), got {len(key)}")
        half = len(key) // 2
        aes = Cipher(algorithms.AES(key[:half]), modes.ECB())
        self._ecb = {True: aes.encryptor(), False: aes.decryptor()}
        self._tweak_ecb = Cipher(algorithms.AES(key[half:]), modes.ECB()).encryptor()

    def transform_into(
        self,
        src: _U8Array,
        unit_size: int,
        first_unit: int,
        initial_tweak: int,
        encrypt: bool,
        out: _U8Array,
    ) -> None:
        """xts_transform of the 1-D uint8 `src` written into `out` (same size, not
        overlapping `src`)."""
        unit_size = operator.index(unit_size)
        if unit_size < _BLOCK:
            raise XtsError(f"XTS data unit must be at least {_BLOCK} bytes, got {unit_size}")
        n_full, tail = divmod(src.size, unit_size)
        if 0 < tail < _BLOCK:
            raise XtsError(f"trailing XTS data unit of {tail} bytes is shorter than {_BLOCK}")
        if out.size != src.size:
            raise ValueError(f"output of {out.size} bytes for {src.size} bytes of input")
        first_dusn = operator.index(initial_tweak) + operator.index(first_unit)
        encrypt = bool(encrypt)
        full = n_full * unit_size
        if n_full:
            with SCRATCH.get(unit_size) as scratch:
                self._run(n_full, unit_size, first_dusn, encrypt, scratch).transform(
                    src[:full].reshape(n_full, unit_size), out[:full].reshape(n_full, unit_size)
                )
        if tail:
            with SCRATCH.get(tail) as scratch:
                self._run(1, tail, first_dusn + n_full, encrypt, scratch).transform(
                    src[full:].reshape(1, tail), out[full:].reshape(1, tail)
                )

    def _run(self, n_units: int, length: int, first_dusn: int, encrypt: bool,
             scratch: _Scratch) -> _UnitRun:
        return _UnitRun(
            self._ecb[encrypt], self._tweak_ecb, n_units, length, first_dusn, encrypt, scratch
        )


class _ScratchStore:
    """Batch scratch by unit length, shared by every XtsCipher of the process.

    A DEK keeps its XtsCipher (its contexts are a few hundred bytes), and a device may
    hold tens of thousands of DEKs, so the megabyte or so of scratch per unit length
    is kept once, here, for at most _MAX_SCRATCH_LENGTHS lengths. A transform never
    calls out while it holds the store, so within a thread it is never re-entered;
    a second thread finding it held works on scratch of its own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_length: dict[int, _Scratch] = {}

    @contextmanager
    def get(self, length: int) -> Iterator[_Scratch]:
        if not self._lock.acquire(blocking=False):
            yield _Scratch(length)
            return
        try:
            scratch = self._by_length.get(length)
            if scratch is None:
                if len(self._by_length) >= _MAX_SCRATCH_LENGTHS:
                    # Callers cycling through odd tail lengths must not grow this for ever.
                    self._by_length.clear()
                scratch = self._by_length[length] = _Scratch(length)
            yield scratch
        finally:
            self._lock.release()

    def __len__(self) -> int:
        return len(self._by_length)


SCRATCH = _ScratchStore()


def as_uint8(data: Buffer) -> _U8Array:
    """A 1-D C-contiguous uint8 array of `data`'s bytes (a copy only when strided)."""
    if isinstance(data, np.ndarray):
        if data.dtype != _U8 or data.ndim != 1:
            raise TypeError(f"expected a 1-D uint8 array, got {data.ndim}-D {data.dtype}")
        return np.ascontiguousarray(data)
    view = memoryview(data)
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return np.frombuffer(view, dtype=_U8)


class _Scratch:
    """The per-batch buffers of one unit length, kept by XtsCipher between calls."""

    def __init__(self, length: int) -> None:
        full_blocks, partial = divmod(length, _BLOCK)
        n_masks = full_blocks + (partial != 0)
        self.n_anchors = -(-n_masks // _MAX_ALPHA_SHIFT)
        self.span = -(-n_masks // self.n_anchors)
        self.batch = max(1, _BATCH_BYTES // length)
        self.masks = np.empty((self.batch, self.n_anchors, self.span, 2), dtype=_U64)
        # _spread's operands, one row per (unit, anchor) and one column per alpha
        # power, laid out in full so that the anchor column is the only operand
        # broadcast; broadcasting the powers too, into strided halves of the masks,
        # had cost half the transform.
        rows = (self.batch * self.n_anchors, self.span)
        self.power = np.ascontiguousarray(
            np.broadcast_to(np.arange(self.span, dtype=_U64), rows)
        )
        self.back = np.uint64(63) - self.power
        self.new_low, self.spill = (np.empty(rows, dtype=_U64) for _ in range(2))
        self.masked = np.empty((self.batch, full_blocks * _BLOCK), dtype=_U8)
        # update_into() insists on block_size - 1 spare bytes.
        self.crypted = np.empty(self.masked.size + _BLOCK - 1, dtype=_U8)
        # Ciphertext stealing's last blocks, one per unit (+1 for update_into's spare).
        self.padded = np.empty((self.batch, 2), dtype=_U64)
        self.swapped = np.empty((self.batch + 1, 2), dtype=_U64)


class _UnitRun:
    """Consecutive data units of one length, their masks and scratch space."""

    def __init__(
        self,
        ecb: CipherContext,
        tweak_ecb: CipherContext,
        n_units: int,
        length: int,
        first_dusn: int,
        encrypt: bool,
        scratch: _Scratch,
    ) -> None:
        self._ecb = ecb
        self._encrypt = encrypt
        self._full_blocks, self._partial = divmod(length, _BLOCK)
        # The alpha powers form a sequential chain per unit. Splitting
        # j = q * span + i, the few anchors T_{q*span} are walked once here for
        # all units, and each batch gets T_{q*span + i} in one broadcast pass.
        n_anchors, self._span = scratch.n_anchors, scratch.span
        self._anchors = _first_masks(tweak_ecb, first_dusn, n_units, n_anchors, self._span)

        batch = min(n_units, scratch.batch)
        self._batch = batch
        self._scratch = scratch
        self._masks = scratch.masks[:batch]
        self._masked = scratch.masked[:batch]
        self._crypted = scratch.crypted
        self._padded = scratch.padded
        self._swapped = scratch.swapped

    def transform(self, src: _U8Array, out: _U8Array) -> None:
        """XTS over the rows of `src` (one data unit each) into `out`."""
        for start in range(0, src.shape[0], self._batch):
            rows = slice(start, start + self._batch)
            self._transform_batch(src[rows], out[rows], self._anchors[rows])

    def _transform_batch(self, src: _U8Array, out: _U8Array, anchors: _U64Array) -> None:
        n = src.shape[0]
        m, r = self._full_blocks, self._partial
        masks64 = self._masks[:n]
        _spread(anchors.reshape(-1, 2), self._scratch, masks64.reshape(-1, self._span, 2))
        # Byte rows, one per unit: the XORs below then run one loop over each
        # unit's bytes, where (n, m, 16) views of 520-byte rows ran 16-byte loops.
        masks = masks64.reshape(n, -1).view(_U8)
        head_len = m * _BLOCK
        x = np.bitwise_xor(src[:, :head_len], masks[:, :head_len], out=self._masked[:n])
        if r and not self._encrypt:
            # IEEE 1619 5.4.2: decryption with stealing undoes the last full
            # ciphertext block under T_m, the mask it was encrypted with.
            last = slice(head_len - _BLOCK, head_len)
            np.bitwise_xor(src[:, last], masks[:, head_len : head_len + _BLOCK], out=x[:, last])
        written = self._ecb.update_into(x, self._crypted[: x.size + _BLOCK - 1])
        y = self._crypted[:written].reshape(x.shape)
        if not r:
            np.bitwise_xor(y, masks[:, :head_len], out=out)
            return

        body = head_len - _BLOCK
        np.bitwise_xor(y[:, :body], masks[:, :body], out=out[:, :body])
        if r == _LANE and src.strides[0] % _LANE == 0 and out.strides[0] % _LANE == 0:
            self._steal_lanes(src, out, y, masks64.reshape(n, -1, 2), m)
            return
        # IEEE 1619 5.3.2 / 5.4.2: block m-1's result (CC when encrypting, PP
        # when decrypting) gives its first r bytes to the short last block and
        # lends the rest to pad the partial input block, which is then
        # processed under the other of the two last masks.
        first_mask, second_mask = (m - 1, m) if self._encrypt else (m, m - 1)
        first = masks[:, first_mask * _BLOCK : (first_mask + 1) * _BLOCK]
        second = masks[:, second_mask * _BLOCK : (second_mask + 1) * _BLOCK]
        stolen_from = y[:, body:head_len] ^ first
        padded = np.concatenate((src[:, head_len:], stolen_from[:, r:]), axis=1)
        padded ^= second
        swapped = np.frombuffer(self._ecb.update(padded), dtype=_U8).reshape(n, _BLOCK)
        np.bitwise_xor(swapped, second, out=out[:, body:head_len])
        out[:, head_len:] = stolen_from[:, :r]


    def _steal_lanes(
        self, src: _U8Array, out: _U8Array, y: _U8Array, masks: _U64Array, m: int
    ) -> None:
        """Ciphertext stealing for an 8-byte partial block (520-byte units), the
        general path's steps on 1-D strided uint64 lanes: one numpy loop per lane
        instead of one 16-byte loop per unit."""
        n = src.shape[0]
        head_len = m * _BLOCK
        first, second = (m - 1, m) if self._encrypt else (m, m - 1)
        f_lo, f_hi = masks[:, first, 0], masks[:, first, 1]
        s_lo, s_hi = masks[:, second, 0], masks[:, second, 1]
        y_lo = y[:, head_len - _BLOCK : head_len - _LANE].view(_U64)[:, 0]
        y_hi = y[:, head_len - _LANE : head_len].view(_U64)[:, 0]
        partial = src[:, head_len:].view(_U64)[:, 0]
        padded = self._padded[:n]
        # Block m-1's result: its first 8 bytes are the short last block, its last 8
        # pad the partial input block.
        np.bitwise_xor(y_lo, f_lo, out=out[:, head_len:].view(_U64)[:, 0])
        np.bitwise_xor(partial, s_lo, out=padded[:, 0])
        np.bitwise_xor(y_hi, f_hi, out=padded[:, 1])
        np.bitwise_xor(padded[:, 1], s_hi, out=padded[:, 1])
        swapped = self._swapped[: n + 1]
        self._ecb.update_into(padded.view(_U8), swapped.view(_U8))
        block = out[:, head_len - _BLOCK : head_len]
        np.bitwise_xor(swapped[:n, 0], s_lo, out=block[:, :_LANE].view(_U64)[:, 0])
        np.bitwise_xor(swapped[:n, 1], s_hi, out=block[:, _LANE:].view(_U64)[:, 0])


def _first_masks(
    tweak_ecb: CipherContext, first_dusn: int, n_units: int, n_anchors: int, span: int
) -> _U64Array:
    """E_key2(dusn_k) * alpha^(q*span) for every unit k and q < n_anchors."""
    first = first_dusn % _MOD_128
    base_low = np.uint64(first & _MASK_64)
    low = base_low + np.arange(n_units, dtype=_U64)  # wraps mod 2**64
    high = np.uint64(first >> 64)  # plus the carry out of low; wraps mod 2**128
    dusns = np.empty((n_units, 2), dtype=_U64)
    dusns[:, 0] = low
    np.add(high, (low < base_low).view(np.uint8), out=dusns[:, 1], casting="unsafe")

    anchors = np.empty((n_units, n_anchors, 2), dtype=_U64)
    # cryptography only takes byte-format buffers, hence the uint8 views; the
    # result goes straight into its place (update() would allocate and fault a
    # fresh buffer), through a spare of block_size - 1 bytes update_into needs.
    crypted = np.empty(n_units * 2 + 2, dtype=_U64)
    done = tweak_ecb.update_into(dusns.view(_U8), crypted.view(_U8))
    anchors[:, 0] = crypted.view(_U8)[:done].view(_U64).reshape(-1, 2)
    spill = np.empty(n_units, dtype=_U64)
    for q in range(1, n_anchors):
        _mul_alpha_pow(anchors[:, q - 1], np.uint64(span), anchors[:, q], spill)
    return anchors


def _spread(anchors: _U64Array, s: _Scratch, out: _U64Array) -> None:
    """out[a, i] = anchors[a] * alpha^i in GF(2^128) for i < span: _mul_alpha_pow
    with every full-size operand contiguous and the anchors broadcast along a row."""
    rows = anchors.shape[0]
    spill, new_low = s.spill[:rows], s.new_low[:rows]
    power, back = s.power[:rows], s.back[:rows]
    one = np.uint64(1)
    low, high = anchors[:, 0:1], anchors[:, 1:2]
    out_high = out[..., 1]
    np.left_shift(high, power, out=out_high)
    # By 64 - k in two steps, so that k == 0 stays defined.
    np.right_shift(low >> one, back, out=spill)
    np.bitwise_or(out_high, spill, out=out_high)
    np.right_shift(high >> one, back, out=spill)
    np.left_shift(low, power, out=new_low)
    # Fold the bits shifted out of bit 127 back in: spill * (x^7 + x^2 + x + 1).
    np.bitwise_xor(new_low, spill, out=new_low)
    for shift in (1, 1, 5):
        np.left_shift(spill, np.uint64(shift), out=spill)
        np.bitwise_xor(new_low, spill, out=new_low)
    np.copyto(out[..., 0], new_low)


def _mul_alpha_pow(
    src: _U64Array, k: np.uint64 | _U64Array, out: _U64Array, spill: _U64Array
) -> None:
    """out = src * alpha^k in GF(2^128), 0 <= k <= _MAX_ALPHA_SHIFT, broadcasting.

    `spill` is scratch of out's shape without the last axis; `src` must not
    overlap `out`.
    """
    one = np.uint64(1)
    low, high = src[..., 0], src[..., 1]
    back = np.uint64(63) - k  # shift by 64 - k in two steps so k == 0 stays defined
    out_low, out_high = out[..., 0], out[..., 1]

    np.left_shift(high, k, out=out_high)
    np.right_shift(low >> one, back, out=spill)
    out_high |= spill

    np.right_shift(high >> one, back, out=spill)
    np.left_shift(low, k, out=out_low)
    # Fold the bits shifted out of bit 127 back in: spill * (x^7 + x^2 + x + 1).
    out_low ^= spill
    for shift in (1, 1, 5):
        spill <<= np.uint64(shift)
        out_low ^= spill
