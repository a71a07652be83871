"""ibv_reg_mr's move of a program's pages onto a memfd, and what fork does to a
session (provider/tests/regcheck.c): completions that arrive during the move are all
polled; a forked child's verbs calls fail EIO at once; a forked and exec'ed child that
keeps its parent's control session cannot have the daemon map its parent's memory."""

from __future__ import annotations

import native
import pytest

REGCHECK = native.REPO / "provider" / "build" / "regcheck"


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
