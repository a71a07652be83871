"""A peer in the bench: UCX's own put over TCP on loopback, measured in the same run.

``ucx_perftest`` (Debian's ``ucx-utils``) runs as a server and a client on loopback with
``UCX_TLS=tcp,self``: put bandwidth at 1 MiB and 64 KiB (``ucp_put_bw``) and put latency
at 64 B (``ucp_put_lat``). It is another RDMA-style stack over the same TCP, so
softhca's rows stand beside it as ratios, next to the TCP-stream ratios. Absent, the
section says so and the bench runs on.

Units, as ucx_perftest prints them (src/tools/perf): its "MB/s" is 2^20 bytes a
second, converted here to 1e6 bytes like every other figure of the bench; a ping-pong
test's latency is half the round trip, so the round trip a 64-byte RDMA_WRITE's
post-to-completion compares with is twice it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

from .common import DEFAULT_MTU, MIB, sig4, size_text

# The same loopback plumbing as the provider's perftest pairs.
from .provider import _free_port, _listening

PROGRAM = "ucx_perftest"
BW_SIZES = (MIB, 64 << 10)
LAT_SIZE = 64
TIMEOUT = 120.0
# "Final:  iterations  lat 50%ile  lat average  lat overall  bw average  bw overall
#  msgrate average  msgrate overall"
FINAL = re.compile(r"^Final:\s+(.*)$", re.M)


def unavailable() -> str | None:
    if shutil.which(PROGRAM) is None:
        return (f"{PROGRAM} is not installed (Debian's ucx-utils: apt-get install -y "
                "ucx-utils)")
    return None


def _env() -> dict:
    # TCP and loopback-to-self only: the same wire the daemons use, no shared memory.
    return {**os.environ, "UCX_TLS": "tcp,self", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def _run(test: str, size: int, iterations: int) -> list[float]:
    """The figures of the client's Final line of one ``ucx_perftest`` pair."""
    port = _free_port()
    args = [PROGRAM, "-p", str(port), "-t", test, "-s", str(size), "-n", str(iterations)]
    srv = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=_env())
    try:
        deadline = time.monotonic() + 30
        while not _listening(srv.pid, port):
            if srv.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{PROGRAM} server did not listen: "
                                   f"{srv.communicate()[0][-300:]}")
            time.sleep(0.05)
        cli = subprocess.run([*args, "127.0.0.1"], capture_output=True, text=True,
                             timeout=TIMEOUT, env=_env())
        srv.communicate(timeout=TIMEOUT)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    out = cli.stdout + cli.stderr
    found = FINAL.search(out)
    if cli.returncode or found is None:
        raise RuntimeError(f"{test} -s {size} exited {cli.returncode}: {out[-300:]}")
    return [float(x) for x in found.group(1).split()]


def ucx_rows(quick: bool, progress=lambda _msg: None) -> dict:
    """The three UCX figures, or {"skipped": why}."""
    why = unavailable()
    if why:
        return {"skipped": why}
    out: dict = {"transport": "UCX_TLS=tcp,self, loopback", "put_bw": []}
    try:
        for size in BW_SIZES:
            progress(f"UCX put bandwidth {size >> 10} KiB")
            # About 256 MiB (as a goodput row's budget), a few MiB with --quick.
            n = max(8, (4 * MIB if quick else 256 * MIB) // size)
            f = _run("ucp_put_bw", size, n)
            out["put_bw"].append({"size": size, "iterations": n,
                                  "mb_s": round(f[5] * MIB / 1e6, 1)})
        progress("UCX put latency 64 B")
        n = 100 if quick else 4000
        f = _run("ucp_put_lat", LAT_SIZE, n)
        out["put_lat"] = {"size": LAT_SIZE, "iterations": n, "half_round_trip_us": f[1],
                          "round_trip_us": round(2 * f[1], 3)}
    except (RuntimeError, OSError, subprocess.TimeoutExpired, IndexError, ValueError) as e:
        return {"skipped": f"a ucx_perftest run failed: {e}"[:400]}
    return out


def attach_ucx_ratios(goodput: list[dict], latency: dict, ucx: dict) -> None:
    """softhca's plain rows of the same sizes (every op and path MTU: UCX's put is the
    one figure per size) as ratios to UCX's put, and the latency p50 to UCX's put round
    trip."""
    if "skipped" in ucx:
        return
    by_size = {r["size"]: r["mb_s"] for r in ucx["put_bw"]}
    for g in goodput:
        mb = by_size.get(g["size"])
        if g["config"] == "plain" and mb:
            g["ceilings"]["ucx_put"] = mb
            g["ratio"]["ucx_put"] = sig4(g["mb_s"] / mb)
    rtt = ucx["put_lat"]["round_trip_us"]
    if rtt > 0:
        latency.setdefault("ceilings", {})["ucx_put_round_trip_us"] = rtt
        latency.setdefault("ratio", {})["p50_to_ucx_put"] = sig4(latency["p50_us"] / rtt)


def ucx_lines(doc: dict) -> list[str]:
    """The UCX section of the table (documents saved before it have none)."""
    u = doc.get("ucx")
    if u is None:
        return []
    if "skipped" in u:
        return [f"UCX peer: none in this run: {u['skipped']}"]
    bw = ", ".join(f"{size_text(r['size'])} {r['mb_s']:.1f} MB/s" for r in u["put_bw"])
    lat = u["put_lat"]
    rows = [g for g in doc["goodput"] if "ucx_put" in g["ratio"]]
    mtu = doc.get("setup", {}).get("path_mtu", DEFAULT_MTU)
    mine = "; ".join(f"{g['op']} {size_text(g['size'])}"
                     + (f" (MTU {g['path_mtu']})" if g.get("path_mtu", mtu) != mtu else "")
                     + f" /UCX {g['ratio']['ucx_put']:.3g} (/TCP {g['ratio']['tcp_stream']:.3g})"
                     for g in rows)
    ratio = doc["latency"].get("ratio", {}).get("p50_to_ucx_put")
    out = [f"UCX peer ({PROGRAM}, {u['transport']}): put bandwidth {bw}; put latency "
           f"{lat['size']} B {lat['half_round_trip_us']:.1f} us one way (half a round trip), "
           f"{lat['round_trip_us']:.1f} us round trip",
           f"  plain rows / UCX put of the same size: {mine}"]
    if ratio is not None:
        out.append(f"  latency p50 / UCX put round trip: {ratio:.2f}x")
    return out
