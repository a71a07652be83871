"""The client's records: pyverbs' constructors and structs that are not objects of the
daemon (docs/api.md). ``WC`` is protocol.records', the one record every floor shares.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..protocol import records
from ..protocol.attrs import SGE
from ..protocol.enums import MkeyErrType, QpType, SendFlags, WrOpcode
from ..protocol.records import WC

__all__ = ["WC", "Event", "MkeyErr", "QPAttr", "QPCap", "QPInfo", "QPInitAttr", "RecvWR",
           "SendWR", "SigErr"]


@dataclass(frozen=True)
class Event:
    """A pushed event: ``kind`` "packet" (``header["pkt"]`` is the packet's header as on
    the wire, ``header["dir"]`` "tx" or "rx") or "trace" (one pipeline stage: ``stage``,
    ``direction``, ``stream``, ``offset``, ``detail``, the QP and WR it belongs to);
    ``data`` is the packet's payload or the stage's bytes."""

    kind: str
    header: dict
    data: bytes


class SendWR(records.SendWR):
    """struct ibv_send_wr with pyverbs' SendWR constructor: its argument order, and
    signaled by default, as pyverbs is. The fields and their wire form are
    protocol.records.SendWR's."""

    def __init__(self, wr_id: int = 0, opcode: int = WrOpcode.SEND, num_sge: int | None = None,
                 imm_data: int | None = None, sg: list[SGE] | None = None,
                 send_flags: int = SendFlags.SIGNALED) -> None:
        super().__init__(wr_id, opcode, list(sg or []), send_flags, imm_data, num_sge=num_sge)


class RecvWR(records.RecvWR):
    """struct ibv_recv_wr with pyverbs' RecvWR constructor (its argument order)."""

    def __init__(self, wr_id: int = 0, num_sge: int | None = None,
                 sg: list[SGE] | None = None) -> None:
        super().__init__(wr_id, list(sg or []), num_sge)


@dataclass
class QPCap:
    """struct ibv_qp_cap, with pyverbs' defaults: queue depths and SGEs per WR."""

    max_send_wr: int = 1
    max_recv_wr: int = 10
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@dataclass
class QPInitAttr:
    """struct ibv_qp_init_attr(_ex) with mlx5dv's send_ops_flags, for ``pd.create_qp``.

    ``scq`` and ``rcq`` (CQs) are required. ``send_ops_flags`` must include
    MLX5DV_QP_EX_WITH_MKEY_CONFIGURE for a QP that will configure MKEYs
    (``qp.wr_mkey_configure`` / ``qp.post_mkey_configure``); without it their
    ``wr_complete`` raises EOPNOTSUPP. ``create_flags``: MLX5DV_QP_CREATE_* (signature
    pipelining)."""

    qp_type: int = QpType.RC
    scq: Any = None
    rcq: Any = None
    cap: QPCap = field(default_factory=QPCap)
    sq_sig_all: int = 0
    send_ops_flags: int = 0
    # mlx5dv_qp_init_attr.create_flags (MLX5DV_QP_CREATE_SIG_PIPELINING, ...).
    create_flags: int = 0


@dataclass
class QPAttr:
    """struct ibv_qp_attr (the fields an RC QP uses), plus the peer daemon's address."""

    qp_state: int | None = None
    path_mtu: int | None = None
    dest_qp_num: int | None = None
    rq_psn: int | None = None
    sq_psn: int | None = None
    timeout: int | None = None
    retry_cnt: int | None = None
    rnr_retry: int | None = None
    min_rnr_timer: int | None = None
    max_rd_atomic: int | None = None
    max_dest_rd_atomic: int | None = None
    qp_access_flags: int | None = None
    dest_host: str | None = None
    dest_port: int | None = None
    dest_dev: str | None = None
    cur_qp_state: int | None = None
    en_sqd_async_notify: int | None = None
    # A UD QP's Q_Key (IBV_QP_QKEY).
    qkey: int | None = None

    def to_wire(self) -> dict:
        """The fields that are not None, as modify_qp's ``attr`` map (docs/protocol.md);
        applications do not need it. Sends nothing."""
        return {k: int(v) if isinstance(v, int) else v
                for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class QPInfo:
    """What a peer needs to connect to a QP: its daemon, device, QP number, first PSN."""

    host: str
    port: int
    dev: str
    qp_num: int
    psn: int = 0


@dataclass(frozen=True)
class SigErr:
    """struct mlx5dv_sig_err"""

    actual_value: int
    expected_value: int
    offset: int


@dataclass(frozen=True)
class MkeyErr:
    """struct mlx5dv_mkey_err"""

    err_type: MkeyErrType
    sig_err: SigErr

    def __repr__(self) -> str:
        if self.err_type == MkeyErrType.NO_ERR:
            return "MkeyErr(MLX5DV_MKEY_NO_ERR)"
        s = self.sig_err
        return (f"MkeyErr(MLX5DV_MKEY_SIG_BLOCK_{self.err_type.name}, actual={s.actual_value:#x}, "
                f"expected={s.expected_value:#x}, offset={s.offset})")
