"""The wire plane of a daemon: RC packets between its QPs and other daemons' over TCP.

Packets to a daemon go on an outgoing ``WireLink`` this daemon opens to it (its HELLO
is server/link.py's ``open_link``, as a client's is); each daemon only reads packets
from the links others opened to it (``WirePlane.wire_in``), so the two directions of a
QP pair never share a socket. On both ways the packets pass the wire taps and
subscribers (server/taps.py) and the fault rules (server/faults.py, with the
reordering they hold back); an accepted packet goes to its QP only from the daemon and
QP its address vector names.

The plane does not drive the QPs: after packets reach a QP it calls the daemon's
``service`` (server/daemon.py), which lets the QP answer, and ``transmit`` is what
``service`` calls with the packets a QP sends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections import deque
from collections.abc import Callable

from ..engine.ud import Addressed
from ..protocol.errors import RDMAError
from ..protocol.frames import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode_frame
from ..protocol.kinds import FrameKind
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
from ..protocol.runs import RUNS_FRAME_MAX, decode_runs, runs_frame
from .faults import REORDER_FLUSH_S, Emit, Faults
from .hosts import QPHost
from .link import READ_CHUNK, open_link
from .logs import kv, log
from .session import send_error
from .taps import Taps
from .wire_in import WireIn

_RUNS = FrameKind.RUNS.value
# The packets that begin a SEND: the ones that would take a receive.
# (RC's: UC and UD have no RNR NAK.)
_SEND_FIRSTS = with_flags(Op.SEND | Op.FIRST, none_of=Op.UC | Op.UD)

HANDSHAKE_TIMEOUT = 10.0
# Bytes per second of packets a wire link may bring that are dropped on arrival
# (duplicates, outside the window, for no QP or from the wrong peer): past it the link
# is read more slowly, so that a peer flooding what is thrown away costs the daemon a
# bounded share of its time. Go-back-N after a loss resends what was taken already,
# well under this.
WASTE_RATE = 64 << 20
# What a queued packet costs beside its payload (the Packet, its header map, the frame).
PACKET_OVERHEAD = 256
# Room a train frame's prefix and header take beside its payload (a header is well under).
TRAIN_HEADROOM = 1024
# Room each run after the first takes in a runs frame's header (an entry is under 80 bytes).
RUN_HEADROOM = 128
# How long a link nobody sends on any more may still send its last CM messages (the
# DREQs of a closing session's rdma_cm ids) before it is cut.
CM_LINGER_S = 1.0


class WirePlane:
    """The wire links of one daemon and what its packets go through on the way."""

    def __init__(self, *, counters: dict[str, int], qps: dict[tuple[str, int], QPHost],
                 faults: Faults, taps: Taps, service: Callable[[QPHost], None],
                 trains: bool, peer_token: bytes | None, max_frame: int,
                 address: Callable[[], str],
                 loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.get_running_loop,
                 ) -> None:
        self.counters = counters
        self.qps = qps
        self.faults = faults
        self.events = taps
        self.taps = taps.taps
        self.service = service
        self.trains = trains
        self.peer_token = peer_token
        self.max_frame = max_frame
        self.address = address
        # The running loop (the daemon's, kept: asyncio's costs a getpid each call).
        self.loop = loop
        # Which daemons this one's links reached ((host, port) as a QP named it), and
        # which daemons opened a link here (their origin): a QP whose retries run out
        # towards a daemon it reached but that never opened a link back was not heard
        # because that daemon cannot connect back (Daemon.explain_retry_exceeded).
        self.reached: set[tuple[str, int]] = set()
        self.heard_from: set[tuple[str, int]] = set()
        self.links: dict[tuple[str, int], WireLink] = {}
        self.resolving: set[asyncio.Task] = set()
        # Links closed while their sockets still send their last CM messages.
        self.lingering: set[WireLink] = set()
        self._reorder_timer: asyncio.TimerHandle | None = None
        # Where CM messages go (the daemon's ConnectionManager.receive).
        self.on_cm: Callable = lambda header, payload, origin: None

    # -- inbound --------------------------------------------------------------------------
    async def wire_in(self, reader, writer, decoder: FrameDecoder, first: list,
                      peer: str, origin: tuple[str, int] | None) -> None:
        self.counters["wire_connections"] += 1
        if origin is not None:
            self.heard_from.add(origin)
        log.info("wire link up %s", kv(event="wire_in", peer=peer))

        def failed(e: FrameError) -> None:
            self.counters["wire_protocol_errors"] += 1
            log.warning("wire peer disconnected %s", kv(event="wire_protocol_error", peer=peer,
                                                        errno=e.errno_name, reason=e.message))
            send_error(writer, 0, e)

        link = WireIn(decoder, lambda frames: self.take_frames(frames, origin),
                      self._throttle, failed)
        # What the stream reader read past the HELLO's frames and still holds (a private
        # attribute of asyncio's StreamReader; without it, nothing is held there).
        held = getattr(reader, "_buffer", None)
        pending = bytes(held) if held else b""
        if held:
            held.clear()
        link.attach(writer.transport, first, pending)
        await link.done

    def take_frames(self, frames: list, origin: tuple[str, int] | None) -> int:
        """The frames of one read of a wire link: CM messages to the connection manager,
        packets and trains to their QPs, which are then serviced once each. Returns the
        payload bytes dropped on arrival. Raises FrameError for a frame that breaks the
        protocol (the link closes)."""
        touched: dict[int, QPHost] = {}
        now = self.loop().time()
        waste = 0
        for fr in frames:
            if fr.header.get("t") == "cm":
                # A connection manager message (server/cm.py), from the daemon this
                # link proved it comes from.
                self.on_cm(fr.header, fr.payload, origin)
                continue
            try:
                if fr.kind == _RUNS:
                    # Several messages' runs (protocol/runs.py): each taken as the
                    # train frame of it would be.
                    dev, runs = decode_runs(fr.header, fr.payload)
                    for run, sqp in runs:
                        waste += self._take_run(dev, run, sqp, origin, now, touched)
                    continue
                dev, run = decode(fr.header, fr.payload)
            except IntegrityError as e:
                # A link error: dropped and counted; the requester's retransmission
                # recovers it (docs/architecture.md, wire plane).
                self.counters["packets_bad_icrc"] += e.packets
                continue
            waste += self._take_run(dev, run, fr.header.get("sqp"), origin, now, touched)
        for qph in touched.values():
            self.service(qph)
        return waste

    def _throttle(self, waste: int) -> float:
        """``waste`` bytes just read were dropped on arrival: count them; the seconds the
        link is not read for, so that it brings no more than WASTE_RATE of them (0: it
        need not wait)."""
        self.counters["wire_bytes_discarded"] += waste
        delay = waste / WASTE_RATE
        if delay < 0.001:
            return 0.0
        self.counters["wire_throttle_ms"] += int(delay * 1000)
        return delay

    def _take_run(self, dev: str, run: Run, sqp, origin, now: float, touched: dict) -> int:
        """A run (a frame's packets) accepted from a wire link: given whole to its QP
        (RCQP.receive) when nothing here needs its packets; cut into packets, each
        observed and checked on its own, where a tap, a ``packets`` subscriber or a fault
        rule must see them, or where its packets may exceed the QP's path MTU (the
        over-MTU drop is per packet). Counters count packets either way. Returns the
        payload bytes dropped on arrival (the fast path's)."""
        qph = self.qps.get((dev, run.dest_qp))
        if self.events.per_packet or self.faults.rules or (
                qph is not None and run.mtu > qph.rcqp.mtu):
            for pkt in run.packets():
                self._observe(dev, pkt, qph, sqp, origin, now, touched)
            return 0
        if self.events.watching:
            # Taps that take runs (a capture): the run whole, cut later, off this path.
            self.events.seen("rx", dev, [run], qph.session if qph is not None else None)
        self.counters["packets_received"] += run.n
        if qph is None:
            self.counters["packets_unknown_qp"] += run.n
            return len(run.payload)
        if qph.rcqp.connected and (origin not in qph.origins or sqp != qph.rcqp.dest_qp):
            self.counters["packets_wrong_peer"] += run.n
            return len(run.payload)
        stats = qph.rcqp.stats
        before = _discarded(stats)
        qph.rcqp.receive(run, now)
        touched[id(qph)] = qph
        dropped = _discarded(stats) - before
        return len(run.payload) if dropped >= run.n else dropped * run.mtu

    def _observe(self, dev: str, pkt: Packet, qph: QPHost | None, sqp, origin, now: float,
                 touched: dict) -> None:
        """One packet of a run cut for observation: taps, the source and MTU checks,
        fault rules, then its QP."""
        self.counters["packets_received"] += 1
        if self.events.watching:
            self.events.seen("rx", dev, [pkt], qph.session if qph is not None else None)
        if qph is None:
            self.counters["packets_unknown_qp"] += 1
            return
        if qph.rcqp.connected and (origin not in qph.origins or sqp != qph.rcqp.dest_qp):
            # A connected QP takes packets only from the daemon and QP of its address
            # vector, as an HCA drops a packet whose source does not match the QP's
            # context (so a forged packet cannot reach another session's QP).
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

    # -- outbound -------------------------------------------------------------------------
    def transmit(self, qph: QPHost, pkts: list) -> None:
        """Packets (and trains) QP ``qph`` sends, towards its peer: past the taps, the
        subscribers and the fault rules, onto the link to the peer's daemon. A UD QP's
        packets come each with the route of its AH (engine/ud.py ``Addressed``)."""
        if pkts and type(pkts[0]) is Addressed:
            for a in pkts:
                # The links a UD QP sends on stay open while it lives (``release``).
                qph.routes.add(a.route[:2])
                self._transmit_to(qph, a.route, [a.packet])
        elif qph.dest is not None:
            self._transmit_to(qph, qph.dest, pkts)

    def _transmit_to(self, qph: QPHost, dest: tuple[str, int, str],
                     pkts: list[Packet | Run]) -> None:
        host, port, dev = dest
        if not self.trains or self.events.per_packet or self.faults.rules:
            # Trains are cut into their packets where packets are needed: each tap
            # and subscriber sees, and each fault rule matches, the packets the QP
            # would have sent one by one (GSO segmentation before a tap). A tap that
            # takes runs (a capture) cuts them itself, off the data path.
            pkts = split(pkts)
        if self.events.watching:
            self.events.seen("tx", dev, pkts, qph.session)
        if self.faults.rules:
            for e in self.faults.apply("out", qph.rcqp.qp_num, qph.rcqp.mtu, pkts,
                                       route=(*dest, qph.rcqp.qp_num),
                                       owner=qph.session):
                self._emit_out(e)
            self._arm_reorder_flush()
        else:
            self.link_to(host, port).send(dev, pkts, src_qp=qph.rcqp.qp_num, owner=qph)
            self.counters["packets_sent"] += count(pkts)

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

    def send_cm(self, host: str, port: int, header: dict, payload: bytes) -> None:
        """A CM message to the daemon at ``host:port``, on the link its packets take."""
        link = self.link_to(host, port)
        link.cm_sent = True
        link.send(None, [CMFrame(header, payload)], src_qp=0)

    # -- links ------------------------------------------------------------------------------
    def link_to(self, host: str, port: int) -> WireLink:
        link = self.links.get((host, port))
        if link is None or link.closed:
            link = WireLink(self, host, port)
            self.links[(host, port)] = link
        return link

    def connect(self, qph: QPHost, host: str, port: int) -> None:
        """QP ``qph`` is connected to a QP of the daemon at ``host:port``: it takes packets
        from there only, and the link opens now, so that the first packet does not spend
        its ACK timeout on TCP and HELLO set-up."""
        self.set_origins(qph, host, port)
        self.link_to(host, port)

    def release(self, qps: set, keep: set | frozenset = frozenset()) -> None:
        """A session closed: its QPs' queued packets go, and a link no live QP sends on
        any more, nor ``keep`` names (the peers of live rdma_cm ids, whose DREQs go on
        it), is closed, so a peer that never reads keeps nothing of it."""
        for link in list(self.links.values()):
            link.forget(qps)
        wanted = {(q.dest[0], q.dest[1]) for q in self.qps.values() if q.dest is not None}
        wanted.update(keep)
        wanted.update(r for q in self.qps.values() for r in q.routes)
        for key, link in list(self.links.items()):
            if key not in wanted:
                # Nobody sends on it any more: what it still holds is lost on the wire,
                # as for a link that is cut, and freed now. Unless it carried CM
                # messages: the DREQs of the session's rdma_cm ids must reach the peer
                # (rdma_cm tells a peer when a process dies), so it closes once its
                # socket has taken them, within CM_LINGER_S whatever the peer does.
                if link.cm_sent and link.writer is not None:
                    self.lingering.add(link)
                    link.close(linger=CM_LINGER_S,
                               done=lambda link=link: self.lingering.discard(link))
                else:
                    link.close(abort=True)
                del self.links[key]

    async def flush(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until every link that is not closed has
        handed all it holds to the kernel (one still opening has first to open)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while any(link.unsent() for link in (*self.links.values(), *self.lingering)) \
                and loop.time() < end:
            await asyncio.sleep(0.005)

    def close(self) -> None:
        """The daemon stops: every link closes, no peer name is resolved any more."""
        for link in list(self.links.values()):
            link.close()
        for task in self.resolving:
            task.cancel()

    def cannot_hear(self, host: str, port: int) -> bool:
        """Whether the daemon at ``host:port`` was reached by a link from here but never
        opened one back (so its packets, the ACKs included, cannot come)."""
        return (host, port) in self.reached and not peer_origins(host, port) & self.heard_from

    def set_origins(self, qph: QPHost, host: str, port: int) -> None:
        """The (host, port) pairs a QP connected to ``host:port`` takes packets from;
        a host name is resolved in the background (until then the QP takes none, and
        the peer's retransmission covers the wait)."""
        cls = host_class(host)
        qph.origins = frozenset()
        if cls == "loopback" or _is_ip(host):
            qph.origins = peer_origins(host, port)
            return

        async def resolve() -> None:
            try:
                infos = await asyncio.get_running_loop().getaddrinfo(host, port)
            except OSError as e:
                log.warning("peer address unresolved %s", kv(event="resolve_failed",
                                                             host=host, reason=str(e)))
                return
            if qph.dest is not None and qph.dest[:2] == (host, port):
                qph.origins = frozenset().union(*(peer_origins(i[4][0], port)
                                                  for i in infos))

        task = asyncio.get_running_loop().create_task(resolve())
        self.resolving.add(task)
        task.add_done_callback(self.resolving.discard)


class WireLink:
    """An outgoing wire connection to another daemon.

    Everything sent goes through one backlog, before the link is up and after: the
    backlog is bounded (``MAX_BACKLOG`` bytes, as ``_charge`` counts them) *before* it
    grows, and past it packets are lost on the wire, counted
    (``packets_dropped_link_full``), and RC recovers them
    or, when the peer never reads, the QPs run out of retries (IBV_WC_RETRY_EXC_ERR),
    as over a cable nobody drains. The backlog moves to the socket only while its
    unsent bytes are under ``MAX_BUFFERED``, and again each time the socket drains; so
    a READ's responses, views of the memory read, are read as they are sent and never
    copied whole into a socket buffer."""

    MAX_BUFFERED = 4 << 20
    MAX_BACKLOG = 64 << 20

    def __init__(self, plane: WirePlane, host: str, port: int) -> None:
        self.plane = plane
        # The daemon it leaves from, as its HELLO names it (host:port).
        self.daemon = plane.address()
        self.host, self.port = host, port
        self.writer: asyncio.StreamWriter | None = None
        # (dev, packet or train, icrc override, source QPN, the QP that sent it), in the
        # order they go.
        self.backlog: deque[tuple[str, Packet | Run, int | None, int, object]] = deque()
        self.backlog_bytes = 0
        # The largest frame the peer takes (its welcome says): a train that would be
        # larger goes as its packets.
        self.peer_max_frame = DEFAULT_MAX_FRAME
        # Whether the peer takes runs frames (its welcome says "runs": 1; a daemon of
        # the previous version does not, and gets each run as its train frame).
        self.peer_runs = False
        self.closed = False
        # Why it could not open (server/cm.py's address resolution reads it).
        self.failure: BaseException | None = None
        self._draining: asyncio.Task | None = None
        # Whether a CM message went on it (its close then lets the socket send it).
        self.cm_sent = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    def unsent(self) -> bool:
        """Whether it still holds bytes the kernel has not taken (or, opening, will)."""
        if self.writer is None:
            return not self.closed
        return bool(self.backlog_bytes or self.writer.transport.get_write_buffer_size())

    def buffered(self) -> int:
        """Bytes this link holds: its backlog and what its socket has not sent."""
        unsent = self.writer.transport.get_write_buffer_size() if self.writer is not None else 0
        return self.backlog_bytes + unsent

    def send(self, dev: str | None, pkts: list[Packet | Run], icrc_value: int | None = None, *,
             src_qp: int, owner: object = None) -> None:
        """Queue ``pkts`` (packets and trains) of QP ``src_qp`` behind what waits and move
        what the socket takes; ``icrc_value`` (one packet) overrides its check;
        ``owner`` (the sending QP) lets a closing session take back its queued packets."""
        if self.closed:
            return      # lost on the wire; RC retransmission or its retry limit follows
        room = self.MAX_BACKLOG - self.backlog_bytes
        for k, p in enumerate(pkts):
            size = _charge(p)
            if size > room:
                # What does not fit is lost on the wire (a READ's later responses: the
                # requester asks again from the first it lacks).
                self.plane.counters["packets_dropped_link_full"] += count(pkts[k:])
                break
            self.backlog.append((dev, p, icrc_value, src_qp, owner))
            room -= size
        self.backlog_bytes = self.MAX_BACKLOG - room
        self._pump()

    def _pump(self) -> None:
        """Move what the socket takes now; a drainer moves the rest as it drains."""
        self._write_some()
        if self.backlog and self.writer is not None and self._draining is None:
            self._draining = asyncio.get_running_loop().create_task(self._drain())

    def _write_some(self) -> None:
        """Frame the backlog while the socket's unsent bytes (and those framed here) are
        under MAX_BUFFERED, and write them with one ``writelines``: the trains a service
        sends at once leave in one system call, not one each."""
        w = self.writer
        if w is None or self.closed:
            return
        room = self.MAX_BUFFERED - w.transport.get_write_buffer_size()
        bufs: list = []
        backlog = self.backlog
        while backlog and room > 0:
            dev, p, icrc_value, src_qp, _ = backlog.popleft()
            self.backlog_bytes -= _charge(p)
            if dev is None:
                framed = encode_frame(p.header, p.payload)
            elif (self.peer_runs and backlog and type(p) is Run
                  and len(p.payload) + TRAIN_HEADROOM <= self.peer_max_frame):
                framed = self._runs(dev, p, src_qp, room)
            else:
                framed = self._frames(dev, p, icrc_value, src_qp)
            bufs += framed
            room -= sum(len(b) for b in framed)
        if bufs:
            w.writelines(bufs)

    def _runs(self, dev: str, first: Run, src_qp: int, room: int) -> list:
        """``first`` and the runs to the same HCA right behind it in the backlog, as
        many as one frame of the peer's takes (RUNS_FRAME_MAX, its max_frame) and the
        socket's ``room``, as one ``runs`` frame (protocol/runs.py); alone, its train
        frame."""
        runs = [(first, src_qp)]
        size = len(first.payload) + TRAIN_HEADROOM
        limit = min(self.peer_max_frame, room)
        backlog = self.backlog
        while backlog and len(runs) < RUNS_FRAME_MAX:
            d, p, _, sqp, _ = backlog[0]
            if d != dev or type(p) is not Run:
                break
            size += len(p.payload) + RUN_HEADROOM
            if size > limit:
                break
            backlog.popleft()
            self.backlog_bytes -= _charge(p)
            runs.append((p, sqp))
        if len(runs) == 1:
            return self._frames(dev, first, None, src_qp)
        return runs_frame(dev, runs)

    def _frames(self, dev: str, p, icrc_value: int | None, src_qp: int) -> list:
        """The buffers of a packet or train (a train larger than the peer's frame limit
        as its packets)."""
        items = (p.packets() if type(p) is Run
                 and len(p.payload) + TRAIN_HEADROOM > self.peer_max_frame else [p])
        bufs: list = []
        for x in items:
            # The source QP, which the receiver checks against its QP's dest_qp_num (the
            # BTH does not carry it; an HCA knows it from the QP context).
            h = (train_header(dev, x) if type(x) is Run
                 else packet_header(dev, x, icrc_value=icrc_value))
            h["sqp"] = src_qp
            bufs.extend(encode_frame(h, x.payload, check=False))
        return bufs

    async def _drain(self) -> None:
        try:
            while self.backlog and not self.closed:
                await self.writer.drain()
                self._write_some()
        except (ConnectionError, OSError):
            pass
        finally:
            self._draining = None

    def forget(self, owners: set) -> None:
        """Drop the queued packets of ``owners`` (the QPs of a closing session)."""
        if self.backlog:
            self.backlog = deque(q for q in self.backlog if q[4] not in owners)
            self.backlog_bytes = sum(_charge(q[1]) for q in self.backlog)

    def close(self, abort: bool = False, *, linger: float | None = None,
              done=None) -> None:
        """Close the link; with ``abort``, drop what its socket has not sent (a close
        waits for the peer to take it, which a peer that never reads never does); with
        ``linger``, let the socket send what it holds for that many seconds, then abort
        (``done`` is called then). What the backlog holds goes either way."""
        self.closed = True
        self.task.cancel()
        if self._draining is not None:
            self._draining.cancel()
        if linger is not None and self.writer is not None and self.backlog:
            # A link nobody sends on holds only CM messages (its QPs' packets were
            # taken back): small, written whole.
            with contextlib.suppress(Exception):
                self.writer.writelines([b for dev, p, *_ in self.backlog if dev is None
                                        for b in encode_frame(p.header, p.payload)])
        self.backlog.clear()
        self.backlog_bytes = 0
        if self.writer is not None:
            with contextlib.suppress(Exception):
                if abort:
                    self.writer.transport.abort()
                else:
                    self.writer.close()
            if linger is not None:
                transport = self.writer.transport

                def end() -> None:
                    transport.abort()
                    if done is not None:
                        done()
                asyncio.get_running_loop().call_later(linger, end)
        elif done is not None:
            done()

    async def _run(self) -> None:
        where = f"{self.host}:{self.port}"
        try:
            link = await open_link(self.host, self.port, "wire", self.plane.peer_token,
                                   timeout=HANDSHAKE_TIMEOUT, max_frame=self.plane.max_frame,
                                   src=self.daemon,
                                   local_host=loopback_source(self.daemon, self.host))
            reader, writer = link.reader, link.writer
            if self.closed:
                # Closed while it opened, and still running: asyncio.wait_for (Python
                # before 3.12) loses a cancellation that comes as the handshake ends, and
                # the link would go up and read for ever, its peer's end with it (a
                # daemon's link to itself kept its stop waiting).
                writer.transport.abort()
                return
            peer_max = link.welcome.get("max_frame")
            if type(peer_max) is int and peer_max > 0:
                self.peer_max_frame = peer_max
            self.peer_runs = link.welcome.get("runs") == 1
            # drain() waits while more than MAX_BUFFERED is unsent, until a quarter is.
            writer.transport.set_write_buffer_limits(high=self.MAX_BUFFERED)
            self.writer = writer
            self.plane.reached.add((self.host, self.port))
            self._pump()
            log.info("wire link up %s", kv(event="wire_out", peer=where))
            # Nothing is expected back on this direction; reading notices the close.
            while await reader.read(READ_CHUNK):
                pass
        except asyncio.CancelledError:
            raise
        except (OSError, ConnectionError, asyncio.TimeoutError, RDMAError) as e:
            self.failure = e
            log.warning("wire link failed %s", kv(event="wire_out_failed", peer=where,
                                                   reason=str(e) or type(e).__name__))
        finally:
            self.closed = True
            self.backlog.clear()
            self.backlog_bytes = 0


class CMFrame:
    """A CM message queued on a wire link among the packets (server/cm.py)."""

    __slots__ = ("header", "payload")

    def __init__(self, header: dict, payload: bytes) -> None:
        self.header, self.payload = header, payload


def _discarded(stats: dict[str, int]) -> int:
    """Packets a QP dropped on arrival: RC's duplicates and those outside its window,
    the datagrams UC and UD could not take."""
    return (stats["duplicates_discarded"] + stats["out_of_window_discarded"]
            + stats.get("datagrams_dropped", 0))


def _charge(p: Packet | Run) -> int:
    """What a packet or train costs a link's backlog: its framing, and its payload
    unless that is a view of memory held anyway (an MR's, which a READ's responses read
    as they are sent); a payload of its own (a copy made for it: an MKEY's READ
    responses, a WR's gathered message) counts whole."""
    n = p.n if type(p) is Run else 1
    data = p.payload
    owned = not isinstance(data, memoryview) or isinstance(data.obj, (bytes, bytearray))
    return n * PACKET_OVERHEAD + (len(data) if owned else 0)


def host_class(ip: str) -> str:
    """A host as the wire check compares it: 127.0.0.1, ::1 and "localhost" are one
    host ("loopback", where a wildcard or 127.0.0.1 daemon's links come from); any other
    address of 127.0.0.0/8 is a host of its own, as each ``softhca run`` daemon on one
    machine takes an address of its own there and leaves from it (``loopback_source``).
    An IPv4-mapped IPv6 address (a dual-stack listener's view) is its IPv4 address."""
    try:
        addr = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return "loopback" if ip == "localhost" else ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback and (addr.version == 6 or str(addr) == "127.0.0.1"):
        return "loopback"
    return str(addr)


def peer_origins(host: str, port: int) -> frozenset[tuple[str, int]]:
    """The link origins (``link_origin``) the daemon at ``host:port`` may send from: its
    host's class, and for a loopback address "loopback" too (a daemon listening on
    0.0.0.0 or 127.0.0.1 that was dialed at another loopback address, or by a host name
    such as Debian's 127.0.1.1, leaves from 127.0.0.1)."""
    cls = host_class(host)
    try:
        loop = ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        loop = False
    return frozenset({(cls, port), ("loopback", port)} if loop else {(cls, port)})


def loopback_source(daemon: str, host: str) -> str | None:
    """The source address of a wire link from the daemon at ``daemon`` (HOST:PORT) to
    ``host``: the daemon's own when both are IPv4 loopback addresses and the daemon's is
    not 127.0.0.1 (the kernel would pick 127.0.0.1, and the peer would take the link for
    another daemon's: a reply sent there finds nobody); None (the kernel's choice)
    otherwise."""
    own = daemon.rpartition(":")[0]
    try:
        a, b = ipaddress.IPv4Address(own), ipaddress.IPv4Address(host)
    except ValueError:
        return None
    if a.is_loopback and b.is_loopback and own != "127.0.0.1":
        return own
    return None


def self_route(own_host: str, own_port: int, dialed: tuple[str, int] | None, host: str,
               port: int) -> tuple[str, int]:
    """``host:port``, or this daemon's own address (``own_host:own_port``; loopback for
    a wildcard listener) when ``host:port`` is ``dialed``, the address a client used to
    reach this daemon."""
    if dialed is None or port != dialed[1] or host_class(host) != host_class(dialed[0]):
        return host, port
    try:
        wildcard = ipaddress.ip_address(own_host or "0.0.0.0").is_unspecified
    except ValueError:
        wildcard = False
    if wildcard:
        own_host = "::1" if ":" in own_host else "127.0.0.1"
    return own_host, own_port


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
        return True
    except ValueError:
        return False


def link_origin(peer, src: str | None) -> tuple[str, int] | None:
    """Where an incoming wire link comes from: the host its TCP connection comes from
    (which a remote sender cannot choose) and the port its hello says its daemon
    listens on. None for a link that names no daemon: its packets match no QP."""
    if src is None or not peer:
        return None
    return host_class(peer[0]), int(src.rpartition(":")[2])
