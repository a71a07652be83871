"""pyverbs.qp: queue pairs, their attributes, and the extended QP's WR builder.

softhca models RC, UC and UD QPs (engine/rc.py, uc.py, ud.py); creating any other type
fails with EOPNOTSUPP from the daemon. An RC or UC QP reaches its peer through the dgid
of its address vector (``_route``), a UD QP through each WR's AH (pyverbs.addr.AH).
"""

from __future__ import annotations

import copy
import dataclasses
import errno

from ...engine.qp_state import FIELDS as _QP_FIELDS
from ...protocol.attrs import SGE as _SGE
from .. import api
from .. import mw as _mw
from . import _route, _sync
from . import enums as e
from ._objects import Record, Resource, check_alloc_type, delegate, unsupported
from .addr import AHAttr
from .base import PyverbsCM
from .mw import bind_fields, bind_send_wr, bind_type1
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError
from .wr import SendWR, be32_field_to_host, recv_wrs


class QPCap(Record):
    _fields = (("max_send_wr", 1), ("max_recv_wr", 10), ("max_send_sge", 1),
               ("max_recv_sge", 1), ("max_inline_data", 0))


class _InitAttr(Record):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.cap is None:
            self.cap = QPCap()

    # pyverbs names the CQs both ways.
    send_cq = property(lambda self: self.scq, lambda self, v: setattr(self, "scq", v))
    recv_cq = property(lambda self: self.rcq, lambda self, v: setattr(self, "rcq", v))

    max_send_wr = delegate("cap", "max_send_wr")
    max_recv_wr = delegate("cap", "max_recv_wr")
    max_send_sge = delegate("cap", "max_send_sge")
    max_recv_sge = delegate("cap", "max_recv_sge")
    max_inline_data = delegate("cap", "max_inline_data")


class QPInitAttr(_InitAttr):
    """struct ibv_qp_init_attr; pyverbs' defaults (UD, sq_sig_all=1)."""

    _fields = (("qp_type", e.IBV_QPT_UD), ("qp_context", None), ("scq", None), ("rcq", None),
               ("srq", None), ("cap", None), ("sq_sig_all", 1))


class QPInitAttrEx(_InitAttr):
    """struct ibv_qp_init_attr_ex"""

    _fields = (("qp_type", e.IBV_QPT_UD), ("qp_context", None), ("scq", None), ("rcq", None),
               ("srq", None), ("cap", None), ("sq_sig_all", 0), ("comp_mask", 0),
               ("pd", None), ("xrcd", None), ("create_flags", 0), ("max_tso_header", 0),
               ("source_qpn", 0), ("hash_conf", None), ("ind_table", None),
               ("send_ops_flags", 0))


class QPAttr(Record):
    """struct ibv_qp_attr; pyverbs' defaults are those of a RESET -> INIT transition."""

    _fields = (("qp_state", e.IBV_QPS_INIT), ("cur_qp_state", e.IBV_QPS_RESET),
               ("port_num", 1), ("path_mtu", e.IBV_MTU_1024), ("path_mig_state", 0),
               ("qkey", 0), ("rq_psn", 0), ("sq_psn", 0), ("dest_qp_num", 0),
               ("qp_access_flags", 0), ("cap", None), ("ah_attr", None),
               ("alt_ah_attr", None), ("pkey_index", 0), ("alt_pkey_index", 0),
               ("en_sqd_async_notify", 0), ("sq_draining", 0), ("max_rd_atomic", 0),
               ("max_dest_rd_atomic", 0), ("min_rnr_timer", 0), ("timeout", 0),
               ("retry_cnt", 0), ("rnr_retry", 0), ("alt_port_num", 0), ("alt_timeout", 0),
               ("rate_limit", 0))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.cap is None:
            self.cap = QPCap(0, 0, 0, 0, 0)
        if self.ah_attr is None:
            self.ah_attr = AHAttr()
        if self.alt_ah_attr is None:
            self.alt_ah_attr = AHAttr()


class ECE(Record):
    _fields = (("vendor_id", 0), ("options", 0), ("comp_mask", 0))


class DataBuffer(PyverbsCM):
    def __init__(self, addr, length):
        super().__init__()
        self.addr, self.length = addr, length


# Masks of pyverbs' to_init / to_rtr / to_rts for an RC QP (ibv_modify_qp(3)'s table).
_RC_MASKS = {
    "INIT": e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS,
    "RTR": (e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN
            | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER),
    "RTS": (e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN
            | e.IBV_QP_MAX_QP_RD_ATOMIC),
}
# ... and for UD and UC QPs (the same table's rows for IBV_QPT_UD and IBV_QPT_UC).
_UD_MASKS = {"INIT": e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_QKEY, "RTR": 0,
             "RTS": e.IBV_QP_SQ_PSN}
_UC_MASKS = {"INIT": e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS,
             "RTR": e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN | e.IBV_QP_RQ_PSN,
             "RTS": e.IBV_QP_SQ_PSN}
# The ibv_qp_attr field of each mask bit is the engine's table; those the control plane
# carries travel, port and P_Key index are checked here (one of each exists).
_WIRE_FIELDS = {f.name for f in dataclasses.fields(api.QPAttr)}
_LOCAL = e.IBV_QP_PORT | e.IBV_QP_PKEY_INDEX | e.IBV_QP_CUR_STATE

# ibv_wr_opcode -> its ibv_qp_create_send_ops_flags bit. The mlx5 provider installs every
# builder an RC QP supports whatever send_ops_flags said (rdma-core's test_mlx5_mkey
# calls wr_send_inv on a QP created WITH_SEND only), so softhca does not refuse either.
_SEND_OPS = {
    e.IBV_WR_SEND: e.IBV_QP_EX_WITH_SEND,
    e.IBV_WR_SEND_WITH_IMM: e.IBV_QP_EX_WITH_SEND_WITH_IMM,
    e.IBV_WR_SEND_WITH_INV: e.IBV_QP_EX_WITH_SEND_WITH_INV,
    e.IBV_WR_RDMA_WRITE: e.IBV_QP_EX_WITH_RDMA_WRITE,
    e.IBV_WR_RDMA_WRITE_WITH_IMM: e.IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
    e.IBV_WR_RDMA_READ: e.IBV_QP_EX_WITH_RDMA_READ,
    e.IBV_WR_ATOMIC_CMP_AND_SWP: e.IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
    e.IBV_WR_ATOMIC_FETCH_AND_ADD: e.IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
    e.IBV_WR_LOCAL_INV: e.IBV_QP_EX_WITH_LOCAL_INV,
    e.IBV_WR_BIND_MW: e.IBV_QP_EX_WITH_BIND_MW,
    e.IBV_WR_ATOMIC_WRITE: e.IBV_QP_EX_WITH_ATOMIC_WRITE,
}
_MODELLED_OPS = 0
for _op in _SEND_OPS.values():
    _MODELLED_OPS |= _op
_IMM = (e.IBV_WR_SEND_WITH_IMM, e.IBV_WR_RDMA_WRITE_WITH_IMM)
_INV = (e.IBV_WR_SEND_WITH_INV, e.IBV_WR_LOCAL_INV)


def _client_cq(cq, what):
    from .cq import _CQBase

    if cq is None:
        return None
    if not isinstance(cq, _CQBase) or cq._obj is None:
        raise PyverbsUserError(f"{what} must be an open CQ or CQEX")
    return cq


def _send_wr(wr) -> api.SendWR:
    """A pyverbs SendWR as the client's: imm_data from its __be32 bits, LOCAL_INV and
    SEND_WITH_INV reading the key from the same storage, as in C."""
    if wr._unsupported:
        raise unsupported(wr._unsupported)
    if wr.opcode not in _SEND_OPS:
        raise unsupported(f"Send opcode {wr.opcode}")
    if wr.opcode == e.IBV_WR_BIND_MW:
        if wr._bind is None:
            raise PyverbsRDMAError("Failed to post send: IBV_WR_BIND_MW without "
                                   "set_bind_wr", errno.EINVAL)
        return bind_send_wr(wr, wr.rkey)
    sg = [s._attr() for s in wr.sg[:wr.num_sge]]
    imm = be32_field_to_host(wr.imm_data) if wr.opcode in _IMM else None
    out = api.SendWR(wr_id=wr.wr_id, opcode=int(wr.opcode), sg=sg, imm_data=imm,
                     send_flags=int(wr.send_flags))
    out.rkey, out.remote_addr = int(wr.rkey), int(wr.remote_addr)
    out.compare_add, out.swap = int(wr.compare_add), int(wr.swap)
    if wr.ah is not None:
        out.set_wr_ud(wr.ah._obj, int(wr.remote_qpn), int(wr.remote_qkey))
    if wr.opcode in _INV:
        out.invalidate_rkey = int(wr.imm_data) & 0xFFFFFFFF
    return out


class QP(Resource):
    """ibv_create_qp(3) on a PD with a QPInitAttr, or ibv_create_qp_ex(3) on a Context
    with a QPInitAttrEx. With ``qp_attr``, an RC QP is moved to INIT, as pyverbs does."""

    _dv_send_ops = 0
    _dv_create_flags = 0

    def __init__(self, creator, init_attr, qp_attr=None):
        super().__init__()
        from .device import Context
        from .pd import PD

        if isinstance(creator, PD):
            pd = creator
        elif isinstance(creator, Context):
            pd = getattr(init_attr, "pd", None)
            if pd is None:
                raise unsupported("QPs without a PD (XRC receive QPs)")
        else:
            raise PyverbsUserError(f"A QP is created on a PD or a Context, not a "
                                   f"{type(creator).__name__}")
        srq = init_attr.srq
        if srq is not None and getattr(srq, "_obj", None) is None:
            raise PyverbsUserError("QPInitAttr.srq must be an open SRQ")
        if getattr(init_attr, "xrcd", None) is not None:
            raise unsupported("XRC domains")
        if getattr(init_attr, "ind_table", None) is not None:
            raise unsupported("RSS indirection tables")
        # IBV_QP_CREATE_BLOCK_SELF_MCAST_LB (mlx5 takes it) asks that the QP not receive
        # the multicast it sends: softhca has no multicast (ibv_attach_mcast is not
        # modelled), no QP receives any, so the request holds. Any other flag is refused.
        flags = getattr(init_attr, "create_flags", 0) or 0
        if flags & ~e.IBV_QP_CREATE_BLOCK_SELF_MCAST_LB:
            raise unsupported(f"ibv_create_qp_ex create_flags {flags:#x}")
        if getattr(init_attr, "max_tso_header", 0):
            raise unsupported("TSO")
        scq = _client_cq(init_attr.scq, "scq")
        rcq = _client_cq(init_attr.rcq, "rcq") or scq
        if scq is None:
            raise PyverbsUserError("An RC QP needs a send CQ")
        pd._ctx._check()
        self._pd = self.pd = pd
        self._scq, self._rcq = scq, rcq
        self.init_attr = init_attr
        self._send_ops = getattr(init_attr, "send_ops_flags", 0) \
            if getattr(init_attr, "comp_mask", 0) & e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS else 0
        extra = self._send_ops & ~_MODELLED_OPS
        if extra:
            raise unsupported(f"ibv_create_qp_ex send_ops_flags {extra:#x} (atomic write, "
                              "memory window binds, TSO)")
        cap = init_attr.cap
        attr = api.QPInitAttr(
            qp_type=int(init_attr.qp_type), scq=scq._obj, rcq=rcq._obj,
            cap=api.QPCap(cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge,
                          cap.max_recv_sge, cap.max_inline_data),
            sq_sig_all=int(init_attr.sq_sig_all), send_ops_flags=self._dv_send_ops,
            create_flags=self._dv_create_flags, srq=srq._obj if srq is not None else None)
        self._srq = srq
        if int(init_attr.qp_type) == e.IBV_QPT_RC:
            check_alloc_type("MLX_QP", "QP")
        obj = _sync.run(pd._obj.create_qp(attr), "Failed to create QP")
        self._adopt(pd._ctx, obj)
        self._qp_num = obj.qp_num
        self._state = e.IBV_QPS_RESET
        self._attrs = QPAttr(qp_state=e.IBV_QPS_RESET)
        if qp_attr is not None:
            if init_attr.qp_type in (e.IBV_QPT_RC, e.IBV_QPT_UC):
                self.to_init(qp_attr)
            else:
                self.to_rts(qp_attr)

    # -- attributes --------------------------------------------------------------------
    @property
    def qp_type(self):
        return self.init_attr.qp_type

    @property
    def qp_state(self):
        return self._state

    @property
    def qp_num(self):
        return self._qp_num

    def _get_comp_mask(self, dst):
        masks = {e.IBV_QPT_UD: _UD_MASKS, e.IBV_QPT_UC: _UC_MASKS}.get(self.qp_type, _RC_MASKS)
        return masks[dst] | e.IBV_QP_STATE

    def _dest(self, ah_attr):
        """(host, port, device name) the AV's dgid leads to."""
        if not ah_attr.is_global or ah_attr.gr is None or ah_attr.gr.dgid is None:
            raise PyverbsRDMAError("Failed to modify QP: a RoCE address vector needs a GRH "
                                   "(is_global=1 and a dgid)", errno.EINVAL)
        host, port, index = _route.route(ah_attr.gr.dgid.raw, self._ctx._node.port)
        node = self._ctx._node
        if _route.same_daemon(host, port, node.host, node.port):
            names = node.devices
        else:
            try:
                names = _sync.device_names(f"{host}:{port}")
            except PyverbsRDMAError as err:
                if err.error_code != errno.EACCES:
                    raise
                # A daemon that serves no control session on its TCP port (softhca
                # run's, without --token-file) or wants another token: its devices are
                # taken to be named as this daemon's, the rule the C provider follows.
                names = node.devices
        if index >= len(names):
            raise PyverbsRDMAError(f"Failed to modify QP: the daemon at {host}:{port} has no "
                                   f"device {index}", errno.EINVAL)
        return host, port, names[index]

    # -- ibv_modify_qp -----------------------------------------------------------------
    def modify(self, qp_attr, comp_mask, what="Failed to modify QP"):
        self._ctx._check()
        if comp_mask & e.IBV_QP_PORT and qp_attr.port_num != 1:
            raise PyverbsRDMAError(f"{what}: port {qp_attr.port_num} does not "
                                   "exist (the device has port 1)", errno.EINVAL)
        if comp_mask & e.IBV_QP_PKEY_INDEX and qp_attr.pkey_index != 0:
            raise PyverbsRDMAError(f"{what}: P_Key index {qp_attr.pkey_index} "
                                   "is outside the one-entry P_Key table", errno.EINVAL)
        fields, sent = {}, 0
        for bit, name in _QP_FIELDS.items():
            if not comp_mask & bit or bit == e.IBV_QP_AV:
                continue
            if name in _WIRE_FIELDS:
                fields[name] = int(getattr(qp_attr, name))
            elif bit & _LOCAL:
                continue
            sent |= bit         # no value travels: the engine refuses what it needs
        if comp_mask & e.IBV_QP_AV:
            sent |= e.IBV_QP_AV
            fields["dest_host"], fields["dest_port"], fields["dest_dev"] = \
                self._dest(qp_attr.ah_attr)
        # The mask goes along: the engine's transition table (engine/qp_state.py) decides
        # which attributes a transition requires, allows or does not model.
        state = _sync.run(self._obj.modify(api.QPAttr(**fields), sent), what)
        self._state = state
        for name in fields:
            if hasattr(qp_attr, name):
                setattr(self._attrs, name, getattr(qp_attr, name))
        if comp_mask & e.IBV_QP_AV:
            self._attrs.ah_attr = copy.deepcopy(qp_attr.ah_attr)

    def _to(self, qp_attr, dst, state):
        qp_attr.qp_state = state
        self.modify(qp_attr, self._get_comp_mask(dst), f"Failed to modify QP state to "
                                                       f"{dst.lower()}")

    def to_init(self, qp_attr):
        self._to(qp_attr, "INIT", e.IBV_QPS_INIT)

    def to_rtr(self, qp_attr):
        if self.qp_state != e.IBV_QPS_INIT:
            self.to_init(qp_attr)
        self._to(qp_attr, "RTR", e.IBV_QPS_RTR)

    def to_rts(self, qp_attr):
        if self.qp_state != e.IBV_QPS_RTR:
            self.to_rtr(qp_attr)
        self._to(qp_attr, "RTS", e.IBV_QPS_RTS)

    def query(self, attr_mask):
        self._ctx._check()
        a = _sync.run(self._obj.query(), "Failed to query QP")
        attr = copy.deepcopy(self._attrs)
        attr.qp_state = attr.cur_qp_state = a.get("qp_state", self._state)
        self._state = attr.qp_state
        for name in ("dest_qp_num", "path_mtu", "timeout", "retry_cnt", "rnr_retry"):
            if a.get(name) is not None:
                setattr(attr, name, a[name])
        cap = self.init_attr.cap
        attr.cap = QPCap(cap.max_send_wr, cap.max_recv_wr, cap.max_send_sge,
                         cap.max_recv_sge, cap.max_inline_data)
        init = QPInitAttr(qp_type=self.qp_type, scq=self._scq, rcq=self._rcq, cap=attr.cap,
                          sq_sig_all=int(self.init_attr.sq_sig_all))
        return attr, init

    # -- posting -----------------------------------------------------------------------
    def post_send(self, wr, bad_wr=None):
        if not isinstance(wr, SendWR):
            raise PyverbsUserError("post_send takes a SendWR")
        self._ctx._check()
        wrs = [_send_wr(w) for w in wr._chain()]
        _sync.run(self._obj.post_send(wrs), "Failed to post send")

    def post_recv(self, wr, bad_wr=None):
        _sync.run(self._obj.post_recv(recv_wrs(wr, self._ctx)), "Failed to post recv")

    def set_ece(self, ece):
        raise unsupported("Enhanced connection establishment (ECE)")

    def query_ece(self):
        raise unsupported("Enhanced connection establishment (ECE)")

    def bind_mw(self, mw, mw_bind):
        bind_type1(self, mw, mw_bind)

    def query_data_in_order(self, op, flags=0):
        """ibv_query_qp_data_in_order(3): softhca's provider does not implement the op,
        so libibverbs answers as it does then: 0 (no in-order guarantee claimed)."""
        self._ctx._check()
        return 0


class QPEx(QP):
    """ibv_qp_ex: WRs built with ``wr_start``, ``wr_<opcode>`` plus ``wr_set_*``, posted
    together by ``wr_complete`` (ibv_wr_post(3)). The QP's ``wr_id`` and ``wr_flags`` are
    those of the next WR started."""

    def __init__(self, creator, init_attr, qp_attr=None):
        super().__init__(creator, init_attr, qp_attr)
        self.wr_id = 0
        self.wr_flags = 0
        self.comp_mask = 0
        self.ind_table = None
        self._batch: list | None = None
        self._error: PyverbsRDMAError | None = None

    # A batch is a list of ("send", SendWR) and ("mkey", [client builder calls]) items.
    def wr_start(self):
        self._batch, self._error = [], None

    def wr_abort(self):
        self._batch, self._error = None, None

    def _fail(self, err: PyverbsRDMAError) -> None:
        # ibv_wr_*(3): builder errors surface at ibv_wr_complete; the first one counts.
        if self._error is None:
            self._error = err

    def _new_send(self, opcode, **fields):
        if self._batch is None:
            self._fail(PyverbsRDMAError("A WR was built outside wr_start", errno.EINVAL))
            return
        wr = api.SendWR(wr_id=self.wr_id, opcode=int(opcode), send_flags=int(self.wr_flags),
                        imm_data=fields.pop("imm_data", None))
        for k, v in fields.items():
            setattr(wr, k, int(v))
        self._batch.append(("send", wr))

    def _last_send(self):
        if self._batch and self._batch[-1][0] == "send":
            return self._batch[-1][1]
        self._fail(PyverbsRDMAError("wr_set_* without a WR to attach it to", errno.EINVAL))
        return None

    def wr_send(self):
        self._new_send(e.IBV_WR_SEND)

    def wr_send_imm(self, data):
        self._new_send(e.IBV_WR_SEND_WITH_IMM, imm_data=int(data) & 0xFFFFFFFF)

    def wr_send_inv(self, invalidate_rkey):
        self._new_send(e.IBV_WR_SEND_WITH_INV, invalidate_rkey=invalidate_rkey)

    def wr_rdma_write(self, rkey, remote_addr):
        self._new_send(e.IBV_WR_RDMA_WRITE, rkey=rkey, remote_addr=remote_addr)

    def wr_rdma_write_imm(self, rkey, remote_addr, data):
        self._new_send(e.IBV_WR_RDMA_WRITE_WITH_IMM, rkey=rkey, remote_addr=remote_addr,
                       imm_data=int(data) & 0xFFFFFFFF)

    def wr_rdma_read(self, rkey, remote_addr):
        self._new_send(e.IBV_WR_RDMA_READ, rkey=rkey, remote_addr=remote_addr)

    def wr_atomic_cmp_swp(self, rkey, remote_addr, compare, swap):
        self._new_send(e.IBV_WR_ATOMIC_CMP_AND_SWP, rkey=rkey, remote_addr=remote_addr,
                       compare_add=compare, swap=swap)

    def wr_atomic_fetch_add(self, rkey, remote_addr, add):
        self._new_send(e.IBV_WR_ATOMIC_FETCH_AND_ADD, rkey=rkey, remote_addr=remote_addr,
                       compare_add=add)

    def wr_local_inv(self, invalidate_rkey):
        self._new_send(e.IBV_WR_LOCAL_INV, invalidate_rkey=invalidate_rkey)

    def wr_bind_mw(self, mw, rkey, bind_info):
        if self._batch is None:
            self._fail(PyverbsRDMAError("A WR was built outside wr_start", errno.EINVAL))
            return
        try:
            window, mr, addr, length, access = bind_fields(mw, bind_info)
        except PyverbsUserError as err:
            self._fail(PyverbsRDMAError(str(err), errno.EINVAL))
            return
        wr = _mw.bind_wr(window, mr, addr, length, access, rkey=int(rkey) & 0xFFFFFFFF,
                         wr_id=self.wr_id, send_flags=int(self.wr_flags))
        self._batch.append(("send", wr))

    def wr_atomic_write(self, rkey, remote_addr, atomic_wr):
        data = bytes(atomic_wr)
        if len(data) < 8:
            self._fail(PyverbsRDMAError("ibv_wr_atomic_write takes 8 bytes", errno.EINVAL))
            return
        # The 8 bytes travel in the WR, as rxe copies them into the WQE.
        self._new_send(e.IBV_WR_ATOMIC_WRITE, rkey=rkey, remote_addr=remote_addr,
                       compare_add=int.from_bytes(data[:8], "little"))

    def wr_send_tso(self, hdr, hdr_sz, mss):
        self._fail(unsupported("TSO"))

    def wr_set_ud_addr(self, ah, remote_qpn, remote_qkey):
        wr = self._last_send()
        if wr is not None:
            wr.set_wr_ud(ah._obj, int(remote_qpn), int(remote_qkey))

    def wr_set_xrc_srqn(self, remote_srqn):
        self._fail(unsupported("XRC"))

    def wr_set_inline_data(self, addr, length):
        self._fail(unsupported("Inline data from this process's memory"))

    def wr_set_inline_data_list(self, num_buf, buf_list):
        self._fail(unsupported("Inline data from this process's memory"))

    def wr_set_sge(self, sge):
        wr = self._last_send()
        if wr is not None:
            wr.sg = [_SGE(int(sge.addr), int(sge.length), int(sge.lkey))]
            wr.num_sge = 1

    def wr_set_sge_list(self, num_sge, sg_list):
        wr = self._last_send()
        if wr is not None:
            wr.sg = [_SGE(int(s.addr), int(s.length), int(s.lkey)) for s in sg_list[:num_sge]]
            wr.num_sge = len(wr.sg)

    def wr_complete(self):
        batch, self._batch = self._batch, None
        err, self._error = self._error, None
        if batch is None:
            raise PyverbsRDMAError("ibv_wr_complete failed.", errno.EINVAL)
        if err is not None:
            reason = str(err).rsplit(". Errno: ", 1)[0]     # the code is appended again
            raise PyverbsRDMAError(f"ibv_wr_complete failed: {reason}", err.error_code)
        self._ctx._check()
        _sync.run(self._post_batch(batch), "ibv_wr_complete failed")

    async def _post_batch(self, batch):
        # Runs of sends go as one post_send with wr_complete (all or nothing, the send
        # queue's room for the whole run checked first), runs of MKEY-configure calls as
        # one mkey_configure, in order; each run is applied whole or refused whole by the
        # daemon, but a batch mixing both kinds can stop after an earlier run was posted
        # (ibv_wr_complete posts all or nothing). rdma-core's tests never mix them.
        i = 0
        while i < len(batch):
            kind = batch[i][0]
            j = i
            while j < len(batch) and batch[j][0] == kind:
                j += 1
            if kind == "send":
                await self._obj.post_send([item[1] for item in batch[i:j]], wr_complete=True)
            else:
                q = self._obj
                q.wr_start()
                for _, call in batch[i:j]:
                    call(q)
                await q.wr_complete()
            i = j
