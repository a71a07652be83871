"""The daemon's connection manager (docs/native.md, "The connection manager"): the
rdma_cm ids of its sessions, and the CM messages (REQ, REP, REJ, RTU, DREQ, DREP) it
exchanges with other daemons on its wire links.

Addresses: an IPv4 address names the daemon listening at that address on this daemon's
own wire port (daemons of one fabric share a port, as RoCE v2 shares UDP 4791); this
daemon's own address, a loopback address or 0.0.0.0 name this daemon. An id may be of
either family, as the kernel's rdma_cm ids are: the IPv6 addresses that name a daemon
are the unspecified, the loopback and the IPv4-mapped ones (protocol.cm.ipv4_of); any
other is no address of this daemon (EADDRNOTAVAIL to bind) and has no route
(ENETUNREACH to resolve), daemons reaching each other over IPv4. A REQ carries the
family its sender used; a listener takes the REQs of its own family, and a `::`
listener without RDMA_OPTION_ID_AFONLY IPv4 ones too. Its softhca GID is
fe80::<IPv4>:<port>:<device index>, the one ``softhca run`` writes to sysfs.

Authentication: a CM message comes on a wire link, whose HELLO proved the peer token,
and counts as sent by the daemon the link comes from (its TCP source address and the
wire port its HELLO names), never by what the message says; a message for an id that
is connected to another daemon, or that names another communication id, is refused
and counted (``cm_messages_refused``), as the wire plane refuses a packet from a QP's
wrong peer. A DREQ or DREP that names no id here ends a disconnect this side is done
with (both sides sent a DREQ, and the id was destroyed meanwhile): as the IB CM does, a
DREP is dropped and a DREQ answered with a DREP, without a word, and counted
(``cm_dreps_discarded``, ``cm_dreqs_answered_after``).

The library (provider/rdmacm/) moves its QPs through INIT, RTR and RTS with what the
events carry; the daemon relays, retransmits (a REQ or REP not answered within
``RESPONSE_TIMEOUT`` is sent again, ``MAX_RETRIES`` times, then the id gets
UNREACHABLE or CONNECT_ERROR with -ETIMEDOUT) and bounds everything per session.
"""

from __future__ import annotations

import asyncio
import errno
import random
import socket
from dataclasses import dataclass

from ..engine.cm import CMId, CMState, backlog_of, timewait_seconds
from ..engine.rc import RCQP
from ..protocol import cm as proto
from ..protocol.errors import RDMAError
from ..protocol.replies import frame
from . import cm_addresses, cm_sidr
from .cm_inbound import CmInbound
from .cm_timewait import CmTimewait
from .wire import host_class

# Bounds per session: rdma_cm ids, ids waiting for a REP (connects in flight).
MAX_IDS = 1024
MAX_CONNECTING = 256
# rdma_listen(3)'s largest backlog (and the one a backlog of 0 asks for).
MAX_BACKLOG = 128


@dataclass
class Timing:
    """How long a REQ, REP or DREQ waits for its answer, and how often it is resent
    (IBTA's CM response timeout and max CM retries, which rdma_cm sets for its user)."""

    response_timeout: float = 1.0
    max_retries: int = 3
    # How long an MRA'd REQ waits for its REP before it is sent again: the kernel's
    # rdma_cm asks for 4.096 us * 2^24, some 68 s.
    mra_timeout: float = 68.7
    # How long a disconnected connection stays in timewait (server/cm_timewait.py):
    # the IB CM's time for a RoCE path, 1.024 s (engine/cm.py); ``serve --cm-timewait``.
    timewait: float = timewait_seconds()


def gid_bytes(ip: str, port: int, dev: int) -> bytes:
    return bytes.fromhex("fe80000000000000") + socket.inet_aton(ip) + port.to_bytes(2, "big") \
        + dev.to_bytes(2, "big")


class ConnectionManager(CmInbound, CmTimewait):
    """The CM of one daemon (``node``: its host, port, devices, wire plane, counters)."""

    def __init__(self, node, timing: Timing | None = None) -> None:
        self.node = node
        self.timing = timing or Timing()
        self.ids: dict[int, CMId] = {}
        # (port space, port, IP version) -> the listening id.
        self.listeners: dict[tuple[int, int, int], int] = {}
        # (origin, the active side's cid) -> the child id a REQ made (duplicates).
        self.by_remote: dict[tuple, int] = {}
        self._next = random.randrange(1, 1 << 30)
        self._timers: dict[int, asyncio.TimerHandle] = {}
        # Address and route resolutions waiting for a wire link, by id.
        self._probes: dict[int, asyncio.Task] = {}
        node.counters.update({"cm_messages_in": 0, "cm_messages_out": 0,
                              "cm_messages_refused": 0, "cm_retransmissions": 0,
                              "cm_messages_dropped": 0, "cm_backlog_drops": 0,
                              "cm_dreps_discarded": 0, "cm_dreqs_answered_after": 0})
        self._init_timewait()

    # -- addresses ---------------------------------------------------------------------
    def my_ip(self) -> str:
        try:
            return socket.gethostbyname(self.node.host)
        except OSError:
            return "127.0.0.1"

    def daemon_of(self, ip: str) -> tuple[str, int]:
        """The daemon (host, wire port) IPv4 address ``ip`` names (server/cm_addresses.py)."""
        return cm_addresses.daemon_of(self, ip)

    def explain(self, cid: CMId, event: str, why: str) -> None:
        cm_addresses.explain(self, cid, event, why)

    # -- the session's calls -----------------------------------------------------------
    def get(self, owner, handle: int) -> CMId:
        cid = self.ids.get(handle)
        if cid is None or cid.owner is not owner:
            raise RDMAError("ENOENT", f"cm id {handle} is not an rdma_cm_id of this session")
        return cid

    def create_id(self, owner, ps: int, *, listener: int = 0) -> CMId:
        mine = sum(1 for c in self.ids.values() if c.owner is owner)
        if mine >= MAX_IDS:
            raise RDMAError("ENOMEM", f"rdma_create_id: this session holds {mine} ids, "
                                      "the daemon's limit per session")
        self._next = self._next % ((1 << 31) - 1) + 1
        while self._next in self.ids:
            self._next += 1
        cid = CMId(self._next, owner, ps, listener=listener)
        self.ids[cid.handle] = cid
        return cid

    def destroy_id(self, cid: CMId) -> None:
        """rdma_destroy_id(3): a connection still up is disconnected (DREQ, not waited
        for), a child never accepted is rejected, a listener's pending children go."""
        if cm_sidr.is_ud(cid):
            cm_sidr.destroy_id(self, cid)
            return
        if cid.state in (CMState.ESTABLISHED, CMState.REP_SENT, CMState.REP_RCVD):
            self._send(cid, "dreq", {})
        elif cid.state == CMState.REQ_RCVD:
            self._send(cid, "rej", {"reason": proto.REJ_CONSUMER})
        elif cid.state == CMState.REQ_SENT and cid.peer is not None:
            self._send(cid, "rej", {"reason": proto.REJ_STALE_CONN})
        self._forget(cid)
        for child in list(cid.pending):
            c = self.ids.get(child)
            if c is not None:
                self._send(c, "rej", {"reason": proto.REJ_CONSUMER})
                self._forget(c)

    def _forget(self, cid: CMId) -> None:
        self._cancel(cid)
        self.end_timewait(cid)
        probe = self._probes.pop(cid.handle, None)
        if probe is not None:
            probe.cancel()
        self.ids.pop(cid.handle, None)
        key = (cid.ps, cid.port, proto.family(cid.ip))
        if self.listeners.get(key) == cid.handle:
            del self.listeners[key]
        parent = self.ids.get(cid.listener)
        if parent is not None:
            parent.pending.discard(cid.handle)
        for key in [k for k, v in self.by_remote.items() if v == cid.handle]:
            del self.by_remote[key]

    def session_gone(self, owner) -> None:
        for cid in [c for c in self.ids.values() if c.owner is owner]:
            if cid.handle in self.ids:
                self.destroy_id(cid)

    def peers(self) -> set[tuple[str, int]]:
        """The daemons the ids are connected (or connecting) to: their links stay open
        while the ids live, for the DREQ (or REJ) that ends each, whichever session
        holds the QP (a program's rdma_cm and its verbs are two sessions)."""
        return {cid.peer for cid in self.ids.values() if cid.peer is not None}

    def bind(self, cid: CMId, ip: str, port: int, reuse: bool = False,
             afonly: bool = False) -> int:
        cid.check("bind")
        v4 = proto.ipv4_of(ip)
        if v4 is None:
            raise RDMAError("EADDRNOTAVAIL", f"rdma_bind_addr: {ip} is no address of this "
                            "daemon: its IPv6 addresses are ::, ::1 and the IPv4-mapped "
                            f"::ffff:{self.my_ip()} (daemons speak IPv4)")
        if v4 not in ("0.0.0.0", self.my_ip()) and not v4.startswith("127."):
            raise RDMAError("EADDRNOTAVAIL", f"rdma_bind_addr: {ip} is not this daemon's "
                                             f"address ({self.my_ip()})")
        # The kernel's rdma_cm: an IPv4 id is AFONLY; an IPv6 one as the option says
        # (net.ipv6.bindv6only's default, 0, when the program did not set it).
        afonly = afonly or proto.family(ip) == 4
        port = port or self._ephemeral(cid.ps)
        # As SO_REUSEADDR: two ids that both asked may share a port, unless one listens.
        # Two AFONLY ids of two families never meet (tgtd binds 0.0.0.0 and :: so).
        if any(c.ps == cid.ps and c.port == port and c.state != CMState.IDLE
               and not (reuse and c.reuse and c.state != CMState.LISTEN)
               and not _apart(c, ip, afonly)
               for c in self.ids.values() if c.listener == 0):
            raise RDMAError("EADDRINUSE", f"rdma_bind_addr: port {port} is bound already")
        cid.ip, cid.port, cid.reuse, cid.afonly = ip, port, reuse, afonly
        cid.to(CMState.BOUND)
        return port

    def _ephemeral(self, ps: int) -> int:
        used = {c.port for c in self.ids.values() if c.ps == ps}
        for _ in range(64):
            p = random.randrange(32768, 61000)
            if p not in used:
                return p
        raise RDMAError("EADDRINUSE", "no ephemeral port is free")

    def resolve_addr(self, cid: CMId, ip: str, port: int, timeout_ms: int = 2000) -> None:
        cid.check("resolve_addr")
        v4 = proto.ipv4_of(ip)
        if v4 is None:
            raise RDMAError("ENETUNREACH", f"rdma_resolve_addr: no route to {ip}: daemons "
                            "reach each other over IPv4; name the peer by its IPv4 address "
                            "or as ::ffff:a.b.c.d")
        if cid.state == CMState.IDLE:
            self.bind(cid, "::" if proto.family(ip) == 6 else "0.0.0.0", 0)
        elif proto.family(cid.ip) != proto.family(ip):
            raise RDMAError("EINVAL", f"rdma_resolve_addr: the id is bound to {cid.ip}, "
                                      f"{ip} is of the other address family")
        back = cid.state
        cid.peer = self.daemon_of(v4)
        cid.peer_ip, cid.peer_port = ip, port
        cid.to(CMState.ADDR_QUERY)
        self._reach(cid, timeout_ms, ("addr_resolved", CMState.ADDR_RESOLVED),
                    ("addr_error", back))

    def resolve_route(self, cid: CMId, timeout_ms: int = 2000) -> None:
        # One hop between daemons: the route is the link to the peer's daemon.
        cid.check("resolve_route")
        cid.to(CMState.ROUTE_QUERY)
        self._reach(cid, timeout_ms, ("route_resolved", CMState.ROUTE_RESOLVED),
                    ("route_error", CMState.ADDR_RESOLVED))

    def _reach(self, cid: CMId, timeout_ms: int, ok: tuple, err: tuple) -> None:
        """Resolution: this daemon at once; another once its wire link is up (or its
        host refused the TCP connection: the host is there, and a REQ to it will end
        UNREACHABLE), else ``err``'s event with -ETIMEDOUT after ``timeout_ms``, or
        -EHOSTUNREACH / -ENETUNREACH as soon as the network says so."""
        if cid.peer == (self.node.host, self.node.port):
            # Resolved now (the id may go on at once); its event follows the reply.
            cid.to(ok[1])
            self._later(cid, ok[0], ok[1], **self._addrs(cid))
            return
        link = self.node.wire.link_to(*cid.peer)
        self._probes[cid.handle] = asyncio.get_running_loop().create_task(
            self._probe(cid, link, timeout_ms / 1000, ok, err))

    async def _probe(self, cid: CMId, link, timeout: float, ok: tuple, err: tuple) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        status = -errno.ETIMEDOUT
        try:
            while loop.time() < deadline:
                if link.writer is not None and not link.closed or _refused(link.failure):
                    self._resolved(cid, ok[0], ok[1], **self._addrs(cid))
                    return
                if link.closed:
                    status = _link_status(link.failure)
                    break
                await asyncio.sleep(0.01)
            self._resolved(cid, err[0], err[1], status=status)
        finally:
            self._probes.pop(cid.handle, None)

    def _later(self, cid: CMId, kind: str, state: CMState, **fields) -> None:
        asyncio.get_running_loop().call_soon(lambda: self._event(cid, kind, **fields))

    def _resolved(self, cid: CMId, kind: str, state: CMState, **fields) -> None:
        if self.ids.get(cid.handle) is not cid:
            return      # destroyed meanwhile
        cid.to(state)
        self._event(cid, kind, **fields)

    def listen(self, cid: CMId, backlog: int) -> None:
        cid.check("listen")
        key = (cid.ps, cid.port, proto.family(cid.ip))
        other = self.listeners.get(key)
        if other is not None and other != cid.handle:
            raise RDMAError("EADDRINUSE", f"rdma_listen: port {cid.port} has a listener")
        if any(c is not cid and c.ps == cid.ps and c.port == cid.port and c.listener == 0
               and c.state != CMState.IDLE and not _apart(c, cid.ip, cid.afonly)
               for c in self.ids.values()):
            raise RDMAError("EADDRINUSE", f"rdma_listen: port {cid.port} is shared "
                                          "(RDMA_OPTION_ID_REUSEADDR) with another id")
        cid.backlog = backlog_of(backlog, MAX_BACKLOG)
        self.listeners[key] = cid.handle
        cid.to(CMState.LISTEN)

    def listener_for(self, m: dict) -> tuple[CMId | None, bool]:
        """The listener a REQ (or SIDR_REQ) ``m`` is for, as the kernel's rdma_cm
        matches one: its port and IP version, or a `::` listener that is not AFONLY
        for an IPv4 REQ. Also whether the port has a listener at all (one of the other
        family: the REQ is then rejected by the consumer, not for its service id)."""
        fam = proto.family(m["dip"])
        lid = self.listeners.get((m["ps"], m["port"], fam))
        other = self.ids.get(self.listeners.get((m["ps"], m["port"], 10 - fam), 0))
        if lid is None and fam == 4 and other is not None and not other.afonly \
                and proto.ipv4_of(other.ip) == "0.0.0.0":
            return other, True
        parent = self.ids.get(lid) if lid is not None else None
        return parent, parent is not None or other is not None

    def _check_qp(self, cid: CMId, qpn: int, call: str, kind: type = RCQP) -> None:
        """The QP a connect or accept names must be a QP of the id's kind (RC, or UD
        for an RDMA_PS_UDP id) of the caller: of its session, or of another session of
        the same process (librdmacm's control session is not the provider's, but the
        kernel's SO_PEERCRED names one pid for both). Otherwise a program could have a
        peer connect, or send its datagrams, to a neighbour's QP."""
        names = list(self.node.hcas)
        dev = names[cid.dev] if cid.dev < len(names) else None
        qph = self.node.qps.get((dev, qpn))
        if qph is None or not isinstance(qph.rcqp, kind) \
                or not _same_process(qph.session, cid.owner):
            raise RDMAError("EINVAL", f"rdma_{call}: qp_num {qpn:#x} is no QP of this "
                                      "process on the id's device")

    def connect(self, cid: CMId, r: proto.CmConnect) -> None:
        cid.check("connect")
        if cm_sidr.is_ud(cid):
            cm_sidr.connect(self, cid, r)
            return
        data = proto.check_private_data("req", r.private_data)
        self._check_qp(cid, r.qpn, "connect")
        busy = sum(1 for c in self.ids.values()
                   if c.owner is cid.owner and c.state == CMState.REQ_SENT)
        if busy >= MAX_CONNECTING:
            raise RDMAError("EAGAIN", f"rdma_connect: {busy} connects of this session wait "
                                      "for an answer, the daemon's limit")
        msg = {"ps": cid.ps, "port": cid.peer_port or 1, "sip": self._src_ip(cid),
               "sport": cid.port, "dip": cid.peer_ip, "qpn": r.qpn, "psn": r.psn,
               "rr": r.responder_resources, "depth": r.initiator_depth,
               "retry": r.retry_count, "rnr": r.rnr_retry_count}
        cid.to(CMState.REQ_SENT)
        self._send(cid, "req", msg, data, retry="unreachable")

    def accept(self, cid: CMId, r: proto.CmAccept) -> None:
        if cm_sidr.is_ud(cid):
            cm_sidr.accept(self, cid, r)
            return
        cid.check("accept")
        data = proto.check_private_data("rep", r.private_data)
        self._check_qp(cid, r.qpn, "accept")
        cid.to(CMState.REP_SENT)
        self._send(cid, "rep", {"qpn": r.qpn, "psn": r.psn, "rr": r.responder_resources,
                                "depth": r.initiator_depth, "rnr": r.rnr_retry_count},
                   data, retry="connect_error")
        self._unpend(cid)

    def reject(self, cid: CMId, private_data) -> None:
        if cm_sidr.is_ud(cid):
            cm_sidr.reject(self, cid, private_data)
            return
        cid.check("reject")
        data = proto.check_private_data("rej", private_data)
        self._send(cid, "rej", {"reason": proto.REJ_CONSUMER}, data)
        self._unpend(cid)
        cid.to(CMState.DISCONNECTED)

    def establish(self, cid: CMId) -> None:
        cid.check("establish")
        # The active side's own ESTABLISHED is the library's (it turns the
        # CONNECT_RESPONSE into it when the id owns its QP); rdma_establish(3) on an id
        # whose QP the program moves itself gets no event, as with rdma_cm.
        self._send(cid, "rtu", {})
        cid.to(CMState.ESTABLISHED)

    def disconnect(self, cid: CMId) -> None:
        cid.check("disconnect")
        if cid.state in (CMState.DREQ_SENT, CMState.TIMEWAIT, CMState.DISCONNECTED) \
                or cm_sidr.is_ud(cid):
            return      # the peer's DREQ came first, or ours is under way; UD: no DREQ
        cid.to(CMState.DREQ_SENT)
        self._send(cid, "dreq", {}, retry="disconnected")

    def _unpend(self, cid: CMId) -> None:
        parent = self.ids.get(cid.listener)
        if parent is not None:
            parent.pending.discard(cid.handle)

    # -- messages ------------------------------------------------------------------------
    def _src_ip(self, cid: CMId) -> str:
        """The id's source address, in its family: this daemon's address for a
        wildcard or loopback bind (IPv4-mapped for an IPv6 id, ::1 towards ::1)."""
        v4 = proto.ipv4_of(cid.ip) or cid.ip
        if v4 != "0.0.0.0" and not v4.startswith("127."):
            return cid.ip
        if proto.family(cid.ip) == 4:
            return self.my_ip()
        return "::1" if cid.peer_ip == "::1" else f"::ffff:{self.my_ip()}"

    def _addrs(self, cid: CMId) -> dict:
        host, port = cid.peer or (self.node.host, self.node.port)
        peer_ip = socket.gethostbyname(host) if not _numeric(host) else host
        return {"dev": cid.dev, "sgid": gid_bytes(self.my_ip(), self.node.port, cid.dev),
                "dgid": gid_bytes(peer_ip, port, cid.peer_dev), "sip": self._src_ip(cid),
                "sport": cid.port, "dip": cid.peer_ip, "dport": cid.peer_port}

    def _send(self, cid: CMId, kind: str, fields: dict, data: bytes = b"", *,
              retry: str | None = None) -> None:
        if cid.peer is None:
            return
        header = {"t": "cm", "m": kind, "lcid": cid.handle, "rcid": cid.remote_cid,
                  "dev": cid.dev, **fields}
        self._transmit(cid.peer, header, data)
        if retry is not None:
            cid.resend = {"header": header, "data": data, "fail": retry}
            cid.tries = self.timing.max_retries
            self._arm(cid)

    def _transmit(self, peer: tuple[str, int], header: dict, data: bytes) -> None:
        self.node.counters["cm_messages_out"] += 1
        if self.node.faults.rules and self.node.faults.drops_cm("out", header["m"]):
            self.node.counters["cm_messages_dropped"] += 1
            return
        if peer == (self.node.host, self.node.port):
            origin = ("loopback" if host_class(self.node.host) == "loopback"
                      else host_class(self.my_ip()), self.node.port)
            asyncio.get_running_loop().call_soon(self.receive, dict(header), data, origin)
        else:
            self.node.wire.send_cm(peer[0], peer[1], header, data)

    def _arm(self, cid: CMId, after: float | None = None) -> None:
        self._stop_timer(cid)
        self._timers[cid.handle] = asyncio.get_running_loop().call_later(
            self.timing.response_timeout if after is None else after, self._timeout,
            cid.handle)

    def _cancel(self, cid: CMId) -> None:
        """No more retransmissions for ``cid``: its answer came (or it is gone)."""
        self._stop_timer(cid)
        cid.resend = None

    def _stop_timer(self, cid: CMId) -> None:
        t = self._timers.pop(cid.handle, None)
        if t is not None:
            t.cancel()

    def _timeout(self, handle: int) -> None:
        self._timers.pop(handle, None)
        cid = self.ids.get(handle)
        if cid is None or cid.resend is None:
            return
        if cid.tries > 0:
            cid.tries -= 1
            self.node.counters["cm_retransmissions"] += 1
            self._transmit(cid.peer, cid.resend["header"], cid.resend["data"])
            self._arm(cid)
            return
        fail = cid.resend["fail"]
        cid.resend = None
        if fail == "unreachable":
            self.explain(cid, "unreachable", cm_addresses.why_unanswered(self, cid))
        cid.to(CMState.DISCONNECTED)
        self._event(cid, fail, status=0 if fail == "disconnected" else -errno.ETIMEDOUT)
        if fail == "disconnected":
            self.enter_timewait(cid)    # the DREQ's resends ran out: done all the same

    # -- events --------------------------------------------------------------------------
    def _event(self, cid: CMId, kind: str, status: int = 0, **fields) -> None:
        if self.ids.get(cid.handle) is not cid:
            return      # destroyed meanwhile
        payload = fields.pop("_payload", b"")
        cid.owner.push(frame("cm_event", cm=kind, cmid=cid.handle, status=status, **fields),
                       payload)

    def counts(self, owner=None) -> dict[str, int]:
        ids = [c for c in self.ids.values() if owner is None or c.owner is owner]
        # "timers" counts the timewaits' too, "remote" their records by peer QP number.
        return {"ids": len(ids), "listeners": len(self.listeners),
                "timers": len(self._timers) + len(self._probes) + len(self._tw_timers),
                "remote": len(self.by_remote) + len(self.timewait)}


def _apart(c: CMId, ip: str, afonly: bool) -> bool:
    """Whether a bound id ``c`` and an id binding ``ip`` (AFONLY or not) may hold one
    port whatever their addresses: both AFONLY and of two families."""
    return afonly and c.afonly and proto.family(c.ip) != proto.family(ip)


def _link_status(failure: BaseException | None) -> int:
    """An ADDR_ERROR / ROUTE_ERROR's status for a wire link that could not open: the
    network's errno (EHOSTUNREACH, ENETUNREACH, ETIMEDOUT), or -ECONNREFUSED for a
    daemon that refused the link's HELLO (another fabric's peer token)."""
    name = getattr(failure, "errno_name", "")
    if name in ("EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT"):
        return -getattr(errno, name)
    return -errno.ECONNREFUSED


def _refused(failure: BaseException | None) -> bool:
    """The TCP connection was refused: the host is there, its daemon is not."""
    return getattr(failure, "errno_name", "") == "ECONNREFUSED"


def _same_process(a, b) -> bool:
    """Whether sessions ``a`` and ``b`` are one, or two of one process (both on the
    UNIX socket, whose SO_PEERCRED pid the kernel vouches for)."""
    if a is b:
        return True
    pa, pb = getattr(a, "peer_cred", None), getattr(b, "peer_cred", None)
    return pa is not None and pb is not None and pa[0] == pb[0] and pa[0] > 0


def _numeric(host: str) -> bool:
    try:
        socket.inet_aton(host)
        return True
    except OSError:
        return False
