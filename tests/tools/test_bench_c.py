"""``softhca bench --c`` (tools/bench/cprograms.py): reading qperf's and perftest's output,
the ratios, the table, ``--compare`` and ``softhca bench goals`` on the section.

The outputs are real ones, captured here (tests/data/bench_c/): ``client_quick.out`` is
the client side of one quick section (qperf's five tests and perftest's two clients
between two network namespaces, each side under ``softhca run``); ``qperf_tcp_bw_lat.out`` one qperf client running tcp_bw and tcp_lat
between the namespaces (no softhca); ``qperf_rc_bw_no_device.out`` qperf -cm1 rc_bw with
no RDMA device on the server's side. Every expected value is read off those files by
eye and written here, with the programs' units: qperf's steps by 1000, perftest's
"MB/sec" by 2^20."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from softhca.tools.bench import cprograms, goals, output
from softhca.tools.bench.compare import CompareError, compare_rows
from softhca.tools.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "bench_c"
MIB = 1 << 20
FIVE = ("rc_lat_to_tcp_lat", "ib_send_lat_to_tcp_lat", "rc_bw_to_tcp_bw",
        "rc_rdma_write_bw_to_tcp_bw", "ib_write_bw_to_tcp_bw")


def fixture(name: str) -> str:
    return (DATA / name).read_text()


def test_each_section_of_a_real_client_run():
    found = cprograms.sections(fixture("client_quick.out"))
    assert set(found) == {"tcp_lat", "rc_lat", "tcp_bw", "rc_bw", "rc_rdma_write_bw",
                          "ib_send_lat", "ib_write_bw", "iscsicheck"}
    assert all(status == 0 for status, _ in found.values())
    # "latency = 9.03 us", "2.87 ms", "bw = 848 MB/sec", "32.3 MB/sec", "47.6 MB/sec"
    assert cprograms.qperf_figure(found["tcp_lat"][1]) == ("latency", 9.03)
    name, us = cprograms.qperf_figure(found["rc_lat"][1])
    assert name == "latency" and math.isclose(us, 2870.0)
    assert cprograms.qperf_figure(found["tcp_bw"][1]) == ("bw", 848.0)
    name, mb = cprograms.qperf_figure(found["rc_bw"][1])
    assert name == "bw" and math.isclose(mb, 32.3)
    name, mb = cprograms.qperf_figure(found["rc_rdma_write_bw"][1])
    assert name == "bw" and math.isclose(mb, 47.6)


def test_qperf_gigabytes_and_one_figure_per_test():
    text = fixture("qperf_tcp_bw_lat.out")
    bw, lat = text.split("tcp_lat:")
    # "bw = 1.17 GB/sec": 1.17e9 bytes a second, 1170 MB/s of 1e6 bytes.
    name, mb = cprograms.qperf_figure(bw)
    assert name == "bw" and math.isclose(mb, 1170.0)
    assert cprograms.qperf_figure(lat) == ("latency", 25.9)
    # Two tests' output is not one test's figure.
    with pytest.raises(cprograms.ParseError, match="no single figure"):
        cprograms.qperf_figure(text)


def test_a_failed_qperf_test_has_no_figure():
    with pytest.raises(cprograms.ParseError, match="rdma_create_event_channel failed"):
        cprograms.qperf_figure(fixture("qperf_rc_bw_no_device.out"))
    with pytest.raises(cprograms.ParseError, match="unit 'parsecs/sec'"):
        cprograms.qperf_figure("rc_bw:\n    bw  =  3 parsecs/sec\n")


def test_perftest_rows():
    found = cprograms.sections(fixture("client_quick.out"))
    # " 64      100          665.34         7296.50      1381.80  1777.61  986.69  7296.50 ..."
    assert cprograms.send_lat_figures(found["ib_send_lat"][1], 64, 100) == {
        "size": 64, "iterations": 100, "typical_us": 1381.80, "avg_us": 1777.61,
        "p99_us": 7296.50}
    # " 1048576    50   305.12   305.12   0.000305": BW average 305.12 x 2^20 bytes/s.
    bw = cprograms.write_bw_figures(found["ib_write_bw"][1], MIB, 50)
    assert bw == {"size": MIB, "iterations": 50, "mb_s": round(305.12 * 1048576 / 1e6, 1)}
    assert bw["mb_s"] == 319.9
    # A row of other iterations or size is not the one asked for.
    with pytest.raises(cprograms.ParseError, match="no row of 1048576 bytes x 1000"):
        cprograms.write_bw_figures(found["ib_write_bw"][1], MIB, 1000)
    with pytest.raises(cprograms.ParseError, match="no row of 4096 bytes x 100"):
        cprograms.send_lat_figures(found["ib_send_lat"][1], 4096, 100)


def test_the_whole_section_and_its_ratios():
    section = cprograms._figures(cprograms.QUICK, fixture("client_quick.out"))
    assert section["qperf"] == {
        "tcp_lat": {"size": 64, "latency_us": 9.03}, "rc_lat": {"size": 64, "latency_us": 2870.0},
        "tcp_bw": {"size": 65536, "mb_s": 848.0}, "rc_bw": {"size": 65536, "mb_s": 32.3},
        "rc_rdma_write_bw": {"size": 65536, "mb_s": 47.6}}
    # Without the iSER rows (a run where tgt is missing): their ratios are not there.
    assert set(cprograms.ratios(section)) == set(FIVE)
    section["iser"] = cprograms._iser_figures(cprograms.QUICK, fixture("client_quick.out"))
    r = cprograms.ratios(section)
    expected = {"rc_lat_to_tcp_lat": 2870.0 / 9.03, "ib_send_lat_to_tcp_lat": 1381.80 / 9.03,
                "rc_bw_to_tcp_bw": 32.3 / 848.0, "rc_rdma_write_bw_to_tcp_bw": 47.6 / 848.0,
                "ib_write_bw_to_tcp_bw": 319.9 / 848.0, "iser_write_to_tcp_bw": 16.2 / 848.0,
                "iser_read_to_tcp_bw": 41.4 / 848.0}
    assert set(r) == set(expected)
    for name, value in expected.items():
        assert math.isclose(r[name], value, rel_tol=1e-3), name


def test_iscsichecks_two_passes():
    found = cprograms.sections(fixture("client_quick.out"))
    # "wrote 8388608 bytes in 0.52 s (16.2 MB/s)", "read 8388608 bytes in 0.20 s (41.4 MB/s)"
    assert cprograms.iscsicheck_figures(found["iscsicheck"][1], 8 * MIB) == {
        "write": {"size": 262144, "bytes": 8388608, "seconds": 0.52, "mb_s": 16.2},
        "read": {"size": 262144, "bytes": 8388608, "seconds": 0.20, "mb_s": 41.4}}
    with pytest.raises(cprograms.ParseError, match="wrote 8388608 bytes, not 67108864"):
        cprograms.iscsicheck_figures(found["iscsicheck"][1], 64 * MIB)
    failed = found["iscsicheck"][1].replace("compare ok:", "compare FAILED:")
    with pytest.raises(cprograms.ParseError, match="no compare ok"):
        cprograms.iscsicheck_figures(failed, 8 * MIB)
    # In the section, a failed iSER run is a note; the rest stands.
    text = fixture("client_quick.out").replace("=== iscsicheck exit 0", "=== iscsicheck exit 1")
    assert cprograms._iser_figures(cprograms.QUICK, text)["skipped"].startswith(
        "iscsicheck failed: iscsicheck exited 1")
    # ... with what tgtd and tgtadm said on the server's side, where they said it.
    served = "qperf's\n--- tgtd and tgtadm:\ntgtadm: can't find the target\n"
    note = cprograms._iser_figures(cprograms.QUICK, text, served)["skipped"]
    assert note.endswith("--- tgtd and tgtadm said:\ntgtadm: can't find the target\n"), note


def test_a_failed_section_names_the_program():
    text = fixture("client_quick.out").replace("=== rc_bw exit 0", "=== rc_bw exit 1")
    with pytest.raises(cprograms.ParseError, match="rc_bw exited 1"):
        cprograms._figures(cprograms.QUICK, text)
    cut = fixture("client_quick.out").split("=== ib_write_bw\n")[0]
    with pytest.raises(cprograms.ParseError, match="ib_write_bw printed no section"):
        cprograms._figures(cprograms.QUICK, cut)


def section_doc() -> dict:
    section = cprograms._figures(cprograms.QUICK, fixture("client_quick.out"))
    section["iser"] = cprograms._iser_figures(cprograms.QUICK, fixture("client_quick.out"))
    section["ratios"] = cprograms.ratios(section)
    section["setup"] = {"plan": {"qperf_seconds": 1, "send_lat_iterations": 100,
                                 "write_bw_iterations": 50, "iser_mib": 8}}
    return section


def test_the_table_lines():
    lines = output.c_lines({"c_programs": section_doc()})
    assert lines[0].startswith("C programs (--c): qperf, perftest and iSER between two ")
    assert "qperf -t 1 s a test, ib_send_lat -n 100, ib_write_bw -n 50, iscsicheck 8 MiB" \
        in lines[0]
    rows = {line.split("  ")[1].strip(): line for line in lines[3:]}
    assert len(rows) == 7
    assert "2870.0 us" in rows["qperf -cm1 rc_lat 64 B"]
    assert "tcp_lat 9.0 us" in rows["qperf -cm1 rc_lat 64 B"]
    assert rows["qperf -cm1 rc_lat 64 B"].rstrip().endswith(f"{2870 / 9.03:.3g}")
    assert rows["perftest ib_write_bw -s 1M, average"].rstrip().endswith(f"{319.9 / 848:.3g}")
    assert rows["iSER READ(16) 256 KiB, one in flight"].rstrip().endswith(f"{41.4 / 848:.3g}")
    no_iser = section_doc()
    no_iser["iser"] = {"skipped": "tgtd not installed"}
    lines = output.c_lines({"c_programs": no_iser})
    assert len(lines) == 3 + 5 + 1 and lines[-1] == "  iSER: skipped: tgtd not installed"
    assert output.c_lines({}) == []
    assert output.c_lines({"c_programs": {"skipped": "needs root"}}) == [
        "C programs (--c): skipped: needs root"]


def e2e(section: dict | None) -> dict:
    doc = {"benchmark": "softhca end to end", "setup": {"path_mtu": 4096},
           "goodput": [{"op": "RDMA_WRITE", "config": "plain", "size": MIB, "path_mtu": 4096,
                        "mb_s": 100.0, "ratio": {"tcp_stream": 0.1, "engine": 0.01,
                                                 "min": 0.1}}]}
    if section is not None:
        doc["c_programs"] = section
    return doc


def test_compare_rows_of_the_section():
    rows = compare_rows(e2e(section_doc()))
    lat = rows["C qperf -cm1 rc_lat 64 B"]
    assert lat["figure"] == 2870.0 and lat["unit"] == "us" and lat["better"] == "lower"
    assert math.isclose(lat["ratio"], 2870 / 9.03, rel_tol=1e-3)
    bw = rows["C qperf -cm1 rc_rdma_write_bw 64 KiB"]
    assert bw["figure"] == 47.6 and bw["better"] == "higher"
    iser = rows["C iSER WRITE(16) 256 KiB, one in flight"]
    assert iser["figure"] == 16.2 and math.isclose(iser["ratio"], 16.2 / 848, rel_tol=1e-3)
    assert compare_rows(e2e(section_doc()), "figure")["C qperf -cm1 rc_bw 64 KiB"][
        "ratio"] == 32.3
    # A run whose iSER rows were skipped (or saved before them) has the other five.
    no_iser = section_doc()
    no_iser["iser"] = {"skipped": "tgtd not installed"}
    no_iser["ratios"] = cprograms.ratios(no_iser)
    assert len([k for k in compare_rows(e2e(no_iser)) if k.startswith("C ")]) == 5
    # No section, or a skipped one: no rows of it.
    assert not any(k.startswith("C ") for k in compare_rows(e2e(None)))
    assert not any(k.startswith("C ") for k in compare_rows(e2e({"skipped": "x"})))
    broken = section_doc()
    broken["ratios"]["rc_bw_to_tcp_bw"] = "fast"
    with pytest.raises(CompareError, match="ratios.rc_bw_to_tcp_bw"):
        compare_rows(e2e(broken))


def test_compare_table_shows_the_change(tmp_path, capsys):
    saved, new = section_doc(), section_doc()
    new["ratios"]["rc_bw_to_tcp_bw"] = 0.2
    paths = []
    for name, s in (("saved.json", saved), ("new.json", new)):
        (tmp_path / name).write_text(json.dumps(e2e(s)))
        paths.append(str(tmp_path / name))
    assert main(["bench", "--compare", *paths]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("C qperf -cm1 rc_bw 64 KiB"))
    assert f"{0.2 / (32.3 / 848):.4g}" in line and line.rstrip().endswith("higher")


# -- softhca bench goals -----------------------------------------------------------------

C_FIGURES = ("C: qperf rc_lat / tcp_lat", "C: ib_send_lat 64 B typical / tcp_lat",
             "C: qperf rc_bw 64 KiB / tcp_bw", "C: qperf rc_rdma_write_bw 64 KiB / tcp_bw",
             "C: ib_write_bw 1 MiB / tcp_bw", "C: iSER WRITE 256 KiB / tcp_bw",
             "C: iSER READ 256 KiB / tcp_bw")


def c_run(rc_lat: float, send_lat: float, rc_bw: float, write_bw: float,
          ib_write: float, iser: tuple[float, float] | None = None) -> dict:
    """A run with the section's ratios (written, as a saved run holds them); the iSER
    ones only when ``iser`` (write, read) is given."""
    ratios = {"rc_lat_to_tcp_lat": rc_lat, "ib_send_lat_to_tcp_lat": send_lat,
              "rc_bw_to_tcp_bw": rc_bw, "rc_rdma_write_bw_to_tcp_bw": write_bw,
              "ib_write_bw_to_tcp_bw": ib_write}
    if iser is not None:
        ratios.update(iser_write_to_tcp_bw=iser[0], iser_read_to_tcp_bw=iser[1])
    return e2e({"ratios": ratios})


def goal_rows(tmp_path, capsys, runs: list[dict]) -> tuple[dict, str]:
    paths = []
    for k, doc in enumerate(runs):
        (tmp_path / f"r{k}.json").write_text(json.dumps(doc))
        paths.append(str(tmp_path / f"r{k}.json"))
    assert main(["bench", "goals", *paths]) == 0
    out = capsys.readouterr().out
    rows = {}
    for line in out.splitlines():
        if line.startswith("C: "):
            cells = [c.strip() for c in line.split("  ") if c.strip()]
            rows[cells[0]] = cells[1:]
    return rows, out


def test_the_goals_of_the_section(tmp_path, capsys):
    runs = [c_run(3.0, 1.5, 0.7, 0.5, 0.95, iser=(0.3, 0.6)),
            c_run(1.0, 2.5, 0.4, 0.8, 0.5, iser=(0.5, 0.2)), e2e(None)]
    rows, out = goal_rows(tmp_path, capsys, runs)
    # The medians of the two runs that have the section, by hand; the third is not judged.
    expected = {
        "C: qperf rc_lat / tcp_lat": ("<= 2x", ["3", "1"], "1", "2", "met"),
        "C: ib_send_lat 64 B typical / tcp_lat": ("<= 2x", ["1.5", "2.5"], "1.5", "2",
                                                  "met"),
        "C: qperf rc_bw 64 KiB / tcp_bw": (">= 0.6", ["0.7", "0.4"], "0.4", "0.55",
                                           f"missed by {0.6 / 0.55:.3g}x"),
        "C: qperf rc_rdma_write_bw 64 KiB / tcp_bw": (">= 0.7", ["0.5", "0.8"], "0.5", "0.65",
                                                      f"missed by {0.7 / 0.65:.3g}x"),
        "C: ib_write_bw 1 MiB / tcp_bw": (">= 0.9", ["0.95", "0.5"], "0.5", "0.725",
                                          f"missed by {0.9 / 0.725:.3g}x"),
        "C: iSER WRITE 256 KiB / tcp_bw": (">= 0.5", ["0.3", "0.5"], "0.3", "0.4",
                                           f"missed by {0.5 / 0.4:.3g}x"),
        "C: iSER READ 256 KiB / tcp_bw": (">= 0.5", ["0.6", "0.2"], "0.2", "0.4",
                                          f"missed by {0.5 / 0.4:.3g}x"),
    }
    for figure, (goal, cells, lo, median, verdict) in expected.items():
        assert rows[figure] == [goal, *cells, "not judged", lo, median, verdict], figure
    assert ("  run 3: not judged: no c_programs section (a run without `softhca bench --c`) "
            "(C: qperf rc_lat / tcp_lat)") in out


def test_a_le_goal_missed_and_runs_without_the_section(tmp_path, capsys):
    rows, out = goal_rows(tmp_path, capsys, [c_run(4.0, 2.0, 0.6, 0.7, 0.9, iser=(0.5, 0.9))])
    # Exactly at a goal is met; 4.0 against <= 2 is missed by 4 / 2.
    assert rows["C: qperf rc_lat / tcp_lat"][-1] == "missed by 2x"
    assert [rows[f][-1] for f in C_FIGURES[1:]] == ["met"] * 6
    # A section without the iSER rows (tgt not installed): those two are absent.
    rows, out = goal_rows(tmp_path, capsys, [c_run(1.0, 1.0, 1.0, 1.0, 1.0)])
    assert rows["C: iSER READ 256 KiB / tcp_bw"][1:] == ["absent", "-", "-",
                                                         "not measured (no run has it)"]
    assert "run 1: no c_programs.ratios.iser_read_to_tcp_bw" in out
    rows, out = goal_rows(tmp_path, capsys, [e2e(None), e2e({"skipped": "needs root"})])
    for figure in C_FIGURES:
        assert rows[figure] == [rows[figure][0], "not judged", "not judged", "-", "-",
                                "not judged (no run has its section)"], figure
    assert "its c_programs section was skipped: needs root" in out
    rep = goals.report([str(tmp_path / "r0.json")])
    row = next(r for r in rep["groups"][0]["rows"] if r["figure"] == C_FIGURES[4])
    assert row["verdict"] == "not judged" and row["not_judged"] == [True]
    assert row["field"] == "c_programs.ratios.ib_write_bw_to_tcp_bw"


def test_the_goals_are_the_briefs():
    # Written out from the goals' table (docs/performance.md), apart from the module.
    c = {(g.field[-1], g.op, g.goal) for g in goals.GOALS if g.section == "c_programs"}
    assert c == {("rc_lat_to_tcp_lat", "<=", 2.0), ("ib_send_lat_to_tcp_lat", "<=", 2.0),
                 ("rc_bw_to_tcp_bw", ">=", 0.6), ("rc_rdma_write_bw_to_tcp_bw", ">=", 0.7),
                 ("ib_write_bw_to_tcp_bw", ">=", 0.9), ("iser_write_to_tcp_bw", ">=", 0.5),
                 ("iser_read_to_tcp_bw", ">=", 0.5)}
    assert {name for name, _, _ in cprograms.RATIOS} == {f for f, _, _ in c}


def test_the_flag(capsys):
    assert main(["bench", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--c " in text and "qperf -cm1 rc_lat" in text


def test_skipped_saying_why(monkeypatch):
    monkeypatch.setattr(cprograms.namespaces.os, "geteuid", lambda: 1000)
    assert cprograms.c_rows(quick=True) == {
        "skipped": "needs root (network namespaces, and softhca run's mount namespace)"}
    monkeypatch.undo()
    if cprograms.namespaces.unavailable() is not None:
        pytest.skip(cprograms.namespaces.unavailable())
    real = cprograms.shutil.which
    monkeypatch.setattr(cprograms.shutil, "which",
                        lambda p: None if p in ("qperf", "ib_write_bw") else real(p))
    assert cprograms.c_rows(quick=True)["skipped"] == (
        "qperf, ib_write_bw not installed (Debian's qperf and perftest)")


def test_the_flag_reaches_the_bench(monkeypatch, capsys):
    from softhca.tools import bench

    seen = []

    def run_e2e(opts, progress):
        seen.append(opts)
        raise bench.BenchError("stopped here")

    monkeypatch.setattr(bench, "run_e2e", run_e2e)
    assert main(["bench", "--quick", "--c"]) == 1
    assert main(["bench", "--quick"]) == 1
    assert [o.c_programs for o in seen] == [True, False]
    assert "softhca bench: stopped here" in capsys.readouterr().err
