"""ibv_create_qp(3) caps against the device's limits: a cap above what the device
supports is EINVAL, as a device answers (ibv_query_device(3) max_qp_wr, max_sge; the
inline limit below), checked before anything is created. The request's schema bounds
them by their C types only (uint32_t), so a large value is the verb's EINVAL, not a
malformed request."""

from __future__ import annotations

from ..protocol import control
from ..protocol.errors import einval

# The most inline data a send WR may carry (ibv_create_qp(3) cap.max_inline_data).
MAX_INLINE_DATA = 1 << 16


def check_caps(r: control.CreateQp, max_qp_wr: int) -> None:
    for name, limit, most in (("max_send_wr", "max_qp_wr", max_qp_wr),
                              ("max_recv_wr", "max_qp_wr", max_qp_wr),
                              ("max_send_sge", "max_sge", control.MAX_SGE),
                              ("max_recv_sge", "max_sge", control.MAX_SGE),
                              ("max_inline_data", "inline limit", MAX_INLINE_DATA)):
        value = getattr(r, name)
        if value > most:
            raise einval(f"ibv_create_qp: cap.{name} {value} exceeds the device's "
                         f"{limit} {most}")
    for name in ("max_send_wr", "max_recv_wr"):
        if getattr(r, name) < 1:
            raise einval(f"ibv_create_qp: cap.{name} must be at least 1")
