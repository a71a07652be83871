"""``softhca bench engine``: the engine's transforms through the transfer pipeline, each
beside one call of the C primitive it is built on.

The engine computes one guard per block and runs XTS per data unit, as the device
does (mlx5dv_wr_set_mkey_sig_block(3): a PI "every 512B block";
mlx5dv_wr_set_mkey_crypto(3): "The tweak is incremented after each
data_unit_size"). One call of the primitive over the whole buffer does the same
bytes with none of that per-block work, so it is a ceiling, not a target: the
ratio says how much of the primitive's speed the pipeline keeps.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from ...engine import backend, guards, transfer
from ...engine.hca import HCA
from ...engine.mkey_configure import MkeyConfigureBuilder
from ...protocol.attrs import SGE, CryptoAttr, DEKInitAttr, SigBlockAttr, SigBlockDomain, SigCrc
from ...protocol.enums import (
    BlockSize,
    CryptoKeySize,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    SigCrcType,
    SignatureCryptoOrder,
    SigType,
)
from .common import ALL, MIB, T10DIF_512, TWEAK, best_seconds, mb_s, sig4, xts_key

# IEEE 1619 caps a data unit at 2^20 AES blocks and OpenSSL refuses more in one
# XTS context, so the "one context" ceiling runs on 16 MiB pieces.
XTS_MAX_UNIT = 1 << 24
CRC32C_4K = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_4096,
                           crc=SigCrc(SigCrcType.CRC32C, 0xFFFFFFFF))
CRC64_4K = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_4096,
                          crc=SigCrc(SigCrcType.CRC64_XP10, 0xFFFFFFFFFFFFFFFF))


@dataclass(frozen=True)
class Result:
    name: str
    engine_mb_s: float
    primitive: str
    primitive_mb_s: float
    ratio: float
    # With the native engine: the same transform on the Python engine in the same run,
    # and native / python. None when the Python engine is the one measured.
    python_mb_s: float | None = None
    native_over_python: float | None = None


@dataclass(frozen=True)
class Report:
    mib: float
    repeat: int
    data_bytes: int
    machine: dict
    results: list[Result]


class EngineNode:
    """One engine HCA and PD, with MKEYs configured over memory directly: the transforms
    without a daemon or a wire."""

    def __init__(self) -> None:
        self.hca = HCA("mlx5_0")
        self.pd = self.hca.alloc_pd()
        self.qp = MkeyConfigureBuilder(self.pd, Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE)

    def mkey_over(self, memory: bytes, *, sig: SigBlockAttr | None = None,
                  crypto_key: bytes | None = None, order: int = 0,
                  unit: int = BlockSize.SIZE_512):
        mr = self.hca.reg_mr(self.pd, len(memory), ALL)
        mr.write(memory)
        flags = MkeyInitAttrFlags.INDIRECT
        crypto = None
        if sig is not None:
            flags |= MkeyInitAttrFlags.BLOCK_SIGNATURE
        if crypto_key is not None:
            flags |= MkeyInitAttrFlags.CRYPTO
            dek = self.hca.create_dek(DEKInitAttr(pd=self.pd, key_size=CryptoKeySize.SIZE_256,
                                                  key=crypto_key))
            crypto = CryptoAttr(encrypt_on_tx=True, signature_crypto_order=order,
                                data_unit_size=unit, initial_tweak=TWEAK, dek=dek)
        mkey = self.hca.create_mkey(self.pd, flags, 1)
        self.qp.post_configure(mkey, access=ALL, sges=[SGE(mr.addr, mr.length, mr.lkey)],
                               sig=sig, crypto=crypto)
        return mr, mkey


def _guard_primitive(kind: str) -> tuple[str, Callable[[bytes], object]]:
    # The implementation the engine itself uses for this guard, called once.
    impl = guards._active(kind)
    return f"{impl.name} {kind}, 1 call", impl.fn


def _xts_one_context(key: bytes, data: bytes) -> bytes:
    out = []
    for start in range(0, len(data), XTS_MAX_UNIT):
        ctx = Cipher(algorithms.AES(key), modes.XTS(TWEAK)).encryptor()
        out.append(ctx.update(data[start:start + XTS_MAX_UNIT]) + ctx.finalize())
    return b"".join(out)



def machine_info() -> dict:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "guard_backends": {kind: guards.backend(kind) for kind in guards.GUARD_KINDS},
        **engine_backend_info(),
    }


def engine_backend_info() -> dict:
    """Which engine ran (SOFTHCA_ENGINE, engine/backend.py) and, when native, its XTS."""
    info = {"engine_backend": backend.name()}
    if backend.native is not None:
        info["native_xts"] = backend.native.xts_impl
    else:
        info["python_because"] = backend.why_python or "the native module is not built"
    return info


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, float | None]:
    """Best seconds of ``fn`` on the engine in use and, when that is the native one, on the
    Python engine too (a configuration's plan and DEK cipher are made per backend)."""
    if backend.native is None:
        return best_seconds(fn, repeat), None
    native_s = best_seconds(fn, repeat)
    with backend.using("python"):
        python_s = best_seconds(fn, repeat)
    return native_s, python_s


def run_engine(mib: float = 4.0, repeat: int = 5) -> Report:
    # Whole 4096-byte blocks, so every row (512- and 4096-byte blocks and units,
    # 520-byte units of row C) covers the same bytes without a tail.
    nbytes = max(4096, int(mib * MIB) // 4096 * 4096)
    rng = np.random.default_rng(1619)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    key = xts_key(rng)
    results: list[Result] = []

    def add(name: str, engine: tuple[float, float | None], primitive: str,
            primitive_s: float) -> None:
        e, p = mb_s(nbytes, engine[0]), mb_s(nbytes, primitive_s)
        py = mb_s(nbytes, engine[1]) if engine[1] is not None else None
        # Four significant digits: the ratios run down to about 0.005.
        results.append(Result(name, round(e, 1), primitive, round(p, 1), sig4(e / p),
                              round(py, 1) if py is not None else None,
                              sig4(e / py) if py is not None else None))

    # Signature generation only: memory has no PI, the wire gets one per block
    # (mlx5dv_wr_set_mkey_sig_block(3) example 2, at other block sizes and types).
    for name, domain, kind in (("T10-DIF generate, 512B blocks", T10DIF_512, "t10dif_crc"),
                               ("CRC32C generate, 4096B blocks", CRC32C_4K, "crc32c"),
                               ("CRC64_XP10 generate, 4096B blocks", CRC64_4K, "crc64_xp10")):
        node = EngineNode()
        _, mkey = node.mkey_over(data, sig=SigBlockAttr(mem=None, wire=domain, check_mask=0))
        wire_len = transfer.wire_length(node.pd, mkey.lkey)
        engine_s = _timed(lambda n=node, k=mkey, w=wire_len: transfer.tx(n.pd, k.lkey, 0, w),
                          repeat)
        label, fn = _guard_primitive(kind)
        primitive_s = best_seconds(lambda f=fn: f(data), repeat)
        add(name, engine_s, label, primitive_s)

    # Crypto only: one stream, the order is irrelevant (table rows A and F).
    xts_s = best_seconds(lambda: _xts_one_context(key, data), repeat)
    for unit, size in ((512, BlockSize.SIZE_512), (4096, BlockSize.SIZE_4096)):
        node = EngineNode()
        _, mkey = node.mkey_over(data, crypto_key=key, unit=size)
        engine_s = _timed(lambda n=node, k=mkey: transfer.tx(n.pd, k.lkey, 0, nbytes), repeat)
        add(f"AES-XTS-256 encrypt, {unit}B units", engine_s, "cryptography XTS, 1 context",
            xts_s)

    # Row C: T10DIF generated every 512 bytes, then data and PI encrypted in
    # 520-byte units (mlx5dv_wr_set_mkey_crypto(3) example 2). Its ceiling is one
    # guard call over the data plus one XTS context over the wire bytes.
    node = EngineNode()
    sig = SigBlockAttr(mem=None, wire=T10DIF_512, check_mask=0xFF)
    mr, mkey = node.mkey_over(data, sig=sig, crypto_key=key,
                              order=SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX,
                              unit=BlockSize.SIZE_520)
    wire_len = transfer.wire_length(node.pd, mkey.lkey)
    wire = transfer.tx(node.pd, mkey.lkey, 0, wire_len)
    label, fn = _guard_primitive("t10dif_crc")
    row_c_primitive = (best_seconds(lambda: fn(data), repeat)
                       + best_seconds(lambda: _xts_one_context(key, wire), repeat))
    row_c_label = f"{label.split(',')[0]} + cryptography XTS, 1 call each"
    tx_s = _timed(lambda: transfer.tx(node.pd, mkey.lkey, 0, wire_len), repeat)
    add("row C TX: T10-DIF gen + XTS 520B", tx_s, row_c_label, row_c_primitive)
    rx_s = _timed(lambda: transfer.rx(node.pd, mkey.lkey, 0, wire), repeat)
    add("row C RX: XTS 520B + T10-DIF check", rx_s, row_c_label, row_c_primitive)
    # The RX runs checked every T10DIF; a latched error would mean the bench moved
    # wrong bytes, which makes its numbers meaningless, so say so.
    err = mkey.mkey_check()
    if err.err_type:
        print(f"softhca bench: row C RX latched signature error {err}", file=sys.stderr)
    return Report(mib, repeat, nbytes, machine_info(), results)


