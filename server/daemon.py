"""The daemon: HCAs, control sessions and wire links on one TCP port.

One asyncio task per connection. The first frame on a connection is the daemon's
challenge and the second the peer's hello (``protocol.handshake``); the hello's role
makes the connection a control session (verbs calls from an application:
server/session.py reads them, server/verbs.py answers them) or a wire link (RC packets
from another daemon's QPs). Connecting out, a daemon's ``WireLink`` does the HELLO with
server/link.py's ``open_link``, as a client does.

The engine is sans-I/O; this module is its clock and its cables. After anything that
may make a QP want to talk (a post, a packet, a timer), ``_service`` asks the QP for
its packets, writes them to the link towards its peer, moves its completions to the
CQs, and arms one timer at the QP's next deadline. Packets to a daemon go on an
outgoing link this daemon opens to it; each daemon only reads packets from the
links others opened to it, so the two directions of a QP pair never share a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import ipaddress
import itertools
import secrets
from typing import Any

from ..engine.crypto_login import DeviceCrypto
from ..engine.hca import HCA
from ..protocol.enums import QpState
from ..protocol.errors import RDMAError
from ..protocol.frames import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode_frame
from ..protocol.handshake import HandshakeError, hello_src, make_challenge, verify_hello
from ..protocol.opcodes import Op, with_flags
from ..protocol.packets import (
    IntegrityError,
    Packet,
    Run,
    count,
    decode,
    packet_check,
    packet_header,
    split,
    train_header,
)
from .faults import REORDER_FLUSH_S, Emit, Faults
from .link import READ_CHUNK, open_link, read_frames
from .logs import kv, log
from .session import ControlSession, send_error
from .verbs import QPHost

# The packets that begin a SEND: the ones that would take a receive.
_SEND_FIRSTS = with_flags(Op.SEND | Op.FIRST)

DEFAULT_PORT = 4791
HANDSHAKE_TIMEOUT = 10.0
# What a queued packet costs beside its payload (the Packet, its header map, the frame).
PACKET_OVERHEAD = 256
# Room a train frame's prefix and header take beside its payload (a header is well under).
TRAIN_HEADROOM = 1024
# Daemon(peer_token=...) not given: wire links prove the clients' token.
SAME_TOKEN = object()
QPN_MOD = 1 << 24
# QPs that go to ERR within this many seconds of each other share one malloc_trim.
TRIM_DELAY_S = 0.1


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one daemon accepts; each limit hit is a clear error, never a crash."""

    max_connections: int = 1024             # control sessions and wire links together
    # Connections that have not completed the HELLO: a separate, smaller pool with a
    # shorter timeout, so that sockets that never say hello take no authenticated slot.
    # When it is full the oldest is closed for the newcomer: an idle socket holds its
    # slot only until others arrive, and a real peer's HELLO takes one round trip.
    max_pre_hello: int = 64
    hello_timeout: float = 3.0
    max_objects: int = 1 << 16              # verbs objects per control session
    max_session_bytes: int = 4 << 30        # registered MR bytes per session (ENOMEM)
    max_daemon_bytes: int = 16 << 30        # registered MR bytes in the daemon (ENOMEM)
    max_frame: int = DEFAULT_MAX_FRAME      # bytes in one frame (EMSGSIZE, then close)
    max_msg_size: int = 1 << 31             # bytes in one message (ibv_port_attr max_msg_sz)
    max_qp_wr: int = 1 << 14                # max_send_wr / max_recv_wr of a QP (EINVAL)
    # A session's unsent replies beyond this stop its requests being read until the
    # client reads: a client that floods and never reads cannot grow the daemon.
    reply_high_water: int = 8 << 20
    # poll_cq / get_async_event requests one session may have waiting (ENOMEM past it).
    max_waits: int = 1024


def plain(v: Any) -> Any:
    """A trace detail as msgpack can carry it: enums as names, records as maps, integers
    past 64 bits (XTS tweaks) as hex strings."""
    if isinstance(v, bool) or v is None or isinstance(v, (str, bytes, float)):
        return v
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, int):
        return int(v) if -(1 << 63) <= v < (1 << 64) else hex(v)
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if dataclasses.is_dataclass(v):
        return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if hasattr(v, "item"):          # numpy scalars
        return plain(v.item())
    return str(v)


# -- the daemon --------------------------------------------------------------------------

class Daemon:
    """``softhca serve``: the HCAs of one node, served on ``host:port``."""

    def __init__(self, hcas: tuple[str, ...] | list[str] = ("mlx5_0",), host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, token: bytes | None = None,
                 max_frame: int | None = None, limits: Limits | None = None,
                 crypto: DeviceCrypto | None = None, strict_blocks: bool = False,
                 peer_token: bytes | None | object = SAME_TOKEN, trains: bool = True) -> None:
        if not hcas:
            raise ValueError("a daemon needs at least one HCA")
        limits = limits or Limits()
        if max_frame is not None:
            limits = dataclasses.replace(limits, max_frame=max_frame)
        self.limits = limits
        # Every HCA of the daemon starts with the same crypto configuration
        # (docs/crypto-import.md): import method, import KEK and credential.
        self.crypto = crypto or DeviceCrypto()
        self.hcas = {name: HCA(name, self.crypto, strict_blocks=strict_blocks) for name in hcas}
        self.host = host
        self.port = port
        self.token = token
        # Wire links (other daemons) prove the peer token; by default the clients' one.
        self.peer_token = token if peer_token is SAME_TOKEN else peer_token
        self.max_frame = limits.max_frame
        # Packet trains (docs/protocol.md): runs of one WR's packets go as one frame.
        # Off (``serve --no-trains``), every request packet goes as its own frame; READ
        # responses too. Trains that arrive are taken either way.
        self.trains = trains
        self.registered_bytes = 0
        self.connections = 0
        # Connections still in the HELLO, oldest first (a dict keeps insertion order).
        self._pre_hello: dict[asyncio.StreamWriter, None] = {}
        self.qps: dict[tuple[str, int], QPHost] = {}
        self.links: dict[tuple[str, int], WireLink] = {}
        self.sessions: set[ControlSession] = set()
        self.counters: dict[str, int] = {
            "packets_sent": 0, "packets_received": 0, "packets_bad_icrc": 0,
            "packets_unknown_qp": 0, "packets_over_mtu": 0, "wire_protocol_errors": 0,
            "control_sessions": 0, "wire_connections": 0, "connections_refused": 0,
            "packets_dropped_link_full": 0, "packets_wrong_peer": 0, "pre_hello_evicted": 0}
        # Wire taps: callables (direction "tx" | "rx", dev, Packet) seeing every packet
        # this daemon sends or accepts (the demo's wire images, captures, traces).
        # Empty, they cost one truth test per batch.
        self.taps: list = []
        self.faults = Faults()
        # Sessions that asked for pushed events: session -> ({"packets", "trace"},
        # daemon_wide).
        self.subscribers: dict[ControlSession, tuple[set[str], bool]] = {}
        self._packet_watch = False
        # RC statistics of QPs already destroyed, so daemon totals never go backwards.
        self._gone_qp_stats: dict[str, int] = {}
        self._reorder_timer: asyncio.TimerHandle | None = None
        self._trim_timer: asyncio.TimerHandle | None = None
        # QP numbers start at an unpredictable 24-bit value (issue 13: QPNs counted from
        # 0x11 let a forged packet name another session's QP without looking).
        self._qpn = itertools.count(secrets.randbelow(QPN_MOD))
        self._server: asyncio.AbstractServer | None = None
        self._conn_tasks: set[asyncio.Task] = set()
        self._resolving: set[asyncio.Task] = set()
        self._closing = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connection, self.host, self.port,
                                                  limit=READ_CHUNK)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("listening %s", kv(event="listen", address=self.address,
                                     hcas=",".join(self.hcas), auth=self.token is not None))

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def close(self) -> None:
        """Graceful stop: every QP to ERR (outstanding WRs flushed), every connection closed."""
        if self._closing:
            return
        self._closing = True
        log.info("stopping %s", kv(event="shutdown", sessions=len(self.sessions),
                                    qps=len(self.qps)))
        if self._server is not None:
            self._server.close()
        if self._trim_timer is not None:
            self._trim_timer.cancel()
        for session in list(self.sessions):
            session.verbs.flush_all()
        # A poll_cq waiting when the signal came is owed the flushed completions: let
        # those replies go out before the connections close.
        waits = [t for s in self.sessions for t in s.verbs._waits]
        if waits:
            await asyncio.wait(waits, timeout=1.0)
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.writer.drain(), 1.0)
        for link in list(self.links.values()):
            link.close()
        for task in [*self._conn_tasks, *self._resolving]:
            task.cancel()
        if self._conn_tasks:
            await asyncio.gather(*self._conn_tasks, return_exceptions=True)
        for session in list(self.sessions):
            session.verbs.destroy_all()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    # -- connections ----------------------------------------------------------------------
    async def _on_connection(self, reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
        # A coroutine, so that asyncio runs it as a task this daemon can find and
        # cancel on close (a plain callback has no current task).
        task = asyncio.current_task()
        if task is not None:
            self._conn_tasks.add(task)
            task.add_done_callback(self._conn_tasks.discard)
        await self._connection(reader, writer)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if peer else "?"
        decoder = FrameDecoder(self.max_frame)
        limits = self.limits
        if len(self._pre_hello) >= limits.max_pre_hello:
            # Issue 13, defect 4: sockets that never say hello must not lock everyone
            # out. The oldest of them makes room; it has had the longest to speak.
            oldest = next(iter(self._pre_hello))
            del self._pre_hello[oldest]
            self.counters["pre_hello_evicted"] += 1
            with contextlib.suppress(Exception):
                oldest.transport.abort()
        self._pre_hello[writer] = None
        authenticated = False
        try:
            challenge, nonce = make_challenge(self.token is not None
                                              or self.peer_token is not None)
            writer.writelines(encode_frame(challenge))
            frames = await asyncio.wait_for(read_frames(reader, decoder), limits.hello_timeout)
            if not frames:
                return
            hello = frames[0].header
            role = verify_hello(hello, nonce, self.token, self.peer_token)
            self._pre_hello.pop(writer, None)
            if self.connections >= limits.max_connections:
                self.counters["connections_refused"] += 1
                log.warning("refused %s", kv(event="refused", peer=peer_s, errno="EBUSY",
                                              reason="connection limit"))
                send_error(writer, 0, RDMAError("EBUSY", f"this daemon serves at most "
                                                          f"{limits.max_connections} "
                                                          "connections"))
                return
            self.connections += 1
            authenticated = True
            writer.writelines(encode_frame({"t": "welcome", "role": role,
                                            "devices": list(self.hcas),
                                            "max_frame": self.max_frame}))
            rest = frames[1:]
            if role == "control":
                session = ControlSession(self, reader, writer, decoder, peer_s)
                await session.run(rest)
            else:
                origin = _link_origin(peer, hello_src(hello))
                await self._wire_in(reader, writer, decoder, rest, peer_s, origin)
        except (HandshakeError, FrameError) as e:
            log.warning("refused %s", kv(event="refused", peer=peer_s, errno=e.errno_name,
                                          reason=e.message))
            send_error(writer, 0, e)
        except asyncio.TimeoutError:
            log.warning("refused %s", kv(event="refused", peer=peer_s, errno="ETIMEDOUT",
                                          reason="no hello within the handshake timeout"))
            send_error(writer, 0, RDMAError("ETIMEDOUT", "no hello within "
                                                          f"{limits.hello_timeout:g} s"))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Daemon.close cancels connection tasks; ending normally keeps asyncio's
            # stream callback from reporting the cancellation as an error.
            pass
        finally:
            self._pre_hello.pop(writer, None)
            if authenticated:
                self.connections -= 1
            with contextlib.suppress(Exception):
                writer.close()

    # -- wire plane: inbound --------------------------------------------------------------
    async def _wire_in(self, reader, writer, decoder: FrameDecoder, first: list,
                       peer: str, origin: tuple[str, int] | None) -> None:
        self.counters["wire_connections"] += 1
        log.info("wire link up %s", kv(event="wire_in", peer=peer))
        frames = first
        try:
            while True:
                touched: dict[int, QPHost] = {}
                now = asyncio.get_running_loop().time()
                for fr in frames:
                    try:
                        dev, run = decode(fr.header, fr.payload)
                    except IntegrityError as e:
                        # A link error: dropped and counted; the requester's
                        # retransmission recovers it (docs/architecture.md, wire plane).
                        self.counters["packets_bad_icrc"] += e.packets
                        continue
                    self._take_run(dev, run, fr.header.get("sqp"), origin, now, touched)
                for qph in touched.values():
                    self.service(qph)
                frames = await read_frames(reader, decoder)
                if not frames:
                    return
        except FrameError as e:
            self.counters["wire_protocol_errors"] += 1
            log.warning("wire peer disconnected %s", kv(event="wire_protocol_error", peer=peer,
                                                        errno=e.errno_name, reason=e.message))
            send_error(writer, 0, e)

    def _take_run(self, dev: str, run: Run, sqp, origin, now: float, touched: dict) -> None:
        """A run (a frame's packets) accepted from a wire link: given whole to its QP
        (RCQP.receive) when nothing here needs its packets; cut into packets, each
        observed and checked on its own, where a tap, a ``packets`` subscriber or a fault
        rule must see them, or where its packets may exceed the QP's path MTU (the
        over-MTU drop is per packet). Counters count packets either way."""
        qph = self.qps.get((dev, run.dest_qp))
        if self.taps or self._packet_watch or self.faults.rules or (
                qph is not None and run.mtu > qph.rcqp.mtu):
            for pkt in run.packets():
                self._observe(dev, pkt, qph, sqp, origin, now, touched)
            return
        self.counters["packets_received"] += run.n
        if qph is None:
            self.counters["packets_unknown_qp"] += run.n
        elif origin not in qph.origins or sqp != qph.rcqp.dest_qp:
            # A connected QP takes packets only from the daemon and QP of its address
            # vector, as an HCA drops a packet whose source does not match the QP's
            # context.
            self.counters["packets_wrong_peer"] += run.n
        else:
            qph.rcqp.receive(run, now)
            touched[id(qph)] = qph

    def _observe(self, dev: str, pkt: Packet, qph: QPHost | None, sqp, origin, now: float,
                 touched: dict) -> None:
        """One packet of a run cut for observation: taps, the source and MTU checks,
        fault rules, then its QP."""
        self.counters["packets_received"] += 1
        if self.taps:
            for tap in self.taps:
                tap("rx", dev, pkt)
        if self._packet_watch:
            self._packet_event("rx", dev, pkt, qph.session if qph is not None else None)
        if qph is None:
            self.counters["packets_unknown_qp"] += 1
            return
        if origin not in qph.origins or sqp != qph.rcqp.dest_qp:
            self.counters["packets_wrong_peer"] += 1
            return
        if len(pkt.payload) > qph.rcqp.mtu:
            # IBTA 9.6.3: a packet longer than the path MTU is silently dropped.
            self.counters["packets_over_mtu"] += 1
            return
        if self.faults.rules:
            for e in self.faults.apply("in", qph.rcqp.qp_num, qph.rcqp.mtu, [pkt],
                                       on_rnr=self._refuse_rnr(qph), route=qph,
                                       owner=qph.session):
                self._emit_in(e, now, touched)
            self._arm_reorder_flush()
        else:
            qph.rcqp.receive(Run.of(pkt), now)
            touched[id(qph)] = qph

    def _refuse_rnr(self, qph: QPHost):
        def refuse(p: Packet) -> bool:
            # Only a SEND that would take a receive now can be refused with RNR.
            if p.opcode not in _SEND_FIRSTS:
                return False
            qph.rcqp.refuse_rnr = 1
            return True
        return refuse

    def _emit_in(self, e: Emit, now: float, touched: dict | None) -> None:
        qph: QPHost = e.route
        if e.stale_icrc_of is not None:
            # A link error on the way in: the integrity check fails, the packet goes.
            self.counters["packets_bad_icrc"] += 1
            return
        if e.delay:
            asyncio.get_running_loop().call_later(e.delay, self._deliver_late, e)
            return
        if qph.session.gone:
            return
        qph.rcqp.receive(Run.of(e.packet), now)
        qph.rcqp.refuse_rnr = 0
        if touched is None:
            self.service(qph)
        else:
            touched[id(qph)] = qph

    def _deliver_late(self, e: Emit) -> None:
        e.delay = 0.0
        self._emit_in(e, asyncio.get_running_loop().time(), None)

    def _emit_out(self, e: Emit) -> None:
        if e.delay:
            delay, e.delay = e.delay, 0.0
            asyncio.get_running_loop().call_later(delay, self._emit_out, e)
            return
        host, port, dev, src_qp = e.route
        override = packet_check(dev, e.stale_icrc_of) if e.stale_icrc_of is not None else None
        self.link_to(host, port).send(dev, [e.packet], override, src_qp=src_qp)
        self.counters["packets_sent"] += 1

    def _arm_reorder_flush(self) -> None:
        if self.faults.holding and self._reorder_timer is None:
            self._reorder_timer = asyncio.get_running_loop().call_later(
                REORDER_FLUSH_S, self._flush_reordered)

    def _flush_reordered(self) -> None:
        self._reorder_timer = None
        now = asyncio.get_running_loop().time()
        for direction, e in self.faults.flush_held():
            if direction == "out":
                self._emit_out(e)
            else:
                self._emit_in(e, now, None)

    # -- events pushed to subscribers (softhca trace / capture) ---------------------------
    def subscribe(self, session: ControlSession, kinds: set[str],
                  daemon_wide: bool = False) -> None:
        """Push ``kinds`` of events to ``session``: those of its own QPs, or with
        ``daemon_wide`` every session's (issue 13: a tap showed others' payloads)."""
        if kinds:
            self.subscribers[session] = (kinds, daemon_wide)
        else:
            self.subscribers.pop(session, None)
        self._rewire_events()

    def _wants(self, kind: str, owner: ControlSession | None = None) -> list[ControlSession]:
        """The subscribers to ``kind`` that may see an event of ``owner``'s QP (any
        subscriber when ``owner`` is None and the question is whether anyone listens)."""
        return [s for s, (k, wide) in self.subscribers.items()
                if kind in k and not s.gone and (wide or owner is None or s is owner)]

    def _rewire_events(self) -> None:
        """Watch packets and install the QPs' trace hooks only while someone listens,
        so that without subscribers neither costs anything."""
        self._packet_watch = bool(self._wants("packets"))
        hook = self._trace_event if self._wants("trace") else None
        for qph in self.qps.values():
            qph.rcqp.trace = hook if hook is None else self._trace_hook(qph)

    def _trace_hook(self, qph: QPHost):
        dev, owner = qph.hca.name, qph.session
        return lambda ctx, ev: self._trace_event(dev, ctx, ev, owner)

    def _packet_event(self, direction: str, dev: str, p: Packet,
                      owner: ControlSession | None) -> None:
        subs = [s for s in self._wants("packets", owner)
                if owner is not None or self.subscribers[s][1]]
        if not subs:
            return
        header = {"t": "event", "kind": "packet", "dir": direction, "dev": dev,
                  "time": asyncio.get_running_loop().time(), "daemon": self.address,
                  "pkt": packet_header(dev, p)}
        for s in subs:
            s.push(header, p.payload)

    def _trace_event(self, dev: str, ctx: dict, ev, owner: ControlSession) -> None:
        subs = self._wants("trace", owner)
        if not subs:
            return
        header = {"t": "event", "kind": "trace", "dev": dev, "daemon": self.address,
                  "time": asyncio.get_running_loop().time(), **plain(ctx),
                  "direction": ev.direction, "stage": ev.stage, "key": ev.key,
                  "stream": ev.stream, "offset": ev.offset, "detail": plain(ev.detail)}
        for s in subs:
            s.push(header, ev.data)

    def stats(self) -> dict[str, int]:
        """The daemon's counters and the RC statistics summed over its QPs, past and present."""
        total = dict(self.counters)
        for k, v in self._gone_qp_stats.items():
            total[k] = total.get(k, 0) + v
        for qph in self.qps.values():
            for k, v in qph.rcqp.stats.items():
                total[k] = total.get(k, 0) + v
        for name in ("retransmissions", "retransmitted_packets", "ack_timeouts", "rnr_retries",
                     "duplicates_discarded", "psn_seq_naks_sent"):
            total.setdefault(name, 0)
        total["fault_rules"] = len(self.faults.rules)
        total.update(self.partial_block_counts())
        return total

    def partial_block_counts(self) -> dict[str, int]:
        """Layouts and transfers that were not whole protection blocks (docs/blocks.md):
        the totals, and "NAME[dev:mkey]" for each MKEY that had any, while it exists."""
        out = {"partial_block_layouts": 0, "partial_block_transfers": 0}
        for hca in self.hcas.values():
            for name, n in hca.partial_blocks.items():
                out[name] += n
            for key, obj in hca.keys.items():
                for name in ("partial_block_layouts", "partial_block_transfers"):
                    n = getattr(obj, name, 0)
                    if n:
                        out[f"{name}[{hca.name}:{key:#x}]"] = n
        return out

    def release_links(self, qps: set) -> None:
        """A session closed: its QPs' queued packets go, and a link no live QP sends on
        any more is closed, so a peer that never reads keeps nothing of it."""
        for link in list(self.links.values()):
            link.forget(qps)
        wanted = {(q.dest[0], q.dest[1]) for q in self.qps.values() if q.dest is not None}
        for key, link in list(self.links.items()):
            if key not in wanted:
                # Nobody sends on it any more: what it still holds is lost on the wire,
                # as for a link that is cut, and freed now.
                link.close(abort=True)
                del self.links[key]
        _return_free_memory()

    def forget_qp(self, qph: QPHost) -> None:
        for k, v in qph.rcqp.stats.items():
            self._gone_qp_stats[k] = self._gone_qp_stats.get(k, 0) + v
        self.qps.pop((qph.hca.name, qph.rcqp.qp_num), None)

    # -- wire plane: outbound, timers and completions ------------------------------------
    def link_to(self, host: str, port: int) -> WireLink:
        link = self.links.get((host, port))
        if link is None or link.closed:
            link = WireLink(self, host, port)
            self.links[(host, port)] = link
        return link

    def service(self, qph: QPHost) -> None:
        """Let the QP transmit, move its completions, arm its next timer."""
        if qph.session.gone:
            return
        loop = asyncio.get_running_loop()
        pkts = qph.rcqp.poll_wire(loop.time(), self.trains)
        if pkts and qph.dest is not None:
            host, port, dev = qph.dest
            if not self.trains or self.taps or self._packet_watch or self.faults.rules:
                # Trains are cut into their packets where packets are needed: each tap
                # and subscriber sees, and each fault rule matches, the packets the QP
                # would have sent one by one (GSO segmentation before a tap).
                pkts = split(pkts)
            if self.taps:
                for p in pkts:
                    for tap in self.taps:
                        tap("tx", dev, p)
            if self._packet_watch:
                for p in pkts:
                    self._packet_event("tx", dev, p, qph.session)
            if self.faults.rules:
                for e in self.faults.apply("out", qph.rcqp.qp_num, qph.rcqp.mtu, pkts,
                                           route=(*qph.dest, qph.rcqp.qp_num),
                                           owner=qph.session):
                    self._emit_out(e)
                self._arm_reorder_flush()
            else:
                self.link_to(host, port).send(dev, pkts, src_qp=qph.rcqp.qp_num, owner=qph)
                self.counters["packets_sent"] += count(pkts)
        scq = qph.rcqp.poll_send_cq()
        if scq:
            qph.session.verbs.complete(qph.scq, scq)
        rcq = qph.rcqp.poll_recv_cq()
        if rcq:
            qph.session.verbs.complete(qph.rcq, rcq)
        if qph.rcqp.events:
            for ev in qph.rcqp.take_events():
                qph.session.verbs.async_events.push(qph.ctx, ev, qp=qph.handle,
                                              qp_num=qph.rcqp.qp_num)
        if (qph.rcqp.state == QpState.ERR) != qph.flushed:
            # Into ERR (or out of it again, through RESET, for the next time).
            qph.flushed = not qph.flushed
            if qph.flushed:
                self._trim_soon()
        deadline = qph.rcqp.next_deadline()
        if deadline != qph.timer_at:
            if qph.timer is not None:
                qph.timer.cancel()
            qph.timer = None if deadline is None else loop.call_at(deadline, self._fire, qph)
            qph.timer_at = deadline

    def _trim_soon(self) -> None:
        """QPs went to ERR: the messages their flushed WRs had gathered are free now, and
        many at once when a peer is lost (each QP retries out). Those blocks sit in the
        heap below later allocations, so glibc cannot give them back by itself; one
        malloc_trim for every QP that failed within TRIM_DELAY_S does."""
        if self._trim_timer is None:
            self._trim_timer = asyncio.get_running_loop().call_later(TRIM_DELAY_S,
                                                                      self._trim_now)

    def _trim_now(self) -> None:
        self._trim_timer = None
        _return_free_memory()

    def _fire(self, qph: QPHost) -> None:
        qph.timer = qph.timer_at = None
        self.service(qph)

    def set_origins(self, qph: QPHost, host: str, port: int) -> None:
        """The (host, port) pairs a QP connected to ``host:port`` takes packets from;
        a host name is resolved in the background (until then the QP takes none, and
        the peer's retransmission covers the wait)."""
        cls = host_class(host)
        qph.origins = frozenset()
        if cls == "loopback" or _is_ip(host):
            qph.origins = frozenset({(cls, port)})
            return

        async def resolve() -> None:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port)
            except OSError as e:
                log.warning("peer address unresolved %s", kv(event="resolve_failed",
                                                             host=host, reason=str(e)))
                return
            if qph.dest is not None and qph.dest[:2] == (host, port):
                qph.origins = frozenset((host_class(i[4][0]), port) for i in infos)

        task = asyncio.get_running_loop().create_task(resolve())
        self._resolving.add(task)
        task.add_done_callback(self._resolving.discard)

    def new_qpn(self) -> int:
        """A 24-bit QP number in use on none of this daemon's HCAs; never QP0 or QP1,
        which IBA reserves for management."""
        while True:
            qpn = next(self._qpn) % QPN_MOD
            if qpn > 1 and not any((dev, qpn) in self.qps for dev in self.hcas):
                return qpn


class WireLink:
    """An outgoing wire connection to another daemon; packets queue until it is up.

    Its send buffer is bounded (``MAX_BUFFERED`` bytes, queued or unsent): past it the
    packets are lost on the wire, counted, and RC recovers them or, when the peer
    never reads, the QPs run out of retries (IBV_WC_RETRY_EXC_ERR), as over a cable
    nobody drains."""

    MAX_BUFFERED = 4 << 20

    def __init__(self, daemon: Daemon, host: str, port: int) -> None:
        self.daemon = daemon
        self.host, self.port = host, port
        self.writer: asyncio.StreamWriter | None = None
        # (dev, packet or train, icrc override, source QPN, the QP that sent it) until
        # the link is up.
        self.queued: list[tuple[str, Packet | Run, int | None, int, object]] = []
        self.queued_bytes = 0
        # The largest frame the peer takes (its welcome says): a train that would be
        # larger goes as its packets.
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self.closed = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    def buffered(self) -> int:
        """Bytes this link holds: queued before it is up, or unsent in its socket."""
        if self.writer is None:
            return self.queued_bytes
        return self.writer.transport.get_write_buffer_size()

    def send(self, dev: str, pkts: list[Packet | Run], icrc_value: int | None = None, *,
             src_qp: int, owner: object = None) -> None:
        """Frame and write ``pkts`` (packets and trains) of QP ``src_qp``; ``icrc_value`` (one packet)
        overrides its check; ``owner`` (the sending QP) lets a closing session take back
        its queued packets."""
        if self.closed:
            return      # lost on the wire; RC retransmission or its retry limit follows
        room = self.MAX_BUFFERED - self.buffered()
        if room <= 0:
            self.daemon.counters["packets_dropped_link_full"] += count(pkts)
            return
        if self.writer is None:
            for p in pkts:
                self.queued.append((dev, p, icrc_value, src_qp, owner))
                self.queued_bytes += len(p.payload) + PACKET_OVERHEAD
            return
        bufs = []
        if any(type(p) is Run and len(p.payload) + TRAIN_HEADROOM > self.peer_max_frame
               for p in pkts):
            pkts = [x for p in pkts for x in (
                p.packets() if type(p) is Run
                and len(p.payload) + TRAIN_HEADROOM > self.peer_max_frame else [p])]
        for p in pkts:
            # The source QP, which the receiver checks against its QP's dest_qp_num
            # (the BTH does not carry it; an HCA knows it from the QP context).
            h = (train_header(dev, p) if type(p) is Run
                 else packet_header(dev, p, icrc_value=icrc_value))
            h["sqp"] = src_qp
            bufs.extend(encode_frame(h, p.payload))
        self.writer.writelines(bufs)

    def forget(self, owners: set) -> None:
        """Drop the queued packets of ``owners`` (the QPs of a closing session)."""
        if self.queued:
            self.queued = [q for q in self.queued if q[4] not in owners]
            self.queued_bytes = sum(len(q[1].payload) + PACKET_OVERHEAD for q in self.queued)

    def close(self, abort: bool = False) -> None:
        """Close the link; with ``abort``, drop what its socket has not sent (a close
        waits for the peer to take it, which a peer that never reads never does)."""
        self.closed = True
        self.task.cancel()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                if abort:
                    self.writer.transport.abort()
                else:
                    self.writer.close()

    async def _run(self) -> None:
        where = f"{self.host}:{self.port}"
        try:
            link = await open_link(self.host, self.port, "wire", self.daemon.peer_token,
                                   timeout=HANDSHAKE_TIMEOUT, max_frame=self.daemon.max_frame,
                                   src=self.daemon.address)
            reader, writer = link.reader, link.writer
            peer_max = link.welcome.get("max_frame")
            if type(peer_max) is int and peer_max > 0:
                self.peer_max_frame = peer_max
            self.writer = writer
            queued, self.queued, self.queued_bytes = self.queued, [], 0
            for dev, p, icrc_value, src_qp, owner in queued:
                self.send(dev, [p], icrc_value, src_qp=src_qp, owner=owner)
            log.info("wire link up %s", kv(event="wire_out", peer=where))
            # Nothing is expected back on this direction; reading notices the close.
            while await reader.read(READ_CHUNK):
                pass
        except asyncio.CancelledError:
            raise
        except (OSError, ConnectionError, asyncio.TimeoutError, RDMAError) as e:
            log.warning("wire link failed %s", kv(event="wire_out_failed", peer=where,
                                                   reason=str(e) or type(e).__name__))
        finally:
            self.closed = True
            self.queued, self.queued_bytes = [], 0


_malloc_trim = None


def _return_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc malloc_trim(3)) once a
    session's QPs and links are gone: a WR's gathered message is one block kept until
    it completes, and what a closed session freed should not stay resident because a
    later allocation sits above it in the heap. A no-op where malloc_trim is missing."""
    global _malloc_trim
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


def host_class(ip: str) -> str:
    """A host as the wire check compares it: every loopback address is one host, and an
    IPv4-mapped IPv6 address (a dual-stack listener's view) is its IPv4 address."""
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return "loopback" if ip == "localhost" else ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return "loopback" if addr.is_loopback else str(addr)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
        return True
    except ValueError:
        return False


def _link_origin(peer, src: str | None) -> tuple[str, int] | None:
    """Where an incoming wire link comes from: the host its TCP connection comes from
    (which a remote sender cannot choose) and the port its hello says its daemon
    listens on. None for a link that names no daemon: its packets match no QP."""
    if src is None or not peer:
        return None
    return host_class(peer[0]), int(src.rpartition(":")[2])
