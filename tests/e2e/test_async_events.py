"""ibv_get_async_event(3) / ibv_ack_async_event(3) through the daemon: per context,
waiting up to a timeout, each event acknowledged once."""

from __future__ import annotations

import asyncio

import pytest

import softhca.client as sh
from softhca.protocol.enums import EventType
from softhca.protocol.errors import RDMAError
from softhca.server.async_events import AsyncEvents


async def test_no_event_within_the_timeout_is_none():
    async with sh.embedded() as node:
        ctx = await node.open_device()
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await ctx.get_async_event(0.2) is None
        assert loop.time() - start >= 0.19
        assert await ctx.get_async_event(0) is None


async def test_ack_of_an_event_never_handed_out_is_einval():
    async with sh.embedded() as node:
        ctx = await node.open_device()
        with pytest.raises(sh.RDMAError) as e:
            await sh.AsyncEvent(ctx, 12345, EventType.SQ_DRAINED).ack()
        assert e.value.errno_name == "EINVAL"


async def test_events_are_per_context_in_order_and_acked_once():
    ev = AsyncEvents()
    ev.push(1, EventType.SQ_DRAINED, qp=5, qp_num=0x11)
    ev.push(1, EventType.QP_FATAL, qp=5, qp_num=0x11)
    assert await ev.get(2, 0.05) is None
    waiter = asyncio.ensure_future(ev.get(2, 5))
    await asyncio.sleep(0)
    ev.push(2, EventType.COMM_EST, qp=6, qp_num=0x12)
    got = await waiter
    assert got["event_type"] == EventType.COMM_EST and got["qp"] == 6
    first, second = ev.take(1), ev.take(1)
    assert (first["event_type"], second["event_type"]) == (EventType.SQ_DRAINED,
                                                          EventType.QP_FATAL)
    assert ev.take(1) is None
    ev.ack(first["event"])
    with pytest.raises(sh.RDMAError) as e:
        ev.ack(first["event"])
    assert e.value.errno_name == "EINVAL"


def test_a_client_that_never_reads_or_acks_cannot_grow_the_queues():
    from softhca.server import async_events as ae

    ev = AsyncEvents()
    for _ in range(ae.MAX_QUEUED + 500):
        ev.push(1, EventType.SQ_DRAINED, qp=1, qp_num=0x11)
    assert len(ev._queues[1]) == ae.MAX_QUEUED and ev.dropped == 500
    for _ in range(ae.MAX_UNACKED):
        ev.take(1)
    ev.push(2, EventType.SQ_DRAINED, qp=2, qp_num=0x12)
    with pytest.raises(RDMAError) as e:
        ev.take(2)
    assert e.value.errno_name == "ENOMEM"
    ev.ack(next(iter(ev.unacked)))
    assert ev.take(2)["qp_num"] == 0x12
