"""A control session spoken in frames by hand, for tests that attack the daemon: requests
written (pipelined if the test likes) without the client library, replies read only when
the test asks for them."""

from __future__ import annotations

import array
import asyncio
import socket

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
        raw.path = path
        return raw

    async def hand_over(self, fds: list[int], seq: int, **hello) -> dict:
        """Hands ``fds`` to the daemon as the provider does for a registration (a memfd
        HELLO on a connection of its own, SCM_RIGHTS), under ``seq`` and this session's
        key; ``hello`` replaces fields of the HELLO. The daemon's answer's header."""
        header = {"t": "hello", "version": 1, "role": "memfd",
                  "key": self.welcome["memfd_key"], "seq": seq, **hello}
        return await asyncio.to_thread(hand_over, self.path, header, fds)

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


def hand_over(path: str, header: dict, fds: list[int], *, chunks: int = 1) -> dict:
    """A memfd HELLO with ``fds`` on a new connection to the UNIX socket at ``path``
    (blocking: run it off the daemon's loop); ``chunks`` > 1 sends the HELLO's bytes in
    that many messages, each carrying ``fds``. The answer's header."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(path)
        dec = FrameDecoder(1 << 20)

        def frame():
            got = []
            while not got:
                data = s.recv(1 << 16)
                if not data:
                    return {"t": "closed"}
                got = dec.feed(data)
            return got[0].header

        assert frame()["t"] == "challenge"
        data = frame_bytes(header)
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        step = max(1, len(data) // chunks)
        for at in range(0, len(data), step):
            try:
                s.sendmsg([data[at:at + step]], anc)
            except (BrokenPipeError, ConnectionResetError):
                break
        return frame()
