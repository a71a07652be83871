"""pyverbs.srq: shared receive queues (ibv_create_srq(3), ibv_modify_srq(3),
ibv_query_srq(3), ibv_post_srq_recv(3)) over the async client's SRQ.

Basic SRQs only: XRC SRQs (an XRCD) and tag-matching SRQs (OpsWr) raise EOPNOTSUPP, as a
device without them answers."""

from __future__ import annotations

from . import _sync
from . import enums as e
from ._objects import Record, Resource, attributes, check_alloc_type, unsupported
from .pyverbs_error import PyverbsUserError
from .wr import recv_wrs


class SrqAttr(Record):
    """struct ibv_srq_attr, with pyverbs' defaults."""

    _fields = (("max_wr", 100), ("max_sge", 1), ("srq_limit", 0))


class SrqInitAttr(Record):
    """struct ibv_srq_init_attr: its ``attr`` (an SrqAttr; pyverbs' defaults when None),
    whose fields it shows as its own."""

    _fields = (("attr", None),)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.attr is None:
            self.attr = SrqAttr()

    max_wr = property(lambda self: self.attr.max_wr)
    max_sge = property(lambda self: self.attr.max_sge)
    srq_limit = property(lambda self: self.attr.srq_limit)


class SrqInitAttrEx(Record):
    """struct ibv_srq_init_attr_ex (ibv_create_srq_ex(3))."""

    _fields = (("max_wr", 100), ("max_sge", 1), ("srq_limit", 0), ("comp_mask", 0),
               ("srq_type", e.IBV_SRQT_BASIC), ("pd", None), ("xrcd", None), ("cq", None),
               ("tm_cap", None))


OpsWr = attributes("OpsWr")


class SRQ(Resource):
    """ibv_create_srq(3) on a PD with an SrqInitAttr, or ibv_create_srq_ex(3) on a
    Context with an SrqInitAttrEx (IBV_SRQ_INIT_ATTR_PD required)."""

    def __init__(self, creator, attr):
        super().__init__()
        from .device import Context
        from .pd import PD

        if isinstance(creator, PD):
            pd = creator
        elif isinstance(creator, Context):
            pd = self._pd_of_ex(attr)
        else:
            raise PyverbsUserError("SRQ needs either Context or PD for creation")
        pd._ctx._check()
        check_alloc_type("MLX_SRQ", "SRQ")
        self._pd = self.pd = pd
        self.cq = getattr(attr, "cq", None)
        obj = _sync.run(pd._obj.create_srq(attr.max_wr, attr.max_sge, attr.srq_limit),
                        "Failed to create SRQ")
        self._adopt(pd._ctx, obj)

    @staticmethod
    def _pd_of_ex(attr):
        mask = attr.comp_mask
        if mask & e.IBV_SRQ_INIT_ATTR_TYPE and attr.srq_type != e.IBV_SRQT_BASIC:
            raise unsupported("XRC and tag-matching SRQs")
        if mask & (e.IBV_SRQ_INIT_ATTR_XRCD | e.IBV_SRQ_INIT_ATTR_TM):
            raise unsupported("XRC and tag-matching SRQs")
        if not mask & e.IBV_SRQ_INIT_ATTR_PD or attr.pd is None:
            raise PyverbsUserError("ibv_create_srq_ex needs IBV_SRQ_INIT_ATTR_PD and a pd")
        return attr.pd

    def get_srq_num(self):
        raise unsupported("XRC SRQ numbers (ibv_get_srq_num)")

    def modify(self, attr, comp_mask):
        """ibv_modify_srq(3) with IBV_SRQ_MAX_WR and / or IBV_SRQ_LIMIT."""
        self._ctx._check()
        _sync.run(self._obj.modify(
            attr.max_wr if comp_mask & e.IBV_SRQ_MAX_WR else None,
            attr.srq_limit if comp_mask & e.IBV_SRQ_LIMIT else None), "Failed to modify SRQ")

    def query(self):
        """ibv_query_srq(3): an SrqAttr."""
        self._ctx._check()
        a = _sync.run(self._obj.query(), "Failed to query SRQ")
        return SrqAttr(a["max_wr"], a["max_sge"], a["srq_limit"])

    def post_recv(self, wr, bad_wr=None):
        """ibv_post_srq_recv(3) of a RecvWR and the WRs chained to it."""
        _sync.run(self._obj.post_recv(recv_wrs(wr, self._ctx)), "Failed to post receive to SRQ")

    def _dependents(self):
        # A QP taking its receives from the SRQ goes before it, as pyverbs closes them.
        return [c for c in list(self._ctx._children) if getattr(c, "_srq", None) is self]
