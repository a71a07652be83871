"""pyverbs.providers.mlx5.mlx5dv: the mlx5 direct-verbs context, QP and CQ.

Mlx5QP adds the mlx5dv WR builders to QPEx: mlx5dv_wr_mkey_configure(3) and its setters,
and the older mlx5dv_wr_mr_list / mlx5dv_wr_mr_interleaved (mlx5dv_wr_post(3)), which
register the same indirect layouts: each is posted as the configure WR with its access
flags and layout setters. DevX, UAR, UMEM, VAR, packet pacing, DC and raw WQEs are not
modelled: creating them raises EOPNOTSUPP.
"""

from __future__ import annotations

import errno

from .....protocol.attrs import SGE as _SGE
from ... import _sync
from ..._objects import Record, unmodelled, unsupported
from ...base import PyverbsObject
from ...cq import CQEX
from ...device import Context, _flags_text
from ...pyverbs_error import PyverbsRDMAError, PyverbsUserError
from ...qp import QPEx
from . import mlx5_enums as dve


class Mlx5DVContextAttr(Record):
    # fds: an FdArr (v59's MLX5DV_CONTEXT_ATTR_MASK_FD_ARRAY).
    _fields = (("flags", 0), ("comp_mask", 0), ("fds", None))


class Mlx5DVPortAttr(Record):
    _fields = (("flags", 0), ("vport", 0), ("vport_vhca_id", 0), ("esw_owner_vhca_id", 0),
               ("vport_steering_icm_rx", 0), ("vport_steering_icm_tx", 0),
               ("reg_c0_value", 0), ("reg_c0_mask", 0))


class Mlx5DVContext(Record):
    """struct mlx5dv_context; ``crypto_caps`` is a dict as pyverbs returns it."""

    _fields = (("version", 0), ("flags", 0), ("comp_mask", 0), ("cqe_comp_caps", None),
               ("sw_parsing_caps", None), ("striding_rq_caps", None),
               ("tunnel_offload_caps", 0), ("max_dynamic_bfregs", 0),
               ("max_clock_info_update_nsec", 0), ("flow_action_flags", 0),
               ("dc_odp_caps", 0), ("crypto_caps", None), ("num_lag_ports", 0),
               ("dci_streams_caps", None), ("max_wr_memcpy_length", 0))


# What a device without crypto engines reports (mlx5dv_query_device(3)).
NO_CRYPTO = {"failed_selftests": 0, "crypto_engines": 0, "wrapped_import_method": 0,
             "log_max_num_deks": 0, "flags": 0}


class Mlx5Context(Context):
    """mlx5dv_open_device(3)"""

    def __init__(self, attr, name=""):
        if attr is None:
            raise PyverbsUserError("Mlx5Context needs an Mlx5DVContextAttr")
        super().__init__(name=name)
        if attr.flags & ~dve.MLX5DV_CONTEXT_FLAGS_DEVX:
            self.close()
            raise unsupported(f"mlx5dv_open_device flags {attr.flags:#x}")
        if attr.flags & dve.MLX5DV_CONTEXT_FLAGS_DEVX:
            self.close()
            raise unsupported("DevX (MLX5DV_CONTEXT_FLAGS_DEVX)")

    def query_mlx5_device(self, comp_mask=-1):
        self._check()
        query = getattr(self._actx, "query_mlx5_device", None)
        caps = dict(NO_CRYPTO)
        if query is not None:
            got = _sync.run(query(), f"Failed to query mlx5 device {self.name}.")
            caps.update(got.get("crypto_caps", got) if isinstance(got, dict) else {})
        return Mlx5DVContext(version=1, comp_mask=0 if comp_mask == -1 else comp_mask,
                             crypto_caps=caps, num_lag_ports=0,
                             cqe_comp_caps={"max_num": 0, "supported_format": 0},
                             sw_parsing_caps={"sw_parsing_offloads": 0,
                                              "supported_qpts": 0},
                             striding_rq_caps={"min_single_stride_log_num_of_bytes": 0,
                                               "max_single_stride_log_num_of_bytes": 0,
                                               "min_single_wqe_log_num_of_strides": 0,
                                               "max_single_wqe_log_num_of_strides": 0,
                                               "supported_qpts": 0},
                             dci_streams_caps={"max_log_num_concurent": 0,
                                               "max_log_num_errored": 0})

    @staticmethod
    def query_mlx5_port(ctx, port_num):
        """mlx5dv_query_port(3): softhca's port belongs to no e-switch, so no vport,
        steering or REG_C0 information is valid (flags 0), as on a NIC outside
        switchdev mode."""
        ctx._check()
        if port_num != 1:
            raise PyverbsRDMAError(f"Failed to query dv port mlx5 {ctx.name} port "
                                   f"{port_num}.", errno.EINVAL)
        return Mlx5DVPortAttr()

    @staticmethod
    def reserved_qpn_alloc(ctx):
        raise unsupported("mlx5dv_reserved_qpn_alloc")

    @staticmethod
    def reserved_qpn_dealloc(ctx, qpn):
        raise unsupported("mlx5dv_reserved_qpn_dealloc")

    @staticmethod
    def _crypto(ctx, name, what):
        ctx._check()
        fn = getattr(ctx._actx, name, None)
        if fn is None:
            raise unsupported(what)
        return fn

    @staticmethod
    def crypto_login(ctx, login_attr):
        fn = Mlx5Context._crypto(ctx, "crypto_login", "mlx5dv_crypto_login")
        _sync.run(fn(bytes(login_attr.credential), int(login_attr.import_kek_id)),
                  "Failed to create crypto login session.")

    @staticmethod
    def query_login_state(ctx):
        fn = Mlx5Context._crypto(ctx, "query_login_state", "mlx5dv_crypto_login_query_state")
        return _sync.run(fn(), "Failed to query the crypto login session state.")

    @staticmethod
    def crypto_logout(ctx):
        fn = Mlx5Context._crypto(ctx, "crypto_logout", "mlx5dv_crypto_logout")
        _sync.run(fn(), "Failed to logout from crypto login session.")

    def devx_general_cmd(self, in_, outlen):
        raise unsupported("DevX")

    def devx_query_eqn(self, vector):
        raise unsupported("DevX")

    @staticmethod
    def device_timestamp_to_ns(ctx, device_timestamp):
        raise unsupported("Device timestamps")


class Mlx5DCIStreamInitAttr(Record):
    _fields = (("log_num_concurent", 0), ("log_num_errored", 0))


class Mlx5DVDCInitAttr(Record):
    _fields = (("dc_type", dve.MLX5DV_DCTYPE_DCI), ("dct_access_key", 0),
               ("dci_streams", None))


class Mlx5DVQPInitAttr(Record):
    _fields = (("comp_mask", 0), ("create_flags", 0), ("dc_init_attr", None),
               ("send_ops_flags", 0))

    @property
    def dc_type(self):
        return self.dc_init_attr.dc_type if self.dc_init_attr is not None else 0


# mlx5dv_create_qp(3) create flags. Disabling scatter-to-CQE only changes where the
# hardware puts small receives, never what the application sees, so softhca accepts it.
_HINT_FLAGS = dve.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE
_MKEY_OPS = (dve.MLX5DV_QP_EX_WITH_MR_INTERLEAVED | dve.MLX5DV_QP_EX_WITH_MR_LIST
             | dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)


class Mlx5QP(QPEx):
    """mlx5dv_create_qp(3)"""

    def __init__(self, context, init_attr, dv_init_attr=None):
        dv = dv_init_attr or Mlx5DVQPInitAttr()
        self._dv_user_ops = 0
        if dv.comp_mask & dve.MLX5DV_QP_INIT_ATTR_MASK_DC or dv.dc_init_attr is not None \
                and dv.comp_mask & dve.MLX5DV_QP_INIT_ATTR_MASK_DC:
            raise unsupported("DC QPs")
        if dv.comp_mask & dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS:
            self._dv_user_ops = int(dv.send_ops_flags)
            extra = self._dv_user_ops & ~_MKEY_OPS
            if extra:
                raise unsupported(f"mlx5dv send_ops_flags {extra:#x} (raw WQEs, memcpy)")
        flags = int(dv.create_flags) if dv.comp_mask & \
            dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS else 0
        device_flags = flags & ~_HINT_FLAGS
        if device_flags & ~dve.MLX5DV_QP_CREATE_SIG_PIPELINING:
            raise unsupported(f"mlx5dv_create_qp create_flags {device_flags:#x}")
        self._dv_create_flags = device_flags
        # The daemon's QP takes configure WRs when any of the three builders is allowed;
        # which of them the application may call is checked here, per its own flags.
        self._dv_send_ops = dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE \
            if self._dv_user_ops & _MKEY_OPS else 0
        super().__init__(context, init_attr)

    def _mkey_call(self, needed, name, apply):
        if self._batch is None:
            self._fail(PyverbsRDMAError("A WR was built outside wr_start", errno.EINVAL))
            return
        if needed and not self._dv_user_ops & needed:
            self._fail(unsupported(f"{name} on a QP created without "
                                   f"{dve.mlx5dv_qp_create_send_ops_flags(needed).name}"))
            return
        self._batch.append(("mkey", apply))

    def _configure(self, mkey, num_setters, conf, needed, name):
        wr_id, wr_flags = int(self.wr_id), int(self.wr_flags)
        mobj = mkey._obj

        def apply(q):
            q.wr_id, q.wr_flags = wr_id, wr_flags
            q.wr_mkey_configure(mobj, int(num_setters), conf)

        self._mkey_call(needed, name, apply)

    def wr_mkey_configure(self, mkey, num_setters, mkey_config):
        self._configure(mkey, num_setters, mkey_config._attr(),
                        dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE, "mlx5dv_wr_mkey_configure")

    def wr_set_mkey_access_flags(self, access_flags):
        self._mkey_call(0, "", lambda q: q.wr_set_mkey_access_flags(int(access_flags)))

    def wr_set_mkey_layout_list(self, sge_list):
        sges = [_SGE(int(s.addr), int(s.length), int(s.lkey)) for s in sge_list]
        self._mkey_call(0, "", lambda q: q.wr_set_mkey_layout_list(sges))

    def wr_set_mkey_layout_interleaved(self, repeat_count, mr_interleaved_lst):
        data = [m._attr() for m in mr_interleaved_lst]
        self._mkey_call(0, "", lambda q: q.wr_set_mkey_layout_interleaved(int(repeat_count),
                                                                           data))

    def wr_set_mkey_sig_block(self, block_attr):
        attr = block_attr._attr()
        self._mkey_call(0, "", lambda q: q.wr_set_mkey_sig_block(attr))

    def wr_set_mkey_crypto(self, attr):
        a = attr._attr()
        self._mkey_call(0, "", lambda q: q.wr_set_mkey_crypto(a))

    def wr_mr_list(self, mkey, access_flags, sge_list):
        from .mlx5dv_mkey import Mlx5MkeyConfAttr

        self._configure(mkey, 2, Mlx5MkeyConfAttr()._attr(), dve.MLX5DV_QP_EX_WITH_MR_LIST,
                        "mlx5dv_wr_mr_list")
        self.wr_set_mkey_access_flags(access_flags)
        self.wr_set_mkey_layout_list(sge_list)

    def wr_mr_interleaved(self, mkey, access_flags, repeat_count, mr_interleaved_lst):
        from .mlx5dv_mkey import Mlx5MkeyConfAttr

        self._configure(mkey, 2, Mlx5MkeyConfAttr()._attr(),
                        dve.MLX5DV_QP_EX_WITH_MR_INTERLEAVED, "mlx5dv_wr_mr_interleaved")
        self.wr_set_mkey_access_flags(access_flags)
        self.wr_set_mkey_layout_interleaved(repeat_count, mr_interleaved_lst)

    def wr_set_dc_addr(self, ah, remote_dctn, remote_dc_key):
        self._fail(unsupported("DC QPs"))

    def wr_set_dc_addr_stream(self, ah, remote_dctn, remote_dc_key, stream_id):
        self._fail(unsupported("DC QPs"))

    def wr_raw_wqe(self, wqe):
        self._fail(unsupported("Raw WQEs"))

    def wr_memcpy(self, dest_lkey, dest_addr, src_lkey, src_addr, length):
        self._fail(unsupported("mlx5dv_wr_memcpy"))

    def cancel_posted_send_wrs(self, wr_id):
        fn = getattr(self._obj, "cancel_posted_send_wrs", None)
        if fn is None:
            raise unsupported("mlx5dv_qp_cancel_posted_send_wrs")
        return _sync.run(fn(int(wr_id)), "Failed to cancel send WRs")

    @staticmethod
    def query_lag_port(qp):
        raise unsupported("LAG ports")

    @staticmethod
    def modify_lag_port(qp, port_num):
        raise unsupported("LAG ports")

    @staticmethod
    def modify_qp_sched_elem(qp, req_sched_leaf=None, resp_sched_leaf=None):
        raise unsupported("Scheduling elements")

    @staticmethod
    def modify_udp_sport(qp, udp_sport):
        raise unsupported("mlx5dv_modify_qp_udp_sport")

    @staticmethod
    def map_ah_to_qp(ah, qp_num):
        raise unsupported("mlx5dv_map_ah_to_qp")

    @staticmethod
    def modify_dci_stream_channel_id(qp, stream_id):
        raise unsupported("DCI streams")


class Mlx5DVCQInitAttr(Record):
    _fields = (("comp_mask", 0), ("cqe_comp_res_format", 0), ("flags", 0), ("cqe_size", 0))


class Mlx5CQ(CQEX):
    """mlx5dv_create_cq(3). CQE compression and padding are not modelled (EOPNOTSUPP);
    the CQE size is taken as the provider takes it (cq.cqe_size)."""

    def __init__(self, context, init_attr, dv_init_attr=None):
        dv = dv_init_attr or Mlx5DVCQInitAttr()
        if dv.comp_mask & (dve.MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE
                           | dve.MLX5DV_CQ_INIT_ATTR_MASK_FLAGS):
            raise unsupported("mlx5dv_create_cq CQE compression and padding")
        size = dv.cqe_size if dv.comp_mask & dve.MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE else None
        super().__init__(context, init_attr, size)


Mlx5DevxObj = unmodelled("Mlx5DevxObj", "DevX objects")
Mlx5UMEM = unmodelled("Mlx5UMEM", "DevX UMEMs")
Mlx5UAR = unmodelled("Mlx5UAR", "UARs")
Mlx5VAR = unmodelled("Mlx5VAR", "VARs")
Mlx5PP = unmodelled("Mlx5PP", "Packet pacing")
Mlx5DmOpAddr = unmodelled("Mlx5DmOpAddr", "Device memory operations")
Mlx5DevxEq = unmodelled("Mlx5DevxEq", "DevX EQs")
Mlx5DevxMsiVector = unmodelled("Mlx5DevxMsiVector", "DevX MSI vectors")
WqeSeg = unmodelled("WqeSeg", "Raw WQEs")
WqeCtrlSeg = unmodelled("WqeCtrlSeg", "Raw WQEs", WqeSeg)
WqeDataSeg = unmodelled("WqeDataSeg", "Raw WQEs", WqeSeg)
Wqe = unmodelled("Wqe", "Raw WQEs")
Mlx5Cqe64 = unmodelled("Mlx5Cqe64", "Raw CQEs", PyverbsObject)


def context_flags_to_str(flags):
    return _flags_text(flags, dve.mlx5dv_context_flags) or "None"


def context_comp_mask_to_str(mask):
    return _flags_text(mask, dve.mlx5dv_context_comp_mask) or "None"


def cqe_comp_to_str(cqe):
    return _flags_text(cqe, dve.mlx5dv_cqe_comp_res_format) or "None"


def send_ops_flags_to_str(flags):
    return _flags_text(flags, dve.mlx5dv_qp_create_send_ops_flags) or "None"
