"""The per-configuration plan of an MKEY (engine/keyplan.py) and the scratch transfers run
in: a reconfigured MKEY never runs on a stale plan, results never alias the scratch the
next transfer overwrites, a transfer inside a transfer, the scratch size limit, and the
crcmod fallback of the per-block guards. Expected bytes come from softhca.tools.oracle
(crcmod and one cryptography XTS context per data unit), never from the engine."""

from __future__ import annotations

import numpy as np
import pytest

from softhca.engine import guards, keyplan, transfer
from softhca.protocol.attrs import SGE, CryptoAttr, SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from softhca.protocol.enums import (
    BLOCK_SIZE_BYTES,
    BlockSize,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difFlags,
    SigType,
)
from softhca.tools import oracle

# Every test on the Python engine and on the native accelerator (tests/support/engine_backends.py).
pytestmark = pytest.mark.usefixtures("engine_backend")

KEY_A = bytes(range(64))
KEY_B = bytes(range(100, 164))
T10_512 = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_512,
                         dif=SigT10dif(bg=0, app_tag=0xBEEF, ref_tag=0x10,
                                       flags=SigT10difFlags.REF_REMAP))
CRC32C_4K = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_4096,
                           crc=SigCrc(SigCrcType.CRC32C, 0))


def crypto(node, key: bytes, unit: BlockSize, tweak: int,
           order=SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX) -> CryptoAttr:
    return CryptoAttr(encrypt_on_tx=True, signature_crypto_order=order, data_unit_size=unit,
                      dek=node.create_dek(key), initial_tweak=tweak.to_bytes(16, "little"))


def wire_of(data: bytes, domain: SigBlockDomain, key: bytes, unit: BlockSize,
            tweak: int) -> bytes:
    """Signature before crypto on TX: PI generated per block, then XTS over the wire."""
    return oracle.xts(key, oracle.protect(data, domain), BLOCK_SIZE_BYTES[unit], tweak,
                      encrypt=True)


def test_reconfigured_mkey_does_not_run_on_a_stale_plan(node, rng):
    """Configure, transfer, reconfigure with another block geometry, guard, key, data unit
    and tweak, transfer: the second transfer is the new configuration's, byte for byte."""
    data = rng.randbytes(8 * 4096)
    mr, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=T10_512, check_mask=0xFF),
                              crypto=crypto(node, KEY_A, BlockSize.SIZE_520, 7))
    first_wire = transfer.wire_length(node.pd, mkey.lkey)
    got = transfer.tx(node.pd, mkey.lkey, 0, first_wire)
    assert got == wire_of(data, T10_512, KEY_A, BlockSize.SIZE_520, 7)
    first_plan = mkey.keyplan
    assert first_plan is not None

    node.configure(mkey, sges=[SGE(mr.addr, mr.length, mr.lkey)],
                   sig=SigBlockAttr(wire=CRC32C_4K, check_mask=0xFF),
                   crypto=crypto(node, KEY_B, BlockSize.SIZE_4096, (1 << 64) - 3))
    assert mkey.keyplan is None  # dropped by the configure
    wire_len = transfer.wire_length(node.pd, mkey.lkey)
    assert wire_len == 8 * (4096 + 4)
    got = transfer.tx(node.pd, mkey.lkey, 0, wire_len)
    assert got == wire_of(data, CRC32C_4K, KEY_B, BlockSize.SIZE_4096, (1 << 64) - 3)
    assert mkey.keyplan is not first_plan

    # And back through RX: the new plan checks CRC32C and decrypts with key B.
    mr.write(bytes(len(data)))
    transfer.rx(node.pd, mkey.lkey, 0, got)
    assert mr.read() == data
    assert mkey.mkey_check().err_type == 0


def test_plan_follows_attributes_set_without_a_configure(node, rng):
    """The plan checks itself against the MKEY's layout, sig and crypto objects, so even
    a path that replaces them without mkey_configure gets a fresh plan."""
    data = rng.randbytes(2 * 4096)
    _, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=T10_512, check_mask=0))
    transfer.tx(node.pd, mkey.lkey, 0, 16 * 520)
    _, other = node.mkey_over(data, sig=SigBlockAttr(wire=CRC32C_4K, check_mask=0))
    mkey.sig = other.sig  # keyplan not dropped by hand
    got = transfer.tx(node.pd, mkey.lkey, 0, 2 * 4100)
    assert got == oracle.protect(data, CRC32C_4K)


def test_results_do_not_alias_scratch(node, rng):
    """Two transfers in a row through the same scratch: the first result is unchanged."""
    data = rng.randbytes(16 * 512)
    _, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=T10_512, check_mask=0),
                             crypto=crypto(node, KEY_A, BlockSize.SIZE_520, 1))
    first = transfer.tx(node.pd, mkey.lkey, 0, 8 * 520)
    snapshot = bytes(first)
    second = transfer.tx(node.pd, mkey.lkey, 8 * 520, 8 * 520)
    assert first == snapshot
    assert isinstance(first, bytes) and isinstance(second, bytes)
    whole = wire_of(data, T10_512, KEY_A, BlockSize.SIZE_520, 1)
    assert first + second == whole


def test_transfer_inside_a_transfer(node, rng):
    """A trace callback that transfers while the pool is in use gets fresh arrays, and
    neither transfer's bytes are disturbed."""
    data = rng.randbytes(8 * 512)
    _, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=T10_512, check_mask=0),
                             crypto=crypto(node, KEY_A, BlockSize.SIZE_520, 3))
    whole = wire_of(data, T10_512, KEY_A, BlockSize.SIZE_520, 3)
    inner = []

    def trace(ev):
        if ev.stage == "generate" and not inner:
            inner.append(transfer.tx(node.pd, mkey.lkey, 4 * 520, 4 * 520))

    outer = transfer.tx(node.pd, mkey.lkey, 0, 8 * 520, trace=trace)
    assert outer == whole
    assert inner == [whole[4 * 520:]]
    assert not keyplan.POOL.in_use


def test_scratch_limit(node, rng, monkeypatch):
    """A stage larger than SCRATCH_MAX runs on fresh arrays and never grows the pool."""
    monkeypatch.setattr(keyplan, "SCRATCH_MAX", 4096)
    keyplan.POOL.release()
    data = rng.randbytes(32 * 512)
    _, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=T10_512, check_mask=0),
                             crypto=crypto(node, KEY_A, BlockSize.SIZE_512, 9))
    got = transfer.tx(node.pd, mkey.lkey, 0, 32 * 520)
    assert got == wire_of(data, T10_512, KEY_A, BlockSize.SIZE_512, 9)
    assert all(len(s.buf) <= 4096 for s in keyplan.POOL._slots.values())
    small = transfer.tx(node.pd, mkey.lkey, 0, 4 * 520)  # fits: through the pool
    assert small == got[:4 * 520]
    assert all(len(s.buf) <= 4096 for s in keyplan.POOL._slots.values())
    keyplan.POOL.release()


def test_scratch_grows_and_keeps_results_right(node, rng, engine_backend):
    """Transfers of growing size through one MKEY: each slot grows, views are rebuilt."""
    keyplan.POOL.release()
    data = rng.randbytes(300 * 512)
    _, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=T10_512, check_mask=0))
    whole = oracle.protect(data, T10_512)
    for blocks in (1, 7, 130, 300, 2):
        assert transfer.tx(node.pd, mkey.lkey, 0, blocks * 520) == whole[:blocks * 520]
    if engine_backend == "native":
        # The last stage of a TX writes straight into the bytes handed out: no sig slot.
        assert "sig" not in keyplan.POOL._slots
        return
    # Block views are made for the blocks transfers used, not for the whole slot.
    sig_slot = keyplan.POOL._slots["sig"]
    assert len(sig_slot.buf) >= 300 * 520
    assert [len(v) for v in sig_slot._views.values()] == [300]


@pytest.mark.parametrize("kind,seed", [("t10dif_crc", 0), ("t10dif_crc", 0xFFFF),
                                       ("crc32", 0), ("crc32c", 0xFFFFFFFF),
                                       ("crc64_xp10", 0), ("t10dif_csum", 0xFFFF)])
def test_block_guard_backends_agree_with_oracle(kind, seed, rng):
    """BlockGuard over views and over rows, with the fast library and with crcmod (the
    fallback when the [fast] extra is missing), against the oracle."""
    length = 520
    n = 9
    buf = np.frombuffer(rng.randbytes(n * (length + 8)), dtype=np.uint8)
    rows = buf.reshape(n, length + 8)[:, :length]
    mv = memoryview(buf)
    views = [mv[i * (length + 8):i * (length + 8) + length] for i in range(n + 3)]
    oracle_fn = {"t10dif_crc": oracle.t10dif_crc, "crc32": oracle.crc32_fcph,
                 "crc32c": oracle.crc32c, "crc64_xp10": oracle.crc64_xp10,
                 "t10dif_csum": oracle.ip_csum}[kind]
    want = [oracle_fn(bytes(r), seed) for r in rows]
    impls = [guards._select(kind, prefer_fast=True), guards._select(kind, prefer_fast=False)]
    if kind != "t10dif_csum":
        assert impls[1].name == "crcmod"
    for impl in impls:
        g = guards.BlockGuard(kind, seed, length, impl)
        assert g(rows).tolist() == want
        assert g(rows, views).tolist() == want


def test_transfers_with_the_crcmod_backend(node, rng, monkeypatch):
    """The whole pipeline with crcmod serving every guard (no fastcrc / anycrc)."""
    for kind in guards.GUARD_KINDS:
        monkeypatch.setitem(guards._ACTIVE, kind, guards._select(kind, prefer_fast=False))
    data = rng.randbytes(4 * 4096)
    mr, mkey = node.mkey_over(data, sig=SigBlockAttr(wire=CRC32C_4K, check_mask=0xFF))
    wire = transfer.tx(node.pd, mkey.lkey, 0, 4 * 4100)
    assert mkey.keyplan.sig_tx._out.guard.backend == "crcmod"
    assert wire == oracle.protect(data, CRC32C_4K)
    mr.write(bytes(len(data)))
    transfer.rx(node.pd, mkey.lkey, 0, wire)
    assert mr.read() == data
    assert mkey.mkey_check().err_type == 0


def test_one_piece_layout_gathers_a_view_and_pieces_copy(node, rng):
    """Layout.gather: inside one piece (a whole period included) it is a view of the MR;
    across pieces the bytes are copied, both the MR's bytes."""
    data = rng.randbytes(2048)
    mr, mkey = node.mkey_over(data)
    view = mkey.layout.gather(0, 2048)
    assert np.shares_memory(view, mr.buf)
    assert view.tobytes() == data
    mr2 = node.reg_mr(rng.randbytes(1024))
    mk2 = node.create_mkey()
    node.configure(mk2, sges=[SGE(mr.addr, 1024, mr.lkey), SGE(mr2.addr, 1024, mr2.lkey)])
    both = mk2.layout.gather(512, 1024)
    assert not np.shares_memory(both, mr.buf)
    assert both.tobytes() == data[512:1024] + mr2.read()[:512]
