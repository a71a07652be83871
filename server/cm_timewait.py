"""The timewait of a disconnected rdma_cm connection (rdma_get_cm_event(3),
RDMA_CM_EVENT_TIMEWAIT_EXIT), a mixin of server/cm.py's ConnectionManager.

Once a side's disconnect completes (it sent a DREQ and took the DREP, or its DREQ's
resends ran out, or it answered the peer's DREQ with a DREP) its id holds the
connection's QP numbers for ``Timing.timewait`` (the IB CM's time for a RoCE path,
engine/cm.py ``timewait_seconds``: 1.024 s; ``serve --cm-timewait``), so that packets
of the old connection still in flight cannot reach a new one. Meanwhile a REQ from
the same peer (daemon and device) naming the same QP number is refused with a REJ of
reason 10, stale connection, as the IB CM refuses it. Then the id gets
RDMA_CM_EVENT_TIMEWAIT_EXIT (status 0) and its QP may be used again.

Destroying the id ends its timewait at once, silently: the timer is cancelled, the
record dropped, no event sent (the kernel's CM keeps its record of the QP numbers
until the time runs out; here everything an id holds goes with it, so a session's
ids, and their timewaits, die with the session). Ids in timewait are still ids: they
count against the session's ``MAX_IDS`` until destroyed. UD ids (SIDR) have none.
"""

from __future__ import annotations

import asyncio

from ..engine.cm import CMId, CMState
from ..protocol import cm as proto
from .wire import host_class


class CmTimewait:
    """The ids in timewait: a timer each, and a record by (peer's daemon, peer's
    device, peer's QP number) that stale REQs are looked up in."""

    def _init_timewait(self) -> None:
        self.timewait: dict[tuple, int] = {}
        self._tw_timers: dict[int, asyncio.TimerHandle] = {}
        self.node.counters["cm_stale_rejects"] = 0

    def _tw_key(self, cid: CMId) -> tuple:
        return ((host_class(cid.peer[0]), cid.peer[1]), cid.peer_dev, cid.remote_qpn)

    def enter_timewait(self, cid: CMId) -> None:
        """``cid``'s disconnect completed: it waits ``Timing.timewait``, then gets
        TIMEWAIT_EXIT unless destroyed first."""
        cid.to(CMState.TIMEWAIT)
        if cid.peer is not None and cid.remote_qpn:
            self.timewait[self._tw_key(cid)] = cid.handle
        old = self._tw_timers.pop(cid.handle, None)
        if old is not None:
            old.cancel()
        self._tw_timers[cid.handle] = asyncio.get_running_loop().call_later(
            self.timing.timewait, self._timewait_exit, cid.handle)

    def _timewait_exit(self, handle: int) -> None:
        self._tw_timers.pop(handle, None)
        cid = self.ids.get(handle)
        if cid is None or cid.state != CMState.TIMEWAIT:
            return
        self._drop_record(cid)
        cid.to(CMState.DISCONNECTED)
        self._event(cid, "timewait_exit")

    def _drop_record(self, cid: CMId) -> None:
        if cid.peer is not None and self.timewait.get(self._tw_key(cid)) == cid.handle:
            del self.timewait[self._tw_key(cid)]

    def end_timewait(self, cid: CMId) -> None:
        """The id is destroyed: its timewait ends with no event."""
        t = self._tw_timers.pop(cid.handle, None)
        if t is not None:
            t.cancel()
        self._drop_record(cid)

    def stale_req(self, m: dict, origin, peer) -> bool:
        """Whether REQ ``m`` names the QP of a connection of its sender still in
        timewait here; if so it is refused with REJ reason 10 (stale connection)."""
        if (origin, m["dev"], m["qpn"]) not in self.timewait:
            return False
        self.node.counters["cm_stale_rejects"] += 1
        self._transmit(peer, {"t": "cm", "m": "rej", "lcid": 1, "rcid": m["lcid"],
                              "dev": 0, "reason": proto.REJ_STALE_CONN}, b"")
        return True
