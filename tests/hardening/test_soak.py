"""``softhca soak``: some seconds of valid traffic beside every attack in rotation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Every attack: a co-tenant's packet injection, idle pre-HELLO sockets, fault rule
# floods, malformed frames, a huge interleaved layout, pipelined polls, an mr_read flood,
# duplicate READs and trains, a NAK storm, msgpack bombs, a subscriber that never reads,
# a tenant holding its connection share, a DEK flood.
ATTACKS = ("injection,idle_sockets,rule_flood,malformed,huge_layout,poll_flood,mr_read_flood,"
           "dup_read,dup_trains,nak_storm,msgpack_bomb,slow_subscriber,slot_hog,dek_flood")


def test_soak_runs_valid_traffic_beside_the_attacks_and_reports():
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "soak", "--seconds", "16",
                        "--attacks", ATTACKS, "--json"],
                       capture_output=True, text=True, timeout=180)
    report = json.loads(r.stdout)
    print(f"\n{json.dumps(report, sort_keys=True)}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert report["valid_wrs"] > 0 and report["verify_failures"] == 0
    assert report["bytes_verified"] == report["valid_wrs"] * 65536
    assert set(report["attacks"]) == set(ATTACKS.split(","))
    assert all(a["tried"] == a["refused"] >= 1 for a in report["attacks"].values())
    assert report["attacks_refused"] == sum(a["tried"] for a in report["attacks"].values())
    assert 0 < report["peak_rss"]["target"] < 400 << 20, "bounded, and measured"
    assert report["peak_rss"]["initiator"] > 0
    assert report["probe_max_ms"] > 0


def test_soak_refuses_an_unknown_attack():
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "soak", "--attacks",
                        "injection,teleport"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown attack(s) teleport" in r.stderr


def test_soak_runs_a_c_pair_through_the_provider_beside_the_unix_attacks():
    """The daemons serve UNIX sockets too; C programs run through the provider on them
    (``softhca run --target``) beside the Python pair, while the UNIX socket is flooded
    with idle connections and one process holds its uid's sessions."""
    from softhca.tools.soak_native import unavailable

    why = unavailable()
    if why:
        pytest.skip(f"the C pair cannot run here: {why}")
    attacks = "unix_idle,unix_hog,idle_sockets,slot_hog"
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "soak", "--seconds", "20",
                        "--attacks", attacks, "--json"],
                       capture_output=True, text=True, timeout=240)
    report = json.loads(r.stdout)
    print(f"\n{json.dumps(report, sort_keys=True)}")
    assert r.returncode == 0, r.stdout + r.stderr
    pair = report["c_pair"]
    assert not pair["skipped"] and not pair["failures"], pair
    runs = pair["runs"]
    assert runs.get("ibv_rc_pingpong", 0) >= 1 and runs.get("memcheck", 0) >= 1, pair
    # memcheck transfer checks three 10,000-byte transfers and the 512 bytes on each
    # side of their targets (provider/tests/memcheck.c's LEN and HALO); ibv_rc_pingpong
    # moves 2 x size x iters bytes a run (4096 x 200 here).
    assert pair["bytes_checked"] == runs["memcheck"] * 3 * (10000 + 2 * 512), pair
    assert pair["bytes_moved"] == runs["ibv_rc_pingpong"] * 2 * 4096 * 200, pair
    assert set(report["attacks"]) == set(attacks.split(","))
    assert all(a["tried"] == a["refused"] >= 1 for a in report["attacks"].values())
    assert report["verify_failures"] == 0 and report["valid_wrs"] > 0
