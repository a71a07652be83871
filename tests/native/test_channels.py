"""Completion channels as middleware uses them (provider/tests/chancheck.c): the fd of
ibv_create_comp_channel is the channel's own from the start, so a program may make it
non-blocking and poll it before any CQ is bound (UCX and libiscsi do); then events of
two CQs on it through ibv_get_cq_event / ibv_ack_cq_events, and the kernel's destroy
order (ibv_destroy_comp_channel(3): it fails while a CQ is associated, EBUSY). A CQ a
QP uses and a PD with objects are EBUSY too, answered as a kernel answers them: the errno,
no line on stderr unless SOFTHCA_DEBUG asks for the daemon's reason."""

from __future__ import annotations

import native
import pytest

pytestmark = pytest.mark.readme_row("`ibv_create_cq`, `ibv_poll_cq`, `ibv_req_notify_cq`")

CHANCHECK = native.REPO / "provider" / "build" / "chancheck"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    if not CHANCHECK.is_file():
        pytest.skip(f"{CHANCHECK} is not built (`make provider`)")
    with native.place(tmp_path_factory.mktemp("channels")) as p:
        yield p


def test_channel_fd_is_real_before_and_after_cqs(where):
    r = where.run(where.server, ["env", "-u", "SOFTHCA_DEBUG", str(CHANCHECK)])
    print(r.output)
    assert "FAIL" not in r.output, r.output
    for line in [
        "ibv_create_comp_channel gives an open fd of its own",
        "fcntl(F_SETFL, O_NONBLOCK) on it before any CQ is bound",
        "poll(POLLIN, timeout 0) before any CQ: 0",
        "read of the empty non-blocking channel: EAGAIN",
        "ibv_get_cq_event on it with no event: -1, EAGAIN",
        "a second channel has an fd of its own",
        "destroying it unused: 0 and its fd closed",
        "polled from a thread while 200 CQs and 200 other channels come and go: the fd "
        "stays the channel's, no POLLHUP, POLLERR or POLLNVAL",
        "binding two CQs keeps the channel's fd and its O_NONBLOCK",
        "poll says readable and ibv_get_cq_event gives one of the channel's CQs",
        "and the next event is the other CQ's",
        "a SEND with the CQs not re-armed completes and raises no event",
        "re-arming the receive CQ: its event, only",
        "then the channel is empty: EAGAIN",
        "ibv_destroy_cq of a CQ a QP uses: EBUSY",
        "ibv_dealloc_pd of a PD with an MR and a QP: EBUSY",
        "and the CQ still raises its events",
        "ibv_destroy_comp_channel with two CQs bound: EBUSY, the fd still open",
        "with one CQ bound: EBUSY",
        "with none: 0 and its fd closed",
        "the program's stdin flags still untouched",
    ]:
        assert f"chancheck: ok: {line}" in r.output, r.output
    assert r.returncode == 0, r.output
    # the EBUSY answers leave stderr alone (qperf's teardown meets them)
    assert "softhca:" not in r.output, r.output


def test_an_ebusy_destroys_reason_is_said_under_softhca_debug(where):
    r = where.run(where.server, ["env", "SOFTHCA_DEBUG=1", str(CHANCHECK)])
    assert r.returncode == 0, r.output
    assert "softhca: ibv_destroy_cq: CQ " in r.output, r.output
    assert "softhca: ibv_dealloc_pd: PD " in r.output, r.output
