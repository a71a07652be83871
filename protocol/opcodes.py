"""The IBTA RC opcode table: every packet's number, name and what it is.

One table, read by everything that needs to know what an opcode means: the packet
decoder (which extension headers an opcode must carry), the RC requester and
responder (where a message begins and ends, what completes what), the fault rules
(which packets start a message) and the RoCEv2 encoder (the BTH OpCode byte, the
AETH syndrome byte). Linux rxe does the same with its ``rxe_opcode[]`` table and
its START/MIDDLE/END/SEND/WRITE/READ/IMMDT/RETH/AETH masks.

A second table, ``WR_OPCODES``, says what each send work request opcode
(enum ibv_wr_opcode) is to the RC requester, as rxe's ``rxe_wr_opcode_info[]`` does.

Numbers are the IBTA's (volume 1, 9.2, the RC opcodes: transport bits 000); names are
the ones packets carry on softhca's wire. A single-packet message (RDMA READ request,
an atomic, an ACK) is both FIRST and LAST, as rxe marks it START and END; ONLY is
FIRST | LAST.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag

from .enums import WcOpcode, WrOpcode


class Op(IntFlag):
    """What an RC opcode is and which headers its packet carries."""

    # Where the packet sits in its message.
    FIRST = 1 << 0
    MIDDLE = 1 << 1
    LAST = 1 << 2
    ONLY = FIRST | LAST
    # What the message is. Requests go requester -> responder, responses back.
    SEND = 1 << 3
    WRITE = 1 << 4
    READ_REQUEST = 1 << 5
    READ_RESPONSE = 1 << 6
    ATOMIC = 1 << 7         # COMPARE_SWAP and FETCH_ADD requests
    ACK = 1 << 8            # ACKNOWLEDGE and ATOMIC_ACKNOWLEDGE
    WITH_IMM = 1 << 9
    WITH_INV = 1 << 10
    # The headers after the BTH (IBTA 9.3), and whether a payload may follow.
    RETH = 1 << 11
    AETH = 1 << 12
    IMMDT = 1 << 13
    IETH = 1 << 14
    ATOMICETH = 1 << 15
    ATOMICACKETH = 1 << 16
    PAYLOAD = 1 << 17
    # The transport of an opcode that is not RC's (IBTA 9.2: transport bits 001 UC,
    # 011 UD), and the DETH (Q_Key, source QP) that UD packets carry.
    UC = 1 << 18
    UD = 1 << 19
    DETH = 1 << 20
    # RDMA ATOMIC WRITE (IBTA 1.5 / rxe's IB_OPCODE_RC_RDMA_ATOMIC_WRITE): a RETH and 8
    # bytes placed as one 64-bit store, answered by an ACK.
    ATOMIC_WRITE = 1 << 21

    REQUEST = SEND | WRITE | READ_REQUEST | ATOMIC | ATOMIC_WRITE
    RESPONSE = READ_RESPONSE | ACK
    POSITION = FIRST | MIDDLE | LAST
    KIND = SEND | WRITE | READ_REQUEST | READ_RESPONSE | ATOMIC | ACK


@dataclass(frozen=True)
class Opcode:
    """One row of the table."""

    number: int
    name: str
    flags: Op


_F, _M, _L, _O = Op.FIRST, Op.MIDDLE, Op.LAST, Op.ONLY
_SEND = Op.SEND | Op.PAYLOAD
_WRITE = Op.WRITE | Op.PAYLOAD
_RESP = Op.READ_RESPONSE | Op.PAYLOAD

# The RC SEND and RDMA WRITE rows, which UC repeats 0x20 higher (IBTA 9.2).
_RC_SEND_WRITE = tuple(Opcode(n, name, f) for n, name, f in (
    (0x00, "SEND_FIRST", _SEND | _F), (0x01, "SEND_MIDDLE", _SEND | _M),
    (0x02, "SEND_LAST", _SEND | _L),
    (0x03, "SEND_LAST_WITH_IMM", _SEND | _L | Op.WITH_IMM | Op.IMMDT),
    (0x04, "SEND_ONLY", _SEND | _O),
    (0x05, "SEND_ONLY_WITH_IMM", _SEND | _O | Op.WITH_IMM | Op.IMMDT),
    (0x06, "RDMA_WRITE_FIRST", _WRITE | _F | Op.RETH), (0x07, "RDMA_WRITE_MIDDLE", _WRITE | _M),
    (0x08, "RDMA_WRITE_LAST", _WRITE | _L),
    (0x09, "RDMA_WRITE_LAST_WITH_IMM", _WRITE | _L | Op.WITH_IMM | Op.IMMDT),
    (0x0A, "RDMA_WRITE_ONLY", _WRITE | _O | Op.RETH),
    (0x0B, "RDMA_WRITE_ONLY_WITH_IMM", _WRITE | _O | Op.RETH | Op.WITH_IMM | Op.IMMDT)))

# IBTA 9.2, the RC opcode table. 0x15 is reserved; 0x18-0x1C (FLUSH among them) and
# 0x1E-0x1F are not modelled.
TABLE: tuple[Opcode, ...] = (
    *_RC_SEND_WRITE,
    Opcode(0x0C, "RDMA_READ_REQUEST", Op.READ_REQUEST | _O | Op.RETH),
    # IBTA: FIRST, LAST and ONLY read responses carry an AETH, MIDDLE not.
    Opcode(0x0D, "RDMA_READ_RESPONSE_FIRST", _RESP | _F | Op.AETH),
    Opcode(0x0E, "RDMA_READ_RESPONSE_MIDDLE", _RESP | _M),
    Opcode(0x0F, "RDMA_READ_RESPONSE_LAST", _RESP | _L | Op.AETH),
    Opcode(0x10, "RDMA_READ_RESPONSE_ONLY", _RESP | _O | Op.AETH),
    Opcode(0x11, "ACKNOWLEDGE", Op.ACK | _O | Op.AETH),
    Opcode(0x12, "ATOMIC_ACKNOWLEDGE", Op.ACK | _O | Op.AETH | Op.ATOMICACKETH),
    Opcode(0x13, "COMPARE_SWAP", Op.ATOMIC | _O | Op.ATOMICETH),
    Opcode(0x14, "FETCH_ADD", Op.ATOMIC | _O | Op.ATOMICETH),
    Opcode(0x16, "SEND_LAST_WITH_INV", _SEND | _L | Op.WITH_INV | Op.IETH),
    Opcode(0x17, "SEND_ONLY_WITH_INV", _SEND | _O | Op.WITH_INV | Op.IETH),
    Opcode(0x1D, "RDMA_ATOMIC_WRITE", Op.ATOMIC_WRITE | _O | Op.RETH | Op.PAYLOAD),
    # IBTA 9.2, UC (0x20-0x2B): SEND and RDMA WRITE only, no responses.
    *(Opcode(0x20 + rc.number, "UC_" + rc.name, rc.flags | Op.UC)
      for rc in _RC_SEND_WRITE),
    # IBTA 9.2, UD (0x64, 0x65): one-packet SENDs, each with a DETH.
    Opcode(0x64, "UD_SEND_ONLY", _SEND | _O | Op.UD | Op.DETH),
    Opcode(0x65, "UD_SEND_ONLY_WITH_IMM", _SEND | _O | Op.UD | Op.DETH | Op.WITH_IMM | Op.IMMDT),
)

BY_NAME: dict[str, Opcode] = {op.name: op for op in TABLE}
FLAGS: dict[str, Op] = {op.name: op.flags for op in TABLE}
OPCODE_NUMBERS: dict[str, int] = {op.name: op.number for op in TABLE}
NAMES = frozenset(BY_NAME)

ACKNOWLEDGE = "ACKNOWLEDGE"
ATOMIC_ACKNOWLEDGE = "ATOMIC_ACKNOWLEDGE"
RDMA_READ_REQUEST = "RDMA_READ_REQUEST"
RDMA_ATOMIC_WRITE = "RDMA_ATOMIC_WRITE"


# -- send work requests (enum ibv_wr_opcode) -------------------------------------------


@dataclass(frozen=True)
class WrInfo:
    """What one ibv_wr_opcode is to the RC requester."""

    # Modelled on an RC QP; posting any other opcode is EOPNOTSUPP.
    supported: bool
    # The completion's ibv_wc_opcode.
    wc_opcode: WcOpcode
    # ibv_post_send(3): the WR carries imm_data (a ``*_WITH_IMM`` opcode).
    imm: bool = False
    # Its message is a SEND (a receive on the responder takes it).
    send: bool = False
    # An atomic: the opcode of its one request packet.
    atomic: str | None = None
    # Answered by responses of its own, which alone complete it (READ, atomics): what
    # max_rd_atomic counts (ibv_modify_qp(3)).
    responded: bool = False
    # ibv_post_send(3): IBV_SEND_INLINE is "valid only for Send and RDMA Write".
    inline: bool = False


WR_OPCODES: dict[WrOpcode, WrInfo] = {
    WrOpcode.RDMA_WRITE: WrInfo(True, WcOpcode.RDMA_WRITE, inline=True),
    WrOpcode.RDMA_WRITE_WITH_IMM: WrInfo(True, WcOpcode.RDMA_WRITE, imm=True, inline=True),
    WrOpcode.SEND: WrInfo(True, WcOpcode.SEND, send=True, inline=True),
    WrOpcode.SEND_WITH_IMM: WrInfo(True, WcOpcode.SEND, imm=True, send=True, inline=True),
    WrOpcode.RDMA_READ: WrInfo(True, WcOpcode.RDMA_READ, responded=True),
    WrOpcode.ATOMIC_CMP_AND_SWP: WrInfo(True, WcOpcode.COMP_SWAP, atomic="COMPARE_SWAP",
                                        responded=True),
    WrOpcode.ATOMIC_FETCH_AND_ADD: WrInfo(True, WcOpcode.FETCH_ADD, atomic="FETCH_ADD",
                                          responded=True),
    WrOpcode.LOCAL_INV: WrInfo(True, WcOpcode.LOCAL_INV),
    WrOpcode.BIND_MW: WrInfo(True, WcOpcode.BIND_MW),
    WrOpcode.SEND_WITH_INV: WrInfo(True, WcOpcode.SEND, send=True, inline=True),
    WrOpcode.TSO: WrInfo(False, WcOpcode.TSO),
    # The MKEY configure WR (mlx5dv_wr_mkey_configure): posted through RCQP.post_local,
    # never as a send WR.
    WrOpcode.DRIVER1: WrInfo(False, WcOpcode.DRIVER1),
    WrOpcode.ATOMIC_WRITE: WrInfo(True, WcOpcode.ATOMIC_WRITE),
}


def with_flags(all_of: Op, none_of: int = 0) -> frozenset[str]:
    """The opcode names whose flags include every bit of ``all_of`` and none of
    ``none_of``: built once, so the wire path tests membership, not names."""
    return frozenset(op.name for op in TABLE
                     if op.flags & all_of == all_of and not op.flags & none_of)


def with_any(any_of: Op) -> frozenset[str]:
    """The opcode names whose flags include a bit of ``any_of``."""
    return frozenset(op.name for op in TABLE if op.flags & any_of)


# What names a packet of a message: its kind, position and ending (IMM / INV).
_NAMING = Op.KIND | Op.POSITION | Op.WITH_IMM | Op.WITH_INV
_BY_NAMING = {op.flags & _NAMING: op.name for op in TABLE
              if op.flags & (Op.SEND | Op.WRITE | Op.READ_RESPONSE)
              and not op.flags & (Op.UC | Op.UD)}


def _naming(kind: Op, first: bool, last: bool, imm: bool, inv: bool) -> int:
    flags = kind | (Op.FIRST if first else 0) | (Op.LAST if last else 0)
    if not first and not last:
        flags |= Op.MIDDLE
    if last and imm:
        flags |= Op.WITH_IMM
    if last and inv:
        flags |= Op.WITH_INV
    return flags


# Every (kind, first, last, imm, inv) answered once here: the wire path asks several times
# per packet train, and IntFlag arithmetic costs about a microsecond a call.
_OPCODE_FOR: dict[tuple, str] = {}
for _kind in (Op.SEND, Op.WRITE, Op.READ_RESPONSE):
    for _key in ((f, la, i, v) for f in (False, True) for la in (False, True)
                 for i in (False, True) for v in (False, True)):
        _name = _BY_NAMING.get(_naming(_kind, *_key))
        if _name is not None:
            _OPCODE_FOR[(int(_kind), *_key)] = _name


def opcode_for(kind: Op, first: bool, last: bool, imm: bool = False,
               inv: bool = False) -> str:
    """The opcode of a packet of a ``kind`` message (SEND, WRITE, READ_RESPONSE) at that
    position; ImmDt and IETH go on the last packet only (IBTA 9.2)."""
    name = _OPCODE_FOR.get((int(kind), bool(first), bool(last), bool(imm), bool(inv)))
    if name is None:
        raise ValueError(f"no RC opcode is {Op(_naming(kind, first, last, imm, inv))!r}")
    return name


# -- AETH (IBTA 9.3.5) -------------------------------------------------------------------

# IBTA 9.7.5.2.8, the RNR NAK timer field: code -> milliseconds (code 0 is the longest).
RNR_TIMER_MS = (655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48,
                0.64, 0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72,
                40.96, 61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52)

# The timer of a plain "RNR" syndrome, the name daemons before the timer codes sent:
# the client's min_rnr_timer default.
RNR_TIMER_CODE = 12

# An RNR NAK carries the responder's min_rnr_timer, which the requester waits before it
# sends again (IBTA 9.7.5.2.8): "RNR_<code>" for each of the 32 codes.
RNR_SYNDROMES = {"RNR": RNR_TIMER_CODE, **{f"RNR_{c}": c for c in range(32)}}


def rnr_syndrome(code: int) -> str:
    """The syndrome name of an RNR NAK with timer ``code``."""
    return f"RNR_{code}"


# AETH syndrome = reserved bit 7, type in bits 6:5 (00 ACK, 01 RNR NAK, 11 NAK), value in
# bits 4:0 (credit count, 0x1F "invalid" for an ACK without end-to-end credits; RNR
# timer; NAK code). By the names softhca's packets carry.
AETH_SYNDROMES = {
    "ACK": 0x1F,
    **{name: 0x20 | code for name, code in RNR_SYNDROMES.items()},
    "NAK_PSN_SEQ": 0x60,
    "NAK_INV_REQ": 0x61,
    "NAK_REM_ACCESS": 0x62,
    "NAK_REM_OP": 0x63,
}
SYNDROMES = frozenset(AETH_SYNDROMES)
