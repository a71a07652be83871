"""pyverbs.pd: protection domains."""

from __future__ import annotations

from . import _sync
from ._objects import Record, Resource, unmodelled, unsupported
from .pyverbs_error import PyverbsUserError


class PD(Resource):
    """ibv_alloc_pd(3) on a Context."""

    def __init__(self, creator, **kwargs):
        super().__init__()
        from .device import Context

        if kwargs.get("handle") is not None:
            raise unsupported("ibv_import_pd")
        if not isinstance(creator, Context):
            raise PyverbsUserError(f"PD needs a Context, got {type(creator).__name__}")
        creator._check()
        self.ctx = creator
        self._adopt(creator, _sync.run(creator._actx.alloc_pd(), "Failed to allocate PD"))

    def _dependents(self):
        # pyverbs closes what was created on a PD before the PD itself; memory windows
        # first, since an MR with a window bound cannot be deregistered.
        mine = [c for c in list(self._ctx._children) if getattr(c, "_pd", None) is self]
        return sorted(mine, key=lambda c: not getattr(c, "_closes_first", False))

    @property
    def handle(self):
        return self._obj.handle if self._obj is not None else 0

    def advise_mr(self, advise, flags, sg_list):
        """ibv_advise_mr(3) (engine/odp.py: the memory is resident, a valid prefetch is
        done at once)."""
        self._ctx._check()
        _sync.run(self._obj.advise_mr(int(advise), int(flags), [s._attr() for s in sg_list]),
                  "Failed to advise MR")

    def unimport(self):
        raise unsupported("ibv_unimport_pd")


class ParentDomainContext(Record):
    _fields = (("pd", None), ("alloc_func", None), ("free_func", None), ("user_data", None))


class ParentDomainInitAttr(Record):
    _fields = (("pd", None), ("pd_context", None))

    @property
    def comp_mask(self):
        return 0


ParentDomain = unmodelled("ParentDomain", "Parent domains (ibv_alloc_parent_domain)", PD)
