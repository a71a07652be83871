"""What the roles of an RC QP (engine/rc_requester.py, rc_completer.py, rc_responder.py)
share: the QP context they read and act on (``QPContext``), PSN arithmetic in the 24-bit
space, the send WR as the send queue tracks it
(``SendRequest``, which the requester transmits and the completer completes), and the
scatter of arriving bytes over SGEs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..protocol.attrs import SGE
from ..protocol.enums import WcOpcode, WcStatus, WrOpcode
from ..protocol.opcodes import WrInfo
from . import transfer
from .hca import PD

if TYPE_CHECKING:
    from ..protocol.packets import Packet
    from ..protocol.records import SendWR

PSN_MOD = 1 << 24
_HALF = 1 << 23


class QPContext(Protocol):
    """The QP context the roles share, as rxe's requester, completer and responder share
    struct rxe_qp: its state and attributes, its PD, its counters, and the few actions
    that touch more than one role. engine/rc.py's RCQP is the one implementation; the
    roles name it by this interface so that rc.py alone imports them (rc -> roles), never
    the other way round."""

    state: Any
    pd: PD
    stats: dict[str, int]
    events: list
    dest_qp: int
    mtu: int
    timeout_s: float
    retry_cnt: int
    rnr_retry: int
    rnr_timer_s: float
    sq_depth: int
    rq_depth: int
    sq_sig_all: bool
    max_inline_data: int
    max_rd_atomic: int
    max_dest_rd_atomic: int
    qp_access_flags: int
    sig_pipelining: bool
    # Unacknowledged packets the requester may have (the device's rc_window).
    rc_window: int
    # The completer's view of the send queue: the requester (rc_requester.Requester).
    requester: Any

    def trace_for(self, **ctx) -> Callable | None: ...

    def enter_err(self) -> None: ...

    def enter_sqd(self, notify: bool) -> None: ...

    def invalidate(self, key: int | None, remote: bool) -> bool: ...

    def complete_send(self, wr_id: int, status: WcStatus, opcode: WcOpcode,
                      byte_len: int = 0) -> None: ...

    def complete_recv(self, wr_id: int, status: WcStatus, opcode: WcOpcode, byte_len: int = 0,
                      imm_data: int | None = None, wc_flags: int = 0,
                      invalidated_rkey: int = 0) -> None: ...


def psn_add(psn: int, n: int) -> int:
    return (psn + n) % PSN_MOD


def psn_diff(a: int, b: int) -> int:
    """a - b in the 24-bit PSN space, as a signed number in [-2^23, 2^23)."""
    return (a - b + _HALF) % PSN_MOD - _HALF


def scatter(pd: PD, sges: list[SGE], data: bytes, trace=None,
            sig_errors: list | None = None) -> None:
    """docs/semantics.md section 5: the arriving bytes over the SGEs in order, one transfer each."""
    off = 0
    for s in sges:
        if off >= len(data):
            break
        chunk = data[off:off + s.length]
        transfer.rx(pd, s.lkey, s.addr, chunk, trace=trace, sig_errors=sig_errors)
        off += len(chunk)


@dataclass(eq=False)
class SendRequest:
    """A posted send WR as the send queue tracks it."""

    wr: SendWR
    info: WrInfo
    signaled: bool
    length: int
    wc_opcode: WcOpcode
    built: bool = False
    psn: int = 0
    npsn: int = 0
    # An atomic's one request packet; a SEND's or WRITE's gathered payload, from which
    # its packets (or runs of them) are cut when they go (never kept as packets).
    pkts: list[Packet] | None = None
    data: bytes | None = None
    # PSNs of this WR acknowledged (READ: response packets received, in order).
    acked: int = 0
    # Packets of this WR transmitted since the last go-back (READ: 1 once the request went).
    sent: int = 0
    # The most packets of this WR ever transmitted: below it, a transmission is a resend.
    high: int = 0
    # READ: the response count it was last re-requested from on a gap (-1: never).
    rerequested: int = -1
    # A local error found while gathering: completed when the WR reaches the head.
    error: WcStatus | None = None
    read_buf: bytearray = field(default_factory=bytearray)
    # IBV_SEND_INLINE: the payload copied at post time.
    inline: bytes | None = None
    # A local WR: sends nothing, runs ``action`` (or its LOCAL_INV) at the SQ head.
    local: bool = False
    action: Callable[[], None] | None = None
    # mlx5dv_qp_cancel_posted_send_wrs(3): replaced by a NOP (local, no effect).
    canceled: bool = False

    @property
    def barrier(self) -> bool:
        """A local WR with an effect, which later WRs must see before they are built."""
        return self.local and (self.action is not None
                               or self.wr.opcode in (WrOpcode.LOCAL_INV, WrOpcode.BIND_MW))

    @property
    def live(self) -> bool:
        """Built and not failed locally: its packets went, or may go, on the wire."""
        return self.built and self.error is None
