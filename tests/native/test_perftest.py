"""perftest's programs, unmodified, on softhca through the provider: each pair (server
and client, each with its own daemon) between two network namespaces, with perftest's
default post-send API (ibv_wr_*, since the device reads as a ConnectX-6) and with
--use_old_post_send (ibv_post_send), each at 64 B, 4 KiB and 1 MiB: -n 1000 at the two
small sizes, -n 200 at 1 MiB (still past every queue's depth, below). Each must exit 0
on both sides and print its result row for the size and iteration count it was given."""

from __future__ import annotations

import itertools
import json
import re

import native
import pytest

pytestmark = pytest.mark.readme_row("perftest: `ib_write_bw`")

_ports = itertools.count(21000)
ITERS = 1000
# At 1 MiB: each run still moves 200 MiB, and 200 WRs go past perftest's send queue
# (-t, 128 deep for the _bw programs, 1 for the _lat ones), so it wraps; the 512-deep
# receive queue of ib_send_bw / ib_send_lat wraps in the 1000-iteration runs of the
# smaller sizes. 1000 of them was 1 GiB a run, most of the module's minutes, for no
# behaviour the smaller count leaves out.
ITERS_1MIB = 200
# perftest's result row: "#bytes #iterations ..." then the figures: for the _bw programs
# BW peak and BW average (MiB/s, two decimals) and MsgRate (Mpps, six decimals), for the
# _lat ones t_min, t_max, ... (usec).
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)(?:\s+([\d.]+))?", re.M)

# Every perftest program of the RC verbs, at each of these message sizes; ib_atomic_bw,
# whose messages are one 64-bit word, once.
SIZED = ["ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_write_lat", "ib_send_lat",
         "ib_read_lat"]
PROGRAMS = [*SIZED, "ib_atomic_bw"]
SIZES = [64, 4096, 1 << 20]


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable(*PROGRAMS)
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("perftest")) as p:
        yield p


def run_pair(where, program: str, size: int, extra: list[str]) -> None:
    port = next(_ports)
    iters = ITERS_1MIB if size == 1 << 20 else ITERS
    args = [program, "-p", str(port), "-n", str(iters), *extra]
    if program != "ib_atomic_bw":
        args += ["-s", str(size)]
    srv, cli = where.pair(args, [*args, where.server.addr], port)
    # Both sides' output on a failure: the side that failed first is often the other one
    # (its daemon gone, this side ends in RETRY_EXC_ERR).
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{program} {name} exited {r.returncode} ({where.kind}):\n{both}"
    rows = [m for m in ROW.finditer(cli.output) if int(m.group(1)) == size]
    assert rows, f"{program} client printed no row for {size} bytes:\n{cli.output}"
    assert int(rows[0].group(2)) == iters, cli.output
    # A bandwidth row is judged by its MsgRate, which resolves one message a second: its
    # BW average is the same figure times the size in MiB/s, to two decimals, 0.00 for
    # 8-byte atomics below 655 a second (1000 taking over 1.5 s, as on a loaded machine;
    # with a 50 ms delay on the link the row reads 0.00 and MsgRate 0.000300). A latency
    # row by its t_max.
    figure = rows[0].group(5) if program.endswith("_bw") else rows[0].group(4)
    assert figure is not None and float(figure) > 0, cli.output


API = pytest.mark.parametrize("api", [[], ["--use_old_post_send"]],
                              ids=["wr-api", "old-post-send"])


@pytest.mark.readme_row("RC QPs: `ibv_create_qp`")
@API
@pytest.mark.parametrize("size", SIZES, ids=["64B", "4KiB", "1MiB"])
@pytest.mark.parametrize("program", SIZED)
def test_perftest(where, program, size, api):
    run_pair(where, program, size, api)


@pytest.mark.readme_row("`ibv_post_send`: SEND")
@API
def test_ib_atomic_bw(where, api):
    """Once per API, not per size: an atomic (FETCH_AND_ADD, or CMP_AND_SWP under -A)
    works on one 64-bit word, so ib_atomic_bw takes no -s and its row always reads
    8 bytes; three sizes would be the same run three times."""
    run_pair(where, "ib_atomic_bw", 8, api)


def test_ib_write_bw_recovers_from_dropped_packets(where, tmp_path):
    """A fault rule drops 5% of the client daemon's outgoing packets for the whole run:
    ib_write_bw still completes its 5000 writes on both sides, and the daemon's RC
    statistics show the go-back-N retransmissions that recovered them."""
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"action": "drop", "probability": 0.05, "seed": 7}]))
    stats = tmp_path / "stats.json"
    port = next(_ports)
    args = ["ib_write_bw", "-p", str(port), "-n", "5000", "-s", "4096"]
    srv, cli = where.pair(args, [*args, where.server.addr], port,
                          client_run_args=["--faults", str(rules), "--stats", str(stats)])
    assert srv.returncode == 0 and cli.returncode == 0, srv.output + cli.output
    rows = [m for m in ROW.finditer(cli.output) if int(m.group(1)) == 4096]
    assert rows and int(rows[0].group(2)) == 5000, cli.output
    s = json.loads(stats.read_text())
    assert s["fault_rules"] == 1
    # A lost packet is recovered only by retransmitting it: the run completed, and the
    # retransmissions that did it are counted.
    assert s["retransmissions"] > 0 and s["retransmitted_packets"] > 0, s


def test_bench_provider_rows(monkeypatch):
    """`softhca bench --provider`'s two rows: perftest's own figures, read from its rows
    (each run here -n 200, not the bench's 1000: the 1 MiB writes were 1 GiB, and what
    is checked is that the rows of the count asked for are found and read)."""
    from softhca.tools.bench import provider
    from softhca.tools.bench.provider import provider_rows, unavailable

    if unavailable():
        pytest.skip(unavailable())
    assert provider.ITERATIONS == 1000
    monkeypatch.setattr(provider, "ITERATIONS", 200)
    rows = provider_rows()
    assert "skipped" not in rows, rows
    bw, lat = rows["ib_write_bw"], rows["ib_send_lat"]
    assert bw["size"] == 1 << 20 and bw["iterations"] == 200 and bw["mb_s"] > 0
    assert lat["size"] == 64 and 0 < lat["typical_us"] <= lat["p99_us"]
