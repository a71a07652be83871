"""Both post paths of the provider from C (provider/wq.c; docs/native.md, "Send and
receive rings"): a QP's send and receive queues in a ring shared with the daemon, which
every QP of ibv_create_qp gets by default, and the post requests SOFTHCA_WQ_RING=0 asks
for. wqcheck (provider/tests/wqcheck.c) checks on each: inline data from a stack buffer
reused right after the post, error completions, the QP's state at post, a reset QP
reused; a WR only the daemon finds bad (past max_msg_sz, a UD AH of another PD)
completes in error on the ring and is refused at post on the requests. ibv_rc_pingpong, ibv_uc_pingpong and ibv_ud_pingpong between two
daemons pass on both, each checking its bytes; SOFTHCA_DEBUG says which path a QP
took."""

from __future__ import annotations

import itertools
import re

import native
import pytest

RING_LINE = re.compile(r"ibv_create_qp: QP 0x[0-9a-f]+: send queue and receive queue in a "
                       r"ring shared with the daemon")
REQUESTS_LINE = "ibv_create_qp: work requests go as requests (SOFTHCA_WQ_RING=0)"
MODES = pytest.mark.parametrize("ring", ["1", "0"], ids=["ring", "requests"])
_ports = itertools.count(20950)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable("ibv_rc_pingpong", "ibv_uc_pingpong", "ibv_ud_pingpong")
    if why:
        pytest.skip(why)
    if not native.WQCHECK.is_file():
        pytest.skip(f"{native.WQCHECK} is not built (`make provider`)")
    with native.place(tmp_path_factory.mktemp("wq-ring")) as p:
        yield p


def env(ring: str) -> list[str]:
    return ["env", f"SOFTHCA_WQ_RING={ring}", "SOFTHCA_DEBUG=1"]


def took(output: str, ring: str) -> None:
    """Every QP took the path asked for, and at least one was made."""
    if ring == "1":
        assert RING_LINE.search(output) and REQUESTS_LINE not in output, output
    else:
        assert REQUESTS_LINE in output and not RING_LINE.search(output), output


BOTH = [
    "64 inline WRITEs from a stack buffer overwritten after each post land as posted",
    "an SGE of an lkey no MR has: ibv_post_send takes the chain",
    "an SGE of an lkey no MR has: WR 0 completes, WR 1 completes local protection error, "
    "WR 2 flushes",
    "an SGE of an lkey no MR has: and the QP is in ERR",
    "ibv_post_send in RESET: EINVAL", "ibv_post_recv in RESET: EINVAL",
    "ibv_post_send in INIT: EINVAL", "ibv_post_recv in INIT takes the receive",
    "to ERR the receive flushes; ibv_post_send in ERR takes the WR and it flushes",
    "a QP reset and connected again takes 16 WRs, twice over",
    "a FETCH_AND_ADD of a 4-byte SGE: ibv_post_send refuses it: EINVAL, bad_wr at WR 1",
    "a FETCH_AND_ADD of a 4-byte SGE: and WR 0 completes, no other",
]
RING_ONLY = [
    "a WRITE past max_msg_sz: WR 0 completes, WR 1 completes local length error, WR 2 "
    "flushes",
    "a UD SEND whose AH is of another PD: WR 0 completes, WR 1 completes local QP "
    "operation error, WR 2 flushes",
    "a UD SEND whose AH is of another PD: and the QP is in ERR",
]
REQUESTS_ONLY = [
    "a WRITE past max_msg_sz: ibv_post_send refuses it: EINVAL, bad_wr at WR 1",
    "a UD SEND whose AH is of another PD: ibv_post_send refuses it: EINVAL, bad_wr at WR 1",
]


@MODES
def test_wqcheck(where, ring):
    mode = "ring" if ring == "1" else "requests"
    r = where.run(where.server, [*env(ring), str(native.WQCHECK), mode])
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for line in BOTH + (RING_ONLY if ring == "1" else REQUESTS_ONLY):
        assert f"wqcheck: ok: {line}" in r.output, r.output
    took(r.output, ring)


@MODES
@pytest.mark.parametrize("program", ["ibv_rc_pingpong", "ibv_uc_pingpong",
                                     "ibv_ud_pingpong"])
def test_pingpong(where, ring, program):
    port = next(_ports)
    size = 1024 if program == "ibv_ud_pingpong" else 4096
    common = [program, "-g", "0", "-s", str(size), "-n", "300", "-p", str(port)]
    srv, cli = where.pair([*env(ring), *common], [*env(ring), *common, where.server.addr],
                          port)
    for r in (srv, cli):
        assert r.returncode == 0, f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
        # its result lines: size * iters * 2 bytes, and the iterations
        assert re.search(rf"^{size * 300 * 2} bytes in [\d.]+ seconds", r.output, re.M), \
            r.output
        assert re.search(r"^300 iters in [\d.]+ seconds", r.output, re.M), r.output
        took(r.output, ring)
