"""The verbs side of a control session: the objects an application's calls created, and
one handler per control request (``HANDLERS``: request type to handler; the requests are
protocol/control.py's typed calls).

Every handler is registered the same way: a function of (the session's ``Verbs``, the
request, its id) in a handler module (``HANDLER_MODULES``: device_verbs, qp_verbs,
ud_verbs, srq_verbs, mw_verbs, process_mr, shared_mr, dv_verbs, node_verbs, cm_verbs,
wq_verbs),
named in that module's own ``HANDLERS`` dict; ``HANDLERS`` here joins them, refusing a
request type named twice. A handler returns the reply's fields
(``_payload`` for bytes), or None when it answers later itself (a ``poll_cq`` that
waits). It raises RDMAError to refuse; the session (server/session.py) turns that into
the error reply. Reading, writing and back-pressure are the session's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from ..engine.mw import dealloc_mw
from ..protocol import control
from ..protocol.enums import EventType, QpState
from ..protocol.errors import RDMAError
from ..protocol.records import WC
from . import (
    cm_verbs,
    device_verbs,
    dv_verbs,
    mw_verbs,
    node_verbs,
    process_mr,
    qp_verbs,
    shared_mr,
    srq_verbs,
    ud_verbs,
    wq_verbs,
)
from .async_events import AsyncEvents
from .hosts import CQHost, Node, QPHost, Session
from .logs import kv, log

# The requests that create an object, and the kind of object each creates (its quota's).
_CREATORS = {control.OpenDevice: "ctx", control.AllocPd: "pd", control.RegMr: "mr",
             control.RegMrShared: "mr", control.RegMrProcess: "mr",
             control.CreateCq: "cq", control.CreateQp: "qp", control.CreateMkey: "mkey",
             control.CreateDek: "dek", control.CryptoLoginReq: "crypto_login",
             control.CreateAh: "ah",
             control.AllocMw: "mw",
             control.CreateSrq: "srq",
             control.CreateCryptoLogin: "crypto_login"}


def _buffer_bytes(request: control.Request) -> int:
    """The buffer bytes a creating request will allocate beside its object."""
    # A shared MR's pages are the program's, but the MR is charged its length like any
    # other (Verbs.add), so it is checked against the same budget first.
    return request.length if isinstance(request, (control.RegMr, control.RegMrShared,
                                                  control.RegMrProcess)) else 0


def _object_bytes(kind: str, obj: Any) -> int:
    """The buffer bytes an object holds beside itself (an MR's memory)."""
    return obj.length if kind == "mr" else 0


class Verbs:
    """The verbs objects of one control session, and the call of a request's handler
    (``HANDLERS``); the handlers are functions of the modules listed there, each given
    this object."""

    def __init__(self, daemon: Node, session: Session) -> None:
        self.daemon = daemon
        self.session = session
        self.peer = session.peer
        self.objects: dict[int, tuple[str, Any]] = {}
        # Objects of each kind this session holds (its quotas, server/shares.py).
        self.counts: dict[str, int] = {}
        self._handles = itertools.count(1)
        # poll_cq and get_async_event requests waiting (the daemon's close lets their
        # replies go out before it closes the connection).
        self.waits: set[asyncio.Task] = set()
        self.gone = False
        self.registered_bytes = 0
        # ibv_get_async_event(3): per context; a PD's context names a QP's.
        self.async_events = AsyncEvents()
        self.ctx_of_pd: dict[int, int] = {}
        # The session's CQs' completion rings (server/cq_ring.py): an empty poll of any
        # of them is woken by a completion into any, as one connection's are.
        self.rings: list = []

    def call(self, request: control.Request, rid: int) -> dict | None:
        """Run the request's handler (``HANDLERS``); its reply's fields, or None if it
        replies later."""
        kind = type(request)
        # Checked before the engine allocates anything, so a refusal leaks nothing.
        creates = _CREATORS.get(kind)
        if creates is not None:
            if len(self.objects) >= self.daemon.limits.max_objects:
                raise RDMAError("ENOMEM", f"{request.VERB}: this session holds "
                                          f"{len(self.objects)} objects, the daemon's limit "
                                          "per session")
            try:
                self.daemon.shares.check(self.session.credential, self.counts, creates,
                                         _buffer_bytes(request))
            except RDMAError as e:
                raise RDMAError(e.errno_name, f"{request.VERB}: {e.message}") from None
        return HANDLERS[kind](self, request, rid)

    # -- object table -------------------------------------------------------------------
    def add(self, kind: str, obj: Any, handle: int | None = None) -> int:
        if handle is None:
            handle = next(self._handles)
        self.objects[handle] = (kind, obj)
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.daemon.shares.take(self.session.credential, kind, _object_bytes(kind, obj))
        return handle

    def get(self, handle: int, kind: str) -> Any:
        entry = self.objects.get(handle)
        if entry is None or entry[0] != kind:
            raise RDMAError("ENOENT", f"handle {handle} is not a {kind} of this session")
        return entry[1]

    def flush_all(self) -> None:
        """SIGTERM: every QP of the session to ERR, its WRs flushed to the CQs."""
        for kind, obj in list(self.objects.values()):
            if kind == "qp":
                obj.rcqp.modify_to_err()
                self.daemon.service(obj)

    def cq_event(self, cq: CQHost) -> None:
        """The event of armed ring CQ ``cq``: written into its channel's socket when it
        has one, else (or when that socket is full) a cq_event frame. Either way a
        post's reply held for its completion goes now."""
        if cq.events is not None and cq.events.signal():
            self.session.release_held()
        else:
            self.session.push_cq_event(cq.handle)

    def complete(self, cq: CQHost, wcs: list[WC]) -> None:
        """Completions of one of this session's QPs into ``cq``; on an overrun the CQ's
        context gets IBV_EVENT_CQ_ERR and every QP using the CQ goes to ERR, as a device
        that can no longer report their completions stops them."""
        overrun = cq.push(wcs)
        if cq.ring is not None and cq.entries:
            # Into the program's ring at once (server/cq_ring.py), before the reply of
            # the request that made them: a poll after that reply sees them.
            cq.ring.write(cq.take_pushed())
            for ring in self.rings:
                ring.wake()
            if cq.armed:
                cq.armed = False
                self.cq_event(cq)
            else:
                # a post's reply held to ride with its completion (server/post_reply.py)
                # goes now: the completion is in the ring already
                self.session.release_held()
        elif cq.push_mode and cq.entries:
            # Written before the reply of the request that made them (if any): frames
            # on the connection arrive in order, so a poll after that reply sees them.
            self.session.push_wcs(cq.handle, cq.take_pushed())
        if not overrun:
            return
        log.warning("CQ overrun %s", kv(event="cq_overrun", peer=self.peer, cq=cq.handle,
                                        cqe=cq.cqe))
        self.async_events.push(cq.ctx, EventType.CQ_ERR, cq=cq.handle)
        for kind, o in list(self.objects.values()):
            if kind == "qp" and (o.scq is cq or o.rcq is cq) and o.rcqp.state != QpState.ERR:
                o.rcqp.modify_to_err()
                self.daemon.service(o)

    def qp_event(self, qph: QPHost, ev: EventType) -> None:
        """An asynchronous event of one of this session's QPs, to its context."""
        self.async_events.push(qph.ctx, ev, qp=qph.handle, qp_num=qph.rcqp.qp_num)

    def destroy_all(self) -> None:
        """The session ended: its objects go, as when a process exits (docs/architecture.md)."""
        if self.gone:
            return
        self.gone = True
        self.daemon.events.unsubscribe(self.session)
        self.daemon.faults.drop_owner(self.session)
        cm = getattr(self.daemon, "cm", None)
        if cm is not None:
            cm.session_gone(self.session)
        for t in self.waits:
            t.cancel()
        counts: dict[str, int] = {}
        qps = {obj for kind, obj in self.objects.values() if kind == "qp"}
        for kind, obj in list(self.objects.values()):
            counts[kind] = counts.get(kind, 0) + 1
            self._destroy(kind, obj)
        self.objects.clear()
        self.daemon.release_links(qps)
        if counts:
            log.info("session objects destroyed %s", kv(event="session_cleanup", peer=self.peer,
                                                        **counts))

    def _destroy(self, kind: str, obj: Any) -> None:
        d = self.daemon
        self.counts[kind] -= 1
        d.shares.give_back(self.session.credential, kind, _object_bytes(kind, obj))
        if kind == "qp":
            obj.rcqp.modify_to_err()
            srq = getattr(obj.rcqp, "srq", None)      # RC QPs only: UC and UD take none
            if srq is not None:
                srq.qps -= 1
            if obj.timer is not None:
                obj.timer.cancel()
            if obj.wq is not None:
                obj.wq.close()
            d.forget_qp(obj)
        elif kind == "mr":
            obj.pd.hca.dereg_mr(obj)
            self.registered_bytes -= obj.length
            self.daemon.registered_bytes -= obj.length
        elif kind == "mkey":
            obj.pd.hca.destroy_mkey(obj)
        elif kind == "mw":
            dealloc_mw(obj.pd.hca, obj)
        elif kind == "dek":
            obj.pd.hca.destroy_dek(obj)
        elif kind == "pd":
            obj.hca.pds.pop(obj.handle, None)
        elif kind == "cq" and obj.ring is not None:
            self.rings.remove(obj.ring)
            obj.ring.close()
            obj.ring = None
            if obj.events is not None:
                obj.events.close()
                obj.events = None

    def destroy_handle(self, handle: int, kind: str) -> dict:
        obj = self.get(handle, kind)
        self._destroy(kind, obj)
        del self.objects[handle]
        return {}

    # -- what the handlers share --------------------------------------------------------
    def charge_registration(self, n: int) -> None:
        """ENOMEM when ``n`` more registered bytes pass the session's or the daemon's
        limit (checked before anything is allocated)."""
        lim = self.daemon.limits
        if self.registered_bytes + n > lim.max_session_bytes:
            raise RDMAError("ENOMEM", f"ibv_reg_mr of {n} bytes: this session has "
                                      f"{self.registered_bytes} registered, its limit is "
                                      f"{lim.max_session_bytes}")
        if self.daemon.registered_bytes + n > lim.max_daemon_bytes:
            raise RDMAError("ENOMEM", f"ibv_reg_mr of {n} bytes: the daemon has "
                                      f"{self.daemon.registered_bytes} registered, its limit "
                                      f"is {lim.max_daemon_bytes}")

    def room_to_wait(self, verb: str) -> None:
        """A session holds at most ``max_waits`` waiting poll_cq and get_async_event
        requests: each is a task and a timer in the daemon, so past it ENOMEM, as a
        device out of resources answers (retry once one of them is answered)."""
        cap = self.daemon.limits.max_waits
        if len(self.waits) >= cap:
            raise RDMAError("ENOMEM", f"{verb}: this session already has {cap} requests "
                                      "waiting, the daemon's limit; retry when one returns")

    def start_wait(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.waits.add(task)
        task.add_done_callback(self.waits.discard)


# The modules that hold the handlers, each naming its own in a ``HANDLERS`` dict of request
# type to a function of (the session's Verbs, the request, its id): the one way a handler is
# registered, so that a request type is found in exactly one place.
HANDLER_MODULES = (device_verbs, qp_verbs, ud_verbs, srq_verbs, mw_verbs, process_mr,
                   shared_mr, dv_verbs, node_verbs, cm_verbs, wq_verbs)


def join_handlers(modules) -> dict[type, Callable[[Any, Any, int], dict | None]]:
    """The ``HANDLERS`` of ``modules`` as one table; ValueError for a request type that two
    of them name (a dict merge would keep the later one without a word)."""
    out: dict[type, Callable[[Any, Any, int], dict | None]] = {}
    for mod in modules:
        for kind, handler in mod.HANDLERS.items():
            if kind in out:
                raise ValueError(f"{kind.__name__} has a handler in {out[kind].__module__} "
                                 f"and in {mod.__name__}")
            out[kind] = handler
    return out


# The handler of each request type.
HANDLERS = join_handlers(HANDLER_MODULES)
