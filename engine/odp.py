"""On-demand paging as softhca has it (ibv_reg_mr(3) IBV_ACCESS_ON_DEMAND,
ibv_advise_mr(3)).

An MR's memory is the daemon's own and always resident: nothing is ever paged out,
so an ODP MR takes no page fault and works for every operation the engine has. The
flag is kept on the MR (it changes what ibv_advise_mr accepts), and a prefetch has
nothing to bring in: it is complete once its scatter/gather list is found valid,
which is what IBV_ADVISE_MR_FLAG_FLUSH asks to wait for. The errors are the man
page's, checked whole before the call returns.
"""

from __future__ import annotations

from ..protocol.attrs import SGE
from ..protocol.enums import AccessFlags
from ..protocol.errors import RDMAError, einval
from .memory import MR, PD

ON_DEMAND = 1 << 6                      # IBV_ACCESS_ON_DEMAND
PREFETCH, PREFETCH_WRITE, PREFETCH_NO_FAULT = 0, 1, 2
FLAG_FLUSH = 1
# SGEs one call may name (ibv_advise_mr(3) num_sge is a uint32_t; checking them is
# one stretch of the event loop).
MAX_ADVISE_SGE = 1024


def advise(pd: PD, advice: int, flags: int, sges: list[SGE]) -> None:
    """ibv_advise_mr(3) on ``pd``."""
    if advice not in (PREFETCH, PREFETCH_WRITE, PREFETCH_NO_FAULT):
        raise RDMAError("EOPNOTSUPP", f"ibv_advise_mr: advice {advice} is not a prefetch")
    if flags & ~FLAG_FLUSH:
        raise einval(f"ibv_advise_mr: flags {flags:#x} (only IBV_ADVISE_MR_FLAG_FLUSH)")
    if not 0 < len(sges) <= MAX_ADVISE_SGE:
        raise einval(f"ibv_advise_mr: num_sge {len(sges)} (1 .. {MAX_ADVISE_SGE})")
    for i, s in enumerate(sges):
        mr = pd.hca.keys.get(s.lkey)
        if mr is None:
            raise RDMAError("EFAULT", f"ibv_advise_mr: sg_list[{i}] lkey {s.lkey:#x} is invalid")
        if not isinstance(mr, MR):
            raise einval(f"ibv_advise_mr: sg_list[{i}] names a memory window or an MKEY")
        if mr.pd is not pd:
            raise RDMAError("EPERM", f"ibv_advise_mr: sg_list[{i}] lkey {s.lkey:#x} is of "
                                     "another PD")
        if not mr.access & ON_DEMAND:
            raise einval(f"ibv_advise_mr: sg_list[{i}] MR {s.lkey:#x} is not an on-demand "
                         "paging MR (IBV_ACCESS_ON_DEMAND)")
        if advice == PREFETCH_WRITE and not mr.access & AccessFlags.LOCAL_WRITE:
            raise RDMAError("EPERM", f"ibv_advise_mr: MR {s.lkey:#x} is not writable for "
                                     "IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE")
        if s.addr < mr.addr or s.addr + s.length > mr.addr + mr.length:
            raise RDMAError("EFAULT", f"ibv_advise_mr: [{s.addr:#x}, +{s.length}) leaves MR "
                                      f"{s.lkey:#x} [{mr.addr:#x}, +{mr.length})")
