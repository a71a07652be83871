"""pyverbs.addr: GIDs, global routes, address vectors (AHAttr) and address handles."""

from __future__ import annotations

import errno

from .. import ah as _ah
from .. import api
from . import _route, _sync
from ._objects import Record, Resource, delegate
from .base import PyverbsObject
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError


class GID(PyverbsObject):
    """union ibv_gid; ``gid`` is its 'xxxx:xxxx:...:xxxx' text."""

    def __init__(self, val=None):
        super().__init__()
        self.raw = bytes(16)
        if val is not None:
            self.gid = val

    @property
    def gid(self):
        return _route.format_gid(self.raw)

    @gid.setter
    def gid(self, val):
        text = str(val).replace(":", "")
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = b""
        if len(raw) != 16:
            raise PyverbsUserError(f"Invalid GID {val!r}: expected 8 groups of 4 hex digits")
        self.raw = raw

    def __str__(self):
        return self.gid

    def __eq__(self, other):
        return isinstance(other, GID) and other.raw == self.raw

    def __hash__(self):
        return hash(self.raw)


class GRH(Record):
    _fields = (("sgid", None), ("dgid", None), ("version_tclass_flow", 0), ("paylen", 0),
               ("next_hdr", 0), ("hop_limit", 1))


class GlobalRoute(Record):
    _fields = (("dgid", None), ("flow_label", 0), ("sgid_index", 0), ("hop_limit", 1),
               ("traffic_class", 0))


class AHAttr(Record):
    """struct ibv_ah_attr; with ``gr`` (a GlobalRoute) and is_global=1 its dgid routes."""

    _fields = (("dlid", 0), ("sl", 0), ("src_path_bits", 0), ("static_rate", 0),
               ("is_global", 0), ("port_num", 1), ("gr", None))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.gr is None:
            self.gr = GlobalRoute()

    # pyverbs exposes the GlobalRoute's fields on the AHAttr too.
    dgid = delegate("gr", "dgid")
    sgid_index = delegate("gr", "sgid_index")
    flow_label = delegate("gr", "flow_label")
    hop_limit = delegate("gr", "hop_limit")
    traffic_class = delegate("gr", "traffic_class")


class AH(Resource):
    """ibv_create_ah(3): an address handle of a PD for a UD QP's send WRs. From an AHAttr
    (``attr=``) whose dgid, a softhca GID (``_route``), names the daemon and device its
    packets go to (a GID that leads nowhere is EINVAL), or, as
    ibv_create_ah_from_wc(3), from a UD receive's WC (``wc=``), the GRH its buffer began
    with (``grh=``: a GRH, its 40 bytes, or the address of the buffer in an MR of this
    PD) and ``port_num``."""

    def __init__(self, pd, **kwargs):
        super().__init__()
        pd._ctx._check()
        if "attr" in kwargs:
            obj = self._from_attr(pd, kwargs["attr"])
        elif "wc" in kwargs:
            obj = self._from_wc(pd, kwargs["wc"], kwargs.get("grh"), kwargs.get("port_num", 1))
        else:
            raise PyverbsUserError("AH takes attr= (an AHAttr) or wc=, grh=, port_num=")
        self._adopt(pd._ctx, obj)
        # PD._dependents: closed before its PD, as pyverbs does.
        self._pd = self.pd = pd

    @staticmethod
    def _from_attr(pd, attr):
        # A RoCE port has no LIDs: its address vectors need a GRH (ibv_create_ah(3)).
        if not attr.is_global or attr.gr is None or attr.gr.dgid is None:
            raise PyverbsRDMAError("Failed to create AH: a RoCE address vector needs a GRH "
                                   "(is_global=1 with a dgid)", errno.EINVAL)
        try:
            host, port, index = _route.route(
                attr.gr.dgid.raw, getattr(getattr(pd, "_ctx", None), "_node", None)
                and pd._ctx._node.port)
        except PyverbsRDMAError as ex:
            raise PyverbsRDMAError(f"Failed to create AH: {ex}", ex.error_code) from None
        sgid = pd._ctx.query_gid(attr.port_num, attr.gr.sgid_index).raw
        peer = api.QPInfo(host, port, _device_name(pd, host, port, index), 0)
        return _sync.run(pd._obj.create_ah(
            peer, sgid=sgid, dgid=attr.gr.dgid.raw, traffic_class=int(attr.gr.traffic_class),
            hop_limit=int(attr.gr.hop_limit), flow_label=int(attr.gr.flow_label)),
            "Failed to create AH")

    @staticmethod
    def _from_wc(pd, wc, grh, port_num):
        if port_num != 1:
            raise PyverbsRDMAError(f"Failed to create AH: port {port_num} does not exist",
                                   errno.EINVAL)
        raw = _grh_bytes(pd, grh)
        host, port, index = _route.route(ah_route(raw)["dgid"])
        name = _device_name(pd, host, port, index)
        return _sync.run(pd._obj.create_ah_from_wc(_client_wc(wc), raw, name),
                         "Failed to create AH")


def ah_route(raw: bytes) -> dict:
    return _ah.reply_route(raw)


def _device_name(pd, host, port, index) -> str:
    node = pd._ctx._node
    names = node.devices if _route.same_daemon(host, port, node.host, node.port) \
        else _sync.device_names(f"{host}:{port}")
    if index >= len(names):
        raise PyverbsRDMAError(f"Failed to create AH: the daemon at {host}:{port} has no "
                               f"device {index}", errno.EINVAL)
    return names[index]


def _grh_bytes(pd, grh) -> bytes:
    """The 40 GRH bytes of ``grh``: a GRH record, bytes, or an address in an MR of the PD
    (the receive buffer, as C passes a pointer)."""
    if isinstance(grh, GRH):
        first = int(grh.version_tclass_flow)
        return (first.to_bytes(4, "big") + int(grh.paylen).to_bytes(2, "big")
                + bytes([int(grh.next_hdr), int(grh.hop_limit)]) + grh.sgid.raw + grh.dgid.raw)
    if isinstance(grh, (bytes, bytearray, memoryview)):
        return bytes(grh)
    if isinstance(grh, int):
        # The PD's MRs (pyverbs.mr imports this module's neighbours: no import here).
        for mr in pd._dependents():
            buf = getattr(mr, "buf", None) if hasattr(mr, "read") else None
            if isinstance(buf, int) and buf <= grh and grh + 40 <= buf + mr.length:
                return bytes(mr.read(40, grh - buf))
    raise PyverbsUserError("grh must be a GRH, its 40 bytes, or an address inside an MR "
                           "of this PD")


def _client_wc(wc):
    """The async client's WC for a pyverbs WC (the fields ibv_create_ah_from_wc reads)."""
    return api.WC(int(wc.wr_id), int(wc.status), int(wc.opcode), int(wc.byte_len),
                  int(wc.qp_num), None, int(wc.wc_flags), src_qp=int(wc.src_qp))
