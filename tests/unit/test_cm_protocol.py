"""The connection manager's message limits (protocol/cm.py) and state machine
(engine/cm.py), without a daemon."""

from __future__ import annotations

import pytest

from softhca.engine.cm import CMId, CMState, backlog_of
from softhca.protocol import cm
from softhca.protocol.errors import RDMAError
from softhca.protocol.frames import FrameError

# rdma_connect(3) / rdma_accept(3) / rdma_reject(3): what an RC connection's REQ, REP
# and REJ carry for the user on RoCE (IBTA's 92, 196 and 148 bytes; the REQ less the
# 36-byte rdma_cm header).
LIMITS = {"req": 56, "rep": 196, "rej": 148}


@pytest.mark.parametrize("kind,limit", sorted(LIMITS.items()))
def test_private_data_limits(kind, limit):
    assert cm.check_private_data(kind, b"x" * limit) == b"x" * limit
    with pytest.raises(RDMAError) as e:
        cm.check_private_data(kind, b"x" * (limit + 1))
    assert e.value.errno_name == "EINVAL" and str(limit) in e.value.message


def req(**over) -> dict:
    h = {"t": "cm", "m": "req", "lcid": 7, "rcid": 0, "dev": 0, "ps": cm.PS_TCP,
         "port": 7174, "sip": "10.0.0.2", "sport": 40000, "dip": "10.0.0.1", "qpn": 17,
         "psn": 5, "rr": 1, "depth": 1, "retry": 7, "rnr": 7}
    h.update(over)
    return h


def test_a_req_decodes_with_its_private_data():
    m = cm.decode_message(req(), b"hello")
    assert m["qpn"] == 17 and m["private_data"] == b"hello"
    assert cm.padded("req", b"hello") == b"hello" + bytes(51)


@pytest.mark.parametrize("header,payload,why", [
    (req(m="lap"), b"", "unknown CM message"),
    (req(qpn=0), b"", "qpn"),
    (req(psn=1 << 24), b"", "psn"),
    (req(retry=8), b"", "retry"),
    (req(extra=1), b"", "unknown field"),
    (req(), b"x" * 57, "private data"),
    ({"t": "cm", "m": "rep", "lcid": 3, "rcid": 0, "dev": 0, "qpn": 1, "psn": 0, "rr": 1,
      "depth": 1, "rnr": 7}, b"", "rcid 0"),
    ({"t": "cm", "m": "dreq", "lcid": 3, "rcid": 4, "dev": 0}, b"x" * 221, "private data"),
])
def test_malformed_messages_are_refused(header, payload, why):
    with pytest.raises(FrameError) as e:
        cm.decode_message(header, payload)
    assert e.value.errno_name == "EPROTO" and why in e.value.message


def test_calls_are_refused_in_the_wrong_state():
    cid = CMId(1, object(), cm.PS_TCP)
    for call in ("connect", "accept", "reject", "establish", "listen", "resolve_route",
                 "disconnect"):
        with pytest.raises(RDMAError) as e:
            cid.check(call)
        assert e.value.errno_name == "EINVAL"
    cid.check("bind")
    cid.to(CMState.BOUND)
    cid.check("listen")
    with pytest.raises(RDMAError):
        cid.check("bind")       # bound once
    cid.to(CMState.ROUTE_RESOLVED)
    cid.check("connect")


def test_backlog():
    assert backlog_of(0, 128) == 128
    assert backlog_of(3, 128) == 3
    assert backlog_of(1 << 20, 128) == 128


def test_the_tcp_and_udp_port_spaces_are_modelled_and_ib_is_not():
    # rdma_cma.h: RDMA_PS_IPOIB 0x0002, RDMA_PS_TCP 0x0106, RDMA_PS_UDP 0x0111,
    # RDMA_PS_IB 0x013F.
    for ps in (0x0002, 0x013F):
        with pytest.raises(FrameError) as e:
            cm.CmCreateId.decode({"t": "cm_create_id", "id": 1, "ps": ps}, memoryview(b""))
        assert e.value.errno_name == "EOPNOTSUPP"
    for ps in (0x0106, 0x0111):
        assert cm.CmCreateId.decode({"t": "cm_create_id", "id": 1, "ps": ps},
                                    memoryview(b"")).ps == ps


def test_a_req_of_ipv6_addresses_decodes_in_canonical_form():
    # inet_ntop's text for ::ffff:10.0.0.2, whatever spelling the sender used
    m = cm.decode_message(req(sip="0:0:0:0:0:FFFF:a00:2", dip="::ffff:10.0.0.1"), b"")
    assert (m["sip"], m["dip"]) == ("::ffff:10.0.0.2", "::ffff:10.0.0.1")


@pytest.mark.parametrize("sip,dip,why", [
    ("::ffff:10.0.0.2", "10.0.0.1", "two families"),
    ("10.0.0.2", "::1", "two families"),
    ("fe80::1::2", "::1", "IPv4 or IPv6 address"),
    ("10.0.0.256", "10.0.0.1", "IPv4 address"),
    ("x" * 46, "::1", "sip"),
])
def test_a_req_whose_addresses_are_not_one_family_of_addresses_is_refused(sip, dip, why):
    with pytest.raises(FrameError) as e:
        cm.decode_message(req(sip=sip, dip=dip), b"")
    assert e.value.errno_name == "EPROTO" and why in e.value.message, e.value.message


@pytest.mark.parametrize("text,v4", [
    ("10.1.2.3", "10.1.2.3"), ("::", "0.0.0.0"), ("::1", "127.0.0.1"),
    ("::ffff:10.1.2.3", "10.1.2.3"), ("2001:db8::1", None), ("fe80::1", None),
    # IPv4-compatible (deprecated, RFC 4291) is not IPv4-mapped: no IPv4 address
    ("::10.1.2.3", None),
])
def test_the_ipv4_address_an_address_names(text, v4):
    assert cm.ipv4_of(cm.ip_text(text)) == v4


def test_a_bind_request_takes_either_family_and_refuses_other_text():
    assert cm.ip_text("::FFFF:10.1.2.3") == "::ffff:10.1.2.3"
    for bad in ("localhost", "1.2.3", "::g", ""):
        with pytest.raises(RDMAError) as e:
            cm.ip_text(bad)
        assert e.value.errno_name == "EINVAL", bad
