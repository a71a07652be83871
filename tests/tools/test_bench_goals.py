"""``softhca bench goals``: saved runs against the performance goals (tools/bench/goals.py).

The runs are small hand-written documents with only the members the goals read; each
expected median and factor is worked out here from the numbers written in the test, as
tools/bench/goals.py defines them: F = goal / median for a >= goal, median / goal for a <= goal."""

from __future__ import annotations

import json
import re

import pytest

from softhca.tools.bench import goals
from softhca.tools.cli import main

MIB = 1 << 20


def e2e_run(write_1m: float, read_1m: float, send_64k: float, write_4k: float,
            t10dif_1m: float, row_c_min: float, row_c_engine: float,
            chain: float | None, ucx: float | None = None, load=(0.2, 0.1, 0.1)) -> dict:
    """An end-to-end run with the goodput rows the goals read (ratios given), a plain
    1 MiB RDMA_WRITE at path MTU 1024 that must never be read in place of the 4096 one,
    and the latency ratio to the chain unless ``chain`` is None (a run saved before the
    chain was measured)."""
    def row(op, config, size, ratio, mtu=4096, **extra):
        r = {"op": op, "config": config, "size": size, "path_mtu": mtu, "mb_s": 100.0,
             "ceilings": {"tcp_stream": 1000.0, "engine": extra.pop("engine", 5000.0)},
             "ratio": {"tcp_stream": ratio, "engine": 0.02, "min": extra.pop("min", ratio)}}
        if ucx is not None and config == "plain":
            r["ratio"]["ucx_put"] = ucx
        return r

    doc = {"benchmark": "softhca end to end",
           "machine": {"load_average_at_start": list(load)},
           "setup": {"path_mtu": 4096},
           "goodput": [row("RDMA_WRITE", "plain", MIB, 0.01, mtu=1024),
                       row("RDMA_WRITE", "plain", MIB, write_1m),
                       row("RDMA_READ", "plain", MIB, read_1m),
                       row("SEND", "plain", 65536, send_64k),
                       row("RDMA_WRITE", "plain", 4096, write_4k),
                       row("RDMA_WRITE", "t10dif", MIB, t10dif_1m),
                       row("RDMA_WRITE", "row_c", MIB, 0.9, min=row_c_min,
                           engine=row_c_engine)],
           "latency": {"size": 64, "p50_us": 500.0, "ratio": {"p50_to_tcp_round_trip": 4.0}}}
    if chain is not None:
        doc["latency"]["ratio"]["p50_to_tcp_chain"] = chain
    if ucx is not None:
        doc["latency"]["ratio"]["p50_to_ucx_put"] = 20.0
    return doc


def engine_run(t10dif: float, crc32c: float, xts: float, row_c_tx: float,
               backend: str = "native") -> dict:
    names = ("T10-DIF generate, 512B blocks", "CRC32C generate, 4096B blocks",
             "AES-XTS-256 encrypt, 512B units", "row C TX: T10-DIF gen + XTS 520B")
    return {"benchmark": "engine", "machine": {"engine_backend": backend},
            "results": [{"name": n, "engine_mb_s": 1000.0 * r, "primitive_mb_s": 1000.0,
                         "ratio": r}
                        for n, r in zip(names, (t10dif, crc32c, xts, row_c_tx), strict=True)]}


def save(tmp_path, name: str, doc) -> str:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def table_rows(text: str) -> dict[str, list[str]]:
    """Every goals table's rows by figure: [goal, run 1, ..., min, median, verdict]."""
    out = {}
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("figure "):
            for row in lines[k + 2:]:
                if not row.strip() or row.startswith(("absent", "  ", "[")):
                    break
                cells = re.split(r"\s{2,}", row.strip())
                out[cells[0]] = cells[1:]
    return out


RUNS = [e2e_run(0.40, 0.85, 0.30, 0.04, 0.61, 0.35, 2400.0, chain=5.0),
        e2e_run(0.50, 0.95, 0.70, 0.05, 0.55, 0.65, 1500.0, chain=1.5),
        e2e_run(0.90, 0.75, 0.20, 0.06, 0.70, 0.50, 1900.0, chain=None)]


def test_each_goal_met_or_missed_by_its_factor(tmp_path, capsys):
    paths = [save(tmp_path, f"run{k}.json", d) for k, d in enumerate(RUNS, 1)]
    assert main(["bench", "goals", *paths]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    # (figure, goal text, the three cells, min, median, verdict), the medians by hand:
    # the middle of three, or the mean of the two a run without the field leaves.
    expected = {
        "plain RDMA_WRITE 1 MiB / TCP": (">= 0.8", ["0.4", "0.5", "0.9"], "0.4", "0.5",
                                         f"missed by {0.8 / 0.5:.3g}x"),
        "plain RDMA_READ 1 MiB / TCP": (">= 0.8", ["0.85", "0.95", "0.75"], "0.75", "0.85",
                                        "met"),
        "plain SEND 64 KiB / TCP": (">= 0.6", ["0.3", "0.7", "0.2"], "0.2", "0.3",
                                    f"missed by {0.6 / 0.3:.3g}x"),
        "plain RDMA_WRITE 4 KiB / TCP": (">= 0.5", ["0.04", "0.05", "0.06"], "0.04", "0.05",
                                         f"missed by {0.5 / 0.05:.3g}x"),
        "T10-DIF RDMA_WRITE 1 MiB / TCP": (">= 0.8", ["0.61", "0.55", "0.7"], "0.55", "0.61",
                                           f"missed by {0.8 / 0.61:.3g}x"),
        "row C RDMA_WRITE 1 MiB / TCP": (">= 0.8", ["0.9", "0.9", "0.9"], "0.9", "0.9", "met"),
        "row C RDMA_WRITE 1 MiB / lower ceiling": (">= 0.6", ["0.35", "0.65", "0.5"], "0.35",
                                                   "0.5", f"missed by {0.6 / 0.5:.3g}x"),
        "row C RDMA_WRITE 1 MiB: engine ceiling, MB/s": (">= 2000", ["2400", "1500", "1900"],
                                                         "1500", "1900",
                                                         f"missed by {2000 / 1900:.3g}x"),
        # A <= goal: the median of 5.0 and 1.5 is 3.25, 2.17 times the goal.
        "64-byte RDMA_WRITE p50 / TCP chain": ("<= 1.5x", ["5", "1.5", "absent"], "1.5",
                                               "3.25", f"missed by {3.25 / 1.5:.3g}x"),
    }
    for figure, (goal, cells, lo, median, verdict) in expected.items():
        assert rows[figure] == [goal, *cells, lo, median, verdict], figure
    # Run 3 was saved before the chain was measured: its cell and the line below say so.
    assert ('  run 3: no latency.ratio.p50_to_tcp_chain (64-byte RDMA_WRITE p50 / TCP '
            'chain)') in out
    # No UCX peer in any run: no UCX rows; no engine run: its goals not measured.
    assert "UCX" not in out
    assert "[engine bench] no run of `softhca bench engine --json` given: its 4 goals are " \
           "not measured" in out
    assert "[end to end, engine not recorded] 3 runs:" in out
    assert f"  run 1: {paths[0]} (load average at start 0.2 0.1 0.1)" in out


def test_a_le_goal_met_and_a_ge_goal_missed_by_the_other_formula(tmp_path, capsys):
    run = e2e_run(0.2, 0.8, 0.6, 0.5, 0.6, 0.6, 2000.0, chain=1.5)
    assert main(["bench", "goals", save(tmp_path, "r.json", run)]) == 0
    rows = table_rows(capsys.readouterr().out)
    # Exactly at each goal is met, both ways.
    for figure in ("plain RDMA_READ 1 MiB / TCP", "plain SEND 64 KiB / TCP",
                   "plain RDMA_WRITE 4 KiB / TCP", "64-byte RDMA_WRITE p50 / TCP chain",
                   "row C RDMA_WRITE 1 MiB: engine ceiling, MB/s"):
        assert rows[figure][-1] == "met", figure
    assert rows["plain RDMA_WRITE 1 MiB / TCP"][-1] == "missed by 4x"
    # A <= goal met below it.
    run = e2e_run(0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 9000.0, chain=0.5)
    rep = goals.report([save(tmp_path, "r2.json", run)])
    # ... and the C programs' goals not judged: the run has no --c section.
    assert [r["verdict"] for r in rep["groups"][0]["rows"]] == ["met"] * 9 + ["not judged"] * 7


def test_engine_runs_and_the_json_document(tmp_path, capsys):
    runs = [engine_run(0.7, 0.3, 1.2, 0.24), engine_run(0.8, 0.9, 0.7, 0.2),
            engine_run(0.1, 0.2, 0.1, 0.1, backend="python")]
    paths = [save(tmp_path, f"e{k}.json", d) for k, d in enumerate(runs, 1)]
    e2e = save(tmp_path, "e2e.json", RUNS[0])
    # Either bench in any order: each file's own "benchmark" says which it is; the
    # Python engine's run is judged apart from the native ones.
    assert main(["bench", "goals", paths[0], e2e, paths[2], paths[1], "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [(g["bench"], g["engine_backend"], [r["file"] for r in g["runs"]])
            for g in rep["groups"]] == [("softhca end to end", None, [e2e]),
                                        ("engine", "native", [paths[0], paths[1]]),
                                        ("engine", "python", [paths[2]])]
    by = {r["figure"]: r for r in rep["groups"][1]["rows"]}
    r = by["engine CRC32C 4 KiB / one call"]
    assert r["values"] == [0.3, 0.9] and r["median"] == (0.3 + 0.9) / 2 and r["min"] == 0.3
    assert r["goal"] == {"op": ">=", "value": 0.5} and r["verdict"] == "met"
    r = by["engine row C TX / one call each"]
    assert r["verdict"] == "missed" and r["factor"] == pytest.approx(0.3 / ((0.24 + 0.2) / 2))
    assert r["field"] == 'results[name="row C TX: T10-DIF gen + XTS 520B"].ratio'
    e2e_rows = {r["figure"]: r for r in rep["groups"][0]["rows"]}
    assert e2e_rows["plain RDMA_WRITE 1 MiB / TCP"]["values"] == [0.4]
    # The Python engine's run alone.
    assert main(["bench", "goals", paths[2]]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows["engine AES-XTS-256 512 B / one context"][-1] == f"missed by {0.4 / 0.1:.3g}x"
    assert f"[engine bench, python engine] 1 run:\n  run 1: {paths[2]}\n" in out
    assert "[end to end] no run of `softhca bench --json` given: its 16 goals" in out


def test_the_ucx_ratios_when_a_run_has_them(tmp_path, capsys):
    with_ucx = e2e_run(0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2000.0, chain=3.0, ucx=1.5)
    without = e2e_run(0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2000.0, chain=3.0)
    assert main(["bench", "goals", save(tmp_path, "a.json", with_ucx),
                 save(tmp_path, "b.json", without)]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert rows["plain SEND 64 KiB / UCX put"] == ["-", "1.5", "absent", "1.5", "1.5",
                                                   "no goal"]
    assert rows["64-byte RDMA_WRITE p50 / UCX put round trip"][:3] == ["-", "20", "absent"]
    assert '  run 2: no goodput[op="SEND", config="plain", size=65536, path_mtu=4096]' \
           '.ratio.ucx_put (plain SEND 64 KiB / UCX put)' in out


def test_rows_saved_without_a_path_mtu_ran_at_the_setups():
    run = e2e_run(0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2000.0, chain=3.0)
    for row in run["goodput"]:
        if row["path_mtu"] == 4096:
            del row["path_mtu"]
    assert goals.lookup(run, goals.GOALS[0].field) == 0.5
    # At a setup of 1024 those rows are not the 4096 ones the goals name.
    run["setup"]["path_mtu"] = 1024
    with pytest.raises(goals.Absent, match=r'no goodput\[op="RDMA_WRITE"'):
        goals.lookup(run, goals.GOALS[0].field)


def test_a_field_that_is_not_a_number_is_absent_not_a_crash(tmp_path, capsys):
    run = e2e_run(0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 2000.0, chain=3.0)
    write_1m = next(r for r in run["goodput"] if r["op"] == "RDMA_WRITE" and r["size"] == MIB
                    and r["path_mtu"] == 4096 and r["config"] == "plain")
    write_1m["ratio"]["tcp_stream"] = "fast"
    run["latency"] = [1, 2]
    run["machine"]["engine_backend"] = ["native"]
    del run["goodput"][-1]["ceilings"]
    assert main(["bench", "goals", save(tmp_path, "odd.json", run)]) == 0
    out = capsys.readouterr().out
    rows = table_rows(out)
    for figure in ("plain RDMA_WRITE 1 MiB / TCP", "64-byte RDMA_WRITE p50 / TCP chain",
                   "row C RDMA_WRITE 1 MiB: engine ceiling, MB/s"):
        assert rows[figure][1:] == ["absent", "-", "-", "not measured (no run has it)"], figure
    assert 'ratio.tcp_stream is not a number ("fast")' in out
    assert "  run 1: no latency.ratio (64-byte RDMA_WRITE p50 / TCP chain)" in out
    assert "[end to end, engine not recorded] 1 run:" in out


@pytest.mark.parametrize("content, reason", [
    (None, "no such file"),
    ("{", "not JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
    ('{"benchmark": "other"}', "not a saved `softhca bench --json` or `softhca bench "
                               "engine --json` document"),
    ("[1]", "not a saved `softhca bench --json`"),
])
def test_a_file_it_cannot_read_is_refused(tmp_path, capsys, content, reason):
    path = str(tmp_path / "x.json") if content is None else save(tmp_path, "x.json", content)
    good = save(tmp_path, "good.json", RUNS[0])
    assert main(["bench", "goals", good, path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"softhca bench goals: {reason}")
    assert captured.err.rstrip().endswith(path)


def test_the_goals_table_holds_the_performance_goals():
    # Written out from the goals' table (docs/performance.md), independently of the module's wording.
    judged = {(g.field[-1] if g.kind == "softhca end to end" else g.field[1]["name"],
               g.op, g.goal) for g in goals.GOALS if g.op is not None}
    assert sum(g.op is not None for g in goals.GOALS) == 20
    assert ("p50_to_tcp_chain", "<=", 1.5) in judged
    assert ("engine", ">=", 2000.0) in judged
    assert {("T10-DIF generate, 512B blocks", ">=", 0.3),
            ("CRC32C generate, 4096B blocks", ">=", 0.5),
            ("AES-XTS-256 encrypt, 512B units", ">=", 0.4),
            ("row C TX: T10-DIF gen + XTS 520B", ">=", 0.3)} <= judged
    sizes = sorted((g.field[1]["op"], g.field[1]["config"], g.field[1]["size"], g.goal)
                   for g in goals.GOALS if g.op == ">=" and g.field[0] == "goodput"
                   and g.field[-1] == "tcp_stream")
    assert sizes == sorted([("RDMA_WRITE", "plain", MIB, 0.8), ("RDMA_READ", "plain", MIB, 0.8),
                            ("SEND", "plain", 65536, 0.6), ("RDMA_WRITE", "plain", 4096, 0.5),
                            ("RDMA_WRITE", "t10dif", MIB, 0.8),
                            ("RDMA_WRITE", "row_c", MIB, 0.8)])
