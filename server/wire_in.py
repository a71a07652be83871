"""Reading an inbound wire link: the socket's bytes straight into the frame decoder.

After the HELLO, an inbound wire link's transport is handed from its asyncio
``StreamReader`` to ``WireIn``, a plain ``asyncio.Protocol``: each read the loop makes
(up to 256 KiB, as ``READ_CHUNK``) goes to the decoder as the loop hands it over. A
``StreamReader`` would first append it to its buffer and then copy it out again for
``read`` (two copies of every byte of every train, about a tenth of a receiving daemon's
time in the 1 MiB rows of ``softhca bench``), and wake a task for it. The frames are
taken as they were (``WirePlane.take_frames``); reading is paused, not slept, while a
link is throttled for waste.

It is a ``BufferedProtocol``: the loop reads into a buffer of the link's own
(``get_buffer``) rather than into one of its own that it then copies into a new
``bytes`` per read, so each byte of a train is copied once on its way from the socket
to the frame decoder, whose frames are views into that buffer. The buffer is reused
only when no view of it is left (a frame's payload kept past its read, which nothing
on the wire path does today, would make the next read take a fresh one): its bytes
never change under anything that still looks at them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..protocol.frames import FrameDecoder, FrameError, unshared
from .link import READ_CHUNK

# The least of a cut frame still to come that is read into the frame's own buffer: a
# read's worth (below it the copy out of the read buffer costs less than a read more).
DIRECT_MIN = READ_CHUNK // 4


class WireIn(asyncio.BufferedProtocol):
    """The protocol of an inbound wire link once its HELLO is done; ``done`` resolves
    when the link ends (end of stream, a lost connection, or a frame error, which
    ``on_error`` reports before the connection closes)."""

    def __init__(self, decoder: FrameDecoder, take: Callable[[list], int],
                 throttle: Callable[[int], float], on_error: Callable[[FrameError], None]) -> None:
        self.decoder = decoder
        decoder.direct_min = DIRECT_MIN
        self.take = take
        self.throttle = throttle
        self.on_error = on_error
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()
        # The buffer the loop reads into, and how many reads needed a fresh one
        # because a view of the previous one was still alive.
        self._buf = bytearray(READ_CHUNK)
        self.fresh_buffers = 0
        # Whether the loop's last read went straight into a large frame's own buffer
        # (FrameDecoder.recv_buffer), and how many reads did.
        self._direct = False
        self.direct_reads = 0

    def attach(self, transport: asyncio.Transport, first: list, pending: bytes) -> None:
        """Take over ``transport`` from the stream reader: the frames that came with the
        HELLO's read (``first``), then the bytes the reader still held (``pending``; a
        peer waits for its welcome before it sends packets, so this is empty unless the
        peer ran ahead)."""
        self.transport = transport
        transport.set_protocol(self)
        try:
            self._pace(self.take(first))
        except FrameError as e:
            self._fail(e)
        if pending:
            self.data_received(pending)
        if not self.done.done() and not transport.is_reading():
            # The stream reader may have paused reading at its buffer limit.
            transport.resume_reading()

    def get_buffer(self, sizehint: int) -> bytearray | memoryview:
        # The rest of a frame larger than a read (a train of many packets) is read
        # straight into that frame's buffer: no copy out of the read buffer into it.
        view = self.decoder.recv_buffer()
        self._direct = view is not None
        if view is not None:
            return view
        if not unshared(self._buf):
            self._buf = bytearray(READ_CHUNK)
            self.fresh_buffers += 1
        return self._buf

    def buffer_updated(self, nbytes: int) -> None:
        if self._direct:
            self.direct_reads += 1
            self._deliver(lambda: self.decoder.filled(nbytes))
            return
        # The frames are views of the buffer, which is not read into again while any
        # view of it lives (get_buffer): the decoder may use it in place.
        self._received(memoryview(self._buf)[:nbytes], True)

    def data_received(self, data: bytes) -> None:
        # What the stream reader held at the hand-over, and reads the loop made before
        # it switched to get_buffer.
        self._received(data, False)

    def _received(self, data, stable: bool) -> None:
        self._deliver(lambda: self.decoder.feed(data, stable=stable))

    def _deliver(self, decode: Callable[[], list]) -> None:
        if self.done.done():
            return
        try:
            frames = decode()
            if frames:
                self._pace(self.take(frames))
        except FrameError as e:
            self._fail(e)

    def _pace(self, waste: int) -> None:
        """Bytes just read and dropped on arrival: reading pauses for the time the
        throttle says (the sender's TCP window fills meanwhile)."""
        if not waste:
            return
        delay = self.throttle(waste)
        if delay and self.transport is not None and not self.done.done():
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(delay, self._resume)

    def _resume(self) -> None:
        if not self.done.done() and self.transport is not None:
            self.transport.resume_reading()

    def _fail(self, e: FrameError) -> None:
        if not self.done.done():
            self.on_error(e)
            self.done.set_result(None)

    def eof_received(self) -> bool:
        if not self.done.done():
            self.done.set_result(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)
