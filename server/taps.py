"""What watches a daemon's traffic: wire taps (callables seeing every packet it sends or
accepts: captures, the demo's wire images) and the control sessions subscribed to
pushed events (``packets``: the RC packets of its QPs; ``trace``: the engine's trace
of their messages, stage by stage).

A session sees the events of its own QPs, or with ``daemon_wide`` every session's.
Packets are watched and the QPs' trace hooks installed only while someone listens,
so that without subscribers neither costs anything.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import errno
from collections.abc import Callable
from typing import Any

from ..protocol.kinds import FrameKind
from ..protocol.packets import Packet, packet_header
from .hosts import QPHost, Session
from .logs import kv, log

# Trace events kept for the end of a turn of the loop, at most (past it: dropped).
TRACE_PENDING = 4096
# A wire tap: called with the direction ("tx" | "rx"), the device and the packet.
Tap = Callable[[str, str, Packet], None]


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
        if all(type(x) is int and -(1 << 63) <= x < (1 << 64) for x in v):
            return list(v)      # a check's results per block: thousands, plain already
        return [plain(x) for x in v]
    if dataclasses.is_dataclass(v):
        return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if hasattr(v, "item"):          # numpy scalars
        return plain(v.item())
    return str(v)


class Taps:
    """The wire taps and event subscribers of one daemon, whose QPs are ``qps`` and
    whose address (named in every event) ``address()`` says."""

    def __init__(self, qps: dict[tuple[str, int], QPHost], address: Callable[[], str],
                 counters: dict[str, int] | None = None) -> None:
        self.qps = qps
        self.address = address
        # ``side_features_stopped``: taps and subscribers stopped because they failed.
        self.counters = counters if counters is not None else {}
        self.counters.setdefault("side_features_stopped", 0)
        self.counters.setdefault("trace_events_dropped", 0)
        # Trace events waiting for the end of this turn of the loop (_trace_event).
        self._trace_pending: list[tuple] = []
        # Wire taps: empty, they cost one truth test per batch.
        self.taps: list[Tap] = []
        # Sessions that asked for pushed events: session -> ({"packets", "trace"},
        # daemon_wide).
        self.subscribers: dict[Session, tuple[set[str], bool]] = {}
        # Whether any session wants packets (kept, as it is asked for every batch).
        self.packet_watch = False

    @property
    def watching(self) -> bool:
        """Whether anything must see the packets (a tap or a subscriber)."""
        return bool(self.taps) or self.packet_watch

    @property
    def per_packet(self) -> bool:
        """Whether something must see them one by one: a ``packets`` subscriber, or a
        tap that does not take runs (``takes_runs``: a capture, which cuts a train into
        its packets on a thread of its own)."""
        return self.packet_watch or any(not getattr(t, "takes_runs", False)
                                        for t in self.taps)

    def subscribe(self, session: Session, kinds: set[str] | frozenset[str],
                  daemon_wide: bool = False) -> None:
        """Push ``kinds`` of events to ``session``: those of its own QPs, or with
        ``daemon_wide`` every session's (a tap of every session shows their payloads,
        so it is asked for by name)."""
        if kinds:
            self.subscribers[session] = (set(kinds), daemon_wide)
        else:
            self.subscribers.pop(session, None)
        self._rewire()

    def unsubscribe(self, session: Session) -> None:
        """The session ended: its subscriptions go."""
        if session in self.subscribers:
            self.subscribe(session, set())

    def wants(self, kind: str, owner: Session | None = None) -> list[Session]:
        """The subscribers to ``kind`` that may see an event of ``owner``'s QP (any
        subscriber when ``owner`` is None and the question is whether anyone listens)."""
        return [s for s, (k, wide) in self.subscribers.items()
                if kind in k and not s.gone and (wide or owner is None or s is owner)]

    def _rewire(self) -> None:
        """Watch packets and install the QPs' trace hooks only while someone listens."""
        self.packet_watch = bool(self.wants("packets"))
        tracing = bool(self.wants("trace"))
        for qph in self.qps.values():
            qph.rcqp.trace = self._hook(qph) if tracing else None

    def trace_hook(self, qph: QPHost) -> Callable[[dict, Any], None] | None:
        """The RCQP trace hook of ``qph``: None while nobody subscribes to traces."""
        return self._hook(qph) if self.wants("trace") else None

    def _hook(self, qph: QPHost) -> Callable[[dict, Any], None]:
        dev, owner = qph.hca.name, qph.session
        return lambda ctx, ev: self._trace_event(dev, ctx, ev, owner)

    def seen(self, direction: str, dev: str, pkts: list,
             owner: Session | None) -> None:
        """Packets of ``owner``'s QP (None: of no QP here) sent ("tx") or accepted ("rx"):
        to the wire taps, then to the subscribers. ``pkts`` holds runs (trains) only
        when nothing is ``per_packet``. A tap that fails is stopped, never the
        packets."""
        failed = None
        for tap in self.taps:
            try:
                for p in pkts:
                    tap(direction, dev, p)
            except Exception as e:      # noqa: BLE001 - any failure of a tap stops it alone
                failed = [*(failed or []), (tap, e)]
        for tap, e in failed or ():
            self.stop_tap(tap, e)
        if self.packet_watch:
            for p in pkts:
                self._packet_event(direction, dev, p, owner)

    def _packet_event(self, direction: str, dev: str, p: Packet,
                      owner: Session | None) -> None:
        subs = [s for s in self.wants("packets", owner)
                if owner is not None or self.subscribers[s][1]]
        if not subs:
            return
        header = {"t": FrameKind.EVENT, "kind": "packet", "dir": direction, "dev": dev,
                  "time": asyncio.get_running_loop().time(), "daemon": self.address(),
                  "pkt": packet_header(dev, p)}
        for s in subs:
            self._push(s, header, p.payload)

    def _trace_event(self, dev: str, ctx: dict, ev, owner: Session) -> None:
        """A stage of a transfer, on the data path: kept (the engine's event holds a
        copy of the stage's bytes) and pushed once this turn of the loop is over, after
        the packets and ACKs the transfer made have gone, so that a trace never delays
        an ACK. At most ``TRACE_PENDING`` wait; past it an event is dropped, counted
        (``trace_events_dropped``)."""
        if not self.wants("trace", owner):
            return
        loop = asyncio.get_running_loop()
        if len(self._trace_pending) >= TRACE_PENDING:
            self.counters["trace_events_dropped"] += 1
            return
        if not self._trace_pending:
            loop.call_soon(self._push_traces)
        self._trace_pending.append((dev, ctx, ev, owner, loop.time()))

    def _push_traces(self) -> None:
        pending, self._trace_pending = self._trace_pending, []
        daemon = self.address()
        for dev, ctx, ev, owner, when in pending:
            subs = self.wants("trace", owner)
            if not subs:
                continue
            header = {"t": FrameKind.EVENT, "kind": "trace", "dev": dev, "daemon": daemon,
                      "time": when, **plain(ctx),
                      "direction": ev.direction, "stage": ev.stage, "key": ev.key,
                      "stream": ev.stream, "offset": ev.offset, "at": ev.at,
                      "detail": plain(ev.detail)}
            for s in subs:
                self._push(s, header, ev.data)

    def notice(self, qph: QPHost, fields: dict) -> None:
        """Something a trace subscriber should be told about QP ``qph`` beside its
        transfers (server/return_path.py: a peer that cannot connect back): an event of
        kind "notice" to those subscribed to "trace"."""
        subs = self.wants("trace", qph.session)
        if not subs:
            return
        header = {"t": FrameKind.EVENT, "kind": "notice", "dev": qph.hca.name,
                  "daemon": self.address(), "time": asyncio.get_running_loop().time(),
                  **plain(fields)}
        for s in subs:
            self._push(s, header, b"")

    def _push(self, s: Session, header: dict, payload) -> None:
        """An event to subscriber ``s``; one that fails (its event cannot be encoded,
        its connection broke) is unsubscribed, never the traffic that made the event.
        A slow one loses events (Session.push counts them)."""
        try:
            s.push(header, payload)
        except Exception as e:          # noqa: BLE001 - a failing subscriber stops alone
            self.unsubscribe(s)
            self._stopped("subscriber", e)

    def stop_tap(self, tap: Tap, e: BaseException) -> None:
        """A wire tap failed (a capture file's disk is full, EFBIG, EIO ...): it is
        removed and told (its ``stopped``, if it has one), with one log line and
        ``side_features_stopped`` counted; the packets go on."""
        if tap in self.taps:
            self.taps.remove(tap)
        stopped = getattr(tap, "stopped", None)
        if stopped is not None:
            try:
                stopped(e)
            except Exception:           # noqa: BLE001 - already stopped; nothing more to do
                pass
        self._stopped(getattr(tap, "name", type(tap).__name__), e)

    def _stopped(self, what: str, e: BaseException) -> None:
        self.counters["side_features_stopped"] += 1
        reason = (f"{e.strerror} ({errno_name(e)})" if isinstance(e, OSError) and e.strerror
                  else f"{type(e).__name__}: {e}")
        log.warning("side feature stopped %s", kv(event="side_feature_stopped", what=what,
                                                   reason=reason, traffic="continues"))


def errno_name(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, str(e.errno))
