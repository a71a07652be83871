"""perftest's programs, unmodified, on softhca through the provider: each pair (server
and client, each with its own daemon) between two network namespaces, with perftest's
default post-send API (ibv_wr_*, since the device reads as a ConnectX-6) and with
--use_old_post_send (ibv_post_send). Each must exit 0 on both sides and print its
result row for the size and iteration count it was given."""

from __future__ import annotations

import itertools
import re

import native
import pytest

_ports = itertools.count(21000)
ITERS = 1000
# perftest's result row: "#bytes #iterations ..." then the figures.
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", re.M)

PROGRAMS = ["ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ib_send_lat",
            "ib_read_lat", "ib_atomic_bw"]


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable(*PROGRAMS)
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("perftest")) as p:
        yield p


def run_pair(where, program: str, size: int, extra: list[str]) -> None:
    port = next(_ports)
    args = [program, "-p", str(port), "-n", str(ITERS), *extra]
    if program != "ib_atomic_bw":       # atomics move 8 bytes, whatever -s says
        args += ["-s", str(size)]
    srv, cli = where.pair(args, [*args, where.server.addr], port)
    want = 8 if program == "ib_atomic_bw" else size
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{program} {name} ({where.kind}):\n{r.output}"
    rows = [m for m in ROW.finditer(cli.output) if int(m.group(1)) == want]
    assert rows, f"{program} client printed no row for {want} bytes:\n{cli.output}"
    assert int(rows[0].group(2)) == ITERS, cli.output
    assert float(rows[0].group(4)) > 0, cli.output


@pytest.mark.parametrize("api", [[], ["--use_old_post_send"]], ids=["wr-api", "old-post-send"])
@pytest.mark.parametrize("program", PROGRAMS)
def test_perftest_4k(where, program, api):
    run_pair(where, program, 4096, api)


@pytest.mark.parametrize("size", [64, 1 << 20], ids=["64B", "1MiB"])
@pytest.mark.parametrize("program", ["ib_write_bw", "ib_read_bw", "ib_send_bw"])
def test_perftest_bw_sizes(where, program, size):
    run_pair(where, program, size, [])


@pytest.mark.parametrize("program", ["ib_write_lat", "ib_send_lat", "ib_read_lat"])
def test_perftest_lat_64(where, program):
    run_pair(where, program, 64, [])
