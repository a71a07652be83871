"""Memory windows, MR re-registration and CQ resizing, awaited (docs/api.md): the
calls behind ``pd.alloc_mw``, ``qp.bind_mw``, ``mr.rereg`` and ``cq.resize``.

A window's binds are work requests of a QP's send queue, as on a device: ``bind_mw``
(type 1, ibv_bind_mw(3)) posts one and gives the window its next rkey at once, as the
verb does; a type 2 window is bound by posting ``bind_wr(...)`` (IBV_WR_BIND_MW) and
its rkey is the WR's. Either completes IBV_WC_BIND_MW, or IBV_WC_MW_BIND_ERR when the
device refuses the bind (engine/mw.py says when).
"""

from __future__ import annotations

from ..protocol.enums import AccessFlags, SendFlags, WrOpcode
from ..protocol.errors import RDMAError
from .records import SendWR

MW_TYPE_1, MW_TYPE_2 = 1, 2
REREG_MR_CHANGE_TRANSLATION, REREG_MR_CHANGE_PD, REREG_MR_CHANGE_ACCESS = 1, 2, 4


def inc_rkey(rkey: int) -> int:
    """ibv_inc_rkey(3): the low 8 bits (the consumer's key) incremented."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


class MW:
    """ibv_mw: a memory window (``await pd.alloc_mw(type)``). Attributes: ``pd``,
    ``handle``, ``rkey``, ``type``."""

    def __init__(self, pd, handle: int, rkey: int, mw_type: int) -> None:
        self.pd, self.handle, self.rkey, self.type = pd, handle, rkey, mw_type

    async def close(self) -> None:
        """ibv_dealloc_mw(3): its rkey is refused from now on.

        Errors: ENOENT when already deallocated."""
        await self.pd.node.request("dealloc_mw", mw=self.handle)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


async def alloc_mw(pd, mw_type: int = MW_TYPE_1) -> MW:
    h, _ = await pd.node.request("alloc_mw", pd=pd.handle, type=int(mw_type))
    return MW(pd, h["mw"], h["rkey"], int(mw_type))


def bind_wr(mw: MW, mr, addr: int, length: int, access: int, *, rkey: int | None = None,
            wr_id: int = 0, send_flags: int = SendFlags.SIGNALED) -> SendWR:
    """An IBV_WR_BIND_MW work request binding ``mw`` to ``[addr, +length)`` of ``mr``
    with ``access`` (mw_access_flags); its new rkey is ``rkey`` (default
    ibv_inc_rkey(mw.rkey)), of which the device keeps the low 8 bits."""
    wr = SendWR(wr_id=wr_id, opcode=WrOpcode.BIND_MW, send_flags=send_flags)
    wr.rkey = inc_rkey(mw.rkey) if rkey is None else int(rkey)
    wr.bind = (mw, mr.lkey if mr is not None else 0, int(addr), int(length), int(access))
    return wr


async def bind_mw(qp, mw: MW, mr, addr: int, length: int, access: int, *, wr_id: int = 0,
                  send_flags: int = SendFlags.SIGNALED) -> int:
    """ibv_bind_mw(3) of type 1 window ``mw`` on ``qp``: posts the bind and returns the
    window's new rkey (also ``mw.rkey`` from now on; if the bind then completes in error,
    the old rkey is the window's again, as the man page says the user must undo it).
    A bind of length 0 takes the window's access away.

    Errors, as libibverbs gives them before posting: EINVAL for a type 2 window, an
    ``mr`` of None with an addr or length, IBV_ACCESS_ZERO_BASED; EPERM for an MR of
    another PD than the window's; then ibv_post_send's."""
    if mw.type != MW_TYPE_1:
        raise RDMAError("EINVAL", "ibv_bind_mw binds type 1 windows; post IBV_WR_BIND_MW "
                                  "for type 2")
    if mr is None and (addr or length):
        raise RDMAError("EINVAL", "ibv_bind_mw: bind_info.mr is NULL but addr or length "
                                  "is not 0")
    if mr is not None and mr.pd is not mw.pd:
        raise RDMAError("EPERM", "ibv_bind_mw: bind_info.mr is of another PD than the window")
    if access & AccessFlags.ZERO_BASED:
        raise RDMAError("EINVAL", "ibv_bind_mw: zero-based windows are not supported")
    wr = bind_wr(mw, mr, addr if mr is not None else 0, length if mr is not None else 0,
                 access, wr_id=wr_id, send_flags=send_flags)
    await qp.post_send(wr)
    mw.rkey = wr.rkey
    return wr.rkey


async def reg_process_mr(pd, addr: int, length: int, access: int,
                         secret: bytes | None = None) -> dict:
    """ibv_reg_mr(3) of this process's ``length`` bytes at ``addr``: with an embedded
    daemon (``sh.embedded``) remote writes land in the caller's buffer. ``secret`` is the
    daemon object's ``process_secret`` (default: the embedded node's daemon's).

    Errors: EOPNOTSUPP with any other daemon; EFAULT for a range that is not read-write
    memory of the process; those of ``reg_mr``. Returns the reply's fields (the MR's
    handle, keys, address and length)."""
    if secret is None:
        secret = getattr(getattr(pd.node, "daemon", None), "process_secret", None)
    if secret is None:
        raise RDMAError("EOPNOTSUPP", "ibv_reg_mr of this process's memory needs the embedded "
                                      "daemon in this process")
    h, _ = await pd.node.request("reg_mr_process", pd=pd.handle, addr=int(addr),
                                 length=int(length), access=int(access), secret=bytes(secret))
    return h


async def rereg_mr(mr, flags: int, pd=None, length: int = 0, access: int = 0, addr: int = 0,
                   secret: bytes | None = None) -> None:
    """ibv_rereg_mr(3) of ``mr``: IBV_REREG_MR_CHANGE_ACCESS (to ``access``), _CHANGE_PD
    (to ``pd``), _CHANGE_TRANSLATION (``length`` fresh zeroed bytes of the daemon's
    memory at a new ``mr.addr``, or with ``addr`` this process's memory there, as
    ``reg_process_mr``). The MR keeps its keys.

    Errors: EINVAL as the man page and libibverbs give them (no flag or unknown flags,
    access without CHANGE_ACCESS, an access ibv_reg_mr refuses, a translation of length
    0, CHANGE_PD without a PD); EBUSY while memory windows are bound to the MR."""
    if flags & REREG_MR_CHANGE_PD and pd is None:
        raise RDMAError("EINVAL", "ibv_rereg_mr: IBV_REREG_MR_CHANGE_PD needs a PD")
    if addr and secret is None:
        secret = getattr(getattr(mr.pd.node, "daemon", None), "process_secret", None)
    h, _ = await mr.pd.node.request(
        "rereg_mr", mr=mr.handle, flags=int(flags),
        pd=pd.handle if flags & REREG_MR_CHANGE_PD else 0, length=int(length),
        access=int(access), addr=int(addr), secret=bytes(secret or b""))
    if flags & REREG_MR_CHANGE_PD:
        mr.pd = pd
    mr.lkey, mr.rkey, mr.addr, mr.length = h["lkey"], h["rkey"], h["addr"], h["length"]


async def advise_mr(pd, advice: int, flags: int, sges) -> None:
    """ibv_advise_mr(3): prefetch ``sges`` (SGEs of IBV_ACCESS_ON_DEMAND MRs of ``pd``).
    The daemon's memory is always resident, so a valid prefetch is done at once
    (engine/odp.py). Errors: the man page's (EINVAL, EFAULT, EPERM; EOPNOTSUPP for an
    advice other than the three prefetches)."""
    await pd.node.request("advise_mr", pd=pd.handle, advice=int(advice), flags=int(flags),
                          sg=[[int(s.addr), int(s.length), int(s.lkey)] for s in sges])


async def resize_cq(cq, cqe: int) -> int:
    """ibv_resize_cq(3): the CQ holds ``cqe`` entries from now on (``cq.cqe``).

    Errors: EINVAL when ``cqe`` is outside 1 .. max_cqe or below the completions the CQ
    holds and the application has not polled."""
    h, _ = await cq.ctx.node.request("resize_cq", cq=cq.handle, cqe=int(cqe))
    cq.cqe = h["cqe"]
    return cq.cqe
