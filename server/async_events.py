"""Asynchronous events of a control session's device contexts (ibv_get_async_event(3)).

An event belongs to the context its QP was created on, as with verbs, where each
ibv_context has its own async event file. ``get`` hands out the oldest one, waiting
up to a timeout for one to come; an event handed out stays unacknowledged until
``ack`` (ibv_ack_async_event(3)), and acknowledging twice, or an event never handed
out, is EINVAL.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque

from ..protocol.enums import EventType
from ..protocol.errors import RDMAError, einval

# Bounds, so that a client that never reads or never acknowledges its events cannot grow
# the daemon: events queued per context (past it the newest are dropped and counted, as
# a subscriber that does not keep up loses events), and events handed out but not yet
# acknowledged per session (past it get_async_event is refused until some are acked).
MAX_QUEUED = 1024
MAX_UNACKED = 1024


async def wait_woken(waiters: set[asyncio.Future], timeout: float) -> None:
    """Wait up to ``timeout`` s for ``wake(waiters)`` (a poll_cq or get_async_event the
    daemon holds rather than answer empty at once). A set, so that ending one wait
    costs O(1) and a session's many waits end in linear time, not quadratic."""
    fut = asyncio.get_running_loop().create_future()
    waiters.add(fut)
    try:
        await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        waiters.discard(fut)


def wake(waiters: set[asyncio.Future]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    waiters.clear()


class AsyncEvents:
    def __init__(self) -> None:
        self._queues: dict[int, deque[dict]] = {}
        self._waiters: dict[int, set[asyncio.Future]] = {}
        self._ids = itertools.count(1)
        self.unacked: dict[int, dict] = {}
        self.dropped = 0

    def push(self, ctx: int, event_type: EventType, **element) -> None:
        """Queue an event for context ``ctx``; ``element`` names what it is about
        (``qp``: the QP's handle and ``qp_num``)."""
        q = self._queues.setdefault(ctx, deque())
        if len(q) >= MAX_QUEUED:
            self.dropped += 1
            return
        q.append({"event": next(self._ids), "event_type": int(event_type), **element})
        wake(self._waiters.get(ctx, set()))

    def take(self, ctx: int) -> dict | None:
        q = self._queues.get(ctx)
        if not q:
            return None
        if len(self.unacked) >= MAX_UNACKED:
            raise RDMAError("ENOMEM", f"ibv_get_async_event: {len(self.unacked)} events are "
                                      "handed out and not acknowledged (ibv_ack_async_event)")
        ev = q.popleft()
        self.unacked[ev["event"]] = ev
        return ev

    async def get(self, ctx: int, timeout: float) -> dict | None:
        """The oldest event of ``ctx``, waiting up to ``timeout`` s; None if none came."""
        ev = self.take(ctx)
        if ev is not None or timeout <= 0:
            return ev
        await wait_woken(self._waiters.setdefault(ctx, set()), timeout)
        try:
            return self.take(ctx)
        except RDMAError:
            return None     # refused at the call already if it was full; the event stays

    def ack(self, event: int) -> None:
        if self.unacked.pop(event, None) is None:
            raise einval(f"ibv_ack_async_event: event {event} was not handed out by "
                         "ibv_get_async_event, or is already acknowledged")
