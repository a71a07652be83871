"""The daemon: HCAs, control sessions and wire links on one TCP port.

One asyncio task per connection. The first frame on a connection is the daemon's
challenge and the second the peer's hello (``protocol.handshake``); the hello's role
makes the connection a control session (verbs calls from an application:
server/session.py reads them, server/verbs.py answers them) or a wire link (RC packets
from another daemon's QPs: server/wire.py). Wire taps and pushed events are
server/taps.py's.

The engine is sans-I/O; this module is its clock. After anything that may make a QP
want to talk (a post, a packet, a timer), ``service`` asks the QP for its packets and
hands them to the wire plane towards its peer, moves its completions and events to the
sinks its session gave it, and arms one timer at the QP's next deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets

from ..engine.crypto_login import DeviceCrypto
from ..engine.hca import HCA
from ..protocol.enums import QpState
from ..protocol.errors import RDMAError
from ..protocol.frames import REQUEST_LIMITS, FrameDecoder, encode_frame
from ..protocol.handshake import (
    HandshakeError,
    hello_credential,
    hello_src,
    make_challenge,
    verify_hello,
)
from ..protocol.replies import frame
from .cm import ConnectionManager, Timing
from .faults import Faults
from .hosts import Limits, QPHost
from .link import READ_CHUNK, read_frames
from .logs import kv, log
from .return_path import explain_retry_exceeded
from .session import ControlSession, send_error
from .shares import Shares, Watchdog
from .taps import Taps, plain
from .wire import WireLink, WirePlane, host_class, link_origin, self_route

__all__ = ["DEFAULT_PORT", "Daemon", "Limits", "WireLink", "host_class", "kv", "plain"]

DEFAULT_PORT = 4791
# The peer credential of the daemons of this process that were given none: made at
# start, so that daemons in one process (``embedded``) link to each other and no other
# process's daemon, and never a client's token, opens a wire link to them. Daemons in
# other processes share one with ``serve --peer-token-file`` (docs/protocol.md).
PROCESS_PEER_TOKEN = secrets.token_bytes(32)
GENERATED = object()
# Why a control hello is refused on a TCP port that serves wire links only.
NO_TCP_CONTROL = ("this daemon's TCP port takes wire links from peer daemons only, no "
                  "control session: its program reaches it on its UNIX socket, and control "
                  "from another host needs a token (softhca run --token-file FILE)")
QPN_MOD = 1 << 24
# How long a stopping daemon waits for its wire links to take the DREQs of its
# sessions' rdma_cm ids (a link to a peer that is gone must not hold the stop).
CM_FLUSH_S = 1.0
# QPs that go to ERR within this many seconds of each other share one malloc_trim.
TRIM_DELAY_S = 0.1


# How often, and how long each time, Daemon.close cancels a connection task that has not
# ended (end_tasks).
END_ROUNDS, END_WAIT_S = 3, 1.0


async def end_tasks(tasks, rounds: int = END_ROUNDS, wait: float = END_WAIT_S) -> set:
    """Cancel ``tasks`` and wait for them to end; those still running after ``wait``
    seconds are cancelled again, ``rounds`` times at most, and returned (never waited on
    for ever). Why again: asyncio.wait_for before Python 3.12 loses a cancellation that
    comes as its inner future completes, and its task goes on (a connection that had just
    said its HELLO then served a link nobody would close)."""
    pending = set(tasks)
    for _ in range(rounds):
        if not pending:
            break
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait)
    if pending:
        log.warning("stopping %s", kv(event="tasks_not_ended", tasks=len(pending)))
    return pending


class Daemon:
    """``softhca serve``: the HCAs of one node, served on ``host:port``."""

    def __init__(self, hcas: tuple[str, ...] | list[str] = ("mlx5_0",), host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, token: bytes | tuple[bytes, ...] | None = None,
                 max_frame: int | None = None, limits: Limits | None = None,
                 crypto: DeviceCrypto | None = None, strict_blocks: bool = False,
                 peer_token: bytes | None | object = GENERATED, trains: bool = True,
                 rc_window: int | None = None, tcp_control: bool = True) -> None:
        if not hcas:
            raise ValueError("a daemon needs at least one HCA")
        limits = limits or Limits()
        if max_frame is not None:
            limits = dataclasses.replace(limits, max_frame=max_frame)
        self.limits = limits
        # Every HCA of the daemon starts with the same crypto configuration
        # (docs/crypto-import.md): import method, import KEK and credential.
        self.crypto = crypto or DeviceCrypto()
        # ``serve --rc-window``: each HCA's RC window (engine/hca.py), else its default.
        window = {} if rc_window is None else {"rc_window": rc_window}
        self.hcas = {name: HCA(name, self.crypto, strict_blocks=strict_blocks, **window)
                     for name in hcas}
        self.host = host
        self.port = port
        # The client token, or a tuple of them (one per tenant: each its own credential).
        self.token = token
        # Whether the TCP port serves control sessions at all. ``softhca run``'s daemon
        # serves its program on a UNIX socket and, without --token-file, its TCP port
        # serves wire links only: a control session there could tap, fault and drive
        # the program's traffic from any host that reaches the port.
        self.tcp_control = tcp_control
        # Wire links (other daemons) prove the peer token, never the clients' one unless
        # given as it; None: wire links are not authenticated.
        self.peer_token = PROCESS_PEER_TOKEN if peer_token is GENERATED else peer_token
        self.peer_token_generated = peer_token is GENERATED
        self.max_frame = limits.max_frame
        # Packet trains (docs/protocol.md): runs of one WR's packets go as one frame.
        # Off (``serve --no-trains``), every request packet goes as its own frame; READ
        # responses too. Trains that arrive are taken either way.
        self.trains = trains
        self.registered_bytes = 0
        self.connections = 0
        # What each credential holds, and the daemon's memory in use (server/shares.py).
        self.shares = Shares(limits)
        # Connections still in the HELLO, oldest first (a dict keeps insertion order).
        self._pre_hello: dict[asyncio.StreamWriter, None] = {}
        self.qps: dict[tuple[str, int], QPHost] = {}
        self.sessions: set[ControlSession] = set()
        self.counters: dict[str, int] = {
            "packets_sent": 0, "packets_received": 0, "packets_bad_icrc": 0,
            "packets_unknown_qp": 0, "packets_over_mtu": 0, "wire_protocol_errors": 0,
            "control_sessions": 0, "wire_connections": 0, "connections_refused": 0,
            "packets_dropped_link_full": 0, "packets_wrong_peer": 0, "pre_hello_evicted": 0,
            "wire_bytes_discarded": 0, "wire_throttle_ms": 0}
        self.faults = Faults()
        # Wire taps and pushed events; ``taps``: callables (direction "tx" | "rx", dev,
        # Packet) seeing every packet this daemon sends or accepts (the demo's wire
        # images, captures).
        self.events = Taps(self.qps, lambda: self.address, self.counters)
        self.taps = self.events.taps
        self.wire = WirePlane(counters=self.counters, qps=self.qps, faults=self.faults,
                              taps=self.events, service=self.service, trains=trains,
                              peer_token=self.peer_token, max_frame=self.max_frame,
                              address=lambda: self.address, loop=lambda: self.loop)
        self.links = self.wire.links
        # rdma_cm's connection manager (server/cm.py): its messages come on wire links.
        self.cm = ConnectionManager(self, Timing(timewait=limits.cm_timewait))
        self.wire.on_cm = self.cm.receive
        # RC statistics of QPs already destroyed, so daemon totals never go backwards.
        self._gone_qp_stats: dict[str, int] = {}
        self._trim_timer: asyncio.TimerHandle | None = None
        self._server: asyncio.AbstractServer | None = None
        self._conn_tasks: set[asyncio.Task] = set()
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the daemon runs in, asked of asyncio once (on Python 3.11 each
        ``get_running_loop`` is a getpid(2), several times per packet before)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._loop = asyncio.get_running_loop()
        return loop

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
        # As the kernel's CM does for the ids of a process that dies: every connected
        # rdma_cm id is disconnected (a DREQ to its peer), and the DREQs are handed to
        # the kernel before the links close, so a peer hears of it now, not when its
        # keep-alive or an RC retry fails. A session that ended already did the same.
        for session in list(self.sessions):
            self.cm.session_gone(session)
        await self.wire.flush(CM_FLUSH_S)
        for session in list(self.sessions):
            session.verbs.flush_all()
        # A poll_cq waiting when the signal came is owed the flushed completions: let
        # those replies go out before the connections close.
        waits = [t for s in self.sessions for t in s.verbs.waits]
        if waits:
            await asyncio.wait(waits, timeout=1.0)
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.writer.drain(), 1.0)
        self.wire.close()
        await end_tasks(self._conn_tasks)
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
        self.track_connection()
        await self._connection(reader, writer)

    def track_connection(self) -> None:
        """The current task serves a connection (of any listener): close cancels it."""
        task = asyncio.current_task()
        if task is not None:
            self._conn_tasks.add(task)
            task.add_done_callback(self._conn_tasks.discard)

    def pre_hello(self, writer: asyncio.StreamWriter,
                  pool: dict[asyncio.StreamWriter, None] | None = None) -> None:
        """A connection that has not said HELLO yet: one of at most ``max_pre_hello`` in
        ``pool`` (the TCP port's, else a listener's own: a flood on the network port
        does not evict local programs). Sockets that never say hello must not lock
        everyone out: when the pool is full the oldest of them makes room (it has had
        the longest to speak), so the listener keeps accepting and holds a bounded
        number of descriptors for them."""
        pool = self._pre_hello if pool is None else pool
        if len(pool) >= self.limits.max_pre_hello:
            oldest = next(iter(pool))
            del pool[oldest]
            self.counters["pre_hello_evicted"] += 1
            with contextlib.suppress(Exception):
                oldest.transport.abort()
        pool[writer] = None

    def hello_done(self, writer: asyncio.StreamWriter,
                   pool: dict[asyncio.StreamWriter, None] | None = None) -> None:
        """The connection said its HELLO, or ended: it leaves its pre-HELLO pool."""
        (self._pre_hello if pool is None else pool).pop(writer, None)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        peer_s = f"{peer[0]}:{peer[1]}" if peer else "?"
        # Requests and packets are unpacked under the structural limits: a header that
        # breaks one is refused after bounded work (protocol/frames.py REQUEST_LIMITS).
        decoder = FrameDecoder(self.max_frame, REQUEST_LIMITS)
        limits = self.limits
        self.pre_hello(writer)
        authenticated = ""
        try:
            # ``auth`` tells a client whether its hello needs the token; a wire hello
            # proves the peer credential whatever it says.
            # A port that serves no control session asks for a token as well: no
            # control hello gets anywhere without one.
            challenge, nonce = make_challenge(self.token is not None or not self.tcp_control)
            writer.writelines(encode_frame(challenge))
            frames = await asyncio.wait_for(read_frames(reader, decoder), limits.hello_timeout)
            if not frames:
                return
            hello = frames[0].header
            role = verify_hello(hello, nonce, self.token, self.peer_token)
            if role == "control" and not self.tcp_control:
                raise HandshakeError("EACCES", NO_TCP_CONTROL)
            self.hello_done(writer)
            credential = self._credential(role, hello, nonce)
            if self.connections >= limits.max_connections:
                raise RDMAError("EBUSY", f"this daemon serves at most "
                                         f"{limits.max_connections} connections")
            self.shares.admit(credential)
            self.connections += 1
            authenticated = credential
            # A wire link's welcome: this daemon takes runs frames (protocol/runs.py).
            more = {"runs": 1} if role == "wire" else {}
            writer.writelines(encode_frame(frame("welcome", role=role,
                                                 devices=list(self.hcas),
                                                 max_frame=self.max_frame, **more)))
            await self._serve_connection(role, credential, reader, writer, decoder,
                                         frames[1:], peer, peer_s, hello)
        except RDMAError as e:
            # The HELLO refused (HandshakeError), a frame broken before it, a limit.
            if e.errno_name == "EBUSY":
                self.counters["connections_refused"] += 1
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
            self.hello_done(writer)
            if authenticated:
                self.connections -= 1
                self.shares.leave(authenticated)
            with contextlib.suppress(Exception):
                writer.close()

    def _credential(self, role: str, hello: dict, nonce: bytes) -> str:
        """The credential a verified hello proved: "peer HOST:PORT" (a wire link, by the
        daemon it names: each peer daemon its own share), "client" on a daemon with one
        client token or none, "client#N" for the Nth of several."""
        if role != "control":
            return f"peer {hello_src(hello)}"
        if isinstance(self.token, tuple) and len(self.token) > 1:
            return f"client#{hello_credential(hello, nonce, self.token, role)}"
        return "client"

    async def _serve_connection(self, role: str, credential: str, reader, writer,
                                decoder: FrameDecoder, rest: list, peer, peer_s: str,
                                hello: dict) -> None:
        """An authenticated connection, watched (server/shares.py Watchdog) until it ends."""
        def close(e: RDMAError) -> None:
            send_error(writer, 0, e)
            writer.transport.abort()

        if role == "control":
            session = ControlSession(self, reader, writer, decoder, peer_s, credential)
            src = hello_src(hello)
            if src is not None:
                host, _, port = src.rpartition(":")
                session.dialed = (host.strip("[]"), int(port))
            watch = Watchdog(decoder, self.limits, close, session.idle, peer_s)
            try:
                await session.run(rest)
            finally:
                watch.stop()
        else:
            watch = Watchdog(decoder, self.limits, close, None, peer_s)
            try:
                origin = link_origin(peer, hello_src(hello))
                await self.wire.wire_in(reader, writer, decoder, rest, peer_s, origin)
            finally:
                watch.stop()

    def stats(self) -> dict[str, int]:
        """The daemon's counters and the RC statistics summed over its QPs, past and present."""
        total = dict(self.counters)
        for k, v in self._gone_qp_stats.items():
            total[k] = total.get(k, 0) + v
        for qph in self.qps.values():
            for k, v in qph.rcqp.stats.items():
                total[k] = total.get(k, 0) + v
        for name in ("retransmissions", "retransmitted_packets", "ack_timeouts", "rnr_retries",
                     "duplicates_discarded", "psn_seq_naks_sent", "duplicate_reads_answered",
                     "duplicate_reads_dropped", "duplicate_runs_discarded",
                     "out_of_window_discarded", "psn_seq_naks_ignored"):
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
        """A session closed: its QPs' packets and the links nobody sends on go
        (``WirePlane.release``), and the memory they held goes back to the system."""
        self.wire.release(qps, self.cm.peers())
        _return_free_memory()

    def add_qp(self, qph: QPHost) -> None:
        """A session created QP ``qph``: packets for its number reach it now, and its
        trace goes to the subscribers if any listen."""
        self.qps[(qph.hca.name, qph.rcqp.qp_num)] = qph
        qph.rcqp.trace = self.events.trace_hook(qph)

    def route(self, host: str, port: int, dialed: tuple[str, int] | None) -> tuple[str, int]:
        """Where a QP of a session that reached this daemon at ``dialed`` sends to reach
        the daemon at ``host:port``: this daemon's own address when that is ``dialed``,
        which may be a forwarded or published port this daemon cannot connect to itself
        (`docker run -p 127.0.0.1:14796:4791`); else ``host:port``."""
        return self_route(self.host, self.port, dialed, host, port)

    def connect(self, qph: QPHost, host: str, port: int) -> None:
        """QP ``qph``'s address vector names the daemon at ``host:port``."""
        self.wire.connect(qph, host, port)

    def forget_qp(self, qph: QPHost) -> None:
        for k, v in qph.rcqp.stats.items():
            self._gone_qp_stats[k] = self._gone_qp_stats.get(k, 0) + v
        self.qps.pop((qph.hca.name, qph.rcqp.qp_num), None)

    # -- the QPs' clock --------------------------------------------------------------------
    def service(self, qph: QPHost) -> None:
        """Let the QP transmit, move its completions and events, arm its next timer."""
        if qph.session.gone:
            return
        loop = self.loop
        pkts = qph.rcqp.poll_wire(loop.time(), self.wire.trains)
        if pkts:
            self.wire.transmit(qph, pkts)
        self._deliver(qph)
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

    def _deliver(self, qph: QPHost) -> None:
        """The QP's completions and asynchronous events, to the sinks its session gave.
        A ring QP's consumer indices first (server/wq_ring.py): a program that sees a
        completion sees its WQE's slot free, as rxe frees a WQE before it posts the CQE."""
        if qph.wq is not None:
            qph.wq.publish(qph.rcqp)
        scq = qph.rcqp.poll_send_cq()
        if scq:
            scq = explain_retry_exceeded(self.wire, self.events, qph, scq, self.address)
            qph.completions(qph.scq, scq)
        rcq = qph.rcqp.poll_recv_cq()
        if rcq:
            qph.completions(qph.rcq, rcq)
        if qph.rcqp.events:
            for ev in qph.rcqp.take_events():
                qph.events(qph, ev)

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

    def new_qpn(self) -> int:
        """A 24-bit QP number in use on none of this daemon's HCAs; never QP0 or QP1,
        which IBA reserves for management. Drawn at random from the whole space: a QPN
        counted from the last one would let a co-tenant name its neighbour's QP from
        its own (docs/protocol.md, trust model)."""
        while True:
            qpn = secrets.randbelow(QPN_MOD - 2) + 2
            if not any((dev, qpn) in self.qps for dev in self.hcas):
                return qpn


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
