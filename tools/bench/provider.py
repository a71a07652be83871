"""``softhca bench --provider``: the same daemons' speed seen by unmodified C programs
through the libibverbs provider (provider/, docs/native.md): perftest's ib_write_bw at
1 MiB and ib_send_lat at 64 B, each a pair of ``softhca run`` processes (each with its
own embedded daemon) on loopback. The rows stand beside the client's plain RDMA_WRITE
1 MiB row, its TCP ceiling and the client's latency, from the same bench run.

Needs root (softhca run's mount namespace), the built provider and Debian's perftest;
without them the section says why it was skipped.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from ..native import PROVIDER_DIR, PROVIDER_LIB
from .cprograms import ParseError, perftest_row
from .namespaces import listening as _listening  # ucx.py's pairs use it too

ITERATIONS = 1000
WRITE_SIZE = 1 << 20
LAT_SIZE = 64
TIMEOUT = 120.0


def unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (softhca run makes the device node in a mount namespace)"
    if not (PROVIDER_DIR / PROVIDER_LIB).is_file():
        return "the provider is not built (make provider)"
    missing = [p for p in ("ib_write_bw", "ib_send_lat", "unshare") if not shutil.which(p)]
    return f"{', '.join(missing)} not installed (Debian's perftest)" if missing else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pair(program: list[str]) -> str:
    """The client's output of ``program`` run as a server and a client on loopback."""
    port = _free_port()
    # The two ends' daemons are two processes: they link with a peer token both know.
    with tempfile.NamedTemporaryFile("w", prefix="softhca-peer-") as token:
        token.write(secrets.token_hex(32) + "\n")
        token.flush()
        run = [sys.executable, "-m", "softhca.tools.cli", "run",
               "--peer-token-file", token.name, "--"]
        return _pair_with(program, port, run)


def _pair_with(program: list[str], port: int, run: list[str]) -> str:
    args = [*program, "-p", str(port)]
    srv = subprocess.Popen([*run, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    try:
        deadline = time.monotonic() + 30
        while not _listening(srv.pid, port):
            if srv.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{program[0]} server did not listen: "
                                   f"{srv.communicate()[0][-400:]}")
            time.sleep(0.05)
        cli = subprocess.run([*run, *args, "127.0.0.1"], capture_output=True, text=True,
                             timeout=TIMEOUT)
        srv.communicate(timeout=TIMEOUT)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    if cli.returncode or srv.returncode:
        raise RuntimeError(f"{program[0]} exited {cli.returncode}/{srv.returncode}: "
                           f"{(cli.stdout + cli.stderr)[-400:]}")
    return cli.stdout


def _row(out: str, size: int) -> list[float]:
    return perftest_row(out, size, ITERATIONS)


def provider_rows(progress=lambda _msg: None) -> dict:
    """The two rows, or {"skipped": why}."""
    why = unavailable()
    if why:
        return {"skipped": why}
    try:
        progress("provider: ib_write_bw 1 MiB")
        # --report_gbits: Gbit/s of 10^9 bits, so MB/s (10^6 bytes) is exactly x 125
        bw = _row(_pair(["ib_write_bw", "-s", str(WRITE_SIZE), "-n", str(ITERATIONS),
                         "--report_gbits"]), WRITE_SIZE)
        progress("provider: ib_send_lat 64 B")
        # t_min, t_max, t_typical, t_avg, t_stdev, 99%, 99.9% (usec)
        lat = _row(_pair(["ib_send_lat", "-s", str(LAT_SIZE), "-n", str(ITERATIONS)]),
                   LAT_SIZE)
    except (RuntimeError, ParseError, OSError, subprocess.TimeoutExpired) as e:
        return {"skipped": f"a provider run failed: {e}"}
    return {"ib_write_bw": {"size": WRITE_SIZE, "iterations": ITERATIONS,
                            "mb_s": round(bw[1] * 125, 1)},
            "ib_send_lat": {"size": LAT_SIZE, "iterations": ITERATIONS,
                            "typical_us": lat[2], "avg_us": lat[3], "p99_us": lat[5]}}
