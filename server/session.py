"""A control session's transport: one application's connection to the daemon.

It reads request frames, decodes each into its typed request (protocol/control.py), hands
it to the session's verbs (server/verbs.py) and writes the one reply; it pushes
subscribed events and the completions of pushed CQs. Back-pressure: a session whose
unsent replies pass the daemon's ``reply_high_water`` is not read again until the client
reads, and events beyond it are dropped (counted, and shown in the session's counters),
so neither a flooding client nor a slow subscriber can grow the daemon or slow the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..protocol import control
from ..protocol.errors import RDMAError
from ..protocol.frames import FrameDecoder, FrameError, encode_frame
from ..protocol.replies import check_reply, err_frame
from ..protocol.session import Broken, Call, Closed, Refused, Role
from ..protocol.session import ControlSession as Protocol
from .hosts import Node
from .logs import kv, log
from .post_reply import HOLD_S
from .verbs import Verbs

# How long one session may run requests before the event loop serves the others.
TURN_S = 0.002
# Bytes of requests read (and decoded) at once: a read of small pipelined requests is
# some 700 frames, a few milliseconds of msgpack, not the 5,800 a 256 KiB read holds.
REQUEST_CHUNK = 1 << 15

# A subscriber's unsent events past this are dropped (counted) rather than queued: the
# socket's buffer is moved down on every write (asyncio's), so a trace of megabyte
# transfers that falls behind must not leave megabytes there for the daemon to move.
EVENT_HIGH_WATER = 2 << 20


def _reply_size(ev) -> int:
    """The payload bytes a request's reply will carry (what the reply budget is charged
    before the request runs): an mr_read's length; the rest reply with a small header."""
    if type(ev) is Call and type(ev.request) is control.MrRead:
        return ev.request.length
    return 0


def _checked(verb: str, result: dict) -> None:
    """A handler's reply against protocol/replies.py's table (what provider/wire.h
    gives the C libraries): a field it does not name, or of another type, is the
    daemon's bug, answered and logged as an internal error, never sent."""
    try:
        check_reply(verb, result)
    except FrameError as e:
        raise AssertionError(e.message) from None


def send_error(writer: asyncio.StreamWriter, rid: int, e: RDMAError) -> None:
    """An ``err`` frame outside a session (the HELLO refused, the connection limit)."""
    with contextlib.suppress(Exception):
        writer.writelines(encode_frame(err_frame(rid, e)))


class ControlSession:
    """One application's connection: its requests in, replies and events out. The
    protocol is protocol/session.py's, in its server role; this is its transport."""

    def __init__(self, daemon: Node, reader, writer, decoder: FrameDecoder, peer: str,
                 credential: str = "client") -> None:
        self.daemon = daemon
        # What its HELLO proved (server/shares.py): its objects count against its share.
        self.credential = credential
        # The address its client dialed to reach this daemon (the HELLO's src), when it
        # said: a QP peer named by it is on this daemon (Daemon.route).
        self.dialed: tuple[str, int] | None = None
        self.reader, self.writer = reader, writer
        self.protocol = Protocol(Role.SERVER, decoder=decoder, peer=peer)
        self.peer = peer
        self.events_dropped = 0
        self.verbs = Verbs(daemon, self)
        # The timer of a held reply (_hold), while one waits.
        self._held: asyncio.TimerHandle | None = None

    def idle(self) -> bool:
        """Whether the session holds its slot for nothing: no objects, no request
        waiting, no subscription (the watchdog's idle timeout closes only such a one; a
        session whose QPs live is using its slot however quiet it is)."""
        return (not self.verbs.objects and not self.verbs.waits
                and self not in self.daemon.events.subscribers)

    @property
    def gone(self) -> bool:
        """The session ended and its objects were destroyed."""
        return self.verbs.gone

    async def run(self, first: list) -> None:
        d = self.daemon
        d.sessions.add(self)
        d.counters["control_sessions"] += 1
        log.info("session open %s", kv(event="session_open", peer=self.peer))
        try:
            events = self.protocol.receive_frames(first)
            while await self._serve(events):
                events = []
                while not events:
                    data = await self.reader.read(REQUEST_CHUNK)
                    events = self.protocol.receive_data(data)
        finally:
            if self._held is not None:
                self._held.cancel()
            self.verbs.destroy_all()
            d.sessions.discard(self)
            log.info("session closed %s", kv(event="session_close", peer=self.peer))

    async def _serve(self, events: list) -> bool:
        """Handle one read's events in order; False once the session has ended."""
        loop = self.daemon.loop
        transport = self.writer.transport
        high = self.daemon.limits.reply_high_water
        turn = loop.time()
        for ev in events:
            # By exact type: protocol/session.py's own final dataclasses.
            kind = type(ev)
            if kind is Closed:
                return False
            if kind is Broken:
                # Framing is lost: say why (queued by the protocol), then close
                # (docs/protocol.md).
                log.warning("session broke framing %s", kv(
                    event="frame_error", peer=self.peer, errno=ev.error.errno_name,
                    reason=ev.error.message))
                self._flush()
                continue
            # The reply budget is checked before the request runs: one whose reply
            # would take the unsent bytes past it waits until the client reads, and
            # meanwhile nothing more is read from this session.
            buffered = transport.get_write_buffer_size()
            if buffered and buffered + _reply_size(ev) > high:
                await self.writer.drain()
            self._handle(ev)
            if loop.time() - turn > TURN_S:
                # A burst of cheap requests gives the other sessions their turn.
                await asyncio.sleep(0)
                turn = loop.time()
        if transport.get_write_buffer_size() > high:
            await self.writer.drain()
        return True

    def _hold(self) -> None:
        """Leave what is queued for the next write, or for HOLD_S at most."""
        if self._held is None:
            self._held = self.daemon.loop.call_later(HOLD_S, self._flush)

    def _flush(self) -> None:
        if self._held is not None:
            self._held.cancel()
            self._held = None
        data = self.protocol.data_to_send()
        if data:
            # (try, not contextlib.suppress: this runs for every reply and push, and the
            # context manager is three calls more each time.)
            try:
                self.writer.writelines(data)
            except Exception:   # a connection being torn down; its reader ends it
                pass

    def push(self, header: dict, payload: bytes = b"") -> None:
        """An event to this subscriber. A subscriber that does not keep up loses events
        (counted, and shown in its counters), never slows the wire: the daemon does not
        wait for it."""
        limit = min(self.daemon.limits.reply_high_water, EVENT_HIGH_WATER)
        if self.writer.transport.get_write_buffer_size() > limit:
            self.events_dropped += 1
            return
        self.protocol.push_event(header, payload)
        self._flush()

    def push_wcs(self, cq: int, wcs: list) -> None:
        """Completions of pushed CQ ``cq`` to the client, one frame per batch. Never
        dropped, unlike events: the CQ's cqe bounds what is unpolled (server/hosts.py
        CQHost.pushed), so a client that never reads holds at most that much here, and
        the bytes count against reply_high_water like replies (past it the session's
        requests, the posts that make more completions, are not read)."""
        self.protocol.push_completions(cq, [w.to_wire() for w in wcs])
        self._flush()

    def release_held(self) -> None:
        """What waits to ride with the next frame (a post's reply held for its
        completion, server/post_reply.py) is written now: a ring CQ's completion went
        into the ring, not into a frame."""
        if self._held is not None:
            self._flush()

    def push_cq_event(self, cq: int) -> None:
        """The event of armed ring CQ ``cq`` (its completions are in its ring): never
        dropped, one per arming at most."""
        self.protocol.push_cq_event(cq)
        self._flush()

    def reply(self, rid: int, payload: bytes | memoryview = b"", **result: Any) -> None:
        self.protocol.reply(rid, payload, **result)
        self._flush()

    def reply_to(self, verb: str, rid: int, **result: Any) -> None:
        """The reply to a ``verb`` request answered later (a poll_cq or get_async_event
        that waited), checked as ``_handle`` checks the others."""
        try:
            _checked(verb, result)
        except AssertionError as e:
            log.error("reply refused %s", kv(event="internal_error", peer=self.peer,
                                              reason=str(e)))
            self.protocol.send_error(rid, RDMAError("EPROTO", f"internal error: {e!r}"[:200]))
        else:
            self.protocol.reply(rid, b"", **result)
        self._flush()

    def _handle(self, ev: Call | Refused) -> None:
        proto = self.protocol
        if type(ev) is Refused:
            proto.send_error(ev.rid, ev.error)
            self._flush()
            return
        rid = ev.rid
        try:
            result = self.verbs.call(ev.request, rid)
            if result is not None:
                payload = result.pop("_payload", b"")
                hold = result.pop("_hold", False)
                _checked(ev.request.VERB, result)
                proto.reply(rid, payload, **result)
                if hold:
                    # Written with the next frame, its completion's (server/post_reply.py).
                    self._hold()
                    return
        except RDMAError as e:
            proto.send_error(rid, e)
        except Exception as e:      # a bug must cost one request, never the daemon
            log.exception("request failed %s", kv(event="internal_error", peer=self.peer))
            proto.send_error(rid, RDMAError("EPROTO", f"internal error: {e!r}"[:200]))
        self._flush()
