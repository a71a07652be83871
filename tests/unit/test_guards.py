"""engine.guards against the catalogue check values and an oracle written from the definitions.

The oracle shares nothing with the module: a per-bit CRC in the Rocksoft model
(width, poly, refin=refout, register start, xorout) and RFC 1071 in plain
Python. Every test runs against both the fast C backend and the crcmod
fallback, since a process only ever uses one of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softhca.engine import guards

VECTORS = json.loads((Path(__file__).parent.parent / "data" / "crc_check_values.json").read_text())
CHECK_INPUT = VECTORS["input_ascii"].encode()

CRC_KINDS = ("t10dif_crc", "crc32", "crc32c", "crc64_xp10")
BLOCK_SIZES = (512, 520, 4048, 4096, 4160)
SEEDS = {
    "t10dif_crc": (0, 0xFFFF),
    "t10dif_csum": (0, 0xFFFF),
    "crc32": (0, 0xFFFFFFFF),
    "crc32c": (0, 0xFFFFFFFF),
    "crc64_xp10": (0, 2**64 - 1),
}
KIND_SEEDS = [(k, s) for k in guards.GUARD_KINDS for s in SEEDS[k]]

# (width, normal poly without the top bit, reflected, xorout): the contract's table.
PARAMS = {
    "t10dif_crc": (16, 0x8BB7, False, 0),
    "crc32": (32, 0x04C11DB7, False, 0xFFFFFFFF),
    "crc32c": (32, 0x1EDC6F41, True, 0xFFFFFFFF),
    "crc64_xp10": (64, 0xAD93D23594C93659, True, 2**64 - 1),
}


# ---------------------------------------------------------------- oracle


def _reflect(value: int, bits: int) -> int:
    return int(f"{value:0{bits}b}"[::-1], 2)


def bitwise_crc(data: bytes, width: int, poly: int, reflected: bool, init: int, xorout: int) -> int:
    mask = (1 << width) - 1
    top = 1 << (width - 1)
    crc = init
    for byte in data:
        if reflected:
            byte = _reflect(byte, 8)
        crc ^= byte << (width - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) & mask if crc & top else (crc << 1) & mask
    if reflected:
        crc = _reflect(crc, width)
    return crc ^ xorout


def rfc1071(data: bytes, start: int = 0) -> int:
    if len(data) % 2:
        data += b"\0"
    total = start
    for i in range(0, len(data), 2):
        total += (data[i] << 8) | data[i + 1]
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def oracle(kind: str, data: bytes, seed: int) -> int:
    if kind == "t10dif_csum":
        return rfc1071(data, seed)
    width, poly, reflected, xorout = PARAMS[kind]
    return bitwise_crc(data, width, poly, reflected, seed, xorout)


# ---------------------------------------------------------------- helpers

BACKENDS = {
    "fast": {k: guards._select(k, prefer_fast=True) for k in guards.GUARD_KINDS},
    "crcmod": {k: guards._select(k, prefer_fast=False) for k in guards.GUARD_KINDS},
}


@pytest.fixture(params=sorted(BACKENDS))
def impls(request):
    return BACKENDS[request.param]


def test_backends_are_what_they_say():
    for kind in CRC_KINDS:
        assert BACKENDS["crcmod"][kind].name == "crcmod"
    assert BACKENDS["crcmod"]["t10dif_csum"].name == "numpy"
    assert guards.backend("t10dif_csum") == "numpy"
    for kind in guards.GUARD_KINDS:
        assert guards.backend(kind) in ("fastcrc", "anycrc", "crcmod", "numpy")
        # the fast path unless the run itself forces the fallback
        forced = os.environ.get("SOFTHCA_CRC_BACKEND", "").strip().lower() == "crcmod"
        assert guards.backend(kind) == BACKENDS["crcmod" if forced else "fast"][kind].name


def test_width_bits():
    assert guards.WIDTH_BITS == {
        "t10dif_crc": 16,
        "t10dif_csum": 16,
        "crc32": 32,
        "crc32c": 32,
        "crc64_xp10": 64,
    }
    assert tuple(guards.GUARD_KINDS) == ("t10dif_crc", "t10dif_csum", "crc32", "crc32c", "crc64_xp10")


# ---------------------------------------------------------------- check values

CHECKS = [
    ("t10dif_crc_bg_0", "t10dif_crc", 0, CHECK_INPUT),
    ("t10dif_crc_bg_ffff", "t10dif_crc", 0xFFFF, CHECK_INPUT),
    ("ip_checksum_rfc1071", "t10dif_csum", 0, CHECK_INPUT),
    ("ip_checksum_rfc1071_example_0001f203f4f5f6f7", "t10dif_csum", 0, bytes.fromhex("0001f203f4f5f6f7")),
    ("crc32_fcph_seed_ffffffff", "crc32", 0xFFFFFFFF, CHECK_INPUT),
    ("crc32_fcph_seed_0", "crc32", 0, CHECK_INPUT),
    ("crc32c_seed_ffffffff", "crc32c", 0xFFFFFFFF, CHECK_INPUT),
    ("crc32c_seed_0", "crc32c", 0, CHECK_INPUT),
    ("crc64_xp10_seed_all_ones", "crc64_xp10", 2**64 - 1, CHECK_INPUT),
    ("crc64_xp10_seed_0", "crc64_xp10", 0, CHECK_INPUT),
]


def test_every_vector_is_checked():
    assert {c[0] for c in CHECKS} == set(VECTORS) - {"input_ascii"}


@pytest.mark.parametrize("key,kind,seed,data", CHECKS, ids=[c[0] for c in CHECKS])
def test_check_values(impls, key, kind, seed, data):
    expected = int(VECTORS[key], 16)
    assert oracle(kind, data, seed) == expected  # the oracle agrees with the catalogue
    arr = np.frombuffer(data, np.uint8)
    for form in (data, bytearray(data), memoryview(data), arr):
        assert guards._guard(impls[kind], kind, form, seed) == expected
    assert guards._guards_many(impls[kind], arr.reshape(1, -1), kind, seed).tolist() == [expected]


@pytest.mark.parametrize("key,kind,seed,data", CHECKS, ids=[c[0] for c in CHECKS])
def test_check_values_public(key, kind, seed, data):
    assert guards.guard(kind, data, seed) == int(VECTORS[key], 16)


# ---------------------------------------------------------------- guards_many vs oracle

RNG = np.random.default_rng(0x5EED)
N_BLOCKS = 3
PI = 8
# One (N_BLOCKS, size + PI) array per size, shared by all kinds and seeds; the oracle
# value of each block is computed once (the per-bit CRC is slow).
PARENTS = {size: RNG.integers(0, 256, (N_BLOCKS, size + PI), dtype=np.uint8) for size in BLOCK_SIZES}


@pytest.fixture(scope="module")
def expected_cache():
    return {}


def _expected(cache, kind, seed, size, where):
    key = (kind, seed, size, where)
    if key not in cache:
        view = PARENTS[size][:, :size] if where == "data" else PARENTS[size][:, PI:]
        cache[key] = [oracle(kind, row.tobytes(), seed) for row in view]
    return cache[key]


@pytest.mark.parametrize("size", BLOCK_SIZES)
@pytest.mark.parametrize("kind,seed", KIND_SEEDS, ids=[f"{k}-{s:#x}" for k, s in KIND_SEEDS])
def test_guards_many_matches_oracle(impls, expected_cache, kind, seed, size):
    parent = PARENTS[size]
    expected = _expected(expected_cache, kind, seed, size, "data")
    strided = parent[:, :size]  # data part of (n, size + pi) interleaved blocks
    assert not strided.flags.c_contiguous
    before = parent.copy()
    for blocks in (strided, np.ascontiguousarray(strided)):
        got = guards._guards_many(impls[kind], blocks, kind, seed)
        assert got.dtype == np.uint64 and got.shape == (N_BLOCKS,)
        assert got.tolist() == expected
    assert np.array_equal(parent, before)  # input untouched
    # single-buffer path agrees, row by row
    assert [guards._guard(impls[kind], kind, row, seed) for row in strided] == expected


@pytest.mark.parametrize("kind,seed", KIND_SEEDS, ids=[f"{k}-{s:#x}" for k, s in KIND_SEEDS])
def test_guards_many_offset_rows(impls, expected_cache, kind, seed):
    # rows starting PI bytes in (pi before data), and the public entry point
    size = 512
    blocks = PARENTS[size][:, PI:]
    expected = _expected(expected_cache, kind, seed, size, "after_pi")
    assert guards._guards_many(impls[kind], blocks, kind, seed).tolist() == expected
    assert guards.guards_many(blocks, kind, seed).tolist() == expected


@pytest.mark.parametrize("kind,seed", KIND_SEEDS, ids=[f"{k}-{s:#x}" for k, s in KIND_SEEDS])
def test_guards_many_odd_shapes(impls, kind, seed):
    rng = np.random.default_rng(7)
    # last axis not contiguous (every other byte), odd lengths, empty blocks, no blocks
    wide = rng.integers(0, 256, (4, 2 * 37), dtype=np.uint8)
    cases = [wide[:, ::2], wide[:, :37], wide[:, :1], wide[:, :0], wide[:0, :16], wide.T[:5].T]
    for blocks in cases:
        expected = [oracle(kind, row.tobytes(), seed) for row in blocks]
        got = guards._guards_many(impls[kind], blocks, kind, seed)
        assert got.dtype == np.uint64 and got.shape == (blocks.shape[0],)
        assert got.tolist() == expected, blocks.shape


def test_guard_odd_length_csum_pads_a_zero_byte():
    assert guards.guard("t10dif_csum", b"\x12\x34\x56", 0) == rfc1071(b"\x12\x34\x56\x00")
    assert guards.guard("t10dif_csum", b"", 0) == 0xFFFF
    assert guards.guard("t10dif_csum", bytes(8), 0xFFFF) == 0  # bg is added into the sum
    assert guards.guard("t10dif_csum", bytes(8), 0) == 0xFFFF


def test_guard_accepts_other_buffers():
    data = bytes(range(64))
    expected = oracle("crc32c", data, 0)
    u16 = np.frombuffer(data, np.uint8).view(np.uint16)
    for form in (u16, memoryview(u16), memoryview(data).cast("B", (8, 8))):
        assert guards.guard("crc32c", form, 0) == expected
    strided = np.frombuffer(bytes(range(128)), np.uint8)[::2]
    assert guards.guard("crc32c", memoryview(strided), 0) == oracle("crc32c", strided.tobytes(), 0)
    assert guards.guard("crc32c", strided, 0) == oracle("crc32c", strided.tobytes(), 0)


# ---------------------------------------------------------------- fast == fallback

KINDS_ST = st.sampled_from(KIND_SEEDS)


@settings(max_examples=50, deadline=None)
@given(ks=KINDS_ST, data=st.binary(max_size=600))
def test_fast_and_fallback_agree_on_buffers(ks, data):
    kind, seed = ks
    fast = guards._guard(BACKENDS["fast"][kind], kind, data, seed)
    slow = guards._guard(BACKENDS["crcmod"][kind], kind, data, seed)
    assert fast == slow
    assert 0 <= fast < 1 << guards.WIDTH_BITS[kind]


@settings(max_examples=50, deadline=None)
@given(
    ks=KINDS_ST,
    n=st.integers(0, 6),
    size=st.integers(0, 300),
    pi=st.sampled_from([0, 8, 64]),
    seed_bytes=st.integers(0, 2**32 - 1),
)
def test_fast_and_fallback_agree_on_blocks(ks, n, size, pi, seed_bytes):
    kind, seed = ks
    parent = np.random.default_rng(seed_bytes).integers(0, 256, (n, size + pi), dtype=np.uint8)
    blocks = parent[:, :size]
    fast = guards._guards_many(BACKENDS["fast"][kind], blocks, kind, seed)
    slow = guards._guards_many(BACKENDS["crcmod"][kind], blocks, kind, seed)
    assert fast.tolist() == slow.tolist()
    assert fast.tolist() == [guards.guard(kind, row, seed) for row in blocks]


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("kind", ["", "crc16", "T10DIF_CRC", "crc64", None])
def test_unknown_kind(kind):
    with pytest.raises(ValueError):
        guards.guard(kind, b"x", 0)
    with pytest.raises(ValueError):
        guards.guards_many(np.zeros((1, 8), np.uint8), kind, 0)
    with pytest.raises(ValueError):
        guards.backend(kind)
    with pytest.raises(ValueError):
        guards._select(kind, True)


BAD_SEEDS = [
    ("t10dif_crc", 1),
    ("t10dif_crc", 0xFFFFFFFF),
    ("t10dif_csum", 0x1234),
    ("crc32", 0xFFFF),
    ("crc32", 2**64 - 1),
    ("crc32c", 1),
    ("crc64_xp10", 0xFFFFFFFF),
    ("crc64_xp10", -1),
    ("crc32", 0.0),
    ("crc32", "0"),
]


@pytest.mark.parametrize("kind,seed", BAD_SEEDS)
def test_unsupported_seed(kind, seed):
    with pytest.raises(ValueError):
        guards.guard(kind, b"x", seed)
    with pytest.raises(ValueError):
        guards.guards_many(np.zeros((2, 8), np.uint8), kind, seed)


def test_numpy_integer_seed():
    assert guards.guard("t10dif_crc", CHECK_INPUT, np.uint16(0xFFFF)) == 0x8E3C


def test_bad_blocks():
    with pytest.raises(ValueError):
        guards.guards_many(np.zeros(8, np.uint8), "crc32", 0)
    with pytest.raises(TypeError):
        guards.guards_many(np.zeros((2, 8), np.uint16), "crc32", 0)


def test_env_forces_crcmod():
    code = (
        "from softhca.engine import guards\n"
        "print(','.join(guards.backend(k) for k in guards.GUARD_KINDS))\n"
        "print(hex(guards.guard('crc32', b'123456789', 0)))\n"
    )
    env = dict(os.environ, SOFTHCA_CRC_BACKEND="crcmod")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    names, value = out.stdout.split()
    assert names == "crcmod,numpy,crcmod,crcmod,crcmod"
    assert value == "0x765e7680"


def test_missing_fast_libraries_fall_back_to_crcmod():
    code = (
        "import sys\n"
        "sys.modules['fastcrc'] = sys.modules['anycrc'] = None  # makes their import fail\n"
        "from softhca.engine import guards\n"
        "print(','.join(guards.backend(k) for k in guards.GUARD_KINDS))\n"
        "print(hex(guards.guard('crc64_xp10', b'123456789', 0)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SOFTHCA_CRC_BACKEND"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    names, value = out.stdout.split()
    assert names == "crcmod,numpy,crcmod,crcmod,crcmod"
    assert value == "0x87ff3f9b2b57c87b"
