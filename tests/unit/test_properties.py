"""Property tests: random signature and crypto configurations and random data.

- TX and RX are inverses on the images they produce: RX of a TX wire image gives a
  memory image whose TX is that wire image again, and TX of a memory image RX wrote
  gives back the wire image RX was given.
- Flipping any byte that the check covers, in wire block k, is reported at block k.
"""

from __future__ import annotations

import os

import pytest
from conftest import EngineNode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from softhca.engine import transfer
from softhca.protocol.attrs import CryptoAttr, SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from softhca.protocol.enums import (
    BLOCK_SIZE_BYTES,
    BlockSize,
    MkeyErrType,
    SigBlockAttrFlags,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difFlags,
    SigType,
)

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

SETTINGS = settings(max_examples=int(os.environ.get("SOFTHCA_PROPERTY_EXAMPLES", "60")),
                    deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

SMALL_BLOCKS = [BlockSize.SIZE_512, BlockSize.SIZE_520]


@st.composite
def domains(draw, block_size, escapes=True):
    if draw(st.booleans()):
        flags = draw(st.sampled_from([0, SigT10difFlags.REF_REMAP] + (
            [SigT10difFlags.APP_ESCAPE, SigT10difFlags.APP_REF_ESCAPE] if escapes else [])))
        return SigBlockDomain(sig_type=SigType.T10DIF, block_size=block_size, dif=SigT10dif(
            bg_type=draw(st.sampled_from([0, 1])), bg=draw(st.sampled_from([0, 0xFFFF])),
            app_tag=draw(st.sampled_from([0, 0x1234, 0xFFFF])),
            ref_tag=draw(st.integers(0, 0xFFFFFFFF)), flags=flags))
    crc_type = draw(st.sampled_from(list(SigCrcType)))
    ones = 0xFFFFFFFFFFFFFFFF if crc_type == SigCrcType.CRC64_XP10 else 0xFFFFFFFF
    return SigBlockDomain(sig_type=SigType.CRC, block_size=block_size,
                          crc=SigCrc(crc_type, draw(st.sampled_from([0, ones]))))


@st.composite
def configs(draw):
    bs = draw(st.sampled_from(SMALL_BLOCKS))
    mem = draw(st.none() | domains(bs))
    wire = draw(st.none() | domains(bs)) if mem is not None else draw(domains(bs))
    flags, copy_mask = 0, 0
    if mem is not None and wire is not None and mem.sig_type == wire.sig_type and (
            mem.sig_type == SigType.T10DIF or mem.crc.crc_type == wire.crc.crc_type) \
            and draw(st.booleans()):
        flags, copy_mask = SigBlockAttrFlags.COPY_MASK, draw(st.integers(0, 255))
    sig = SigBlockAttr(mem=mem, wire=wire, flags=flags, copy_mask=copy_mask,
                       check_mask=draw(st.integers(0, 255)))
    crypto = None
    if draw(st.booleans()):
        order = draw(st.sampled_from(list(SignatureCryptoOrder)))
        # The data unit must tile the stream crypto runs on: its block width.
        crypto_on = wire if order == SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX else mem
        width = BLOCK_SIZE_BYTES[bs] + (pi_size(crypto_on) if crypto_on else 0)
        units = {v: k for k, v in BLOCK_SIZE_BYTES.items()}
        if width in units:
            crypto = dict(order=order, dus=units[width], eot=draw(st.booleans()),
                          tweak=draw(st.binary(min_size=16, max_size=16)))
    return sig, crypto, draw(st.integers(1, 5)), draw(st.integers(0, 3))


def pi_size(d: SigBlockDomain) -> int:
    if d.sig_type == SigType.T10DIF:
        return 8
    return 8 if d.crc.crc_type == SigCrcType.CRC64_XP10 else 4


def setup(sig, crypto, n_blocks, start_block):
    node = EngineNode()
    bs = BLOCK_SIZE_BYTES[(sig.mem or sig.wire).block_size]
    mem_w = bs + (pi_size(sig.mem) if sig.mem else 0)
    wire_w = bs + (pi_size(sig.wire) if sig.wire else 0)
    total = (start_block + n_blocks) * mem_w
    attr = None
    if crypto:
        dek = node.create_dek(os.urandom(64))
        attr = CryptoAttr(encrypt_on_tx=crypto["eot"], signature_crypto_order=crypto["order"],
                          data_unit_size=crypto["dus"], initial_tweak=crypto["tweak"], dek=dek)
    mr, mkey = node.mkey_over(os.urandom(total), sig=sig, crypto=attr)
    return node, mr, mkey, wire_w, mem_w


@SETTINGS
@given(configs())
def test_rx_of_tx_gives_back_the_memory_image(cfg):
    sig, crypto, n, start = cfg
    node, mr, mkey, wire_w, mem_w = setup(sig, crypto, n, start)
    offset, length = start * wire_w, n * wire_w
    w1 = transfer.tx(node.pd, mkey.lkey, offset, length)
    assert len(w1) == length
    transfer.rx(node.pd, mkey.lkey, offset, w1)
    mem1 = mr.read()
    w2 = transfer.tx(node.pd, mkey.lkey, offset, length)
    assert w2 == w1
    transfer.rx(node.pd, mkey.lkey, offset, w2)
    assert mr.read() == mem1


@st.composite
def checked_wire_configs(draw):
    bs = draw(st.sampled_from(SMALL_BLOCKS))
    wire = draw(domains(bs, escapes=False))
    size = pi_size(wire)
    relevant = [7 - i for i in range(size)]
    bits = draw(st.lists(st.sampled_from(relevant), min_size=1, unique=True))
    check_mask = sum(1 << b for b in bits)
    n = draw(st.integers(1, 4))
    k = draw(st.integers(0, n - 1))
    checked = [7 - b for b in bits]           # PI byte indexes the check covers
    guard_bytes = range(size) if wire.sig_type == SigType.CRC else (0, 1)
    targets = [("pi", c) for c in checked]
    if all(g in checked for g in guard_bytes):
        targets += [("data", draw(st.integers(0, BLOCK_SIZE_BYTES[bs] - 1)))]
    target = draw(st.sampled_from(targets))
    return SigBlockAttr(mem=None, wire=wire, check_mask=check_mask), n, k, target, \
        draw(st.integers(1, 255))


@SETTINGS
@given(checked_wire_configs())
def test_a_flipped_checked_byte_is_reported_at_its_block(cfg):
    sig, n, k, (where, index), flip = cfg
    node, mr, mkey, wire_w, _ = setup(sig, None, n, 0)
    wire = bytearray(transfer.tx(node.pd, mkey.lkey, 0, n * wire_w))
    bs = BLOCK_SIZE_BYTES[sig.wire.block_size]
    wire[k * wire_w + (bs + index if where == "pi" else index)] ^= flip
    transfer.rx(node.pd, mkey.lkey, 0, bytes(wire))
    err = mkey.mkey_check()
    assert err.err_type != MkeyErrType.NO_ERR
    assert err.offset == k * wire_w
