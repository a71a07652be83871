"""engine.xts against IEEE 1619 vectors and cryptography's own XTS mode.

Expected values always come from the published vectors or from the oracle
below (one cryptography ``modes.XTS`` context per data unit), never from the
code under test.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from softhca.engine.backend import xts_transform
from softhca.engine.xts import _MAX_SCRATCH_LENGTHS, SCRATCH, XtsCipher, XtsError
from softhca.protocol.enums import BLOCK_SIZE_BYTES, BlockSize

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

_VECTORS = json.loads(
    (Path(__file__).parent.parent / "data" / "xts_ieee1619.json").read_text())["vectors"]


def oracle(
    key: bytes, data: bytes, unit_size: int, first_unit: int, initial_tweak: int, encrypt: bool
) -> bytes:
    """Per-unit cryptography XTS; the DUSN is the 16-byte little-endian tweak."""
    out = bytearray()
    for k, start in enumerate(range(0, len(data), unit_size)):
        dusn = (initial_tweak + first_unit + k) % (1 << 128)
        cipher = Cipher(algorithms.AES(key), modes.XTS(dusn.to_bytes(16, "little")))
        ctx = cipher.encryptor() if encrypt else cipher.decryptor()
        out += ctx.update(data[start : start + unit_size]) + ctx.finalize()
    return bytes(out)


def random_key(rng: random.Random, length: int) -> bytes:
    while True:
        key = rng.randbytes(length)
        if key[: length // 2] != key[length // 2 :]:  # cryptography's XTS refuses equal halves
            return key


@pytest.mark.parametrize("vector", _VECTORS, ids=lambda v: f"vector{v['vector']}")
def test_ieee1619_vector(vector: dict) -> None:
    key = bytes.fromhex(vector["key_hex"])
    plaintext = bytes.fromhex(vector["plaintext_hex"])
    ciphertext = bytes.fromhex(vector["ciphertext_hex"])
    dusn = vector["data_unit_sequence_number"]
    assert dusn.to_bytes(16, "little").hex() == vector["tweak_le_hex"]

    size = len(plaintext)
    assert xts_transform(key, plaintext, size, 0, dusn, encrypt=True) == ciphertext
    assert xts_transform(key, ciphertext, size, 0, dusn, encrypt=False) == plaintext


def test_vectors_cover_both_key_sizes_and_equal_halves() -> None:
    key_lengths = {len(v["key_hex"]) // 2 for v in _VECTORS}
    assert key_lengths == {32, 64}
    halves = [(h[: len(h) // 2], h[len(h) // 2 :]) for h in (v["key_hex"] for v in _VECTORS)]
    assert any(key1 == key2 for key1, key2 in halves)


@pytest.mark.parametrize("key_len", [32, 64])
@pytest.mark.parametrize("unit_size", [512, 520, 4048, 4096, 4160])
@pytest.mark.parametrize("n_units", [0, 1, 3, 8])
@pytest.mark.parametrize("tail", [0, 16, 24, 100, 496])
def test_matches_cryptography_xts(key_len: int, unit_size: int, n_units: int, tail: int) -> None:
    rng = random.Random(f"{key_len}-{unit_size}-{n_units}-{tail}")
    key = random_key(rng, key_len)
    data = rng.randbytes(n_units * unit_size + tail)
    tweaks = [
        (0, 0),
        (rng.getrandbits(64), rng.randrange(1 << 20)),
        ((1 << 64) - 2, 0),  # carry out of the low 64-bit word
        ((1 << 128) - 3, 1),  # wraps past 2**128 - 1 within a few units
        (rng.getrandbits(128), rng.getrandbits(32)),
    ]
    for initial_tweak, first_unit in tweaks:
        for encrypt in (True, False):
            expected = oracle(key, data, unit_size, first_unit, initial_tweak, encrypt)
            got = xts_transform(key, data, unit_size, first_unit, initial_tweak, encrypt)
            assert got == expected, (initial_tweak, first_unit, encrypt)


@pytest.mark.parametrize(
    ("unit_size", "n_units", "tail"),
    [(512, 1100, 100), (4096, 70, 0), (4160, 130, 24)],
)
@pytest.mark.parametrize("encrypt", [True, False])
def test_large_buffers_match_cryptography_xts(
    unit_size: int, n_units: int, tail: int, encrypt: bool
) -> None:
    """Buffers of several hundred KiB, as the engine sees them, tweak crossing 2**64."""
    rng = random.Random(f"large-{unit_size}-{n_units}-{tail}")
    key = random_key(rng, 64)
    data = rng.randbytes(n_units * unit_size + tail)
    initial_tweak, first_unit = (1 << 64) - 500, 17
    expected = oracle(key, data, unit_size, first_unit, initial_tweak, encrypt)
    assert xts_transform(key, data, unit_size, first_unit, initial_tweak, encrypt) == expected


@pytest.mark.parametrize("unit_size", [16, 17, 31, 32, 33, 47])
@pytest.mark.parametrize("encrypt", [True, False])
def test_shortest_units_match_cryptography_xts(unit_size: int, encrypt: bool) -> None:
    rng = random.Random(f"short-{unit_size}")
    key = random_key(rng, 32)
    data = rng.randbytes(9 * unit_size + 16)
    expected = oracle(key, data, unit_size, 3, 40, encrypt)
    assert xts_transform(key, data, unit_size, 3, 40, encrypt) == expected


def test_unit_tweaks_follow_data_position() -> None:
    """Units 2.. of a buffer equal a transform of the same bytes started at unit 2."""
    rng = random.Random(7)
    key = random_key(rng, 64)
    data = rng.randbytes(5 * 520)
    whole = xts_transform(key, data, 520, 10, 3, encrypt=True)
    assert whole[2 * 520 :] == xts_transform(key, data[2 * 520 :], 520, 12, 3, encrypt=True)
    assert whole == oracle(key, data, 520, 10, 3, encrypt=True)


@pytest.mark.parametrize(
    "wrap",
    [
        bytes,
        bytearray,
        memoryview,
        lambda b: np.frombuffer(b, dtype=np.uint8),
        lambda b: np.frombuffer(b"\0" + b, dtype=np.uint8)[1:],  # unaligned
        lambda b: np.repeat(np.frombuffer(b, dtype=np.uint8), 2)[::2],  # strided
        lambda b: memoryview(bytes(x for x in b for _ in range(2)))[::2],  # strided
    ],
    ids=["bytes", "bytearray", "memoryview", "ndarray", "unaligned", "strided", "strided_mv"],
)
def test_accepts_buffer_types(wrap) -> None:
    rng = random.Random(11)
    key = random_key(rng, 32)
    data = rng.randbytes(3 * 520 + 40)
    expected = oracle(key, data, 520, 5, 99, encrypt=True)
    got = xts_transform(key, wrap(data), 520, 5, 99, encrypt=True)
    assert isinstance(got, bytes)
    assert got == expected


def test_rejects_non_uint8_array() -> None:
    with pytest.raises(TypeError):
        xts_transform(bytes(range(32)), np.zeros(8, dtype=np.uint32), 16, 0, 0, encrypt=True)


@given(
    key=st.sampled_from([32, 64]).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
    unit_size=st.integers(16, 700),
    data=st.binary(max_size=3000),
    first_unit=st.integers(0, (1 << 64) - 1),
    initial_tweak=st.integers(0, (1 << 128) - 1),
)
@settings(max_examples=50, deadline=None)
def test_round_trip(
    key: bytes, unit_size: int, data: bytes, first_unit: int, initial_tweak: int
) -> None:
    # A last partial unit under 16 bytes has no XTS encoding: trim it rather than reject
    # the example (rejections can trip hypothesis' filter_too_much health check).
    if 0 < len(data) % unit_size < 16:
        data = data[: len(data) - len(data) % unit_size]
    ciphertext = xts_transform(key, data, unit_size, first_unit, initial_tweak, encrypt=True)
    assert len(ciphertext) == len(data)
    assert (
        xts_transform(key, ciphertext, unit_size, first_unit, initial_tweak, encrypt=False) == data
    )
    if key[: len(key) // 2] != key[len(key) // 2 :]:
        assert ciphertext == oracle(key, data, unit_size, first_unit, initial_tweak, encrypt=True)


def test_empty_data() -> None:
    assert xts_transform(bytes(range(32)), b"", 512, 0, 0, encrypt=True) == b""


@pytest.mark.parametrize(
    ("unit_size", "length"),
    [(8, 64), (15, 30), (512, 10), (512, 512 + 15), (520, 2 * 520 + 1)],
)
def test_short_unit_raises(unit_size: int, length: int) -> None:
    with pytest.raises(XtsError):
        xts_transform(bytes(range(64)), bytes(length), unit_size, 0, 0, encrypt=True)


@pytest.mark.parametrize("key_len", [0, 16, 24, 31, 33, 48, 63, 65, 128])
def test_bad_key_length_raises(key_len: int) -> None:
    with pytest.raises(XtsError):
        xts_transform(bytes(key_len), bytes(512), 512, 0, 0, encrypt=False)


def test_xts_error_is_value_error() -> None:
    assert issubclass(XtsError, ValueError)


# -- XtsCipher: one key's contexts reused across calls ---------------------------------


def test_cipher_reused_across_calls_matches_cryptography_xts() -> None:
    """One XtsCipher for a run of calls mixing directions, unit sizes (every
    data_unit_size the crypto setter accepts, and short tails) and tweaks: its ECB
    contexts are never finalized and fed whole blocks only, so no call leaks state
    into the next."""
    rng = random.Random("reuse")
    key = random_key(rng, 64)
    cipher = XtsCipher(key)
    for step in range(40):
        unit = rng.choice([*BLOCK_SIZE_BYTES.values(), 16, 33, 700])
        n_units = rng.randrange(0, 6)
        tail = rng.choice([0, 16, 17, 40]) if unit > 56 else 0
        data = rng.randbytes(n_units * unit + tail)
        tweak = rng.choice([rng.getrandbits(128), (1 << 64) - 1 - rng.randrange(4)])
        first_unit = rng.randrange(1 << 20)
        encrypt = rng.random() < 0.5
        out = np.empty(len(data), dtype=np.uint8)
        cipher.transform_into(
            np.frombuffer(data, dtype=np.uint8), unit, first_unit, tweak, encrypt, out
        )
        assert out.tobytes() == oracle(key, data, unit, first_unit, tweak, encrypt), step


def test_transform_into_refuses_a_wrong_sized_output() -> None:
    cipher = XtsCipher(bytes(range(64)))
    with pytest.raises(ValueError):
        cipher.transform_into(np.zeros(512, np.uint8), 512, 0, 0, True, np.zeros(496, np.uint8))


def test_cipher_scratch_is_bounded() -> None:
    """Callers cycling through many tail lengths keep at most a few scratch sets."""
    cipher = XtsCipher(bytes(range(64)))
    for tail in range(16, 16 + 40):
        data = np.zeros(512 + tail, np.uint8)
        cipher.transform_into(data, 512, 0, 0, True, np.empty_like(data))
    assert len(SCRATCH) <= _MAX_SCRATCH_LENGTHS


def test_cipher_with_its_scratch_held_elsewhere() -> None:
    """While the shared scratch is held (another thread transforming), a transform
    works on scratch of its own and gives the same bytes."""
    rng = random.Random("held")
    key = random_key(rng, 64)
    data = rng.randbytes(3 * 520)
    cipher = XtsCipher(key)
    src = np.frombuffer(data, dtype=np.uint8)
    out = np.empty(len(data), dtype=np.uint8)
    with SCRATCH.get(520):
        cipher.transform_into(src, 520, 4, 9, True, out)
    assert out.tobytes() == oracle(key, data, 520, 4, 9, True)


# -- the engine's crypto MKEY at every data unit size -----------------------------------


@pytest.mark.parametrize("dus", list(BlockSize), ids=lambda d: f"{BLOCK_SIZE_BYTES[d]}B")
def test_engine_mkey_every_data_unit_size(dus: BlockSize) -> None:
    """TX encrypts and RX decrypts through an MKEY's cached plan exactly as one
    cryptography XTS context per unit does, several units, tweaks carrying out of the
    low 64 bits, at transfer offsets other than 0, twice (the second on the reused
    plan and scratch)."""
    from softhca.engine import transfer
    from softhca.engine.hca import HCA
    from softhca.engine.mkey_configure import MkeyConfigureBuilder
    from softhca.protocol.attrs import SGE, CryptoAttr, DEKInitAttr
    from softhca.protocol.enums import (
        AccessFlags,
        CryptoKeySize,
        MkeyInitAttrFlags,
        Mlx5dvQpExSendOps,
    )

    unit = BLOCK_SIZE_BYTES[dus]
    rng = random.Random(f"engine-{unit}")
    key = random_key(rng, 64)
    hca = HCA("mlx5_0")
    pd = hca.alloc_pd()
    access = AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE
    data = rng.randbytes(9 * unit)
    mr = hca.reg_mr(pd, len(data), access)
    mr.write(data)
    dek = hca.create_dek(DEKInitAttr(pd=pd, key_size=CryptoKeySize.SIZE_256, key=key))
    tweak = (1 << 64) - 4  # units 4.. carry into the high 64 bits
    attr = CryptoAttr(encrypt_on_tx=True, data_unit_size=dus, dek=dek,
                      initial_tweak=tweak.to_bytes(16, "little"))
    mkey = hca.create_mkey(pd, MkeyInitAttrFlags.INDIRECT | MkeyInitAttrFlags.CRYPTO, 1)
    MkeyConfigureBuilder(pd, Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE).post_configure(
        mkey, access=access, sges=[SGE(mr.addr, mr.length, mr.lkey)], crypto=attr)
    for first, count in ((0, 9), (2, 5), (0, 9)):
        plain = data[first * unit:(first + count) * unit]
        wire = transfer.tx(pd, mkey.lkey, first * unit, count * unit)
        assert wire == oracle(key, plain, unit, first, tweak, True)
        mr.write(bytes(len(data)))
        transfer.rx(pd, mkey.lkey, first * unit, wire)
        assert mr.read(count * unit, first * unit) == plain
        mr.write(data)
