"""The send and receive queues of a QP the C provider shares with a local daemon.

A QP the provider creates over the daemon's UNIX socket may keep its work requests in a
memfd both processes map (docs/native.md, "Send and receive rings"), as a device's
queues live in host memory: ibv_post_send and ibv_post_recv write each WR as a WQE into
the next slot, publish them by advancing the queue's producer index, and ring a
doorbell (a ``doorbell`` frame with no reply); the daemon reads the WQEs up to the
producer into its own WR objects and advances the consumer index as the engine retires
each WR (a send WR when its completion is made, signaled or not; a receive when it is
consumed or flushed), which tells the program the slot is free again. Nothing waits
for an answer.

This module is the one description of the layout; tools/gen_wire_h.py writes it into
provider/wire.h (``SHCA_WQ_*``) and the daemon (server/wq_ring.py) reads with it. One
memfd holds the QP's queues one after the other, the send queue's first: each queue is
a header (the producer index, the program's to store, and the consumer index, the
daemon's, unsigned 64-bit little-endian counts each on a cache line of its own) and
``slots`` WQE slots of a fixed stride, WQE ``i`` in slot ``i % slots``; ``slots`` is the
QP's max_send_wr (max_recv_wr). A send WQE is a fixed header (``SEND_FIELDS``) followed
by either ``num_sge`` SGEs or, with IBV_SEND_INLINE, ``inline_len`` bytes of the data
itself, so the program's buffer is free when the post returns and no bounce page is
shared between posts; the stride holds the larger of max_send_sge SGEs and
max_inline_data bytes, rounded up to a cache line as mlx5 sizes its WQEs in 64-byte
basic blocks. A receive WQE is its wr_id, num_sge and SGEs.
"""

from __future__ import annotations

import struct

__all__ = ["CACHE_LINE", "CONSUMER_OFFSET", "HEADER_SIZE", "PRODUCER_OFFSET",
           "RECV_FIELDS", "RECV_FORMAT", "RECV_HEADER_SIZE", "SEND_FIELDS", "SEND_FORMAT",
           "SEND_HEADER_SIZE", "SGE_FORMAT", "SGE_SIZE", "QUEUE_RECV", "QUEUE_SEND",
           "queue_bytes", "recv_stride", "send_stride", "slot_offset"]

CACHE_LINE = 64
# A queue's header: the producer index (the program's), the consumer index (the
# daemon's), each on a cache line of its own.
PRODUCER_OFFSET = 0
CONSUMER_OFFSET = CACHE_LINE
HEADER_SIZE = 2 * CACHE_LINE
# The queues a QP's memfd may hold (create_qp's ring_queues, a bit each): the send
# queue first, then the receive queue.
QUEUE_SEND = 1
QUEUE_RECV = 2

# One SGE: struct ibv_sge's addr, length, lkey.
SGE_FORMAT = "<QII"
SGE_SIZE = 16
# A send WQE's header: struct ibv_send_wr's fields (wr.rdma, wr.atomic, wr.ud and
# bind_mw flattened), little-endian, at these offsets. imm_data is the value (the C
# field's big-endian bits as a number, as the wire's post_send carries it), read for
# the opcodes with an immediate; invalidate_rkey for SEND_WITH_INV and LOCAL_INV; rkey
# is also BIND_MW's new key; ah is the session's handle of a UD WR's AH; bind_mw is the
# session's handle of BIND_MW's window, bind_lkey/addr/length/access its bind_info.
# inline_len: the bytes of inline data after the header (num_sge is then 0).
SEND_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("wr_id", 0, 8),
    ("opcode", 8, 4),
    ("send_flags", 12, 4),
    ("imm_data", 16, 4),
    ("invalidate_rkey", 20, 4),
    ("remote_addr", 24, 8),
    ("rkey", 32, 4),
    ("num_sge", 36, 4),
    ("compare_add", 40, 8),
    ("swap", 48, 8),
    ("ah", 56, 4),
    ("remote_qpn", 60, 4),
    ("remote_qkey", 64, 4),
    ("inline_len", 68, 4),
    ("bind_mw", 72, 4),
    ("bind_lkey", 76, 4),
    ("bind_addr", 80, 8),
    ("bind_length", 88, 8),
    ("bind_access", 96, 4),
)
SEND_FORMAT = "<QIIIIQIIQQIIIIIIQQI"
SEND_HEADER_SIZE = 104
# A receive WQE's header: wr_id and num_sge, then the SGEs.
RECV_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("wr_id", 0, 8),
    ("num_sge", 8, 4),
)
RECV_FORMAT = "<QI"
RECV_HEADER_SIZE = 16


def _check(fields: tuple[tuple[str, int, int], ...], fmt: str, header: int) -> None:
    at = 0
    for name, offset, size in fields:
        if offset != at:
            raise AssertionError(f"wq ring field {name} at {offset}, packed at {at}")
        at += size
    if struct.calcsize(fmt) != at or at > header or header % 8:
        raise AssertionError("wq ring format and table differ")


_check(SEND_FIELDS, SEND_FORMAT, SEND_HEADER_SIZE)
_check(RECV_FIELDS, RECV_FORMAT, RECV_HEADER_SIZE)
if struct.calcsize(SGE_FORMAT) != SGE_SIZE:
    raise AssertionError("wq ring SGE format")


def _round(n: int) -> int:
    return -(-n // CACHE_LINE) * CACHE_LINE


def send_stride(max_send_sge: int, max_inline_data: int) -> int:
    """The bytes of one send WQE slot of a QP with these caps."""
    return _round(SEND_HEADER_SIZE + max(max_send_sge * SGE_SIZE, max_inline_data, 1))


def recv_stride(max_recv_sge: int) -> int:
    """The bytes of one receive WQE slot of a QP with this cap."""
    return _round(RECV_HEADER_SIZE + max(max_recv_sge, 1) * SGE_SIZE)


def queue_bytes(slots: int, stride: int) -> int:
    """The bytes of one queue: its header and its slots (a multiple of CACHE_LINE)."""
    return HEADER_SIZE + slots * stride


def slot_offset(index: int, slots: int, stride: int) -> int:
    """Where WQE ``index`` (a producer or consumer count) lies in its queue."""
    return HEADER_SIZE + (index % slots) * stride
