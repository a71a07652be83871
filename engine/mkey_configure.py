"""The MKEY configure work request builder: ibv_wr_start, mlx5dv_wr_mkey_configure,
its setters, ibv_wr_complete (mlx5dv_wr_mkey_configure(3)).

As in rdma-core, the builder and setters return nothing: what is wrong is found
and reported by `wr_complete` as one errno, and then nothing of the batch is
applied. The rules are docs/semantics.md section 4, checked in the order the calls
were made so that the first broken rule is the one reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..protocol.attrs import CryptoAttr, MkeyConfAttr, MrInterleaved, SigBlockAttr
from ..protocol.enums import (
    AccessFlags,
    MkeyConfFlags,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    SendFlags,
    WcOpcode,
)
from ..protocol.errors import RDMAError, einval, eopnotsupp
from ..protocol.records import build_configure_wr
from .crypto import validate_crypto_attr
from .hca import MAX_MR_SIZE, MR, PD
from .mkey import Layout, MKey
from .signature import validate_sig_block_attr

# mlx5dv_wr_set_mkey_access_flags(3): the flags an MKEY may grant.
MKEY_ACCESS = int(AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_WRITE | AccessFlags.REMOTE_READ
               | AccessFlags.REMOTE_ATOMIC)
CONF_FLAGS = int(MkeyConfFlags.RESET_SIG_ATTR)

# Setter kinds: each may be called once per configure WR, and both layout
# setters count as the one layout ("Not more than one data layout setter").
ACCESS, LAYOUT, SIG, CRYPTO = "access flags", "layout", "sig_block", "crypto"


@dataclass
class _ConfigureWR:
    wr_id: int
    wr_flags: int
    mkey: MKey
    num_setters: int
    conf_attr: MkeyConfAttr
    setters: dict[str, Any] = field(default_factory=dict)
    calls: int = 0


@dataclass(frozen=True)
class PostedConfigure:
    """A configure WR that wr_complete accepted; it completes with IBV_WC_DRIVER1."""

    wr_id: int
    signaled: bool
    mkey: MKey
    opcode: int = WcOpcode.DRIVER1


@dataclass
class _Applied:
    mkey: MKey
    access: int | None
    layout: Layout | None
    reset_sig: bool
    sig: Any
    crypto: Any
    partial_layout: bool = False


class MkeyConfigureBuilder:
    """The ibv_qp_ex WR builder of one QP, for MKEY configure WRs."""

    def __init__(self, pd: PD, send_ops_flags: int, sq_sig_all: bool = False) -> None:
        self.pd = pd
        self.send_ops_flags = send_ops_flags
        self.sq_sig_all = sq_sig_all
        self.wr_id = 0
        self.wr_flags = 0
        self._open = False
        self._wrs: list[_ConfigureWR] = []
        # The first misuse seen between wr_start and wr_complete, reported by wr_complete.
        self._error: RDMAError | None = None

    def _fail(self, error: RDMAError) -> None:
        if self._error is None:
            self._error = error

    def wr_start(self) -> None:
        self._open = True
        self._wrs = []
        self._error = None

    def wr_mkey_configure(self, mkey: MKey, num_setters: int, attr: MkeyConfAttr) -> None:
        if not self._open:
            self._fail(einval("mlx5dv_wr_mkey_configure called outside ibv_wr_start"))
            return
        self._close_current()
        if not self.send_ops_flags & Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE:
            self._fail(eopnotsupp("QP was not created with MLX5DV_QP_EX_WITH_MKEY_CONFIGURE"))
        elif not self.wr_flags & SendFlags.INLINE:
            self._fail(eopnotsupp("MKEY configure requires IBV_SEND_INLINE in wr_flags"))
        elif attr.conf_flags & ~CONF_FLAGS:
            self._fail(eopnotsupp(f"mkey_conf_attr conf_flags {attr.conf_flags:#x} has "
                                  "unknown flags"))
        elif attr.comp_mask:
            self._fail(eopnotsupp(f"mkey_conf_attr comp_mask {attr.comp_mask:#x} must be 0"))
        elif not isinstance(mkey, MKey) or mkey.pd.hca.keys.get(mkey.lkey) is not mkey:
            self._fail(einval("the MKEY to configure is unknown (destroyed?)"))
        elif mkey.pd is not self.pd:
            self._fail(einval(f"MKEY {mkey.lkey:#x} belongs to another PD than the QP"))
        self._wrs.append(_ConfigureWR(self.wr_id, self.wr_flags, mkey, num_setters, attr))

    def _close_current(self) -> None:
        """A configure is followed by exactly num_setters setters."""
        if self._wrs:
            wr = self._wrs[-1]
            if wr.calls < wr.num_setters:
                self._fail(einval(f"mlx5dv_wr_mkey_configure announced {wr.num_setters} "
                                  f"setters but {wr.calls} were called"))

    def _setter(self, kind: str, value: Any) -> None:
        if not self._open or not self._wrs:
            self._fail(einval(f"mlx5dv_wr_set_mkey_{kind.replace(' ', '_')} called with no "
                              "open mlx5dv_wr_mkey_configure"))
            return
        wr = self._wrs[-1]
        wr.calls += 1
        if wr.calls > wr.num_setters:
            self._fail(einval(f"more setters than num_setters={wr.num_setters}"))
        elif kind in wr.setters:
            self._fail(einval(f"the {kind} setter was called twice in one MKEY configure"))
        else:
            wr.setters[kind] = value

    def wr_set_mkey_access_flags(self, access_flags: int) -> None:
        self._setter(ACCESS, int(access_flags))

    def wr_set_mkey_layout_list(self, sges) -> None:
        self._setter(LAYOUT, ("list", tuple(sges)))

    def wr_set_mkey_layout_interleaved(self, repeat_count: int,
                                       data: list[MrInterleaved]) -> None:
        self._setter(LAYOUT, ("interleaved", int(repeat_count), tuple(data)))

    def wr_set_mkey_sig_block(self, attr: SigBlockAttr) -> None:
        self._setter(SIG, attr)

    def wr_set_mkey_crypto(self, attr: CryptoAttr) -> None:
        self._setter(CRYPTO, attr)

    def post_configure(self, mkey: MKey, *, access: int | None = None, sges=None,
                       interleaved: tuple[int, list[MrInterleaved]] | None = None,
                       sig: SigBlockAttr | None = None, crypto: CryptoAttr | None = None,
                       conf_flags: int = 0, wr_id: int = 0,
                       wr_flags: int = SendFlags.INLINE) -> list[PostedConfigure]:
        """One configure WR as mlx5dv_wr_mkey_configure(3)'s examples post it: the
        builder, one setter per attribute given (num_setters counted from them), then
        wr_complete. The verbs sequence itself stays available for tests of misuse."""
        build_configure_wr(self, mkey, access=access, sges=sges, interleaved=interleaved,
                           sig=sig, crypto=crypto, conf_flags=conf_flags, wr_id=wr_id,
                           wr_flags=wr_flags)
        return self.wr_complete()

    def wr_complete(self) -> list[PostedConfigure]:
        """Validate the whole batch, then apply it; raise RDMAError and apply nothing
        when any rule is broken."""
        if not self._open:
            raise einval("ibv_wr_complete called without ibv_wr_start")
        self._close_current()
        try:
            if self._error is not None:
                raise self._error
            applied = [self._validate(wr) for wr in self._wrs]
        finally:
            self._open = False
            wrs, self._wrs, self._error = self._wrs, [], None
        for a in applied:
            _apply(a)
        return [PostedConfigure(wr.wr_id, bool(self.sq_sig_all or wr.wr_flags & SendFlags.SIGNALED),
                                wr.mkey) for wr in wrs]

    def _validate(self, wr: _ConfigureWR) -> _Applied:
        mkey = wr.mkey
        s = wr.setters
        access = s.get(ACCESS)
        if access is not None and access & ~MKEY_ACCESS:
            raise einval(f"access flags {access:#x} outside LOCAL_WRITE | REMOTE_WRITE | "
                         "REMOTE_READ | REMOTE_ATOMIC")
        layout = _layout(self.pd, mkey, s[LAYOUT]) if LAYOUT in s else None
        sig = None
        if SIG in s:
            if not mkey.create_flags & MkeyInitAttrFlags.BLOCK_SIGNATURE:
                raise einval(f"MKEY {mkey.lkey:#x} was created without "
                             "MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE")
            sig = validate_sig_block_attr(s[SIG])
        crypto = None
        if CRYPTO in s:
            if not mkey.create_flags & MkeyInitAttrFlags.CRYPTO:
                raise einval(f"MKEY {mkey.lkey:#x} was created without "
                             "MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO")
            crypto = validate_crypto_attr(s[CRYPTO], self.pd)
        reset = bool(wr.conf_attr.conf_flags & MkeyConfFlags.RESET_SIG_ATTR)
        partial = _partial_layout(self.pd, mkey, layout or mkey.layout,
                                  sig if sig is not None or reset else mkey.sig)
        return _Applied(mkey, access, layout, reset, sig, crypto, partial)


def _partial_layout(pd: PD, mkey: MKey, layout: Layout | None, sig) -> bool:
    """Whether the layout the MKEY will have ends in a partial protection block of the
    signature it will have; refused (EINVAL) on a strict_blocks device (docs/blocks.md)."""
    if layout is None or sig is None:
        return False
    tail = layout.length % sig.mem_width
    if tail and pd.hca.strict_blocks:
        raise einval(f"layout of {layout.length} bytes is not a whole number of "
                     f"{sig.mem_width}-byte protection blocks in the memory domain "
                     f"({tail} bytes over); this device runs with strict blocks")
    return bool(tail)


def _layout_mr(pd: PD, lkey: int, addr: int, length: int, what: str) -> tuple[MR, int]:
    mr = pd.hca.keys.get(lkey)
    if not isinstance(mr, MR):
        raise einval(f"{what}: lkey {lkey:#x} is not a registered MR")
    if mr.pd is not pd:
        raise einval(f"{what}: lkey {lkey:#x} belongs to another PD")
    if length < 0 or addr < mr.addr or addr + length > mr.addr + mr.length:
        raise einval(f"{what}: [{addr:#x}, +{length}) leaves MR lkey {lkey:#x} "
                     f"[{mr.addr:#x}, +{mr.length})")
    return mr, addr - mr.addr


def _layout(pd: PD, mkey: MKey, spec) -> Layout:
    if spec[0] == "list":
        sges = spec[1]
        if len(sges) > mkey.max_entries:
            raise einval(f"layout list of {len(sges)} SGEs exceeds max_entries "
                         f"{mkey.max_entries}")
        pieces = []
        for i, sge in enumerate(sges):
            mr, off = _layout_mr(pd, sge.lkey, sge.addr, sge.length, f"layout SGE {i}")
            pieces.append((mr, off, sge.length))
        return _check_length(Layout("list", tuple(pieces), len(sges)))
    _, repeat, entries = spec
    # mlx5dv_wr_mkey_configure(3): "one entry will be consumed for strided header".
    if len(entries) + 1 > mkey.max_entries:
        raise einval(f"interleaved layout of {len(entries)} entries needs max_entries >= "
                     f"{len(entries) + 1}, the MKEY has {mkey.max_entries}")
    if repeat <= 0:
        raise einval(f"interleaved repeat_count {repeat} must be positive")
    pieces = []
    strides = []
    for i, e in enumerate(entries):
        stride = e.bytes_count + e.bytes_skip
        last = e.addr + (repeat - 1) * stride
        mr, off = _layout_mr(pd, e.lkey, e.addr, 0, f"interleaved entry {i}")
        _layout_mr(pd, e.lkey, last, e.bytes_count, f"interleaved entry {i}")
        pieces.append((mr, off, e.bytes_count))
        strides.append(stride)
    layout = Layout("interleaved", tuple(pieces), len(entries) + 1, repeat, tuple(strides))
    _check_length(layout)
    return layout


def _check_length(layout: Layout) -> Layout:
    # The memory domain of an MKEY is bounded as an MR is (ibv_query_device(3)
    # max_mr_size): a layout longer than the device maps is refused, not truncated.
    if layout.length > MAX_MR_SIZE:
        raise einval(f"{layout.kind} layout spans {layout.length} bytes, more than the "
                     f"device's max_mr_size {MAX_MR_SIZE}")
    return layout


def _apply(a: _Applied) -> None:
    mkey = a.mkey
    # Transfers reuse a plan of the configuration (engine/keyplan.py); a new one is made
    # from what this configure leaves on the MKEY.
    mkey.keyplan = None
    if a.access is not None:
        mkey.access = a.access
    if a.layout is not None:
        mkey.layout = a.layout
    if a.reset_sig:
        mkey.sig = None
        mkey.sig_error = None
    if a.sig is not None:
        mkey.sig = a.sig
        mkey.sig_error = None
    if a.crypto is not None:
        mkey.crypto = a.crypto
    if a.partial_layout:
        mkey.count_partial("layouts")
    mkey.valid = True
