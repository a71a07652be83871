"""SIDR for RDMA_PS_UDP ids (server/cm_sidr.py) driven by hand-written control
requests: resolution with private data each way, rdma_reject, the private data bounds
of rdma_connect(3) / rdma_accept(3) for UD (180 and 136 bytes), and SIDR messages
forged or malformed on the wire plane."""

from __future__ import annotations

import asyncio

from test_cm import PEER, Session, connect_fields, daemon, make_qp

from softhca.protocol import cm
from softhca.protocol.frames import encode_frame
from softhca.server.link import open_link

RDMA_UDP_QKEY = 0x01234567      # rdma_cma.h's value, the Q_Key of RDMA_PS_UDP ids


async def ud_listener(s: Session, port: int) -> int:
    lid = (await s.call("cm_create_id", ps=cm.PS_UDP))["cmid"]
    await s.call("cm_bind", cmid=lid, ip="0.0.0.0", port=port)
    await s.call("cm_listen", cmid=lid, backlog=4)
    return lid


async def ud_resolved(s: Session, port: int) -> int:
    cid = (await s.call("cm_create_id", ps=cm.PS_UDP))["cmid"]
    await s.call("cm_resolve_addr", cmid=cid, ip="127.0.0.1", port=port)
    await s.event("addr_resolved")
    await s.call("cm_resolve_route", cmid=cid)
    await s.event("route_resolved")
    return cid


async def make_ud_qp(s: Session) -> int:
    """A UD QP of session ``s``: the only QP its SIDR_REP may name."""
    return await make_qp(s, qp_type=4)


async def ud_connect_fields(s: Session, cid: int) -> dict:
    # librdmacm names the id's UD QP, though a SIDR_REQ carries no QP number.
    return connect_fields(cid, await make_ud_qp(s))


def accept_fields(child: int, qpn: int) -> dict:
    return {"cmid": child, "qpn": qpn, "psn": 0, "responder_resources": 0,
            "initiator_depth": 0, "rnr_retry_count": 0}


async def test_sidr_resolution_gives_the_peers_qpn_and_qkey():
    async with daemon() as d:
        srv, cli = await Session.open(d), await Session.open(d)
        lid = await ud_listener(srv, 7174)
        cid = await ud_resolved(cli, 7174)
        await cli.call("cm_connect", b"hello", **(await ud_connect_fields(cli, cid)))
        h, pdata = await srv.event("connect_request")
        assert h["listen"] == lid and pdata == b"hello" + bytes(175)
        child = h["cmid"]
        qpn = await make_ud_qp(srv)
        await srv.call("cm_accept", b"welcome", **accept_fields(child, qpn))
        h, pdata = await cli.event("established")
        assert (h["qpn"], h["qkey"]) == (qpn, RDMA_UDP_QKEY)
        assert pdata == b"welcome" + bytes(129)
        assert h["dgid"] == bytes.fromhex("fe800000000000007f000001") \
            + d.port.to_bytes(2, "big") + bytes(2)
        # No RTU: the passive side hears nothing more; a UD id has no DREQ either.
        await cli.call("cm_disconnect", cmid=cid)
        await asyncio.sleep(0.05)
        assert not srv.events and not cli.events
        for s, ids in ((cli, [cid]), (srv, [child, lid])):
            for i in ids:
                await s.call("cm_destroy_id", cmid=i)
        assert d.cm.counts() == {"ids": 0, "listeners": 0, "timers": 0, "remote": 0}
        srv.close()
        cli.close()


async def test_ud_private_data_bounds_and_reject():
    async with daemon() as d:
        srv, cli = await Session.open(d), await Session.open(d)
        await ud_listener(srv, 7175)
        cid = await ud_resolved(cli, 7175)
        e = await cli.refused("cm_connect", b"x" * 181, **(await ud_connect_fields(cli, cid)))
        assert e["errno"] == "EINVAL" and "SIDR_REQ carries at most 180" in e["msg"], e
        await cli.call("cm_connect", b"x" * 180, **(await ud_connect_fields(cli, cid)))
        h, pdata = await srv.event("connect_request")
        assert pdata == b"x" * 180
        child = h["cmid"]
        e = await srv.refused("cm_accept", b"x" * 137,
                              **accept_fields(child, await make_ud_qp(srv)))
        assert e["errno"] == "EINVAL" and "136" in e["msg"]
        e = await srv.refused("cm_reject", b"x" * 137, cmid=child)
        assert e["errno"] == "EINVAL" and "136" in e["msg"]
        await srv.call("cm_reject", b"no thanks", cmid=child)
        # rdma_cm reports a SIDR_REP that does not accept as UNREACHABLE, its status
        # the SIDR_REP's (2: rejected).
        h, pdata = await cli.event("unreachable")
        assert h["status"] == 2 and pdata == b"no thanks" + bytes(127)
        srv.close()
        cli.close()


async def test_a_sidr_req_to_nobody_is_unreachable_status_1():
    async with daemon() as d:
        cli = await Session.open(d)
        cid = await ud_resolved(cli, 7176)
        await cli.call("cm_connect", **(await ud_connect_fields(cli, cid)))
        h, _ = await cli.event("unreachable")
        assert h["status"] == 1
        cli.close()


async def test_sidr_messages_forged_on_the_wire_plane_are_refused():
    async with daemon() as d:
        srv, cli = await Session.open(d), await Session.open(d)
        await ud_listener(srv, 7177)
        cid = await ud_resolved(cli, 7177)
        await cli.call("cm_connect", **(await ud_connect_fields(cli, cid)))
        h, _ = await srv.event("connect_request")
        child = h["cmid"]
        link = await open_link(d.host, d.port, "wire", PEER, timeout=5, max_frame=1 << 20,
                               src="127.0.0.1:1")
        before = d.counters["cm_messages_refused"]
        rep = {"t": "cm", "m": "sidr_rep", "lcid": child, "rcid": cid, "dev": 0,
               "status": 0, "qpn": 9, "qkey": 1}
        forged = [
            (rep, b""),                                              # not its peer
            ({**rep, "m": "rep", "psn": 0, "rr": 1, "depth": 1, "rnr": 7}, b""),
            ({**rep, "qpn": 0}, b""),                                # accepts, no QP
            ({"t": "cm", "m": "req", "lcid": 5, "rcid": 0, "dev": 0, "ps": cm.PS_UDP,
              "port": 7177, "sip": "127.0.0.1", "sport": 1, "dip": "127.0.0.1",
              "qpn": 1, "psn": 0, "rr": 1, "depth": 1, "retry": 7, "rnr": 7}, b""),
            ({"t": "cm", "m": "sidr_req", "lcid": 6, "rcid": 0, "dev": 0,
              "ps": cm.PS_TCP, "port": 7177, "sip": "127.0.0.1", "sport": 1,
              "dip": "127.0.0.1"}, b""),
            ({"t": "cm", "m": "sidr_req", "lcid": 7, "rcid": 0, "dev": 0,
              "ps": cm.PS_UDP, "port": 7177, "sip": "127.0.0.1", "sport": 1,
              "dip": "127.0.0.1"}, b"x" * 181),                      # too long
        ]
        for f, p in forged:
            link.writer.writelines(encode_frame(f, p))
        await link.writer.drain()
        for _ in range(100):
            if d.counters["cm_messages_refused"] - before == len(forged):
                break
            await asyncio.sleep(0.02)
        assert d.counters["cm_messages_refused"] - before == len(forged)
        # Nothing reached either side: the real SIDR_REP still resolves.
        qpn = await make_ud_qp(srv)
        await srv.call("cm_accept", **accept_fields(child, qpn))
        h, _ = await cli.event("established")
        assert h["qpn"] == qpn
        assert not srv.events
        link.writer.close()
        srv.close()
        cli.close()


async def test_an_rc_message_for_a_ud_id_is_refused_even_from_its_peer():
    """A REP (or DREQ) from the very daemon a UD id resolves with is still refused: a
    UD id takes only a SIDR_REP, so an RC message cannot move it."""
    async with daemon() as d:
        srv, cli = await Session.open(d), await Session.open(d)
        await ud_listener(srv, 7178)
        cid = await ud_resolved(cli, 7178)
        await cli.call("cm_connect", **(await ud_connect_fields(cli, cid)))
        h, _ = await srv.event("connect_request")
        child = h["cmid"]
        link = await open_link(d.host, d.port, "wire", PEER, timeout=5, max_frame=1 << 20,
                               src=f"127.0.0.1:{d.port}")
        before = d.counters["cm_messages_refused"]
        for f in ({"t": "cm", "m": "rep", "lcid": child, "rcid": cid, "dev": 0, "qpn": 9,
                   "psn": 0, "rr": 1, "depth": 1, "rnr": 7},
                  {"t": "cm", "m": "dreq", "lcid": cid, "rcid": child, "dev": 0}):
            link.writer.writelines(encode_frame(f))
        await link.writer.drain()
        for _ in range(100):
            if d.counters["cm_messages_refused"] - before == 2:
                break
            await asyncio.sleep(0.02)
        assert d.counters["cm_messages_refused"] - before == 2
        assert not cli.events and not srv.events
        link.writer.close()
        srv.close()
        cli.close()


async def test_a_sidr_rep_naming_a_qp_not_the_callers_or_not_ud_is_refused():
    """rdma_accept on a UD id answers with the QP number the peer will send datagrams
    to: another session's UD QP, or the caller's own RC QP, is EINVAL and nothing is
    sent; the caller's own UD QP then resolves."""
    async with daemon() as d:
        srv, cli, other = (await Session.open(d), await Session.open(d),
                           await Session.open(d))
        await ud_listener(srv, 7179)
        cid = await ud_resolved(cli, 7179)
        await cli.call("cm_connect", **(await ud_connect_fields(cli, cid)))
        h, _ = await srv.event("connect_request")
        child = h["cmid"]
        for qpn in (await make_ud_qp(other), await make_qp(srv)):
            e = await srv.refused("cm_accept", **accept_fields(child, qpn))
            assert e["errno"] == "EINVAL" and "no QP of this process" in e["msg"], e
        await asyncio.sleep(0.05)
        assert not cli.events
        qpn = await make_ud_qp(srv)
        await srv.call("cm_accept", **accept_fields(child, qpn))
        h, _ = await cli.event("established")
        assert h["qpn"] == qpn
        for s in (srv, cli, other):
            s.close()
