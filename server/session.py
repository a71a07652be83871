"""A control session's transport: one application's connection to the daemon.

It reads request frames, checks each against its schema (protocol/control.py), hands
it to the session's verbs (server/verbs.py) and writes the one reply; it pushes
subscribed events. Back-pressure: a session whose unsent replies pass the daemon's
``reply_high_water`` is not read again until the client reads, and events beyond it
are dropped (counted), so neither a flooding client nor a slow subscriber can grow
the daemon or slow the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from ..protocol import control
from ..protocol.errors import RDMAError
from ..protocol.frames import FrameDecoder, FrameError, encode_frame
from ..protocol.link import read_frames
from .logs import kv, log
from .verbs import Verbs

if TYPE_CHECKING:
    from .daemon import Daemon


def send_error(writer: asyncio.StreamWriter, rid: int, e: RDMAError) -> None:
    with contextlib.suppress(Exception):
        writer.writelines(encode_frame({"t": "err", "id": rid, "errno": e.errno_name,
                                        "msg": e.message}))


class ControlSession:
    """One application's connection: its requests in, replies and events out."""

    def __init__(self, daemon: Daemon, reader, writer, decoder: FrameDecoder, peer: str) -> None:
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
        try:
            high = d.limits.reply_high_water
            while True:
                for fr in frames:
                    self._handle(fr)
                if self.writer.transport.get_write_buffer_size() > high:
                    await self.writer.drain()
                frames = await read_frames(self.reader, self.decoder)
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
            result = self.verbs.call(verb, args, fr.payload, rid)
            if result is not None:
                payload = result.pop("_payload", b"")
                self.reply(rid, payload, **result)
        except RDMAError as e:
            send_error(self.writer, rid, e)
        except Exception as e:      # a bug must cost one request, never the daemon
            log.exception("request failed %s", kv(event="internal_error", peer=self.peer))
            send_error(self.writer, rid, RDMAError("EPROTO", f"internal error: {e!r}"[:200]))
