"""Both completion paths of the provider from C (provider/cq.c; docs/native.md,
"Completion rings"): a CQ's ring shared with the daemon, which every CQ gets by default,
and the pushed "wc" frames with cq_credit that SOFTHCA_CQ_RING=0 asks for. The same
programs pass on each: completion channels (chancheck), ibv_resize_cq with completions
after it (mwcheck), ibv_post_send's partial posts (postcheck) and an RC ping-pong with
events between two daemons (ibv_rc_pingpong -e), each side checking every byte. The
other native tests run the default, the ring; SOFTHCA_DEBUG says which path a CQ took."""

from __future__ import annotations

import itertools
import re

import native
import pytest

CHANCHECK = native.REPO / "provider" / "build" / "chancheck"
RING_LINE = "entries in a completion ring shared with the daemon"
FRAMES_LINE = "ibv_create_cq: completions come as frames (SOFTHCA_CQ_RING=0)"
MODES = pytest.mark.parametrize("ring", ["1", "0"], ids=["ring", "frames"])
_ports = itertools.count(20900)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable("ibv_rc_pingpong")
    if why:
        pytest.skip(why)
    for prog in (CHANCHECK, native.MWCHECK, native.POSTCHECK):
        if not prog.is_file():
            pytest.skip(f"{prog} is not built (`make provider`)")
    with native.place(tmp_path_factory.mktemp("cq-ring")) as p:
        yield p


def env(ring: str) -> list[str]:
    return ["env", f"SOFTHCA_CQ_RING={ring}", "SOFTHCA_DEBUG=1"]


def took(output: str, ring: str) -> None:
    """Every CQ took the path asked for, and at least one was made."""
    if ring == "1":
        assert RING_LINE in output and FRAMES_LINE not in output, output
    else:
        assert FRAMES_LINE in output and RING_LINE not in output, output


@MODES
def test_completion_channels(where, ring):
    r = where.run(where.server, [*env(ring), str(CHANCHECK)])
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for line in ("poll says readable and ibv_get_cq_event gives one of the channel's CQs",
                 "and the next event is the other CQ's",
                 "a SEND with the CQs not re-armed completes and raises no event",
                 "re-arming the receive CQ: its event, only",
                 "then the channel is empty: EAGAIN", "and the CQ still raises its events"):
        assert f"chancheck: ok: {line}" in r.output, r.output
    took(r.output, ring)


@MODES
def test_resize_cq_then_completions(where, ring):
    r = where.run(where.server, [*env(ring), str(native.MWCHECK), "windows"])
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for line in ("ibv_resize_cq to 128", "ibv_resize_cq to 0 is EINVAL",
                 "ibv_resize_cq keeps the completions not polled yet, in order",
                 "the peer writes through the type 1 window, nothing around it",
                 "a WRITE through it after completes with remote access error"):
        assert f"mwcheck: ok: {line}" in r.output, r.output
    took(r.output, ring)


@MODES
def test_partial_posts_complete_what_was_taken(where, ring):
    r = where.run(where.server, [*env(ring), str(native.POSTCHECK), "badwr"])
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    assert ("postcheck: ok: ibv_post_send of 20 WRs on a 16-deep send queue: ENOMEM, "
            "bad_wr at WR 16") in r.output, r.output
    took(r.output, ring)


@MODES
def test_rc_pingpong_with_events(where, ring):
    port = next(_ports)
    # rdma-core's ibv_rc_pingpong: -e sleeps in ibv_get_cq_event for each completion
    common = ["ibv_rc_pingpong", "-g", "0", "-c", "-e", "-s", "4096", "-n", "300",
              "-p", str(port)]
    srv, cli = where.pair([*env(ring), *common], [*env(ring), *common, where.server.addr],
                          port)
    for r in (srv, cli):
        assert r.returncode == 0, f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
        # its result lines: size * iters * 2 bytes, and the iterations
        assert re.search(r"^2457600 bytes in [\d.]+ seconds", r.output, re.M), r.output
        assert re.search(r"^300 iters in [\d.]+ seconds", r.output, re.M), r.output
        took(r.output, ring)
