"""``softhca bench``, the end-to-end bench, checked for shape only: every figure present
and positive, the ratios those figures give, every QP's writes completed, every process
it started gone. Speeds are never compared: they depend on the machine and its load."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

from softhca.tools import bench
from softhca.tools.bench import e2e_to_table, ucx
from softhca.tools.cli import main

OPS = {"RDMA_WRITE", "RDMA_READ", "SEND"}
CONFIGS = {"plain", "t10dif", "row_c"}
SIZES = {4096, 65536, 1 << 20}
MIB = 1 << 20
# The rows beyond the grid at path MTU 4096.
EXTRA = {("RDMA_WRITE", "plain", MIB, 1024)}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDED = os.path.join(ROOT, "docs", "performance.json")


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
    """One `softhca bench --quick --json --compare docs/performance.json` in a subprocess,
    its temporary files (daemons' ready files, logs) under a directory of its own, so its
    processes can be found."""
    tmp = tmp_path_factory.mktemp("bench")
    out_file = tmp / "bench.json"
    env = {**os.environ, "TMPDIR": str(tmp)}
    done = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "bench", "--quick",
                           "--json", "--json-out", str(out_file), "--compare", RECORDED],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    compared = printed.pop("compare")
    return {"doc": printed, "compare": compared, "file": out_file, "tmp": tmp}


def test_json_is_printed_and_written(run):
    # The file holds the run alone (a later run's SAVED), stdout adds the comparison.
    assert json.loads(run["file"].read_text()) == run["doc"]


def test_every_goodput_figure_present_positive_with_its_ceilings(run):
    rows = run["doc"]["goodput"]
    assert {(g["op"], g["config"], g["size"], g["path_mtu"]) for g in rows} == {
        (op, c, s, 4096) for op in OPS for c in CONFIGS for s in SIZES} | EXTRA
    assert len(rows) == len(OPS) * len(CONFIGS) * len(SIZES) + len(EXTRA)
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


def test_the_mtu_1024_row(run):
    doc = run["doc"]
    assert doc["setup"]["extra_rows"] == [{"op": "RDMA_WRITE", "config": "plain", "size": MIB,
                                           "path_mtu": 1024}]
    rows = {(g["op"], g["config"], g["size"], g["path_mtu"]): g for g in doc["goodput"]}
    row, same_at_4096 = rows[("RDMA_WRITE", "plain", MIB, 1024)], rows[("RDMA_WRITE", "plain",
                                                                        MIB, 4096)]
    assert positive(row["mb_s"]) and row["bytes"] == row["messages"] * MIB
    # The same wire bytes and the same target transform: the same ceilings.
    assert row["ceilings"] == same_at_4096["ceilings"]
    assert {(c["config"], c["path_mtu"]) for c in doc["checks"]} == {
        *((c, 4096) for c in CONFIGS), ("plain", 1024)}
    lines = [line.split() for line in bench.e2e_to_table(doc).splitlines()]
    assert ["RDMA_WRITE", "1", "MiB", "1024"] in [words[:4] for words in lines]
    assert "plain (MTU 1024) memory intact" in bench.e2e_to_table(doc)


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


# -- --compare ------------------------------------------------------------------------------

def e2e_doc(rows: list[tuple], p50=None) -> dict:
    """A small saved end-to-end document: (op, config, size, path MTU, MB/s, ratio to TCP)."""
    doc = {"benchmark": "softhca end to end", "machine": {"load_average_at_start": [1.0, 2.0,
                                                                                 3.0]},
           "setup": {"path_mtu": 4096},
           "goodput": [{"op": op, "config": c, "size": size, "path_mtu": mtu, "mb_s": mb,
                        "ratio": {"tcp_stream": r, "engine": r / 10, "min": r}}
                       for op, c, size, mtu, mb, r in rows]}
    if p50 is not None:
        doc["latency"] = {"size": 64, "p50_us": p50[0], "p99_us": 3 * p50[0],
                          "ratio": {"p50_to_tcp_round_trip": p50[1],
                                    "p99_to_tcp_round_trip": 2 * p50[1]}}
    return doc


def write(tmp_path, name: str, doc) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


SAVED = e2e_doc([("RDMA_WRITE", "plain", MIB, 4096, 80.0, 0.081),
                 ("SEND", "plain", 65536, 4096, 88.0, 0.089),
                 ("RDMA_READ", "t10dif", 4096, 4096, 9.0, 0.0238)], p50=(1010.0, 5.6))
NEW = e2e_doc([("RDMA_WRITE", "plain", MIB, 4096, 400.0, 0.43),
               ("SEND", "plain", 65536, 4096, 350.0, 0.3713),
               ("RDMA_READ", "t10dif", 4096, 4096, 7.5, 0.0201),
               ("RDMA_WRITE", "plain", MIB, 1024, 300.0, 0.29)], p50=(370.0, 1.9))


def printed_rows(text: str) -> dict[str, list[str]]:
    """The comparison table's rows by label: [saved, new, saved ratio, new ratio,
    new/saved, better] (figures with their unit)."""
    lines = text.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("row ")) + 2
    out = {}
    for line in lines[start:]:
        if not line.strip():
            break
        cells = [c for c in line.split("  ") if c.strip()]
        out[cells[0].strip()] = [c.strip() for c in cells[1:]]
    return out


def test_compare_prints_the_ratio_of_ratios(tmp_path, capsys):
    saved, new = write(tmp_path, "saved.json", SAVED), write(tmp_path, "new.json", NEW)
    assert main(["bench", "--compare", saved, new]) == 0
    out = capsys.readouterr().out
    rows = printed_rows(out)
    expected = {"RDMA_WRITE 1 MiB plain": (0.081, 0.43), "SEND 64 KiB plain": (0.089, 0.3713),
                "RDMA_READ 4 KiB t10dif": (0.0238, 0.0201), "latency 64 B p50": (5.6, 1.9),
                "latency 64 B p99": (11.2, 3.8)}
    for label, (old, cur) in expected.items():
        cells = rows[label]
        assert float(cells[2]) == old and float(cells[3]) == cur, cells
        assert math.isclose(float(cells[4]), cur / old, rel_tol=1e-3), (label, cells)
        assert cells[5] == ("lower" if label.startswith("latency") else "higher")
    assert rows["RDMA_WRITE 1 MiB plain"][:2] == ["80.0 MB/s", "400.0 MB/s"]
    # In the new run only: shown, with no ratio of ratios.
    assert rows["RDMA_WRITE 1 MiB plain MTU 1024"] == ["-", "300.0 MB/s", "-", "0.29", "-",
                                                       "higher"]
    assert "in one run only: RDMA_WRITE 1 MiB plain MTU 1024" in out
    goodput = [0.43 / 0.081, 0.3713 / 0.089, 0.0201 / 0.0238]
    geo = math.prod(goodput) ** (1 / 3)
    assert f"new/saved geometric mean {geo:.4g}" in out
    assert "load average at start: saved 1.0 2.0 3.0" in out


def test_compare_json_and_the_other_ratios(tmp_path, capsys):
    saved, new = write(tmp_path, "saved.json", SAVED), write(tmp_path, "new.json", NEW)
    assert main(["bench", "--compare", saved, new, "--json", "--compare-ratio", "engine"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["ratio"] == "engine" and c["saved"] == saved and c["new"] == new
    by = {r["row"]: r for r in c["rows"]}
    r = by["SEND 64 KiB plain"]
    assert r["saved"] == {"figure": 88.0, "ratio": 0.0089}
    assert r["new"] == {"figure": 350.0, "ratio": 0.03713}
    assert math.isclose(r["ratio_of_ratios"], 0.03713 / 0.0089, rel_tol=1e-3)
    assert by["RDMA_WRITE 1 MiB plain MTU 1024"]["saved"] is None


def test_compare_engine_documents(tmp_path, capsys):
    def engine_doc(ratio: float) -> dict:
        return {"benchmark": "engine", "results": [
            {"name": "T10-DIF generate, 512B blocks", "engine_mb_s": 8536.0 * ratio,
             "primitive": "fastcrc", "primitive_mb_s": 8536.0, "ratio": ratio}]}
    saved = write(tmp_path, "e1.json", engine_doc(0.063))
    new = write(tmp_path, "e2.json", engine_doc(0.21))
    assert main(["bench", "engine", "--compare", saved, new]) == 0
    cells = printed_rows(capsys.readouterr().out)["T10-DIF generate, 512B blocks"]
    assert math.isclose(float(cells[4]), 0.21 / 0.063, rel_tol=1e-3)
    # An engine document is not an end-to-end one, and the other way round.
    assert main(["bench", "--compare", saved]) == 2
    assert main(["bench", "engine", "--compare", RECORDED]) == 2
    err = capsys.readouterr().err
    assert "not by `softhca bench --json`" in err and "not by `softhca bench engine --json`" in err


def test_compare_beside_the_run(run):
    # The quick run beside the recorded run of docs/performance.md.
    with open(RECORDED) as f:
        recorded = json.load(f)
    c = run["compare"]
    assert c["saved"] == RECORDED and c["new"] == "this run" and c["ratio"] == "tcp_stream"
    by = {r["row"]: r for r in c["rows"]}
    # Runs saved before rows carried their path MTU ran every row at 4096.
    old = {(g["op"], g["config"], g["size"], g.get("path_mtu", 4096)): g
           for g in recorded["goodput"]}
    for g in run["doc"]["goodput"]:
        label = (f"{g['op']} {bench.size_text(g['size'])} {g['config']}"
                 + ("" if g["path_mtu"] == 4096 else f" MTU {g['path_mtu']}"))
        row = by[label]
        key = (g["op"], g["config"], g["size"], g["path_mtu"])
        if key not in old:
            assert row["saved"] is None and row["ratio_of_ratios"] is None
            continue
        saved_ratio = old[key]["ratio"]["tcp_stream"]
        assert row["saved"]["ratio"] == saved_ratio
        assert math.isclose(row["ratio_of_ratios"], g["ratio"]["tcp_stream"] / saved_ratio,
                            rel_tol=1e-3)


@pytest.mark.parametrize(("content", "reason"), [
    (None, "no such file: "),
    ("{", "not JSON (Expecting property name enclosed in double quotes at line 1 column 2): "),
    ("[1, 2]", "not a saved `softhca bench --json` or `softhca bench engine --json` document"),
    ({"benchmark": "softhca end to end"}, 'no "goodput" rows: '),
    ({"benchmark": "softhca end to end", "goodput": [{"op": "SEND", "config": "plain",
                                                      "size": 4096, "mb_s": 1.0}]},
     "goodput row 0 lacks an op, a config, a size, a numeric mb_s or a positive "
     "ratio.tcp_stream: "),
    (e2e_doc([("SEND", "plain", 4096, 4096, 1.0, 0.0)]), "goodput row 0 lacks"),
    ({**SAVED, "latency": {"p50_us": 1.0}}, "latency lacks a numeric p50_us or a positive "),
    ({"benchmark": "engine", "results": [{"name": "x"}]}, "results row 0 lacks a name"),
])
def test_compare_refuses_a_missing_or_malformed_file(tmp_path, capsys, content, reason):
    path = str(tmp_path / "missing.json") if content is None else write(tmp_path, "bad.json",
                                                                        content)
    kind = ["engine"] if isinstance(content, dict) and content.get("benchmark") == "engine" \
        else []
    # Refused before anything runs (no daemon is started: this returns at once).
    assert main(["bench", *kind, "--compare", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    prefix = "softhca bench" + (" engine" if kind else "") + " --compare: "
    assert err.startswith(prefix + reason), err
    assert err.endswith(path) and "\n" not in err and "Traceback" not in err


def test_compare_takes_at_most_sixteen_new_files(tmp_path, capsys):
    saved = write(tmp_path, "saved.json", SAVED)
    assert main(["bench", "--compare", saved, *[saved] * 17]) == 2
    assert "SAVED and at most 16 NEW files, not 17" in capsys.readouterr().err


def test_compare_reads_several_new_runs_as_each_rows_median(tmp_path, capsys):
    """Three new runs: each row's new ratio is the median of its three (computed here
    from the documents' numbers), new/saved is that over the saved ratio, and a row in
    one run only is its figure alone."""
    ratios = {"RDMA_WRITE 1 MiB plain": (0.43, 0.21, 0.5), "SEND 64 KiB plain": (0.3, 0.1, 0.2)}
    runs = []
    for k in range(3):
        doc = e2e_doc([("RDMA_WRITE", "plain", MIB, 4096, 100.0 * (k + 1),
                        ratios["RDMA_WRITE 1 MiB plain"][k]),
                       ("SEND", "plain", 65536, 4096, 50.0 + k,
                        ratios["SEND 64 KiB plain"][k])], p50=(300.0 + k, 2.0 - k / 2))
        if k == 1:
            doc["goodput"].append({"op": "SEND", "config": "plain", "size": MIB,
                                   "path_mtu": 4096, "mb_s": 9.0,
                                   "ratio": {"tcp_stream": 0.7, "engine": 0.07, "min": 0.7}})
        doc["machine"]["load_average_at_start"] = [float(k)] * 3
        runs.append(write(tmp_path, f"new-{k}.json", doc))
    saved = write(tmp_path, "saved.json", SAVED)
    assert main(["bench", "--compare", saved, *runs]) == 0
    out = capsys.readouterr().out
    rows = printed_rows(out)
    old = {"RDMA_WRITE 1 MiB plain": 0.081, "SEND 64 KiB plain": 0.089}
    for label, three in ratios.items():
        middle = sorted(three)[1]
        cells = rows[label]
        assert float(cells[3]) == middle, cells
        assert cells[4].split() == [f"{x:.4g}" for x in three], cells
        assert math.isclose(float(cells[5]), middle / old[label], rel_tol=1e-3), cells
    assert rows["RDMA_WRITE 1 MiB plain"][1] == "200.0 MB/s"        # median figure
    assert rows["latency 64 B p50"][1] == "301.0 us"
    assert float(rows["latency 64 B p50"][3]) == 1.5
    assert "beside the median of 3 runs" in out
    assert "load average at start: saved 1.0 2.0 3.0, new 0.0 0.0 0.0; 1.0 1.0 1.0; 2.0" in out
    assert rows["SEND 1 MiB plain"][:4] == ["-", "9.0 MB/s", "-", "0.7"]
    assert main(["bench", "--compare", saved, *runs, "--json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["new"] == runs
    by = {r["row"]: r for r in c["rows"]}
    assert by["SEND 64 KiB plain"]["new"] == {"figure": 51.0, "ratio": 0.2,
                                              "runs": [0.3, 0.1, 0.2]}
    assert by["SEND 1 MiB plain"]["new"] == {"figure": 9.0, "ratio": 0.7}


def test_compare_reads_runs_saved_before_rows_had_a_path_mtu(tmp_path, capsys):
    old = e2e_doc([("RDMA_WRITE", "plain", MIB, 4096, 80.0, 0.1)])
    del old["goodput"][0]["path_mtu"]
    saved, new = write(tmp_path, "old.json", old), write(tmp_path, "new.json", NEW)
    assert main(["bench", "--compare", saved, new]) == 0
    cells = printed_rows(capsys.readouterr().out)["RDMA_WRITE 1 MiB plain"]
    assert math.isclose(float(cells[4]), 0.43 / 0.1, rel_tol=1e-3)


def test_engine_json_out_writes_the_run_and_still_prints_the_table(tmp_path, capsys):
    # A tiny run (0.0625 MiB, one timing each): the file is the run's JSON document,
    # readable as a later --compare SAVED, and the table is printed as without it.
    out = tmp_path / "engine.json"
    assert main(["bench", "engine", "--mib", "0.0625", "--repeat", "1",
                 "--json-out", str(out)]) == 0
    printed = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "engine"
    names = [r["name"] for r in doc["results"]]
    assert names and all(n in printed for n in names)
    assert main(["bench", "engine", "--compare", str(out), str(out)]) == 0
    cells = printed_rows(capsys.readouterr().out)[names[0]]
    assert math.isclose(float(cells[4]), 1.0)


# -- the UCX peer and the latency's wake-ups ----------------------------------------------

needs_ucx = pytest.mark.skipif(shutil.which("ucx_perftest") is None,
                               reason="ucx_perftest not installed (Debian's ucx-utils)")


@needs_ucx
def test_ucx_figures_and_ratios(run):
    doc = run["doc"]
    u = doc["ucx"]
    assert "skipped" not in u, u
    assert [r["size"] for r in u["put_bw"]] == [MIB, 64 << 10]
    assert all(positive(r["mb_s"]) for r in u["put_bw"])
    by_size = {r["size"]: r["mb_s"] for r in u["put_bw"]}
    lat = u["put_lat"]
    assert lat["size"] == 64 and positive(lat["half_round_trip_us"])
    # ucx_perftest prints half a round trip for a ping-pong test.
    assert math.isclose(lat["round_trip_us"], 2 * lat["half_round_trip_us"], rel_tol=1e-3)
    rows = [g for g in doc["goodput"] if g["config"] == "plain" and g["size"] in by_size]
    assert rows
    for g in rows:
        assert g["ceilings"]["ucx_put"] == by_size[g["size"]]
        assert close(g["ratio"]["ucx_put"], g["mb_s"], by_size[g["size"]])
    # Rows of another size or configuration have no UCX figure.
    assert not any("ucx_put" in g["ratio"] for g in doc["goodput"]
                   if g["config"] != "plain" or g["size"] not in by_size)
    assert close(doc["latency"]["ratio"]["p50_to_ucx_put"], doc["latency"]["p50_us"],
                 lat["round_trip_us"])
    table = e2e_to_table(doc)
    assert "UCX peer (ucx_perftest, UCX_TLS=tcp,self, loopback): put bandwidth 1 MiB" in table
    assert "plain rows / UCX put of the same size: RDMA_WRITE 64 KiB /UCX" in table
    assert "RDMA_WRITE 1 MiB (MTU 1024) /UCX" in table


def test_without_ucx_perftest_the_bench_says_so(monkeypatch):
    monkeypatch.setattr(ucx.shutil, "which", lambda _name: None)
    got = ucx.ucx_rows(quick=True)
    assert got == {"skipped": "ucx_perftest is not installed (Debian's ucx-utils: "
                              "apt-get install -y ucx-utils)"}
    goodput = [{"op": "RDMA_WRITE", "config": "plain", "size": MIB, "mb_s": 1.0,
                "ceilings": {}, "ratio": {}}]
    latency = {"p50_us": 1.0}
    ucx.attach_ucx_ratios(goodput, latency, got)
    assert goodput[0]["ratio"] == {} and "ratio" not in latency
    assert ucx.ucx_lines({"ucx": got}) == [
        "UCX peer: none in this run: ucx_perftest is not installed (Debian's ucx-utils: "
        "apt-get install -y ucx-utils)"]


def test_a_failing_ucx_run_is_a_note_not_an_error(monkeypatch, tmp_path):
    fake = tmp_path / "ucx_perftest"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(ucx, "PROGRAM", str(fake))
    got = ucx.ucx_rows(quick=True)
    assert got["skipped"].startswith("a ucx_perftest run failed: ")


def test_latency_wakeups_per_sample(run):
    lat = run["doc"]["latency"]
    w = lat["breakdown"]["wakeups_per_sample"]
    assert set(w) == {"target", "initiator", "client", "total"}
    # Every process takes part in a sample, but one wake-up may serve the tail of one
    # sample and the head of the next (the initiator was seen at 0.47 on a loaded
    # machine): each wakes for some, and together they wake more than once a sample.
    assert all(w[k] > 0.25 for k in ("target", "initiator", "client")), w
    assert w["total"] > 1.5, w
    assert math.isclose(w["total"], w["target"] + w["initiator"] + w["client"], abs_tol=0.02)
    assert "wake-ups per sample" in e2e_to_table(run["doc"])


# -- the SEND rows' credits -------------------------------------------------------------------

async def test_send_rows_never_outrun_the_targets_posted_receives(monkeypatch):
    """The SEND rows' application keeps credits: a SEND goes only against a receive the
    target's application has posted. With that application made slow (each reposting
    held 20 ms), a stream of 64 KiB SENDs completes with no RNR NAK and nothing
    retransmitted, and every message sent was received."""
    import dataclasses

    import softhca.client as sh
    from softhca.tools.bench import e2e

    slow = e2e._Pair._post_recvs

    async def held(self, n):
        await asyncio.sleep(0.02)
        await slow(self, n)

    opts = dataclasses.replace(bench.QUICK, seconds=0.5, mib=64.0, depth=16)
    async with sh.embedded() as tnode, sh.embedded() as inode:
        pair = await e2e._Pair.create("plain", tnode, inode, opts)
        monkeypatch.setattr(e2e._Pair, "_post_recvs", held)
        before = [await tnode.counters(), await inode.counters()]
        messages, _ = await pair._stream("SEND", 65536, 16, 0.5, 1 << 20)
        after = [await tnode.counters(), await inode.counters()]
    moved = {k: sum(after[j][k] - before[j][k] for j in (0, 1))
             for k in ("rnr_retries", "retransmitted_packets", "packets_sent")}
    # Far more messages than the receives first posted (4 x depth): credit came back.
    assert messages > 4 * 16, messages
    assert moved["rnr_retries"] == 0 and moved["retransmitted_packets"] == 0, moved
    assert moved["packets_sent"] >= messages * 16


def test_the_tcp_ceiling_is_the_best_of_three_streams(monkeypatch, tmp_path):
    """Each TCP ceiling is the fastest of TCP_TRIALS streams, all of their MB/s kept;
    --quick measures one."""
    import dataclasses
    import itertools

    from softhca.tools.bench import ceilings

    rates = itertools.cycle([300.0, 900.0, 600.0])

    def stream(size, seconds, budget, workdir):
        mb = next(rates)
        return {"wire_size": size, "messages": 1, "bytes": size, "seconds": 1.0, "mb_s": mb}

    monkeypatch.setattr(ceilings, "tcp_stream", stream)
    full = ceilings.tcp_ceilings(dataclasses.replace(bench.QUICK, quick=False), str(tmp_path),
                                 sizes=(4096,))
    assert ceilings.TCP_TRIALS == 3
    assert [c["trials_mb_s"] for c in full] == [[300.0, 900.0, 600.0]] * len(full)
    assert all(c["mb_s"] == 900.0 for c in full)
    assert all(c["app_mb_s"] == round(900.0 * 4096 / c["wire_size"], 1) for c in full)
    quick = ceilings.tcp_ceilings(bench.QUICK, str(tmp_path), sizes=(4096,))
    assert all(len(c["trials_mb_s"]) == 1 for c in quick)


def test_compare_by_the_figures_themselves(tmp_path, capsys):
    """--compare-ratio figure: new/saved is the MB/s (or us) of the new run over the saved
    one, computed here from the documents' figures; no ceiling enters."""
    saved, new = write(tmp_path, "saved.json", SAVED), write(tmp_path, "new.json", NEW)
    assert main(["bench", "--compare", saved, new, "--json", "--compare-ratio", "figure"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["ratio"] == "figure"
    by = {r["row"]: r for r in c["rows"]}
    assert math.isclose(by["RDMA_WRITE 1 MiB plain"]["ratio_of_ratios"], 400.0 / 80.0,
                        rel_tol=1e-3)
    assert math.isclose(by["RDMA_READ 4 KiB t10dif"]["ratio_of_ratios"], 7.5 / 9.0,
                        rel_tol=1e-3)
    p50 = by["latency 64 B p50"]
    assert p50["better"] == "lower" and math.isclose(p50["ratio_of_ratios"], 370.0 / 1010.0,
                                                      rel_tol=1e-3)
    assert not any(label.endswith("/ chain") for label in by)
    assert main(["bench", "--compare", saved, new, "--compare-ratio", "figure"]) == 0
    assert "ratio = the figure itself (MB/s, us; runs of one machine only)" in (
        capsys.readouterr().out)
