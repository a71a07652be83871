"""The daemon's side of a QP's shared send and receive rings (protocol/wq_ring.py).

The provider makes one memfd for a QP's queues, sealed against shrinking, and hands it
over as it hands over a CQ's completion ring (server/cq_ring.py); the daemon maps it,
reads the WQEs the program publishes when a doorbell says so (server/wq_verbs.py) and
publishes the consumer index as the engine retires the WRs. The ring is the program's
memory, so nothing in it is trusted: the daemon keeps its own read index (``drained``)
and consumer index (``published``), and a producer index the program cannot have
stored (behind what the daemon has read, or more than the queue's depth ahead of the
consumer the daemon published) breaks the queue: the QP goes to ERR with
IBV_EVENT_QP_FATAL and the queue is read no more until the QP is reset. Every read of
a WQE is of a slot inside the mapping, whatever its fields say (``num_sge`` and
``inline_len`` are bounded by the slot, the opcode by enum ibv_wr_opcode): a WQE that
says more than its slot holds is a malformed WQE, which the caller completes in error.

Memory order (x86-64 only, as the completion rings: ``cq_ring.supported``): the program
stores the WQEs and then the producer index with release order; the daemon loads the
index and then the slots, and x86-64 keeps loads in order, so it reads whole WQEs. The
consumer index it stores (one aligned 8-byte store) after it has read the slots it frees.
"""

from __future__ import annotations

import mmap
import struct

from ..protocol import wq_ring
from ..protocol.attrs import SGE
from ..protocol.enums import SendFlags, WrOpcode
from ..protocol.errors import einval
from ..protocol.opcodes import WR_OPCODES
from ..protocol.records import RecvWR, SendWR
from .cq_ring import check_ring_fd, handed_fd

__all__ = ["Malformed", "Queue", "QpRings", "take_rings"]

_SEND = struct.Struct(wq_ring.SEND_FORMAT)
_RECV = struct.Struct(wq_ring.RECV_FORMAT)
_SGE = struct.Struct(wq_ring.SGE_FORMAT)
_OPCODES = {int(op): op for op in WrOpcode}
_INLINE = int(SendFlags.INLINE)
_QPN_MAX = (1 << 24) - 1


class Malformed(Exception):
    """A WQE its slot cannot hold or no WR can be (a program writing its ring by hand):
    the WR it names (its wr_id) completes in error."""

    def __init__(self, wr_id: int, why: str) -> None:
        super().__init__(why)
        self.wr_id = wr_id


class Queue:
    """One queue of a QP's ring: its slots in the mapping, what the daemon has read of
    it and the consumer index it published."""

    def __init__(self, mm: mmap.mmap, base: int, slots: int, stride: int,
                 max_sge: int) -> None:
        self._map, self.base, self.slots, self.stride = mm, base, slots, stride
        self.max_sge = max_sge
        # the producer (0) and consumer (1) indices as native 8-byte items
        self._index = memoryview(mm).cast("B")[
            base:base + wq_ring.CONSUMER_OFFSET + 8].cast("Q")
        self.reset()

    def reset(self) -> None:
        """The QP was reset: the queue starts over empty (the program's index too)."""
        self.drained = 0
        self.published = 0
        self.broken = False
        self.scheduled = False
        self._index[wq_ring.CONSUMER_OFFSET // 8] = 0

    def producer(self) -> int:
        return self._index[wq_ring.PRODUCER_OFFSET // 8]

    def publish(self, outstanding: int) -> None:
        """The consumer index: every WQE read and not among the ``outstanding`` WRs the
        engine holds is retired. Never moved back."""
        cons = self.drained - outstanding
        if cons > self.published:
            self.published = cons
            self._index[wq_ring.CONSUMER_OFFSET // 8] = cons

    def pending(self) -> int | None:
        """WQEs published and not read yet; None when the producer index is none the
        program can have stored (the queue is broken then)."""
        prod = self.producer()
        if prod < self.drained or prod - self.published > self.slots:
            self.broken = True
            return None
        return prod - self.drained

    def _slot(self) -> int:
        return self.base + wq_ring.slot_offset(self.drained, self.slots, self.stride)

    def _sges(self, at: int, n: int, wr_id: int) -> list[SGE]:
        if n > self.max_sge:
            raise Malformed(wr_id, f"num_sge {n} exceeds the queue's max_sge {self.max_sge}")
        return [SGE(*_SGE.unpack_from(self._map, at + i * wq_ring.SGE_SIZE)) for i in range(n)]

    def read_send(self, ud: bool, max_inline: int) -> SendWR:
        """The next send WQE as a SendWR (``drained`` moves past it whatever it holds);
        Malformed for one no ibv_post_send can write. UD: wr.ud's AH is the session's
        handle, made the object by the caller."""
        at = self._slot()
        self.drained += 1
        (wr_id, opcode, flags, imm, inv, raddr, rkey, nsge, cmp, swap, ah, rqpn, rqkey,
         inl, mw, blkey, baddr, blen, bacc) = _SEND.unpack_from(self._map, at)
        op = _OPCODES.get(opcode)
        if op is None:
            raise Malformed(wr_id, f"opcode {opcode} is not an enum ibv_wr_opcode")
        data = at + wq_ring.SEND_HEADER_SIZE
        inline = None
        if flags & _INLINE and op != WrOpcode.LOCAL_INV:
            if inl > max_inline:
                raise Malformed(wr_id, f"{inl} bytes of inline data exceed max_inline_data "
                                       f"{max_inline}")
            inline = bytes(self._map[data:data + inl])
            sg: list[SGE] = []
        else:
            sg = self._sges(data, nsge, wr_id)
        if rqpn > _QPN_MAX:
            raise Malformed(wr_id, f"remote_qpn {rqpn:#x} is not a 24-bit QP number")
        info = WR_OPCODES.get(op)
        return SendWR(wr_id, op, sg, flags, imm if info is not None and info.imm else None,
                      rkey, raddr, cmp, swap, inv, ah=ah if ud else None, remote_qpn=rqpn,
                      remote_qkey=rqkey,
                      bind=(mw, blkey, baddr, blen, bacc) if op == WrOpcode.BIND_MW else None,
                      inline=inline)

    def read_recv(self) -> RecvWR:
        """The next receive WQE as a RecvWR; Malformed for one its slot cannot hold."""
        at = self._slot()
        self.drained += 1
        wr_id, nsge = _RECV.unpack_from(self._map, at)
        return RecvWR(wr_id, self._sges(at + wq_ring.RECV_HEADER_SIZE, nsge, wr_id))

    def close(self) -> None:
        self._index.release()


class QpRings:
    """A QP's mapped ring: its send queue and receive queue (either may be None)."""

    def __init__(self, fd: int, queues: int, caps, verb: str = "ibv_create_qp") -> None:
        """``caps``: the create_qp request (its depths, max SGEs and max_inline_data)."""
        layout = []
        at = 0
        if queues & wq_ring.QUEUE_SEND:
            stride = wq_ring.send_stride(caps.max_send_sge, caps.max_inline_data)
            layout.append(("sq", at, caps.max_send_wr, stride, caps.max_send_sge))
            at += wq_ring.queue_bytes(caps.max_send_wr, stride)
        if queues & wq_ring.QUEUE_RECV:
            stride = wq_ring.recv_stride(caps.max_recv_sge)
            layout.append(("rq", at, caps.max_recv_wr, stride, caps.max_recv_sge))
            at += wq_ring.queue_bytes(caps.max_recv_wr, stride)
        size = check_ring_fd(fd, at, verb, "QP")
        self.max_inline = caps.max_inline_data
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.sq: Queue | None = None
        self.rq: Queue | None = None
        for name, base, slots, stride, max_sge in layout:
            setattr(self, name, Queue(self._map, base, slots, stride, max_sge))
        self.closed = False

    @property
    def queues(self) -> int:
        return ((wq_ring.QUEUE_SEND if self.sq else 0)
                | (wq_ring.QUEUE_RECV if self.rq else 0))

    def reset(self) -> None:
        for q in (self.sq, self.rq):
            if q is not None:
                q.reset()

    def publish(self, qp) -> None:
        """Both consumer indices, from what the engine's QP ``qp`` still holds."""
        if self.closed:
            return
        if self.sq is not None:
            self.sq.publish(qp.sq_outstanding())
        if self.rq is not None:
            self.rq.publish(qp.rq_outstanding())

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for q in (self.sq, self.rq):
            if q is not None:
                q.close()
        self._map.close()


def take_rings(verbs, r, queues: int) -> QpRings:
    """The ring the session's program handed over under ``r.ring`` (one memfd), mapped
    for ``queues``."""
    with handed_fd(verbs, r.ring, "ibv_create_qp", "a ring", "send and receive rings are "
                   "shared with local programs over the daemon's UNIX socket on x86-64 "
                   "only") as fd:
        if not queues:
            raise einval("ibv_create_qp: a ring names the queues it holds (ring_queues)")
        return QpRings(fd, queues, r)
