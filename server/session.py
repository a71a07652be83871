"""A control session's transport: one application's connection to the daemon.

It reads request frames, decodes each into its typed request (protocol/control.py), hands
it to the session's verbs (server/verbs.py) and writes the one reply; it pushes
subscribed events and the completions of pushed CQs. Back-pressure: a session whose unsent replies pass the daemon's
``reply_high_water`` is not read again until the client reads, and events beyond it
are dropped (counted, and shown in the session's counters), so neither a flooding client nor a slow subscriber can grow
the daemon or slow the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..protocol import control
from ..protocol.errors import RDMAError
from ..protocol.frames import FrameDecoder, FrameError, encode_frame
from ..protocol.link import read_frames
from .hosts import Node
from .logs import kv, log
from .verbs import Verbs

# How long one session may run requests before the event loop serves the others.
TURN_S = 0.002
# Bytes of requests read (and decoded) at once: a read of small pipelined requests is
# some 700 frames, a few milliseconds of msgpack, not the 5,800 a 256 KiB read holds.
REQUEST_CHUNK = 1 << 15


def _reply_size(header: dict) -> int:
    """The payload bytes a request's reply will carry (what the reply budget is charged
    before the request runs): an mr_read's length; the rest reply with a small header."""
    if header.get("t") == "mr_read":
        n = header.get("length")
        return n if isinstance(n, int) else 0
    return 0


def send_error(writer: asyncio.StreamWriter, rid: int, e: RDMAError) -> None:
    with contextlib.suppress(Exception):
        writer.writelines(encode_frame({"t": "err", "id": rid, "errno": e.errno_name,
                                        "msg": e.message}))


class ControlSession:
    """One application's connection: its requests in, replies and events out."""

    def __init__(self, daemon: Node, reader, writer, decoder: FrameDecoder, peer: str) -> None:
        self.daemon = daemon
        self.reader, self.writer, self.decoder = reader, writer, decoder
        self.peer = peer
        self.events_dropped = 0
        self.verbs = Verbs(daemon, self)

    @property
    def gone(self) -> bool:
        """The session ended and its objects were destroyed."""
        return self.verbs.gone

    async def run(self, first: list) -> None:
        d = self.daemon
        d.sessions.add(self)
        d.counters["control_sessions"] += 1
        log.info("session open %s", kv(event="session_open", peer=self.peer))
        frames = first
        loop = asyncio.get_running_loop()
        transport = self.writer.transport
        try:
            high = d.limits.reply_high_water
            while True:
                turn = loop.time()
                for fr in frames:
                    # The reply budget is checked before the request runs: one whose
                    # reply would take the unsent bytes past it waits until the client
                    # reads, and meanwhile nothing more is read from this session.
                    buffered = transport.get_write_buffer_size()
                    if buffered and buffered + _reply_size(fr.header) > high:
                        await self.writer.drain()
                    self._handle(fr)
                    if loop.time() - turn > TURN_S:
                        # A burst of cheap requests gives the other sessions their turn.
                        await asyncio.sleep(0)
                        turn = loop.time()
                if transport.get_write_buffer_size() > high:
                    await self.writer.drain()
                frames = await read_frames(self.reader, self.decoder, REQUEST_CHUNK)
                if not frames:
                    return
        except FrameError as e:
            # Framing is lost: say why, then close (docs/protocol.md).
            log.warning("session broke framing %s", kv(event="frame_error", peer=self.peer,
                                                        errno=e.errno_name, reason=e.message))
            send_error(self.writer, 0, e)
        finally:
            self.verbs.destroy_all()
            d.sessions.discard(self)
            log.info("session closed %s", kv(event="session_close", peer=self.peer))

    def push(self, header: dict, payload: bytes = b"") -> None:
        """An event to this subscriber. A subscriber that does not keep up loses events
        (counted, and shown in its counters), never slows the wire: the daemon does not wait for it."""
        if self.writer.transport.get_write_buffer_size() > self.daemon.limits.reply_high_water:
            self.events_dropped += 1
            return
        self.writer.writelines(encode_frame(header, payload))

    def push_wcs(self, cq: int, wcs: list) -> None:
        """Completions of pushed CQ ``cq`` to the client, one frame per batch. Never
        dropped, unlike events: the CQ's cqe bounds what is unpolled (server/verbs.py
        CQHost.pushed), so a client that never reads holds at most that much here, and
        the bytes count against reply_high_water like replies (past it the session's
        requests, the posts that make more completions, are not read)."""
        self.writer.writelines(encode_frame({"t": "wc", "cq": cq,
                                             "wcs": [w.to_wire() for w in wcs]}))

    def reply(self, rid: int, payload: bytes | memoryview = b"", **result: Any) -> None:
        self.writer.writelines(encode_frame({"t": "ok", "id": rid, **result}, payload))

    def _handle(self, fr) -> None:
        rid = fr.header.get("id") if isinstance(fr.header.get("id"), int) else 0
        try:
            rid, request = control.decode_request(fr.header, fr.payload)
            result = self.verbs.call(request, rid)
            if result is not None:
                payload = result.pop("_payload", b"")
                self.reply(rid, payload, **result)
        except RDMAError as e:
            send_error(self.writer, rid, e)
        except Exception as e:      # a bug must cost one request, never the daemon
            log.exception("request failed %s", kv(event="internal_error", peer=self.peer))
            send_error(self.writer, rid, RDMAError("EPROTO", f"internal error: {e!r}"[:200]))
