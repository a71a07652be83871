"""Opening a connection to a daemon: TCP, then the HELLO exchange (protocol.handshake).

``open_link`` is the connecting side for both roles: a client's control session
(``client.connect``) and a daemon's outgoing wire link (``server.wire.WireLink``).
It lives above protocol/, which holds the bytes and never a socket.
``read_frames`` is the bounded frame reader every stream of the protocol is read with:
the decoder refuses a frame over its limit (EMSGSIZE) before buffering it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as _errno
import os
import re
import socket
from dataclasses import dataclass

from ..protocol.errors import RDMAError
from ..protocol.frames import Frame, FrameDecoder, encode_frame
from ..protocol.handshake import make_hello
from ..protocol.kinds import FrameKind

__all__ = ["READ_CHUNK", "Link", "connect_error", "open_link", "read_frames"]

# Bytes asked of the socket per read (and the stream reader's buffer limit).
READ_CHUNK = 1 << 18
# What a failed connect(2) is reported as, when it is one of these; other causes are
# ECONNRESET, the errno of a connection that could not be had.
_CONNECT_ERRNOS = {getattr(_errno, name): name for name in
                   ("ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT", "ECONNRESET")}


def connect_error(host: str, port: int, exc: OSError) -> RDMAError:
    """The RDMAError for a connection to ``host:port`` that failed with ``exc``: the
    errno that happened (ECONNREFUSED, EHOSTUNREACH, ENETUNREACH, ETIMEDOUT) and its
    reason, or "cannot resolve host" for a failed name lookup (a socket.gaierror,
    whose numbers are getaddrinfo's EAI_* codes, not errnos)."""
    if isinstance(exc, socket.gaierror):
        reason = exc.strerror or str(exc)
        return RDMAError("EHOSTUNREACH", f"cannot resolve host {host!r}: {reason}")
    number = exc.errno
    if number is None:
        # asyncio tried several addresses and lists each failure: "Multiple exceptions:
        # [Errno 111] Connect call failed ..., [Errno 99] ..."; the first one counts.
        found = re.search(r"\[Errno (\d+)\]", str(exc))
        number = int(found.group(1)) if found else None
    name = _CONNECT_ERRNOS.get(number, "ECONNRESET")
    reason = os.strerror(number) if number else str(exc)
    return RDMAError(name, f"cannot connect to {host}:{port}: {reason}")


async def read_frames(reader: asyncio.StreamReader, decoder: FrameDecoder,
                      chunk: int = READ_CHUNK) -> list[Frame]:
    """The next whole frames; [] at end of stream. ``chunk`` bounds the bytes decoded at
    once, and so the frames one call returns."""
    while True:
        data = await reader.read(chunk)
        if not data:
            return []
        frames = decoder.feed(data)
        if frames:
            return frames


@dataclass
class Link:
    """An open connection: the streams, its decoder (which may hold part of the next
    frame), the daemon's welcome header and any frames that came after it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    decoder: FrameDecoder
    welcome: dict
    rest: list[Frame]


async def open_link(host: str, port: int, role: str, token: bytes | None, *,
                    timeout: float, max_frame: int, src: str | None = None,
                    path: str | None = None, local_host: str | None = None) -> Link:
    """Connect to the daemon at ``host:port`` and complete the HELLO exchange as ``role``.

    Each of the two steps (TCP connect; challenge, hello, welcome) is bounded by
    ``timeout``. ``src`` is a daemon's own address, named on its wire links
    (protocol.handshake). Failures raise RDMAError and close the connection: ETIMEDOUT
    for no answer in time, the connect's own errno (ECONNREFUSED, EHOSTUNREACH,
    ENETUNREACH, ETIMEDOUT; connect_error) or ECONNRESET for a connection closed in the
    handshake, the daemon's own
    errno for an error frame (EBUSY at its connection limit, EACCES for a wrong token),
    HandshakeError from make_hello, EPROTO for anything but a welcome. With ``path``,
    the daemon's UNIX socket instead of TCP (``host:port`` then only names it).
    ``local_host``: the TCP connection's source address (a daemon on a loopback address
    of its own leaves from it, so the peer sees which of the host's daemons it is).
    """
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(path, limit=READ_CHUNK) if path is not None
            else asyncio.open_connection(
                host, port, limit=READ_CHUNK,
                local_addr=(local_host, 0) if local_host is not None else None), timeout)
    except asyncio.TimeoutError:
        raise RDMAError("ETIMEDOUT", f"no answer from {host}:{port} within {timeout:g} s") \
            from None
    except OSError as e:
        if path is not None:
            raise RDMAError(_errno.errorcode.get(e.errno or 0, "ECONNREFUSED"),
                            f"cannot connect to {path}: {e.strerror or e}") from None
        # The errno that happened (ECONNREFUSED, EHOSTUNREACH, ...), or "cannot resolve
        # host" for a failed name lookup (connect_error).
        raise connect_error(host, port, e) from None
    decoder = FrameDecoder(max_frame)
    try:
        frames = await asyncio.wait_for(_handshake_frames(reader, decoder), timeout)
        first = frames[0].header
        if first.get("t") == FrameKind.ERR:     # refused before the HELLO (connection limit)
            raise RDMAError(first.get("errno", "EPROTO"), first.get("msg", "refused"))
        writer.writelines(encode_frame(make_hello(first, role, token, src)))
        frames = frames[1:] or await asyncio.wait_for(_handshake_frames(reader, decoder),
                                                      timeout)
        h = frames[0].header
        if h.get("t") == FrameKind.ERR:
            raise RDMAError(h.get("errno", "EPROTO"), h.get("msg", "handshake refused"))
        if h.get("t") != FrameKind.WELCOME:
            raise RDMAError("EPROTO", f"expected 'welcome' from {host}:{port}, "
                                      f"got {h.get('t')!r}")
    except asyncio.TimeoutError:
        writer.close()
        raise RDMAError("ETIMEDOUT", f"{host}:{port} did not complete the handshake within "
                                     f"{timeout:g} s") from None
    except BaseException:
        with contextlib.suppress(Exception):
            writer.close()
        raise
    return Link(reader, writer, decoder, h, frames[1:])


async def _handshake_frames(reader: asyncio.StreamReader, decoder: FrameDecoder) -> list:
    frames = await read_frames(reader, decoder)
    if not frames:
        raise RDMAError("ECONNRESET", "the daemon closed the connection during the handshake")
    return frames
