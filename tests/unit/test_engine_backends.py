"""The native accelerator against the Python engine, the reference: random layouts,
signatures and crypto through whole transfers, each run once on each backend, must give
byte-identical wire images and memory images, identical signature errors (type, actual,
expected, offset), identical latched MKEY state, identical refusals and identical trace
events.

The Python engine itself is judged against vectors and an independent oracle elsewhere
(test_signature.py, test_xts.py, test_properties.py); this file says the two agree.
SOFTHCA_BACKEND_EXAMPLES sets the property's example count (default 200).
"""

from __future__ import annotations

import os
import random
from contextlib import contextmanager, nullcontext

import pytest
from conftest import EngineNode
from engine_backends import native_missing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from softhca.engine import backend, transfer
from softhca.engine.completion import TransferError
from softhca.engine.xts import xts_transform as python_xts
from softhca.protocol.attrs import CryptoAttr, SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from softhca.protocol.enums import (
    BLOCK_SIZE_BYTES,
    BlockSize,
    SigBlockAttrFlags,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difFlags,
    SigType,
)

EXAMPLES = int(os.environ.get("SOFTHCA_BACKEND_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
T10_FLAGS = (SigT10difFlags.REF_REMAP, SigT10difFlags.APP_ESCAPE, SigT10difFlags.APP_REF_ESCAPE)


@pytest.fixture(autouse=True)
def _needs_native():
    why = native_missing()
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)


@st.composite
def domains(draw, block_size):
    if draw(st.booleans()):
        flags = 0
        for f in T10_FLAGS:     # any subset: both escapes set is a case of its own
            flags |= f if draw(st.booleans()) else 0
        return SigBlockDomain(sig_type=SigType.T10DIF, block_size=block_size, dif=SigT10dif(
            bg_type=draw(st.sampled_from([0, 1])), bg=draw(st.sampled_from([0, 0xFFFF])),
            app_tag=draw(st.sampled_from([0, 0x1234, 0xFFFF])),
            ref_tag=draw(st.sampled_from([0, 7, 0xFFFFFFFE, 0xFFFFFFFF])), flags=flags))
    crc_type = draw(st.sampled_from(list(SigCrcType)))
    ones = 0xFFFFFFFFFFFFFFFF if crc_type == SigCrcType.CRC64_XP10 else 0xFFFFFFFF
    return SigBlockDomain(sig_type=SigType.CRC, block_size=block_size,
                          crc=SigCrc(crc_type, draw(st.sampled_from([0, ones]))))


def same_structure(a: SigBlockDomain | None, b: SigBlockDomain | None) -> bool:
    return (a is not None and b is not None and a.sig_type == b.sig_type
            and (a.sig_type != SigType.CRC or a.crc.crc_type == b.crc.crc_type))


@st.composite
def cases(draw):
    """A configuration (signature, crypto or both) and one TX and one RX through it."""
    bs = draw(st.sampled_from(list(BlockSize)))
    sig = None
    if draw(st.integers(0, 3)):   # three in four have a signature
        mem = draw(st.none() | domains(bs))
        wire = draw(st.none() | domains(bs)) if mem is not None else draw(domains(bs))
        flags, copy_mask = 0, 0
        if same_structure(mem, wire) and draw(st.booleans()):
            flags, copy_mask = SigBlockAttrFlags.COPY_MASK, draw(st.integers(0, 0xFF))
        sig = SigBlockAttr(mem=mem, wire=wire, flags=flags, check_mask=draw(st.integers(0, 0xFF)),
                           copy_mask=copy_mask)
    crypto = None
    if sig is None or draw(st.booleans()):
        crypto = dict(unit=draw(st.sampled_from(list(BlockSize))),
                      order=draw(st.sampled_from(list(SignatureCryptoOrder))),
                      encrypt_on_tx=draw(st.booleans()),
                      key_len=draw(st.sampled_from([32, 64])),
                      tweak=draw(st.sampled_from([0, 5, (1 << 64) - 2, (1 << 128) - 3])))
    return dict(bs=BLOCK_SIZE_BYTES[bs], sig=sig, crypto=crypto,
                blocks=draw(st.integers(0, 5)), first=draw(st.integers(0, 2)),
                tail=draw(st.sampled_from([0, 0, 16, 24, 100])),
                escapes=draw(st.integers(0, 3)), corrupt=draw(st.sampled_from([0, 1, 1, 2, 2])),
                trace=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


def widths(case) -> tuple[int, int]:
    """(memory, wire) bytes per block."""
    sig, bs = case["sig"], case["bs"]

    def size(d):
        if d is None:
            return 0
        if d.sig_type == SigType.T10DIF:
            return 8
        return 8 if d.crc.crc_type == SigCrcType.CRC64_XP10 else 4

    if sig is None:
        return bs, bs
    return bs + size(sig.mem), bs + size(sig.wire)


def wire_image(case, rng: random.Random, wire_w: int, length: int) -> bytes:
    """Random wire bytes, some blocks' PI set to the escape tags, some bytes changed."""
    wire = bytearray(rng.randbytes(length))
    bs = case["bs"]
    for _ in range(case["escapes"]):
        if length >= wire_w and wire_w > bs:
            b = rng.randrange(length // wire_w) * wire_w + bs
            wire[b + 2:b + 4] = b"\xff\xff"
            if rng.random() < 0.5:
                wire[b + 4:b + 8] = b"\xff\xff\xff\xff"
    return bytes(wire)


@contextmanager
def portable_guards():
    """The native module's guards from tables, as on a CPU without SSE4.2 or PCLMULQDQ
    (accel/native.c, portable_guards), whatever this CPU has."""
    module = backend._import_native()[0]
    was = module.portable_guards(True)
    try:
        yield
    finally:
        module.portable_guards(was)


def run(which: str, case, memory: bytes, wire_in: bytes, offset: int, length: int,
        portable: bool = False) -> dict:
    """Everything a TX then an RX through the case's MKEY shows, on one backend (the
    native one with table guards when ``portable``)."""
    out: dict = {}
    with backend.using(which), portable_guards() if portable else nullcontext():
        node = EngineNode()
        crypto = None
        c = case["crypto"]
        if c is not None:
            key = random.Random(case["seed"]).randbytes(c["key_len"])
            dek = node.create_dek(key)
            crypto = CryptoAttr(encrypt_on_tx=c["encrypt_on_tx"], signature_crypto_order=c["order"],
                                data_unit_size=c["unit"], dek=dek,
                                initial_tweak=c["tweak"].to_bytes(16, "little"))
        mr, mkey = node.mkey_over(memory, sig=case["sig"], crypto=crypto)
        events: list = []
        trace = (lambda e: events.append((e.direction, e.stage, e.stream, e.offset, e.data,
                                          e.detail))) if case["trace"] else None
        for name, call in (("tx", lambda errs: transfer.tx(node.pd, mkey.lkey, offset, length,
                                                           trace=trace, sig_errors=errs)),
                           ("rx", lambda errs: transfer.rx(node.pd, mkey.lkey, offset, wire_in,
                                                           trace=trace, sig_errors=errs))):
            errs: list = []
            try:
                out[name] = call(errs)
            except TransferError as exc:
                out[name] = ("refused", exc.fault, str(exc))
            out[name + "_sig_errors"] = errs
        out["memory"] = mr.read(len(memory), 0)
        out["latched"] = mkey.mkey_check() if case["sig"] is not None else None
        out["trace"] = events
    return out


@SETTINGS
@given(case=cases())
def test_native_and_python_engines_agree(case) -> None:
    """Byte-identical outputs and identical error reports, on random layouts: every block
    size, every signature type and guard, escapes, masks, REF_REMAP, COPY_MASK, XTS at
    every data unit size in either order, transfer ends inside a block or a data unit."""
    rng = random.Random(case["seed"])
    mem_w, wire_w = widths(case)
    n_total = case["first"] + case["blocks"] + 1
    memory = rng.randbytes(n_total * mem_w)
    offset = case["first"] * wire_w
    length = case["blocks"] * wire_w + case["tail"]
    python = run("python", case, memory, b"", offset, length)
    # RX gets the TX's image with blocks corrupted, or random bytes with escapes planted.
    wire = python["tx"] if isinstance(python["tx"], bytes) else b""
    if case["corrupt"] == 2 or not wire:
        wire = wire_image(case, rng, wire_w, length)
    elif case["corrupt"] == 1 and wire:
        pos = rng.randrange(len(wire))
        wire = wire[:pos] + bytes([wire[pos] ^ 1 << rng.randrange(8)]) + wire[pos + 1:]
    python = run("python", case, memory, wire, offset, length)
    native = run("native", case, memory, wire, offset, length)
    assert native == python
    # The path a CPU without SSE4.2 or PCLMULQDQ takes, on this one.
    assert run("native", case, memory, wire, offset, length, portable=True) == python
    # What the examples covered (--hypothesis-show-statistics).
    for name in ("tx", "rx"):
        event(f"{name} refused" if isinstance(python[name], tuple) else
              f"{name} signature error" if python[name + "_sig_errors"] else f"{name} clean")


@settings(max_examples=EXAMPLES // 2, deadline=None)
@given(key=st.sampled_from([32, 64]).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
       unit=st.sampled_from([16, 17, 31, 255, 257, 272, 512, 520, 4048, 4096, 4160]),
       data=st.binary(max_size=9000), first=st.integers(0, (1 << 64) - 1),
       tweak=st.integers(0, (1 << 128) - 1), encrypt=st.booleans())
def test_native_xts_both_ways_equals_python(key, unit, data, first, tweak, encrypt) -> None:
    """The native XTS, VAES, AES-NI and OpenSSL alike, against engine/xts.py on odd lengths:
    short last units (ciphertext stealing), tweaks wrapping past 2^64 and 2^128."""
    tail = len(data) % unit
    if 0 < tail < 16:
        data = data[:len(data) - tail]
    want = python_xts(key, data, unit, first, tweak, encrypt)
    module = backend._import_native()[0]
    dusn = (tweak + first) % (1 << 128)
    # Every implementation this CPU has: the module's default and those below it.
    impls = ("vaes", "aesni", "openssl")
    for impl in impls[impls.index(module.xts_impl):]:
        try:
            k = module.XtsKey(key, impl)
        except ValueError:
            # OpenSSL refuses key1 == key2; the engine keeps such a key in Python.
            assert impl == "openssl" and key[:len(key) // 2] == key[len(key) // 2:]
            continue
        assert k.impl == impl
        got = module.xts(k, data, None, unit, dusn & (2**64 - 1), dusn >> 64, encrypt)
        assert got == want, impl


def test_portable_guards_are_the_same_crcs() -> None:
    """The table guards (no SSE4.2 or PCLMULQDQ) give what the accelerated ones give and
    what the Python engine gives, on lengths around every folding step (16, 64, 256 bytes)
    and seeds of both kinds; the switch says what it was and turns back."""
    from softhca.engine import guards

    module = backend._import_native()[0]
    kinds = {"t10dif_crc": (0, 0xFFFF), "crc32": (0, 0xFFFFFFFF), "crc32c": (0, 0xFFFFFFFF),
             "crc64_xp10": (0, 2**64 - 1)}
    rng = random.Random(7)
    before = module.portable_guards()
    for n in (0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 512, 520, 4096, 4097):
        data = rng.randbytes(n)
        for kind, seeds in kinds.items():
            code = {"t10dif_crc": 0, "crc32": 2, "crc32c": 3, "crc64_xp10": 4}[kind]
            for seed in seeds:
                want = guards.guard(kind, data, seed)
                with portable_guards():
                    assert module.portable_guards() is True
                    table = module.guard(code, seed, data)
                assert (table, module.guard(code, seed, data)) == (want, want), (kind, n, seed)
    assert module.portable_guards() is before


def test_env_forces_a_backend(tmp_path) -> None:
    """SOFTHCA_ENGINE=python takes the Python engine even with the module built; native
    and auto take the module; without the module auto falls back and native is an
    ImportError; any other value is refused. One interpreter, the choice made again by
    reloading engine/backend.py under each value."""
    import subprocess
    import sys

    program = """
import importlib, os, sys
from softhca.engine import backend
def choose(value, hide=False):
    os.environ["SOFTHCA_ENGINE"] = value
    if hide:  # a None in sys.modules fails the import: the module as if it were not built
        sys.modules["softhca.accel._native"] = None
        vars(sys.modules["softhca.accel"]).pop("_native", None)
    try:
        return importlib.reload(backend).name()
    except (ImportError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
print(choose("python")); print(choose("native")); print(choose("auto"))
print(choose("fast")); print(choose("auto", True)); print(choose("native", True))
"""
    got = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                         cwd=tmp_path, check=True).stdout.splitlines()
    assert got[:3] == ["python", "native", "native"]
    assert got[3].startswith("ValueError: SOFTHCA_ENGINE='fast'")
    assert got[4] == "python"
    assert got[5].startswith("ImportError: SOFTHCA_ENGINE=native but softhca.accel._native")


def test_a_result_held_is_never_rewritten() -> None:
    """The native module writes a result into the last result's bytes only when nobody
    holds those any more (accel/native.c, result_bytes): a held result keeps its bytes and
    its hash, a dropped one is reused with its cached hash forgotten."""
    module = backend._import_native()[0]
    plan = module.SigPlan(512, None, (0, 1, 8, 0, 0, 0, 0), 0, 0)
    zeros = bytes(512 * 16)
    ones = b"\x01" * (512 * 16)
    held, _ = plan.run_bytes(zeros, 16, 0, 0)
    want, digest = bytes(held), hash(held)
    other, _ = plan.run_bytes(ones, 16, 0, 0)
    assert held == want and hash(held) == digest and other != held
    first_id = id(other)
    del other
    again, _ = plan.run_bytes(zeros, 16, 0, 0)
    assert id(again) == first_id and again == want and hash(again) == hash(want)
    key = module.XtsKey(bytes(range(64)))
    a = module.xts(key, zeros, None, 512, 0, 0, True)
    b = module.xts(key, ones, None, 512, 0, 0, True)
    assert a == python_xts(bytes(range(64)), zeros, 512, 0, 0, True) and a != b
