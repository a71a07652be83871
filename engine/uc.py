"""The UC QP: connected, unacknowledged SEND and RDMA WRITE.

As Linux rxe models it (rxe_req.c, rxe_resp.c for IB_QPT_UC):

- ibv_post_send(3) takes SEND, SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM; RDMA
  READ and the atomics are not UC operations (EINVAL at post, rxe's wr_opcode_mask).
  A message is cut at the path MTU into UC_* packets (IBTA 9.2, opcodes 0x20-0x2B)
  and its WR completes when they are sent: nothing is acknowledged or retransmitted.
- The responder takes packets from its connected peer in PSN order. A packet whose
  PSN is not the expected one drops the message it belongs to: the responder waits
  for the next FIRST or ONLY packet and starts again there (rxe's check_psn for UC,
  ``drop_msg``). A message is applied at its last packet; one that cannot be taken
  (no receive, a receive too small, an rkey without REMOTE_WRITE over the range) is
  dropped silently, and a RDMA_WRITE_WITH_IMM needs a receive like a SEND.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..protocol.enums import AccessFlags, Mtu, WcFlags, WcOpcode, WrOpcode
from ..protocol.enums import QpAttrMask as M
from ..protocol.opcodes import FLAGS, Op
from ..protocol.packets import Packet
from ..protocol.records import SendWR
from . import transfer
from .completion import TransferError
from .datagram import UC_TRANSITIONS, DatagramQP
from .rc_common import PSN_MOD


@dataclass
class _Message:
    """A message being reassembled: SEND or WRITE, its RETH, its bytes so far."""

    write: bool
    reth: tuple | None
    parts: list = field(default_factory=list)


def _uc_name(write: bool, first: bool, last: bool, imm: bool) -> str:
    pos = "ONLY" if first and last else "FIRST" if first else "LAST" if last else "MIDDLE"
    return f"UC_{'RDMA_WRITE' if write else 'SEND'}_{pos}{'_WITH_IMM' if imm and last else ''}"


class UCQP(DatagramQP):
    """A UC QP of ``pd``."""

    TRANSITIONS = UC_TRANSITIONS
    TYPE = "a UC"
    OPCODES = {WrOpcode.SEND: WcOpcode.SEND, WrOpcode.SEND_WITH_IMM: WcOpcode.SEND,
               WrOpcode.RDMA_WRITE: WcOpcode.RDMA_WRITE,
               WrOpcode.RDMA_WRITE_WITH_IMM: WcOpcode.RDMA_WRITE}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mtu = Mtu.MTU_1024.nbytes
        # As an RC QP never given qp_access_flags (engine/rc.py): remote writes enabled.
        self.qp_access_flags = int(AccessFlags.REMOTE_WRITE)
        self._msg: _Message | None = None
        # Packets are dropped until the next FIRST or ONLY (a PSN gap or a bad message).
        self._dropping = False

    def _apply(self, values: dict) -> None:
        if M.PATH_MTU in values:
            self.mtu = Mtu(values[M.PATH_MTU]).nbytes

    def emit(self, wr: SendWR, data: bytes, out: list) -> None:
        write = wr.opcode in (WrOpcode.RDMA_WRITE, WrOpcode.RDMA_WRITE_WITH_IMM)
        imm = wr.opcode in (WrOpcode.SEND_WITH_IMM, WrOpcode.RDMA_WRITE_WITH_IMM)
        n = max(1, -(-len(data) // self.mtu))
        psn = self.take_psns(n)
        for i in range(n):
            first, last = i == 0, i == n - 1
            out.append(Packet(
                self.dest_qp, (psn + i) % PSN_MOD, _uc_name(write, first, last, imm),
                data[i * self.mtu:(i + 1) * self.mtu],
                (wr.rkey, wr.remote_addr, len(data)) if write and first else None,
                imm=wr.imm_data if imm and last else None))

    def take(self, p: Packet) -> None:
        flags = FLAGS[p.opcode]
        if not flags & Op.UC:
            self.drop()
            return
        in_order = p.psn == self.epsn
        self.epsn = (p.psn + 1) % PSN_MOD
        if flags & Op.FIRST:
            if self._msg is not None or not in_order:
                self.drop()         # the message that was cut short
            self._dropping = False
            self._msg = _Message(bool(flags & Op.WRITE), p.reth)
        elif self._dropping or not in_order or self._msg is None:
            if not self._dropping:
                self.drop()
            self._dropping, self._msg = True, None
            return
        self._msg.parts.append(p.payload)
        if flags & Op.LAST:
            msg, self._msg = self._msg, None
            self._apply_message(msg, b"".join(msg.parts), p.imm, p.psn)

    def _apply_message(self, msg: _Message, data: bytes, imm: int | None, psn: int) -> None:
        flags = WcFlags.WITH_IMM if imm is not None else 0
        if not msg.write:
            if not self._rq:
                self.drop()
                return
            self.deliver(data, WcOpcode.RECV, len(data), imm, flags, psn=psn)
            return
        if imm is not None and not self._rq:
            self.drop()
            return
        rkey, va, length = msg.reth
        if length != len(data) or not self.qp_access_flags & AccessFlags.REMOTE_WRITE:
            self.drop()
            return
        try:
            # A zero-length WRITE names no memory: no R_Key check (IBTA C9-88, as rxe).
            if length:
                transfer.rx(self.pd, rkey, va, data, remote=True,
                            trace=self.trace_for(role="responder", op="RDMA_WRITE", psn=psn))
        except TransferError:
            self.drop()
            return
        if imm is not None:
            self.deliver(b"", WcOpcode.RECV_RDMA_WITH_IMM, len(data), imm, flags, psn=psn)
