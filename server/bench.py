"""``softhca bench engine``: the engine's transforms, measured through the transfer
pipeline, beside one call of the C primitive each is built on.

The engine computes one guard per block and runs XTS per data unit, as the device
does (mlx5dv_wr_set_mkey_sig_block(3): a PI "every 512B block";
mlx5dv_wr_set_mkey_crypto(3): "The tweak is incremented after each
data_unit_size"). One call of the primitive over the whole buffer does the same
bytes with none of that per-block work, so it is a ceiling, not a target: the
ratio says how much of the primitive's speed the pipeline keeps. Numbers only;
nothing here judges them.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from softhca.engine import guards, transfer
from softhca.engine.hca import HCA
from softhca.engine.mkey_configure import MkeyConfigureBuilder
from softhca.protocol.attrs import (
    SGE,
    CryptoAttr,
    DEKInitAttr,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from softhca.protocol.enums import (
    AccessFlags,
    BlockSize,
    CryptoKeySize,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difFlags,
    SigType,
)

MIB = 1 << 20
# IEEE 1619 caps a data unit at 2^20 AES blocks and OpenSSL refuses more in one
# XTS context, so the "one context" ceiling runs on 16 MiB pieces.
XTS_MAX_UNIT = 1 << 24
# The standard seeds of each CRC (bg 0 for CRC-16/T10-DIF, all ones for the 32/64-bit
# CRCs) are what the C libraries compute, so engine and primitive do the same work
# and no seed fix-up is timed on one side only.
T10DIF_512 = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_512,
                            dif=SigT10dif(bg=0, app_tag=0xBEEF, ref_tag=0x2000,
                                          flags=SigT10difFlags.REF_REMAP))
CRC32C_4K = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_4096,
                           crc=SigCrc(SigCrcType.CRC32C, 0xFFFFFFFF))
CRC64_4K = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_4096,
                          crc=SigCrc(SigCrcType.CRC64_XP10, 0xFFFFFFFFFFFFFFFF))
ALL = AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE
TWEAK = (0x1122334455667788_99AABBCCDDEEFF00).to_bytes(16, "little")


@dataclass(frozen=True)
class Result:
    name: str
    engine_mb_s: float
    primitive: str
    primitive_mb_s: float
    ratio: float


@dataclass(frozen=True)
class Report:
    mib: float
    repeat: int
    data_bytes: int
    machine: dict
    results: list[Result]


def best_seconds(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` timed calls, after one untimed call that pays for
    first-use costs (seed fix-up tables, OpenSSL contexts, page faults)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def mb_s(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / max(seconds, 1e-12)


class _Node:
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


def _key(rng: np.random.Generator) -> bytes:
    # mlx5dv_dek_create (and OpenSSL) refuse equal XTS key halves.
    while True:
        key = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        if key[:32] != key[32:]:
            return key


def machine_info() -> dict:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "guard_backends": {kind: guards.backend(kind) for kind in guards.GUARD_KINDS},
    }


def run_engine(mib: float = 4.0, repeat: int = 5) -> Report:
    # Whole 4096-byte blocks, so every row (512- and 4096-byte blocks and units,
    # 520-byte units of row C) covers the same bytes without a tail.
    nbytes = max(4096, int(mib * MIB) // 4096 * 4096)
    rng = np.random.default_rng(1619)
    data = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    key = _key(rng)
    results: list[Result] = []

    def add(name: str, engine_s: float, primitive: str, primitive_s: float) -> None:
        e, p = mb_s(nbytes, engine_s), mb_s(nbytes, primitive_s)
        results.append(Result(name, round(e, 1), primitive, round(p, 1), round(e / p, 3)))

    # Signature generation only: memory has no PI, the wire gets one per block
    # (mlx5dv_wr_set_mkey_sig_block(3) example 2, at other block sizes and types).
    for name, domain, kind in (("T10-DIF generate, 512B blocks", T10DIF_512, "t10dif_crc"),
                               ("CRC32C generate, 4096B blocks", CRC32C_4K, "crc32c"),
                               ("CRC64_XP10 generate, 4096B blocks", CRC64_4K, "crc64_xp10")):
        node = _Node()
        _, mkey = node.mkey_over(data, sig=SigBlockAttr(mem=None, wire=domain, check_mask=0))
        wire_len = transfer.wire_length(node.pd, mkey.lkey)
        engine_s = best_seconds(lambda n=node, k=mkey, w=wire_len: transfer.tx(n.pd, k.lkey, 0, w),
                                repeat)
        label, fn = _guard_primitive(kind)
        primitive_s = best_seconds(lambda f=fn: f(data), repeat)
        add(name, engine_s, label, primitive_s)

    # Crypto only: one stream, the order is irrelevant (table rows A and F).
    xts_s = best_seconds(lambda: _xts_one_context(key, data), repeat)
    for unit, size in ((512, BlockSize.SIZE_512), (4096, BlockSize.SIZE_4096)):
        node = _Node()
        _, mkey = node.mkey_over(data, crypto_key=key, unit=size)
        engine_s = best_seconds(lambda n=node, k=mkey: transfer.tx(n.pd, k.lkey, 0, nbytes),
                                repeat)
        add(f"AES-XTS-256 encrypt, {unit}B units", engine_s, "cryptography XTS, 1 context",
            xts_s)

    # Row C: T10DIF generated every 512 bytes, then data and PI encrypted in
    # 520-byte units (mlx5dv_wr_set_mkey_crypto(3) example 2). Its ceiling is one
    # guard call over the data plus one XTS context over the wire bytes.
    node = _Node()
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
    tx_s = best_seconds(lambda: transfer.tx(node.pd, mkey.lkey, 0, wire_len), repeat)
    add("row C TX: T10-DIF gen + XTS 520B", tx_s, row_c_label, row_c_primitive)
    rx_s = best_seconds(lambda: transfer.rx(node.pd, mkey.lkey, 0, wire), repeat)
    add("row C RX: XTS 520B + T10-DIF check", rx_s, row_c_label, row_c_primitive)
    # The RX runs checked every T10DIF; a latched error would mean the bench moved
    # wrong bytes, which makes its numbers meaningless, so say so.
    err = mkey.mkey_check()
    if err.err_type:
        print(f"softhca bench: row C RX latched signature error {err}", file=sys.stderr)
    return Report(mib, repeat, nbytes, machine_info(), results)


def to_json(report: Report) -> str:
    doc = {
        "benchmark": "engine",
        "mib": report.mib,
        "data_bytes": report.data_bytes,
        "repeat": report.repeat,
        "statistic": "best",
        "unit": "MB/s (1e6 bytes of memory-domain data per second)",
        "machine": report.machine,
        "results": [asdict(r) for r in report.results],
    }
    return json.dumps(doc, indent=2)


def to_table(report: Report) -> str:
    m = report.machine
    head = ["name", "engine MB/s", "primitive", "MB/s", "engine/primitive"]
    rows = [[r.name, f"{r.engine_mb_s:.1f}", r.primitive, f"{r.primitive_mb_s:.1f}",
             f"{r.ratio:.3f}"] for r in report.results]
    widths = [max(len(row[i]) for row in [head, *rows]) for i in range(len(head))]
    right = {1, 3, 4}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    backends = ", ".join(f"{k} {v}" for k, v in m["guard_backends"].items())
    ratios = [r.ratio for r in report.results]
    out = [
        f"softhca bench engine: {report.data_bytes / MIB:g} MiB of data per run, best of "
        f"{report.repeat} after one warm-up",
        f"python {m['python']} ({m['implementation']}), {m['cpu_count']} CPUs, {m['platform']}",
        f"guard backends: {backends}",
        "",
        line(head),
        line(["-" * w for w in widths]),
        *(line(r) for r in rows),
        "",
        f"MB/s = 1e6 bytes of memory-domain data per second; primitive = one call over the "
        f"whole buffer (a ceiling). median engine/primitive {statistics.median(ratios):.3f}",
    ]
    return "\n".join(out)
