"""Debian's ibv_srq_pingpong, unmodified, through softhca run: several RC QPs on each
side take their receives from one SRQ (ibv_create_srq, ibv_post_srq_recv, QPs created
with the SRQ), each side with its own daemon, and -c checks every byte received.

What is expected comes from rdma-core's libibverbs/examples/srq_pingpong.c: -n counts
the exchanges of all QPs together (its loop counts sends and receives over every QP,
whatever its usage text says), and its result lines count size * iters * 2 bytes (a
send and a receive per exchange) and those iters."""

from __future__ import annotations

import itertools
import re

import native
import pytest

pytestmark = [
    pytest.mark.readme_row("`ibv_uc_pingpong`, `ibv_ud_pingpong`, `ibv_srq_pingpong`"),
    pytest.mark.readme_row("SRQs: `ibv_create_srq`"),
]

_ports = itertools.count(20400)
BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter$", re.M)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable("ibv_srq_pingpong")
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("native")) as p:
        yield p


@pytest.mark.parametrize("qps, size, iters", [(8, 256, 200)])
def test_ibv_srq_pingpong(where, qps, size, iters):
    port = next(_ports)
    common = ["ibv_srq_pingpong", "-g", "0", "-c", "-p", str(port), "-q", str(qps),
              "-s", str(size), "-n", str(iters), "-r", str(4 * qps)]
    srv, cli = where.pair(common, [*common, where.server.addr], port)
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{name} ({where.kind}):\n{r.output}"
        b, it = BYTES.search(r.output), ITERS.search(r.output)
        assert b and it, f"{name} printed no figures:\n{r.output}"
        assert int(b.group(1)) == 2 * size * iters, r.output
        assert int(it.group(1)) == iters, r.output
    assert "invalid data" not in cli.output + srv.output
