"""The connection manager's messages (docs/native.md, "The connection manager"):

- the control requests a program's librdmacm (provider/rdmacm/) sends its daemon, one per
  rdma_cm call that needs the daemon (``cm_create_id``, ``cm_listen``, ``cm_connect``,
  ...), typed and bounded as every control request is (protocol/control.py);
- the CM messages daemons exchange on their wire links (``{"t": "cm", "m": KIND, ...}``:
  REQ, REP, REJ, RTU, DREQ, DREP as IBTA's CM names them), checked by ``decode_message``
  before the daemon looks at them.

Private data is bounded per message kind as rdma_connect(3), rdma_accept(3) and
rdma_reject(3) bound it for a connection of the TCP port space on RoCE: what IBTA's
CM message carries (REQ 92, REP 196, REJ 148, DREQ/DREP 220 bytes) less the rdma_cm
header a REQ carries (36 bytes, the IP addresses and ports).
"""

from __future__ import annotations

import ipaddress

from .cm_sidr import SIDR_FIELDS, SIDR_PRIVATE_DATA_MAX, check_sidr
from .control import REQUESTS, Request, _handle, _payload, _request, _wire
from .errors import RDMAError, einval
from .frames import FrameError
from .schema import U32, check_fields

# The port spaces of rdma_create_id(3) (enum rdma_port_space).
PS_IPOIB, PS_TCP, PS_UDP, PS_IB = 0x0002, 0x0106, 0x0111, 0x013F
PORT_SPACES = {PS_TCP: "RDMA_PS_TCP", PS_UDP: "RDMA_PS_UDP"}

# Private data bytes a program may give each message (rdma_cm's limits, above).
PRIVATE_DATA_MAX = {"req": 56, "rep": 196, "rej": 148, "dreq": 220, "drep": 220,
                    **SIDR_PRIVATE_DATA_MAX}
# What each message carries on the wire: a received message's private data is this
# long, the sender's bytes then zeros (as an HCA's CM hands it up).
PRIVATE_DATA_SIZE = PRIVATE_DATA_MAX
# MRA: IBTA's message receipt acknowledgement, which a passive side sends for a REQ its
# consumer has not answered yet (the kernel's rdma_cm sends one for every REQ it hands
# up), so the active side waits for the REP instead of resending the REQ.
MESSAGE_KINDS = frozenset({"req", "rep", "rej", "rtu", "dreq", "drep", "mra", *SIDR_FIELDS})

# IBTA 12.6.7.2's reject reasons that rdma_cm reports as a REJECTED event's status.
REJ_CONSUMER = 28
REJ_INVALID_SERVICE_ID = 8
REJ_NO_RESOURCES = 2         # the listener's backlog is full (a busy server)
REJ_STALE_CONN = 10

# The rdma_cm events (enum rdma_cm_event_type), as the events pushed to a session carry.
EVENTS = {"addr_resolved": 0, "addr_error": 1, "route_resolved": 2, "route_error": 3,
          "connect_request": 4, "connect_response": 5, "connect_error": 6,
          "unreachable": 7, "rejected": 8, "established": 9, "disconnected": 10,
          "device_removal": 11, "timewait_exit": 15}

# An address's text: IPv4 dotted or IPv6 (INET6_ADDRSTRLEN less its NUL).
IP_TEXT_MAX = 45
_PSN = (int, 0, (1 << 24) - 1, True)
_QPN = (int, 1, (1 << 24) - 1, True)
_BYTE = (int, 0, 255, True)
_3BIT = (int, 0, 7, True)


def check_private_data(kind: str, data) -> bytes:
    """A program's private data for a ``kind`` message, or EINVAL when it is longer
    than the message carries."""
    n = len(data)
    limit = PRIVATE_DATA_MAX[kind]
    if n > limit:
        raise einval(f"private data of {n} bytes: a {kind.upper()} carries at most "
                     f"{limit}")
    return bytes(data)


def _ps(value: int) -> int:
    if value not in PORT_SPACES:
        raise FrameError("EOPNOTSUPP", f"port space {value:#x}: only RDMA_PS_TCP (RC) "
                                       "and RDMA_PS_UDP (UD) ids are modelled")
    return value


def _ipv4(text: str) -> str:
    parts = text.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) <= 255 for p in parts):
        raise einval(f"address {text!r}: an IPv4 address is expected")
    return text


def ip_text(text: str) -> str:
    """An IPv4 address as it is, an IPv6 one in its canonical form (RFC 5952, as
    inet_ntop writes it), so one address has one text; anything else EINVAL."""
    if ":" not in text:
        return _ipv4(text)
    try:
        a = ipaddress.IPv6Address(text)
        # inet_ntop writes an IPv4-mapped address's last 32 bits dotted
        return f"::ffff:{a.ipv4_mapped}" if a.ipv4_mapped is not None else str(a)
    except ValueError:
        raise einval(f"address {text!r}: an IPv4 or IPv6 address is expected") from None


def ipv4_of(text: str) -> str | None:
    """The IPv4 address an address of either family names for softhca, whose daemons
    reach each other over IPv4: itself; for IPv6 the unspecified (``::`` is 0.0.0.0)
    and loopback (``::1`` is 127.0.0.1) addresses and an IPv4-mapped one
    (::ffff:a.b.c.d is a.b.c.d); None for any other IPv6 address."""
    if ":" not in text:
        return text
    a = ipaddress.IPv6Address(text)
    if a.ipv4_mapped is not None:
        return str(a.ipv4_mapped)
    if a.is_unspecified:
        return "0.0.0.0"
    if a.is_loopback:
        return "127.0.0.1"
    return None


def family(text: str) -> int:
    """4 or 6: the IP version an address's text is of."""
    return 6 if ":" in text else 4


# -- the control requests (a program's librdmacm to its daemon) ---------------------------

@_request("cm_create_id")
class CmCreateId(Request):
    ps: int = _wire(int, 0, 0xFFFF, decode=_ps)


@_request("cm_destroy_id")
class CmDestroyId(Request):
    cmid: int = _handle()


@_request("cm_bind")
class CmBind(Request):
    """rdma_bind_addr(3): an IPv4 or IPv6 address; ``reuse``: the id's
    RDMA_OPTION_ID_REUSEADDR; ``afonly``: RDMA_OPTION_ID_AFONLY (an IPv6 id that takes
    no IPv4 connection; an IPv4 id is always so, as the kernel's rdma_cm has it)."""

    cmid: int = _handle()
    ip: str = _wire(str, 2, IP_TEXT_MAX, decode=ip_text)
    port: int = _wire(int, 0, 65535)
    reuse: bool = _wire(bool, required=False, default=False)
    afonly: bool = _wire(bool, required=False, default=False)


# rdma_resolve_addr(3) / rdma_resolve_route(3)'s timeout_ms (2000 for a client that
# names none); past it, ADDR_ERROR / ROUTE_ERROR with -ETIMEDOUT.
_TIMEOUT_MS = _wire(int, 1, 1 << 31, required=False, default=2000)


@_request("cm_resolve_addr")
class CmResolveAddr(Request):
    cmid: int = _handle()
    ip: str = _wire(str, 2, IP_TEXT_MAX, decode=ip_text)
    port: int = _wire(int, 0, 65535)
    timeout_ms: int = _TIMEOUT_MS


@_request("cm_resolve_route")
class CmResolveRoute(Request):
    cmid: int = _handle()
    timeout_ms: int = _TIMEOUT_MS


@_request("cm_listen")
class CmListen(Request):
    cmid: int = _handle()
    backlog: int = _wire(int, 0, U32)


@_request("cm_connect")
class CmConnect(Request):
    """rdma_connect(3): the QP's number and its starting PSN (chosen by the library, at
    random), the conn_param's resources and retries; the payload is the private data."""

    cmid: int = _handle()
    qpn: int = _wire(int, 1, (1 << 24) - 1)
    psn: int = _wire(int, 0, (1 << 24) - 1)
    responder_resources: int = _wire(int, 0, 255)
    initiator_depth: int = _wire(int, 0, 255)
    retry_count: int = _wire(int, 0, 7)
    rnr_retry_count: int = _wire(int, 0, 7)
    private_data: bytes = _payload()


@_request("cm_accept")
class CmAccept(Request):
    cmid: int = _handle()
    qpn: int = _wire(int, 1, (1 << 24) - 1)
    psn: int = _wire(int, 0, (1 << 24) - 1)
    responder_resources: int = _wire(int, 0, 255)
    initiator_depth: int = _wire(int, 0, 255)
    rnr_retry_count: int = _wire(int, 0, 7)
    private_data: bytes = _payload()


@_request("cm_reject")
class CmReject(Request):
    cmid: int = _handle()
    private_data: bytes = _payload()


@_request("cm_establish")
class CmEstablish(Request):
    cmid: int = _handle()


@_request("cm_disconnect")
class CmDisconnect(Request):
    cmid: int = _handle()


@_request("cm_counts")
class CmCounts(Request):
    """The daemon's CM objects (ids, listeners, connections), for leak checks."""


CM_REQUESTS = (CmCreateId, CmDestroyId, CmBind, CmResolveAddr, CmResolveRoute, CmListen,
               CmConnect, CmAccept, CmReject, CmEstablish, CmDisconnect, CmCounts)
# The control protocol's table of verbs names these too (registered in BY_VERB by
# _request once this module is imported, as the daemon's handlers import it).
REQUESTS.update({c.VERB: c.SCHEMA for c in CM_REQUESTS})
__all__ = ["CM_REQUESTS", "EVENTS", "PRIVATE_DATA_MAX", "decode_message"]
# -- the messages between daemons ------------------------------------------------------

# Each message: the sender's communication id ("lcid") and, but for a REQ, the
# receiver's ("rcid"); the sender's device index ("dev"). A REQ also names the service
# (port space and port), the addresses it was resolved between, and the QP's number,
# starting PSN, resources and retries; a REP the same for the passive QP; a REJ its reason.
_COMMON = {"m": (str, 2, 8, True), "lcid": (int, 1, U32, True),
           "rcid": (int, 0, U32, True), "dev": (int, 0, 255, True)}
_FIELDS = {
    "req": {"ps": (int, 0, 0xFFFF, True), "port": (int, 1, 65535, True),
            "sip": (str, 2, IP_TEXT_MAX, True), "sport": (int, 0, 65535, True),
            "dip": (str, 2, IP_TEXT_MAX, True), "qpn": _QPN, "psn": _PSN, "rr": _BYTE,
            "depth": _BYTE, "retry": _3BIT, "rnr": _3BIT},
    "rep": {"qpn": _QPN, "psn": _PSN, "rr": _BYTE, "depth": _BYTE, "rnr": _3BIT},
    "rej": {"reason": (int, 0, 0xFFFF, True)},
    "rtu": {}, "dreq": {}, "drep": {}, "mra": {}, **SIDR_FIELDS,
}


def decode_message(header: dict, payload) -> dict:
    """A CM message from a wire link, checked: its fields, or FrameError("EPROTO")
    naming the fault (an unknown kind, a missing or out-of-range field, private data
    longer than the kind carries)."""
    kind = header.get("m")
    if kind not in MESSAGE_KINDS:
        raise FrameError("EPROTO", f"unknown CM message {str(kind)[:16]!r}")
    v = check_fields(header, {**_COMMON, **_FIELDS[kind]}, f"CM {kind}")
    limit = PRIVATE_DATA_SIZE.get(kind, 0)
    if len(payload) > limit:
        raise FrameError("EPROTO", f"CM {kind} with {len(payload)} bytes of private data "
                                   f"(at most {limit})")
    # A REJ may name no receiver: an active side that gives up before any REP names
    # its own id, which the receiver knows its child by.
    check_sidr(kind, v)
    # A REQ's addresses are the family its sender used (as the IP version of rdma_cm's
    # header), one family for both: each must be an address.
    if "sip" in v:
        try:
            v["sip"], v["dip"] = ip_text(v["sip"]), ip_text(v["dip"])
        except RDMAError as e:
            raise FrameError("EPROTO", f"CM {kind}: {e.message}") from None
        if family(v["sip"]) != family(v["dip"]):
            raise FrameError("EPROTO", f"CM {kind}: addresses of two families")
    if kind not in ("req", "rej", "sidr_req") and v["rcid"] == 0:
        raise FrameError("EPROTO", f"CM {kind} names no receiver (rcid 0)")
    v["private_data"] = bytes(payload)
    return v


def padded(kind: str, data: bytes) -> bytes:
    """Private data as the receiver gets it: the message's whole field, zero-filled."""
    return data + bytes(PRIVATE_DATA_SIZE.get(kind, 0) - len(data))

