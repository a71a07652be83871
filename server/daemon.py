"""The daemon: HCAs, control sessions and wire links on one TCP port.

One asyncio task per connection. The first frame on a connection is the daemon's
challenge and the second the peer's hello (``protocol.handshake``); the hello's role
makes the connection a control session (verbs calls from an application) or a wire
link (RC packets from another daemon's QPs).

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
import itertools
import logging
from collections import deque
from typing import Any

from ..engine import qp_state
from ..engine.crypto_login import DEK_INIT_ATTR_CRYPTO_LOGIN, CryptoLogin, DeviceCrypto, login
from ..engine.hca import DEK, HCA, MR, PD
from ..engine.mkey import MKey
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..engine.rc import RCQP, WC, RecvWR, SendWR
from ..protocol import control
from ..protocol.attrs import DEKInitAttr, MkeyConfAttr
from ..protocol.enums import (
    CryptoLoginState,
    Mlx5dvQpCreateFlags,
    QpAttrMask,
    QpState,
    QpType,
    WcOpcode,
    WrOpcode,
)
from ..protocol.errors import RDMAError, einval
from ..protocol.frames import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, encode_frame
from ..protocol.handshake import HandshakeError, make_challenge, make_hello, verify_hello
from ..protocol.opcodes import Op, with_flags
from ..protocol.packets import IntegrityError, Packet, decode_packet, packet_check, packet_header
from .async_events import AsyncEvents, wait_woken, wake
from .faults import REORDER_FLUSH_S, Emit, Faults

# The packets that begin a SEND: the ones that would take a receive.
_SEND_FIRSTS = with_flags(Op.SEND | Op.FIRST)

log = logging.getLogger("softhca.server")

# mlx5dv_create_qp(3) create_flags modelled: signature pipelining, and disabling
# scatter to CQE (softhca never scatters into a CQE, so there is nothing to disable).
QP_CREATE_FLAGS = int(Mlx5dvQpCreateFlags.SIG_PIPELINING
                      | Mlx5dvQpCreateFlags.DISABLE_SCATTER_TO_CQE)

# mlx5dv.h enum mlx5dv_context_comp_mask: crypto_caps is filled.
MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD = 1 << 13

DEFAULT_PORT = 4791
HANDSHAKE_TIMEOUT = 10.0
READ_CHUNK = 1 << 18

def kv(**fields: Any) -> str:
    """A structured log line's fields: ``key=value`` pairs, values repr'd when needed."""
    return " ".join(f"{k}={v}" if isinstance(v, (int, float)) or (isinstance(v, str)
                    and v and " " not in v and "=" not in v) else f"{k}={v!r}"
                    for k, v in fields.items())


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one daemon accepts; each limit hit is a clear error, never a crash."""

    max_connections: int = 1024             # control sessions and wire links together
    max_objects: int = 1 << 16              # verbs objects per control session
    max_session_bytes: int = 4 << 30        # registered MR bytes per session (ENOMEM)
    max_daemon_bytes: int = 16 << 30        # registered MR bytes in the daemon (ENOMEM)
    max_frame: int = DEFAULT_MAX_FRAME      # bytes in one frame (EMSGSIZE, then close)
    max_msg_size: int = 1 << 31             # bytes in one message (ibv_port_attr max_msg_sz)
    max_qp_wr: int = 1 << 14                # max_send_wr / max_recv_wr of a QP (EINVAL)
    # A session's unsent replies beyond this stop its requests being read until the
    # client reads: a client that floods and never reads cannot grow the daemon.
    reply_high_water: int = 8 << 20


# -- server-side objects -------------------------------------------------------------

class CQHost:
    """A completion queue: completions in, polls out; a poll may wait for the first."""

    def __init__(self, handle: int, cqe: int) -> None:
        self.handle = handle
        self.cqe = cqe
        self.entries: deque[WC] = deque()
        self._waiters: list[asyncio.Future] = []
        self.overruns = 0

    def push(self, wcs: list[WC]) -> None:
        self.entries.extend(wcs)
        # ibv_create_cq(3): an overrun CQ is an error on the device; nothing is
        # dropped here (tests must still see every completion), but it is counted.
        if len(self.entries) > self.cqe:
            self.overruns += 1
        wake(self._waiters)

    def take(self, num: int) -> list[WC]:
        return [self.entries.popleft() for _ in range(min(num, len(self.entries)))]

    async def wait(self, timeout: float) -> None:
        if self.entries or timeout <= 0:
            return
        await wait_woken(self._waiters, timeout)


@dataclasses.dataclass(eq=False)
class QPHost:
    session: ControlSession
    handle: int
    hca: HCA
    pd: PD
    rcqp: RCQP
    scq: CQHost
    rcq: CQHost
    max_send_sge: int
    max_recv_sge: int
    send_ops_flags: int
    builder: MkeyConfigureBuilder
    dest: tuple[str, int, str] | None = None
    timer: asyncio.TimerHandle | None = None
    timer_at: float | None = None
    attrs: dict = dataclasses.field(default_factory=dict)
    # The session's handle of the context the QP was created on: its async events go there.
    ctx: int = 0


# The verbs that create an object (and so count against a session's object limit).
_CREATORS = frozenset(["open_device", "alloc_pd", "reg_mr", "create_cq", "create_qp",
                       "create_mkey", "create_dek", "crypto_login", "create_crypto_login"])


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


def wc_to_wire(wc: WC) -> list:
    """[wr_id, status, opcode, byte_len, imm_data, qp_num, wc_flags, vendor_err, inv_rkey]"""
    return [wc.wr_id, int(wc.status), int(wc.opcode), wc.byte_len, wc.imm_data, wc.qp_num,
            int(wc.wc_flags), wc.vendor_err, wc.invalidated_rkey]


# -- the daemon --------------------------------------------------------------------------

class Daemon:
    """``softhca serve``: the HCAs of one node, served on ``host:port``."""

    def __init__(self, hcas: tuple[str, ...] | list[str] = ("mlx5_0",), host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, token: bytes | None = None,
                 max_frame: int | None = None, limits: Limits | None = None,
                 crypto: DeviceCrypto | None = None) -> None:
        if not hcas:
            raise ValueError("a daemon needs at least one HCA")
        limits = limits or Limits()
        if max_frame is not None:
            limits = dataclasses.replace(limits, max_frame=max_frame)
        self.limits = limits
        # Every HCA of the daemon starts with the same crypto configuration
        # (docs/crypto-import.md): import method, import KEK and credential.
        self.crypto = crypto or DeviceCrypto()
        self.hcas = {name: HCA(name, self.crypto) for name in hcas}
        self.host = host
        self.port = port
        self.token = token
        self.max_frame = limits.max_frame
        self.registered_bytes = 0
        self.connections = 0
        self.qps: dict[tuple[str, int], QPHost] = {}
        self.links: dict[tuple[str, int], WireLink] = {}
        self.sessions: set[ControlSession] = set()
        self.counters: dict[str, int] = {
            "packets_sent": 0, "packets_received": 0, "packets_bad_icrc": 0,
            "packets_unknown_qp": 0, "packets_over_mtu": 0, "wire_protocol_errors": 0,
            "control_sessions": 0, "wire_connections": 0, "connections_refused": 0}
        # Wire taps: callables (direction "tx" | "rx", dev, Packet) seeing every packet
        # this daemon sends or accepts (the demo's wire images, captures, traces).
        # Empty, they cost one truth test per batch.
        self.taps: list = []
        self.faults = Faults()
        # Sessions that asked for pushed events: session -> {"packets", "trace"}.
        self.subscribers: dict[ControlSession, set[str]] = {}
        # RC statistics of QPs already destroyed, so daemon totals never go backwards.
        self._gone_qp_stats: dict[str, int] = {}
        self._reorder_timer: asyncio.TimerHandle | None = None
        self._qpn = itertools.count(0x11)
        self._server: asyncio.AbstractServer | None = None
        self._conn_tasks: set[asyncio.Task] = set()
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
        for session in list(self.sessions):
            session.flush_all()
        # A poll_cq waiting when the signal came is owed the flushed completions: let
        # those replies go out before the connections close.
        waits = [t for s in self.sessions for t in s._waits]
        if waits:
            await asyncio.wait(waits, timeout=1.0)
        for session in list(self.sessions):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.writer.drain(), 1.0)
        for link in list(self.links.values()):
            link.close()
        for task in list(self._conn_tasks):
            task.cancel()
        if self._conn_tasks:
            await asyncio.gather(*self._conn_tasks, return_exceptions=True)
        for session in list(self.sessions):
            session.destroy_all()
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
        if self.connections >= self.limits.max_connections:
            self.counters["connections_refused"] += 1
            log.warning("refused %s", kv(event="refused", peer=peer_s, errno="EBUSY",
                                          reason="connection limit"))
            _send_error(writer, 0, RDMAError("EBUSY", f"this daemon serves at most "
                                                      f"{self.limits.max_connections} "
                                                      "connections"))
            writer.close()
            return
        self.connections += 1
        try:
            challenge, nonce = make_challenge(self.token is not None)
            writer.writelines(encode_frame(challenge))
            frames = await asyncio.wait_for(_read_frames(reader, decoder), HANDSHAKE_TIMEOUT)
            if not frames:
                return
            role = verify_hello(frames[0].header, nonce, self.token)
            writer.writelines(encode_frame({"t": "welcome", "role": role,
                                            "devices": list(self.hcas),
                                            "max_frame": self.max_frame}))
            rest = frames[1:]
            if role == "control":
                session = ControlSession(self, reader, writer, decoder, peer_s)
                await session.run(rest)
            else:
                await self._wire_in(reader, writer, decoder, rest, peer_s)
        except (HandshakeError, FrameError) as e:
            log.warning("refused %s", kv(event="refused", peer=peer_s, errno=e.errno_name,
                                          reason=e.message))
            _send_error(writer, 0, e)
        except asyncio.TimeoutError:
            log.warning("refused %s", kv(event="refused", peer=peer_s, errno="ETIMEDOUT",
                                          reason="no hello within the handshake timeout"))
            _send_error(writer, 0, RDMAError("ETIMEDOUT", "no hello within "
                                                          f"{HANDSHAKE_TIMEOUT:g} s"))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # Daemon.close cancels connection tasks; ending normally keeps asyncio's
            # stream callback from reporting the cancellation as an error.
            pass
        finally:
            self.connections -= 1
            with contextlib.suppress(Exception):
                writer.close()

    # -- wire plane: inbound --------------------------------------------------------------
    async def _wire_in(self, reader, writer, decoder: FrameDecoder, first: list,
                       peer: str) -> None:
        self.counters["wire_connections"] += 1
        log.info("wire link up %s", kv(event="wire_in", peer=peer))
        frames = first
        try:
            while True:
                touched: dict[int, QPHost] = {}
                now = asyncio.get_running_loop().time()
                for fr in frames:
                    if fr.kind != "pkt":
                        raise FrameError("EPROTO", f"unexpected {fr.kind!r} frame on a wire "
                                                   "link (only 'pkt' is allowed)")
                    try:
                        dev, pkt = decode_packet(fr.header, fr.payload)
                    except IntegrityError:
                        # A link error: dropped and counted; the requester's retransmission
                        # recovers it (docs/architecture.md, wire plane).
                        self.counters["packets_bad_icrc"] += 1
                        continue
                    self.counters["packets_received"] += 1
                    if self.taps:
                        for tap in self.taps:
                            tap("rx", dev, pkt)
                    qph = self.qps.get((dev, pkt.dest_qp))
                    if qph is None:
                        self.counters["packets_unknown_qp"] += 1
                        continue
                    if len(pkt.payload) > qph.rcqp.mtu:
                        # IBTA 9.6.3: a packet longer than the path MTU is silently dropped.
                        self.counters["packets_over_mtu"] += 1
                        continue
                    if self.faults.rules:
                        for e in self.faults.apply("in", qph.rcqp.qp_num, qph.rcqp.mtu, [pkt],
                                                   on_rnr=self._refuse_rnr(qph), route=qph):
                            self._emit_in(e, now, touched)
                        self._arm_reorder_flush()
                    else:
                        qph.rcqp.receive(pkt, now)
                        touched[id(qph)] = qph
                for qph in touched.values():
                    self.service(qph)
                frames = await _read_frames(reader, decoder)
                if not frames:
                    return
        except FrameError as e:
            self.counters["wire_protocol_errors"] += 1
            log.warning("wire peer disconnected %s", kv(event="wire_protocol_error", peer=peer,
                                                        errno=e.errno_name, reason=e.message))
            _send_error(writer, 0, e)

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
        qph.rcqp.receive(e.packet, now)
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
        host, port, dev = e.route
        override = packet_check(dev, e.stale_icrc_of) if e.stale_icrc_of is not None else None
        self.link_to(host, port).send(dev, [e.packet], override)
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
    def subscribe(self, session: ControlSession, kinds: set[str]) -> None:
        if kinds:
            self.subscribers[session] = kinds
        else:
            self.subscribers.pop(session, None)
        self._rewire_events()

    def _wants(self, kind: str) -> list[ControlSession]:
        return [s for s, k in self.subscribers.items() if kind in k and not s.gone]

    def _rewire_events(self) -> None:
        """Install the packet tap and the QPs' trace hooks only while someone listens,
        so that without subscribers neither costs anything."""
        if self._wants("packets"):
            if self._packet_event not in self.taps:
                self.taps.append(self._packet_event)
        elif self._packet_event in self.taps:
            self.taps.remove(self._packet_event)
        hook = self._trace_event if self._wants("trace") else None
        for qph in self.qps.values():
            qph.rcqp.trace = hook if hook is None else self._trace_hook(qph)

    def _trace_hook(self, qph: QPHost):
        dev = qph.hca.name
        return lambda ctx, ev: self._trace_event(dev, ctx, ev)

    def _packet_event(self, direction: str, dev: str, p: Packet) -> None:
        header = {"t": "event", "kind": "packet", "dir": direction, "dev": dev,
                  "time": asyncio.get_running_loop().time(), "daemon": self.address,
                  "pkt": packet_header(dev, p)}
        for s in self._wants("packets"):
            s.push(header, p.payload)

    def _trace_event(self, dev: str, ctx: dict, ev) -> None:
        header = {"t": "event", "kind": "trace", "dev": dev, "daemon": self.address,
                  "time": asyncio.get_running_loop().time(), **plain(ctx),
                  "direction": ev.direction, "stage": ev.stage, "key": ev.key,
                  "stream": ev.stream, "offset": ev.offset, "detail": plain(ev.detail)}
        for s in self._wants("trace"):
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
        return total

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
        pkts = qph.rcqp.poll_packets(loop.time())
        if pkts and qph.dest is not None:
            host, port, dev = qph.dest
            if self.taps:
                for p in pkts:
                    for tap in self.taps:
                        tap("tx", dev, p)
            if self.faults.rules:
                for e in self.faults.apply("out", qph.rcqp.qp_num, qph.rcqp.mtu, pkts,
                                           route=qph.dest):
                    self._emit_out(e)
                self._arm_reorder_flush()
            else:
                self.link_to(host, port).send(dev, pkts)
                self.counters["packets_sent"] += len(pkts)
        scq = qph.rcqp.poll_send_cq()
        if scq:
            qph.scq.push(scq)
        rcq = qph.rcqp.poll_recv_cq()
        if rcq:
            qph.rcq.push(rcq)
        if qph.rcqp.events:
            for ev in qph.rcqp.take_events():
                qph.session.async_events.push(qph.ctx, ev, qp=qph.handle,
                                              qp_num=qph.rcqp.qp_num)
        deadline = qph.rcqp.next_deadline()
        if deadline != qph.timer_at:
            if qph.timer is not None:
                qph.timer.cancel()
            qph.timer = None if deadline is None else loop.call_at(deadline, self._fire, qph)
            qph.timer_at = deadline

    def _fire(self, qph: QPHost) -> None:
        qph.timer = qph.timer_at = None
        self.service(qph)

    def new_qpn(self) -> int:
        return next(self._qpn) & 0xFFFFFF


async def _read_frames(reader: asyncio.StreamReader, decoder: FrameDecoder) -> list:
    """The next whole frames; [] at end of stream."""
    while True:
        data = await reader.read(READ_CHUNK)
        if not data:
            return []
        frames = decoder.feed(data)
        if frames:
            return frames


def _send_error(writer: asyncio.StreamWriter, rid: int, e: RDMAError) -> None:
    with contextlib.suppress(Exception):
        writer.writelines(encode_frame({"t": "err", "id": rid, "errno": e.errno_name,
                                        "msg": e.message}))


class WireLink:
    """An outgoing wire connection to another daemon; packets queue until it is up."""

    MAX_QUEUED = 1 << 16

    def __init__(self, daemon: Daemon, host: str, port: int) -> None:
        self.daemon = daemon
        self.host, self.port = host, port
        self.writer: asyncio.StreamWriter | None = None
        self.queued: list[tuple[str, Packet, int | None]] = []
        self.closed = False
        self.task = asyncio.get_running_loop().create_task(self._run())

    def send(self, dev: str, pkts: list[Packet], icrc_value: int | None = None) -> None:
        """Frame and write ``pkts``; ``icrc_value`` (one packet) overrides its check."""
        if self.closed:
            return      # lost on the wire; RC retransmission or its retry limit follows
        if self.writer is None:
            room = self.MAX_QUEUED - len(self.queued)
            self.queued.extend((dev, p, icrc_value) for p in pkts[:max(room, 0)])
            return
        bufs = []
        for p in pkts:
            bufs.extend(encode_frame(packet_header(dev, p, icrc_value=icrc_value), p.payload))
        self.writer.writelines(bufs)

    def close(self) -> None:
        self.closed = True
        self.task.cancel()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()

    async def _run(self) -> None:
        where = f"{self.host}:{self.port}"
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=READ_CHUNK),
                HANDSHAKE_TIMEOUT)
            decoder = FrameDecoder(self.daemon.max_frame)
            frames = await asyncio.wait_for(_read_frames(reader, decoder), HANDSHAKE_TIMEOUT)
            if not frames:
                raise ConnectionError("closed during the handshake")
            writer.writelines(encode_frame(make_hello(frames[0].header, "wire",
                                                      self.daemon.token)))
            frames = frames[1:] or await asyncio.wait_for(_read_frames(reader, decoder),
                                                          HANDSHAKE_TIMEOUT)
            if not frames or frames[0].kind != "welcome":
                reason = frames[0].header.get("msg") if frames else "closed"
                raise ConnectionError(f"peer refused the wire link: {reason}")
            self.writer = writer
            queued, self.queued = self.queued, []
            for dev, p, icrc_value in queued:
                self.send(dev, [p], icrc_value)
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
            self.queued = []


# -- control sessions -------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class _LoginEntry:
    """A crypto login of one context: its session (mlx5dv_crypto_login, ``api``
    "session") or its object (mlx5dv_crypto_login_create, "object")."""

    ctx: int
    api: str
    login: CryptoLogin


class ControlSession:
    """One application's connection: its verbs calls, the objects they created."""

    def __init__(self, daemon: Daemon, reader, writer, decoder: FrameDecoder, peer: str) -> None:
        self.daemon = daemon
        self.reader, self.writer, self.decoder = reader, writer, decoder
        self.peer = peer
        self.objects: dict[int, tuple[str, Any]] = {}
        self._handles = itertools.count(1)
        self._waits: set[asyncio.Task] = set()
        self.gone = False
        self.registered_bytes = 0
        self.events_dropped = 0
        # ibv_get_async_event(3): per context; a PD's context names a QP's.
        self.async_events = AsyncEvents()
        self.ctx_of_pd: dict[int, int] = {}

    async def run(self, first: list) -> None:
        d = self.daemon
        d.sessions.add(self)
        d.counters["control_sessions"] += 1
        log.info("session open %s", kv(event="session_open", peer=self.peer))
        frames = first
        try:
            high = d.limits.reply_high_water
            while True:
                for fr in frames:
                    self._handle(fr)
                if self.writer.transport.get_write_buffer_size() > high:
                    await self.writer.drain()
                frames = await _read_frames(self.reader, self.decoder)
                if not frames:
                    return
        except FrameError as e:
            # Framing is lost: say why, then close (docs/protocol.md).
            log.warning("session broke framing %s", kv(event="frame_error", peer=self.peer,
                                                        errno=e.errno_name, reason=e.message))
            _send_error(self.writer, 0, e)
        finally:
            self.destroy_all()
            d.sessions.discard(self)
            log.info("session closed %s", kv(event="session_close", peer=self.peer))

    def push(self, header: dict, payload: bytes = b"") -> None:
        """An event to this subscriber. A subscriber that does not keep up loses events
        (counted), never slows the wire: the daemon does not wait for it."""
        if self.writer.transport.get_write_buffer_size() > self.daemon.limits.reply_high_water:
            self.events_dropped += 1
            return
        self.writer.writelines(encode_frame(header, payload))

    def reply(self, rid: int, payload: bytes | memoryview = b"", **result: Any) -> None:
        self.writer.writelines(encode_frame({"t": "ok", "id": rid, **result}, payload))

    def _handle(self, fr) -> None:
        rid = fr.header.get("id") if isinstance(fr.header.get("id"), int) else 0
        try:
            verb, rid, args = control.check_request(fr.header)
            # Checked before the engine allocates anything, so a refusal leaks nothing.
            if verb in _CREATORS and len(self.objects) >= self.daemon.limits.max_objects:
                raise RDMAError("ENOMEM", f"{verb}: this session holds {len(self.objects)} "
                                          "objects, the daemon's limit per session")
            handler = getattr(self, f"op_{verb}")
            result = handler(args, fr.payload, rid)
            if result is not None:
                payload = result.pop("_payload", b"")
                self.reply(rid, payload, **result)
        except RDMAError as e:
            _send_error(self.writer, rid, e)
        except Exception as e:      # a bug must cost one request, never the daemon
            log.exception("request failed %s", kv(event="internal_error", peer=self.peer))
            _send_error(self.writer, rid, RDMAError("EPROTO", f"internal error: {e!r}"[:200]))

    # -- object table -------------------------------------------------------------------
    def add(self, kind: str, obj: Any) -> int:
        handle = next(self._handles)
        self.objects[handle] = (kind, obj)
        return handle

    def get(self, handle: int, kind: str) -> Any:
        entry = self.objects.get(handle)
        if entry is None or entry[0] != kind:
            raise RDMAError("ENOENT", f"handle {handle} is not a {kind} of this session")
        return entry[1]

    def flush_all(self) -> None:
        """SIGTERM: every QP of the session to ERR, its WRs flushed to the CQs."""
        for kind, obj in list(self.objects.values()):
            if kind == "qp":
                obj.rcqp.modify_to_err()
                self.daemon.service(obj)

    def destroy_all(self) -> None:
        """The session ended: its objects go, as when a process exits (docs/architecture.md)."""
        if self.gone:
            return
        self.gone = True
        if self in self.daemon.subscribers:
            self.daemon.subscribe(self, set())
        for t in self._waits:
            t.cancel()
        counts: dict[str, int] = {}
        for kind, obj in list(self.objects.values()):
            counts[kind] = counts.get(kind, 0) + 1
            self._destroy(kind, obj)
        self.objects.clear()
        if counts:
            log.info("session objects destroyed %s", kv(event="session_cleanup", peer=self.peer,
                                                        **counts))

    def _destroy(self, kind: str, obj: Any) -> None:
        d = self.daemon
        if kind == "qp":
            obj.rcqp.modify_to_err()
            if obj.timer is not None:
                obj.timer.cancel()
            d.forget_qp(obj)
        elif kind == "mr":
            obj.pd.hca.dereg_mr(obj)
            self.registered_bytes -= obj.length
            self.daemon.registered_bytes -= obj.length
        elif kind == "mkey":
            obj.pd.hca.destroy_mkey(obj)
        elif kind == "dek":
            obj.pd.hca.destroy_dek(obj)
        elif kind == "pd":
            obj.hca.pds.pop(obj.handle, None)

    def _destroy_handle(self, handle: int, kind: str) -> dict:
        obj = self.get(handle, kind)
        self._destroy(kind, obj)
        del self.objects[handle]
        return {}

    # -- verbs: device and memory -------------------------------------------------------
    def op_devices(self, a, payload, rid):
        return {"devices": list(self.daemon.hcas)}

    def op_open_device(self, a, payload, rid):
        hca = self.daemon.hcas.get(a["name"])
        if hca is None:
            raise RDMAError("ENOENT", f"no device {a['name']!r} on this daemon (it has "
                                      f"{', '.join(self.daemon.hcas)})")
        return {"ctx": self.add("ctx", hca), "name": hca.name}

    def op_query_device(self, a, payload, rid):
        hca = self.get(a["ctx"], "ctx")
        lim = self.daemon.limits
        return {"attr": {"fw_ver": "softhca-1", "vendor_id": 0x02C9, "vendor_part_id": 4123,
                         "max_qp": 1 << 16, "max_qp_wr": lim.max_qp_wr,
                         "max_msg_sz": lim.max_msg_size, "max_sge": control.MAX_SGE,
                         "max_cqe": 1 << 22, "max_mr_size": 1 << 40, "max_pd": 1 << 16,
                         "max_qp_rd_atom": 16, "phys_port_cnt": 1, "node_guid": hash(hca.name)
                         & 0xFFFFFFFFFFFF}}

    def op_close_device(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        # The context's crypto logins end with it, as libmlx5's do with the context.
        for handle, (kind, o) in list(self.objects.items()):
            if kind == "crypto_login" and o.ctx == a["ctx"]:
                self._destroy_handle(handle, "crypto_login")
        return self._destroy_handle(a["ctx"], "ctx")

    def op_alloc_pd(self, a, payload, rid):
        hca = self.get(a["ctx"], "ctx")
        pd = hca.alloc_pd()
        handle = self.add("pd", pd)
        self.ctx_of_pd[handle] = a["ctx"]
        return {"pd": handle}

    def op_dealloc_pd(self, a, payload, rid):
        pd = self.get(a["pd"], "pd")
        for kind, o in self.objects.values():
            if kind in ("mr", "mkey", "qp", "dek") and o.pd is pd:
                raise RDMAError("EBUSY", f"ibv_dealloc_pd: PD {a['pd']} still has a {kind}")
        return self._destroy_handle(a["pd"], "pd")

    def op_reg_mr(self, a, payload, rid):
        pd = self.get(a["pd"], "pd")
        lim, n = self.daemon.limits, a["length"]
        if self.registered_bytes + n > lim.max_session_bytes:
            raise RDMAError("ENOMEM", f"ibv_reg_mr of {n} bytes: this session has "
                                      f"{self.registered_bytes} registered, its limit is "
                                      f"{lim.max_session_bytes}")
        if self.daemon.registered_bytes + n > lim.max_daemon_bytes:
            raise RDMAError("ENOMEM", f"ibv_reg_mr of {n} bytes: the daemon has "
                                      f"{self.daemon.registered_bytes} registered, its limit "
                                      f"is {lim.max_daemon_bytes}")
        mr = pd.hca.reg_mr(pd, n, a["access"])
        self.registered_bytes += n
        self.daemon.registered_bytes += n
        return {"mr": self.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
                "length": mr.length}

    def op_dereg_mr(self, a, payload, rid):
        return self._destroy_handle(a["mr"], "mr")

    def op_mr_write(self, a, payload, rid):
        mr: MR = self.get(a["mr"], "mr")
        mr.write(payload, a["offset"])
        return {}

    def op_mr_read(self, a, payload, rid):
        mr: MR = self.get(a["mr"], "mr")
        return {"_payload": mr.read(a["length"], a["offset"])}

    # -- verbs: CQ and QP ---------------------------------------------------------------
    def op_create_cq(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        cq = CQHost(0, a["cqe"])
        cq.handle = self.add("cq", cq)
        return {"cq": cq.handle, "cqe": a["cqe"]}

    def op_destroy_cq(self, a, payload, rid):
        cq = self.get(a["cq"], "cq")
        for kind, o in self.objects.values():
            if kind == "qp" and (o.scq is cq or o.rcq is cq):
                raise RDMAError("EBUSY", f"ibv_destroy_cq: CQ {a['cq']} is used by QP "
                                         f"{o.rcqp.qp_num:#x}")
        return self._destroy_handle(a["cq"], "cq")

    def op_poll_cq(self, a, payload, rid):
        cq: CQHost = self.get(a["cq"], "cq")
        if cq.entries or a["timeout"] <= 0:
            return {"wcs": [wc_to_wire(w) for w in cq.take(a["num"])]}

        async def wait() -> None:
            await cq.wait(float(a["timeout"]))
            if not self.gone:
                self.reply(rid, wcs=[wc_to_wire(w) for w in cq.take(a["num"])])

        task = asyncio.get_running_loop().create_task(wait())
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)
        return None

    def op_create_qp(self, a, payload, rid):
        pd: PD = self.get(a["pd"], "pd")
        scq = self.get(a["scq"], "cq")
        rcq = self.get(a["rcq"], "cq")
        if a["qp_type"] != QpType.RC:
            raise RDMAError("EOPNOTSUPP", f"qp_type {a['qp_type']}: only IBV_QPT_RC is modelled")
        cap = self.daemon.limits.max_qp_wr
        for name in ("max_send_wr", "max_recv_wr"):
            if a[name] > cap:
                raise einval(f"ibv_create_qp: cap.{name} {a[name]} exceeds the device's "
                             f"max_qp_wr {cap}")
        create_flags = a["create_flags"] or 0
        unmodelled = create_flags & ~QP_CREATE_FLAGS
        if unmodelled:
            names = [f.name for f in Mlx5dvQpCreateFlags if f & unmodelled] or [hex(unmodelled)]
            raise RDMAError("EOPNOTSUPP", "mlx5dv_create_qp: create_flags "
                                          f"{', '.join(names)} not modelled")
        qpn = self.daemon.new_qpn()
        rcqp = RCQP(pd, qpn, sq_depth=a["max_send_wr"], rq_depth=a["max_recv_wr"],
                    sq_sig_all=a["sq_sig_all"], max_inline_data=a["max_inline_data"],
                    sig_pipelining=bool(create_flags & Mlx5dvQpCreateFlags.SIG_PIPELINING))
        builder = MkeyConfigureBuilder(pd, a["send_ops_flags"], a["sq_sig_all"])
        qph = QPHost(self, 0, pd.hca, pd, rcqp, scq, rcq, a["max_send_sge"], a["max_recv_sge"],
                     a["send_ops_flags"], builder)
        qph.handle = self.add("qp", qph)
        qph.ctx = self.ctx_of_pd.get(a["pd"], 0)
        self.daemon.qps[(pd.hca.name, qpn)] = qph
        if self.daemon._wants("trace"):
            rcqp.trace = self.daemon._trace_hook(qph)
        return {"qp": qph.handle, "qp_num": qpn}

    def op_destroy_qp(self, a, payload, rid):
        return self._destroy_handle(a["qp"], "qp")

    def op_modify_qp(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        attr = control.check_fields({"t": "modify_qp.attr", **a["attr"]}, control.QP_ATTR,
                                    "modify_qp attr")
        attr = {k: v for k, v in attr.items() if v is not None}
        if "qp_state" not in attr:
            raise einval("ibv_modify_qp: attr.qp_state is required (IBV_QP_STATE)")
        if ("dest_host" in attr) != ("dest_port" in attr):
            raise einval("ibv_modify_qp: the peer's address (IBV_QP_AV) is dest_host and "
                         "dest_port together")
        # The mask's bits beside the fields sent (those that carry no value here); AV is
        # the peer's address, so only the address sets it.
        mask = a["mask"] & ~QpAttrMask.AV | qp_state.mask_of(attr)
        qph.rcqp.modify(attr, mask)
        if mask & QpAttrMask.AV:
            qph.dest = (attr["dest_host"], attr["dest_port"], attr.get("dest_dev", qph.hca.name))
            # Open the link now, so the first packet does not spend its ACK timeout on
            # TCP and HELLO set-up.
            self.daemon.link_to(attr["dest_host"], attr["dest_port"])
        qph.attrs.update(attr)
        self.daemon.service(qph)
        return {"state": int(qph.rcqp.state)}

    def op_query_qp(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        q = qph.rcqp
        return {"attr": {"qp_state": int(q.state), "qp_num": q.qp_num, "dest_qp_num": q.dest_qp,
                         "path_mtu": qph.attrs.get("path_mtu", 0),
                         "timeout": qph.attrs.get("timeout", 0),
                         "retry_cnt": q.retry_cnt, "rnr_retry": q.rnr_retry,
                         "sq_sig_all": q.sq_sig_all,
                         "dest": list(qph.dest) if qph.dest else None}}

    def op_post_send(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        wrs = control.check_list(a["wrs"], control.SEND_WR, "send_wr")
        now = asyncio.get_running_loop().time()
        try:
            for i, w in enumerate(wrs):
                try:
                    opcode = WrOpcode(w["opcode"])
                except ValueError:
                    raise einval(f"opcode {w['opcode']} is not an enum ibv_wr_opcode") from None
                sg = control.sges_from_wire(w["sg"], f"send_wr[{i}]")
                if len(sg) > qph.max_send_sge:
                    raise einval(f"send WR {i} has {len(sg)} SGEs, the QP's max_send_sge is "
                                 f"{qph.max_send_sge}")
                size = sum(s.length for s in sg)
                if size > self.daemon.limits.max_msg_size:
                    raise einval(f"send WR {i} moves {size} bytes, the port's max_msg_sz is "
                                 f"{self.daemon.limits.max_msg_size}")
                wr = SendWR(w["wr_id"], opcode, sg, w["send_flags"], w["imm_data"], w["rkey"],
                            w["remote_addr"], w["compare_add"], w["swap"],
                            w["invalidate_rkey"])
                try:
                    qph.rcqp.post_send(wr, now)
                except RDMAError as e:
                    raise RDMAError(e.errno_name, f"ibv_post_send: WR {i} (wr_id {w['wr_id']}): "
                                                  f"{e.message}") from None
        finally:
            self.daemon.service(qph)
        return {}

    def op_post_recv(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        wrs = control.check_list(a["wrs"], control.RECV_WR, "recv_wr")
        try:
            for i, w in enumerate(wrs):
                sg = control.sges_from_wire(w["sg"], f"recv_wr[{i}]")
                if len(sg) > qph.max_recv_sge:
                    raise einval(f"recv WR {i} has {len(sg)} SGEs, the QP's max_recv_sge is "
                                 f"{qph.max_recv_sge}")
                qph.rcqp.post_recv(RecvWR(w["wr_id"], sg))
        finally:
            self.daemon.service(qph)
        return {}

    # -- fault injection and counters (the daemon's, not the session's) ----------------
    def op_faults_add(self, a, payload, rid):
        rule = self.daemon.faults.add(a["rule"])
        log.info("fault rule added %s", kv(event="fault_add", peer=self.peer, id=rule.id,
                                            rule=rule.spec))
        return {"rule": rule.as_dict()}

    def op_faults_list(self, a, payload, rid):
        return {"rules": self.daemon.faults.list()}

    def op_faults_clear(self, a, payload, rid):
        n = self.daemon.faults.clear(a["rule_id"])
        log.info("fault rules cleared %s", kv(event="fault_clear", peer=self.peer, n=n))
        return {"cleared": n}

    def op_subscribe(self, a, payload, rid):
        kinds = set(a["events"])
        unknown = kinds - {"packets", "trace"}
        if unknown or not all(isinstance(k, str) for k in kinds):
            raise einval(f"subscribe: unknown event kind(s) {sorted(map(str, unknown))}; "
                         "the kinds are 'packets' and 'trace'")
        self.daemon.subscribe(self, kinds)
        return {"events": sorted(kinds)}

    def op_counters(self, a, payload, rid):
        return {"counters": self.daemon.stats()}

    # -- mlx5dv: MKEYs and DEKs ---------------------------------------------------------
    def op_create_mkey(self, a, payload, rid):
        pd: PD = self.get(a["pd"], "pd")
        mkey = pd.hca.create_mkey(pd, a["create_flags"], a["max_entries"])
        return {"mkey": self.add("mkey", mkey), "lkey": mkey.lkey, "rkey": mkey.rkey}

    def op_destroy_mkey(self, a, payload, rid):
        return self._destroy_handle(a["mkey"], "mkey")

    def op_mkey_check(self, a, payload, rid):
        mkey: MKey = self.get(a["mkey"], "mkey")
        err = mkey.mkey_check()
        return {"err_type": int(err.err_type), "actual_value": int(err.actual_value),
                "expected_value": int(err.expected_value), "offset": int(err.offset)}

    def op_mkey_configure(self, a, payload, rid):
        """mlx5dv_wr_mkey_configure(3) and its setters, replayed between ibv_wr_start and
        ibv_wr_complete: the batch is validated whole and applied whole, or not at all."""
        qph: QPHost = self.get(a["qp"], "qp")
        calls = []
        for i, c in enumerate(a["calls"]):
            what = f"mkey_configure call {i}"
            if not isinstance(c, list) or not c:
                raise FrameError("EPROTO", f"{what} must be a non-empty list")
            if c[0] == "configure":
                if len(c) != len(control.CONFIGURE_CALL):
                    raise FrameError("EPROTO", f"{what}: configure takes wr_id, wr_flags, "
                                               "mkey, num_setters, conf_flags, comp_mask")
                names = ("wr_id", "wr_flags", "mkey", "num_setters", "conf_flags", "comp_mask")
                v = control.check_fields({"t": what, **dict(zip(names, c[1:], strict=True))},
                                         dict(zip(names, control.CONFIGURE_CALL[1:],
                                                  strict=True)), what)
                calls.append(("configure", v, self.get(v["mkey"], "mkey")))
            elif len(c) == 2:
                kind, value = control.setter_from_wire(c[0], c[1], what)
                if kind == "crypto" and value.dek is not None:
                    value = dataclasses.replace(value, dek=self.get(value.dek, "dek"))
                calls.append((kind, value, None))
            else:
                raise FrameError("EPROTO", f"{what}: a setter is [kind, value]")
        q = qph.rcqp
        if q.state not in (QpState.RTS, QpState.ERR):
            raise einval(f"ibv_wr_mkey_configure needs the QP in RTS, it is in "
                         f"{QpState(q.state).name}")
        b = qph.builder
        b.wr_start()
        for kind, value, mkey in calls:
            if kind == "configure":
                b.wr_id, b.wr_flags = value["wr_id"], value["wr_flags"]
                b.wr_mkey_configure(mkey, value["num_setters"],
                                    MkeyConfAttr(conf_flags=value["conf_flags"],
                                                 comp_mask=value["comp_mask"]))
            elif kind == "layout_interleaved":
                b.wr_set_mkey_layout_interleaved(*value)
            else:
                getattr(b, f"wr_set_mkey_{kind}")(value)
        posted = b.wr_complete()
        now = asyncio.get_running_loop().time()
        for p in posted:
            q.post_local(p.wr_id, p.signaled, WcOpcode.DRIVER1, now=now)
        self.daemon.service(qph)
        return {"posted": len(posted)}

    def op_create_dek(self, a, payload, rid):
        hca: HCA = self.get(a["ctx"], "ctx")
        pd: PD = self.get(a["pd"], "pd")
        if pd.hca is not hca:
            raise einval("mlx5dv_dek_create: the PD belongs to another device")
        lg = None
        comp_mask = a["comp_mask"] or 0
        if a["crypto_login"]:
            entry: _LoginEntry = self.get(a["crypto_login"], "crypto_login")
            if entry.api != "object" or entry.ctx != a["ctx"]:
                raise einval("mlx5dv_dek_create: crypto_login is not a crypto login object of "
                             "this context (mlx5dv_crypto_login_create)")
            lg = entry.login
        elif not comp_mask & DEK_INIT_ATTR_CRYPTO_LOGIN:
            session = self._login_entry(a["ctx"], "session")
            lg = session.login if session else None
        dek = hca.create_dek(DEKInitAttr(key_size=a["key_size"], key=a["key"],
                                         has_keytag=a["has_keytag"], keytag=a["keytag"],
                                         key_purpose=a["key_purpose"], pd=pd,
                                         opaque=a["opaque"] or b"", comp_mask=comp_mask,
                                         crypto_login=lg if a["crypto_login"] else None),
                             session_login=lg)
        # The session's handle names it to the client; the engine keeps its own.
        return {"dek": self.add("dek", dek)}

    def op_query_dek(self, a, payload, rid):
        """mlx5dv_dek_query(3): a wrapped DEK is queried only inside a valid crypto login
        (a session or an object of this session on the DEK's device)."""
        dek: DEK = self.get(a["dek"], "dek")
        if dek.wrapped and not any(
                kind == "crypto_login" and o.login.state == CryptoLoginState.VALID
                and self.objects.get(o.ctx, (None, None))[1] is dek.pd.hca
                for kind, o in self.objects.values()):
            raise einval("mlx5dv_dek_query: a wrapped DEK is queried only in a valid crypto "
                         "login session or with a valid crypto login object")
        return {"state": int(dek.state), "opaque": dek.opaque}

    # -- mlx5dv: device caps and crypto login (mlx5dv_query_device(3),
    # mlx5dv_crypto_login(3), mlx5dv_crypto_login_create(3)) ---------------------------
    def op_query_mlx5_device(self, a, payload, rid):
        hca: HCA = self.get(a["ctx"], "ctx")
        return {"attr": {"version": 1, "flags": 0,
                         "comp_mask": MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD,
                         "crypto_caps": hca.crypto.caps()}}

    def _login_entry(self, ctx: int, api: str) -> _LoginEntry | None:
        for kind, o in self.objects.values():
            if kind == "crypto_login" and o.ctx == ctx and o.api == api:
                return o
        return None

    def _new_login(self, a, api: str, verb: str) -> int:
        hca: HCA = self.get(a["ctx"], "ctx")
        if self._login_entry(a["ctx"], api) is not None:
            raise RDMAError("EEXIST", f"{verb}: this context already has a crypto login "
                                      f"{'session' if api == 'session' else 'object'}")
        lg = login(hca.crypto, a["credential"], a["import_kek_id"], a["credential_id"] or 0,
                   a["comp_mask"] or 0, verb)
        return self.add("crypto_login", _LoginEntry(a["ctx"], api, lg))

    def op_crypto_login(self, a, payload, rid):
        self._new_login(a, "session", "mlx5dv_crypto_login")
        return {}

    def op_crypto_login_query_state(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        entry = self._login_entry(a["ctx"], "session")
        return {"state": int(entry.login.state if entry else CryptoLoginState.NO_LOGIN)}

    def op_crypto_logout(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        for handle, (kind, o) in list(self.objects.items()):
            if kind == "crypto_login" and o.ctx == a["ctx"] and o.api == "session":
                return self._destroy_handle(handle, "crypto_login")
        raise RDMAError("ENOENT", "mlx5dv_crypto_logout: no crypto login session exists on "
                                  "this context")

    def op_create_crypto_login(self, a, payload, rid):
        return {"login": self._new_login(a, "object", "mlx5dv_crypto_login_create")}

    def op_crypto_login_query(self, a, payload, rid):
        entry: _LoginEntry = self.get(a["login"], "crypto_login")
        return {"state": int(entry.login.state)}

    def op_destroy_crypto_login(self, a, payload, rid):
        entry: _LoginEntry = self.get(a["login"], "crypto_login")
        if entry.api != "object":
            raise einval("mlx5dv_crypto_login_destroy: that is a login session; end it with "
                         "mlx5dv_crypto_logout")
        return self._destroy_handle(a["login"], "crypto_login")

    # -- async events (ibv_get_async_event(3), ibv_ack_async_event(3)) ------------------
    def op_get_async_event(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        ev = self.async_events.take(a["ctx"])
        if ev is not None or a["timeout"] <= 0:
            return {"event": ev}

        async def wait() -> None:
            found = await self.async_events.get(a["ctx"], float(a["timeout"]))
            if not self.gone:
                self.reply(rid, event=found)

        task = asyncio.get_running_loop().create_task(wait())
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)
        return None

    def op_ack_async_event(self, a, payload, rid):
        self.async_events.ack(a["event"])
        return {}

    def op_cancel_posted_send_wrs(self, a, payload, rid):
        """mlx5dv_qp_cancel_posted_send_wrs(3): the number of WRs canceled."""
        qph: QPHost = self.get(a["qp"], "qp")
        n = qph.rcqp.cancel_posted_send_wrs(a["wr_id"])
        self.daemon.service(qph)
        return {"canceled": n}

    def op_destroy_dek(self, a, payload, rid):
        return self._destroy_handle(a["dek"], "dek")

