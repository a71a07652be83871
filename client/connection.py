"""The client's transport: one control connection, its reads and writes on asyncio.

What goes on the connection, and what comes back means, is protocol/session.py's
(``ControlSession`` in the client role): request ids, replies matched to them, pushed
completions kept until polled, credits returned, pushed events. This module feeds it
the bytes the socket reads, writes the bytes it produces, and turns its events into
the futures, wake-ups and queue the objects (client/objects.py) wait on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

from ..protocol.errors import RDMAError
from ..protocol.session import (
    Broken,
    Closed,
    Completions,
    ControlSession,
    Failed,
    Pushed,
    Reply,
    Role,
)
from ..server.link import READ_CHUNK, Link, open_link
from .records import Event

__all__ = ["CLIENT_MAX_FRAME", "DEFAULT_PORT", "EVENT_QUEUE", "IO_CHUNK", "Connection",
           "PushedCQ"]

DEFAULT_PORT = 4791
# Replies carry mr.read data; a client accepts bigger frames than it sends.
CLIENT_MAX_FRAME = 64 << 20
# mr.write / mr.read move at most this much per request (below the daemon's frame limit).
IO_CHUNK = 8 << 20
# Pushed events waiting to be read; beyond this the oldest go (counted).
EVENT_QUEUE = 1 << 16
# How many fork(2)s separate this process from the one that ran this module first. A
# child of fork has a copy of every Connection of its parent, and their sockets are the
# parent's (one file description, shared): a byte the child wrote would land in the
# middle of the parent's frames, a read would take the parent's replies, and closing
# the transport would unregister it from the parent's epoll instance (also shared). A
# connection made in an earlier generation is refused whole (EIO), with no system call
# and nothing done on its socket; a compare of two ints is all a data-path call pays.
_generation = 0
INHERITED = ("this control session was opened by the parent of a fork(2) (process "
             "{pid}): its socket is the parent's, so a forked child cannot use it or the "
             "verbs objects made on it; the child opens its own (a new connection)")


def _after_fork_in_child() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)

# Unsent request bytes past which a request waits for the socket to drain.
DRAIN_AT = 1 << 20


class PushedCQ:
    """The polls waiting for completions of one pushed CQ (the completions themselves
    are the protocol session's)."""

    __slots__ = ("waiters",)

    def __init__(self) -> None:
        self.waiters: list[asyncio.Future] = []

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


class Connection:
    """One control connection: requests out, their replies back to the awaiting call."""

    def __init__(self, link: Link, address: str) -> None:
        self.reader, self.writer = link.reader, link.writer
        self._transport = link.writer.transport
        self.address = address
        self.welcome = link.welcome
        self.protocol = ControlSession(Role.CLIENT, decoder=link.decoder, peer=address)
        self._futures: dict[int, asyncio.Future] = {}
        self._generation, self._pid = _generation, os.getpid()
        # Pushed events (frames without an id): at most EVENT_QUEUE wait to be read;
        # beyond that the oldest go and are counted.
        self.events: asyncio.Queue = asyncio.Queue()
        self.events_dropped = 0
        # Pushed CQs by handle: the polls waiting on each.
        self.cqs: dict[int, PushedCQ] = {}
        self._credit_flush: asyncio.Handle | None = None
        # The loop the connection lives in, asked once: on Python 3.11
        # asyncio.get_running_loop makes a getpid(2) system call each time.
        self.loop = asyncio.get_running_loop()
        self._task = self.loop.create_task(self._read_loop(link.rest))

    @classmethod
    async def open(cls, host: str, port: int, token: bytes | None, *,
                   timeout: float) -> Connection:
        """TCP to ``host:port`` and the HELLO as a control session (server/link.py)."""
        # The address dialed, in the HELLO's src: the daemon takes a QP peer named by it
        # for itself, however the daemon was reached (a forwarded or published port it
        # cannot connect to itself; docs/protocol.md, "The HELLO").
        dialed = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        link = await open_link(host, port, "control", token, timeout=timeout,
                               max_frame=CLIENT_MAX_FRAME, src=dialed)
        return cls(link, f"{host}:{port}")

    @classmethod
    async def open_unix(cls, path: str, *, timeout: float) -> Connection:
        """A control session on the daemon's UNIX socket ``path`` (``serve --unix``,
        ``softhca run``'s): the kernel vouches for this process's user, no token."""
        link = await open_link("", 0, "control", None, timeout=timeout,
                               max_frame=CLIENT_MAX_FRAME, path=path)
        return cls(link, path)

    @property
    def error(self) -> RDMAError | None:
        """Why the connection ended (what every request raises now), or None while open."""
        return self.protocol.error

    # tools/capture.py reads the reason by this name.
    _closed = error

    @property
    def inherited(self) -> bool:
        """True in a child of fork(2) for a connection its parent opened."""
        return self._generation != _generation

    def inherited_error(self) -> RDMAError:
        return RDMAError("EIO", INHERITED.format(pid=self._pid))

    async def request(self, verb: str, payload: bytes | memoryview = b"",
                      **fields: Any) -> tuple[dict, memoryview]:
        if self._generation != _generation:
            raise self.inherited_error()
        rid = self.protocol.send_request(verb, payload, **fields)
        fut = self.loop.create_future()
        self._futures[rid] = fut
        self._write()
        if self._transport.get_write_buffer_size() > DRAIN_AT:
            await self.writer.drain()
        return await fut

    def cq(self, handle: int) -> PushedCQ:
        """The waiting polls of pushed CQ ``handle`` (made on first use)."""
        st = self.cqs.get(handle)
        if st is None:
            st = self.cqs[handle] = PushedCQ()
        return st

    def available(self, handle: int) -> int:
        """Completions of pushed CQ ``handle`` received and not polled yet."""
        return self.protocol.completions(handle)

    def take(self, handle: int, n: int) -> list:
        """Up to ``n`` received completions of pushed CQ ``handle`` (wire form). Their
        room goes back to the daemon with the next request or at the loop's next turn,
        whichever is first; nothing waits for it."""
        out = self.protocol.take_completions(handle, n)
        if out and self._credit_flush is None and self.protocol.credits_owed:
            self._credit_flush = self.loop.call_soon(self._send_credits)
        return out

    def _send_credits(self) -> None:
        self._credit_flush = None
        if self.protocol.flush_credits():
            self._write()

    def forget_cq(self, handle: int) -> None:
        """A destroyed CQ: its unpolled entries and uncredited count go with it."""
        self.protocol.forget_cq(handle)
        st = self.cqs.pop(handle, None)
        if st is not None:
            st.wake()

    def _write(self) -> None:
        if self._generation != _generation:
            return
        data = self.protocol.data_to_send()
        if data:
            # (try, not contextlib.suppress: this runs for every request.)
            try:
                self._transport.writelines(data)
            except Exception:   # a connection being torn down; the read loop ends it
                pass

    async def _read_loop(self, first: list) -> None:
        proto = self.protocol
        try:
            self._dispatch(proto.receive_frames(first))
            while proto.closed is None:
                self._dispatch(proto.receive_data(await self.reader.read(READ_CHUNK)))
        except ConnectionError as e:
            self._dispatch([proto.connection_lost(RDMAError("ECONNRESET", str(e)))])
        finally:
            if proto.closed is None:        # cancelled by close()
                self._dispatch([proto.connection_lost()])

    def _dispatch(self, events: list) -> None:
        for ev in events:
            # By exact type: the events are protocol/session.py's own final dataclasses,
            # and this runs for every reply and every push.
            kind = type(ev)
            if kind is Reply:
                fut = self._futures.pop(ev.rid, None)
                if fut is not None and not fut.done():
                    fut.set_result((ev.header, ev.payload))
            elif kind is Completions:
                st = self.cqs.get(ev.cq)
                if st is not None:
                    st.wake()
            elif kind is Failed:
                fut = self._futures.pop(ev.rid, None)
                if fut is not None and not fut.done():
                    fut.set_exception(ev.error)
            elif kind is Pushed:
                if self.events.qsize() >= EVENT_QUEUE:
                    self.events.get_nowait()
                    self.events_dropped += 1
                self.events.put_nowait(Event(ev.kind, ev.header, bytes(ev.payload)))
            elif kind is Broken:
                # The daemon broke the protocol: nothing more it sends can be trusted.
                with contextlib.suppress(Exception):
                    self.writer.transport.abort()
            elif kind is Closed:
                self._ended(ev.error)

    def _ended(self, reason: RDMAError) -> None:
        self.events.put_nowait(None)        # ends a subscription's iteration
        for st in self.cqs.values():
            st.wake()
        futures, self._futures = self._futures, {}
        for fut in futures.values():
            if not fut.done():
                fut.set_exception(reason)

    async def close(self) -> None:
        if self._generation != _generation:
            # The parent's session: the child only forgets its copy. Its socket, its
            # read task and its loop's registrations stay the parent's.
            return
        with contextlib.suppress(Exception):
            self.writer.close()
            await self.writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
