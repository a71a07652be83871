"""ibv_reg_mr's move of a program's pages onto a memfd, and what fork does to a
session (provider/tests/regcheck.c): completions that arrive during the move are all
polled; the memfds of every registration go over one connection the context keeps; a
forked child's verbs calls fail EIO at once, and its ibv_close_device leaves the
parent's connections whole; a forked and exec'ed child that keeps its parent's control
session cannot have the daemon map its parent's memory."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import native
import pytest

REGCHECK = native.REPO / "provider" / "build" / "regcheck"
THIEF = Path(__file__).resolve().parents[1] / "support" / "memfd_thief.py"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("registration")) as p:
        yield p


def test_completions_arriving_during_reg_mr_are_all_polled(where):
    r = where.run(where.server, [str(REGCHECK), "lost"], timeout=120)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for line in ("the provider's CQ object is not inside the range of malloc's heap a "
                 "program registers",
                 "ibv_reg_mr of the 64 MiB range succeeded 16 times of 16 (0 refused)",
                 "512 completions polled of 512 posted (0 lost, 0 in error)",
                 "a WRITE after completes"):
        assert f"regcheck: ok: {line}" in r.output, r.output


def test_a_forked_childs_verbs_fail_eio_at_once(where):
    r = where.run(where.server, [str(REGCHECK), "fork"], timeout=60)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for verb, rc in (("ibv_post_send", 5), ("ibv_poll_cq", -5), ("ibv_post_recv", 5),
                     ("ibv_reg_mr", 5)):
        assert f"regcheck: ok: child: {verb} returns {rc} (Input/output error)" in r.output, \
            r.output
    assert "regcheck: ok: parent: its QP still completes a WRITE" in r.output, r.output
    # the child's ibv_close_device closed its copies of the parent's connections without
    # shutting them down: the parent's memfd connection is the one it kept
    assert "regcheck: ok: child: ibv_close_device returns 0" in r.output, r.output
    assert ("regcheck: ok: parent: ibv_reg_mr after the child closed its copy of the "
            "context succeeds on the same 2 connections to the daemon") in r.output, r.output
    # the child was told why, naming fork, once
    said = [ln for ln in r.output.splitlines() if "is a child of fork(2)" in ln]
    assert len(said) == 1 and said[0].startswith("softhca: ibv_post_send: EIO:"), r.output


def test_registrations_hand_their_memfds_over_one_kept_connection(where):
    r = where.run(where.server, [str(REGCHECK), "speed", "50"], timeout=120)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for size in (4, 64, 1024):
        assert f"regcheck: ok: {size} KiB x 50 (0 extra mappings): ibv_reg_mr" in r.output
    assert ("regcheck: ok: after 150 registrations the process has 2 connections to the "
            "daemon") in r.output, r.output
    assert "regcheck: ok: after ibv_close_device it has 0" in r.output, r.output
    print(r.output)


def _median_us(output: str, size_kib: int) -> int:
    m = re.search(rf"regcheck: ok: {size_kib} KiB x \d+ \((\d+) extra mappings\): "
                  r"ibv_reg_mr (\d+) us", output)
    assert m, output
    return int(m.group(2))


def test_reg_mr_costs_no_more_for_a_program_of_many_mappings(where):
    release = tuple(int(x) for x in re.findall(r"\d+", os.uname().release)[:2])
    if release < (6, 11):
        pytest.skip(f"Linux {os.uname().release} has no PROCMAP_QUERY ioctl (6.11): the "
                    "provider reads /proc/self/maps up to the buffer's line")
    few = where.run(where.server, [str(REGCHECK), "speed", "40"], timeout=120)
    many = where.run(where.server, [str(REGCHECK), "speed", "40", "20000"], timeout=300)
    assert few.returncode == 0 and many.returncode == 0, few.output + many.output
    print(few.output + many.output)
    # 20,000 mappings listed before the buffers' in /proc/self/maps: reading them took
    # about 20 ms per ibv_reg_mr (50 ms before the lines were skipped unparsed); the
    # kernel's lookup costs what it costs for a few
    for size in (4, 64, 1024):
        assert _median_us(many.output, size) < 3 * _median_us(few.output, size) + 2000, \
            few.output + many.output


def test_an_execed_child_cannot_register_its_parents_memory(where):
    r = where.run(where.server, [str(REGCHECK), "handoff", sys.executable, str(THIEF)],
                  timeout=60)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    assert "regcheck: ok: the parent's page is intact" in r.output, r.output
    assert "thief: read" not in r.output, r.output
    # each attempt refused: by the memfd's number, and by the handoffs' numbers
    assert r.output.count("thief: refused:") >= 5, r.output
