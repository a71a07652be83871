"""``softhca run`` killed with SIGKILL, which it cannot catch: the program's whole process
tree ends with it (its background children too), and what it left on disk (its run
directory: socket, sysfs tree) is removed by the next ``softhca run``; nothing of its
set-up stays in /tmp. Each run has a directory of the test's own as its TMPDIR, so runs
of other processes are never looked at; the host's /tmp must gain no set-up mount point
(softhca-dev.*, softhca-class.*, where an older softhca run made them)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import native
import pytest

pytestmark = pytest.mark.skipif(native.unavailable() is not None,
                                reason=native.unavailable() or "")
RUN = [sys.executable, "-m", "softhca.tools.cli", "run"]


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else int(fields[1])


def descendants(root: int) -> set[int]:
    """The live processes below ``root`` (by their parent links, read now)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            p = _ppid(int(d.name))
            if p is not None:
                parent[int(d.name)] = p
    out, frontier = set(), {root}
    while frontier:
        frontier = {c for c, p in parent.items() if p in frontier} - out
        out |= frontier
    return out


def _argv(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if _ppid(p) is not None}


def run_env(tmp: Path) -> dict[str, str]:
    """The environment of a ``softhca run`` whose temporary directory is ``tmp``."""
    return dict(os.environ, TMPDIR=str(tmp))


def start(tmp: Path, program: list[str]) -> subprocess.Popen:
    return subprocess.Popen([*RUN, "--", *program], env=run_env(tmp), cwd=native.REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def host_set_up_dirs() -> set[str]:
    """The set-up mount points in the host's /tmp (an older softhca run's)."""
    return {p.name for pat in ("softhca-dev.*", "softhca-class.*")
            for p in Path("/tmp").glob(pat)}


def until(cond, timeout: float, step: float = 0.01):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(step)
    return cond()


def next_run_cleans(tmp: Path) -> list[str]:
    """What is left in ``tmp`` (the runs' TMPDIR) after a next, whole ``softhca run``."""
    r = subprocess.run([*RUN, "--", "true"], env=run_env(tmp), cwd=native.REPO, timeout=60,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return sorted(p.name for p in tmp.iterdir())


def test_sigkill_ends_the_programs_whole_tree_and_the_next_run_cleans(tmp_path):
    before = host_set_up_dirs()
    proc = start(tmp_path, ["sh", "-c", "sleep 1000 & sleep 1000 & wait"])
    try:
        # Both: the first alone is not yet the tree the test kills (sh starts the second
        # after it).
        sleeps = until(lambda: (lambda got: got if len(got) == 2 else None)(
            {p for p in descendants(proc.pid) if _argv(p) == ["sleep", "1000"]}), 30)
        assert sleeps and len(sleeps) == 2, "the program's two sleeps never started"
        tree = descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        left = until(lambda: not alive(tree), 5) or alive(tree)
        assert left is True, {p: _argv(p) for p in alive(tree)}
    finally:
        with_kill = alive(descendants(proc.pid))
        for p in with_kill:
            os.kill(p, signal.SIGKILL)
        proc.kill()
    assert [p.name for p in tmp_path.glob("softhca-run.*")], "SIGKILL left no directory?"
    assert next_run_cleans(tmp_path) == []
    assert host_set_up_dirs() - before == set()


def test_sigkill_during_set_up_leaves_nothing_the_next_run_does_not_clean(tmp_path):
    before = host_set_up_dirs()
    proc = start(tmp_path, ["sleep", "1000"])
    try:
        # The moment the namespace's set-up runs: its script (named softhca-run) has
        # started and the program has not.
        assert until(lambda: any("softhca-run" in _argv(p) for p in descendants(proc.pid)),
                     30, step=0.001), "the set-up never started"
        assert not any(_argv(p) == ["sleep", "1000"] for p in descendants(proc.pid))
        tree = descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        time.sleep(0.5)
        tree |= {p for p in list(tree) for p in descendants(p)}
        left = until(lambda: not alive(tree), 5) or alive(tree)
        assert left is True, {p: _argv(p) for p in alive(tree)}
    finally:
        proc.kill()
    assert next_run_cleans(tmp_path) == []
    assert host_set_up_dirs() - before == set()
