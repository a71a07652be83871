"""A control session spoken in frames by hand, for tests that attack the daemon: requests
written (pipelined if the test likes) without the client library, replies read only when
the test asks for them."""

from __future__ import annotations

import asyncio

from softhca.protocol.frames import FrameDecoder, frame_bytes
from softhca.protocol.handshake import make_challenge, make_hello


class Raw:
    def __init__(self, reader, writer) -> None:
        self.reader, self.writer, self.dec = reader, writer, FrameDecoder(64 << 20)
        self.ids = iter(range(1, 1 << 31))
        self.frames: list = []

    @classmethod
    async def open(cls, address: str) -> Raw:
        host, port = address.rsplit(":", 1)
        r, w = await asyncio.open_connection(host, int(port), limit=1 << 20)
        raw = cls(r, w)
        challenge = await raw.next()
        w.write(frame_bytes(make_hello(challenge.header, "control", None)))
        assert (await raw.next()).kind == "welcome"
        return raw

    @classmethod
    async def open_unix(cls, path: str) -> Raw:
        """A session on a daemon's UNIX socket (serve --unix): no token there."""
        r, w = await asyncio.open_unix_connection(path, limit=1 << 20)
        raw = cls(r, w)
        challenge = await raw.next()
        w.write(frame_bytes(make_hello(challenge.header, "control", None)))
        welcome = await raw.next()
        assert welcome.kind == "welcome", welcome.header
        raw.welcome = welcome.header
        return raw

    async def refused(self, verb: str, **fields) -> dict:
        """The err reply of a request the daemon must refuse."""
        self.writer.write(self.frame(verb, **fields))
        h = (await self.next()).header
        assert h["t"] == "err", h
        return h

    async def next(self, timeout: float = 30.0):
        while not self.frames:
            data = await asyncio.wait_for(self.reader.read(1 << 20), timeout)
            assert data, "the daemon closed the session"
            self.frames.extend(self.dec.feed(data))
        return self.frames.pop(0)

    def frame(self, verb: str, **fields) -> bytes:
        return frame_bytes({"t": verb, "id": next(self.ids), **fields})

    async def call(self, verb: str, **fields) -> dict:
        self.writer.write(self.frame(verb, **fields))
        h = (await self.next()).header
        assert h["t"] == "ok", h
        return h


async def silent_peer():
    """A fake peer daemon on loopback: it completes the HELLO of every wire link (asking
    no token), then never reads again. Returns (server, port, the links' writers)."""
    writers = []

    async def on_conn(reader, writer):
        writers.append(writer)
        challenge, _ = make_challenge(False)
        writer.write(frame_bytes(challenge))
        dec = FrameDecoder()
        frames = []
        while not frames:
            data = await reader.read(4096)
            if not data:
                return
            frames = dec.feed(data)
        writer.write(frame_bytes({"t": "welcome", "role": "wire", "devices": ["mlx5_0"],
                                  "max_frame": 16 << 20}))
        writer.transport.pause_reading()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], writers
