"""pyverbs.device: the device list, Context (ibv_context) and what it reports.

A Context is one control session with the daemon (``_sync``). The device's attributes come
from the daemon (query_device); its one port is RoCE-like (Ethernet link layer, active)
with a one-entry GID table whose GID leads back to the daemon (``_route``).
"""

from __future__ import annotations

import errno
import weakref

from . import _sync, gid_table
from . import enums as e
from ._objects import Record, unmodelled, unsupported
from .addr import GID
from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

PORT = 1


class Device(PyverbsObject):
    def __init__(self, name, guid, node_type, transport_type, index):
        super().__init__()
        self.name = name
        self.guid = guid
        self.node_type = node_type
        self.transport_type = transport_type
        self.index = index

    def __str__(self):
        return (f"Device {self.name.decode()}, node type {translate_node_type(self.node_type)}, "
                f"transport type {translate_transport_type(self.transport_type)}, "
                f"guid {guid_to_hex(self.guid)}")


def get_device_list():
    """ibv_get_device_list(3): the daemon's devices (an mlx5 RoCE device reports node
    type CA and transport IB)."""
    return [Device(name.encode(), guid, e.IBV_NODE_CA, e.IBV_TRANSPORT_IB, i)
            for i, (name, guid) in enumerate(_sync.device_guids())]


def rdma_get_devices():
    return get_device_list()


class DeviceAttr(Record):
    _fields = tuple((n, 0) for n in (
        "fw_version", "node_guid", "sys_image_guid", "max_mr_size", "page_size_cap",
        "vendor_id", "vendor_part_id", "hw_ver", "max_qp", "max_qp_wr", "device_cap_flags",
        "max_sge", "max_sge_rd", "max_cq", "max_cqe", "max_mr", "max_pd", "max_qp_rd_atom",
        "max_ee_rd_atom", "max_res_rd_atom", "max_qp_init_rd_atom", "max_ee_init_rd_atom",
        "atomic_caps", "max_ee", "max_rdd", "max_mw", "max_raw_ipv6_qp", "max_raw_ethy_qp",
        "max_mcast_grp", "max_mcast_qp_attach", "max_total_mcast_qp_attach", "max_ah",
        "max_fmr", "max_map_per_fmr", "max_srq", "max_srq_wr", "max_srq_sge", "max_pkeys",
        "local_ca_ack_delay", "phys_port_cnt"))


class ODPCaps(Record):
    _fields = (("general_caps", 0), ("rc_odp_caps", 0), ("uc_odp_caps", 0),
               ("ud_odp_caps", 0), ("xrc_odp_caps", 0))


class PCIAtomicCaps(Record):
    _fields = (("fetch_add", 0), ("swap", 0), ("compare_swap", 0))


class TSOCaps(Record):
    _fields = (("max_tso", 0), ("supported_qpts", 0))


class RSSCaps(Record):
    _fields = (("supported_qpts", 0), ("max_rwq_indirection_tables", 0),
               ("rx_hash_fields_mask", 0), ("rx_hash_function", 0),
               ("max_rwq_indirection_table_size", 0))


class PacketPacingCaps(Record):
    _fields = (("qp_rate_limit_min", 0), ("qp_rate_limit_max", 0), ("supported_qpts", 0))


class TMCaps(Record):
    _fields = (("max_rndv_hdr_size", 0), ("max_num_tags", 0), ("flags", 0), ("max_ops", 0),
               ("max_sge", 0))


class CQModerationCaps(Record):
    _fields = (("max_cq_count", 0), ("max_cq_period", 0))


class DeviceAttrEx(Record):
    """struct ibv_device_attr_ex: softhca has no ODP, TSO, RSS, tag matching, pacing or
    device memory, so those capabilities are zero."""

    _fields = (("orig_attr", None), ("comp_mask", 0), ("odp_caps", None),
               ("completion_timestamp_mask", 0), ("hca_core_clock", 0),
               ("device_cap_flags_ex", 0), ("tso_caps", None), ("rss_caps", None),
               ("max_wq_type_rq", 0), ("packet_pacing_caps", None), ("raw_packet_caps", 0),
               ("tm_caps", None), ("cq_mod_caps", None), ("max_dm_size", 0),
               ("pci_atomic_caps", None), ("xrc_odp_caps", 0), ("phys_port_cnt_ex", 0))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, cls in (("odp_caps", ODPCaps), ("tso_caps", TSOCaps), ("rss_caps", RSSCaps),
                          ("packet_pacing_caps", PacketPacingCaps), ("tm_caps", TMCaps),
                          ("cq_mod_caps", CQModerationCaps),
                          ("pci_atomic_caps", PCIAtomicCaps)):
            if getattr(self, name) is None:
                setattr(self, name, cls())


class QueryDeviceExInput(Record):
    _fields = (("comp_mask", 0),)


class PortAttr(Record):
    _fields = tuple((n, 0) for n in (
        "state", "max_mtu", "active_mtu", "gid_tbl_len", "port_cap_flags", "max_msg_sz",
        "bad_pkey_cntr", "qkey_viol_cntr", "pkey_tbl_len", "lid", "sm_lid", "lmc",
        "max_vl_num", "sm_sl", "subnet_timeout", "init_type_reply", "active_width",
        "active_speed", "phys_state", "link_layer", "flags", "port_cap_flags2",
        "active_speed_ex"))


class GIDEntry(Record):
    _fields = (("subnet_prefix", 0), ("interface_id", 0), ("gid_index", 0), ("port_num", 0),
               ("gid_type", 0), ("ndev_ifindex", 0))

    def gid_str(self):
        from .utils import gid_str

        return gid_str(self.subnet_prefix, self.interface_id)


class AsyncEvent(PyverbsObject):
    """struct ibv_async_event: ``event_type`` and the object it concerns; ``ack()`` is
    ibv_ack_async_event(3)."""

    def __init__(self, event_type=0, element=None, element_type=None, _event=None):
        super().__init__()
        self.event_type = event_type
        self.element = element
        self.element_type = element_type
        self._event = _event

    def ack(self):
        if self._event is not None:
            _sync.run(self._event.ack(), "Failed to ack async event")


class AllocDmAttr(Record):
    _fields = (("length", 0), ("log_align_req", 0), ("comp_mask", 0))


DM = unmodelled("DM", "Device memory (ibv_alloc_dm)")


class FdArr(Record):
    """struct ibv_fd_arr (rdma-core v59): file descriptors for a privileged context."""

    _fields = (("arr", ()), ("count", 0))


class Context(PyverbsCM):
    """ibv_context: ``Context(name='mlx5_0')`` opens the device on the softhca daemon."""

    def __init__(self, **kwargs):
        super().__init__()
        self._node = None
        self._children = weakref.WeakSet()
        self.name = kwargs.get("name")
        for unsupported_kw, what in (("cmid", "Opening a device through an RDMA CM ID"),
                                     ("cmd_fd", "ibv_import_device")):
            if kwargs.get(unsupported_kw) is not None:
                raise unsupported(what)
        if self.name is None:
            raise PyverbsUserError("Device name must be provided")
        node = _sync.open_session()
        if self.name not in node.devices:
            _sync.close_session(node)
            raise PyverbsRDMAError(f"Failed to find device {self.name}")
        try:
            self._actx = _sync.run(node.open_device(self.name),
                                   f"Failed to open device {self.name}")
        except BaseException:
            _sync.close_session(node)
            raise
        self._node = node
        self._dev_index = node.devices.index(self.name)

    # -- lifetime ------------------------------------------------------------------------
    def close(self):
        node, self._node = self._node, None
        if node is None:
            return
        for child in list(self._children):
            child._obj = None
        _sync.close_session(node)

    def __del__(self):
        node = getattr(self, "_node", None)
        if node is not None:
            self._node = None
            _sync.close_session(node, wait=False)

    def _check(self):
        if self._node is None:
            raise PyverbsRDMAError(f"Context of {self.name} is closed", errno.EBADF)
        return self._node

    @property
    def context(self):
        return self._actx

    @property
    def num_comp_vectors(self):
        return 1

    @property
    def cmd_fd(self):
        """The context's command channel: its control connection's socket. Importing a
        context from it (Context(cmd_fd=...)) is not modelled."""
        self._check()
        sock = self._node._conn.writer.get_extra_info("socket")
        return sock.fileno()

    # -- queries -------------------------------------------------------------------------
    def _raw_attr(self) -> dict:
        self._check()
        return _sync.run(self._actx.query_device(), f"Failed to query device {self.name}")

    def query_device(self):
        a = self._raw_attr()
        guid = a.get("node_guid", 0)
        # Every attribute is the daemon's (server/device_attr.py), as the provider
        # passes them on: the two clients cannot disagree.
        names = ("max_mr_size", "page_size_cap", "vendor_id", "vendor_part_id", "max_qp",
                 "max_qp_wr", "device_cap_flags", "max_srq", "max_srq_wr", "max_srq_sge",
                 "max_sge", "max_sge_rd", "max_cq", "max_cqe", "max_mr", "max_mw", "max_pd",
                 "max_ah", "max_qp_rd_atom", "max_res_rd_atom", "max_qp_init_rd_atom",
                 "max_pkeys", "local_ca_ack_delay", "phys_port_cnt")
        return DeviceAttr(fw_version=a.get("fw_ver", ""), node_guid=guid,
                          sys_image_guid=guid, atomic_caps=a.get("atomic_cap", 0),
                          **{n: a.get(n, 0) for n in names})

    def query_device_ex(self, ex_input=None):
        attr = self.query_device()
        raw = self._raw_attr()
        odp = raw.get("odp_caps", {})
        return DeviceAttrEx(orig_attr=attr, phys_port_cnt_ex=attr.phys_port_cnt,
                            device_cap_flags_ex=raw.get("device_cap_flags_ex", 0),
                            odp_caps=ODPCaps(general_caps=odp.get("general_caps", 0),
                                             rc_odp_caps=odp.get("rc_odp_caps", 0)))

    def query_port(self, port_num):
        if port_num != PORT:
            raise PyverbsRDMAError(f"Failed to query port {port_num}", errno.EINVAL)
        a = self._raw_attr()
        return PortAttr(state=e.IBV_PORT_ACTIVE, max_mtu=e.IBV_MTU_4096,
                        active_mtu=e.IBV_MTU_4096, gid_tbl_len=a.get("gid_tbl_len", 1),
                        port_cap_flags=0,
                        max_msg_sz=a.get("max_msg_sz", 0), pkey_tbl_len=1, max_vl_num=1,
                        subnet_timeout=18, active_width=2, active_speed=32, phys_state=5,
                        link_layer=e.IBV_LINK_LAYER_ETHERNET)

    def query_gid(self, port_num, index):
        self._check()
        gid = GID()
        gid.raw = gid_table.query_gid(self, port_num, index)
        return gid

    def query_gid_type(self, port_num, index):
        self._check()
        return gid_table.query_gid_type(self, port_num, index)

    def query_pkey(self, port_num, index):
        if port_num != PORT or index != 0:
            raise PyverbsRDMAError(f"Failed to query pkey {index} of port {port_num}",
                                   errno.EINVAL)
        return 0xFFFF

    def get_pkey_index(self, port_num, pkey):
        """ibv_get_pkey_index(3): the index of ``pkey`` in the port's P_Key table (one
        entry, the default P_Key 0xFFFF, as query_pkey answers)."""
        if port_num != PORT or pkey != 0xFFFF:
            raise PyverbsRDMAError(f"Failed to get P_Key index of {pkey:#x} on port "
                                   f"{port_num}", errno.ENOENT)
        return 0

    def _gid_entry(self):
        raw = self.query_gid(PORT, 0).raw
        return GIDEntry(int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little"),
                        0, PORT, e.IBV_GID_TYPE_ROCE_V2, 0)

    def query_gid_table(self, max_entries, flags=0):
        self._check()
        return gid_table.entries(self, GIDEntry, max_entries)

    def query_gid_ex(self, port_num, gid_index, flags=0):
        self._check()
        return gid_table.query_gid_ex(self, GIDEntry, port_num, gid_index)

    def query_rt_values_ex(self, comp_mask=0):
        raise unsupported("ibv_query_rt_values_ex (a device clock)")

    def get_async_event(self):
        """ibv_get_async_event(3): blocks until the device reports an event."""
        self._check()
        ev = _sync.run(self._actx.get_async_event(None), "Failed to get async event")
        element, kind = None, None
        if ev.qp_num is not None:
            element = next((c for c in list(self._children)
                            if getattr(c, "_qp_num", None) == ev.qp_num), None)
            kind = "qp" if element else None
        elif ev.srq is not None:
            element = next((c for c in list(self._children)
                            if getattr(c, "_obj", None) is ev.srq), None)
            kind = "srq" if element else None
        return AsyncEvent(int(ev.event_type), element, kind, ev)


# -- the text helpers of pyverbs.device -------------------------------------------------

_NODE_TYPES = {1: "CA", 2: "Switch", 3: "Router", 4: "RNIC", 5: "USNIC", 6: "USNIC UDP",
               7: "Unspecified"}
_TRANSPORTS = {0: "IB", 1: "IWARP", 2: "USNIC", 3: "USNIC UDP", 4: "Unspecified"}
_PORT_STATES = {0: "NOP", 1: "Down", 2: "Init", 3: "Armed", 4: "Active", 5: "Active defer"}
_PHYS_STATES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "Port configuration training",
                5: "Link up", 6: "Link error recovery", 7: "Phy test"}
_WIDTHS = {1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}
_SPEEDS = {0: "0.0 Gbps", 1: "2.5 Gbps", 2: "5.0 Gbps", 4: "5.0 Gbps", 8: "10.0 Gbps",
           16: "14.0 Gbps", 32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps",
           256: "200.0 Gbps"}
_LINK_LAYERS = {0: "Unspecified", 1: "InfiniBand", 2: "Ethernet"}
_EVENTS = {int(v): k for k, v in e.ibv_event_type.__members__.items()}


def _text(table, value, what):
    return table.get(value, f"Invalid {what} {value}")


def translate_node_type(node_type):
    return _text(_NODE_TYPES, node_type, "node type")


def translate_transport_type(transport_type):
    return _text(_TRANSPORTS, transport_type, "transport type")


def guid_format(num):
    h = f"{num:016x}"
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))


def guid_to_hex(node_guid):
    return hex(node_guid).replace("L", "").replace("0x", "")


def port_state_to_str(port_state):
    return _text(_PORT_STATES, port_state, "state")


def phys_state_to_str(phys):
    return _text(_PHYS_STATES, phys, "physical state")


def translate_mtu(mtu):
    return f"{128 << mtu}" if 1 <= mtu <= 5 else f"Invalid MTU {mtu}"


def translate_link_layer(ll):
    return _text(_LINK_LAYERS, ll, "link layer")


def width_to_str(width):
    return _text(_WIDTHS, width, "width")


def speed_to_str(speed, speed_ex=0):
    # v59 passes active_speed_ex too: when not 0 it is the speed (the newer encoding).
    return _text(_SPEEDS, speed_ex or speed, "speed")


def translate_gid_type(gid_type):
    return {0: "IB/RoCE v1", 1: "RoCE v2"}.get(gid_type, f"Invalid gid type {gid_type}")


def translate_event_type(event_type):
    return _EVENTS.get(event_type, f"Unknown event type {event_type}")


def _flags_text(flags, enum_cls):
    return " ".join(m.name for m in enum_cls if m.value and flags & m.value == m.value)


def translate_port_cap_flags(flags):
    return _flags_text(flags, e.ibv_port_cap_flags)


def translate_port_cap_flags2(flags):
    return _flags_text(flags, e.ibv_port_cap_flags2)


def translate_device_caps(flags):
    return _flags_text(flags, e.ibv_device_cap_flags)
