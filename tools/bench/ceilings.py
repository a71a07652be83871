"""The ceilings each end-to-end figure stands beside, measured in the same run, and the
helper processes that measure them (``python -m softhca.tools.bench ROLE ...``).

A ceiling is what the same bytes cost without softhca in the way: the engine's
transform alone (no daemon, no wire), and a plain asyncio TCP stream, round trip or
chain of the same hops between separate processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time

import numpy as np

from ...engine import transfer
from ...protocol.attrs import SigBlockAttr
from ...protocol.enums import BlockSize, SignatureCryptoOrder
from ..daemons import OWN_SESSION, stop_all, wait_file
from .common import (
    ALL,
    CONFIGS,
    LATENCY_BYTES,
    MIB,
    SIZES,
    T10DIF_512,
    BenchError,
    E2EOptions,
    best_seconds,
    mb_s,
    percentile,
    run_loop,
    wire_size,
    xts_key,
)
from .engine import EngineNode

# The daemon's socket reads (server/link.py READ_CHUNK); the TCP ceiling reads alike.
TCP_READ_CHUNK = 1 << 18
_RUNS = itertools.count()
HELPER = [sys.executable, "-m", "softhca.tools.bench"]


# -- ceiling (b): the engine's transform alone -------------------------------------------

def engine_ceilings(sizes=SIZES, budget: int = 4 * MIB, repeat: int = 3) -> list[dict]:
    """MB/s of application data through the target side's transform of each configuration
    (plain: an MR, a copy), in both directions, one call per message as the responder
    makes it, best of ``repeat`` runs of about ``budget`` bytes each."""
    rng = np.random.default_rng(512)
    top = max(sizes)
    memory = rng.integers(0, 256, top, dtype=np.uint8).tobytes()
    key = xts_key(rng)
    out = []
    for config in CONFIGS:
        node = EngineNode()
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
    daemon reads its wire links (server/wire_in.py): a BufferedProtocol that the loop
    reads into one reused buffer of TCP_READ_CHUNK bytes, no new bytes object per read.
    A StreamReader would copy every read, a cost the daemon no longer pays, and the
    ceiling would sit below what the same socket can carry."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    class Sink(asyncio.BufferedProtocol):
        def __init__(self) -> None:
            self.buf = bytearray(TCP_READ_CHUNK)
            self.received = 0
            self.t0 = 0.0

        def connection_made(self, transport) -> None:
            self.transport = transport
            self.t0 = time.perf_counter()

        def get_buffer(self, sizehint: int) -> bytearray:
            return self.buf

        def buffer_updated(self, nbytes: int) -> None:
            self.received += nbytes

        def eof_received(self) -> bool:
            return False        # close the transport

        def connection_lost(self, exc) -> None:
            if not done.done():
                done.set_result({"bytes": self.received,
                                 "seconds": time.perf_counter() - self.t0})

    server = await loop.create_server(Sink, "127.0.0.1", 0)
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
        procs.append(subprocess.Popen([*HELPER, "tcp-echo", ready, str(300)], **OWN_SESSION))
        port = int(wait_file(ready, procs, "the TCP echo process"))
        us = sorted(t * 1e6 for t in run_loop(_tcp_ping(port, samples, size)))
    finally:
        stop_all(procs)
    return {"size": size, "samples": len(us), "p50_us": round(percentile(us, 50), 1),
            "p99_us": round(percentile(us, 99), 1), "min_us": round(us[0], 1)}


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
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([*HELPER, "tcp-echo", ready_t, str(300)], **OWN_SESSION))
        t_port = wait_file(ready_t, procs, "the chain's target process")
        procs.append(subprocess.Popen([*HELPER, "tcp-forward", ready_i, t_port, str(300)],
                                      **OWN_SESSION))
        port = int(wait_file(ready_i, procs, "the chain's initiator process"))
        us = sorted(t * 1e6 for t in run_loop(_tcp_ping(port, samples, size)))
    finally:
        stop_all(procs)
    return {"size": size, "samples": len(us), "hops": 4, "p50_us": round(percentile(us, 50), 1),
            "p99_us": round(percentile(us, 99), 1), "min_us": round(us[0], 1)}


def tcp_stream(size: int, seconds: float, budget: int, workdir: str) -> dict:
    """One TCP ceiling: a sender process writes ``size``-byte messages, one write each, to
    a receiver process, for ``seconds`` or ``budget`` bytes; MB/s as the receiver saw it."""
    ready = os.path.join(workdir, f"tcp-{size}-{next(_RUNS)}.port")
    procs: list[subprocess.Popen] = []
    try:
        sink = subprocess.Popen([*HELPER, "tcp-sink", ready, str(seconds + 60)],
                                stdout=subprocess.PIPE, text=True, **OWN_SESSION)
        procs.append(sink)
        port = wait_file(ready, procs, "the TCP receiver")
        source = subprocess.Popen([*HELPER, "tcp-source", port, str(size), str(seconds),
                                   str(budget)], **OWN_SESSION)
        procs.append(source)
        out, _ = sink.communicate(timeout=seconds + 90)
        if source.wait(timeout=30) != 0 or sink.returncode != 0:
            raise BenchError(f"the TCP stream of {size}-byte messages failed "
                             f"(sender {source.returncode}, receiver {sink.returncode})")
        result = json.loads(out)
    finally:
        stop_all(procs)
    return {"wire_size": size, "messages": result["bytes"] // size, "bytes": result["bytes"],
            "seconds": round(result["seconds"], 6),
            "mb_s": round(mb_s(result["bytes"], result["seconds"]), 1)}


# TCP streams per ceiling, the best kept: one stream's MB/s moved by a factor of two from
# run to run on a quiet 2-core machine (3,178 to 6,143 MB/s at 1 MiB), and a ceiling that
# low makes every ratio to it, and every --compare of two runs, mostly its noise. Noise
# only ever slows a stream, so the best of three is the steadier reading of what TCP does.
TCP_TRIALS = 3


def tcp_ceilings(opts: E2EOptions, workdir: str, sizes=SIZES) -> list[dict]:
    """A TCP stream per distinct wire message size (plain, and with T10-DIF's 8 bytes per
    512), the best of TCP_TRIALS (one with --quick), each also given in MB/s of the
    application bytes those wire bytes carry; ``trials_mb_s`` keeps every stream's."""
    out = []
    trials = 1 if opts.quick else TCP_TRIALS
    for size in sizes:
        for wire in sorted({wire_size(c, size) for c in CONFIGS}):
            # At least 32 messages, so that even --quick measures a stream, not a start-up.
            runs = [tcp_stream(wire, opts.seconds, max(32 * wire, int(opts.mib * MIB)),
                               workdir) for _ in range(trials)]
            r = max(runs, key=lambda x: x["mb_s"])
            r["trials_mb_s"] = [x["mb_s"] for x in runs]
            r["size"] = size
            r["app_mb_s"] = round(r["mb_s"] * size / wire, 1)
            out.append(r)
    return out


# -- the helper processes: python -m softhca.tools.bench ROLE ... ---------------------

def helper_main(argv: list[str]) -> int:
    role, *rest = argv
    if role == "tcp-sink":
        ready_file, timeout = rest[0], float(rest[1])
        print(json.dumps(run_loop(_tcp_sink(ready_file, timeout))), flush=True)
        return 0
    if role == "tcp-echo":
        run_loop(_tcp_echo(rest[0], float(rest[1])))
        return 0
    if role == "tcp-forward":
        run_loop(_tcp_forward(rest[0], int(rest[1]), float(rest[2])))
        return 0
    if role == "tcp-source":
        port, size, seconds, budget = int(rest[0]), int(rest[1]), float(rest[2]), int(rest[3])
        run_loop(_tcp_source(port, size, seconds, budget))
        return 0
    print(f"unknown role {role!r}", file=sys.stderr)
    return 2
