"""pyverbs.cmid: rdma_cm ids (rdma_cma.h) over softhca's connection manager.

``AddrInfo`` resolves as rdma_getaddrinfo(3) does (IPv4, RDMA_PS_TCP or RDMA_PS_UDP);
``CMID`` made from an AddrInfo is synchronous (as rdma_create_ep(3): each call waits for
its event), one made from a ``CMEventChannel`` is asynchronous (its events are read with
``CMEvent``).
The id's QP moves as librdmacm moves it: INIT at creation, RTR and RTS with what the
REQ / REP exchange gave (rdma_accept, and the CONNECT_RESPONSE the library turns into
ESTABLISHED), ERR before a DREQ. RDMA_PS_UDP ids have UD QPs and resolve their peer by
SIDR (_cm_ud.py: ESTABLISHED's ``UDParam``); the other port spaces and multicast raise
EOPNOTSUPP.
"""

from __future__ import annotations

import errno
import queue
import secrets
import socket

from . import cm_enums as ce
from . import enums as e
from ._cm_qp import QP_TYPE, IdQP
from ._cm_session import CMSession
from ._cm_ud import UDParam, ud_event
from ._cm_verbs import RdmaVerbs
from ._objects import Record, unmodelled
from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

_EVENTS = {name[len("RDMA_CM_EVENT_"):].lower(): int(v)
           for name, v in ce.rdma_cm_event_type.__members__.items()}
_RESOLVE_MS = 2000
__all__ = ["AddrInfo", "CMEvent", "CMEventChannel", "CMID", "ConnParam", "JoinMCAttrEx",
           "UDParam"]


def _fail(what: str, err: int) -> PyverbsRDMAError:
    return PyverbsRDMAError(what, err)


# -- rdma_getaddrinfo ---------------------------------------------------------------------

def _resolve(host, service, passive: bool, numeric: bool):
    if host is None and service is None:
        return None
    port = int(service) if service not in (None, "") else 0
    if host is None:
        return ("0.0.0.0", port)
    flags = socket.AI_NUMERICHOST if numeric else 0
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM, 0, flags)
    except socket.gaierror as err:
        raise _fail(f"Failed to get address info for {host}: {err}", errno.EADDRNOTAVAIL) \
            from None
    return (infos[0][4][0], port)


class AddrInfo(PyverbsObject):
    """rdma_getaddrinfo(3): ``src`` / ``dst`` (hosts) and their services (ports);
    ``service`` names the passive side's port with RAI_PASSIVE, the destination's
    otherwise. ``src_addr`` / ``dst_addr`` are (ip, port) pairs."""

    def __init__(self, src=None, dst=None, src_service=None, dst_service=None,
                 port_space=ce.RDMA_PS_TCP, flags=0, service=None):
        super().__init__()
        if port_space not in QP_TYPE:
            raise _fail(f"Failed to get address info: port space {int(port_space):#x} "
                        "(RDMA_PS_TCP and RDMA_PS_UDP are modelled)", errno.EOPNOTSUPP)
        passive = bool(flags & ce.RAI_PASSIVE)
        if service is not None:
            if passive:
                src_service = service
            else:
                dst_service = service
        numeric = bool(flags & ce.RAI_NUMERICHOST)
        self.flags = flags
        self.port_space = port_space
        self.qp_type = QP_TYPE[port_space]
        self.src_addr = _resolve(src, src_service, passive, numeric)
        self.dst_addr = None if passive else _resolve(dst, dst_service, False, numeric)
        if self.src_addr is None and passive:
            self.src_addr = ("0.0.0.0", 0)
        if self.dst_addr is None and not passive:
            raise _fail("Failed to get address info: an active side needs a destination",
                        errno.EINVAL)


class ConnParam(Record):
    """struct rdma_conn_param (librdmacm's defaults: 1 / 1 resources, 7 / 7 retries)."""

    _fields = (("resources", 1), ("depth", 1), ("flow_control", 0), ("retry", 7),
               ("rnr_retry", 7), ("srq", 0), ("qp_num", 0), ("data", b""))


JoinMCAttrEx = unmodelled("JoinMCAttrEx", "rdma_cm multicast (rdma_join_multicast_ex)",
                          PyverbsObject)


# -- event channels and events ------------------------------------------------------------

class CMEventChannel(PyverbsCM):
    """rdma_create_event_channel(3): the events of the ids made on it, in order. Its
    ids' CM requests, QPs and PDs share one control session with the daemon."""

    def __init__(self):
        super().__init__()
        self._session = CMSession().hold()
        self._q: queue.Queue = queue.Queue()
        self._ids: dict[int, CMID] = {}

    def _take(self):
        if self._session is None:
            raise _fail("Failed to get CM event: the channel is closed", errno.EBADF)
        self._session.check("Failed to get CM event")
        item = self._q.get()
        if item is None:
            raise _fail("Failed to get CM event: the daemon's session ended",
                        errno.ECONNRESET)
        return item

    def close(self):
        s, self._session = self._session, None
        if s is not None:
            s.release()


class CMEvent(PyverbsObject):
    """rdma_get_cm_event(3): waits for the channel's next event, after the library's
    part (a new id for a CONNECT_REQUEST; for an id with a QP, a CONNECT_RESPONSE's QP
    to RTR and RTS and the RTU, reported as ESTABLISHED)."""

    def __init__(self, channel):
        super().__init__()
        if not isinstance(channel, CMEventChannel):
            raise PyverbsUserError("CMEvent needs a CMEventChannel")
        while True:
            h, data = channel._take()
            cmid = _owner_of(channel, h)
            if cmid is not None:
                break
        self._fill(cmid, h, data)

    def _fill(self, cmid, h, data):
        self._ud = None
        self.event_type, self.status = cmid._process(h, data, self)
        self.private_data = data
        self.id = cmid

    @classmethod
    def _of(cls, cmid, h, data):
        ev = cls.__new__(cls)
        PyverbsObject.__init__(ev)
        ev._fill(cmid, h, data)
        return ev

    def event_str(self):
        return ce.rdma_cm_event_type(self.event_type).name

    def ack_cm_event(self):
        """rdma_ack_cm_event(3): nothing is held for an event here."""

    def close(self):
        pass


def _owner_of(channel, h):
    if h["cm"] == "connect_request":
        listener = channel._ids.get(h.get("listen"))
        if listener is None:
            return None
        child = CMID._child(listener, h)
        channel._ids[child._handle] = child
        return child
    return channel._ids.get(h.get("cmid"))


# -- ids ----------------------------------------------------------------------------------

class CMID(IdQP, RdmaVerbs, PyverbsCM):
    """rdma_create_id(3) / rdma_create_ep(3): ``CMID(creator=AddrInfo, qp_init_attr=,
    pd=)`` a synchronous id (bound when the AddrInfo is RAI_PASSIVE, else resolved and
    with its QP when qp_init_attr is given); ``CMID(creator=CMEventChannel,
    port_space=)`` an asynchronous one."""

    def __init__(self, creator=None, qp_init_attr=None, pd=None,
                 port_space=ce.RDMA_PS_TCP, listen_id=None):
        super().__init__()
        self._handle = 0
        self._qp = self._pd = self._scq = self._rcq = self._cc = None
        self._peer_qpn = self._peer_psn = 0
        self._rr = self._depth = 1
        self._retry = self._rnr = 7
        self._my_psn = secrets.randbelow(1 << 24)
        self._dgid = bytes(16)
        self._ep = None
        if isinstance(creator, CMEvent):
            self._take_over(creator)
            return
        if isinstance(creator, AddrInfo):
            port_space = creator.port_space
        if port_space not in QP_TYPE:
            raise _fail(f"Failed to create CM ID: port space {int(port_space):#x} "
                        "(RDMA_PS_TCP and RDMA_PS_UDP are modelled)", errno.EOPNOTSUPP)
        self._ps = port_space
        if isinstance(creator, CMEventChannel):
            self._channel = creator
            self._sync = None
            self._session = creator._session.hold()
        elif isinstance(creator, AddrInfo):
            self._channel = None
            self._sync = queue.Queue()
            self._session = CMSession(pd._ctx if pd is not None else None).hold()
        else:
            raise PyverbsUserError("CMID's creator is an AddrInfo or a CMEventChannel")
        try:
            self._create()
            if isinstance(creator, AddrInfo):
                self._create_ep(creator, qp_init_attr, pd)
        except BaseException:
            self.close()
            raise

    def _take_over(self, ev):
        """CMID(creator=CMEvent, listen_id=): the CONNECT_REQUEST's new id."""
        child = ev.id
        if ev.event_type != ce.RDMA_CM_EVENT_CONNECT_REQUEST or child._session is None:
            raise PyverbsUserError("CMID from a CMEvent needs an unclaimed CONNECT_REQUEST")
        self.__dict__.update(child.__dict__)
        child._session = None           # this object is the id now
        ev.id = self
        if self._channel is not None:
            self._channel._ids[self._handle] = self

    def _create(self):
        h = self._session.request("cm_create_id", "Failed to create CM ID",
                                  ps=int(self._ps))
        self._adopt_handle(h["cmid"])

    def _adopt_handle(self, handle):
        self._handle = handle
        if self._channel is not None:
            self._channel._ids[handle] = self
            self._session.register(handle, self._channel._q)
        else:
            self._session.register(handle, self._sync)

    def _create_ep(self, ai, qp_init_attr, pd):
        if ai.flags & ce.RAI_PASSIVE:
            self.bind_addr(ai)
            self._ep = (qp_init_attr, pd)
        else:
            self.resolve_addr(ai)
            self.resolve_route()
            if qp_init_attr is not None:
                self.create_qp(qp_init_attr, pd)

    @classmethod
    def _child(cls, listener, h):
        """The new id of a CONNECT_REQUEST, on its listener's session and channel."""
        c = cls.__new__(cls)
        PyverbsCM.__init__(c)
        c._qp = c._pd = c._scq = c._rcq = c._cc = None
        c._ep = None
        c._ps = listener._ps
        c._channel, c._sync = listener._channel, listener._sync
        c._session = listener._session.hold()
        c._handle = h["cmid"]
        c._my_psn = secrets.randbelow(1 << 24)
        c._peer_qpn, c._peer_psn = h.get("qpn", 0), h.get("psn", 0)
        # what the passive side may use: the peer's depth bounds our responder resources
        c._rr, c._depth = h.get("depth", 0), h.get("rr", 0)
        # the REQ's RNR retry count is our QP's (IBTA's CM: each side's is what its peer
        # asked for); the one rdma_accept gives goes in the REP, for the peer's
        c._retry, c._rnr = h.get("retry", 7), h.get("rnr", 7)
        c._dgid = bytes(h.get("dgid") or bytes(16))
        c._dev = h.get("dev", 0)
        return c

    # -- properties ----------------------------------------------------------------------
    @property
    def event_channel(self):
        return self._channel

    @property
    def context(self):
        return self._session.ctx

    @property
    def pd(self):
        """The id's PD (its QP's, else one made on the id's context, as librdmacm's
        default PD of the device)."""
        if self._pd is None:
            from .pd import PD

            self._pd = PD(self.context)
        return self._pd

    @property
    def qp(self):
        return self._qp

    @property
    def handle(self):
        return self._handle

    @property
    def _ud(self):
        return self._ps == ce.RDMA_PS_UDP

    # -- the synchronous waits -------------------------------------------------------------
    def _wait(self, want: str, what: str):
        """A synchronous id's next event: returned when it is ``want``, else raised."""
        if self._session is not None:
            self._session.check(what)
        item = self._sync.get()
        if item is None:
            raise _fail(f"{what}: the daemon's session ended", errno.ECONNRESET)
        h, data = item
        ev = CMEvent._of(self if h["cm"] != "connect_request" else
                         CMID._child(self, h), h, data)
        if ev.event_type == _EVENTS[want]:
            return ev
        st = ev.status
        raise _fail(f"{what}: {ev.event_str()} (status {st})",
                    -st if st and st < 0 else errno.ECONNREFUSED)

    # -- addresses and routes --------------------------------------------------------------
    def bind_addr(self, ai):
        ip, port = ai.src_addr
        self._session.request("cm_bind", "Failed to bind address", cmid=self._handle,
                              ip=ip, port=port, reuse=False)

    def resolve_addr(self, ai, timeout_ms=_RESOLVE_MS):
        if ai.src_addr is not None:
            self.bind_addr(ai)
        ip, port = ai.dst_addr
        self._session.request("cm_resolve_addr", "Failed to resolve address",
                              cmid=self._handle, ip=ip, port=port, timeout_ms=timeout_ms)
        if self._sync is not None:
            self._wait("addr_resolved", "Failed to resolve address")

    def resolve_route(self, timeout_ms=_RESOLVE_MS):
        self._session.request("cm_resolve_route", "Failed to resolve route",
                              cmid=self._handle, timeout_ms=timeout_ms)
        if self._sync is not None:
            self._wait("route_resolved", "Failed to resolve route")

    def listen(self, backlog=0):
        self._session.request("cm_listen", "Failed to listen", cmid=self._handle,
                              backlog=max(0, int(backlog)))

    def get_request(self):
        """rdma_get_request(3): the next connect request of a synchronous listener, an
        id with its own events and a QP made as the listener was asked."""
        if self._sync is None:
            raise _fail("get_request is for a synchronous (AddrInfo) listener", errno.EINVAL)
        ev = self._wait("connect_request", "Failed to get request")
        child = ev.id
        child._sync = queue.Queue()
        self._session.register(child._handle, child._sync)
        if self._ep is not None and self._ep[0] is not None:
            try:
                child.create_qp(self._ep[0], self._ep[1])
            except BaseException:
                child.reject()
                child.close()
                raise
        return child

    # -- connecting ----------------------------------------------------------------------
    def _qpn(self, param):
        qpn = self._qp.qp_num if self._qp is not None else (param.qp_num if param else 0)
        if not qpn:
            raise _fail("the id has no QP and the ConnParam names none", errno.EINVAL)
        return qpn

    def connect(self, param=None):
        p = param if param is not None else ConnParam()
        qpn = self._qpn(param)
        self._rr, self._depth = p.resources, p.depth
        self._retry, self._rnr = min(p.retry, 7), min(p.rnr_retry, 7)
        self._session.request(
            "cm_connect", "Failed to connect", bytes(p.data or b""), cmid=self._handle,
            qpn=qpn, psn=self._my_psn, responder_resources=self._rr,
            initiator_depth=self._depth, retry_count=self._retry,
            rnr_retry_count=self._rnr)
        if self._sync is not None:
            self._wait("established", "Failed to connect")

    def accept(self, param=None):
        rep_rnr = 7
        if param is not None:
            self._rr = min(self._rr, param.resources)
            self._depth = min(self._depth, param.depth)
            rep_rnr = min(param.rnr_retry, 7)
        qpn = self._qpn(param)
        if self._qp is not None and not self._ud:
            self._move("RTS")
        self._session.request(
            "cm_accept", "Failed to accept", bytes(param.data or b"") if param else b"",
            cmid=self._handle, qpn=qpn, psn=self._my_psn, responder_resources=self._rr,
            initiator_depth=self._depth, rnr_retry_count=rep_rnr)
        if self._sync is not None and not self._ud:     # a SIDR_REP has no RTU
            self._wait("established", "Failed to accept")

    def reject(self, private_data=None):
        self._session.request("cm_reject", "Failed to reject", bytes(private_data or b""),
                              cmid=self._handle)

    def establish(self):
        self._session.request("cm_establish", "Failed to establish", cmid=self._handle)

    def disconnect(self):
        from . import qp as q

        if self._qp is not None:        # its WRs flush before the DREQ, as librdmacm's
            self._qp.modify(q.QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
        self._session.request("cm_disconnect", "Failed to disconnect", cmid=self._handle)

    # -- the library's part of an event ------------------------------------------------------
    def _process(self, h, data, ev):
        kind = h["cm"]
        etype = _EVENTS.get(kind, ce.RDMA_CM_EVENT_ADDR_ERROR)
        status = h.get("status", 0)
        self._dev = h.get("dev", getattr(self, "_dev", 0))
        if kind in ("addr_resolved", "connect_response") and h.get("dgid"):
            self._dgid = bytes(h["dgid"])
        if kind == "established" and self._ud:
            # the SIDR_REP's QP and Q_Key, and the route's GID as the AH's destination
            ev._ud = ud_event(h)
            self._peer_qpn, self._peer_qkey = ev._ud["qpn"], ev._ud["qkey"]
        elif kind == "connect_response":
            self._peer_qpn, self._peer_psn = h.get("qpn", 0), h.get("psn", 0)
            self._rr = min(self._rr, h.get("depth", 0))
            self._depth = min(self._depth, h.get("rr", 0))
            self._rnr = h.get("rnr", 7)
            if self._qp is not None:
                try:
                    self._move("RTS")
                    self.establish()
                    etype = ce.RDMA_CM_EVENT_ESTABLISHED
                except PyverbsRDMAError as err:
                    etype, status = ce.RDMA_CM_EVENT_CONNECT_ERROR, -err.error_code
        elif kind == "rejected" and self._qp is not None:
            from . import qp as q

            self._qp.modify(q.QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
        return etype, status

    # -- lifetime ----------------------------------------------------------------------------
    def close(self):
        s = getattr(self, "_session", None)
        if s is None:
            return
        self._session = None
        for obj in (self._qp, self._scq, self._rcq, self._cc):
            if obj is not None:
                obj.close()
        self._qp = None
        if self._handle:
            s.unregister(self._handle)
            if self._channel is not None:
                self._channel._ids.pop(self._handle, None)
            try:
                # (a fork child's copy of its parent's id is only forgotten)
                if s.ctx._node is not None and not s.node._conn.inherited:
                    s.request("cm_destroy_id", "Failed to destroy CM ID", cmid=self._handle)
            finally:
                s.release()
        else:
            s.release()
