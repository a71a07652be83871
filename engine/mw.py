"""Memory windows (ibv_alloc_mw(3), ibv_bind_mw(3), IBV_WR_BIND_MW), as Linux soft-RoCE
(rxe_mw.c) models them.

A window is a remote key onto part of an MR: bound, it lets a peer READ, WRITE or run
atomics on ``[addr, addr + length)`` of the MR with the window's own access flags
(the MR needs IBV_ACCESS_MW_BIND, not remote access of its own). Its rkey lives in the
HCA's key table beside the MRs' and MKEYs': the upper 24 bits an index drawn at random
like theirs, the lower 8 bits the key the consumer supplies at each bind
(ibv_inc_rkey(3) for type 1, the WR's ``bind_mw.rkey`` for type 2), so every bind
makes a new rkey and the old one stops working.

- Type 1 is VALID from its allocation (with length 0, which grants nothing); any bind
  replaces the last one, and a bind of length 0 takes its access away. It cannot be
  invalidated (LOCAL_INV or SEND_WITH_INV of its rkey fail).
- Type 2 is FREE until bound by a BIND_MW work request, then bound to the QP that bound
  it: only that QP's responder honours its rkey. A bound type 2 window cannot be bound
  again until invalidated (LOCAL_INV, or a peer's SEND_WITH_INV), which makes it FREE.

The checks of a bind are rxe_check_bind_mw's; one failing completes the WR with
IBV_WC_MW_BIND_ERR and the QP goes to ERR. softhca adds one: the window, the MR and the
QP must share a PD (rxe asks it of type 2 only), so a window can never reach memory of
another protection domain, hence of another session.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.enums import AccessFlags, WcStatus
from ..protocol.errors import einval
from .completion import Fault, TransferError
from .memory import MR, PD

TYPE_1, TYPE_2 = 1, 2
# The access flags a window may grant (ibv_bind_mw(3) mw_access_flags); ZERO_BASED is
# refused, as rxe's provider does.
MW_ACCESS = int(AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
                | AccessFlags.REMOTE_ATOMIC)
VALID, FREE = "valid", "free"


class BindError(Exception):
    """A bind the device refuses: the WR completes IBV_WC_MW_BIND_ERR."""


@dataclass(eq=False)
class MW:
    """struct ibv_mw and what the device keeps of its binding."""

    pd: PD
    type: int
    rkey: int
    state: str
    mr: MR | None = None
    addr: int = 0
    length: int = 0
    access: int = 0
    # Type 2: the number of the QP it was bound through (the only one that may use it).
    qp_num: int | None = None

    @property
    def lkey(self) -> int:
        # The key table's entry (hca.release_key) is named by it.
        return self.rkey

    def window(self, pd: PD, access: int, qp_num: int | None, addr: int,
               length: int) -> MR:
        """The MR behind ``[addr, +length)`` of this window for a remote access needing
        ``access``, by the responder QP ``qp_num`` of PD ``pd``; TransferError(ACCESS)
        otherwise (rxe_lookup_mw's checks, then the range, as rxe's check_rkey)."""
        who = f"rkey {self.rkey:#x} (a type {self.type} memory window)"
        if self.pd is not pd:
            raise TransferError(Fault.ACCESS, f"{who} belongs to another PD")
        if self.state != VALID or self.length == 0 or self.mr is None:
            raise TransferError(Fault.ACCESS, f"{who} is not bound")
        if self.type == TYPE_2 and qp_num is not None and self.qp_num != qp_num:
            raise TransferError(Fault.ACCESS, f"{who} is bound to QP {self.qp_num:#x}, "
                                              f"not {qp_num:#x}")
        if access and not self.access & access:
            raise TransferError(Fault.ACCESS, f"{who} lacks IBV_ACCESS_"
                                              f"{AccessFlags(access).name}")
        if length < 0 or addr < self.addr or addr + length > self.addr + self.length:
            raise TransferError(Fault.ACCESS, f"[{addr:#x}, +{length}) leaves the window "
                                              f"[{self.addr:#x}, +{self.length}) of {who}")
        if not self.mr.valid:
            raise TransferError(Fault.ACCESS, f"{who}: its MR is deregistered")
        return self.mr

    def unbind(self) -> None:
        if self.mr is not None:
            self.mr.bound_mws -= 1
        self.mr, self.addr, self.length, self.access, self.qp_num = None, 0, 0, 0, None


def alloc_mw(hca, pd: PD, mw_type: int) -> MW:
    """ibv_alloc_mw(3) on ``hca``: EINVAL for a type other than IBV_MW_TYPE_1 / _2."""
    if mw_type not in (TYPE_1, TYPE_2):
        raise einval(f"ibv_alloc_mw: type {mw_type} is not IBV_MW_TYPE_1 or IBV_MW_TYPE_2")
    mw = MW(pd, mw_type, hca.new_key(), VALID if mw_type == TYPE_1 else FREE)
    hca.keys[mw.rkey] = mw
    return mw


def dealloc_mw(hca, mw: MW) -> None:
    """ibv_dealloc_mw(3): the window's rkey stops working at once."""
    mw.unbind()
    mw.state = FREE
    hca.release_key(mw.rkey)


def bind(mw: MW, qp_pd: PD, qp_num: int, new_rkey: int, mr_lkey: int, addr: int,
         length: int, access: int) -> None:
    """Run a bind work request on QP ``qp_num`` (of PD ``qp_pd``): raises BindError
    naming the rule broken, and changes nothing then."""
    hca = qp_pd.hca
    mr = None
    if length:
        mr = hca.keys.get(mr_lkey)
        if not isinstance(mr, MR) or not mr.valid:
            raise BindError(f"mr lkey {mr_lkey:#x} names no MR")
    _check_bind(mw, qp_pd, mr, addr, length, access)
    # The new rkey: the window's index, the consumer's key in the low 8 bits.
    rkey = (mw.rkey & ~0xFF) | (new_rkey & 0xFF)
    mw.unbind()
    if rkey != mw.rkey:
        del hca.keys[mw.rkey]
        mw.rkey = rkey
        hca.keys[rkey] = mw
    mw.state, mw.access, mw.addr, mw.length = VALID, access, addr, length
    if mr is not None:
        mw.mr = mr
        mr.bound_mws += 1
    if mw.type == TYPE_2:
        mw.qp_num = qp_num


def _check_bind(mw: MW, qp_pd: PD, mr: MR | None, addr: int, length: int,
                access: int) -> None:
    if mw.type == TYPE_2 and mw.state != FREE:
        raise BindError(f"type 2 window {mw.rkey:#x} is bound: invalidate it first")
    if mw.pd is not qp_pd:
        raise BindError(f"window {mw.rkey:#x} is not of the QP's PD")
    if mw.type == TYPE_2 and mr is None:
        raise BindError("a type 2 window is bound to an MR with a length above 0")
    if access & ~MW_ACCESS:
        raise BindError(f"mw_access_flags {access:#x} has flags outside {MW_ACCESS:#x}")
    if mr is None:
        return
    if mr.pd is not qp_pd:
        raise BindError(f"MR {mr.lkey:#x} is not of the QP's PD")
    if not mr.access & AccessFlags.MW_BIND:
        raise BindError(f"MR {mr.lkey:#x} was registered without IBV_ACCESS_MW_BIND")
    if access & (AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_ATOMIC) \
            and not mr.access & AccessFlags.LOCAL_WRITE:
        raise BindError("a writable window needs an MR with IBV_ACCESS_LOCAL_WRITE")
    if addr < mr.addr or addr + length > mr.addr + mr.length:
        raise BindError(f"[{addr:#x}, +{length}) leaves MR {mr.lkey:#x} "
                        f"[{mr.addr:#x}, +{mr.length})")


def invalidate(mw: MW, qp_pd: PD) -> bool:
    """LOCAL_INV or SEND_WITH_INV of the window's rkey on a QP of PD ``qp_pd``: a type 2
    window becomes FREE (its rkey refused from now on); False when it may not be
    invalidated (type 1, another PD's)."""
    if mw.type != TYPE_2 or mw.pd is not qp_pd:
        return False
    mw.unbind()
    mw.state = FREE
    return True


def check_bind_wr(wr) -> None:
    """ibv_post_send(3) of an IBV_WR_BIND_MW: what the provider refuses at post time
    (EINVAL), as rxe's validate_send_wr: no SGEs, no immediate data, and the bind
    (``wr.bind``: the window, the MR's lkey, addr, length, access) given."""
    if wr.sg or wr.imm_data:
        raise einval("IBV_WR_BIND_MW carries no SGE and no imm_data")
    if wr.bind is None or not isinstance(wr.bind[0], MW):
        raise einval("IBV_WR_BIND_MW needs bind_mw.mw and bind_mw.bind_info")


def run_bind_wr(wr, qp_pd: PD, qp_num: int) -> WcStatus:
    """The bind WR at the head of the send queue: its completion status."""
    window, mr_lkey, addr, length, access = wr.bind
    try:
        bind(window, qp_pd, qp_num, wr.rkey, mr_lkey, addr, length, access)
    except BindError:
        return WcStatus.MW_BIND_ERR
    return WcStatus.SUCCESS
