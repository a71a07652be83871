"""``softhca bench``: speeds, each beside a ceiling measured in the same run.

``softhca bench`` (the second half of this module) runs two ``softhca serve``
processes and measures what an application sees through softhca.client: goodput,
latency, many QPs at once. ``softhca bench engine`` (the first half) measures the
engine's transforms through the transfer pipeline, beside one call of the C
primitive each is built on.

The engine computes one guard per block and runs XTS per data unit, as the device
does (mlx5dv_wr_set_mkey_sig_block(3): a PI "every 512B block";
mlx5dv_wr_set_mkey_crypto(3): "The tweak is incremented after each
data_unit_size"). One call of the primitive over the whole buffer does the same
bytes with none of that per-block work, so it is a ceiling, not a target: the
ratio says how much of the primitive's speed the pipeline keeps. Numbers only;
nothing here judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .. import client as sh
from ..engine import guards, transfer
from ..engine.hca import HCA
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..protocol.attrs import (
    SGE,
    CryptoAttr,
    DEKInitAttr,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from ..protocol.enums import (
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
from .harness import Side

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
        # Four significant digits: the ratios run down to about 0.005.
        results.append(Result(name, round(e, 1), primitive, round(p, 1), _sig4(e / p)))

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
             f"{r.ratio:.3g}"] for r in report.results]
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
        f"whole buffer (a ceiling). median engine/primitive {statistics.median(ratios):.3g}",
    ]
    return "\n".join(out)


# == softhca bench: two daemons in separate processes, end to end ==========================
#
# What an application sees through softhca.client: goodput of RDMA_WRITE, RDMA_READ and
# SEND between two `softhca serve` processes on loopback, small-message latency, and many
# QPs at once. Every goodput figure stands beside two ceilings measured in the same run:
# a plain asyncio TCP stream between two processes moving the same wire bytes in the same
# message sizes, and the engine's transform alone (softhca.engine, no daemon, no wire)
# for the target side of the same configuration. Numbers only; nothing here judges them.

KIB = 1 << 10
SIZES = (4 * KIB, 64 * KIB, MIB)
OPS = ("RDMA_WRITE", "RDMA_READ", "SEND")
CONFIGS = ("plain", "t10dif", "row_c")
CONFIG_TITLES = {
    "plain": "plain MRs",
    "t10dif": "target MKEY: wire T10-DIF on 512B blocks, memory none",
    "row_c": "target MKEY: crypto table row C (AES-XTS-256 on 520B units, T10-DIF 512B, "
             "signature before crypto on TX, encrypt_on_tx)",
}
# The target's transform an operation runs: a WRITE or SEND arriving goes wire to memory
# (RX), a READ answered goes memory to wire (TX).
TARGET_DIRECTION = {"RDMA_WRITE": "rx", "SEND": "rx", "RDMA_READ": "tx"}
# Rows beyond the grid of OPS x CONFIGS x SIZES at path MTU 4096: (op, config, size,
# path MTU). A 1 MiB RDMA_WRITE at MTU 1024 is 1,024 packets a message instead of 256:
# the row where per-packet costs (and so packet trains, issue 14) weigh most.
EXTRA_ROWS = (("RDMA_WRITE", "plain", MIB, 1024),)
DEFAULT_MTU = 4096
MTU_ENUM = {256: sh.IBV_MTU_256, 512: sh.IBV_MTU_512, 1024: sh.IBV_MTU_1024,
            2048: sh.IBV_MTU_2048, 4096: sh.IBV_MTU_4096}
LATENCY_BYTES = 64
MANY_QPS_BYTES = 4 * KIB
READY_TIMEOUT = 30.0
COMPLETION_TIMEOUT = 60.0
# The daemon's socket reads (server/link.py READ_CHUNK); the TCP ceiling reads alike.
TCP_READ_CHUNK = 1 << 18
_RUNS = itertools.count()


class BenchError(RuntimeError):
    """The bench could not measure (a daemon did not start, a WR failed): no numbers."""


@dataclass(frozen=True)
class E2EOptions:
    seconds: float = 1.0        # per goodput measurement, at most
    mib: float = 256.0          # per goodput measurement, at most (the first batch always goes)
    depth: int = 64             # WRs in flight per QP
    inflight_mib: float = 4.0   # ... but at most this many MiB in flight
    latency_samples: int = 2000
    sessions: int = 100         # control sessions of the many-QPs run (half per daemon)
    qp_pairs: int = 1000        # connected QP pairs of the many-QPs run
    writes_per_qp: int = 4
    quick: bool = False
    # Packet trains on the daemons' wire (`softhca serve --no-trains` when False).
    trains: bool = True


QUICK = E2EOptions(seconds=0.02, mib=1.0, depth=8, inflight_mib=2.0, latency_samples=50,
                   sessions=10, qp_pairs=40, writes_per_qp=2, quick=True)


def wire_size(config: str, size: int) -> int:
    """Wire bytes of ``size`` application bytes: 8 bytes of T10-DIF per 512 with an MKEY."""
    return size if config == "plain" else size // 512 * 520


def size_text(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB and size % MIB == 0 else f"{size // KIB} KiB"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def e2e_machine_info() -> dict:
    try:
        import uvloop
        uv = uvloop.__version__
    except ImportError:
        uv = None
    try:
        with open("/sys/class/net/lo/mtu") as f:
            lo_mtu = int(f.read())
    except (OSError, ValueError):
        lo_mtu = None
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "uvloop": uv,
        "loopback": {"address": "127.0.0.1", "interface": "lo", "mtu": lo_mtu},
        # The machines are shared: other processes' load shows in every figure.
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "guard_backends": {kind: guards.backend(kind) for kind in guards.GUARD_KINDS},
    }


def _run_loop(coro):
    """The coroutine on uvloop when it is installed (as `softhca serve` runs)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# -- ceiling (b): the engine's transform alone -------------------------------------------

def engine_ceilings(sizes=SIZES, budget: int = 4 * MIB, repeat: int = 3) -> list[dict]:
    """MB/s of application data through the target side's transform of each configuration
    (plain: an MR, a copy), in both directions, one call per message as the responder
    makes it, best of ``repeat`` runs of about ``budget`` bytes each."""
    rng = np.random.default_rng(512)
    top = max(sizes)
    memory = rng.integers(0, 256, top, dtype=np.uint8).tobytes()
    key = _key(rng)
    out = []
    for config in CONFIGS:
        node = _Node()
        mkey = None
        if config == "plain":
            mr = node.hca.reg_mr(node.pd, top, ALL)
            mr.write(memory)
            lkey, base = mr.lkey, mr.addr
        else:
            sig = SigBlockAttr(mem=None, wire=T10DIF_512, check_mask=0xFF)
            extra = {} if config == "t10dif" else {
                "crypto_key": key, "order": SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX,
                "unit": BlockSize.SIZE_520}
            _, mkey = node.mkey_over(memory, sig=sig, **extra)
            lkey, base = mkey.lkey, 0
        pd = node.pd
        wire = transfer.tx(pd, lkey, base, wire_size(config, top))
        for size in sizes:
            wl = wire_size(config, size)
            piece = wire[:wl]
            n = max(2, budget // size)

            def tx(n=n, wl=wl, pd=pd, lkey=lkey, base=base):
                for _ in range(n):
                    transfer.tx(pd, lkey, base, wl)

            def rx(n=n, piece=piece, pd=pd, lkey=lkey, base=base):
                for _ in range(n):
                    transfer.rx(pd, lkey, base, piece)

            for direction, fn in (("tx", tx), ("rx", rx)):
                seconds = best_seconds(fn, repeat)
                out.append({"config": config, "size": size, "direction": direction,
                            "mb_s": round(mb_s(n * size, seconds), 1)})
        if mkey is not None and mkey.mkey_check().err_type:
            raise BenchError(f"engine ceiling: {config} RX latched a signature error: the "
                             "bench moved wrong bytes")
    return out


# -- ceiling (a): a plain asyncio TCP stream between two processes -------------------------

async def _tcp_sink(ready_file: str, timeout: float) -> dict:
    """Count the bytes of one connection until the sender closes it, reading as the
    daemon reads its sockets (up to READ_CHUNK at a time)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        t0 = time.perf_counter()
        received = 0
        while True:
            data = await reader.read(TCP_READ_CHUNK)
            if not data:
                break
            received += len(data)
        seconds = time.perf_counter() - t0
        writer.close()
        if not done.done():
            done.set_result({"bytes": received, "seconds": seconds})

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0, limit=TCP_READ_CHUNK)
    _announce_port(server, ready_file)
    try:
        return await asyncio.wait_for(done, timeout)
    finally:
        server.close()


def _announce_port(server: asyncio.Server, ready_file: str) -> None:
    """Write the port ``server`` listens on to ``ready_file``, whole or not at all (the
    other process polls for the file)."""
    port = server.sockets[0].getsockname()[1]
    tmp = ready_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{port}\n")
    os.replace(tmp, ready_file)


async def _tcp_source(port: int, size: int, seconds: float, budget: int) -> None:
    message = os.urandom(size)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    deadline = time.perf_counter() + seconds
    while sent == 0 or (sent + size <= budget and time.perf_counter() < deadline):
        writer.write(message)
        sent += size
        await writer.drain()
    writer.close()
    await writer.wait_closed()


async def _serve_until_one_done(handle, ready_file: str, timeout: float) -> None:
    """A TCP server on a free loopback port (announced in ``ready_file``) running
    ``handle(reader, writer)`` per connection, until the first one is done or
    ``timeout`` seconds: the helper processes of the ceilings."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await handle(reader, writer)
        if not done.done():
            done.set_result(None)

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    _announce_port(server, ready_file)
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        server.close()


async def _tcp_echo(ready_file: str, timeout: float) -> None:
    """Send back whatever one connection sends, until it closes."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(TCP_READ_CHUNK):
            writer.write(data)
        writer.close()

    await _serve_until_one_done(echo, ready_file, timeout)


async def _tcp_ping(port: int, samples: int, size: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    message = os.urandom(size)
    times = []
    warm = min(20, samples)
    for n in range(samples + warm):
        t0 = time.perf_counter()
        writer.write(message)
        await reader.readexactly(size)
        if n >= warm:
            times.append(time.perf_counter() - t0)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return times


def tcp_round_trip(samples: int, workdir: str, size: int = LATENCY_BYTES) -> dict:
    """The latency floor: ``size`` bytes to an echo process and back over a plain asyncio
    TCP connection, one at a time, from this process."""
    ready = os.path.join(workdir, f"echo-{next(_RUNS)}.port")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([sys.executable, "-m", "softhca.tools.bench", "tcp-echo",
                                       ready, str(300)]))
        port = int(_wait_file(ready, procs, "the TCP echo process"))
        us = sorted(t * 1e6 for t in _run_loop(_tcp_ping(port, samples, size)))
    finally:
        _stop(procs)
    return {"size": size, "samples": len(us), "p50_us": round(_percentile(us, 50), 1),
            "p99_us": round(_percentile(us, 99), 1), "min_us": round(us[0], 1)}


async def _tcp_forward(ready_file: str, target_port: int, timeout: float) -> None:
    """The initiator daemon's hops without softhca: each connection from the client gets
    one connection to the target process, and bytes are forwarded both ways as they
    come (the request on to the target, the target's answer back to the client)."""
    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(TCP_READ_CHUNK):
                writer.write(data)
        writer.close()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        t_reader, t_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pump(reader, t_writer), pump(t_reader, writer))

    await _serve_until_one_done(forward, ready_file, timeout)


def tcp_chain(samples: int, workdir: str, size: int = LATENCY_BYTES) -> dict:
    """The latency ceiling of the same hops as a softhca RDMA_WRITE: this process (the
    client's post) -> a forwarding process (the initiator daemon) -> an echo process
    (the target daemon, whose echo is the ACK) -> the forwarding process -> this process
    (the completion). Plain asyncio TCP, ``size`` bytes, one outstanding."""
    n = next(_RUNS)
    ready_t = os.path.join(workdir, f"chain-target-{n}.port")
    ready_i = os.path.join(workdir, f"chain-initiator-{n}.port")
    py = [sys.executable, "-m", "softhca.tools.bench"]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([*py, "tcp-echo", ready_t, str(300)]))
        t_port = _wait_file(ready_t, procs, "the chain's target process")
        procs.append(subprocess.Popen([*py, "tcp-forward", ready_i, t_port, str(300)]))
        port = int(_wait_file(ready_i, procs, "the chain's initiator process"))
        us = sorted(t * 1e6 for t in _run_loop(_tcp_ping(port, samples, size)))
    finally:
        _stop(procs)
    return {"size": size, "samples": len(us), "hops": 4, "p50_us": round(_percentile(us, 50), 1),
            "p99_us": round(_percentile(us, 99), 1), "min_us": round(us[0], 1)}


def _wait_file(path: str, procs: list[subprocess.Popen], what: str,
               timeout: float = READY_TIMEOUT) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                text = f.read()
            if text.endswith("\n"):
                return text.strip()
        except FileNotFoundError:
            pass
        for p in procs:
            if p.poll() is not None:
                raise BenchError(f"{what} exited with status {p.returncode} before it was ready")
        time.sleep(0.02)
    raise BenchError(f"{what} was not ready within {timeout:g} s")


def _stop(procs: list[subprocess.Popen]) -> None:
    """End the processes this bench started: SIGTERM, then SIGKILL after a grace period."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                p.kill()
            p.wait()


def tcp_stream(size: int, seconds: float, budget: int, workdir: str) -> dict:
    """One TCP ceiling: a sender process writes ``size``-byte messages, one write each, to
    a receiver process, for ``seconds`` or ``budget`` bytes; MB/s as the receiver saw it."""
    ready = os.path.join(workdir, f"tcp-{size}-{next(_RUNS)}.port")
    py = [sys.executable, "-m", "softhca.tools.bench"]
    procs: list[subprocess.Popen] = []
    try:
        sink = subprocess.Popen([*py, "tcp-sink", ready, str(seconds + 60)],
                                stdout=subprocess.PIPE, text=True)
        procs.append(sink)
        port = _wait_file(ready, procs, "the TCP receiver")
        source = subprocess.Popen([*py, "tcp-source", port, str(size), str(seconds),
                                   str(budget)])
        procs.append(source)
        out, _ = sink.communicate(timeout=seconds + 90)
        if source.wait(timeout=30) != 0 or sink.returncode != 0:
            raise BenchError(f"the TCP stream of {size}-byte messages failed "
                             f"(sender {source.returncode}, receiver {sink.returncode})")
        result = json.loads(out)
    finally:
        _stop(procs)
    return {"wire_size": size, "messages": result["bytes"] // size, "bytes": result["bytes"],
            "seconds": round(result["seconds"], 6),
            "mb_s": round(mb_s(result["bytes"], result["seconds"]), 1)}


def tcp_ceilings(opts: E2EOptions, workdir: str, sizes=SIZES) -> list[dict]:
    """A TCP stream per distinct wire message size (plain, and with T10-DIF's 8 bytes per
    512), each also given in MB/s of the application bytes those wire bytes carry."""
    out = []
    for size in sizes:
        for wire in sorted({wire_size(c, size) for c in CONFIGS}):
            # At least 32 messages, so that even --quick measures a stream, not a start-up.
            r = tcp_stream(wire, opts.seconds, max(32 * wire, int(opts.mib * MIB)), workdir)
            r["size"] = size
            r["app_mb_s"] = round(r["mb_s"] * size / wire, 1)
            out.append(r)
    return out


# -- the daemons -------------------------------------------------------------------------

class Daemons:
    """``softhca serve`` processes on loopback port 0 (``with Daemons(2, dir) as addrs``);
    leaving the block ends them, whatever happened inside."""

    def __init__(self, n: int, workdir: str, extra: tuple[str, ...] = ()) -> None:
        self.n, self.workdir, self.extra = n, workdir, extra
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []

    def __enter__(self) -> list[str]:
        try:
            addresses = []
            for i in range(self.n):
                ready = os.path.join(self.workdir, f"daemon{i}.ready")
                log_path = os.path.join(self.workdir, f"daemon{i}.log")
                self.logs.append(log_path)
                with open(log_path, "wb") as log_file:
                    self.procs.append(subprocess.Popen(
                        [sys.executable, "-m", "softhca.tools.cli", "serve",
                         "--listen", "127.0.0.1:0", "--ready-file", ready,
                         "--log-level", "warning", *self.extra],
                        stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file))
                addresses.append(_wait_file(ready, self.procs[-1:], f"daemon {i}"))
            return addresses
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        _stop(self.procs)

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 5) -> str:
        out = []
        for path in self.logs:
            with contextlib.suppress(OSError), open(path, errors="replace") as f:
                out += [f"{os.path.basename(path)}: {line.rstrip()}"
                        for line in f.readlines()[-lines:]]
        return "\n".join(out)


# -- goodput and latency over one QP pair ------------------------------------------------

E2E_ACCESS = (sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE
              | sh.IBV_ACCESS_REMOTE_READ)
OPCODES = {"RDMA_WRITE": sh.IBV_WR_RDMA_WRITE, "RDMA_READ": sh.IBV_WR_RDMA_READ,
           "SEND": sh.IBV_WR_SEND}


def _wc_ok(wcs: list, what: str) -> None:
    for wc in wcs:
        if wc.status != sh.IBV_WC_SUCCESS:
            raise BenchError(f"{what}: a work request failed: {wc}")


class _Pair:
    """One RC QP pair for one configuration: the initiator (daemon B) posts, the target
    (daemon A) is written, read and sent to through a plain MR or its MKEY."""

    def __init__(self, config: str, target: Side, initiator: Side, opts: E2EOptions,
                 path_mtu: int = DEFAULT_MTU) -> None:
        self.config, self.t, self.i, self.opts = config, target, initiator, opts
        self.path_mtu = path_mtu
        self.top = max(SIZES)
        self.memory = np.random.default_rng(4791).integers(0, 256, self.top,
                                                           dtype=np.uint8).tobytes()
        self.rq = 4 * opts.depth
        self.recvs_posted = 0

    @classmethod
    async def create(cls, config: str, tnode: sh.Node, inode: sh.Node,
                     opts: E2EOptions, path_mtu: int = DEFAULT_MTU) -> _Pair:
        t, i = [await Side.open(role, node, cqe=4096, max_send_wr=2 * opts.depth + 4,
                                max_recv_wr=4 * opts.depth, max_sge=1)
                for role, node in (("target", tnode), ("initiator", inode))]
        self = cls(config, t, i, opts, path_mtu)
        await t.qp.connect(i.qp.info(), path_mtu=MTU_ENUM[path_mtu])
        await i.qp.connect(t.qp.info(), path_mtu=MTU_ENUM[path_mtu])
        self.t_mr = await t.pd.reg_mr(self.top, E2E_ACCESS)
        await self.t_mr.write(self.memory)
        self.i_mr = await i.pd.reg_mr(wire_size(config, self.top), E2E_ACCESS)
        self.mkey = None
        if config == "plain":
            await self.i_mr.write(self.memory)
            self.rkey, self.raddr = self.t_mr.rkey, self.t_mr.addr
            self.recv_sge = sh.SGE(self.t_mr.addr, self.top, self.t_mr.lkey)
        else:
            self.mkey = await self._mkey(config)
            self.rkey, self.raddr = self.mkey.rkey, 0
            self.recv_sge = sh.SGE(0, wire_size(config, self.top), self.mkey.lkey)
            # The initiator's buffer gets the wire image by reading the target's MKEY,
            # so that what it writes and sends later carries valid T10-DIF (and XTS).
            await i.qp.post_send(self._wr(sh.IBV_WR_RDMA_READ, wire_size(config, self.top)))
            _wc_ok(await i.scq.poll_n(1, COMPLETION_TIMEOUT), "reading the wire image")
        await self._post_recvs(self.rq)
        return self

    async def _mkey(self, config: str) -> sh.MKey:
        t = self.t
        flags = (sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                 | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE)
        crypto = None
        if config == "row_c":
            flags |= sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO
            dek = await t.ctx.create_dek(sh.Mlx5DEKInitAttr(
                pd=t.pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256,
                key=_key(np.random.default_rng(1619))))
            crypto = sh.Mlx5CryptoAttr(
                crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS, encrypt_on_tx=True,
                signature_crypto_order=sh.MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_BEFORE_CRYPTO_ON_TX,
                data_unit_size=sh.MLX5DV_BLOCK_SIZE_520, initial_tweak=TWEAK, dek=dek)
        mkey = await t.pd.create_mkey(flags, 1)
        qp = t.qp
        qp.wr_start()
        qp.wr_id, qp.wr_flags = 0, sh.IBV_SEND_INLINE
        qp.wr_mkey_configure(mkey, 4 if crypto else 3, sh.Mlx5MkeyConfAttr())
        qp.wr_set_mkey_access_flags(E2E_ACCESS)
        qp.wr_set_mkey_layout_list([sh.SGE(self.t_mr.addr, self.top, self.t_mr.lkey)])
        qp.wr_set_mkey_sig_block(sh.Mlx5SigBlockAttr(mem=None, wire=T10DIF_512,
                                                     check_mask=0xFF))
        if crypto:
            qp.wr_set_mkey_crypto(crypto)
        await qp.wr_complete()
        return mkey

    def _wr(self, opcode: int, length: int, signaled: bool = True) -> sh.SendWR:
        wr = sh.SendWR(wr_id=length, opcode=opcode,
                       sg=[sh.SGE(self.i_mr.addr, length, self.i_mr.lkey)],
                       send_flags=sh.IBV_SEND_SIGNALED if signaled else 0)
        if opcode != sh.IBV_WR_SEND:
            wr.set_wr_rdma(self.rkey, self.raddr)
        return wr

    async def _post_recvs(self, n: int) -> None:
        # Every receive takes the largest message, so a smaller one lands in any of them.
        if n:
            await self.t.qp.post_recv([sh.RecvWR(wr_id=1, sg=[self.recv_sge])] * n)

    async def _stream(self, op: str, size: int, depth: int, seconds: float,
                      budget: int) -> tuple[int, float]:
        """Keep ``depth`` WRs in flight, posted in lists of ``batch`` with the last one
        signaled, for ``seconds`` or ``budget`` messages; (messages completed, seconds)."""
        batch = max(1, depth // 4)
        lists = max(1, depth // batch)
        wl = wire_size(self.config, size)
        wrs = [self._wr(OPCODES[op], wl, signaled=(k == batch - 1)) for k in range(batch)]
        i = self.i
        state = {"sent": 0, "done": False, "received": 0}
        receiver = None
        if op == "SEND":
            receiver = asyncio.get_running_loop().create_task(self._receiver(state))
        posted = outstanding = completed = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        try:
            while outstanding < lists and (posted == 0 or posted + batch <= budget):
                await i.qp.post_send(wrs)
                posted += batch
                outstanding += 1
            while outstanding:
                wcs = await i.scq.poll(num_entries=lists, timeout=COMPLETION_TIMEOUT)
                if not wcs:
                    raise BenchError(f"{op} {size_text(size)}: no completion within "
                                     f"{COMPLETION_TIMEOUT:g} s")
                _wc_ok(wcs, f"{op} {size_text(size)}")
                outstanding -= len(wcs)
                completed += len(wcs) * batch
                while (outstanding < lists and posted + batch <= budget
                       and time.perf_counter() < deadline):
                    await i.qp.post_send(wrs)
                    posted += batch
                    outstanding += 1
            elapsed = time.perf_counter() - t0
            if receiver is not None:
                state["sent"], state["done"] = completed, True
                await asyncio.wait_for(receiver, COMPLETION_TIMEOUT)
        finally:
            if receiver is not None and not receiver.done():
                receiver.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await receiver
        return completed, elapsed

    async def _receiver(self, state: dict) -> None:
        """The target's application: take receive completions, post receives again."""
        while not (state["done"] and state["received"] >= state["sent"]):
            wcs = await self.t.rcq.poll(num_entries=self.rq, timeout=0.05)
            _wc_ok(wcs, "SEND's receive")
            state["received"] += len(wcs)
            await self._post_recvs(len(wcs))

    async def goodput(self, op: str, size: int) -> dict:
        o = self.opts
        depth = max(1, min(o.depth, int(o.inflight_mib * MIB) // size))
        # One untimed list first: QP and link warm, first-use costs paid.
        await self._stream(op, size, depth, 0.0, 1)
        budget = max(1, int(o.mib * MIB) // size)
        messages, seconds = await self._stream(op, size, depth, o.seconds, budget)
        return {"op": op, "config": self.config, "size": size, "path_mtu": self.path_mtu,
                "wire_size": wire_size(self.config, size), "depth": depth,
                "messages": messages, "bytes": messages * size, "seconds": round(seconds, 6),
                "mb_s": round(mb_s(messages * size, seconds), 1)}

    async def latency(self, samples: int) -> dict:
        """A 64-byte RDMA_WRITE, one outstanding, signaled: from the post_send call to the
        return of the poll that delivers its completion."""
        i = self.i
        wr = sh.SendWR(wr_id=7, opcode=sh.IBV_WR_RDMA_WRITE,
                       sg=[sh.SGE(self.i_mr.addr, LATENCY_BYTES, self.i_mr.lkey)])
        wr.set_wr_rdma(self.rkey, self.raddr)
        times, posts = [], []
        warm = min(20, samples)
        for n in range(samples + warm):
            t0 = time.perf_counter()
            await i.qp.post_send(wr)
            tp = time.perf_counter()
            wcs = await i.scq.poll(num_entries=1, timeout=COMPLETION_TIMEOUT)
            t1 = time.perf_counter()
            if not wcs:
                raise BenchError(f"latency: no completion within {COMPLETION_TIMEOUT:g} s")
            _wc_ok(wcs, "latency")
            if n >= warm:
                times.append(t1 - t0)
                posts.append(tp - t0)
        # The floor under it: one control request and its reply. The cheapest request
        # there is ("devices"): a poll no longer makes one, its completions are pushed.
        rtts = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await i.node.request("devices")
            rtts.append(time.perf_counter() - t0)
        us = sorted(t * 1e6 for t in times)
        rtt = sorted(t * 1e6 for t in rtts)
        post = sorted(t * 1e6 for t in posts)
        after = sorted((t - p) * 1e6 for t, p in zip(times, posts, strict=True))
        return {"op": "RDMA_WRITE", "config": "plain", "size": LATENCY_BYTES,
                "samples": len(us), "p50_us": round(_percentile(us, 50), 1),
                "p99_us": round(_percentile(us, 99), 1), "min_us": round(us[0], 1),
                "max_us": round(us[-1], 1), "mean_us": round(statistics.fmean(us), 1),
                "control_rtt_p50_us": round(_percentile(rtt, 50), 1),
                "control_rtt_p99_us": round(_percentile(rtt, 99), 1),
                # Where one sample's time goes: post_send's own round trip (the call to
                # its reply), then the wait for the pushed completion after it.
                "breakdown": {"post_send_p50_us": round(_percentile(post, 50), 1),
                              "completion_after_post_p50_us": round(_percentile(after, 50),
                                                                    1)}}

    async def verify(self) -> dict:
        """The target's memory still holds what it started with (every WRITE and SEND
        put the same bytes back), and its MKEY latched no signature error."""
        span = min(self.top, 64 * KIB)
        same = await self.t_mr.read(span) == self.memory[:span]
        err = "none"
        if self.mkey is not None:
            e = await self.mkey.mkey_check()
            if e.err_type != sh.MLX5DV_MKEY_NO_ERR:
                err = repr(e)
        return {"config": self.config, "path_mtu": self.path_mtu, "memory_intact": same,
                "mkey_error": err}


def _percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


# -- 1,000 QPs across 100 connections -----------------------------------------------------

async def many_qps(addresses: list[str], opts: E2EOptions) -> dict:
    """``sessions`` control sessions, half on each daemon, paired; ``qp_pairs`` connected
    QP pairs spread over the session pairs; each initiator QP RDMA_WRITEs
    ``writes_per_qp`` 4 KiB messages. Setup and the message phase are timed apart."""
    per_side = max(1, opts.sessions // 2)
    counts = [opts.qp_pairs // per_side + (k < opts.qp_pairs % per_side)
              for k in range(per_side)]
    sessions: list[sh.Node] = []
    t0 = time.perf_counter()
    try:
        a = await _connect_all(addresses[0], per_side, sessions)
        b = await _connect_all(addresses[1], per_side, sessions)
        groups = await asyncio.gather(*(_qp_group(a[k], b[k], counts[k], opts)
                                        for k in range(per_side)))
        setup = time.perf_counter() - t0
        t1 = time.perf_counter()
        done = await asyncio.gather(*(_write_group(g, opts) for g in groups))
        seconds = time.perf_counter() - t1
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    expected = sum(counts) * opts.writes_per_qp
    completed = sum(done)
    return {"sessions": 2 * per_side, "qp_pairs": sum(counts), "qps": 2 * sum(counts),
            "writes_per_qp": opts.writes_per_qp, "size": MANY_QPS_BYTES,
            "setup_s": round(setup, 3), "messages": expected, "completed": completed,
            "all_completed": completed == expected, "seconds": round(seconds, 6),
            "msg_per_s": round(completed / max(seconds, 1e-12), 1),
            "mb_s": round(mb_s(completed * MANY_QPS_BYTES, seconds), 1)}


async def _connect_all(address: str, n: int, opened: list[sh.Node]) -> list[sh.Node]:
    """``n`` control sessions at once; every one that opened is in ``opened`` (to be
    closed) even when another failed."""
    results = await asyncio.gather(*(sh.connect(address) for _ in range(n)),
                                   return_exceptions=True)
    nodes = [r for r in results if isinstance(r, sh.Node)]
    opened += nodes
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return nodes


async def _qp_group(a: sh.Node, b: sh.Node, n: int, opts: E2EOptions) -> dict:
    sides = []
    for node in (a, b):
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(max(64, 2 * n * opts.writes_per_qp))
        mr = await pd.reg_mr(MANY_QPS_BYTES, E2E_ACCESS)
        sides.append((pd, cq, mr))
    qps = []
    for _ in range(n):
        pair = []
        for pd, cq, _mr in sides:
            pair.append(await pd.create_qp(sh.QPInitAttr(
                qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                cap=sh.QPCap(max_send_wr=max(4, opts.writes_per_qp), max_recv_wr=1))))
        qa, qb = pair
        await qa.connect(qb.info(), path_mtu=sh.IBV_MTU_4096)
        await qb.connect(qa.info(), path_mtu=sh.IBV_MTU_4096)
        qps.append(qa)
    return {"qps": qps, "a": sides[0], "b": sides[1]}


async def _write_group(g: dict, opts: E2EOptions) -> int:
    _, cq, mr = g["a"]
    _, _, remote = g["b"]
    wr = sh.SendWR(opcode=sh.IBV_WR_RDMA_WRITE, sg=[sh.SGE(mr.addr, MANY_QPS_BYTES, mr.lkey)])
    wr.set_wr_rdma(remote.rkey, remote.addr)
    for qp in g["qps"]:
        await qp.post_send([wr] * opts.writes_per_qp)
    n = len(g["qps"]) * opts.writes_per_qp
    wcs = await cq.poll_n(n, COMPLETION_TIMEOUT)
    return sum(wc.status == sh.IBV_WC_SUCCESS for wc in wcs)


# -- the whole run -------------------------------------------------------------------------

def _cpu_seconds(pids: list[int]) -> list[float]:
    """CPU time (user + system) of each process, then of this one."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / tick)
        except (OSError, IndexError, ValueError):
            out.append(0.0)
    return [*out, time.process_time()]


async def _timed(pair: _Pair, op: str, size: int, pids: list[int]) -> dict:
    """One goodput row, with the cores each process kept busy while it ran."""
    cpu0, t0 = _cpu_seconds(pids), time.perf_counter()
    g = await pair.goodput(op, size)
    cpu1, wall = _cpu_seconds(pids), time.perf_counter() - t0
    # Cores busy on average while it ran (1.0 = one core all the time).
    g["cpu"] = {who: round((b - a) / wall, 2) for who, a, b in
                zip(("target", "initiator", "client"), cpu0, cpu1, strict=True)}
    return g


async def _measure(addresses: list[str], pids: list[int], opts: E2EOptions, progress) -> dict:
    tnode = await sh.connect(addresses[0])
    inode = await sh.connect(addresses[1])
    goodput, checks, latency = [], [], None
    try:
        before = [await tnode.counters(), await inode.counters()]
        for config in CONFIGS:
            pair = await _Pair.create(config, tnode, inode, opts)
            for op in OPS:
                for size in SIZES:
                    progress(f"{op} {size_text(size)} {config}")
                    goodput.append(await _timed(pair, op, size, pids))
            if config == "plain":
                progress("latency")
                latency = await pair.latency(opts.latency_samples)
            checks.append(await pair.verify())
            extra = [row for row in EXTRA_ROWS if row[1] == config]
            for mtu in sorted({row[3] for row in extra}):
                pair = await _Pair.create(config, tnode, inode, opts, path_mtu=mtu)
                for op, _, size, _ in (row for row in extra if row[3] == mtu):
                    progress(f"{op} {size_text(size)} {config} path MTU {mtu}")
                    goodput.append(await _timed(pair, op, size, pids))
                checks.append(await pair.verify())
        after = [await tnode.counters(), await inode.counters()]
    finally:
        await tnode.close()
        await inode.close()
    progress(f"{opts.qp_pairs} QP pairs over {opts.sessions} sessions")
    many = await many_qps(addresses, opts)
    watched = ("packets_sent", "packets_received", "retransmitted_packets", "ack_timeouts",
               "rnr_retries", "duplicates_discarded", "packets_bad_icrc")
    wire = {name: sum(after[k].get(name, 0) - before[k].get(name, 0) for k in range(2))
            for name in watched}
    return {"goodput": goodput, "latency": latency, "many_qps": many, "checks": checks,
            "wire_counters": wire}


def _attach_ceilings(goodput: list[dict], tcp: list[dict], engine: list[dict]) -> None:
    tcp_by = {(r["size"], r["wire_size"]): r["app_mb_s"] for r in tcp}
    eng_by = {(r["config"], r["size"], r["direction"]): r["mb_s"] for r in engine}
    for g in goodput:
        c_tcp = tcp_by[(g["size"], g["wire_size"])]
        c_eng = eng_by[(g["config"], g["size"], TARGET_DIRECTION[g["op"]])]
        g["ceilings"] = {"tcp_stream": c_tcp, "engine": c_eng}
        g["ratio"] = {"tcp_stream": _sig4(g["mb_s"] / c_tcp), "engine": _sig4(g["mb_s"] / c_eng),
                      "min": _sig4(g["mb_s"] / min(c_tcp, c_eng))}


def _sig4(x: float) -> float:
    """Four significant digits: ratios span 1e-4 (to a memcpy) to about 1."""
    return float(f"{x:.4g}")


def run_e2e(opts: E2EOptions = E2EOptions(), progress=None) -> dict:
    """The whole end-to-end bench; a JSON-ready dict. Every process it starts is ended
    before it returns or raises."""
    progress = progress or (lambda _msg: None)
    start = time.perf_counter()
    machine = e2e_machine_info()
    progress("engine ceilings")
    engine = engine_ceilings(budget=MIB if opts.quick else 4 * MIB, repeat=2 if opts.quick else 3)
    with tempfile.TemporaryDirectory(prefix="softhca-bench-") as workdir:
        progress("TCP ceilings")
        tcp = tcp_ceilings(opts, workdir)
        tcp_rtt = tcp_round_trip(opts.latency_samples, workdir)
        chain = tcp_chain(opts.latency_samples, workdir)
        daemons = Daemons(2, workdir, () if opts.trains else ("--no-trains",))
        with daemons as addresses:
            try:
                measured = _run_loop(_measure(addresses, [p.pid for p in daemons.procs],
                                              opts, progress))
            except (sh.RDMAError, BenchError, asyncio.TimeoutError) as e:
                tail = daemons.log_tail()
                raise BenchError(f"{e}" + (f"\n{tail}" if tail else "")) from e
            for k, p in enumerate(daemons.procs):
                if p.poll() is not None:
                    raise BenchError(f"daemon {k} died during the bench (status {p.returncode})")
    _attach_ceilings(measured["goodput"], tcp, engine)
    lat = measured["latency"]
    lat["ceilings"] = {"tcp_round_trip_p50_us": tcp_rtt["p50_us"],
                       "tcp_round_trip_p99_us": tcp_rtt["p99_us"],
                       "tcp_chain_p50_us": chain["p50_us"], "tcp_chain_p99_us": chain["p99_us"]}
    lat["ratio"] = {"p50_to_tcp_round_trip": _sig4(lat["p50_us"] / tcp_rtt["p50_us"]),
                    "p99_to_tcp_round_trip": _sig4(lat["p99_us"] / tcp_rtt["p99_us"]),
                    "p50_to_tcp_chain": _sig4(lat["p50_us"] / chain["p50_us"]),
                    "p99_to_tcp_chain": _sig4(lat["p99_us"] / chain["p99_us"])}
    return {
        "benchmark": "softhca end to end",
        "unit": "MB/s = 1e6 bytes of application (memory-domain) data per second",
        "machine": machine,
        "setup": {"daemons": addresses, "processes": "2 x softhca serve, this client, "
                  "TCP sender and receiver: all separate processes",
                  "path_mtu": DEFAULT_MTU, "quick": opts.quick,
                  "extra_rows": [{"op": op, "config": c, "size": size, "path_mtu": mtu}
                                 for op, c, size, mtu in EXTRA_ROWS]},
        "options": asdict(opts),
        "configs": CONFIG_TITLES,
        **measured,
        "ceilings": {"tcp_stream": tcp, "engine": engine, "tcp_round_trip": tcp_rtt,
                     "tcp_chain": chain},
        "total_seconds": round(time.perf_counter() - start, 1),
    }


# -- output ---------------------------------------------------------------------------------

def e2e_to_json(doc: dict) -> str:
    return json.dumps(doc, indent=2)


def _table(head: list[str], rows: list[list[str]], left: int = 1) -> list[str]:
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if k < left else c.rjust(w)
                         for k, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _mtu(doc: dict, row: dict) -> int:
    """A row's path MTU; documents saved before rows carried one ran all at the setup's."""
    return row.get("path_mtu", doc.get("setup", {}).get("path_mtu", DEFAULT_MTU))


def _check_name(doc: dict, check: dict) -> str:
    mtu = _mtu(doc, check)
    return check["config"] + ("" if mtu == doc["setup"]["path_mtu"] else f" (MTU {mtu})")


def e2e_to_table(doc: dict) -> str:
    m, o = doc["machine"], doc["options"]
    uv = f"uvloop {m['uvloop']}" if m["uvloop"] else "no uvloop (asyncio)"
    lo = m["loopback"]
    out = [
        "softhca bench: two `softhca serve` processes on loopback, driven by this process "
        f"through softhca.client; path MTU {doc['setup']['path_mtu']} unless the MTU column "
        "says otherwise" + (" (--quick)" if o["quick"] else ""),
        f"machine: {m['cpu_model']}, {m['cpu_count']} cores, Python {m['python']} "
        f"({m['implementation']}), {uv}, loopback {lo['interface']} MTU {lo['mtu']}, load "
        f"average at start {' '.join(str(x) for x in m['load_average_at_start'])}",
        f"each goodput run: up to {o['seconds']:g} s or {o['mib']:g} MiB, up to {o['depth']} "
        f"WRs in flight (at most {o['inflight_mib']:g} MiB), posted in lists with the last "
        "WR signaled",
        "",
        "goodput, MB/s of application data; ceilings: TCP = asyncio stream between two "
        "processes, same wire bytes and message size;",
        "engine = the target's transform alone (softhca.engine, RX for WRITE/SEND, TX for "
        "READ); ratio = goodput / ceiling, /min = to the lower;",
        "CPU T/I/C = cores busy in the target daemon, the initiator daemon and this client "
        "while the row ran (1.00 = one core)",
    ]
    for config in CONFIGS:
        rows = []
        for g in doc["goodput"]:
            if g["config"] != config:
                continue
            c, r = g["ceilings"], g["ratio"]
            u = g["cpu"]
            rows.append([g["op"], size_text(g["size"]), str(_mtu(doc, g)), str(g["depth"]),
                         f"{g['mb_s']:.1f}",
                         f"{c['tcp_stream']:.1f}", f"{c['engine']:.1f}",
                         f"{r['tcp_stream']:.3g}", f"{r['engine']:.3g}", f"{r['min']:.3g}",
                         f"{u['target']:.2f}/{u['initiator']:.2f}/{u['client']:.2f}"])
        out += ["", f"[{config}] {doc['configs'][config]}"]
        out += _table(["op", "size", "MTU", "depth", "MB/s", "TCP MB/s", "engine MB/s", "/TCP",
                       "/engine", "/min", "CPU T/I/C"], rows, left=2)
    lat = doc["latency"]
    many = doc["many_qps"]
    w = doc["wire_counters"]
    checks = ", ".join(f"{_check_name(doc, c)} memory "
                       f"{'intact' if c['memory_intact'] else 'CHANGED'}"
                       + (f", MKEY error {c['mkey_error']}" if c["config"] != "plain" else "")
                       for c in doc["checks"])
    out += [
        "",
        f"latency: {lat['size']}-byte RDMA_WRITE, one outstanding, signaled, post_send to "
        f"its completion, {lat['samples']} samples: p50 {lat['p50_us']:.1f} us, p99 "
        f"{lat['p99_us']:.1f} us (min {lat['min_us']:.1f}, max {lat['max_us']:.1f}); one "
        f"control request's round trip: p50 {lat['control_rtt_p50_us']:.1f} us, p99 "
        f"{lat['control_rtt_p99_us']:.1f} us; ceiling: a {lat['size']}-byte asyncio TCP "
        f"round trip between two processes, p50 {lat['ceilings']['tcp_round_trip_p50_us']:.1f}"
        f" us, p99 {lat['ceilings']['tcp_round_trip_p99_us']:.1f} us (latency / TCP round "
        f"trip: p50 {lat['ratio']['p50_to_tcp_round_trip']:.2f}x, p99 "
        f"{lat['ratio']['p99_to_tcp_round_trip']:.2f}x)",
        *_chain_lines(lat),
        f"many QPs: {many['qp_pairs']} connected QP pairs ({many['qps']} QPs) over "
        f"{many['sessions']} control sessions: setup {many['setup_s']:.2f} s; "
        f"{many['completed']}/{many['messages']} {size_text(many['size'])} RDMA_WRITEs "
        f"completed ({'all' if many['all_completed'] else 'NOT ALL'}) in "
        f"{many['seconds']:.2f} s = {many['msg_per_s']:.0f} msg/s, {many['mb_s']:.1f} MB/s",
        f"integrity: {checks}",
        f"wire (goodput and latency runs): {w['packets_sent']} packets sent, "
        f"{w['retransmitted_packets']} retransmitted, {w['ack_timeouts']} ACK timeouts, "
        f"{w['rnr_retries']} RNR retries",
        f"total {doc['total_seconds']:.1f} s",
    ]
    return "\n".join(out)


def _chain_lines(lat: dict) -> list[str]:
    """The latency beside the TCP chain of the same hops, and where its time goes
    (documents saved before these were measured have neither)."""
    c, r = lat.get("ceilings", {}), lat.get("ratio", {})
    if "tcp_chain_p50_us" not in c:
        return []
    out = [f"latency chain ceiling: {lat['size']} bytes along the same hops over asyncio TCP "
           "(client -> initiator process -> target process -> back through the initiator "
           f"-> client), p50 {c['tcp_chain_p50_us']:.1f} us, p99 {c['tcp_chain_p99_us']:.1f} "
           f"us (latency / chain: p50 {r['p50_to_tcp_chain']:.2f}x, p99 "
           f"{r['p99_to_tcp_chain']:.2f}x; goal p50 <= 2x)"]
    b = lat.get("breakdown")
    if b:
        out.append(f"latency breakdown (p50): post_send to its reply {b['post_send_p50_us']:.1f}"
                   f" us, then the pushed completion {b['completion_after_post_p50_us']:.1f} "
                   "us later (no poll request)")
    return out


# -- --compare: a saved run beside a new one ------------------------------------------------
#
# Speeds on a shared machine move with its load; a ratio to a ceiling measured in the same
# run moves much less. So a change is read as a ratio of ratios: the row's ratio in the new
# run over its ratio in the saved run. For the end-to-end bench the ratio is to the TCP
# stream by default: no softhca change moves that ceiling (the engine ceiling moves with
# the engine itself), so new/saved is the row's own change, the machine's speed divided out.

E2E_KIND, ENGINE_KIND = "softhca end to end", "engine"
COMPARE_RATIOS = ("tcp_stream", "engine", "min")


class CompareError(ValueError):
    """A document ``--compare`` cannot use; the message is the reason."""


def load_saved(path: str) -> dict:
    """A saved ``softhca bench [engine] --json`` document, checked for what a comparison
    reads; CompareError (reason first, then the file) when it is missing or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise CompareError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise CompareError(f"is a directory, not a saved --json document: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise CompareError(f"cannot read ({reason}): {path}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CompareError(f"not JSON ({e.msg} at line {e.lineno} column {e.colno}): "
                           f"{path}") from None
    compare_rows(doc, "tcp_stream", path)
    return doc


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def doc_kind(doc, path: str = "the document") -> str:
    kind = doc.get("benchmark") if isinstance(doc, dict) else None
    if kind not in (E2E_KIND, ENGINE_KIND):
        raise CompareError(f'not a saved `softhca bench --json` or `softhca bench engine '
                           f'--json` document (its "benchmark" is neither {E2E_KIND!r} nor '
                           f'{ENGINE_KIND!r}): {path}')
    return kind


def compare_rows(doc, ratio: str = "tcp_stream",
                 path: str = "the document") -> dict[str, dict]:
    """label -> {figure, unit, ratio, better} for every row a comparison reads."""
    kind = doc_kind(doc, path)
    rows: dict[str, dict] = {}

    def bad(what: str):
        return CompareError(f"{what}: {path}")

    if kind == ENGINE_KIND:
        results = doc.get("results")
        if not isinstance(results, list) or not results:
            raise bad('no "results" rows')
        for k, r in enumerate(results):
            if not (isinstance(r, dict) and isinstance(r.get("name"), str)
                    and _number(r.get("engine_mb_s")) and _number(r.get("ratio"))
                    and r["ratio"] > 0):
                raise bad(f"results row {k} lacks a name, a numeric engine_mb_s or a "
                          "positive ratio")
            # From the figures when they are there: the ratio of documents saved before
            # it had four significant digits was rounded to three decimals.
            p = r.get("primitive_mb_s")
            ratio_ = r["engine_mb_s"] / p if _number(p) and p > 0 and r["engine_mb_s"] > 0 \
                else r["ratio"]
            rows[r["name"]] = {"figure": r["engine_mb_s"], "unit": "MB/s", "ratio": ratio_,
                               "better": "higher"}
        return rows
    goodput = doc.get("goodput")
    if not isinstance(goodput, list) or not goodput:
        raise bad('no "goodput" rows')
    setup = doc.get("setup")
    setup_mtu = setup.get("path_mtu", DEFAULT_MTU) if isinstance(setup, dict) else DEFAULT_MTU
    for k, g in enumerate(goodput):
        ok = (isinstance(g, dict) and isinstance(g.get("op"), str)
              and isinstance(g.get("config"), str) and isinstance(g.get("size"), int)
              and g["size"] > 0 and _number(g.get("mb_s")) and isinstance(g.get("ratio"), dict)
              and _number(g["ratio"].get(ratio)) and g["ratio"][ratio] > 0
              and isinstance(g.get("path_mtu", setup_mtu), int))
        if not ok:
            raise bad(f"goodput row {k} lacks an op, a config, a size, a numeric mb_s or a "
                      f"positive ratio.{ratio}")
        mtu = g.get("path_mtu", setup_mtu)
        label = (f"{g['op']} {size_text(g['size'])} {g['config']}"
                 + ("" if mtu == DEFAULT_MTU else f" MTU {mtu}"))
        rows[label] = {"figure": g["mb_s"], "unit": "MB/s", "ratio": g["ratio"][ratio],
                       "better": "higher"}
    lat = doc.get("latency")
    if lat is not None:
        for p in ("p50", "p99"):
            r = lat.get("ratio", {}).get(f"{p}_to_tcp_round_trip") \
                if isinstance(lat, dict) and isinstance(lat.get("ratio"), dict) else None
            if not (_number(lat.get(f"{p}_us") if isinstance(lat, dict) else None)
                    and _number(r) and r > 0):
                raise bad(f"latency lacks a numeric {p}_us or a positive "
                          f"ratio.{p}_to_tcp_round_trip")
            rows[f"latency {lat.get('size', LATENCY_BYTES)} B {p}"] = {
                "figure": lat[f"{p}_us"], "unit": "us", "ratio": r, "better": "lower"}
            # The same figure over the chain of the same hops, in runs that measured it.
            rc = lat["ratio"].get(f"{p}_to_tcp_chain")
            if _number(rc) and rc > 0:
                rows[f"latency {lat.get('size', LATENCY_BYTES)} B {p} / chain"] = {
                    "figure": lat[f"{p}_us"], "unit": "us", "ratio": rc, "better": "lower"}
    return rows


def compare(saved: dict, new: dict, ratio: str = "tcp_stream", saved_path: str = "saved",
            new_path: str = "this run") -> dict:
    """Each row of either run: its figure and ratio in both, and new ratio / saved ratio."""
    kinds = doc_kind(saved, saved_path), doc_kind(new, new_path)
    if kinds[0] != kinds[1]:
        raise CompareError(f"the two runs are different benches ({kinds[0]!r} and "
                           f"{kinds[1]!r}): {saved_path} and {new_path}")
    a = compare_rows(saved, ratio, saved_path)
    b = compare_rows(new, ratio, new_path)
    rows, higher = [], []
    for label in [*a, *(k for k in b if k not in a)]:
        old, cur = a.get(label), b.get(label)
        rows.append({"row": label, "better": (old or cur)["better"],
                     "unit": (old or cur)["unit"],
                     "saved": None if old is None else {"figure": old["figure"],
                                                        "ratio": old["ratio"]},
                     "new": None if cur is None else {"figure": cur["figure"],
                                                      "ratio": cur["ratio"]},
                     "ratio_of_ratios": None if old is None or cur is None
                     else _sig4(cur["ratio"] / old["ratio"])})
        if old is not None and cur is not None and old["better"] == "higher":
            higher.append(cur["ratio"] / old["ratio"])
    summary = None if not higher else {
        "rows": len(higher), "geometric_mean": _sig4(math.exp(statistics.fmean(
            math.log(x) for x in higher))), "min": _sig4(min(higher)), "max": _sig4(max(higher))}
    return {"benchmark": kinds[0], "ratio": "engine/primitive" if kinds[0] == ENGINE_KIND
            else ratio, "saved": saved_path, "new": new_path,
            "load_average": {"saved": _load(saved), "new": _load(new)}, "rows": rows,
            "higher_is_better_summary": summary}


def _load(doc: dict):
    m = doc.get("machine")
    return m.get("load_average_at_start") if isinstance(m, dict) else None


RATIO_TEXT = {"tcp_stream": "goodput / TCP stream ceiling", "engine":
              "goodput / engine ceiling", "min": "goodput / the lower ceiling",
              "engine/primitive": "engine / one call of the primitive"}


def compare_to_table(c: dict) -> str:
    def fig(side: dict | None, unit: str) -> str:
        return "-" if side is None else f"{side['figure']:.1f} {unit}"

    def rat(side: dict | None) -> str:
        return "-" if side is None else f"{side['ratio']:.4g}"

    rows = [[r["row"], fig(r["saved"], r["unit"]), fig(r["new"], r["unit"]), rat(r["saved"]),
             rat(r["new"]), "-" if r["ratio_of_ratios"] is None
             else f"{r['ratio_of_ratios']:.4g}", r["better"]]
            for r in c["rows"]]
    load = c["load_average"]
    out = [f"compare: saved {c['saved']} beside {c['new']}; ratio = {RATIO_TEXT[c['ratio']]} "
           "of the same run; new/saved = new ratio / saved ratio (the change, each run's "
           "machine speed divided out)"]
    if load["saved"] or load["new"]:
        out.append("load average at start: saved "
                   + (" ".join(str(x) for x in load["saved"]) if load["saved"] else "unknown")
                   + ", new " + (" ".join(str(x) for x in load["new"]) if load["new"]
                                 else "unknown"))
    out += ["", *_table(["row", "saved", "new", "saved ratio", "new ratio", "new/saved",
                         "better"], rows)]
    s = c["higher_is_better_summary"]
    if s:
        out += ["", f"{s['rows']} rows in both runs where higher is better: new/saved "
                f"geometric mean {s['geometric_mean']:.4g}, min {s['min']:.4g}, max "
                f"{s['max']:.4g}"]
    only = [r["row"] for r in c["rows"] if r["ratio_of_ratios"] is None]
    if only:
        out.append("in one run only: " + ", ".join(only))
    return "\n".join(out)


# -- helper processes: python -m softhca.tools.bench tcp-sink|tcp-source ------------------

def _helper_main(argv: list[str]) -> int:
    role, *rest = argv
    if role == "tcp-sink":
        ready_file, timeout = rest[0], float(rest[1])
        print(json.dumps(_run_loop(_tcp_sink(ready_file, timeout))), flush=True)
        return 0
    if role == "tcp-echo":
        _run_loop(_tcp_echo(rest[0], float(rest[1])))
        return 0
    if role == "tcp-forward":
        _run_loop(_tcp_forward(rest[0], int(rest[1]), float(rest[2])))
        return 0
    if role == "tcp-source":
        port, size, seconds, budget = int(rest[0]), int(rest[1]), float(rest[2]), int(rest[3])
        _run_loop(_tcp_source(port, size, seconds, budget))
        return 0
    print(f"unknown role {role!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_helper_main(sys.argv[1:]))
