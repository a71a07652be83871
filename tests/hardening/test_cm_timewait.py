"""The timewait of a disconnected rdma_cm connection (server/cm_timewait.py), driven by
hand-written control requests as a program's librdmacm sends them: both sides get
RDMA_CM_EVENT_TIMEWAIT_EXIT after their disconnect completes, a REQ naming a QP still
in timewait is refused as a stale connection, and destroying an id (or closing its
session) during the timewait ends it with no event and nothing left behind."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from test_cm import PEER, Session, connect_fields, listener, make_qp, resolved

from softhca.protocol import cm
from softhca.server.daemon import Daemon
from softhca.server.hosts import Limits

SHORT = 0.3         # the daemon limit the tests shorten the timewait to


def expected_timewait_ms(packet_life_time: int, ca_ack_delay: int) -> int:
    """IBTA's ACK timeout, from its definition: the smallest t whose 4.096 us * 2^t
    covers the HCA's ACK delay plus a round trip (two packet lifetimes); the IB CM's
    timewait is that time rounded down to 2^(t - 8) ms."""
    need = (1 << ca_ack_delay) + 2 * (1 << packet_life_time)
    t = next(t for t in range(32) if (1 << t) >= need)
    return 1 << (t - 8)


@contextlib.asynccontextmanager
async def daemon(timewait: float = SHORT):
    d = Daemon(("mlx5_0",), "127.0.0.1", 0, peer_token=PEER,
               limits=Limits(cm_timewait=timewait))
    await d.start()
    try:
        yield d
    finally:
        await d.close()


async def connected(d, port: int, cqp: int | None = None):
    """An RC connection between two sessions: (srv, cli, child id, active id, cli QP)."""
    srv, cli = await Session.open(d), await Session.open(d)
    await listener(srv, port)
    cid = await resolved(cli, port)
    cqp, sqp = cqp or await make_qp(cli), await make_qp(srv)
    await cli.call("cm_connect", **connect_fields(cid, cqp))
    child = (await srv.event("connect_request"))[0]["cmid"]
    await srv.call("cm_accept", cmid=child, qpn=sqp, psn=0, responder_resources=1,
                   initiator_depth=1, rnr_retry_count=7)
    await cli.event("connect_response")
    await cli.call("cm_establish", cmid=cid)
    await srv.event("established")
    return srv, cli, child, cid, cqp


def test_the_default_timewait_is_the_ib_cms_for_a_roce_path():
    # rdma_cm's RoCE packet lifetime (CMA_IBOE_PACKET_LIFETIME 16) and an mlx5 HCA's
    # local_ca_ack_delay (16): 2^16 + 2 * 2^16 needs t = 18, so 2^10 ms.
    want = expected_timewait_ms(16, 16)
    assert want == 1024
    assert Limits().cm_timewait == want / 1000
    d = Daemon(("mlx5_0",), "127.0.0.1", 0)
    assert d.cm.timing.timewait == want / 1000


@pytest.mark.parametrize("bad", [0.0, -1.0, 60.5, 3600.0])
def test_a_timewait_out_of_bounds_is_refused(bad):
    with pytest.raises(ValueError):
        Limits(cm_timewait=bad)


def test_serve_refuses_a_timewait_past_its_bound():
    import argparse

    from softhca.tools.commands.serve import _timewait

    assert _timewait("0.05") == 0.05
    for bad in ("61", "0", "-2", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            _timewait(bad)


async def test_both_sides_get_timewait_exit_after_the_disconnect():
    async with daemon() as d:
        srv, cli, child, cid, _ = await connected(d, 7301)
        t0 = time.monotonic()
        await cli.call("cm_disconnect", cmid=cid)
        await srv.event("disconnected")
        await cli.event("disconnected")
        # Held: nothing comes before the timewait's end.
        await asyncio.sleep(SHORT / 2)
        assert not srv.events and not cli.events
        for s, i in ((cli, cid), (srv, child)):
            h, _ = await s.event("timewait_exit", timeout=5)
            assert h["cmid"] == i and h["status"] == 0
        elapsed = time.monotonic() - t0
        assert SHORT <= elapsed < SHORT + 2.0, elapsed
        # Done: no timer, no record; rdma_disconnect again is still no error.
        assert d.cm.counts()["timers"] == 0 and not d.cm.timewait
        await cli.call("cm_disconnect", cmid=cid)
        for s, ids in ((cli, [cid]), (srv, [child])):
            for i in ids:
                await s.call("cm_destroy_id", cmid=i)
        srv.close()
        cli.close()


async def test_destroying_ids_during_the_timewait_sends_no_event_and_leaks_nothing():
    async with daemon(timewait=1.0) as d:
        srv, cli, child, cid, _ = await connected(d, 7302)
        lid = next(c.handle for c in d.cm.ids.values() if c.state.value == "listen")
        await srv.call("cm_disconnect", cmid=child)
        await srv.event("disconnected")
        await cli.event("disconnected")
        assert d.cm.counts()["timers"] == 2 and len(d.cm.timewait) == 2
        # As rping and ucmatose do: destroyed right after DISCONNECTED.
        await cli.call("cm_destroy_id", cmid=cid)
        await srv.call("cm_destroy_id", cmid=child)
        await srv.call("cm_destroy_id", cmid=lid)
        assert d.cm.counts() == {"ids": 0, "listeners": 0, "timers": 0, "remote": 0}
        await asyncio.sleep(1.3)
        await srv.call("cm_counts")
        await cli.call("cm_counts")
        assert not srv.events and not cli.events
        srv.close()
        cli.close()


async def test_a_closed_session_takes_its_ids_in_timewait_with_it():
    async with daemon(timewait=5.0) as d:
        srv, cli, child, cid, _ = await connected(d, 7303)
        await cli.call("cm_disconnect", cmid=cid)
        await cli.event("disconnected")
        await srv.event("disconnected")
        cli.close()
        srv.close()
        for _ in range(200):
            if d.cm.counts() == {"ids": 0, "listeners": 0, "timers": 0, "remote": 0}:
                break
            await asyncio.sleep(0.02)
        assert d.cm.counts() == {"ids": 0, "listeners": 0, "timers": 0, "remote": 0}


async def test_a_req_naming_a_qp_in_timewait_is_rejected_as_stale():
    """The IB CM refuses a REQ whose QP (of the same peer) belongs to a connection still
    in timewait: REJ reason 10, stale connection; once the timewait ended, the same QP
    connects again."""
    async with daemon(timewait=1.0) as d:
        srv, cli, child, cid, cqp = await connected(d, 7304)
        await cli.call("cm_disconnect", cmid=cid)
        await cli.event("disconnected")
        await srv.event("disconnected")
        again = await resolved(cli, 7304)
        await cli.call("cm_connect", **connect_fields(again, cqp))
        h, _ = await cli.event("rejected")
        assert h["cmid"] == again and h["status"] == cm.REJ_STALE_CONN == 10
        assert d.counters["cm_stale_rejects"] == 1 and not srv.events
        # Another QP of the same peer is no stale connection.
        other = await resolved(cli, 7304)
        await cli.call("cm_connect", **connect_fields(other, await make_qp(cli)))
        assert (await srv.event("connect_request"))[0]["qpn"] != cqp
        await srv.event("timewait_exit", timeout=5)
        await cli.event("timewait_exit", timeout=5)
        late = await resolved(cli, 7304)
        await cli.call("cm_connect", **connect_fields(late, cqp))
        assert (await srv.event("connect_request"))[0]["qpn"] == cqp
        srv.close()
        cli.close()


async def test_a_dreq_never_answered_still_ends_in_timewait():
    async with daemon() as d:
        d.cm.timing.response_timeout, d.cm.timing.max_retries = 0.05, 1
        srv, cli, child, cid, _ = await connected(d, 7305)
        real = d.cm._transmit
        d.cm._transmit = lambda p, h, data: None if h["m"] == "dreq" else real(p, h, data)
        await cli.call("cm_disconnect", cmid=cid)
        h, _ = await cli.event("disconnected", timeout=5)
        assert h["status"] == 0
        h, _ = await cli.event("timewait_exit", timeout=5)
        assert h["cmid"] == cid and not srv.events
        srv.close()
        cli.close()


async def test_a_ud_id_has_no_timewait():
    from test_cm_sidr import accept_fields, make_ud_qp, ud_connect_fields, ud_listener

    async with daemon(timewait=0.1) as d:
        srv, cli = await Session.open(d), await Session.open(d)
        await ud_listener(srv, 7306)
        cid = (await cli.call("cm_create_id", ps=cm.PS_UDP))["cmid"]
        await cli.call("cm_resolve_addr", cmid=cid, ip="127.0.0.1", port=7306)
        await cli.event("addr_resolved")
        await cli.call("cm_resolve_route", cmid=cid)
        await cli.event("route_resolved")
        await cli.call("cm_connect", **(await ud_connect_fields(cli, cid)))
        child = (await srv.event("connect_request"))[0]["cmid"]
        await srv.call("cm_accept", **accept_fields(child, await make_ud_qp(srv)))
        await cli.event("established")
        await cli.call("cm_disconnect", cmid=cid)
        await srv.call("cm_disconnect", cmid=child)
        await asyncio.sleep(0.4)
        await cli.call("cm_counts")
        await srv.call("cm_counts")
        assert not srv.events and not cli.events
        assert not d.cm.timewait and d.cm.counts()["timers"] == 0
        srv.close()
        cli.close()


async def test_ids_in_timewait_count_against_the_sessions_id_limit(monkeypatch):
    """An id in timewait is still an id: with a limit of 3 ids per session, a session
    holding one in timewait may make 2 more, the next is ENOMEM; destroying the one in
    timewait makes room at once."""
    import softhca.server.cm as server_cm

    async with daemon(timewait=30.0) as d:
        srv, cli, child, cid, _ = await connected(d, 7307)
        await cli.call("cm_disconnect", cmid=cid)
        await cli.event("disconnected")
        assert d.cm.ids[cid].state.value == "timewait"
        monkeypatch.setattr(server_cm, "MAX_IDS", 3)
        more = [(await cli.call("cm_create_id", ps=cm.PS_TCP))["cmid"] for _ in range(2)]
        e = await cli.refused("cm_create_id", ps=cm.PS_TCP)
        assert e["errno"] == "ENOMEM", e
        await cli.call("cm_destroy_id", cmid=cid)
        more.append((await cli.call("cm_create_id", ps=cm.PS_TCP))["cmid"])
        assert not cli.events
        srv.close()
        cli.close()
