"""Debian's unmodified ibv_uc_pingpong on softhca through the provider (``softhca run``):
a UC QP on each side (ibv_create_qp with IBV_QPT_UC, moved to RTR and RTS with the
peer's QPN and PSN), SENDs that are never acknowledged; each side with its own daemon,
between two network namespaces (or on loopback where they cannot be made). ``-c``: each
side checks the payload it received."""

from __future__ import annotations

import itertools
import re

import native
import pytest

pytestmark = [
    pytest.mark.readme_row("`ibv_uc_pingpong`, `ibv_ud_pingpong`, `ibv_srq_pingpong`"),
    pytest.mark.readme_row("UD and UC QPs"),
]

_ports = itertools.count(20350)
# uc_pingpong's result lines (rdma-core libibverbs/examples/uc_pingpong.c)
BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter$", re.M)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable("ibv_uc_pingpong")
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("native-uc")) as p:
        yield p


@pytest.mark.parametrize("size,iters", [(64, 200), (4096, 200)])
def test_ibv_uc_pingpong(where, size, iters):
    port = next(_ports)
    common = ["ibv_uc_pingpong", "-g", "0", "-c", "-s", str(size), "-n", str(iters),
              "-p", str(port)]
    srv, cli = where.pair(common, [*common, where.server.addr], port)
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{name} ({where.kind}):\n{r.output}"
        b, it = BYTES.search(r.output), ITERS.search(r.output)
        assert b and it, f"{name} printed no figures:\n{r.output}"
        assert int(b.group(1)) == 2 * size * iters, r.output
        assert int(it.group(1)) == iters, r.output
        assert "invalid data" not in r.output, r.output
