"""protocol/session.py without sockets: a client-role and a server-role ControlSession
talking to each other through bytes in memory, as the client (client/connection.py)
and the daemon (server/session.py) drive them."""

from __future__ import annotations

import pytest

from softhca.protocol import control
from softhca.protocol.control import credits_from_wire
from softhca.protocol.errors import RDMAError
from softhca.protocol.frames import FrameError, frame_bytes
from softhca.protocol.kinds import FrameKind
from softhca.protocol.session import (
    Broken,
    Call,
    Closed,
    Completions,
    ControlSession,
    Failed,
    Pushed,
    Refused,
    Reply,
    Role,
)


def pair() -> tuple[ControlSession, ControlSession]:
    return (ControlSession(Role.CLIENT, max_frame=1 << 20, peer="127.0.0.1:4791"),
            ControlSession(Role.SERVER, max_frame=1 << 20, peer="127.0.0.1:5555"))


def wire(src: ControlSession) -> bytes:
    return b"".join(bytes(b) for b in src.data_to_send())


def carry(src: ControlSession, dst: ControlSession, *, bytewise: bool = False) -> list:
    """Move what ``src`` queued to ``dst``; return ``dst``'s events."""
    data = wire(src)
    if not bytewise:
        return dst.receive_data(data)
    events: list = []
    for i in range(len(data)):
        events += dst.receive_data(data[i:i + 1])
    return events


def test_a_request_and_its_reply():
    client, server = pair()
    rid = client.send_request("open_device", name="mlx5_0")
    assert client.outstanding == 1
    [req] = carry(client, server)
    assert req == Call(rid, control.OpenDevice(name="mlx5_0"))
    server.reply(rid, b"data", ctx=1, name="mlx5_0")
    [rep] = carry(server, client)
    assert isinstance(rep, Reply) and rep.rid == rid
    assert rep.header["ctx"] == 1 and bytes(rep.payload) == b"data"
    assert client.outstanding == 0


def test_the_bytes_are_the_wire_format_of_docs_protocol():
    client, server = pair()
    client.send_request("devices")
    assert wire(client) == frame_bytes({"t": "devices", "id": 1})
    server.reply(1, ctx=2)
    assert wire(server) == frame_bytes({"t": "ok", "id": 1, "ctx": 2})
    server.send_error(3, RDMAError("ENOENT", "no such"))
    assert wire(server) == frame_bytes({"t": "err", "id": 3, "errno": "ENOENT",
                                        "msg": "no such"})
    server.push_completions(5, [{"wr_id": 1}])
    assert wire(server) == frame_bytes({"t": "wc", "cq": 5, "wcs": [{"wr_id": 1}]})
    server.push_event({"t": "event", "kind": "trace", "stage": "x"}, b"\x01")
    assert wire(server) == frame_bytes({"t": "event", "kind": "trace", "stage": "x"}, b"\x01")
    assert FrameKind.OK == "ok" and f"{FrameKind.WC}" == "wc" and str(FrameKind.ERR) == "err"
    assert {FrameKind.EVENT: 1}["event"] == 1


def test_an_error_reply_fails_its_request_only():
    client, server = pair()
    a = client.send_request("alloc_pd", ctx=9)
    b = client.send_request("devices")
    ra, rb = carry(client, server)
    server.send_error(ra.rid, RDMAError("ENOENT", "handle 9 is not a ctx"))
    server.reply(rb.rid, devices=["mlx5_0"])
    fa, ok = carry(server, client)
    assert isinstance(fa, Failed) and fa.rid == a
    assert fa.error.errno_name == "ENOENT" and fa.error.message == "handle 9 is not a ctx"
    assert isinstance(ok, Reply) and ok.rid == b
    assert client.closed is None


def test_replies_out_of_order_match_their_requests():
    # A poll_cq that waits is answered after the requests that follow it.
    client, server = pair()
    rids = [client.send_request("devices") for _ in range(3)]
    reqs = carry(client, server)
    for r in reversed(reqs):
        server.reply(r.rid, n=r.rid)
    got = carry(server, client, bytewise=True)
    assert [e.rid for e in got] == rids[::-1]
    assert all(e.header["n"] == e.rid for e in got)


def test_a_reply_to_no_outstanding_request_breaks_the_session():
    client, server = pair()
    first = client.send_request("devices")
    carry(client, server)
    server.reply(first)
    server.reply(first)          # twice
    events = carry(server, client)
    assert isinstance(events[0], Reply)
    broken, closed = events[1:]
    assert isinstance(broken, Broken) and broken.error.errno_name == "EPROTO"
    assert "not outstanding" in broken.error.message
    assert closed == Closed(broken.error, ())
    with pytest.raises(RDMAError) as e:
        client.send_request("devices")
    assert e.value.errno_name == "EPROTO"
    # Once closed, what else arrives changes nothing.
    server.reply(7)
    assert carry(server, client) == []


def test_an_error_about_no_request_is_the_reason_the_session_ends():
    client, server = pair()
    pending = client.send_request("devices")
    carry(client, server)
    server.send_error(0, RDMAError("EBUSY", "going away"))
    assert carry(server, client) == []          # remembered, nothing fails yet
    [closed] = client.receive_data(b"")
    assert closed.error.errno_name == "EBUSY" and closed.failed == (pending,)
    assert client.error is closed.error


def test_the_end_of_the_stream_fails_what_is_outstanding():
    client, _ = pair()
    rids = (client.send_request("devices"), client.send_request("counters"))
    [closed] = client.receive_data(b"")
    assert closed.failed == rids
    assert closed.error.errno_name == "ECONNRESET"
    assert "127.0.0.1:4791 closed the connection" in closed.error.message
    assert client.receive_data(b"") == []
    assert client.connection_lost() is closed


def test_pushed_completions_are_kept_until_polled_and_their_room_credited():
    client, server = pair()
    server.push_completions(4, [{"wr_id": k} for k in range(3)])
    server.push_completions(6, [{"wr_id": 9}])
    events = carry(server, client)
    assert events == [Completions(4, 3), Completions(6, 1)]
    assert client.completions(4) == 3 and client.completions(5) == 0
    assert client.take_completions(4, 2) == [{"wr_id": 0}, {"wr_id": 1}]
    assert client.take_completions(6, 5) == [{"wr_id": 9}]
    assert client.take_completions(5, 1) == []
    assert client.credits_owed
    # The credits go in front of the next request...
    rid = client.send_request("devices")
    credit, req = carry(client, server)
    assert credit == Call(0, control.CqCredit(credits=((4, 2), (6, 1))))
    assert req.rid == rid and not client.credits_owed
    # ... or on their own when the driver flushes them.
    client.take_completions(4, 1)
    assert client.flush_credits() and not client.flush_credits()
    [credit] = carry(client, server)
    assert credit.request.credits == ((4, 1),)


def test_a_destroyed_cq_takes_its_completions_and_credits_with_it():
    client, server = pair()
    server.push_completions(4, [{"wr_id": 1}, {"wr_id": 2}])
    carry(server, client)
    client.take_completions(4, 1)
    client.forget_cq(4)
    assert client.completions(4) == 0 and not client.credits_owed


def test_completions_received_before_the_end_are_still_there_and_owe_nothing():
    client, server = pair()
    server.push_completions(4, [{"wr_id": 1}])
    carry(server, client)
    client.receive_data(b"")
    assert client.take_completions(4, 1) == [{"wr_id": 1}]
    assert not client.credits_owed and not client.flush_credits()


def test_many_credits_go_in_frames_the_daemon_accepts():
    client, server = pair()
    for cq in range(1, 2500):
        server.push_completions(cq, [{"wr_id": 0}])
    carry(server, client)
    for cq in range(1, 2500):
        client.take_completions(cq, 1)
    client.flush_credits()
    frames = carry(client, server)
    assert [len(f.request.credits) for f in frames] == [1024, 1024, 451]


def test_pushed_events():
    client, server = pair()
    server.push_event({"t": "event", "kind": "packet", "dir": "tx"}, b"\xaa" * 3)
    [ev] = carry(server, client)
    assert isinstance(ev, Pushed) and ev.kind == "packet" and ev.header["dir"] == "tx"
    assert bytes(ev.payload) == b"\xaa" * 3


def test_a_request_that_breaks_its_schema_is_refused_and_the_session_goes_on():
    client, server = pair()
    client.send_request("no_such_verb")
    client.send_request("alloc_pd", ctx="x")
    ok = client.send_request("devices")
    r1, r2, r3 = carry(client, server)
    assert isinstance(r1, Refused) and r1.error.errno_name == "EPROTO"
    assert "no_such_verb" in r1.error.message and r1.rid == 1
    assert isinstance(r2, Refused) and r2.rid == 2
    assert isinstance(r3, Call) and r3.rid == ok
    assert server.closed is None and wire(server) == b""
    server.send_error(r1.rid, r1.error)
    [failed] = carry(server, client)
    assert isinstance(failed, Failed) and failed.rid == 1
    assert (failed.error.errno_name, failed.error.message) == ("EPROTO", r1.error.message)


def test_a_client_that_breaks_the_framing_gets_an_error_then_the_end():
    client, server = pair()
    server.receive_frames([])
    events = server.receive_data(b"\x00\x00\x00\x01garbage")
    broken, closed = events
    assert isinstance(broken, Broken) and broken.error.errno_name == "EPROTO"
    assert closed == Closed(None, ())
    # The server role says why (id 0), which the client takes as its reason.
    assert carry(server, client) == []
    [end] = client.receive_data(b"")
    assert end.error.errno_name == "EPROTO"
    assert server.receive_data(frame_bytes({"t": "devices", "id": 1})) == []


def test_a_frame_over_the_limit_is_emsgsize():
    server = ControlSession(Role.SERVER, max_frame=64)
    broken, _ = server.receive_data(frame_bytes({"t": "mr_write", "id": 1}, b"x" * 100))
    assert broken.error.errno_name == "EMSGSIZE"


@pytest.mark.parametrize("header", [
    {"t": "devices", "id": 1},                      # a request, sent to the client
    {"t": "hello", "version": 1},                   # a handshake frame after the HELLO
    {"t": "wc", "cq": "x", "wcs": []},              # a malformed push
    {"t": "wc", "cq": 1},
    {"t": "ok", "id": [1]},                         # an id that is no id
    {"t": "err", "id": 1, "errno": "EWHAT", "msg": "?"},
])
def test_a_daemon_that_breaks_the_protocol_ends_the_session(header):
    client, _ = pair()
    rid = client.send_request("devices")
    broken, closed = client.receive_data(frame_bytes(header))
    assert isinstance(broken, Broken) and broken.error.errno_name == "EPROTO"
    assert closed.failed == (rid,) and closed.error is broken.error


def test_frames_split_anywhere_decode_alike():
    client, server = pair()
    for k in range(5):
        client.send_request("mr_write", b"\x01" * k * 7, mr=1, offset=k)
    reqs = carry(client, server, bytewise=True)
    assert [(r.request.offset, bytes(r.request.data)) for r in reqs] == \
        [(k, b"\x01" * k * 7) for k in range(5)]


def test_each_role_does_only_its_own_part():
    client, server = pair()
    with pytest.raises(TypeError):
        client.reply(1)
    with pytest.raises(TypeError):
        client.push_completions(1, [])
    with pytest.raises(TypeError):
        server.send_request("devices")


@pytest.mark.parametrize("credits", [[[1]], [["x", 1]], [[1, 0]], [[1, True]], [7],
                                     [[1, 1 << 40]], [[0, 1]], [[1, 65]]])
def test_credits_from_wire_refuses_a_malformed_pair(credits):
    with pytest.raises(FrameError) as e:
        credits_from_wire(credits, 64)
    assert e.value.errno_name == "EPROTO" and "credits[0]" in e.value.message


def test_credits_from_wire_sums_per_cq():
    assert credits_from_wire([[3, 2], [5, 1], [3, 4]], 64) == {3: 6, 5: 1}
