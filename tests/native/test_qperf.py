"""qperf, unmodified, on softhca: every RC test qperf has (`qperf --help tests`: RDMA
send/receive, RDMA READ and WRITE, InfiniBand atomics and the verification tests),
with -cm1 (its connection through rdma_cm: our librdmacm), between two network
namespaces, each side under ``softhca run``.

Without -cm1 qperf gives the QP an address vector with no GRH, which RoCE requires: the
provider refuses it EINVAL, and says so (test_without_cm_the_grh_is_named).

One client process runs every test in turn, each as its own qperf (so one failing
test does not hide the next), its output and exit status printed between markers;
then `qperf ADDR quit` ends the server. Each test's verdict is qperf's own: exit 0
and its figure line (`bw = 70.8 MB/sec`, `latency = 1.32 ms`, `msg_rate = 2.44
K/sec`), with no "failed" (qperf's word for an error, a ver_* test's wrong value
included)."""

from __future__ import annotations

import re

import native
import pytest

pytestmark = pytest.mark.readme_row("qperf 0.4.11")

RC_TESTS = ["rc_bw", "rc_lat", "rc_bi_bw",
            "rc_rdma_read_bw", "rc_rdma_read_lat", "rc_rdma_write_bw", "rc_rdma_write_lat",
            "rc_rdma_write_poll_lat",
            "rc_compare_swap_mr", "rc_fetch_add_mr",
            "ver_rc_compare_swap", "ver_rc_fetch_add"]
PORT = 19765          # qperf's listen port
WIRE = 23791          # both daemons' wire port (rdma_cm: one port per fabric)
# -t: each test's duration. Not 1: the atomic tests first post 1,024 WRs (qperf's
# NCQE), each ibv_post_send a round trip to the daemon, and on a loaded machine that
# alone can take a second, leaving a figure of 0 completions.
SECONDS = 2
SECTION = re.compile(r"^=== (\S+)\n(.*?)^=== \1 exit (\d+)$", re.M | re.S)
FIGURE = re.compile(r"^\s+(bw|latency|msg_rate)\s+=\s+([\d.]+) (\S+)$", re.M)


def _client_script(tmp, addr: str) -> str:
    lines = ["#!/bin/sh"]
    for t in RC_TESTS:
        lines += [f"echo '=== {t}'",
                  f"qperf -cm1 -t {SECONDS} {addr} {t} 2>&1",
                  f"echo \"=== {t} exit $?\""]
    lines.append(f"qperf {addr} quit >/dev/null 2>&1")
    script = tmp / "qperf-client.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    with native.cm_place(tmp_path_factory.mktemp("qperf"), "qperf") as p:
        yield p


@pytest.fixture(scope="module")
def results(where, tmp_path_factory):
    """Each test's section of the client's output: {test: (exit status, lines)}."""
    tmp = tmp_path_factory.mktemp("qperf-run")
    srv, cli = where.pair(["qperf"], ["sh", _client_script(tmp, where.server.addr)], PORT,
                          timeout=len(RC_TESTS) * 20, wire_port=WIRE)
    sections = {m.group(1): (int(m.group(3)), m.group(2)) for m in SECTION.finditer(cli.output)}
    return srv, cli, sections


@pytest.mark.parametrize("test", RC_TESTS)
def test_qperf_cm(results, test):
    srv, cli, sections = results
    assert test in sections, (f"qperf {test} printed no section (client exit "
                              f"{cli.returncode}):\n{cli.output}\n--- server:\n{srv.output}")
    status, out = sections[test]
    print(f"qperf -cm1 -t {SECONDS} {test}: exit {status}\n{out}")
    assert status == 0, f"qperf {test} exited {status}:\n{out}\n--- server:\n{srv.output}"
    assert "failed" not in out, out
    figures = FIGURE.findall(out)
    assert len(figures) == 1, out
    name, value, unit = figures[0]
    assert name == ("latency" if test.endswith("_lat") else
                    "msg_rate" if test.endswith("_mr") or test.startswith("ver_") else
                    "bw"), out
    assert float(value) > 0, out


def test_qperf_server_ended(results):
    """`qperf ADDR quit` ended the server, which ran every test with no error of its own."""
    srv, cli, _ = results
    assert srv.returncode == 0, srv.output
    assert cli.returncode == 0, cli.output


def test_without_cm_the_grh_is_named(where):
    """Without -cm1 qperf exchanges QP numbers over its TCP socket and builds an address
    vector with is_global 0: RoCE carries every packet in a GRH, so the provider refuses
    the modify to RTR EINVAL and its message names that requirement."""
    srv, cli = where.pair(["qperf", "-lp", str(PORT + 1)],
                          ["sh", "-c", f"qperf -lp {PORT + 1} -t 1 {where.server.addr} rc_bw"
                           f" 2>&1; qperf -lp {PORT + 1} {where.server.addr} quit"],
                          PORT + 1, timeout=60, wire_port=WIRE)
    both = srv.output + cli.output
    print(both)
    assert "failed to modify QP to RTR" in both, both
    assert re.search(r"ibv_modify_qp: EINVAL: RoCE requires a GRH", both), both
