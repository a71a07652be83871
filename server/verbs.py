"""The verbs side of a control session: the objects an application's calls created, and
one handler per control request (``HANDLERS``: request type to handler method; the requests
are protocol/control.py's typed calls).

A handler gets the decoded request and its id, and returns the reply's fields
(``_payload`` for bytes), or None when it answers later itself (a ``poll_cq`` that
waits). It raises RDMAError to refuse; the session (server/session.py) turns that into
the error reply. Reading, writing and back-pressure are the session's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

from ..engine import qp_state
from ..engine.hca import MR, PD
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..engine.mw import dealloc_mw
from ..engine.rc import RCQP
from ..protocol import control
from ..protocol.control import MAX_CQE
from ..protocol.enums import EventType, Mlx5dvQpCreateFlags, QpAttrMask, QpState, QpType
from ..protocol.errors import RDMAError, einval
from ..protocol.records import WC
from .async_events import AsyncEvents
from .cm_verbs import CM_HANDLERS
from .device_attr import device_attr
from .dv_verbs import Mlx5dvVerbs
from .hosts import CQHost, Node, QPHost, Session
from .logs import kv, log
from .mw_verbs import HANDLERS as MW_HANDLERS
from .mw_verbs import bind_objects, clean_on_reset, refuse_bound
from .node_verbs import NodeVerbs
from .post_reply import reply_may_wait, send_queue_busy
from .post_wrs import post_each, post_sends
from .qp_caps import check_caps
from .shared_mr import op_reg_mr_shared
from .srq_verbs import SRQ_HANDLERS, srq_of
from .ud_verbs import UdVerbs

# mlx5dv_create_qp(3) create_flags modelled: signature pipelining, and disabling
# scatter to CQE (softhca never scatters into a CQE, so there is nothing to disable).
QP_CREATE_FLAGS = int(Mlx5dvQpCreateFlags.SIG_PIPELINING
                      | Mlx5dvQpCreateFlags.DISABLE_SCATTER_TO_CQE)

# Bytes of a max_frame kept for the reply's header (the client's chunking keeps as many).
READ_HEADROOM = 4096

# The requests that create an object (and so count against a session's object limit).
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


class Verbs(Mlx5dvVerbs, NodeVerbs, UdVerbs):
    """The verbs objects of one control session and the handlers of its requests (the
    mlx5dv ones are Mlx5dvVerbs', server/dv_verbs.py; those of the daemon's fault rules,
    counters and events NodeVerbs', server/node_verbs.py)."""

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

    def complete(self, cq: CQHost, wcs: list[WC]) -> None:
        """Completions of one of this session's QPs into ``cq``; on an overrun the CQ's
        context gets IBV_EVENT_CQ_ERR and every QP using the CQ goes to ERR, as a device
        that can no longer report their completions stops them."""
        overrun = cq.push(wcs)
        if cq.push_mode and cq.entries:
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

    def destroy_handle(self, handle: int, kind: str) -> dict:
        obj = self.get(handle, kind)
        self._destroy(kind, obj)
        del self.objects[handle]
        return {}

    # -- verbs: device and memory -------------------------------------------------------
    def op_devices(self, r: control.Devices, rid: int) -> dict | None:
        return {"devices": list(self.daemon.hcas)}

    def op_open_device(self, r: control.OpenDevice, rid: int) -> dict | None:
        hca = self.daemon.hcas.get(r.name)
        if hca is None:
            raise RDMAError("ENOENT", f"no device {r.name!r} on this daemon (it has "
                                      f"{', '.join(self.daemon.hcas)})")
        return {"ctx": self.add("ctx", hca), "name": hca.name}

    def op_query_device(self, r: control.QueryDevice, rid: int) -> dict | None:
        return {"attr": device_attr(self, self.get(r.ctx, "ctx"))}

    def op_close_device(self, r: control.CloseDevice, rid: int) -> dict | None:
        self.get(r.ctx, "ctx")
        # The context's crypto logins end with it, as libmlx5's do with the context.
        for handle, (kind, o) in list(self.objects.items()):
            if kind == "crypto_login" and o.ctx == r.ctx:
                self.destroy_handle(handle, "crypto_login")
        return self.destroy_handle(r.ctx, "ctx")

    def op_alloc_pd(self, r: control.AllocPd, rid: int) -> dict | None:
        hca = self.get(r.ctx, "ctx")
        pd = hca.alloc_pd()
        handle = self.add("pd", pd)
        self.ctx_of_pd[handle] = r.ctx
        return {"pd": handle}

    def op_dealloc_pd(self, r: control.DeallocPd, rid: int) -> dict | None:
        pd = self.get(r.pd, "pd")
        for kind, o in self.objects.values():
            if kind in ("mr", "mkey", "qp", "dek", "ah", "mw", "srq") and o.pd is pd:
                raise RDMAError("EBUSY", f"ibv_dealloc_pd: PD {r.pd} still has a {kind}")
        return self.destroy_handle(r.pd, "pd")

    def op_reg_mr(self, r: control.RegMr, rid: int) -> dict | None:
        pd = self.get(r.pd, "pd")
        n = r.length
        self.charge_registration(n)
        mr = pd.hca.reg_mr(pd, n, r.access)
        self.registered_bytes += n
        self.daemon.registered_bytes += n
        return {"mr": self.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
                "length": mr.length}

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

    def op_dereg_mr(self, r: control.DeregMr, rid: int) -> dict | None:
        refuse_bound(self.get(r.mr, "mr"))
        return self.destroy_handle(r.mr, "mr")

    def op_mr_write(self, r: control.MrWrite, rid: int) -> dict | None:
        mr: MR = self.get(r.mr, "mr")
        mr.write(r.data, r.offset)
        return {}

    def op_mr_read(self, r: control.MrRead, rid: int) -> dict | None:
        mr: MR = self.get(r.mr, "mr")
        # The reply is one frame: a read larger than the frame limit the daemon announced
        # in its welcome is refused before a byte is copied (the client reads in chunks).
        most = self.daemon.max_frame - READ_HEADROOM
        if r.length > most:
            raise RDMAError("EMSGSIZE", f"mr_read of {r.length} bytes: one reply carries "
                                        f"at most {most} (max_frame {self.daemon.max_frame})")
        return {"_payload": mr.read(r.length, r.offset)}

    # -- verbs: CQ and QP ---------------------------------------------------------------
    def op_create_cq(self, r: control.CreateCq, rid: int) -> dict | None:
        self.get(r.ctx, "ctx")
        if not 1 <= r.cqe <= MAX_CQE:
            raise einval(f"ibv_create_cq cqe {r.cqe} is outside [1, max_cqe {MAX_CQE}]")
        cq = CQHost(0, r.cqe, r.ctx, r.push)
        cq.handle = self.add("cq", cq)
        return {"cq": cq.handle, "cqe": r.cqe, "push": cq.push_mode}

    def op_destroy_cq(self, r: control.DestroyCq, rid: int) -> dict | None:
        cq = self.get(r.cq, "cq")
        for kind, o in self.objects.values():
            if kind == "qp" and (o.scq is cq or o.rcq is cq):
                raise RDMAError("EBUSY", f"ibv_destroy_cq: CQ {r.cq} is used by QP "
                                         f"{o.rcqp.qp_num:#x}")
        return self.destroy_handle(r.cq, "cq")

    def op_cq_credit(self, r: control.CqCredit, rid: int) -> dict | None:
        """The client polled pushed entries: give their room back. Checked whole before
        any is applied; accepted, it has no reply (the client does not wait for one)."""
        # r.credits holds one (handle, sum) per CQ (control.credits_from_wire).
        cqs = [(self.get(h, "cq"), n) for h, n in r.credits]
        for cq, n in cqs:
            if n > cq.pushed:
                cq.credit(n)        # raises EPROTO before anything is applied
        for cq, n in cqs:
            cq.credit(n)
        return None

    def op_poll_cq(self, r: control.PollCq, rid: int) -> dict | None:
        cq: CQHost = self.get(r.cq, "cq")
        # A pushed CQ keeps no entries here (they went to the client as they came), so
        # on it poll_cq returns none: with a timeout it is the client's wait for the
        # next completion held here, bounded by max_waits like any other, and answered
        # (after the "wc" frame) when one comes.
        if cq.entries or r.timeout <= 0:
            return {"wcs": [w.to_wire() for w in cq.take(r.num)]}
        self._room_to_wait("ibv_poll_cq")

        async def wait() -> None:
            await cq.wait(float(r.timeout))
            if not self.gone:
                self.session.reply(rid, wcs=[w.to_wire() for w in cq.take(r.num)])

        self._wait(wait())
        return None

    def _room_to_wait(self, verb: str) -> None:
        """A session holds at most ``max_waits`` waiting poll_cq and get_async_event
        requests: each is a task and a timer in the daemon, so past it ENOMEM, as a
        device out of resources answers (retry once one of them is answered)."""
        cap = self.daemon.limits.max_waits
        if len(self.waits) >= cap:
            raise RDMAError("ENOMEM", f"{verb}: this session already has {cap} requests "
                                      "waiting, the daemon's limit; retry when one returns")

    def _wait(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.waits.add(task)
        task.add_done_callback(self.waits.discard)

    def op_create_qp(self, r: control.CreateQp, rid: int) -> dict | None:
        pd: PD = self.get(r.pd, "pd")
        scq = self.get(r.scq, "cq")
        rcq = self.get(r.rcq, "cq")
        if r.qp_type not in (QpType.RC, QpType.UC, QpType.UD):
            raise RDMAError("EOPNOTSUPP", f"qp_type {r.qp_type}: IBV_QPT_RC, UC and UD are "
                                          "modelled")
        check_caps(r, self.daemon.limits.max_qp_wr)
        if r.qp_type != QpType.RC:
            return self.add_qp(self.create_datagram_qp(r, pd, scq, rcq), r.pd)
        create_flags = r.create_flags
        unmodelled = create_flags & ~QP_CREATE_FLAGS
        if unmodelled:
            names = [f.name for f in Mlx5dvQpCreateFlags if f & unmodelled] or [hex(unmodelled)]
            raise RDMAError("EOPNOTSUPP", "mlx5dv_create_qp: create_flags "
                                          f"{', '.join(names)} not modelled")
        srq = srq_of(self, r, pd)
        qpn = self.daemon.new_qpn()
        rcqp = RCQP(pd, qpn, sq_depth=r.max_send_wr, rq_depth=r.max_recv_wr,
                    sq_sig_all=r.sq_sig_all, max_inline_data=r.max_inline_data,
                    sig_pipelining=bool(create_flags & Mlx5dvQpCreateFlags.SIG_PIPELINING),
                    srq=srq)
        if srq is not None:
            srq.qps += 1
        builder = MkeyConfigureBuilder(pd, r.send_ops_flags, r.sq_sig_all)
        return self.add_qp(QPHost(self.session, 0, pd.hca, pd, rcqp, scq, rcq,
                                   r.max_send_sge, r.max_recv_sge, r.send_ops_flags, builder,
                                   self.complete, self.qp_event), r.pd)

    def op_destroy_qp(self, r: control.DestroyQp, rid: int) -> dict | None:
        return self.destroy_handle(r.qp, "qp")

    def op_modify_qp(self, r: control.ModifyQp, rid: int) -> dict | None:
        qph: QPHost = self.get(r.qp, "qp")
        attr = r.attr
        # No IBV_QP_STATE: a change within the current state, as mlx5 and rxe take it
        # (ib_modify_qp_is_ok); the engine checks it as the transition cur -> cur.
        if ("dest_host" in attr) != ("dest_port" in attr):
            raise einval("ibv_modify_qp: the peer's address (IBV_QP_AV) is dest_host and "
                         "dest_port together")
        # The mask's bits beside the fields sent (those that carry no value here); AV is
        # the peer's address, so only the address sets it.
        mask = r.mask & ~QpAttrMask.AV | qp_state.mask_of(attr)
        qph.rcqp.modify(attr, mask)
        if mask & QpAttrMask.AV:
            # The peer's daemon; this one when named by the address the session dialed.
            host, port = self.daemon.route(attr["dest_host"], attr["dest_port"],
                                           self.session.dialed)
            qph.dest = (host, port, attr.get("dest_dev", qph.hca.name))
            self.daemon.connect(qph, host, port)
        qph.attrs.update(attr)
        self.daemon.service(qph)
        clean_on_reset(qph)
        return {"state": int(qph.rcqp.state)}

    def op_query_qp(self, r: control.QueryQp, rid: int) -> dict | None:
        qph: QPHost = self.get(r.qp, "qp")
        q = qph.rcqp
        return {"attr": {"qp_state": int(q.state), "qp_num": q.qp_num, "dest_qp_num": q.dest_qp,
                         "path_mtu": qph.attrs.get("path_mtu", 0),
                         "timeout": qph.attrs.get("timeout", 0),
                         "retry_cnt": q.retry_cnt, "rnr_retry": q.rnr_retry,
                         "sq_sig_all": q.sq_sig_all, "qkey": getattr(q, "qkey", 0),
                         "dest": list(qph.dest) if qph.dest else None}}

    def op_post_send(self, r: control.PostSend, rid: int) -> dict | None:
        qph: QPHost = self.get(r.qp, "qp")
        wrs = r.wrs
        now = asyncio.get_running_loop().time()
        bind_objects(self, wrs)
        busy = send_queue_busy(qph)
        try:
            post_sends(qph, wrs, r.wr_complete, now, self.daemon.limits.max_msg_size,
                       self.resolve_ah)
        finally:
            self.daemon.service(qph)
        # The reply may go with the completion (server/post_reply.py).
        return {"_hold": True} if reply_may_wait(qph, wrs, busy) else {}

    def op_post_recv(self, r: control.PostRecv, rid: int) -> dict | None:
        qph: QPHost = self.get(r.qp, "qp")
        wrs = r.wrs
        def post(wr) -> None:
            if len(wr.sg) > qph.max_recv_sge:
                raise einval(f"it has {len(wr.sg)} SGEs, the QP's max_recv_sge is "
                             f"{qph.max_recv_sge}")
            qph.rcqp.post_recv(wr)
        try:
            post_each("ibv_post_recv", wrs, post)
        finally:
            self.daemon.service(qph)
        return {}

    # -- async events (ibv_get_async_event(3), ibv_ack_async_event(3)) ------------------
    def op_get_async_event(self, r: control.GetAsyncEvent, rid: int) -> dict | None:
        self.get(r.ctx, "ctx")
        ev = self.async_events.take(r.ctx)
        if ev is not None or r.timeout <= 0:
            return {"event": ev}
        self._room_to_wait("ibv_get_async_event")

        async def wait() -> None:
            found = await self.async_events.get(r.ctx, float(r.timeout))
            if not self.gone:
                self.session.reply(rid, event=found)

        self._wait(wait())
        return None

    def op_ack_async_event(self, r: control.AckAsyncEvent, rid: int) -> dict | None:
        self.async_events.ack(r.event)
        return {}


# The handler of each request type, called with the session's Verbs, the request and
# its id.
HANDLERS: dict[type[control.Request], Callable[[Any, Any, int], dict | None]] = {
    control.Devices: Verbs.op_devices,
    control.OpenDevice: Verbs.op_open_device,
    control.QueryDevice: Verbs.op_query_device,
    control.CloseDevice: Verbs.op_close_device,
    control.AllocPd: Verbs.op_alloc_pd,
    control.DeallocPd: Verbs.op_dealloc_pd,
    control.RegMr: Verbs.op_reg_mr,
    control.RegMrShared: op_reg_mr_shared,
    control.DeregMr: Verbs.op_dereg_mr,
    control.MrWrite: Verbs.op_mr_write,
    control.MrRead: Verbs.op_mr_read,
    control.CreateCq: Verbs.op_create_cq,
    control.DestroyCq: Verbs.op_destroy_cq,
    control.CqCredit: Verbs.op_cq_credit,
    control.PollCq: Verbs.op_poll_cq,
    control.CreateQp: Verbs.op_create_qp,
    control.DestroyQp: Verbs.op_destroy_qp,
    control.CreateAh: UdVerbs.op_create_ah,
    control.DestroyAh: UdVerbs.op_destroy_ah,
    control.ModifyQp: Verbs.op_modify_qp,
    control.QueryQp: Verbs.op_query_qp,
    control.PostSend: Verbs.op_post_send,
    control.PostRecv: Verbs.op_post_recv,
    control.CreateMkey: Mlx5dvVerbs.op_create_mkey,
    control.DestroyMkey: Mlx5dvVerbs.op_destroy_mkey,
    control.MkeyConfigure: Mlx5dvVerbs.op_mkey_configure,
    control.MkeyCheck: Mlx5dvVerbs.op_mkey_check,
    control.CreateDek: Mlx5dvVerbs.op_create_dek,
    control.DestroyDek: Mlx5dvVerbs.op_destroy_dek,
    control.QueryDek: Mlx5dvVerbs.op_query_dek,
    control.QueryMlx5Device: Mlx5dvVerbs.op_query_mlx5_device,
    control.CryptoLoginReq: Mlx5dvVerbs.op_crypto_login,
    control.CryptoLoginQueryState: Mlx5dvVerbs.op_crypto_login_query_state,
    control.CryptoLogout: Mlx5dvVerbs.op_crypto_logout,
    control.CreateCryptoLogin: Mlx5dvVerbs.op_create_crypto_login,
    control.CryptoLoginQuery: Mlx5dvVerbs.op_crypto_login_query,
    control.GetAsyncEvent: Verbs.op_get_async_event,
    control.AckAsyncEvent: Verbs.op_ack_async_event,
    control.CancelPostedSendWrs: Mlx5dvVerbs.op_cancel_posted_send_wrs,
    control.DestroyCryptoLogin: Mlx5dvVerbs.op_destroy_crypto_login,
    control.FaultsAdd: NodeVerbs.op_faults_add,
    control.FaultsList: NodeVerbs.op_faults_list,
    control.FaultsClear: NodeVerbs.op_faults_clear,
    control.Counters: NodeVerbs.op_counters,
    control.Subscribe: NodeVerbs.op_subscribe,
    **CM_HANDLERS,
    **MW_HANDLERS,
    **SRQ_HANDLERS,
}
