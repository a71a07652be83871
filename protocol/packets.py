"""RC packets on the wire plane: the record, its frame header, and the integrity check.

A packet is one frame on a wire connection between two daemons (``docs/protocol.md``).
The header carries what RoCE's BTH and extension headers carry; the payload is the
frame's raw payload. ``packet_check`` (the ``icrc`` field) plays the RoCE ICRC: a CRC32 over the invariant header
fields and the payload. A receiver that finds it wrong drops the packet, counts it,
and leaves recovery to the requester's retransmission, as on a real link.

Header (a msgpack map):

=========  =====================================================================
``t``      ``"pkt"``
``dev``    destination HCA name (a daemon may host several)
``qp``     destination QP number (BTH DestQP, 24 bits)
``psn``    packet sequence number (BTH PSN, 24 bits)
``op``     opcode name, one of ``OPCODES`` (BTH OpCode)
``reth``   ``[rkey, va, dma_len]`` on RDMA WRITE FIRST/ONLY and READ REQUEST
``aeth``   ``[syndrome, msn]`` on ACKNOWLEDGE, READ RESPONSE FIRST/LAST/ONLY, ATOMIC ACK
``imm``    ImmDt, on the ``*_WITH_IMM`` packets
``ieth``   the rkey to invalidate, on ``SEND_*_WITH_INV``
``ateth``  ``[rkey, va, swap_or_add, compare]`` on the two atomic requests
``atack``  the original value, on ATOMIC_ACKNOWLEDGE
``icrc``   CRC32 (zlib polynomial) of ``msgpack([dev, qp, psn, op, reth, aeth, imm,
           ieth, ateth, atack]) + payload``
=========  =====================================================================
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import msgpack

from .frames import FrameError, field
from .opcodes import FLAGS, NAMES, SYNDROMES, Op

PSN_MOD = 1 << 24
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1

# Every opcode name a packet may carry: the IBTA RC opcode table's (protocol/opcodes.py).
OPCODES = NAMES


@dataclass(frozen=True)
class Packet:
    """One RC packet: BTH (dest_qp, psn, opcode), RETH (rkey, addr, dma_len), AETH
    (syndrome, msn), ImmDt, IETH (rkey), AtomicETH (rkey, addr, swap_add, compare)
    and AtomicAckETH (original value), each present where the opcode carries it."""

    dest_qp: int
    psn: int
    opcode: str
    payload: bytes = b""
    reth: tuple | None = None
    aeth: tuple | None = None
    imm: int | None = None
    ieth: int | None = None
    atomic: tuple | None = None
    atomic_ack: int | None = None


# The packet fields that carry each extension header.
_HEADER_FIELDS = ((Op.RETH, "reth"), (Op.AETH, "aeth"), (Op.IMMDT, "imm"), (Op.IETH, "ieth"),
                  (Op.ATOMICETH, "ateth"), (Op.ATOMICACKETH, "atack"))


def _needs(op: str) -> tuple[set[str], bool]:
    """The extension headers opcode ``op`` must carry, and whether it may carry a payload
    (IBTA 9.2, the RC opcode table)."""
    flags = FLAGS[op]
    return {name for bit, name in _HEADER_FIELDS if flags & bit}, bool(flags & Op.PAYLOAD)


_NEEDS = {op: _needs(op) for op in OPCODES}


class IntegrityError(FrameError):
    """The packet's icrc does not match: a link error, the packet is dropped."""


def _listify(t):
    return list(t) if t is not None else None


def packet_check(dev: str, p: Packet) -> int:
    """The integrity check of ``p`` addressed to HCA ``dev`` (the header's ``icrc``; the
    RoCEv2 ICRC of a captured frame is protocol/roce.py's ``roce_icrc``)."""
    head = msgpack.packb([dev, p.dest_qp, p.psn, p.opcode, _listify(p.reth),
                          _listify(p.aeth), p.imm, p.ieth, _listify(p.atomic),
                          p.atomic_ack], use_bin_type=True)
    return zlib.crc32(p.payload, zlib.crc32(head))


def packet_header(dev: str, p: Packet, *, icrc_value: int | None = None) -> dict:
    """The frame header for ``p``; ``icrc_value`` overrides the computed check (fault
    injection of a link error leaves a stale one)."""
    h: dict = {"t": "pkt", "dev": dev, "qp": p.dest_qp, "psn": p.psn, "op": p.opcode}
    for name, value in (("reth", p.reth), ("aeth", p.aeth), ("imm", p.imm),
                        ("ieth", p.ieth), ("ateth", p.atomic), ("atack", p.atomic_ack)):
        if value is not None:
            h[name] = _listify(value) if isinstance(value, tuple) else value
    h["icrc"] = packet_check(dev, p) if icrc_value is None else icrc_value
    return h


def _uint(v, bits: int, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < (1 << bits):
        raise FrameError("EPROTO", f"{what} of 'pkt' must be a {bits}-bit unsigned int, "
                                   f"got {v!r}"[:120])
    return v


def _tuple(header: dict, name: str, n: int, kinds: tuple) -> tuple | None:
    v = field(header, name, list, min=n, max=n, required=False)
    if v is None:
        return None
    out = []
    for i, (item, kind) in enumerate(zip(v, kinds, strict=True)):
        if kind == "syndrome":
            if item not in SYNDROMES:
                raise FrameError("EPROTO", f"{name}[{i}] of 'pkt' is not a known AETH "
                                           f"syndrome: {item!r}"[:120])
            out.append(item)
        else:
            out.append(_uint(item, kind, f"{name}[{i}]"))
    return tuple(out)


def decode_packet(header: dict, payload) -> tuple[str, Packet]:
    """Validate a ``pkt`` frame; return (destination HCA, Packet).

    Raises FrameError("EPROTO") naming the bad field, or IntegrityError when every
    field is well formed but the icrc does not match.
    """
    get = header.get
    dev, qp, psn, op, check = get("dev"), get("qp"), get("psn"), get("op"), get("icrc")
    # Every packet of the wire path comes here: the well-formed BTH is decided by exact
    # type and range tests; anything else takes field()'s path, which names the fault.
    if not (type(dev) is str and 0 < len(dev) <= 64 and type(qp) is int
            and 0 <= qp < PSN_MOD and type(psn) is int and 0 <= psn < PSN_MOD
            and type(op) is str and op in OPCODES and type(check) is int
            and 0 <= check <= _U32):
        dev = field(header, "dev", str, min=1, max=64)
        qp = field(header, "qp", int, min=0, max=PSN_MOD - 1)
        psn = field(header, "psn", int, min=0, max=PSN_MOD - 1)
        op = field(header, "op", str, max=40)
        if op not in OPCODES:
            raise FrameError("EPROTO", f"op of 'pkt' is not an RC opcode: {op!r}"[:120])
        check = field(header, "icrc", int, min=0, max=_U32)
    reth = _tuple(header, "reth", 3, (32, 64, 32)) if "reth" in header else None
    aeth = _tuple(header, "aeth", 2, ("syndrome", 24)) if "aeth" in header else None
    imm = field(header, "imm", int, min=0, max=_U32) if "imm" in header else None
    ieth = field(header, "ieth", int, min=0, max=_U32) if "ieth" in header else None
    ateth = _tuple(header, "ateth", 4, (32, 64, 64, 64)) if "ateth" in header else None
    atack = field(header, "atack", int, min=0, max=_U64) if "atack" in header else None
    need, may_carry = _NEEDS[op]
    present = {"reth": reth, "aeth": aeth, "imm": imm, "ieth": ieth, "ateth": ateth,
               "atack": atack}
    missing = sorted(n for n in need if present[n] is None)
    if missing:
        raise FrameError("EPROTO", f"packet {op} lacks its {', '.join(missing)} header")
    if payload and len(payload) and not may_carry:
        raise FrameError("EPROTO", f"packet {op} carries no payload, got {len(payload)} bytes")
    p = Packet(qp, psn, op, bytes(payload), reth, aeth, imm, ieth, ateth, atack)
    if packet_check(dev, p) != check:
        raise IntegrityError("EPROTO", f"packet {op} psn {psn:#x} to QP {qp:#x}: icrc "
                                       f"mismatch, dropped")
    return dev, p
