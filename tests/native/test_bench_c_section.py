"""``softhca bench --c``'s section run for real, quick (qperf -t 1 a test, ib_send_lat -n
100, ib_write_bw -n 50, iscsicheck over 8 MiB where tgt is installed): two network namespaces, each side under ``softhca run``, every
row of the JSON present with a positive number, its ratio the figure over the TCP
ceiling of the same run, and nothing of it left behind."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest

from softhca.tools.bench import cprograms

LATENCIES = ("tcp_lat", "rc_lat")
BANDWIDTHS = ("tcp_bw", "rc_bw", "rc_rdma_write_bw")


def positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_the_quick_section_has_every_row():
    why = cprograms.unavailable()
    if why:
        pytest.skip(why)
    section = json.loads(json.dumps(cprograms.c_rows(quick=True)))
    assert "skipped" not in section, section["skipped"]
    q, p = section["qperf"], section["perftest"]
    assert set(q) == {*LATENCIES, *BANDWIDTHS}
    for test in LATENCIES:
        assert q[test]["size"] == 64 and positive(q[test]["latency_us"]), q[test]
    for test in BANDWIDTHS:
        assert q[test]["size"] == 65536 and positive(q[test]["mb_s"]), q[test]
    lat, bw = p["ib_send_lat"], p["ib_write_bw"]
    assert (lat["size"], lat["iterations"]) == (64, 100)
    assert all(positive(lat[k]) for k in ("typical_us", "avg_us", "p99_us")), lat
    assert (bw["size"], bw["iterations"]) == (1 << 20, 50) and positive(bw["mb_s"]), bw
    expected = {
        "rc_lat_to_tcp_lat": q["rc_lat"]["latency_us"] / q["tcp_lat"]["latency_us"],
        "ib_send_lat_to_tcp_lat": lat["typical_us"] / q["tcp_lat"]["latency_us"],
        "rc_bw_to_tcp_bw": q["rc_bw"]["mb_s"] / q["tcp_bw"]["mb_s"],
        "rc_rdma_write_bw_to_tcp_bw": q["rc_rdma_write_bw"]["mb_s"] / q["tcp_bw"]["mb_s"],
        "ib_write_bw_to_tcp_bw": bw["mb_s"] / q["tcp_bw"]["mb_s"]}
    if cprograms.iser_unavailable() is None:
        iser = section["iser"]
        assert "skipped" not in iser, iser["skipped"]
        for name in ("write", "read"):
            r = iser[name]
            assert (r["size"], r["bytes"]) == (256 << 10, 8 << 20), r
            assert positive(r["mb_s"]) and positive(r["seconds"]), r
            expected[f"iser_{name}_to_tcp_bw"] = r["mb_s"] / q["tcp_bw"]["mb_s"]
    else:
        assert section["iser"] == {"skipped": cprograms.iser_unavailable()}
    assert set(section["ratios"]) == set(expected)
    for name, value in expected.items():
        assert math.isclose(section["ratios"][name], value, rel_tol=1e-3), name
    assert section["setup"]["seconds"] < 60, section["setup"]
    # The namespaces are gone, and every process with them.
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"-{os.getpid()}-" not in names, names
