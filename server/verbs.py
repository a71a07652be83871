"""The verbs side of a control session: the objects an application's calls created, and
one handler per control request (``op_<verb>``, schemas in protocol/control.py).

A handler gets the request's checked fields, its payload and its id, and returns the
reply's fields (``_payload`` for bytes), or None when it answers later itself (a
``poll_cq`` that waits). It raises RDMAError to refuse; the session (server/session.py)
turns that into the error reply. Reading, writing and back-pressure are the session's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

from ..engine import qp_state
from ..engine.crypto_login import DEK_INIT_ATTR_CRYPTO_LOGIN, CryptoLogin, login
from ..engine.hca import DEK, HCA, MAX_MR_SIZE, MR, PD
from ..engine.mkey import MKey
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..engine.rc import RCQP
from ..protocol import control
from ..protocol.attrs import DEKInitAttr, MkeyConfAttr
from ..protocol.enums import (
    CryptoLoginState,
    EventType,
    Mlx5dvQpCreateFlags,
    QpAttrMask,
    QpState,
    QpType,
    WcOpcode,
)
from ..protocol.errors import RDMAError, einval
from ..protocol.frames import FrameError
from ..protocol.records import WC, RecvWR, SendWR
from ..protocol.session import credits_from_wire
from .async_events import AsyncEvents, wait_woken, wake
from .logs import kv, log

if TYPE_CHECKING:
    from .daemon import Daemon
    from .session import ControlSession

# ibv_query_device(3) max_cqe: the most entries a CQ may be created with.
MAX_CQE = 1 << 22

# mlx5dv_create_qp(3) create_flags modelled: signature pipelining, and disabling
# scatter to CQE (softhca never scatters into a CQE, so there is nothing to disable).
QP_CREATE_FLAGS = int(Mlx5dvQpCreateFlags.SIG_PIPELINING
                      | Mlx5dvQpCreateFlags.DISABLE_SCATTER_TO_CQE)

# Layout entries (SGEs and interleaved entries) one mkey_configure request may carry:
# decoding and checking them is one stretch of the event loop (some 5 ms at this size).
MAX_CONFIGURE_ENTRIES = 4096


def _layout_entries(kind: str, value: Any) -> int:
    """The entries a layout setter's wire value carries (0 if malformed: the decoder says
    why): a list of SGEs, or [repeat_count, entries]."""
    if kind == "layout_interleaved":
        value = value[1] if isinstance(value, list) and len(value) == 2 else None
    return len(value) if isinstance(value, list) else 0


# Bytes of a max_frame kept for the reply's header (the client's chunking keeps as many).
READ_HEADROOM = 4096

# mlx5dv.h enum mlx5dv_context_comp_mask: crypto_caps is filled.
MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD = 1 << 13


# -- server-side objects -------------------------------------------------------------

class CQHost:
    """A completion queue: completions in, polls out; a poll may wait for the first.

    A pushed CQ (create_cq ``push``) sends its completions to the session as they are
    made (server/session.py ``push_wcs``) and keeps none here; ``pushed`` counts those
    the application has not polled yet (the client returns them with cq_credit), so the
    CQ's cqe bounds them exactly as it bounds ``entries``: a client that never polls
    overruns the CQ as one that never calls ibv_poll_cq(3) does."""

    def __init__(self, handle: int, cqe: int, ctx: int = 0, push: bool = False) -> None:
        self.handle = handle
        self.cqe = cqe
        # The session's handle of the context the CQ was created on (its async events).
        self.ctx = ctx
        self.entries: deque[WC] = deque()
        self._waiters: set[asyncio.Future] = set()
        self.overruns = 0
        self.error = False
        self.push_mode = push
        # Entries pushed to the client and not yet credited back (polled there).
        self.pushed = 0

    def push(self, wcs: list[WC]) -> bool:
        """Queue ``wcs``; True when this overran the CQ. ibv_create_cq(3): the CQ holds
        cqe entries; completions past them are an overrun, and as on a device the CQ
        goes to error and takes no more (IBV_EVENT_CQ_ERR, ibv_get_async_event(3)), so
        a CQ nobody polls costs cqe entries, never more. A pushed CQ's entries are
        taken back out at once by the caller (``take_pushed``)."""
        if self.error:
            self.overruns += 1
            return False
        room = self.cqe - len(self.entries) - self.pushed
        overrun = len(wcs) > room
        self.entries.extend(wcs[:room] if overrun else wcs)
        if overrun:
            self.overruns += 1
            self.error = True
        wake(self._waiters)
        return overrun

    def take_pushed(self) -> list[WC]:
        """The entries to send to the client now; they count as pushed until credited."""
        out = list(self.entries)
        self.entries.clear()
        self.pushed += len(out)
        return out

    def credit(self, n: int) -> None:
        """The client polled ``n`` pushed entries: their room is free again. More than
        were pushed is a broken client (EPROTO), refused whole."""
        if n > self.pushed:
            raise RDMAError("EPROTO", f"cq_credit: {n} entries of CQ {self.handle} credited, "
                                      f"{self.pushed} were pushed and not credited")
        self.pushed -= n

    def take(self, num: int) -> list[WC]:
        return [self.entries.popleft() for _ in range(min(num, len(self.entries)))]

    async def wait(self, timeout: float) -> None:
        if self.entries or timeout <= 0:
            return
        await wait_woken(self._waiters, timeout)


@dataclasses.dataclass(eq=False)
class QPHost:
    session: ControlSession
    handle: int
    hca: HCA
    pd: PD
    rcqp: RCQP
    scq: CQHost
    rcq: CQHost
    max_send_sge: int
    max_recv_sge: int
    send_ops_flags: int
    builder: MkeyConfigureBuilder
    dest: tuple[str, int, str] | None = None
    # Where its peer's packets may come from (Daemon.set_origins): none until connected.
    origins: frozenset = frozenset()
    timer: asyncio.TimerHandle | None = None
    timer_at: float | None = None
    # Whether the daemon has seen this QP in ERR (its flushed WRs' memory freed).
    flushed: bool = False
    attrs: dict = dataclasses.field(default_factory=dict)
    # The session's handle of the context the QP was created on: its async events go there.
    ctx: int = 0


# The verbs that create an object (and so count against a session's object limit).
_CREATORS = frozenset(["open_device", "alloc_pd", "reg_mr", "create_cq", "create_qp",
                       "create_mkey", "create_dek", "crypto_login", "create_crypto_login"])


@dataclasses.dataclass(eq=False)
class _LoginEntry:
    """A crypto login of one context: its session (mlx5dv_crypto_login, ``api``
    "session") or its object (mlx5dv_crypto_login_create, "object")."""

    ctx: int
    api: str
    login: CryptoLogin


class Verbs:
    """The verbs objects of one control session and the handlers of its requests."""

    def __init__(self, daemon: Daemon, session: ControlSession) -> None:
        self.daemon = daemon
        self.session = session
        self.peer = session.peer
        self.objects: dict[int, tuple[str, Any]] = {}
        self._handles = itertools.count(1)
        # poll_cq requests waiting for a completion.
        self._waits: set[asyncio.Task] = set()
        self.gone = False
        self.registered_bytes = 0
        # ibv_get_async_event(3): per context; a PD's context names a QP's.
        self.async_events = AsyncEvents()
        self.ctx_of_pd: dict[int, int] = {}

    def call(self, verb: str, a: dict, payload: memoryview, rid: int) -> dict | None:
        """Run ``op_<verb>``; its reply's fields, or None if it replies later."""
        # Checked before the engine allocates anything, so a refusal leaks nothing.
        if verb in _CREATORS and len(self.objects) >= self.daemon.limits.max_objects:
            raise RDMAError("ENOMEM", f"{verb}: this session holds {len(self.objects)} "
                                      "objects, the daemon's limit per session")
        return getattr(self, f"op_{verb}")(a, payload, rid)

    # -- object table -------------------------------------------------------------------
    def add(self, kind: str, obj: Any) -> int:
        handle = next(self._handles)
        self.objects[handle] = (kind, obj)
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

    def destroy_all(self) -> None:
        """The session ended: its objects go, as when a process exits (docs/architecture.md)."""
        if self.gone:
            return
        self.gone = True
        if self.session in self.daemon.subscribers:
            self.daemon.subscribe(self.session, set())
        self.daemon.faults.drop_owner(self.session)
        for t in self._waits:
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
        if kind == "qp":
            obj.rcqp.modify_to_err()
            if obj.timer is not None:
                obj.timer.cancel()
            d.forget_qp(obj)
        elif kind == "mr":
            obj.pd.hca.dereg_mr(obj)
            self.registered_bytes -= obj.length
            self.daemon.registered_bytes -= obj.length
        elif kind == "mkey":
            obj.pd.hca.destroy_mkey(obj)
        elif kind == "dek":
            obj.pd.hca.destroy_dek(obj)
        elif kind == "pd":
            obj.hca.pds.pop(obj.handle, None)

    def _destroy_handle(self, handle: int, kind: str) -> dict:
        obj = self.get(handle, kind)
        self._destroy(kind, obj)
        del self.objects[handle]
        return {}

    # -- verbs: device and memory -------------------------------------------------------
    def op_devices(self, a, payload, rid):
        return {"devices": list(self.daemon.hcas)}

    def op_open_device(self, a, payload, rid):
        hca = self.daemon.hcas.get(a["name"])
        if hca is None:
            raise RDMAError("ENOENT", f"no device {a['name']!r} on this daemon (it has "
                                      f"{', '.join(self.daemon.hcas)})")
        return {"ctx": self.add("ctx", hca), "name": hca.name}

    def op_query_device(self, a, payload, rid):
        hca = self.get(a["ctx"], "ctx")
        lim = self.daemon.limits
        return {"attr": {"fw_ver": "softhca-1", "vendor_id": 0x02C9, "vendor_part_id": 4123,
                         "max_qp": 1 << 16, "max_qp_wr": lim.max_qp_wr,
                         "max_msg_sz": lim.max_msg_size, "max_sge": control.MAX_SGE,
                         "max_cqe": MAX_CQE, "max_mr_size": MAX_MR_SIZE, "max_pd": 1 << 16,
                         "max_qp_rd_atom": 16, "phys_port_cnt": 1, "node_guid": hash(hca.name)
                         & 0xFFFFFFFFFFFF}}

    def op_close_device(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        # The context's crypto logins end with it, as libmlx5's do with the context.
        for handle, (kind, o) in list(self.objects.items()):
            if kind == "crypto_login" and o.ctx == a["ctx"]:
                self._destroy_handle(handle, "crypto_login")
        return self._destroy_handle(a["ctx"], "ctx")

    def op_alloc_pd(self, a, payload, rid):
        hca = self.get(a["ctx"], "ctx")
        pd = hca.alloc_pd()
        handle = self.add("pd", pd)
        self.ctx_of_pd[handle] = a["ctx"]
        return {"pd": handle}

    def op_dealloc_pd(self, a, payload, rid):
        pd = self.get(a["pd"], "pd")
        for kind, o in self.objects.values():
            if kind in ("mr", "mkey", "qp", "dek") and o.pd is pd:
                raise RDMAError("EBUSY", f"ibv_dealloc_pd: PD {a['pd']} still has a {kind}")
        return self._destroy_handle(a["pd"], "pd")

    def op_reg_mr(self, a, payload, rid):
        pd = self.get(a["pd"], "pd")
        lim, n = self.daemon.limits, a["length"]
        if self.registered_bytes + n > lim.max_session_bytes:
            raise RDMAError("ENOMEM", f"ibv_reg_mr of {n} bytes: this session has "
                                      f"{self.registered_bytes} registered, its limit is "
                                      f"{lim.max_session_bytes}")
        if self.daemon.registered_bytes + n > lim.max_daemon_bytes:
            raise RDMAError("ENOMEM", f"ibv_reg_mr of {n} bytes: the daemon has "
                                      f"{self.daemon.registered_bytes} registered, its limit "
                                      f"is {lim.max_daemon_bytes}")
        mr = pd.hca.reg_mr(pd, n, a["access"])
        self.registered_bytes += n
        self.daemon.registered_bytes += n
        return {"mr": self.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
                "length": mr.length}

    def op_dereg_mr(self, a, payload, rid):
        return self._destroy_handle(a["mr"], "mr")

    def op_mr_write(self, a, payload, rid):
        mr: MR = self.get(a["mr"], "mr")
        mr.write(payload, a["offset"])
        return {}

    def op_mr_read(self, a, payload, rid):
        mr: MR = self.get(a["mr"], "mr")
        # The reply is one frame: a read larger than the frame limit the daemon announced
        # in its welcome is refused before a byte is copied (the client reads in chunks).
        most = self.daemon.max_frame - READ_HEADROOM
        if a["length"] > most:
            raise RDMAError("EMSGSIZE", f"mr_read of {a['length']} bytes: one reply carries "
                                        f"at most {most} (max_frame {self.daemon.max_frame})")
        return {"_payload": mr.read(a["length"], a["offset"])}

    # -- verbs: CQ and QP ---------------------------------------------------------------
    def op_create_cq(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        if not 1 <= a["cqe"] <= MAX_CQE:
            raise einval(f"ibv_create_cq cqe {a['cqe']} is outside [1, max_cqe {MAX_CQE}]")
        cq = CQHost(0, a["cqe"], a["ctx"], bool(a["push"]))
        cq.handle = self.add("cq", cq)
        return {"cq": cq.handle, "cqe": a["cqe"], "push": cq.push_mode}

    def op_destroy_cq(self, a, payload, rid):
        cq = self.get(a["cq"], "cq")
        for kind, o in self.objects.values():
            if kind == "qp" and (o.scq is cq or o.rcq is cq):
                raise RDMAError("EBUSY", f"ibv_destroy_cq: CQ {a['cq']} is used by QP "
                                         f"{o.rcqp.qp_num:#x}")
        return self._destroy_handle(a["cq"], "cq")

    def op_cq_credit(self, a, payload, rid):
        """The client polled pushed entries: give their room back. Checked whole before
        any is applied; accepted, it has no reply (the client does not wait for one)."""
        total = credits_from_wire(a["credits"], MAX_CQE)
        cqs = [(self.get(h, "cq"), n) for h, n in total.items()]
        for cq, n in cqs:
            if n > cq.pushed:
                cq.credit(n)        # raises EPROTO before anything is applied
        for cq, n in cqs:
            cq.credit(n)
        return None

    def op_poll_cq(self, a, payload, rid):
        cq: CQHost = self.get(a["cq"], "cq")
        # A pushed CQ keeps no entries here (they went to the client as they came), so
        # on it poll_cq returns none: with a timeout it is the client's wait for the
        # next completion held here, bounded by max_waits like any other, and answered
        # (after the "wc" frame) when one comes.
        if cq.entries or a["timeout"] <= 0:
            return {"wcs": [w.to_wire() for w in cq.take(a["num"])]}
        self._room_to_wait("ibv_poll_cq")

        async def wait() -> None:
            await cq.wait(float(a["timeout"]))
            if not self.gone:
                self.session.reply(rid, wcs=[w.to_wire() for w in cq.take(a["num"])])

        self._wait(wait())
        return None

    def _room_to_wait(self, verb: str) -> None:
        """A session holds at most ``max_waits`` waiting poll_cq and get_async_event
        requests: each is a task and a timer in the daemon, so past it ENOMEM, as a
        device out of resources answers (retry once one of them is answered)."""
        cap = self.daemon.limits.max_waits
        if len(self._waits) >= cap:
            raise RDMAError("ENOMEM", f"{verb}: this session already has {cap} requests "
                                      "waiting, the daemon's limit; retry when one returns")

    def _wait(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    def op_create_qp(self, a, payload, rid):
        pd: PD = self.get(a["pd"], "pd")
        scq = self.get(a["scq"], "cq")
        rcq = self.get(a["rcq"], "cq")
        if a["qp_type"] != QpType.RC:
            raise RDMAError("EOPNOTSUPP", f"qp_type {a['qp_type']}: only IBV_QPT_RC is modelled")
        cap = self.daemon.limits.max_qp_wr
        for name in ("max_send_wr", "max_recv_wr"):
            if a[name] > cap:
                raise einval(f"ibv_create_qp: cap.{name} {a[name]} exceeds the device's "
                             f"max_qp_wr {cap}")
        create_flags = a["create_flags"] or 0
        unmodelled = create_flags & ~QP_CREATE_FLAGS
        if unmodelled:
            names = [f.name for f in Mlx5dvQpCreateFlags if f & unmodelled] or [hex(unmodelled)]
            raise RDMAError("EOPNOTSUPP", "mlx5dv_create_qp: create_flags "
                                          f"{', '.join(names)} not modelled")
        qpn = self.daemon.new_qpn()
        rcqp = RCQP(pd, qpn, sq_depth=a["max_send_wr"], rq_depth=a["max_recv_wr"],
                    sq_sig_all=a["sq_sig_all"], max_inline_data=a["max_inline_data"],
                    sig_pipelining=bool(create_flags & Mlx5dvQpCreateFlags.SIG_PIPELINING))
        builder = MkeyConfigureBuilder(pd, a["send_ops_flags"], a["sq_sig_all"])
        qph = QPHost(self.session, 0, pd.hca, pd, rcqp, scq, rcq, a["max_send_sge"], a["max_recv_sge"],
                     a["send_ops_flags"], builder)
        qph.handle = self.add("qp", qph)
        qph.ctx = self.ctx_of_pd.get(a["pd"], 0)
        self.daemon.qps[(pd.hca.name, qpn)] = qph
        if self.daemon._wants("trace"):
            rcqp.trace = self.daemon._trace_hook(qph)
        return {"qp": qph.handle, "qp_num": qpn}

    def op_destroy_qp(self, a, payload, rid):
        return self._destroy_handle(a["qp"], "qp")

    def op_modify_qp(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        attr = control.check_fields({"t": "modify_qp.attr", **a["attr"]}, control.QP_ATTR,
                                    "modify_qp attr")
        attr = {k: v for k, v in attr.items() if v is not None}
        if "qp_state" not in attr:
            raise einval("ibv_modify_qp: attr.qp_state is required (IBV_QP_STATE)")
        if ("dest_host" in attr) != ("dest_port" in attr):
            raise einval("ibv_modify_qp: the peer's address (IBV_QP_AV) is dest_host and "
                         "dest_port together")
        # The mask's bits beside the fields sent (those that carry no value here); AV is
        # the peer's address, so only the address sets it.
        mask = a["mask"] & ~QpAttrMask.AV | qp_state.mask_of(attr)
        qph.rcqp.modify(attr, mask)
        if mask & QpAttrMask.AV:
            qph.dest = (attr["dest_host"], attr["dest_port"], attr.get("dest_dev", qph.hca.name))
            self.daemon.set_origins(qph, attr["dest_host"], attr["dest_port"])
            # Open the link now, so the first packet does not spend its ACK timeout on
            # TCP and HELLO set-up.
            self.daemon.link_to(attr["dest_host"], attr["dest_port"])
        qph.attrs.update(attr)
        self.daemon.service(qph)
        return {"state": int(qph.rcqp.state)}

    def op_query_qp(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        q = qph.rcqp
        return {"attr": {"qp_state": int(q.state), "qp_num": q.qp_num, "dest_qp_num": q.dest_qp,
                         "path_mtu": qph.attrs.get("path_mtu", 0),
                         "timeout": qph.attrs.get("timeout", 0),
                         "retry_cnt": q.retry_cnt, "rnr_retry": q.rnr_retry,
                         "sq_sig_all": q.sq_sig_all,
                         "dest": list(qph.dest) if qph.dest else None}}

    def op_post_send(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        # Decoded whole first: a malformed WR refuses the request and posts nothing.
        wrs = [SendWR.from_wire(w, f"send_wr[{i}]") for i, w in enumerate(a["wrs"])]
        now = asyncio.get_running_loop().time()
        try:
            for i, wr in enumerate(wrs):
                if len(wr.sg) > qph.max_send_sge:
                    raise einval(f"send WR {i} has {len(wr.sg)} SGEs, the QP's max_send_sge "
                                 f"is {qph.max_send_sge}")
                size = sum(s.length for s in wr.sg)
                if size > self.daemon.limits.max_msg_size:
                    raise einval(f"send WR {i} moves {size} bytes, the port's max_msg_sz is "
                                 f"{self.daemon.limits.max_msg_size}")
                try:
                    qph.rcqp.post_send(wr, now)
                except RDMAError as e:
                    raise RDMAError(e.errno_name, f"ibv_post_send: WR {i} (wr_id {wr.wr_id}): "
                                                  f"{e.message}") from None
        finally:
            self.daemon.service(qph)
        return {}

    def op_post_recv(self, a, payload, rid):
        qph: QPHost = self.get(a["qp"], "qp")
        wrs = [RecvWR.from_wire(w, f"recv_wr[{i}]") for i, w in enumerate(a["wrs"])]
        try:
            for i, wr in enumerate(wrs):
                if len(wr.sg) > qph.max_recv_sge:
                    raise einval(f"recv WR {i} has {len(wr.sg)} SGEs, the QP's max_recv_sge "
                                 f"is {qph.max_recv_sge}")
                qph.rcqp.post_recv(wr)
        finally:
            self.daemon.service(qph)
        return {}

    # -- fault injection and counters (the daemon's, not the session's) ----------------
    def op_faults_add(self, a, payload, rid):
        # A session's rule matches its own QPs and goes with it (issue 13); one that
        # reaches every session's traffic is asked for by name.
        wide = bool(a["daemon_wide"])
        rule = self.daemon.faults.add(a["rule"], owner=None if wide else self.session)
        log.info("fault rule added %s", kv(event="fault_add", peer=self.peer, id=rule.id,
                                            daemon_wide=wide, rule=rule.spec))
        return {"rule": rule.as_dict()}

    def op_faults_list(self, a, payload, rid):
        return {"rules": self.daemon.faults.list(self.session)}

    def op_faults_clear(self, a, payload, rid):
        n = self.daemon.faults.clear(a["rule_id"], self.session, bool(a["daemon_wide"]))
        log.info("fault rules cleared %s", kv(event="fault_clear", peer=self.peer, n=n))
        return {"cleared": n}

    def op_subscribe(self, a, payload, rid):
        kinds = set(a["events"])
        unknown = kinds - {"packets", "trace"}
        if unknown or not all(isinstance(k, str) for k in kinds):
            raise einval(f"subscribe: unknown event kind(s) {sorted(map(str, unknown))}; "
                         "the kinds are 'packets' and 'trace'")
        self.daemon.subscribe(self.session, kinds, bool(a["daemon_wide"]))
        if a["daemon_wide"] and kinds:
            log.info("daemon-wide tap %s", kv(event="subscribe_daemon_wide", peer=self.peer,
                                               kinds=",".join(sorted(kinds))))
        return {"events": sorted(kinds), "daemon_wide": bool(a["daemon_wide"])}

    def op_counters(self, a, payload, rid):
        return {"counters": self.daemon.stats()}

    # -- mlx5dv: MKEYs and DEKs ---------------------------------------------------------
    def op_create_mkey(self, a, payload, rid):
        pd: PD = self.get(a["pd"], "pd")
        mkey = pd.hca.create_mkey(pd, a["create_flags"], a["max_entries"])
        return {"mkey": self.add("mkey", mkey), "lkey": mkey.lkey, "rkey": mkey.rkey}

    def op_destroy_mkey(self, a, payload, rid):
        return self._destroy_handle(a["mkey"], "mkey")

    def op_mkey_check(self, a, payload, rid):
        mkey: MKey = self.get(a["mkey"], "mkey")
        err = mkey.mkey_check()
        return {"err_type": int(err.err_type), "actual_value": int(err.actual_value),
                "expected_value": int(err.expected_value), "offset": int(err.offset)}

    def op_mkey_configure(self, a, payload, rid):
        """mlx5dv_wr_mkey_configure(3) and its setters, replayed between ibv_wr_start and
        ibv_wr_complete: the batch is validated whole and applied whole, or not at all."""
        qph: QPHost = self.get(a["qp"], "qp")
        calls = []
        entries = 0
        for i, c in enumerate(a["calls"]):
            what = f"mkey_configure call {i}"
            if not isinstance(c, list) or not c:
                raise FrameError("EPROTO", f"{what} must be a non-empty list")
            if c[0] == "configure":
                if len(c) != len(control.CONFIGURE_CALL):
                    raise FrameError("EPROTO", f"{what}: configure takes wr_id, wr_flags, "
                                               "mkey, num_setters, conf_flags, comp_mask")
                names = ("wr_id", "wr_flags", "mkey", "num_setters", "conf_flags", "comp_mask")
                v = control.check_fields({"t": what, **dict(zip(names, c[1:], strict=True))},
                                         dict(zip(names, control.CONFIGURE_CALL[1:],
                                                  strict=True)), what)
                calls.append(("configure", v, self.get(v["mkey"], "mkey")))
            elif len(c) == 2:
                if c[0] in ("layout_list", "layout_interleaved"):
                    entries += _layout_entries(c[0], c[1])
                    if entries > MAX_CONFIGURE_ENTRIES:
                        raise einval(f"{what}: more than {MAX_CONFIGURE_ENTRIES} layout "
                                     "entries in one mkey_configure request (post the WRs "
                                     "in several)")
                kind, value = control.setter_from_wire(c[0], c[1], what)
                if kind == "crypto" and value.dek is not None:
                    value = dataclasses.replace(value, dek=self.get(value.dek, "dek"))
                calls.append((kind, value, None))
            else:
                raise FrameError("EPROTO", f"{what}: a setter is [kind, value]")
        q = qph.rcqp
        # In ERR the WRs are built and then flushed by the send queue (RCQP.post_local).
        qp_state.require("ibv_wr_mkey_configure", q.state)
        b = qph.builder
        b.wr_start()
        for kind, value, mkey in calls:
            if kind == "configure":
                b.wr_id, b.wr_flags = value["wr_id"], value["wr_flags"]
                b.wr_mkey_configure(mkey, value["num_setters"],
                                    MkeyConfAttr(conf_flags=value["conf_flags"],
                                                 comp_mask=value["comp_mask"]))
            elif kind == "layout_interleaved":
                b.wr_set_mkey_layout_interleaved(*value)
            else:
                getattr(b, f"wr_set_mkey_{kind}")(value)
        posted = b.wr_complete()
        now = asyncio.get_running_loop().time()
        for p in posted:
            q.post_local(p.wr_id, p.signaled, WcOpcode.DRIVER1, now=now)
        self.daemon.service(qph)
        return {"posted": len(posted)}

    def op_create_dek(self, a, payload, rid):
        hca: HCA = self.get(a["ctx"], "ctx")
        pd: PD = self.get(a["pd"], "pd")
        if pd.hca is not hca:
            raise einval("mlx5dv_dek_create: the PD belongs to another device")
        lg = None
        comp_mask = a["comp_mask"] or 0
        if a["crypto_login"]:
            entry: _LoginEntry = self.get(a["crypto_login"], "crypto_login")
            if entry.api != "object" or entry.ctx != a["ctx"]:
                raise einval("mlx5dv_dek_create: crypto_login is not a crypto login object of "
                             "this context (mlx5dv_crypto_login_create)")
            lg = entry.login
        elif not comp_mask & DEK_INIT_ATTR_CRYPTO_LOGIN:
            session = self._login_entry(a["ctx"], "session")
            lg = session.login if session else None
        dek = hca.create_dek(DEKInitAttr(key_size=a["key_size"], key=a["key"],
                                         has_keytag=a["has_keytag"], keytag=a["keytag"],
                                         key_purpose=a["key_purpose"], pd=pd,
                                         opaque=a["opaque"] or b"", comp_mask=comp_mask,
                                         crypto_login=lg if a["crypto_login"] else None),
                             session_login=lg)
        # The session's handle names it to the client; the engine keeps its own.
        return {"dek": self.add("dek", dek)}

    def op_query_dek(self, a, payload, rid):
        """mlx5dv_dek_query(3): a wrapped DEK is queried only inside a valid crypto login
        (a session or an object of this session on the DEK's device)."""
        dek: DEK = self.get(a["dek"], "dek")
        if dek.wrapped and not any(
                kind == "crypto_login" and o.login.state == CryptoLoginState.VALID
                and self.objects.get(o.ctx, (None, None))[1] is dek.pd.hca
                for kind, o in self.objects.values()):
            raise einval("mlx5dv_dek_query: a wrapped DEK is queried only in a valid crypto "
                         "login session or with a valid crypto login object")
        return {"state": int(dek.state), "opaque": dek.opaque}

    # -- mlx5dv: device caps and crypto login (mlx5dv_query_device(3),
    # mlx5dv_crypto_login(3), mlx5dv_crypto_login_create(3)) ---------------------------
    def op_query_mlx5_device(self, a, payload, rid):
        hca: HCA = self.get(a["ctx"], "ctx")
        return {"attr": {"version": 1, "flags": 0,
                         "comp_mask": MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD,
                         "crypto_caps": hca.crypto.caps()}}

    def _login_entry(self, ctx: int, api: str) -> _LoginEntry | None:
        for kind, o in self.objects.values():
            if kind == "crypto_login" and o.ctx == ctx and o.api == api:
                return o
        return None

    def _new_login(self, a, api: str, verb: str) -> int:
        hca: HCA = self.get(a["ctx"], "ctx")
        if self._login_entry(a["ctx"], api) is not None:
            raise RDMAError("EEXIST", f"{verb}: this context already has a crypto login "
                                      f"{'session' if api == 'session' else 'object'}")
        lg = login(hca.crypto, a["credential"], a["import_kek_id"], a["credential_id"] or 0,
                   a["comp_mask"] or 0, verb)
        return self.add("crypto_login", _LoginEntry(a["ctx"], api, lg))

    def op_crypto_login(self, a, payload, rid):
        self._new_login(a, "session", "mlx5dv_crypto_login")
        return {}

    def op_crypto_login_query_state(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        entry = self._login_entry(a["ctx"], "session")
        return {"state": int(entry.login.state if entry else CryptoLoginState.NO_LOGIN)}

    def op_crypto_logout(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        for handle, (kind, o) in list(self.objects.items()):
            if kind == "crypto_login" and o.ctx == a["ctx"] and o.api == "session":
                return self._destroy_handle(handle, "crypto_login")
        raise RDMAError("ENOENT", "mlx5dv_crypto_logout: no crypto login session exists on "
                                  "this context")

    def op_create_crypto_login(self, a, payload, rid):
        return {"login": self._new_login(a, "object", "mlx5dv_crypto_login_create")}

    def op_crypto_login_query(self, a, payload, rid):
        entry: _LoginEntry = self.get(a["login"], "crypto_login")
        return {"state": int(entry.login.state)}

    def op_destroy_crypto_login(self, a, payload, rid):
        entry: _LoginEntry = self.get(a["login"], "crypto_login")
        if entry.api != "object":
            raise einval("mlx5dv_crypto_login_destroy: that is a login session; end it with "
                         "mlx5dv_crypto_logout")
        return self._destroy_handle(a["login"], "crypto_login")

    # -- async events (ibv_get_async_event(3), ibv_ack_async_event(3)) ------------------
    def op_get_async_event(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        ev = self.async_events.take(a["ctx"])
        if ev is not None or a["timeout"] <= 0:
            return {"event": ev}
        self._room_to_wait("ibv_get_async_event")

        async def wait() -> None:
            found = await self.async_events.get(a["ctx"], float(a["timeout"]))
            if not self.gone:
                self.session.reply(rid, event=found)

        self._wait(wait())
        return None

    def op_ack_async_event(self, a, payload, rid):
        self.async_events.ack(a["event"])
        return {}

    def op_cancel_posted_send_wrs(self, a, payload, rid):
        """mlx5dv_qp_cancel_posted_send_wrs(3): the number of WRs canceled."""
        qph: QPHost = self.get(a["qp"], "qp")
        n = qph.rcqp.cancel_posted_send_wrs(a["wr_id"])
        self.daemon.service(qph)
        return {"canceled": n}

    def op_destroy_dek(self, a, payload, rid):
        return self._destroy_handle(a["dek"], "dek")
