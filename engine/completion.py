"""Which completion a failed transfer gives (docs/semantics.md section 9).

The pipeline raises a TransferError naming the class of failure; the QP layer
turns it into the requester's or the responder's ibv_wc_status with
`TransferError.status`. Signature check failures are never TransferErrors: they
are latched on the MKEY and read with mlx5dv_mkey_check(3).

`CompletionLists` holds a QP's completions until they are polled: every QP type
(engine/rc.py's RC, engine/datagram.py's UC and UD) keeps and hands them out alike.
"""

from __future__ import annotations

from enum import Enum

from ..protocol.enums import WcStatus
from ..protocol.records import WC


class Fault(Enum):
    # lkey/rkey unknown, invalidated, of another PD, lacking access, range outside.
    ACCESS = "access"
    # A length that splits a PI, a misaligned start on a signature or crypto MKEY.
    LENGTH = "length"
    # Crypto MKEY without crypto attributes, keytag mismatch, bad XTS job size.
    CRYPTO = "crypto"


# (status when the key is the requester's own, status the requester sees when the
# key is the responder's)
_STATUS = {
    Fault.ACCESS: (WcStatus.LOC_PROT_ERR, WcStatus.REM_ACCESS_ERR),
    Fault.LENGTH: (WcStatus.LOC_LEN_ERR, WcStatus.REM_INV_REQ_ERR),
    Fault.CRYPTO: (WcStatus.LOC_PROT_ERR, WcStatus.REM_OP_ERR),
}


class TransferError(Exception):
    """A transfer through a key failed before any byte moved."""

    def __init__(self, fault: Fault, message: str) -> None:
        self.fault = fault
        self.message = message
        super().__init__(f"{fault.value}: {message}")

    def status(self, remote: bool) -> WcStatus:
        """The requester's completion status: ``remote`` when the failing key is
        the responder's (the rkey of an RDMA operation)."""
        return _STATUS[self.fault][1 if remote else 0]


class CompletionLists:
    """A QP's completions not yet polled, in the order they completed, apart for its
    send CQ and its receive CQ (ibv_create_qp's send_cq and recv_cq); a QP class
    derives from it and calls ``_init_completions`` in its ``__init__``."""

    def _init_completions(self) -> None:
        self._scq: list[WC] = []
        self._rcq: list[WC] = []

    def _clear_completions(self) -> None:
        """ibv_modify_qp to RESET: completions not yet polled are gone."""
        self._scq.clear()
        self._rcq.clear()

    def poll_send_cq(self) -> list[WC]:
        out, self._scq = self._scq, []
        return out

    def poll_recv_cq(self) -> list[WC]:
        out, self._rcq = self._rcq, []
        return out

    def poll_cq(self) -> list[WC]:
        """Both, send completions first."""
        return self.poll_send_cq() + self.poll_recv_cq()
