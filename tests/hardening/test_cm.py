"""The daemon's connection manager (server/cm.py) driven by hand-written control
requests, as a program's librdmacm sends them: the whole connection on one daemon
(two sessions), then the attacks: private data too long, connects to nobody (10,000 of
them leak nothing), a listener's backlog overrun, a lost REQ, a REQ never answered,
and CM messages forged on the wire plane."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os

import pytest

from softhca.engine.cm import CMId
from softhca.protocol import cm
from softhca.protocol.frames import FrameDecoder, encode_frame, frame_bytes
from softhca.server.cm import MAX_IDS
from softhca.server.daemon import Daemon
from softhca.server.link import open_link

PEER = b"peer-token"


@contextlib.asynccontextmanager
async def daemon():
    d = Daemon(("mlx5_0",), "127.0.0.1", 0, peer_token=PEER)
    await d.start()
    try:
        yield d
    finally:
        await d.close()


class Session:
    """A control session whose replies and pushed CM events are kept apart."""

    def __init__(self, r, w) -> None:
        self.r, self.w, self.dec = r, w, FrameDecoder(1 << 20)
        self.next_id = 1
        self.replies: dict[int, dict] = {}
        self.events: list[tuple[dict, bytes]] = []
        self._rest: list = []

    @classmethod
    async def open(cls, d: Daemon) -> Session:
        r, w = await asyncio.open_connection(d.host, d.port)
        s = cls(r, w)
        await s._frame()                               # the challenge
        w.write(frame_bytes({"t": "hello", "version": 1, "role": "control"}))
        assert (await s._frame()).header["t"] == "welcome"
        return s

    async def _frame(self):
        """A frame of the handshake (nothing else is pushed before the welcome)."""
        while True:
            data = await asyncio.wait_for(self.r.read(1 << 16), 10)
            assert data, "the daemon closed the session"
            frames = self.dec.feed(data)
            if frames:
                self._rest = frames[1:]
                return frames[0]

    async def _pump(self) -> None:
        data = await asyncio.wait_for(self.r.read(1 << 20), 10)
        assert data, "the daemon closed the session"
        for fr in self._rest + self.dec.feed(data):
            if fr.header["t"] == "event":
                self.events.append((fr.header, bytes(fr.payload)))
            else:
                self.replies[fr.header["id"]] = fr.header
        self._rest = []

    def send(self, verb: str, payload: bytes = b"", **fields) -> int:
        rid = self.next_id
        self.next_id += 1
        self.w.writelines(encode_frame({"t": verb, "id": rid, **fields}, payload))
        return rid

    async def reply(self, rid: int) -> dict:
        while rid not in self.replies:
            await self._pump()
        return self.replies.pop(rid)

    async def call(self, verb: str, payload: bytes = b"", **fields) -> dict:
        h = await self.reply(self.send(verb, payload, **fields))
        assert h["t"] == "ok", h
        return h

    async def refused(self, verb: str, payload: bytes = b"", **fields) -> dict:
        h = await self.reply(self.send(verb, payload, **fields))
        assert h["t"] == "err", h
        return h

    async def event(self, kind: str | None = None, timeout: float = 10.0):
        async def wait():
            while not self.events:
                await self._pump()
        await asyncio.wait_for(wait(), timeout)
        h, p = self.events.pop(0)
        if kind is not None:
            assert h["cm"] == kind, h
        return h, p

    def close(self) -> None:
        self.w.close()


async def listener(s: Session, port: int, backlog: int = 4) -> int:
    lid = (await s.call("cm_create_id", ps=cm.PS_TCP))["cmid"]
    await s.call("cm_bind", cmid=lid, ip="0.0.0.0", port=port)
    await s.call("cm_listen", cmid=lid, backlog=backlog)
    return lid


async def resolved(s: Session, port: int) -> int:
    cid = (await s.call("cm_create_id", ps=cm.PS_TCP))["cmid"]
    await s.call("cm_resolve_addr", cmid=cid, ip="127.0.0.1", port=port)
    await s.event("addr_resolved")
    await s.call("cm_resolve_route", cmid=cid)
    await s.event("route_resolved")
    return cid


async def make_qp(s: Session, qp_type: int = 2) -> int:
    """A QP of session ``s`` on the daemon's device (RC, or ``qp_type`` 4 for UD): its
    number, which the CM calls of that session may name (and no other session's may)."""
    ctx = (await s.call("open_device", name="mlx5_0"))["ctx"]
    pd = (await s.call("alloc_pd", ctx=ctx))["pd"]
    cq = (await s.call("create_cq", ctx=ctx, cqe=16))["cq"]
    r = await s.call("create_qp", pd=pd, scq=cq, rcq=cq, qp_type=qp_type, max_send_wr=4,
                     max_recv_wr=4, max_send_sge=1, max_recv_sge=1, max_inline_data=0,
                     sq_sig_all=False, send_ops_flags=0)
    return r["qp_num"]


def connect_fields(cid: int, qpn: int, psn: int = 0x123) -> dict:
    return {"cmid": cid, "qpn": qpn, "psn": psn, "responder_resources": 1,
            "initiator_depth": 1, "retry_count": 7, "rnr_retry_count": 7}


async def test_connect_accept_establish_disconnect():
    async with daemon() as d:
        srv, cli = await Session.open(d), await Session.open(d)
        lid = await listener(srv, 7174)
        cid = await resolved(cli, 7174)
        cqp, sqp = await make_qp(cli), await make_qp(srv)
        await cli.call("cm_connect", b"hello", **connect_fields(cid, cqp))
        h, pdata = await srv.event("connect_request")
        assert h["listen"] == lid and h["qpn"] == cqp and h["psn"] == 0x123
        # Received private data fills the REQ's field: the bytes sent, then zeros.
        assert pdata == b"hello" + bytes(51)
        child = h["cmid"]
        await srv.call("cm_accept", b"welcome", cmid=child, qpn=sqp, psn=0x456,
                       responder_resources=1, initiator_depth=1, rnr_retry_count=7)
        h, pdata = await cli.event("connect_response")
        assert (h["qpn"], h["psn"]) == (sqp, 0x456) and pdata == b"welcome" + bytes(189)
        # The GIDs the library's RTR uses: fe80::<IPv4>:<port>:<dev>, this daemon's.
        assert h["dgid"] == bytes.fromhex("fe80000000000000 7f000001".replace(" ", "")) \
            + d.port.to_bytes(2, "big") + bytes(2)
        await cli.call("cm_establish", cmid=cid)
        await srv.event("established")
        await cli.call("cm_disconnect", cmid=cid)
        await srv.event("disconnected")
        await cli.event("disconnected")
        # The passive side's own rdma_disconnect after the peer's is no error.
        await srv.call("cm_disconnect", cmid=child)
        for s, ids in ((cli, [cid]), (srv, [child, lid])):
            for i in ids:
                await s.call("cm_destroy_id", cmid=i)
        assert d.cm.counts() == {"ids": 0, "listeners": 0, "timers": 0, "remote": 0}
        srv.close()
        cli.close()


async def test_private_data_longer_than_the_message_carries_is_einval():
    async with daemon() as d:
        srv, cli = await Session.open(d), await Session.open(d)
        await listener(srv, 7175)
        cid = await resolved(cli, 7175)
        cqp, sqp = await make_qp(cli), await make_qp(srv)
        e = await cli.refused("cm_connect", b"x" * 57, **connect_fields(cid, cqp))
        assert e["errno"] == "EINVAL" and "56" in e["msg"]
        # Refused whole: the id may still connect, with 56 bytes.
        await cli.call("cm_connect", b"x" * 56, **connect_fields(cid, cqp))
        h, _ = await srv.event("connect_request")
        child = h["cmid"]
        e = await srv.refused("cm_accept", b"x" * 197, cmid=child, qpn=sqp, psn=0,
                              responder_resources=1, initiator_depth=1, rnr_retry_count=7)
        assert e["errno"] == "EINVAL" and "196" in e["msg"]
        e = await srv.refused("cm_reject", b"x" * 149, cmid=child)
        assert e["errno"] == "EINVAL" and "148" in e["msg"]
        await srv.call("cm_reject", b"no thanks", cmid=child)
        h, pdata = await cli.event("rejected")
        assert h["status"] == cm.REJ_CONSUMER and pdata == b"no thanks" + bytes(139)
        srv.close()
        cli.close()


async def test_connects_to_nobody_past_the_id_bound_are_rejected_and_leak_nothing():
    """2,500 ids on one session, 500 at a time, each connected to nobody, rejected and
    destroyed: more than twice the ids a session may hold (MAX_IDS), so an id whose
    destruction did not give its slot back would be refused before the end."""
    async with daemon() as d:
        s = await Session.open(d)
        qpn = await make_qp(s)
        fds = len(os.listdir("/proc/self/fd"))
        n, batch = 2_500, 500
        assert n > 2 * MAX_IDS
        for _ in range(n // batch):
            rids = [s.send("cm_create_id", ps=cm.PS_TCP) for _ in range(batch)]
            ids = [(await s.reply(r))["cmid"] for r in rids]
            for i in ids:
                s.send("cm_resolve_addr", cmid=i, ip="127.0.0.1", port=9)
                s.send("cm_resolve_route", cmid=i)
                s.send("cm_connect", **connect_fields(i, qpn))
            seen = {}
            while len(seen) < batch:
                h, _ = await s.event()
                if h["cm"] == "rejected":
                    assert h["status"] == cm.REJ_INVALID_SERVICE_ID, h
                    seen[h["cmid"]] = h
            assert set(seen) == set(ids)
            for i in ids:
                s.send("cm_destroy_id", cmid=i)
            s.events.clear()
        await s.call("cm_counts")
        assert d.cm.counts() == {"ids": 0, "listeners": 0, "timers": 0, "remote": 0}
        # Nothing else holds on: no CMId object is left, no descriptor was opened.
        gc.collect()
        assert not [o for o in gc.get_objects() if type(o) is CMId]
        assert len(os.listdir("/proc/self/fd")) <= fds
        s.close()


async def test_a_listeners_backlog_overrun_drops_the_req_until_there_is_room():
    """A REQ past a listener's backlog is dropped unanswered, as the kernel's ucma and
    ib_cm drop it (no REJ, "to allow future retries"): the active side's CM sends it
    again, and once rdma_accept makes room it gets in; a REQ that never finds room ends
    UNREACHABLE with -ETIMEDOUT."""
    async with daemon() as d:
        d.cm.timing.response_timeout, d.cm.timing.max_retries = 0.2, 10
        srv, cli = await Session.open(d), await Session.open(d)
        await listener(srv, 7176, backlog=2)
        ids = [await resolved(cli, 7176) for _ in range(3)]
        cqp, sqp = await make_qp(cli), await make_qp(srv)
        for i in ids:
            await cli.call("cm_connect", **connect_fields(i, cqp))
        reqs = [(await srv.event("connect_request"))[0] for _ in range(2)]
        # The two pending REQs were acknowledged (MRA) and wait for their REP, never
        # resent; the third is dropped at each try, and only it is resent.
        await asyncio.sleep(1.0)
        assert d.counters["cm_backlog_drops"] >= 4 and not cli.events and not srv.events
        assert d.counters["cm_retransmissions"] == d.counters["cm_backlog_drops"] - 1
        # Accepting one makes room: the third REQ's next retransmission gets in.
        await srv.call("cm_accept", cmid=reqs[0]["cmid"], qpn=sqp, psn=0,
                       responder_resources=1, initiator_depth=1, rnr_retry_count=7)
        await cli.event("connect_response")
        h, _ = await srv.event("connect_request", timeout=5)
        assert h["cmid"] not in {r["cmid"] for r in reqs}
        # Full again (two pending): a fourth REQ is resent 3 times, then UNREACHABLE.
        d.cm.timing.max_retries = 2
        late = await resolved(cli, 7176)
        await cli.call("cm_connect", **connect_fields(late, cqp))
        h, _ = await cli.event("unreachable", timeout=5)
        assert h["cmid"] == late and h["status"] == -110
        srv.close()
        cli.close()


async def test_a_lost_req_is_sent_again_and_the_connection_completes():
    async with daemon() as d:
        d.cm.timing.response_timeout = 0.2
        srv, cli = await Session.open(d), await Session.open(d)
        await listener(srv, 7177)
        cid = await resolved(cli, 7177)
        cqp = await make_qp(cli)
        real = d.cm._transmit
        lost = []

        def lossy(peer, header, data):
            if header["m"] == "req" and not lost:
                lost.append(header)     # the first REQ never arrives
                return
            real(peer, header, data)

        d.cm._transmit = lossy
        await cli.call("cm_connect", **connect_fields(cid, cqp))
        h, _ = await srv.event("connect_request", timeout=5)
        assert lost and d.counters["cm_retransmissions"] == 1
        srv.close()
        cli.close()


async def test_a_req_never_answered_ends_unreachable():
    async with daemon() as d:
        d.cm.timing.response_timeout = 0.1
        d.cm.timing.max_retries = 2
        cli = await Session.open(d)
        cid = await resolved(cli, 7178)
        cqp = await make_qp(cli)
        real = d.cm._transmit
        d.cm._transmit = lambda p, h, data: None if h["m"] == "req" else real(p, h, data)
        await cli.call("cm_connect", **connect_fields(cid, cqp))
        h, _ = await cli.event("unreachable", timeout=5)
        assert h["status"] == -110          # -ETIMEDOUT, as rdma_cm reports it
        assert d.counters["cm_retransmissions"] == 2
        cli.close()


async def test_cm_messages_forged_on_the_wire_plane_are_refused():
    """A peer daemon's wire link (it proved the peer token) sends a DREQ and a REP for
    a connection it is no party to: both are refused and counted, and the connection
    stays up; a malformed message is refused the same way."""
    async with daemon() as d:
        srv, cli = await Session.open(d), await Session.open(d)
        await listener(srv, 7179)
        cid = await resolved(cli, 7179)
        cqp, sqp = await make_qp(cli), await make_qp(srv)
        await cli.call("cm_connect", **connect_fields(cid, cqp))
        h, _ = await srv.event("connect_request")
        child = h["cmid"]
        link = await open_link(d.host, d.port, "wire", PEER, timeout=5, max_frame=1 << 20,
                               src="127.0.0.1:1")
        before = d.counters["cm_messages_refused"]
        forged = [{"t": "cm", "m": "dreq", "lcid": cid, "rcid": child, "dev": 0},
                  {"t": "cm", "m": "rep", "lcid": child, "rcid": cid, "dev": 0, "qpn": 9,
                   "psn": 0, "rr": 1, "depth": 1, "rnr": 7},
                  {"t": "cm", "m": "bogus", "lcid": 1, "rcid": 1, "dev": 0}]
        for f in forged:
            link.writer.writelines(encode_frame(f))
        await link.writer.drain()
        for _ in range(100):
            if d.counters["cm_messages_refused"] - before == 3:
                break
            await asyncio.sleep(0.02)
        assert d.counters["cm_messages_refused"] - before == 3
        # Nothing reached either side: the real REP still connects them.
        await srv.call("cm_accept", cmid=child, qpn=sqp, psn=0, responder_resources=1,
                       initiator_depth=1, rnr_retry_count=7)
        h, _ = await cli.event("connect_response")
        assert h["qpn"] == sqp
        assert not srv.events
        link.writer.close()
        srv.close()
        cli.close()


@pytest.mark.parametrize("verb,fields", [("cm_listen", {"backlog": 1}),
                                         ("cm_accept", None), ("cm_establish", {})])
async def test_calls_in_the_wrong_state_are_einval(verb, fields):
    async with daemon() as d:
        s = await Session.open(d)
        cid = (await s.call("cm_create_id", ps=cm.PS_TCP))["cmid"]
        if fields is None:
            fields = {"qpn": 1, "psn": 0, "responder_resources": 1, "initiator_depth": 1,
                      "rnr_retry_count": 7}
        e = await s.refused(verb, cmid=cid, **fields)
        assert e["errno"] == "EINVAL", e
        e = await s.refused("cm_bind", cmid=cid + 1000, ip="0.0.0.0", port=1)
        assert e["errno"] == "ENOENT"
        s.close()


async def test_a_connect_or_accept_naming_another_sessions_qp_is_refused():
    """The attack: a session names a QP it does not own (its neighbour's, whose number
    it learnt) in rdma_connect or rdma_accept, so that the peer would connect to that
    QP. EINVAL, and nothing is sent: the victim's QP is never named on the wire."""
    async with daemon() as d:
        srv, cli, victim = (await Session.open(d), await Session.open(d),
                            await Session.open(d))
        await listener(srv, 7180)
        cid = await resolved(cli, 7180)
        theirs, mine = await make_qp(victim), await make_qp(cli)
        out = d.counters["cm_messages_out"]
        for qpn in (theirs, 0xABCDE if 0xABCDE not in (theirs, mine) else 0xABCDF):
            e = await cli.refused("cm_connect", **connect_fields(cid, qpn))
            assert e["errno"] == "EINVAL" and "no QP of this process" in e["msg"], e
        assert d.counters["cm_messages_out"] == out
        # The id is unharmed: with its own QP it connects.
        await cli.call("cm_connect", **connect_fields(cid, mine))
        h, _ = await srv.event("connect_request")
        assert h["qpn"] == mine
        e = await srv.refused("cm_accept", cmid=h["cmid"], qpn=theirs, psn=0,
                              responder_resources=1, initiator_depth=1, rnr_retry_count=7)
        assert e["errno"] == "EINVAL", e
        await srv.call("cm_accept", cmid=h["cmid"], qpn=await make_qp(srv), psn=0,
                       responder_resources=1, initiator_depth=1, rnr_retry_count=7)
        await cli.event("connect_response")
        for s in (srv, cli, victim):
            s.close()


def test_a_cm_fault_rule_only_drops():
    """A fault rule naming a CM message kind drops it and nothing else: another action,
    or a packet field beside it, is EINVAL; an unknown kind is EINVAL with the list."""
    from softhca.protocol.errors import RDMAError
    from softhca.server.faults import validate_rule

    assert validate_rule({"action": "drop", "cm": "req", "count": 1})["direction"] == "out"
    for bad in ({"action": "corrupt", "cm": "req", "block": 0, "block_size": 8},
                {"action": "drop", "cm": "req", "qp": 5},
                {"action": "drop", "cm": "hello"}):
        with pytest.raises(RDMAError) as e:
            validate_rule(bad)
        assert e.value.errno_name == "EINVAL", bad


async def _established(d: Daemon, port: int):
    """Two sessions of ``d`` connected through it: (srv, cli, listener, child, cid)."""
    srv, cli = await Session.open(d), await Session.open(d)
    lid = await listener(srv, port)
    cid = await resolved(cli, port)
    cqp, sqp = await make_qp(cli), await make_qp(srv)
    await cli.call("cm_connect", **connect_fields(cid, cqp))
    h, _ = await srv.event("connect_request")
    child = h["cmid"]
    await srv.call("cm_accept", cmid=child, qpn=sqp, psn=0, responder_resources=1,
                   initiator_depth=1, rnr_retry_count=7)
    await cli.event("connect_response")
    await cli.call("cm_establish", cmid=cid)
    await srv.event("established")
    return srv, cli, lid, child, cid


async def test_a_drep_after_the_id_is_destroyed_is_dropped_without_a_word(caplog):
    """rdma_disconnect then rdma_destroy_id at once (one write): the id goes in
    DREQ_SENT, and the peer's DREP then names no id. The IB CM drops such a DREP
    silently (cm_drep_handler): counted as discarded, nothing refused, no warning in
    the daemon's log, and the peer's side disconnects as usual."""
    async with daemon() as d:
        srv, cli, lid, child, cid = await _established(d, 7181)
        refused = d.counters["cm_messages_refused"]
        caplog.clear()
        r1 = cli.send("cm_disconnect", cmid=cid)
        r2 = cli.send("cm_destroy_id", cmid=cid)
        assert (await cli.reply(r1))["t"] == "ok" and (await cli.reply(r2))["t"] == "ok"
        await srv.event("disconnected")
        for _ in range(100):
            if d.counters.get("cm_dreps_discarded") or d.counters["cm_messages_refused"] > refused:
                break
            await asyncio.sleep(0.02)
        assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
        assert d.counters["cm_messages_refused"] == refused
        assert d.counters["cm_dreps_discarded"] == 1
        await srv.call("cm_destroy_id", cmid=child)
        await srv.call("cm_destroy_id", cmid=lid)
        assert d.counters["cm_messages_refused"] == refused
        assert d.cm.counts() == {"ids": 0, "listeners": 0, "timers": 0, "remote": 0}
        srv.close()
        cli.close()


async def test_a_dreq_for_an_id_gone_is_answered_with_a_drep(caplog):
    """A DREQ naming no id (the peer's, sent after this side's program destroyed its
    id) is answered with a DREP, as the IB CM's cm_dreq_handler answers it, so that
    the peer's disconnect completes at once; the DREP naming no id at the daemon that
    sent the DREQ is dropped there. Neither daemon refuses or warns."""
    async with daemon() as d1, daemon() as d2:
        caplog.clear()
        # d2's wire link to d1: the DREQ comes from d2, and d1 answers d2
        link = await open_link(d1.host, d1.port, "wire", PEER, timeout=5,
                               max_frame=1 << 20, src=f"127.0.0.1:{d2.port}")
        link.writer.writelines(encode_frame({"t": "cm", "m": "dreq", "lcid": 4242,
                                             "rcid": 777777, "dev": 0}))
        await link.writer.drain()
        for _ in range(200):
            if d2.counters.get("cm_dreps_discarded") or d1.counters["cm_messages_refused"]:
                break
            await asyncio.sleep(0.02)
        assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
        assert d1.counters["cm_messages_refused"] == d2.counters["cm_messages_refused"] == 0
        assert d1.counters["cm_dreqs_answered_after"] == 1
        assert d2.counters["cm_dreps_discarded"] == 1
        link.writer.close()
