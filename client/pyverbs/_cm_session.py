"""The control session a pyverbs rdma_cm id talks over, and the routing of its events.

librdmacm keeps one channel to the kernel's CM per process; softhca's pyverbs keeps one
control session per event channel (or per synchronous id), and that session is also the
``Context`` the id's QP, PD and CQs are made on: the daemon accepts a connect or accept
only for a QP of the session that owns the id (server/cm.py), and pyverbs reaches the
daemon over TCP, where no peer credential ties two sessions to one process.

The daemon pushes each rdma_cm event to the session as a frame ``{"cm": KIND, "cmid":
HANDLE, ...}`` (a CONNECT_REQUEST also names its ``listen`` id). A task on the pyverbs
event loop takes those frames off the session and queues each on the queue its id was
registered with (a CONNECT_REQUEST on its listener's, which its new id then shares), so
the blocking calls of the user's thread wait on a plain ``queue.Queue``.
"""

from __future__ import annotations

import asyncio
import errno
import queue
import threading
import weakref

from . import _sync
from .base import PyverbsCM
from .pyverbs_error import PyverbsRDMAError


class CMSession:
    """A control session (its Context on the daemon's first device) and the router of
    its rdma_cm events; shared by the ids made on it, closed with the last of them."""

    def __init__(self, ctx=None):
        from .device import Context

        if ctx is None:
            node = _sync.open_session()
            try:
                ctx = context_on(Context, node, 0)
            except BaseException:
                _sync.close_session(node)
                raise
            self._own = True
        else:
            self._own = False
        self.ctx = ctx
        self.node = ctx._node
        self.devices = list(self.node.devices)
        self._queues: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self._users = 0
        self._pump = asyncio.run_coroutine_threadsafe(self._run(), _sync._start_loop())

    # -- lifetime ----------------------------------------------------------------------
    def hold(self) -> CMSession:
        with self._lock:
            self._users += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            if self.node._conn.inherited:
                # A fork child's copy: the pump is a task of the parent's loop, and
                # cancelling it would write to that loop's wake-up socket, which the
                # parent shares. The child only forgets it.
                return
            self._pump.cancel()
            if self._own and self.ctx._node is not None:
                self.ctx.close()

    # -- requests ----------------------------------------------------------------------
    def check(self, what: str) -> None:
        """Refuse a fork child's wait on its parent's id: no task of the child's loop
        routes that session's events (its socket is the parent's), so it would wait
        forever."""
        _sync.refuse_inherited(self.node, what)

    def request(self, verb: str, what: str, payload: bytes = b"", **fields) -> dict:
        if self.ctx._node is None:
            raise PyverbsRDMAError(f"{what}: the id's session is closed", errno.EBADF)
        h, _ = _sync.run(self.node.request(verb, payload, **fields), what)
        return h

    # -- events ------------------------------------------------------------------------
    def register(self, handle: int, q: queue.Queue) -> None:
        with self._lock:
            self._queues[handle] = q

    def unregister(self, handle: int) -> None:
        with self._lock:
            self._queues.pop(handle, None)

    async def _run(self) -> None:
        events = self.node._conn.events
        while True:
            ev = await events.get()
            if ev is None:          # the session ended: wake every waiter
                with self._lock:
                    qs = {id(q): q for q in self._queues.values()}
                for q in qs.values():
                    q.put(None)
                return
            h = ev.header
            if "cm" not in h:       # not an rdma_cm event (a capture's packet)
                continue
            self._route(h, ev.data)

    def _route(self, h: dict, data: bytes) -> None:
        with self._lock:
            listen = h.get("listen")
            if h["cm"] == "connect_request" and listen:
                q = self._queues.get(listen)
                if q is not None:
                    self._queues[h.get("cmid")] = q
            else:
                q = self._queues.get(h.get("cmid"))
        if q is not None:       # else: an id destroyed meanwhile, as librdmacm drops it
            q.put((dict(h), bytes(data)))


def context_on(context_cls, node, dev: int):
    """A pyverbs Context of device ``dev`` on an open session ``node`` (no new session:
    the id's QP must be of the session its CM requests go over)."""
    name = node.devices[dev]
    ctx = context_cls.__new__(context_cls)
    PyverbsCM.__init__(ctx)
    ctx._node = None
    ctx._children = weakref.WeakSet()
    ctx.name = name
    ctx._actx = _sync.run(node.open_device(name), f"Failed to open device {name}")
    ctx._node = node
    ctx._dev_index = dev
    return ctx
