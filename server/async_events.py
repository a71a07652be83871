"""Asynchronous events of a control session's device contexts (ibv_get_async_event(3)).

An event belongs to the context its QP was created on, as with verbs, where each
ibv_context has its own async event file. ``get`` hands out the oldest one, waiting
up to a timeout for one to come; an event handed out stays unacknowledged until
``ack`` (ibv_ack_async_event(3)), and acknowledging twice, or an event never handed
out, is EINVAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque

from ..protocol.enums import EventType
from ..protocol.errors import einval


async def wait_woken(waiters: list[asyncio.Future], timeout: float) -> None:
    """Wait up to ``timeout`` s for ``wake(waiters)`` (a poll_cq or get_async_event the
    daemon holds rather than answer empty at once)."""
    fut = asyncio.get_running_loop().create_future()
    waiters.append(fut)
    try:
        await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        with contextlib.suppress(ValueError):
            waiters.remove(fut)


def wake(waiters: list[asyncio.Future]) -> None:
    for fut in waiters:
        if not fut.done():
            fut.set_result(None)
    waiters.clear()


class AsyncEvents:
    def __init__(self) -> None:
        self._queues: dict[int, deque[dict]] = {}
        self._waiters: dict[int, list[asyncio.Future]] = {}
        self._ids = itertools.count(1)
        self.unacked: dict[int, dict] = {}

    def push(self, ctx: int, event_type: EventType, **element) -> None:
        """Queue an event for context ``ctx``; ``element`` names what it is about
        (``qp``: the QP's handle and ``qp_num``)."""
        ev = {"event": next(self._ids), "event_type": int(event_type), **element}
        self._queues.setdefault(ctx, deque()).append(ev)
        wake(self._waiters.get(ctx, []))

    def take(self, ctx: int) -> dict | None:
        q = self._queues.get(ctx)
        if not q:
            return None
        ev = q.popleft()
        self.unacked[ev["event"]] = ev
        return ev

    async def get(self, ctx: int, timeout: float) -> dict | None:
        """The oldest event of ``ctx``, waiting up to ``timeout`` s; None if none came."""
        ev = self.take(ctx)
        if ev is not None or timeout <= 0:
            return ev
        await wait_woken(self._waiters.setdefault(ctx, []), timeout)
        return self.take(ctx)

    def ack(self, event: int) -> None:
        if self.unacked.pop(event, None) is None:
            raise einval(f"ibv_ack_async_event: event {event} was not handed out by "
                         "ibv_get_async_event, or is already acknowledged")
