"""pyverbs.mr's memory windows: MW, MWBindInfo, MWBind (client/mw.py underneath).

A window's binds are work requests: ``QP.bind_mw`` (type 1, ibv_bind_mw(3)) and a
``SendWR`` with ``set_bind_wr`` or ``QPEx.wr_bind_mw`` (type 2, IBV_WR_BIND_MW). As in
C, a type 1 window's ``rkey`` changes with each bind; a type 2 window's stays what
ibv_alloc_mw gave, and the bound rkey is the WR's (``SendWR.rkey``).
"""

from __future__ import annotations

from .. import mw as _mw
from . import _sync
from ._objects import Record, Resource
from .pyverbs_error import PyverbsUserError


class MWBindInfo(Record):
    """struct ibv_mw_bind_info"""

    _fields = (("mr", None), ("addr", 0), ("length", 0), ("mw_access_flags", 0),
               ("bind_flags", 0))


class MWBind(Record):
    """struct ibv_mw_bind"""

    _fields = (("bind_info", None), ("send_flags", 0), ("wr_id", 0))


class MW(Resource):
    """ibv_alloc_mw(3) on a PD: ``MW(pd, mw_type)``."""

    # Closed before the other objects of its PD (PD._dependents): an MR with a window
    # bound cannot be deregistered.
    _closes_first = True

    def __init__(self, pd, mw_type):
        super().__init__()
        if not hasattr(getattr(pd, "_obj", None), "alloc_mw"):
            raise PyverbsUserError(f"MW needs a PD, got {type(pd).__name__}")
        pd._ctx._check()
        self._pd = self.pd = pd
        self._adopt(pd._ctx, _sync.run(pd._obj.alloc_mw(int(mw_type)), "Failed to allocate MW"))

    @property
    def rkey(self):
        return self._obj.rkey if self._obj is not None else 0

    @property
    def type(self):
        return self._obj.type if self._obj is not None else 0

    @property
    def handle(self):
        return self._obj.handle if self._obj is not None else 0

    def __str__(self):
        return f"MW:\nRkey                  : {self.rkey}\nMW Type               : {self.type}"


def bind_fields(mw, bind_info):
    """(the client's window, mr, addr, length, access) of a pyverbs bind."""
    if not isinstance(mw, MW) or mw._obj is None:
        raise PyverbsUserError("A bind needs an open MW")
    if not isinstance(bind_info, MWBindInfo):
        raise PyverbsUserError("A bind needs an MWBindInfo")
    mr = bind_info.mr._obj if bind_info.mr is not None else None
    return (mw._obj, mr, int(bind_info.addr), int(bind_info.length),
            int(bind_info.mw_access_flags))


def bind_type1(qp, mw, mw_bind):
    """QP.bind_mw: ibv_bind_mw(3)."""
    window, mr, addr, length, access = bind_fields(mw, mw_bind.bind_info)
    qp._ctx._check()
    _sync.run(_mw.bind_mw(qp._obj, window, mr, addr, length, access,
                          wr_id=int(mw_bind.wr_id), send_flags=int(mw_bind.send_flags)),
              "Failed to Bind MW")


def bind_send_wr(wr, rkey):
    """The client's IBV_WR_BIND_MW of a pyverbs SendWR (``set_bind_wr``) or builder call."""
    window, mr, addr, length, access = wr._bind
    out = _mw.bind_wr(window, mr, addr, length, access, rkey=rkey, wr_id=int(wr.wr_id),
                      send_flags=int(wr.send_flags))
    return out
