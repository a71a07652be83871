"""``softhca bench``, the end-to-end bench, checked for shape only: every figure present
and positive, the ratios those figures give, every QP's writes completed, every process
it started gone. Speeds are never compared: they depend on the machine and its load."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from softhca.tools import bench
from softhca.tools.cli import main

OPS = {"RDMA_WRITE", "RDMA_READ", "SEND"}
CONFIGS = {"plain", "t10dif", "row_c"}
SIZES = {4096, 65536, 1 << 20}


def positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def close(ratio: float, figure: float, ceiling: float) -> bool:
    # Ratios are kept to four significant digits.
    return math.isclose(ratio, figure / ceiling, rel_tol=1e-3)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One `softhca bench --quick --json` in a subprocess, its temporary files (daemons'
    ready files, logs) under a directory of its own, so its processes can be found."""
    tmp = tmp_path_factory.mktemp("bench")
    out_file = tmp / "bench.json"
    env = {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "bench", "--quick",
                           "--json", "--json-out", str(out_file)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    return {"doc": json.loads(done.stdout), "file": out_file, "tmp": tmp}


def test_json_is_printed_and_written(run):
    assert json.loads(run["file"].read_text()) == run["doc"]


def test_every_goodput_figure_present_positive_with_its_ceilings(run):
    rows = run["doc"]["goodput"]
    assert {(g["op"], g["config"], g["size"]) for g in rows} == {
        (op, c, s) for op in OPS for c in CONFIGS for s in SIZES}
    assert len(rows) == len(OPS) * len(CONFIGS) * len(SIZES)
    for g in rows:
        for key in ("mb_s", "messages", "bytes", "seconds", "depth"):
            assert positive(g[key]), (g, key)
        assert g["bytes"] == g["messages"] * g["size"], g
        assert g["wire_size"] == (g["size"] if g["config"] == "plain" else g["size"] // 512 * 520)
        c, r = g["ceilings"], g["ratio"]
        assert positive(c["tcp_stream"]) and positive(c["engine"]), g
        assert all(positive(r[k]) for k in ("tcp_stream", "engine", "min")), g
        assert close(r["tcp_stream"], g["mb_s"], c["tcp_stream"]), g
        assert close(r["engine"], g["mb_s"], c["engine"]), g
        assert close(r["min"], g["mb_s"], min(c["tcp_stream"], c["engine"])), g
        assert set(g["cpu"]) == {"target", "initiator", "client"}


def test_ceilings_are_the_ones_measured(run):
    doc = run["doc"]
    engine = {(e["config"], e["size"], e["direction"]): e["mb_s"]
              for e in doc["ceilings"]["engine"]}
    assert set(engine) == {(c, s, d) for c in CONFIGS for s in SIZES for d in ("tx", "rx")}
    assert all(positive(v) for v in engine.values())
    tcp = {(t["size"], t["wire_size"]): t for t in doc["ceilings"]["tcp_stream"]}
    assert set(tcp) == {(s, w) for s in SIZES for w in (s, s // 512 * 520)}
    for t in tcp.values():
        assert positive(t["mb_s"]) and positive(t["bytes"]) and positive(t["seconds"])
        assert math.isclose(t["app_mb_s"], t["mb_s"] * t["size"] / t["wire_size"], abs_tol=0.1)
    for g in doc["goodput"]:
        direction = "tx" if g["op"] == "RDMA_READ" else "rx"
        assert g["ceilings"]["engine"] == engine[(g["config"], g["size"], direction)]
        assert g["ceilings"]["tcp_stream"] == tcp[(g["size"], g["wire_size"])]["app_mb_s"]


def test_latency(run):
    lat = run["doc"]["latency"]
    assert lat["samples"] == bench.QUICK.latency_samples and lat["size"] == 64
    for key in ("p50_us", "p99_us", "min_us", "max_us", "mean_us", "control_rtt_p50_us",
                "control_rtt_p99_us"):
        assert positive(lat[key]), key
    assert lat["min_us"] <= lat["p50_us"] <= lat["p99_us"] <= lat["max_us"]
    c = lat["ceilings"]
    assert positive(c["tcp_round_trip_p50_us"]) and positive(c["tcp_round_trip_p99_us"])
    assert close(lat["ratio"]["p50_to_tcp_round_trip"], lat["p50_us"], c["tcp_round_trip_p50_us"])
    assert close(lat["ratio"]["p99_to_tcp_round_trip"], lat["p99_us"], c["tcp_round_trip_p99_us"])


def test_many_qps_all_completed(run):
    m = run["doc"]["many_qps"]
    q = bench.QUICK
    assert (m["sessions"], m["qp_pairs"], m["qps"]) == (q.sessions, q.qp_pairs, 2 * q.qp_pairs)
    assert m["messages"] == q.qp_pairs * q.writes_per_qp
    assert m["completed"] == m["messages"] and m["all_completed"] is True
    for key in ("setup_s", "seconds", "msg_per_s", "mb_s"):
        assert positive(m[key]), key


def test_bytes_moved_were_right_and_machine_described(run):
    doc = run["doc"]
    assert {c["config"] for c in doc["checks"]} == CONFIGS
    for c in doc["checks"]:
        assert c["memory_intact"] is True and c["mkey_error"] == "none", c
    w = doc["wire_counters"]
    assert w["packets_sent"] > 0 and w["packets_received"] > 0
    m = doc["machine"]
    assert m["cpu_model"] and m["cpu_count"] >= 1 and m["python"]
    assert "uvloop" in m and m["loopback"]["address"] == "127.0.0.1"
    assert doc["setup"]["path_mtu"] == 4096 and doc["setup"]["quick"] is True
    assert positive(doc["total_seconds"])


def test_table_shows_every_row(run):
    table = bench.e2e_to_table(run["doc"])
    for config in CONFIGS:
        assert f"[{config}]" in table
    for op in OPS:
        assert table.count(op) >= len(CONFIGS) * len(SIZES)
    assert "latency: 64-byte RDMA_WRITE" in table and "p99" in table
    assert f"{bench.QUICK.qp_pairs} connected QP pairs" in table and "(all)" in table


def test_no_process_outlives_the_bench(run):
    # Daemons and TCP helpers all name a file under the run's TMPDIR on their command line.
    assert processes_mentioning(str(run["tmp"])) == []


def test_daemons_are_stopped_when_the_bench_fails(tmp_path):
    daemons = bench.Daemons(2, str(tmp_path))
    with pytest.raises(RuntimeError, match="boom"), daemons as addresses:
        assert len(addresses) == 2 and all(a.startswith("127.0.0.1:") for a in addresses)
        raise RuntimeError("boom")
    assert len(daemons.procs) == 2
    assert all(p.poll() is not None for p in daemons.procs)


def test_help_states_the_defaults(capsys):
    assert main(["bench", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    d = bench.E2EOptions()
    for option, value in (("seconds", d.seconds), ("mib", d.mib), ("depth", d.depth),
                          ("latency-samples", d.latency_samples), ("sessions", d.sessions),
                          ("qp-pairs", d.qp_pairs), ("writes-per-qp", d.writes_per_qp)):
        assert f"(default {value:g}" in text, option
    assert f"at most {d.inflight_mib:g} MiB in flight" in text


def test_building_the_parser_does_not_load_the_bench():
    code = ("import sys; from softhca.tools.cli import build_parser; build_parser(); "
            "print('softhca.tools.bench' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_usage_errors(capsys):
    assert main(["bench", "--sessions", "1"]) == 2
    assert main(["bench", "--seconds", "0"]) == 2
    assert main(["bench", "--depth", "-1"]) == 2
    capsys.readouterr()
