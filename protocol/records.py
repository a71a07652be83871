"""The work-request and completion records: struct ibv_send_wr, ibv_recv_wr and ibv_wc.

One definition serves the application (the client builds WRs and reads WCs), the wire
(``to_wire`` / ``from_wire``) and the engine (the RC QP takes WRs and makes WCs), so a
field added here is carried end to end or nowhere.

On the control plane a send WR and a receive WR travel as maps with the C field names
(the ``rdma``, ``atomic`` and ``imm_data``/``invalidate_rkey`` unions flattened), SGEs
as ``[addr, length, lkey]``; a WC travels as a list in docs/protocol.md's order, since
a poll may carry thousands of them. ``from_wire`` refuses a malformed record with
EPROTO (the frame is not what the protocol says) and an opcode outside enum
ibv_wr_opcode with EINVAL, as ibv_post_send(3) would.

The MKEY configure WR is built by calls rather than as a record (ibv_wr_start,
mlx5dv_wr_mkey_configure, its setters, ibv_wr_complete); ``build_configure_wr`` makes
those calls from keywords for the engine's builder and the client's QP alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .attrs import SGE, CryptoAttr, MkeyConfAttr, MrInterleaved, SigBlockAttr
from .enums import SendFlags, WcOpcode, WcStatus, WrOpcode
from .errors import einval
from .frames import FrameError
from .schema import MAX_SGE, U32, U64, check_fields, sge_to_wire, sges_from_wire

__all__ = ["RECV_WR", "SEND_WR", "SEND_WR_UD", "VENDOR_ERRORS", "VENDOR_ERR_NO_RETURN_LINK", "WC", "RecvWR",
           "SendWR", "WC_FIELDS", "build_configure_wr"]

# softhca's ibv_wc.vendor_err values (a device's own syndromes; 0: nothing more to say),
# docs/semantics.md section 9. NO_RETURN_LINK: a WR ended in IBV_WC_RETRY_EXC_ERR while
# this daemon's link to the peer's daemon was up and that daemon never opened one back:
# the peer could not connect back to the address this QP gave it (a daemon listening on
# loopback, or on an address the peer cannot route to).
VENDOR_ERR_NO_RETURN_LINK = 0x5F01
VENDOR_ERRORS = {
    VENDOR_ERR_NO_RETURN_LINK: "NO_RETURN_LINK: the peer's daemon never connected back to "
                               "this daemon (its packets cannot reach the address this QP "
                               "gave it)",
}

_U32 = (int, 0, U32, True)
_U64 = (int, 0, U64, True)
_SG = (list, 0, MAX_SGE, True)

# One element of post_send's "wrs".
SEND_WR = {"wr_id": _U64, "opcode": _U32, "sg": _SG, "send_flags": _U32,
           "imm_data": (int, 0, U32, False), "rkey": _U32, "remote_addr": _U64,
           "compare_add": _U64, "swap": _U64, "invalidate_rkey": _U32,
           # wr.ud (UD QPs only): the session's AH handle, the remote QPN and Q_Key.
           "ah": (int, 0, U32, False), "remote_qpn": (int, 0, (1 << 24) - 1, False),
           "remote_qkey": (int, 0, U32, False),
           "bind": (list, 5, 5, False)}
# The fields of SEND_WR that a UD QP's WR carries (wr.ud) and no other WR does.
SEND_WR_UD = ("ah", "remote_qpn", "remote_qkey")
# One element of post_recv's "wrs".
RECV_WR = {"wr_id": _U64, "sg": _SG}
# A WC on the wire (poll_cq's "wcs", a pushed "wc" frame's): a list in this order, since
# a poll may carry thousands; src_qp, the last, only in a UD receive's.
WC_FIELDS = ("wr_id", "status", "opcode", "byte_len", "imm_data", "qp_num", "wc_flags",
             "vendor_err", "invalidated_rkey", "src_qp")


# The fast path of from_wire (one WR per post is the latency path): a map holding exactly
# well-typed, in-range fields is built at once; anything else takes the checked path,
# which accepts the same maps and names the fault of the others.
_SEND_REQUIRED = frozenset(k for k, spec in SEND_WR.items() if spec[3])
_SEND_ALL = frozenset(SEND_WR) - {"bind"}
_RECV_ALL = frozenset(RECV_WR)
_WR_OPCODES = {int(op): op for op in WrOpcode}
_ABSENT = object()


def _u(v: Any, hi: int) -> bool:
    return type(v) is int and 0 <= v <= hi


def _fast_sges(items: Any) -> list[SGE] | None:
    if type(items) is not list or len(items) > MAX_SGE:
        return None
    out = []
    for s in items:
        if not (type(s) is list and len(s) == 3 and _u(s[0], U64) and _u(s[1], U32)
                and _u(s[2], U32)):
            return None
        out.append(SGE(s[0], s[1], s[2]))
    return out


def _wire_map(w: Any, schema: dict, what: str) -> dict:
    if not isinstance(w, dict):
        raise FrameError("EPROTO", f"{what} must be a map")
    return check_fields({"t": what.partition("[")[0], **w}, schema, what)


@dataclass
class SendWR:
    """struct ibv_send_wr (wr.rdma and wr.atomic flattened).

    ``num_sge`` None means every SGE of ``sg``; a number makes ``to_wire`` send only the
    first ones, as the C struct's num_sge does (a decoded WR's ``sg`` is just those).
    """

    wr_id: int = 0
    opcode: WrOpcode = WrOpcode.SEND
    sg: list[SGE] = field(default_factory=list)
    send_flags: int = 0
    imm_data: int | None = None
    # wr.rdma; also the target of wr.atomic.
    rkey: int = 0
    remote_addr: int = 0
    # wr.atomic: compare_add is the compare value of CMP_AND_SWP and the addend of
    # FETCH_AND_ADD; swap is CMP_AND_SWP's new value.
    compare_add: int = 0
    swap: int = 0
    # invalidate_rkey of SEND_WITH_INV and LOCAL_INV.
    invalidate_rkey: int = 0
    num_sge: int | None = None
    # wr.ud: the AH (the session's handle on the wire), remote QPN and remote Q_Key.
    ah: Any = None
    remote_qpn: int = 0
    remote_qkey: int = 0
    # bind_mw of IBV_WR_BIND_MW (its new key is ``rkey``): (the window, bind_info.mr's
    # lkey, addr, length, mw_access_flags). The window travels as the session's handle
    # of it; the daemon puts its object there before posting (server/mw_verbs.py).
    bind: tuple | None = None
    # IBV_SEND_INLINE's bytes when the poster copied them already (a send ring's WQE
    # carries them in its slot, protocol/wq_ring.py); None: they are read through the
    # SGEs at post. Never on the wire.
    inline: bytes | None = None

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        """pyverbs' SendWR.set_wr_rdma: the remote key and address of an RDMA_WRITE(_WITH_IMM)
        or RDMA_READ (wr.rdma). Checked only when the WR is posted."""
        self.rkey, self.remote_addr = rkey, addr

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        """pyverbs' SendWR.set_wr_atomic: the remote key and 8-byte aligned address of an
        atomic, ``compare_add`` (CMP_AND_SWP's compare value, FETCH_AND_ADD's addend)
        and ``swap`` (CMP_AND_SWP's new value, default 0). Checked only when the WR is
        posted."""
        self.rkey, self.remote_addr, self.compare_add, self.swap = rkey, addr, compare_add, swap

    def set_wr_ud(self, ah: Any, remote_qpn: int, remote_qkey: int = 0) -> None:
        """pyverbs' SendWR.set_wr_ud: wr.ud of a UD QP's WR, the address handle, remote
        QP number and Q_Key (bit 31 set: the sending QP's own Q_Key, ibv_post_send(3))."""
        self.ah, self.remote_qpn, self.remote_qkey = ah, remote_qpn, remote_qkey

    def to_wire(self) -> dict:
        """The post_send request's map of this WR (docs/protocol.md), the first
        ``num_sge`` SGEs only; applications do not need it."""
        w = {"wr_id": self.wr_id, "opcode": int(self.opcode),
             "sg": [sge_to_wire(s) for s in self.sg[:self.num_sge]],
             "send_flags": int(self.send_flags), "rkey": self.rkey,
             "remote_addr": self.remote_addr, "compare_add": self.compare_add,
             "swap": self.swap, "invalidate_rkey": self.invalidate_rkey}
        if self.imm_data is not None:
            w["imm_data"] = self.imm_data
        if self.ah is not None:
            w.update(ah=getattr(self.ah, "handle", self.ah), remote_qpn=self.remote_qpn,
                     remote_qkey=self.remote_qkey)
        if self.bind is not None:
            w["bind"] = [getattr(self.bind[0], "handle", self.bind[0]), *self.bind[1:]]
        return w

    @classmethod
    def from_wire(cls, w: Any, what: str = "send_wr") -> SendWR:
        """The inverse of ``to_wire`` (the daemon's side): EPROTO for a malformed map,
        EINVAL for an opcode that is not an enum ibv_wr_opcode."""
        wr = _send_wr_fast(w)
        if wr is not None:
            return wr
        v = _wire_map(w, SEND_WR, what)
        try:
            opcode = WrOpcode(v["opcode"])
        except ValueError:
            raise einval(f"opcode {v['opcode']} is not an enum ibv_wr_opcode") from None
        return SendWR(v["wr_id"], opcode, sges_from_wire(v["sg"], what), v["send_flags"],
                      v["imm_data"], v["rkey"], v["remote_addr"], v["compare_add"], v["swap"],
                      v["invalidate_rkey"], ah=v["ah"], remote_qpn=v["remote_qpn"] or 0,
                      remote_qkey=v["remote_qkey"] or 0,
                      bind=_bind_from_wire(v["bind"], what))


def _send_wr_fast(w: Any) -> SendWR | None:
    """The common send WR (no AH, no bind) taken by exact type and range tests, or None
    for ``SendWR.from_wire``'s checked path, which names any fault (and reads the rest)."""
    if not (type(w) is dict and _SEND_REQUIRED <= w.keys() <= _SEND_ALL) \
            or not w.keys().isdisjoint(SEND_WR_UD):
        return None
    imm = w.get("imm_data", _ABSENT)
    opcode = _WR_OPCODES.get(w["opcode"]) if type(w["opcode"]) is int else None
    sges = _fast_sges(w["sg"])
    if not (opcode is not None and sges is not None and _u(w["wr_id"], U64)
            and _u(w["send_flags"], U32) and _u(w["rkey"], U32)
            and _u(w["remote_addr"], U64) and _u(w["compare_add"], U64)
            and _u(w["swap"], U64) and _u(w["invalidate_rkey"], U32)
            and (imm is _ABSENT or _u(imm, U32))):
        return None
    return SendWR(w["wr_id"], opcode, sges, w["send_flags"], None if imm is _ABSENT else imm,
                  w["rkey"], w["remote_addr"], w["compare_add"], w["swap"],
                  w["invalidate_rkey"])


# bind_mw: [mw handle, mr lkey, addr, length, mw_access_flags].
_BIND_BOUNDS = (U32, U32, U64, U64, U32)


def _bind_from_wire(b: Any, what: str) -> tuple | None:
    if b is None:
        return None
    if not all(type(x) is int and 0 <= x <= hi for x, hi in zip(b, _BIND_BOUNDS, strict=True)):
        raise FrameError("EPROTO", f"{what}: bind must be [mw handle, mr lkey, addr, length, "
                                   "mw_access_flags] of unsigned ints")
    return tuple(b)


@dataclass
class RecvWR:
    """struct ibv_recv_wr"""

    wr_id: int = 0
    sg: list[SGE] = field(default_factory=list)
    num_sge: int | None = None

    def to_wire(self) -> dict:
        """The post_recv request's map of this WR (docs/protocol.md), the first
        ``num_sge`` SGEs only; applications do not need it."""
        return {"wr_id": self.wr_id, "sg": [sge_to_wire(s) for s in self.sg[:self.num_sge]]}

    @classmethod
    def from_wire(cls, w: Any, what: str = "recv_wr") -> RecvWR:
        """The inverse of ``to_wire`` (the daemon's side): EPROTO for a malformed map."""
        if type(w) is dict and w.keys() == _RECV_ALL and _u(w["wr_id"], U64):
            sges = _fast_sges(w["sg"])
            if sges is not None:
                return RecvWR(w["wr_id"], sges)
        v = _wire_map(w, RECV_WR, what)
        return RecvWR(v["wr_id"], sges_from_wire(v["sg"], what))


_WC_STATUSES = {int(m): m for m in WcStatus}
_WC_OPCODES = {int(m): m for m in WcOpcode}


def _wc_fast(w: Any) -> bool:
    """Whether ``w`` is a WC's wire list of exact ints in range (imm_data may be nil)."""
    if type(w) is not list or not 9 <= len(w) <= 10:
        return False
    for i, x in enumerate(w):
        if type(x) is int:
            if not 0 <= x <= U64:
                return False
        elif x is not None or i != 4:
            return False
    return True


@dataclass(frozen=True)
class WC:
    """struct ibv_wc"""

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    byte_len: int = 0
    qp_num: int = 0
    imm_data: int | None = None
    wc_flags: int = 0
    # The IETH key of a SEND_WITH_INV receive (IBV_WC_WITH_INV); the C struct shares
    # the field with imm_data.
    invalidated_rkey: int = 0
    vendor_err: int = 0
    # A UD receive's source QP (the DETH's); slid, sl and pkey_index are 0 on RoCE.
    src_qp: int = 0

    def to_wire(self) -> list:
        """[wr_id, status, opcode, byte_len, imm_data, qp_num, wc_flags, vendor_err,
        invalidated_rkey], docs/protocol.md's poll_cq reply; a UD receive's adds src_qp."""
        w = [self.wr_id, int(self.status), int(self.opcode), self.byte_len, self.imm_data,
             self.qp_num, int(self.wc_flags), self.vendor_err, self.invalidated_rkey]
        if self.src_qp:
            w.append(self.src_qp)
        return w

    @classmethod
    def from_wire(cls, w: Any) -> WC:
        """The inverse of ``to_wire`` (the client's side of poll_cq): EPROTO for a
        malformed list or an unknown status or opcode."""
        if _wc_fast(w):
            # Each pushed completion comes here on the client: exact types by lookup,
            # the enums by table (the checked path below refuses what this does not take).
            status, opcode = _WC_STATUSES.get(w[1]), _WC_OPCODES.get(w[2])
            if status is not None and opcode is not None:
                return cls(w[0], status, opcode, byte_len=w[3], imm_data=w[4], qp_num=w[5],
                           wc_flags=w[6], vendor_err=w[7], invalidated_rkey=w[8],
                           src_qp=w[9] if len(w) == 10 else 0)
        if (not isinstance(w, list) or len(w) not in (9, 10)
                or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= U64
                           for i, x in enumerate(w) if i != 4 or x is not None)):
            raise FrameError("EPROTO", f"a WC must be [wr_id, status, opcode, byte_len, "
                                       f"imm_data, qp_num, wc_flags, vendor_err, "
                                       f"invalidated_rkey] of unsigned ints, got {w!r}"[:200])
        try:
            status, opcode = WcStatus(w[1]), WcOpcode(w[2])
        except ValueError:
            raise FrameError("EPROTO", f"WC status {w[1]} or opcode {w[2]} is not an enum "
                                       "ibv_wc_status / ibv_wc_opcode") from None
        return cls(w[0], status, opcode, byte_len=w[3], imm_data=w[4], qp_num=w[5],
                   wc_flags=w[6], vendor_err=w[7], invalidated_rkey=w[8],
                   src_qp=w[9] if len(w) == 10 else 0)

    def __repr__(self) -> str:
        return (f"WC(wr_id={self.wr_id}, status=IBV_WC_{self.status.name}, "
                f"opcode=IBV_WC_{self.opcode.name}, byte_len={self.byte_len}, "
                f"qp_num={self.qp_num:#x}"
                + (f", imm_data={self.imm_data:#x}" if self.imm_data is not None else "")
                + (f", wc_flags={self.wc_flags:#x}" if self.wc_flags else "")
                + (f", src_qp={self.src_qp:#x}" if self.src_qp else "")
                + (f", vendor_err={self.vendor_err:#x} "
                   f"({VENDOR_ERRORS.get(self.vendor_err, 'unknown')})"
                   if self.vendor_err else "") + ")")


def build_configure_wr(qp: Any, mkey: Any, *, access: int | None = None,
                       sges: list[SGE] | None = None,
                       interleaved: tuple[int, list[MrInterleaved]] | None = None,
                       sig: SigBlockAttr | None = None, crypto: CryptoAttr | None = None,
                       conf_flags: int = 0, wr_id: int = 0,
                       wr_flags: int = SendFlags.INLINE) -> None:
    """One configure WR as mlx5dv_wr_mkey_configure(3)'s examples post it, up to (not
    including) ibv_wr_complete: ibv_wr_start, mlx5dv_wr_mkey_configure announcing one
    setter per attribute given, those setters. ``qp`` is anything with the WR-builder
    calls (the engine's MkeyConfigureBuilder, the client's QP); the caller completes it,
    since ibv_wr_complete is synchronous in the one and awaited in the other."""
    layout = sges if sges is not None else interleaved
    given = [a for a in (access, layout, sig, crypto) if a is not None]
    qp.wr_start()
    qp.wr_id, qp.wr_flags = wr_id, wr_flags
    qp.wr_mkey_configure(mkey, len(given), MkeyConfAttr(conf_flags=conf_flags))
    if access is not None:
        qp.wr_set_mkey_access_flags(access)
    if sges is not None:
        qp.wr_set_mkey_layout_list(sges)
    elif interleaved is not None:
        qp.wr_set_mkey_layout_interleaved(*interleaved)
    if sig is not None:
        qp.wr_set_mkey_sig_block(sig)
    if crypto is not None:
        qp.wr_set_mkey_crypto(crypto)
