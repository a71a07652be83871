"""Per-block guards of an MKEY block signature: T10-DIF CRC / IP checksum, CRC32, CRC32C, CRC64.

Seeds: mlx5dv_wr_set_mkey_sig_block(3) says of ``bg`` "The following values
are supported as a seed: 0, 0xFFFF(UINT16_MAX)" and of the CRC seed "Only the
following values are supported as a seed: CRC32/CRC32C - 0, 0xFFFFFFFF;
CRC64_XP10 - 0, 0xFFFFFFFFFFFFFFFF", so anything else is a ValueError here rather
than a guard no HCA would produce. A seed is the CRC register's starting value;
the final xor of the algorithm is applied whatever the seed. (The man page also
says bits above the CRC width are ignored: a caller holding the raw uint64
``seed`` field of a CRC32 domain masks it before calling.)

Backends: the C libraries fastcrc and anycrc are 20-40 times faster than
crcmod's table loop, but they are called for the catalogued algorithm only, i.e. one
fixed seed. fastcrc documents ``initial=`` as "the starting value" yet 0.5.0
takes it after the final xor, so ``initial=0`` silently yields the seed
0xFFFFFFFF guard of CRC32/CRC32C: the very seed-0 case it would be needed for.
A CRC is affine in its register start, so for a fixed length L

    crc_seedA(x) == crc_seedB(x) ^ crc_seedA(0^L) ^ crc_seedB(0^L)

and the other seed costs one xor per block with a constant computed once per
(kind, L, seed) by crcmod. crcmod (a hard dependency, with a C extension) is
also the fallback when the fast libraries are missing, fail their self-check,
or SOFTHCA_CRC_BACKEND=crcmod is set when this module is imported.

Speed: one C call per block, never Python per byte; the T10-DIF checksum has
no C library here and is one numpy reduction over all blocks at once.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import crcmod
import numpy as np

GUARD_KINDS = ("t10dif_crc", "t10dif_csum", "crc32", "crc32c", "crc64_xp10")
WIDTH_BITS = {
    "t10dif_crc": 16,
    "t10dif_csum": 16,
    "crc32": 32,
    "crc32c": 32,
    "crc64_xp10": 64,
}

# mlx5dv_wr_set_mkey_sig_block(3): the only seeds the device takes.
_SEEDS = {
    "t10dif_crc": (0, 0xFFFF),
    "t10dif_csum": (0, 0xFFFF),
    "crc32": (0, 0xFFFF_FFFF),
    "crc32c": (0, 0xFFFF_FFFF),
    "crc64_xp10": (0, 0xFFFF_FFFF_FFFF_FFFF),
}

_CHECK_INPUT = b"123456789"


class _CrcSpec(NamedTuple):
    poly: int  # crcmod form: the x^width term included
    reflected: bool
    xorout: int
    std_seed: int  # register start of the catalogued algorithm the fast libraries implement
    check: int  # catalogued CRC of "123456789" at std_seed


_CRC_SPECS = {
    # T10 SBC-3 guard: CRC-16/T10-DIF, register starts at 0.
    "t10dif_crc": _CrcSpec(0x1_8BB7, False, 0, 0, 0xD0DB),
    # FC-PH CRC32 is computed MSB first (unreflected): CRC-32/BZIP2, not zlib's reflected CRC-32.
    "crc32": _CrcSpec(0x1_04C1_1DB7, False, 0xFFFF_FFFF, 0xFFFF_FFFF, 0xFC89_1918),
    # RFC 3720 CRC32C: CRC-32/ISCSI.
    "crc32c": _CrcSpec(0x1_1EDC_6F41, True, 0xFFFF_FFFF, 0xFFFF_FFFF, 0xE306_9283),
    # Same parameters as the catalogue's CRC-64/NVME, which is how anycrc names it.
    "crc64_xp10": _CrcSpec(
        0x1_AD93_D235_94C9_3659, True, 0xFFFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF, 0xAE8B_1486_0A79_9888
    ),
}


class _Impl(NamedTuple):
    """A per-buffer guard function and the seed it computes at."""

    name: str
    fn: Callable[[Any], int]  # takes one C-contiguous byte buffer
    seed: int


# ---------------------------------------------------------------- crcmod


@functools.cache
def _crcmod_fun(kind: str, seed: int) -> Callable[[Any], int]:
    spec = _CRC_SPECS[kind]
    # crcmod's initCrc is the value *after* the final xor: the register starts at initCrc ^ xorOut.
    return crcmod.mkCrcFun(spec.poly, initCrc=seed ^ spec.xorout, rev=spec.reflected, xorOut=spec.xorout)


@functools.lru_cache(maxsize=1024)
def _seed_fixup(kind: str, length: int, have: int, want: int) -> int:
    """What to xor into a guard computed at seed ``have`` to get seed ``want`` (module docstring)."""
    if have == want:
        return 0
    zeros = bytes(length)
    return _crcmod_fun(kind, have)(zeros) ^ _crcmod_fun(kind, want)(zeros)


# ---------------------------------------------------------------- fast libraries


def _fast_fun(kind: str) -> tuple[str, Callable[[Any], int]] | None:
    try:
        if kind == "crc64_xp10":
            import anycrc

            return "anycrc", anycrc.Model("CRC64-NVME").calc
        from fastcrc import crc16, crc32

        return "fastcrc", {"t10dif_crc": crc16.t10_dif, "crc32": crc32.bzip2, "crc32c": crc32.iscsi}[kind]
    except (ImportError, AttributeError, ValueError):  # missing, or too old to know the algorithm
        return None


def _csum_one(buf: np.ndarray) -> int:
    """The T10-DIF IP checksum of one buffer at bg 0 (the seed is not affine here)."""
    return int(_csum_rows(buf.reshape(1, -1), 0)[0])


def _csum_rows(rows: np.ndarray, bg: int) -> np.ndarray:
    """RFC 1071 checksum of every row of a 2-D uint8 array whose last axis is contiguous."""
    n, length = rows.shape
    even = length & ~1
    # Big-endian words: the guard is the checksum as T10-DIF stores it, first byte most significant.
    s = rows[:, :even].view(">u2").sum(axis=1, dtype=np.uint64)
    if length & 1:  # RFC 1071: an odd trailing byte is padded with a zero byte
        s += rows[:, -1].astype(np.uint64) << np.uint64(8)
    s += np.uint64(bg)
    while n and int(s.max()) > 0xFFFF:  # end-around carry
        s = (s & np.uint64(0xFFFF)) + (s >> np.uint64(16))
    return s ^ np.uint64(0xFFFF)


def _select(kind: str, prefer_fast: bool) -> _Impl:
    """The implementation of ``kind``: the fast C library when wanted and sane, else crcmod."""
    _check_kind(kind)
    if kind == "t10dif_csum":
        return _Impl("numpy", _csum_one, 0)
    spec = _CRC_SPECS[kind]
    if prefer_fast:
        found = _fast_fun(kind)
        # The pyproject accepts a range of versions: keep a library only if it computes
        # the catalogued algorithm, bytes or numpy buffer alike.
        if found is not None:
            try:
                ok = found[1](_CHECK_INPUT) == spec.check == found[1](np.frombuffer(_CHECK_INPUT, np.uint8))
            except (TypeError, ValueError):
                ok = False
            if ok:
                return _Impl(found[0], found[1], spec.std_seed)
    return _Impl("crcmod", _crcmod_fun(kind, spec.std_seed), spec.std_seed)


def _check_kind(kind: str) -> None:
    if kind not in WIDTH_BITS:
        raise ValueError(f"unknown guard kind {kind!r}; expected one of {GUARD_KINDS}")


def _check_seed(kind: str, seed: int) -> int:
    _check_kind(kind)
    try:
        seed = operator.index(seed)
    except TypeError:
        raise ValueError(f"{kind} seed must be an integer, got {seed!r}") from None
    if seed not in _SEEDS[kind]:
        allowed = " or ".join(hex(s) for s in _SEEDS[kind])
        raise ValueError(f"unsupported {kind} seed {seed:#x}: the device takes {allowed}")
    return seed


_BACKEND_ENV = os.environ.get("SOFTHCA_CRC_BACKEND", "auto").strip().lower()
if _BACKEND_ENV not in ("", "auto", "crcmod"):
    raise ValueError(f"SOFTHCA_CRC_BACKEND={_BACKEND_ENV!r}: expected 'auto' or 'crcmod'")
_ACTIVE = {kind: _select(kind, prefer_fast=_BACKEND_ENV != "crcmod") for kind in GUARD_KINDS}


# ---------------------------------------------------------------- the guards


def _as_buffer(data: Any) -> np.ndarray:
    """A 1-D C-contiguous uint8 view of ``data`` (a copy only when it is strided)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError, BufferError):
        return np.ascontiguousarray(np.asarray(memoryview(data))).reshape(-1).view(np.uint8)


def _guard(impl: _Impl, kind: str, data: Any, seed: int) -> int:
    seed = _check_seed(kind, seed)
    buf = _as_buffer(data)
    if kind == "t10dif_csum":
        return int(_csum_rows(buf.reshape(1, -1), seed)[0])
    return impl.fn(buf) ^ _seed_fixup(kind, len(buf), impl.seed, seed)


def _guards_many(impl: _Impl, blocks: np.ndarray, kind: str, seed: int) -> np.ndarray:
    seed = _check_seed(kind, seed)
    blocks = np.asarray(blocks)
    if blocks.ndim != 2:
        raise ValueError(f"blocks must be 2-D (n, block_len), got shape {blocks.shape}")
    if blocks.dtype != np.uint8:
        raise TypeError(f"blocks must be uint8, got {blocks.dtype}")
    n, length = blocks.shape
    if length > 1 and blocks.strides[1] != 1:
        blocks = np.ascontiguousarray(blocks)
    # From here every row is C-contiguous (a row view of a (n, len+pi) array already is),
    # which is all the C functions need: no copy of the strided array.
    if kind == "t10dif_csum":
        return _csum_rows(blocks, seed)
    out = np.fromiter(map(impl.fn, blocks), dtype=np.uint64, count=n)
    fix = _seed_fixup(kind, length, impl.seed, seed)
    if fix:
        out ^= np.uint64(fix)
    return out


def _active(kind: str) -> _Impl:
    _check_kind(kind)
    return _ACTIVE[kind]


def guard(kind: str, data, seed: int) -> int:
    """One buffer (bytes / memoryview / uint8 ndarray)."""
    return _guard(_active(kind), kind, data, seed)


def guards_many(blocks: np.ndarray, kind: str, seed: int) -> np.ndarray:
    """blocks: 2-D uint8 array (n, block_len), possibly a non-contiguous row view of a larger (n, block_len+pi) array.
    Returns a 1-D np.uint64 array of n guard values."""
    return _guards_many(_active(kind), blocks, kind, seed)


class BlockGuard:
    """The guard of ``kind`` at ``seed`` over blocks of ``length`` bytes, looked up once per
    signature configuration (implementation, seed check, seed fix-up), so that a transfer
    pays one C call per block and no other Python work per block.

    ``impl`` picks a backend explicitly (the tests use it to run crcmod beside the fast
    libraries); by default it is the one this process selected at import.
    """

    def __init__(self, kind: str, seed: int, length: int, impl: _Impl | None = None) -> None:
        self.kind = kind
        self.seed = _check_seed(kind, seed)
        self.length = length
        impl = impl or _active(kind)
        self.backend = impl.name
        self._fn = impl.fn
        self._csum = kind == "t10dif_csum"
        self._fix = np.uint64(0 if self._csum else _seed_fixup(kind, length, impl.seed, self.seed))

    def __call__(self, rows: np.ndarray, views: list | None = None) -> np.ndarray:
        """Guards of the n rows of ``rows`` (n, length), each row C-contiguous. ``views``,
        when given, holds at least n buffers with the same bytes as those rows in order
        (memoryviews made once for a scratch buffer): calling the C function on them
        skips making an ndarray per row, the largest per-block cost left."""
        n = rows.shape[0]
        if self._csum:
            return _csum_rows(rows, self.seed)
        # fromiter stops after count items, so a longer views list is fine.
        out = np.fromiter(map(self._fn, rows if views is None else views), dtype=np.uint64,
                          count=n)
        if self._fix:
            out ^= self._fix
        return out


def backend(kind: str) -> str:
    """Name of the library serving ``kind``: "fastcrc", "anycrc", "crcmod" or "numpy"."""
    return _active(kind).name
