"""Debian's unmodified ibv_ud_pingpong on softhca through the provider (``softhca run``):
ibv_create_ah with a GRH, a UD QP moved with IBV_QP_QKEY, sends with wr.ud, receive
buffers 40 bytes larger for the GRH; each side with its own daemon, between two network
namespaces (or on loopback where they cannot be made). ``-c``: each side checks the
payload it received after the GRH."""

from __future__ import annotations

import itertools
import re

import native
import pytest

pytestmark = [
    pytest.mark.readme_row("`ibv_uc_pingpong`, `ibv_ud_pingpong`, `ibv_srq_pingpong`"),
    pytest.mark.readme_row("UD and UC QPs"),
]

_ports = itertools.count(20300)
# ud_pingpong's result lines (rdma-core libibverbs/examples/ud_pingpong.c)
BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter$", re.M)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable("ibv_ud_pingpong")
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("native-ud")) as p:
        yield p


@pytest.mark.parametrize("size,iters", [(64, 200), (2048, 200)])
def test_ibv_ud_pingpong(where, size, iters):
    port = next(_ports)
    common = ["ibv_ud_pingpong", "-g", "0", "-c", "-s", str(size), "-n", str(iters),
              "-p", str(port)]
    srv, cli = where.pair(common, [*common, where.server.addr], port)
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{name} ({where.kind}):\n{r.output}"
        b, it = BYTES.search(r.output), ITERS.search(r.output)
        assert b and it, f"{name} printed no figures:\n{r.output}"
        assert int(b.group(1)) == 2 * size * iters, r.output
        assert int(it.group(1)) == iters, r.output
        assert "invalid data" not in r.output, r.output
