"""Debian's unmodified ibv_ud_pingpong, ibv_uc_pingpong and ibv_srq_pingpong on softhca
through the provider (``softhca run``), each side with its own daemon, between two
network namespaces (or on loopback where they cannot be made); ``-c``: each side checks
every byte it received.

- ibv_ud_pingpong: ibv_create_ah with a GRH, a UD QP moved with IBV_QP_QKEY, sends with
  wr.ud, receive buffers 40 bytes larger for the GRH (the payload checked after it).
- ibv_uc_pingpong: a UC QP on each side moved to RTR and RTS with the peer's QPN and
  PSN, SENDs that are never acknowledged.
- ibv_srq_pingpong: several RC QPs on each side take their receives from one SRQ
  (ibv_create_srq, ibv_post_srq_recv, QPs created with the SRQ).

What is expected comes from rdma-core's libibverbs/examples/*_pingpong.c: their result
lines count size * iters * 2 bytes (a send and a receive per exchange) and those iters;
srq_pingpong's -n counts the exchanges of all QPs together (its loop counts sends and
receives over every QP, whatever its usage text says)."""

from __future__ import annotations

import itertools
import re

import native
import pytest

pytestmark = pytest.mark.readme_row("`ibv_uc_pingpong`, `ibv_ud_pingpong`, `ibv_srq_pingpong`")

_ports = itertools.count(20300)
BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter$", re.M)
PROGRAMS = ("ibv_ud_pingpong", "ibv_uc_pingpong", "ibv_srq_pingpong")


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable(*PROGRAMS)
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("native-pingpong")) as p:
        yield p


CASES = [
    pytest.param("ibv_ud_pingpong", 64, 200, (), marks=pytest.mark.readme_row("UD and UC QPs")),
    pytest.param("ibv_ud_pingpong", 2048, 200, (), marks=pytest.mark.readme_row("UD and UC QPs")),
    pytest.param("ibv_uc_pingpong", 64, 200, (), marks=pytest.mark.readme_row("UD and UC QPs")),
    pytest.param("ibv_uc_pingpong", 4096, 200, (), marks=pytest.mark.readme_row("UD and UC QPs")),
    pytest.param("ibv_srq_pingpong", 256, 200, ("-q", "8", "-r", "32"),
                 marks=pytest.mark.readme_row("SRQs: `ibv_create_srq`")),
]


@pytest.mark.parametrize("program, size, iters, extra", CASES,
                         ids=["ud-64", "ud-2048", "uc-64", "uc-4096", "srq-8qps-256"])
def test_pingpong(where, program, size, iters, extra):
    port = next(_ports)
    common = [program, "-g", "0", "-c", "-s", str(size), "-n", str(iters), "-p", str(port),
              *extra]
    srv, cli = where.pair(common, [*common, where.server.addr], port)
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{name} ({where.kind}):\n{r.output}"
        b, it = BYTES.search(r.output), ITERS.search(r.output)
        assert b and it, f"{name} printed no figures:\n{r.output}"
        assert int(b.group(1)) == 2 * size * iters, r.output
        assert int(it.group(1)) == iters, r.output
        assert "invalid data" not in r.output, r.output
