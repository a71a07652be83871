"""pyverbs.addr: GIDs, global routes, address vectors (AHAttr) and address handles."""

from __future__ import annotations

import errno

from . import _route
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
    """ibv_create_ah(3): an address handle of a PD. softhca resolves its dgid to a daemon
    (``_route``) when it is created, so a GID that leads nowhere fails here with EINVAL.
    Only UD uses AHs, and softhca models no UD QP."""

    def __init__(self, pd, **kwargs):
        super().__init__()
        attr = kwargs.get("attr")
        if attr is None:
            raise PyverbsUserError("softhca creates AHs from an AHAttr (attr=); "
                                   "ibv_create_ah_from_wc needs a UD receive")
        # A RoCE port has no LIDs: its address vectors need a GRH (ibv_create_ah(3)).
        if not attr.is_global or attr.gr is None or attr.gr.dgid is None:
            raise PyverbsRDMAError("Failed to create AH: a RoCE address vector needs a GRH "
                                   "(is_global=1 with a dgid)", errno.EINVAL)
        try:
            _route.route(attr.gr.dgid.raw, getattr(getattr(pd, "_ctx", None), "_node", None)
                         and pd._ctx._node.port)
        except PyverbsRDMAError as ex:
            raise PyverbsRDMAError(f"Failed to create AH: {ex}", ex.error_code) from None
        self.ah_attr = attr
        self.pd = pd
