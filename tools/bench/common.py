"""What both benches share: units, the grid of rows, the options, timing and statistics.

Numbers only; nothing here judges them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...protocol.attrs import SigBlockDomain, SigT10dif
from ...protocol.enums import AccessFlags, BlockSize, SigT10difFlags, SigType
from ...server.loop import run_loop  # noqa: F401 (the bench's modules take it from here)

MIB = 1 << 20
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
# the row where per-packet costs (and so packet trains) weigh most.
EXTRA_ROWS = (("RDMA_WRITE", "plain", MIB, 1024),)
DEFAULT_MTU = 4096
LATENCY_BYTES = 64
MANY_QPS_BYTES = 4 * KIB
COMPLETION_TIMEOUT = 60.0
# The standard seeds of each CRC (bg 0 for CRC-16/T10-DIF, all ones for the 32/64-bit
# CRCs) are what the C libraries compute, so engine and primitive do the same work
# and no seed fix-up is timed on one side only.
T10DIF_512 = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_512,
                            dif=SigT10dif(bg=0, app_tag=0xBEEF, ref_tag=0x2000,
                                          flags=SigT10difFlags.REF_REMAP))
ALL = AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE
TWEAK = (0x1122334455667788_99AABBCCDDEEFF00).to_bytes(16, "little")


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
    # perftest through the libibverbs provider beside the client's rows (provider.py).
    provider: bool = False
    # C programs (qperf, perftest) beside kernel TCP between two network namespaces
    # (cprograms.py).
    c_programs: bool = False


QUICK = E2EOptions(seconds=0.02, mib=1.0, depth=8, inflight_mib=2.0, latency_samples=50,
                   sessions=10, qp_pairs=40, writes_per_qp=2, quick=True)


def wire_size(config: str, size: int) -> int:
    """Wire bytes of ``size`` application bytes: 8 bytes of T10-DIF per 512 with an MKEY."""
    return size if config == "plain" else size // 512 * 520


def size_text(size: int) -> str:
    return f"{size // MIB} MiB" if size >= MIB and size % MIB == 0 else f"{size // KIB} KiB"


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



def sig4(x: float) -> float:
    """Four significant digits: ratios span 1e-4 (to a memcpy) to about 1."""
    return float(f"{x:.4g}")


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of sorted values."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def xts_key(rng: np.random.Generator) -> bytes:
    # mlx5dv_dek_create (and OpenSSL) refuse equal XTS key halves.
    while True:
        key = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
        if key[:32] != key[32:]:
            return key


def wakeups(pids: list[int]) -> list[int]:
    """Voluntary context switches so far of each process's main thread, then of this
    thread: each is one sleep in the event loop's poll and so one wake-up. A process
    that is gone counts 0."""
    out = []
    for path in [*(f"/proc/{pid}/status" for pid in pids), "/proc/thread-self/status"]:
        try:
            with open(path) as f:
                line = next(x for x in f if x.startswith("voluntary_ctxt_switches:"))
            out.append(int(line.split()[1]))
        except (OSError, StopIteration, ValueError):
            out.append(0)
    return out
