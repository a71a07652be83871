"""``softhca soak``: some seconds of valid traffic beside every attack in rotation."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

# Every attack: a co-tenant's packet injection, idle pre-HELLO sockets, fault rule
# floods, malformed frames, a huge interleaved layout, pipelined polls, an mr_read flood,
# duplicate READs and trains, a NAK storm, msgpack bombs, a subscriber that never reads,
# a tenant holding its connection share, a DEK flood.
ATTACKS = ("injection,idle_sockets,rule_flood,malformed,huge_layout,poll_flood,mr_read_flood,"
           "dup_read,dup_trains,nak_storm,msgpack_bomb,slow_subscriber,slot_hog,dek_flood")


def test_soak_runs_valid_traffic_beside_the_attacks_and_reports():
    """Two seconds, and past them until every attack has been tried once (a loaded machine
    takes longer, and still judges each one)."""
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "soak", "--seconds", "2",
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


def _cmdlines() -> list[list[str]]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    out.append([a.decode(errors="replace") for a in f.read().split(b"\0")])
    return out


def test_soak_runs_a_c_pair_through_the_provider_beside_the_unix_attacks():
    """The daemons serve UNIX sockets too; C programs run through the provider on them
    (``softhca run --target``) beside the Python pair, while the UNIX socket is flooded
    with idle connections and one process holds its uid's sessions."""
    from softhca.tools.soak_native import unavailable

    why = unavailable()
    if why:
        pytest.skip(f"the C pair cannot run here: {why}")
    attacks = "unix_idle,unix_hog,idle_sockets,slot_hog"
    # Two seconds, and past them until each attack was tried and each C program ran once.
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "soak", "--seconds", "2",
                        "--attacks", attacks, "--json"],
                       capture_output=True, text=True, timeout=240)
    # no program of the pair outlives the soak (softhca run on a soak's socket)
    left = [cmd for cmd in _cmdlines() if cmd[:1] == [sys.executable] and "--target" in cmd
            and "softhca-soak-" in cmd[cmd.index("--target") + 1]]
    assert not left, left
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


# -- the C pair's programs do not outlive the soak ------------------------------------------
# A stand-in for ``softhca run ... -- program`` (no root, no provider): a shell that
# writes its pid and its background child's to a file and then hangs, as a program
# spinning on the CQs of a daemon gone hangs.

class _Hanging:
    def __init__(self, tmp_path) -> None:
        self.pids = tmp_path / "pids"

    def pair(self, **kw):
        from softhca.tools.soak_native import CPair, CPairReport

        pids = self.pids

        class Hanging(CPair):
            def command(self, sock, argv):
                return ["sh", "-c", f'sleep 600 & echo $! $$ >> {pids}; wait']

        return Hanging(["target.sock", "initiator.sock"], CPairReport(), **kw)

    async def started(self, n: int = 1) -> list[int]:
        import asyncio
        for _ in range(200):
            if self.pids.exists() and len(self.pids.read_text().split()) >= 2 * n:
                return [int(p) for p in self.pids.read_text().split()]
            await asyncio.sleep(0.05)
        raise AssertionError("the stand-in never started")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process not yet dead (a zombie is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def _gone(pids: list[int]) -> list[int]:
    """The pids of ``pids`` still running a moment after (SIGKILL is not instant)."""
    import asyncio
    for _ in range(40):
        alive = [p for p in pids if _running(p)]
        if not alive:
            return []
        await asyncio.sleep(0.05)
    return alive


async def test_a_c_pair_program_past_its_timeout_is_killed_with_its_children(
        tmp_path, monkeypatch):
    import asyncio

    from softhca.tools import soak_native
    monkeypatch.setattr(soak_native, "RUN_TIMEOUT", 0.5)
    h = _Hanging(tmp_path)
    pair = h.pair(start_lock=asyncio.Lock())
    await pair.memcheck()
    assert pair.report.failures and "killed after 0.5 s" in pair.report.failures[0]
    pids = await h.started()
    try:
        assert await _gone(pids) == [], "a program or its child outlived its timeout"
        assert not pair.live
    finally:
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("after", [0.3, 1.5], ids=["pingpong_server_alone", "memcheck"])
async def test_a_cancelled_c_pair_kills_and_reaps_every_program(tmp_path, after):
    """The soak cancels the pair (another part of it failed, asyncio.run ends): the
    pingpong server waiting for its port, or memcheck, is killed with its children."""
    import asyncio

    from softhca.tools import soak_native
    h = _Hanging(tmp_path)
    pair = h.pair(start_lock=asyncio.Lock())
    if after > 1:
        # memcheck first, not the pingpong
        pair.pingpong = pair.memcheck
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(pair.loop(loop.time() + 600))
    pids = await h.started()
    await asyncio.sleep(0.2)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    try:
        assert await _gone(pids) == [], "a program or its child outlived the soak"
        assert not pair.live
        assert soak_native.RUN_TIMEOUT == 60.0      # not by its own timeout
    finally:
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_a_c_pair_program_dies_with_a_killed_soak(tmp_path):
    """The soak's process killed outright (its caller's timeout): the program it started
    gets SIGKILL too (softhca run passes that on to its own program)."""
    pids = tmp_path / "pids"
    script = f"""
import asyncio
from softhca.tools.soak_native import CPair, CPairReport

class Hanging(CPair):
    def command(self, sock, argv):
        return ["sh", "-c", "echo $$ >> {pids}; exec sleep 600"]

async def main():
    await Hanging(["t", "i"], CPairReport(), asyncio.Lock()).memcheck()

asyncio.run(main())
"""
    soak = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(200):
            if pids.exists() and pids.read_text().strip():
                break
            time.sleep(0.05)
        child = int(pids.read_text())
        assert _running(child)
    finally:
        soak.kill()
        soak.wait()
    try:
        for _ in range(40):
            if not _running(child):
                break
            time.sleep(0.05)
        assert not _running(child), "the program outlived its soak"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
