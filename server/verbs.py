"""The verbs side of a control session: the objects an application's calls created, and
one handler per control request (``op_<verb>``, schemas in protocol/control.py).

A handler gets the request's checked fields, its payload and its id, and returns the
reply's fields (``_payload`` for bytes), or None when it answers later itself (a
``poll_cq`` that waits). It raises RDMAError to refuse; the session (server/session.py)
turns that into the error reply. Reading, writing and back-pressure are the session's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

from ..engine.hca import HCA, MR, PD
from ..engine.mkey import MKey
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..engine.rc import RCQP
from ..protocol import control
from ..protocol.attrs import DEKInitAttr, MkeyConfAttr
from ..protocol.enums import Mtu, QpState, QpType, WcOpcode
from ..protocol.errors import RDMAError, einval
from ..protocol.frames import FrameError
from ..protocol.records import WC, RecvWR, SendWR
from .logs import kv, log

if TYPE_CHECKING:
    from .daemon import Daemon
    from .session import ControlSession

# ibv_modify_qp(3), min_rnr_timer: the IBTA encoding of the RNR NAK timer, in ms.
RNR_TIMER_MS = (655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48,
                0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
                40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52)


def ack_timeout_s(timeout: int) -> float:
    """ibv_modify_qp(3): the local ACK timeout is 4.096 us * 2^timeout; 0 means infinite."""
    return 4.096e-6 * (1 << timeout) if timeout else 1e9


# -- server-side objects -------------------------------------------------------------

class CQHost:
    """A completion queue: completions in, polls out; a poll may wait for the first."""

    def __init__(self, handle: int, cqe: int) -> None:
        self.handle = handle
        self.cqe = cqe
        self.entries: deque[WC] = deque()
        self._waiters: list[asyncio.Future] = []
        self.overruns = 0

    def push(self, wcs: list[WC]) -> None:
        self.entries.extend(wcs)
        # ibv_create_cq(3): an overrun CQ is an error on the device; nothing is
        # dropped here (tests must still see every completion), but it is counted.
        if len(self.entries) > self.cqe:
            self.overruns += 1
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    def take(self, num: int) -> list[WC]:
        return [self.entries.popleft() for _ in range(min(num, len(self.entries)))]

    async def wait(self, timeout: float) -> None:
        if self.entries or timeout <= 0:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)


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
    timer: asyncio.TimerHandle | None = None
    timer_at: float | None = None
    attrs: dict = dataclasses.field(default_factory=dict)


# The verbs that create an object (and so count against a session's object limit).
_CREATORS = frozenset(["open_device", "alloc_pd", "reg_mr", "create_cq", "create_qp",
                       "create_mkey", "create_dek"])


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

    def destroy_all(self) -> None:
        """The session ended: its objects go, as when a process exits (docs/architecture.md)."""
        if self.gone:
            return
        self.gone = True
        if self.session in self.daemon.subscribers:
            self.daemon.subscribe(self.session, set())
        for t in self._waits:
            t.cancel()
        counts: dict[str, int] = {}
        for kind, obj in list(self.objects.values()):
            counts[kind] = counts.get(kind, 0) + 1
            self._destroy(kind, obj)
        self.objects.clear()
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
                         "max_cqe": 1 << 22, "max_mr_size": 1 << 40, "max_pd": 1 << 16,
                         "max_qp_rd_atom": 16, "phys_port_cnt": 1, "node_guid": hash(hca.name)
                         & 0xFFFFFFFFFFFF}}

    def op_close_device(self, a, payload, rid):
        return self._destroy_handle(a["ctx"], "ctx")

    def op_alloc_pd(self, a, payload, rid):
        hca = self.get(a["ctx"], "ctx")
        pd = hca.alloc_pd()
        return {"pd": self.add("pd", pd)}

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
        return {"_payload": mr.read(a["length"], a["offset"])}

    # -- verbs: CQ and QP ---------------------------------------------------------------
    def op_create_cq(self, a, payload, rid):
        self.get(a["ctx"], "ctx")
        cq = CQHost(0, a["cqe"])
        cq.handle = self.add("cq", cq)
        return {"cq": cq.handle, "cqe": a["cqe"]}

    def op_destroy_cq(self, a, payload, rid):
        cq = self.get(a["cq"], "cq")
        for kind, o in self.objects.values():
            if kind == "qp" and (o.scq is cq or o.rcq is cq):
                raise RDMAError("EBUSY", f"ibv_destroy_cq: CQ {a['cq']} is used by QP "
                                         f"{o.rcqp.qp_num:#x}")
        return self._destroy_handle(a["cq"], "cq")

    def op_poll_cq(self, a, payload, rid):
        cq: CQHost = self.get(a["cq"], "cq")
        if cq.entries or a["timeout"] <= 0:
            return {"wcs": [w.to_wire() for w in cq.take(a["num"])]}

        async def wait() -> None:
            await cq.wait(float(a["timeout"]))
            if not self.gone:
                self.session.reply(rid, wcs=[w.to_wire() for w in cq.take(a["num"])])

        task = asyncio.get_running_loop().create_task(wait())
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)
        return None

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
        qpn = self.daemon.new_qpn()
        rcqp = RCQP(pd, qpn, sq_depth=a["max_send_wr"], rq_depth=a["max_recv_wr"],
                    sq_sig_all=a["sq_sig_all"], max_inline_data=a["max_inline_data"])
        builder = MkeyConfigureBuilder(pd, a["send_ops_flags"], a["sq_sig_all"])
        qph = QPHost(self.session, 0, pd.hca, pd, rcqp, scq, rcq, a["max_send_sge"],
                     a["max_recv_sge"], a["send_ops_flags"], builder)
        qph.handle = self.add("qp", qph)
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
        state = attr["qp_state"]
        q = qph.rcqp
        if state == QpState.INIT:
            q.modify_to_init()
        elif state == QpState.RTR:
            need = ("dest_qp_num", "rq_psn", "path_mtu", "dest_host", "dest_port")
            missing = [n for n in need if n not in attr]
            if missing:
                raise einval(f"ibv_modify_qp to RTR needs {', '.join(missing)}")
            q.modify_to_rtr(attr["dest_qp_num"], attr["rq_psn"], Mtu(attr["path_mtu"]))
            qph.dest = (attr["dest_host"], attr["dest_port"], attr.get("dest_dev", qph.hca.name))
            # Open the link now, so the first packet does not spend its ACK timeout on
            # TCP and HELLO set-up.
            self.daemon.link_to(attr["dest_host"], attr["dest_port"])
        elif state == QpState.RTS:
            timeout = attr.get("timeout", 17)
            q.modify_to_rts(attr.get("sq_psn", 0), timeout_s=ack_timeout_s(timeout),
                            retry_cnt=attr.get("retry_cnt", 7),
                            rnr_retry=attr.get("rnr_retry", 7),
                            rnr_timer_s=RNR_TIMER_MS[attr.get("min_rnr_timer", 12)] / 1000)
        elif state == QpState.ERR:
            q.modify_to_err()
        elif state == QpState.RESET:
            if q.state != QpState.ERR and q.state != QpState.RESET:
                raise einval("ibv_modify_qp to RESET is modelled from ERR only")
            raise RDMAError("EOPNOTSUPP", "ibv_modify_qp to RESET is not modelled: "
                                          "destroy the QP and create another")
        else:
            raise RDMAError("EOPNOTSUPP", f"QP state {QpState(state).name} is not modelled")
        qph.attrs.update(attr)
        self.daemon.service(qph)
        return {"state": int(q.state)}

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
        rule = self.daemon.faults.add(a["rule"])
        log.info("fault rule added %s", kv(event="fault_add", peer=self.peer, id=rule.id,
                                            rule=rule.spec))
        return {"rule": rule.as_dict()}

    def op_faults_list(self, a, payload, rid):
        return {"rules": self.daemon.faults.list()}

    def op_faults_clear(self, a, payload, rid):
        n = self.daemon.faults.clear(a["rule_id"])
        log.info("fault rules cleared %s", kv(event="fault_clear", peer=self.peer, n=n))
        return {"cleared": n}

    def op_subscribe(self, a, payload, rid):
        kinds = set(a["events"])
        unknown = kinds - {"packets", "trace"}
        if unknown or not all(isinstance(k, str) for k in kinds):
            raise einval(f"subscribe: unknown event kind(s) {sorted(map(str, unknown))}; "
                         "the kinds are 'packets' and 'trace'")
        self.daemon.subscribe(self.session, kinds)
        return {"events": sorted(kinds)}

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
                kind, value = control.setter_from_wire(c[0], c[1], what)
                if kind == "crypto" and value.dek is not None:
                    value = dataclasses.replace(value, dek=self.get(value.dek, "dek"))
                calls.append((kind, value, None))
            else:
                raise FrameError("EPROTO", f"{what}: a setter is [kind, value]")
        q = qph.rcqp
        if q.state not in (QpState.RTS, QpState.ERR):
            raise einval(f"ibv_wr_mkey_configure needs the QP in RTS, it is in "
                         f"{QpState(q.state).name}")
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
        dek = hca.create_dek(DEKInitAttr(key_size=a["key_size"], key=a["key"],
                                         has_keytag=a["has_keytag"], keytag=a["keytag"],
                                         key_purpose=a["key_purpose"], pd=pd))
        # The session's handle names it to the client; the engine keeps its own.
        return {"dek": self.add("dek", dek)}

    def op_destroy_dek(self, a, payload, rid):
        return self._destroy_handle(a["dek"], "dek")
