"""What the RC requester and responder (engine/rc_requester.py, rc_responder.py) both
need: PSN arithmetic in the 24-bit space, messages cut to the path MTU and scattered
over SGEs, and the QP states in which each side works.
"""

from __future__ import annotations

from ..protocol.attrs import SGE
from ..protocol.enums import QpState
from . import transfer
from .hca import PD

PSN_MOD = 1 << 24
_HALF = 1 << 23

# The states in which the requester works (SQD: it finishes what it started), and in
# which packets are accepted at all.
SENDING = (QpState.RTS, QpState.SQD)
RECEIVING = (QpState.RTR, QpState.RTS, QpState.SQD)


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
