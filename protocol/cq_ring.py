"""The completion ring of a CQ the C provider shares with a local daemon.

A CQ the provider creates over the daemon's UNIX socket keeps its completions in a
memfd both processes map (docs/native.md, "Completion rings"): the daemon writes each
work completion into an entry and then publishes it by advancing the producer index;
ibv_poll_cq reads entries up to it and advances the consumer index, which tells the
daemon the room is free again. No frame, no system call on either side for a
completion.

This module is the one description of the layout: the header's two indices (each on
its own cache line, so that the daemon's stores of one never invalidate the line the
program stores the other to) and the entries, one cache line each, of a fixed WC
layout. tools/gen_wire_h.py writes them into provider/wire.h for the C side; the
daemon (server/cq_ring.py) packs with ``ENTRY_FORMAT``. Indices are free-running
unsigned 64-bit counts (they never wrap in practice); entry ``i`` is in slot
``i % slots``, ``slots`` being the CQ's cqe.
"""

from __future__ import annotations

import struct

__all__ = ["CACHE_LINE", "CONSUMER_OFFSET", "ENTRY_FIELDS", "ENTRY_FORMAT", "ENTRY_SIZE",
           "HEADER_SIZE", "PRODUCER_OFFSET", "WAITERS_OFFSET", "entry_offset", "ring_bytes"]

CACHE_LINE = 64
# The header: the producer index (the daemon's to store), the consumer index (the
# program's), each an unsigned 64-bit little-endian count on a cache line of its own.
# Beside the consumer, on the program's line, the count of the program's threads asleep
# in an empty poll (an unsigned 32-bit count): they wait on the producer index's low 32
# bits as a futex(2), and the daemon, seeing it non-zero after it publishes, wakes them.
PRODUCER_OFFSET = 0
CONSUMER_OFFSET = CACHE_LINE
WAITERS_OFFSET = CACHE_LINE + 8
HEADER_SIZE = 2 * CACHE_LINE
# One entry: a struct ibv_wc's fields as softhca's WC carries them (protocol/records.py
# WC_FIELDS), at these offsets, little-endian, the rest of the line zero. imm_data is
# the value (the C side stores it big-endian into ibv_wc.imm_data, as the wire's);
# invalidated_rkey is read when wc_flags has IBV_WC_WITH_INV.
ENTRY_SIZE = CACHE_LINE
ENTRY_FIELDS: tuple[tuple[str, int, int], ...] = (
    ("wr_id", 0, 8),
    ("status", 8, 4),
    ("opcode", 12, 4),
    ("byte_len", 16, 4),
    ("imm_data", 20, 4),
    ("qp_num", 24, 4),
    ("wc_flags", 28, 4),
    ("vendor_err", 32, 4),
    ("invalidated_rkey", 36, 4),
    ("src_qp", 40, 4),
)
ENTRY_FORMAT = "<Q" + "I" * (len(ENTRY_FIELDS) - 1)


def _check_layout() -> None:
    # the format packs the fields at exactly the offsets the table names
    at = 0
    for name, offset, size in ENTRY_FIELDS:
        if offset != at:
            raise AssertionError(f"cq ring entry field {name} at {offset}, packed at {at}")
        at += size
    if struct.calcsize(ENTRY_FORMAT) != at or at > ENTRY_SIZE:
        raise AssertionError("cq ring entry format and table differ")


_check_layout()


def entry_offset(index: int, slots: int) -> int:
    """Where entry ``index`` (a producer or consumer count) lies in the ring."""
    return HEADER_SIZE + (index % slots) * ENTRY_SIZE


def ring_bytes(slots: int) -> int:
    """The bytes a ring of ``slots`` entries needs (its memfd may be larger)."""
    return HEADER_SIZE + slots * ENTRY_SIZE
