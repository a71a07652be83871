"""pyverbs.mr: memory regions (and the MR kinds softhca does not model).

An MR's buffer lives in the daemon's host memory (the simulated host's), not in this
process: ``buf`` is its address there, which SGEs and remote addresses use; ``write`` and
``read`` are the CPU's stores and loads to it, as pyverbs' memcpy into the buffer.
"""

from __future__ import annotations

from . import _sync
from . import enums as e
from ._objects import Resource, delegate, unmodelled, unsupported
from .mw import MW, MWBind, MWBindInfo
from .pyverbs_error import PyverbsRDMAError, PyverbsUserError

# ibv_reg_mr(3): what softhca's MRs cannot honour. Huge pages are a way of backing
# memory the simulated host does not have. (IBV_ACCESS_ON_DEMAND is engine/odp.py's.)
_UNMODELLED_ACCESS = {
    e.IBV_ACCESS_HUGETLB: "IBV_ACCESS_HUGETLB",
    e.IBV_ACCESS_ZERO_BASED: "IBV_ACCESS_ZERO_BASED",
}
# ibv_reg_mr(3): "IBV_ACCESS_RELAXED_ORDERING ... optional: the device may ignore it".
_OPTIONAL_ACCESS = e.IBV_ACCESS_RELAXED_ORDERING


class MR(Resource):
    def __init__(self, creator, length=0, access=0, address=None, implicit=False, **kwargs):
        super().__init__()
        from .pd import PD

        if kwargs.get("handle") is not None:
            raise unsupported("ibv_import_mr")

        if implicit:
            # An MR of the whole address space: the daemon's memory is registered by
            # the byte (odp_caps has no IBV_ODP_SUPPORT_IMPLICIT).
            raise unsupported("Implicit on-demand MRs")
        if not isinstance(creator, PD):
            raise unsupported(f"Registering an MR through a {type(creator).__name__}")
        for flag, what in _UNMODELLED_ACCESS.items():
            if access & flag:
                raise unsupported(f"ibv_reg_mr with {what}")
        creator._ctx._check()
        self._pd = self.pd = creator
        self._length = length
        if address is not None:
            # This process's memory: only the embedded daemon, in this process, has it.
            secret = _sync.process_secret()
            if secret is None:
                raise unsupported("Registering memory of this process (MR address=) with a "
                                  "daemon outside the process")
            obj = _sync.run(creator._obj.reg_process_mr(int(address), length,
                                                        access & ~_OPTIONAL_ACCESS, secret),
                            "Failed to register a MR")
        else:
            obj = _sync.run(creator._obj.reg_mr(length, access & ~_OPTIONAL_ACCESS),
                            "Failed to register a MR")
        self._adopt(creator._ctx, obj)

    def write(self, data, length, offset=0):
        if self._obj is None or length < 0:
            raise PyverbsUserError(f"The MR buffer isn't allocated or length {length} "
                                   "is invalid")
        if isinstance(data, str):
            data = data.encode()
        data = bytes(data[:length])
        _sync.run(self._obj.write(data, offset), "Failed to write to the MR")

    def read(self, length, offset):
        if offset < 0:
            raise PyverbsUserError(f"Invalid offset {offset}")
        if self._obj is None or length < 0:
            raise PyverbsUserError(f"The MR buffer isn't allocated or length {length} "
                                   "is invalid")
        return _sync.run(self._obj.read(length, offset), "Failed to read from the MR")

    def rereg(self, flags, pd=None, addr=0, length=0, access=0):
        """ibv_rereg_mr(3). A new translation is this process's memory: with the embedded
        daemon only, EOPNOTSUPP otherwise, as for ``MR(..., address=)``."""
        secret = None
        if flags & e.IBV_REREG_MR_CHANGE_TRANSLATION:
            secret = _sync.process_secret()
            if secret is None:
                raise unsupported("ibv_rereg_mr to memory of this process with a daemon "
                                  "outside the process (IBV_REREG_MR_CHANGE_TRANSLATION)")
        if flags & e.IBV_REREG_MR_CHANGE_ACCESS:
            for flag, what in _UNMODELLED_ACCESS.items():
                if access & flag:
                    raise unsupported(f"ibv_rereg_mr with {what}")
            access &= ~_OPTIONAL_ACCESS
        if flags & e.IBV_REREG_MR_CHANGE_PD and pd is None:
            raise PyverbsRDMAError("Failed to rereg MR: IBV_REREG_MR_CHANGE_PD needs a PD", 22)
        self._ctx._check()
        _sync.run(self._obj.rereg(flags, pd._obj if pd is not None else None, length, access,
                                  int(addr or 0), secret), "Failed to rereg MR")
        if flags & e.IBV_REREG_MR_CHANGE_PD:
            self._pd = self.pd = pd
        if flags & e.IBV_REREG_MR_CHANGE_TRANSLATION:
            self._length = length

    def unimport(self):
        raise unsupported("ibv_unimport_mr")

    @property
    def buf(self):
        return self._obj.addr if self._obj is not None else 0

    lkey = delegate("_obj", "lkey", writable=False)
    rkey = delegate("_obj", "rkey", writable=False)
    handle = delegate("_obj", "handle", writable=False)

    @property
    def length(self):
        return self._length


__all__ = ["DMMR", "MR", "MW", "DmaBufMR", "MWBind", "MWBindInfo"]
DMMR = unmodelled("DMMR", "Device memory MRs (ibv_reg_dm_mr)", MR)
DmaBufMR = unmodelled("DmaBufMR", "dma-buf MRs (ibv_reg_dmabuf_mr)", MR)
