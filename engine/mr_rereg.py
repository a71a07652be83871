"""ibv_rereg_mr(3): an MR's access, protection domain or translation changed in place.

The MR keeps its handle and its keys (the man page allows new keys; keeping them is
what lets a peer holding the rkey see the change, as the upstream tests expect: an
access taken away makes the peer's next WRITE fail with a remote access error). What
the new attributes forbid is refused from the next access on, as every access
resolves the key again (engine/transfer.py).

Errors, EINVAL as libibverbs and the kernel give them: flags empty or outside
IBV_REREG_MR_CHANGE_TRANSLATION | _CHANGE_PD | _CHANGE_ACCESS; access flags without
IBV_REREG_MR_CHANGE_ACCESS; a new translation of length 0; the new access refused as
ibv_reg_mr(3) refuses it; a PD of another device. EBUSY while memory windows are
bound to the MR (they map its memory). A refused call changes nothing.
"""

from __future__ import annotations

from ..protocol.errors import RDMAError, einval
from .hca import MAX_MR_SIZE, check_mr_access
from .memory import MR, PD

CHANGE_TRANSLATION, CHANGE_PD, CHANGE_ACCESS = 1, 2, 4
FLAGS = CHANGE_TRANSLATION | CHANGE_PD | CHANGE_ACCESS


def rereg(mr: MR, flags: int, pd: PD | None, length: int, access: int,
          at: tuple | None = None) -> None:
    """Apply ibv_rereg_mr(3) to ``mr``: checked whole, then applied. A new translation
    is ``at`` (address, buffer of ``length`` bytes), or ``length`` fresh zeroed bytes of
    the device's host memory at a new address."""
    if not flags or flags & ~FLAGS:
        raise einval(f"ibv_rereg_mr flags {flags:#x}: give one or more of "
                     "IBV_REREG_MR_CHANGE_TRANSLATION, _CHANGE_PD, _CHANGE_ACCESS")
    if access and not flags & CHANGE_ACCESS:
        raise einval("ibv_rereg_mr: access flags given without IBV_REREG_MR_CHANGE_ACCESS")
    if flags & CHANGE_ACCESS:
        check_mr_access(access, "ibv_rereg_mr")
    if flags & CHANGE_PD and (pd is None or pd.hca is not mr.pd.hca):
        raise einval("ibv_rereg_mr: IBV_REREG_MR_CHANGE_PD needs a PD of the MR's device")
    if flags & CHANGE_TRANSLATION and not 0 < length <= MAX_MR_SIZE:
        raise einval(f"ibv_rereg_mr: a new translation of {length} bytes (1 .. "
                     f"max_mr_size {MAX_MR_SIZE})")
    if mr.bound_mws:
        raise RDMAError("EBUSY", f"ibv_rereg_mr: {mr.bound_mws} memory window(s) are bound "
                                 f"to MR {mr.lkey:#x}")
    if flags & CHANGE_ACCESS:
        mr.access = access
    if flags & CHANGE_PD:
        mr.pd = pd
    if flags & CHANGE_TRANSLATION:
        mr.addr, mr.buf = at if at is not None else mr.pd.hca.fresh_memory(length)
        mr.length = length
