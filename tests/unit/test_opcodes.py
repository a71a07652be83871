"""The IBTA RC opcode table (protocol/opcodes.py) against the IBTA written out here.

IBTA volume 1, 9.2 (the RC rows of the opcode table, transport bits 000) lists for each
opcode its 5-bit code and the headers its packet carries after the BTH; 9.3.5 the AETH
syndrome encoding; 9.7.5.2.8 the RNR NAK timer codes. Each is typed in again below,
from the specification, not from the module under test.
"""

from __future__ import annotations

import pytest

from softhca.protocol import opcodes
from softhca.protocol.frames import FrameError
from softhca.protocol.opcodes import Op, opcode_for, with_any, with_flags
from softhca.protocol.packets import OPCODES, Packet, decode_packet, packet_header

# code: (name, headers after the BTH, payload?) -- IBTA 9.2 RC opcodes.
IBTA_RC = {
    0b00000: ("SEND_FIRST", "", True),
    0b00001: ("SEND_MIDDLE", "", True),
    0b00010: ("SEND_LAST", "", True),
    0b00011: ("SEND_LAST_WITH_IMM", "ImmDt", True),
    0b00100: ("SEND_ONLY", "", True),
    0b00101: ("SEND_ONLY_WITH_IMM", "ImmDt", True),
    0b00110: ("RDMA_WRITE_FIRST", "RETH", True),
    0b00111: ("RDMA_WRITE_MIDDLE", "", True),
    0b01000: ("RDMA_WRITE_LAST", "", True),
    0b01001: ("RDMA_WRITE_LAST_WITH_IMM", "ImmDt", True),
    0b01010: ("RDMA_WRITE_ONLY", "RETH", True),
    0b01011: ("RDMA_WRITE_ONLY_WITH_IMM", "RETH ImmDt", True),
    0b01100: ("RDMA_READ_REQUEST", "RETH", False),
    0b01101: ("RDMA_READ_RESPONSE_FIRST", "AETH", True),
    0b01110: ("RDMA_READ_RESPONSE_MIDDLE", "", True),
    0b01111: ("RDMA_READ_RESPONSE_LAST", "AETH", True),
    0b10000: ("RDMA_READ_RESPONSE_ONLY", "AETH", True),
    0b10001: ("ACKNOWLEDGE", "AETH", False),
    0b10010: ("ATOMIC_ACKNOWLEDGE", "AETH AtomicAckETH", False),
    0b10011: ("COMPARE_SWAP", "AtomicETH", False),
    0b10100: ("FETCH_ADD", "AtomicETH", False),
    0b10110: ("SEND_LAST_WITH_INV", "IETH", True),
    0b10111: ("SEND_ONLY_WITH_INV", "IETH", True),
    # IBTA 1.5 (Memory Placement Extensions): RDMA ATOMIC WRITE carries a RETH and 8
    # bytes of payload (rxe's IB_OPCODE_RC_RDMA_ATOMIC_WRITE, 0x1D).
    0b11101: ("RDMA_ATOMIC_WRITE", "RETH", True),
}
# IBTA 9.2, UC (transport bits 001): SEND and RDMA WRITE only, the RC rows' headers.
IBTA_UC = {
    0b00100000: ("UC_SEND_FIRST", "", True),
    0b00100001: ("UC_SEND_MIDDLE", "", True),
    0b00100010: ("UC_SEND_LAST", "", True),
    0b00100011: ("UC_SEND_LAST_WITH_IMM", "ImmDt", True),
    0b00100100: ("UC_SEND_ONLY", "", True),
    0b00100101: ("UC_SEND_ONLY_WITH_IMM", "ImmDt", True),
    0b00100110: ("UC_RDMA_WRITE_FIRST", "RETH", True),
    0b00100111: ("UC_RDMA_WRITE_MIDDLE", "", True),
    0b00101000: ("UC_RDMA_WRITE_LAST", "", True),
    0b00101001: ("UC_RDMA_WRITE_LAST_WITH_IMM", "ImmDt", True),
    0b00101010: ("UC_RDMA_WRITE_ONLY", "RETH", True),
    0b00101011: ("UC_RDMA_WRITE_ONLY_WITH_IMM", "RETH ImmDt", True),
}
# IBTA 9.2, UD (transport bits 011): SEND ONLY, with a DETH.
IBTA_UD = {
    0b01100100: ("UD_SEND_ONLY", "DETH", True),
    0b01100101: ("UD_SEND_ONLY_WITH_IMM", "DETH ImmDt", True),
}
HEADER_FLAG = {"RETH": Op.RETH, "AETH": Op.AETH, "ImmDt": Op.IMMDT, "IETH": Op.IETH,
               "AtomicETH": Op.ATOMICETH, "AtomicAckETH": Op.ATOMICACKETH, "DETH": Op.DETH}
HEADER_FIELD = {"RETH": ("reth", (1, 2, 3)), "AETH": ("aeth", ("ACK", 0)),
                "ImmDt": ("imm", 5), "IETH": ("ieth", 6),
                "AtomicETH": ("atomic", (1, 2, 3, 4)), "AtomicAckETH": ("atomic_ack", 7)}


IBTA_ALL = {**IBTA_RC, **IBTA_UC, **IBTA_UD}


def test_numbers_and_names_are_the_ibta_rc_uc_ud_tables():
    assert {op.number: op.name for op in opcodes.TABLE} == {
        code: name for code, (name, _, _) in IBTA_ALL.items()}
    assert set(OPCODES) == {name for name, _, _ in IBTA_ALL.values()}


@pytest.mark.parametrize("code", sorted(IBTA_ALL))
def test_headers_and_payload_of_each_opcode(code):
    name, headers, payload = IBTA_ALL[code]
    flags = opcodes.FLAGS[name]
    want = 0
    for h in headers.split():
        want |= HEADER_FLAG[h]
    assert flags & (Op.RETH | Op.AETH | Op.IMMDT | Op.IETH | Op.ATOMICETH
                    | Op.ATOMICACKETH | Op.DETH) == want
    assert bool(flags & Op.PAYLOAD) == payload


@pytest.mark.parametrize("code", sorted(IBTA_RC))
def test_the_decoder_requires_exactly_the_tables_headers(code):
    """A packet with every IBTA header of its opcode decodes; without any one of them it
    is EPROTO naming it; a payload where the IBTA allows none is EPROTO."""
    name, headers, payload = IBTA_RC[code]
    fields = {HEADER_FIELD[h][0]: HEADER_FIELD[h][1] for h in headers.split()}
    p = Packet(1, 2, name, b"xy" if payload else b"", **fields)
    assert decode_packet(packet_header("mlx5_0", p), p.payload)[1] == p
    for h in headers.split():
        short = Packet(1, 2, name, p.payload, **{k: v for k, v in fields.items()
                                                 if k != HEADER_FIELD[h][0]})
        with pytest.raises(FrameError) as e:
            decode_packet(packet_header("mlx5_0", short), short.payload)
        assert e.value.errno_name == "EPROTO" and "lacks" in e.value.message
    if not payload:
        with pytest.raises(FrameError) as e:
            decode_packet(packet_header("mlx5_0", p), b"z")
        assert e.value.errno_name == "EPROTO"


def test_kinds_and_positions():
    # By the names' IBTA meaning, independently of the flags.
    for code, (name, _, _) in IBTA_RC.items():
        f = opcodes.FLAGS[name]
        single = name in ("RDMA_READ_REQUEST", "ACKNOWLEDGE", "ATOMIC_ACKNOWLEDGE",
                          "COMPARE_SWAP", "FETCH_ADD", "RDMA_ATOMIC_WRITE")
        assert bool(f & Op.FIRST) == ("FIRST" in name or "ONLY" in name or single), name
        assert bool(f & Op.LAST) == ("LAST" in name or "ONLY" in name or single), name
        assert bool(f & Op.MIDDLE) == ("MIDDLE" in name), name
        assert bool(f & Op.WITH_IMM) == name.endswith("WITH_IMM"), name
        assert bool(f & Op.WITH_INV) == name.endswith("WITH_INV"), name
        # Responses are the codes 0x0D-0x12 (read responses, ACK, atomic ACK).
        assert bool(f & Op.RESPONSE) == (0x0D <= code <= 0x12), name
    assert with_flags(Op.ATOMIC) == {"COMPARE_SWAP", "FETCH_ADD"}
    assert with_flags(Op.ACK) == {"ACKNOWLEDGE", "ATOMIC_ACKNOWLEDGE"}
    assert with_flags(Op.SEND | Op.FIRST, none_of=Op.UC | Op.UD) == {
        "SEND_FIRST", "SEND_ONLY", "SEND_ONLY_WITH_IMM", "SEND_ONLY_WITH_INV"}
    assert with_flags(Op.SEND | Op.FIRST, none_of=Op.UD) - with_flags(Op.SEND | Op.FIRST,
                                                                      none_of=Op.UC) == {
        "UC_SEND_FIRST", "UC_SEND_ONLY", "UC_SEND_ONLY_WITH_IMM"}
    assert with_flags(Op.UD) == {"UD_SEND_ONLY", "UD_SEND_ONLY_WITH_IMM"}
    assert with_any(Op.READ_REQUEST | Op.READ_RESPONSE) == {
        n for n, _, _ in IBTA_RC.values() if n.startswith("RDMA_READ")}


def test_opcode_for_names_each_packet_of_a_message():
    assert opcode_for(Op.SEND, True, True) == "SEND_ONLY"
    assert opcode_for(Op.SEND, True, False, imm=True) == "SEND_FIRST"   # ImmDt on the last
    assert opcode_for(Op.SEND, False, True, inv=True) == "SEND_LAST_WITH_INV"
    assert opcode_for(Op.WRITE, False, False) == "RDMA_WRITE_MIDDLE"
    assert opcode_for(Op.WRITE, True, True, imm=True) == "RDMA_WRITE_ONLY_WITH_IMM"
    assert opcode_for(Op.READ_RESPONSE, False, True) == "RDMA_READ_RESPONSE_LAST"
    with pytest.raises(ValueError):
        opcode_for(Op.WRITE, True, True, inv=True)      # IBTA has no WRITE with invalidate


def test_aeth_syndromes_and_rnr_timer_codes():
    # IBTA 9.3.5: bits 6:5 type (00 ACK, 01 RNR NAK, 11 NAK), bits 4:0 value.
    assert opcodes.AETH_SYNDROMES["ACK"] == 0b000_11111
    assert opcodes.AETH_SYNDROMES["RNR"] == 0b001_00000 | opcodes.RNR_TIMER_CODE
    assert [opcodes.AETH_SYNDROMES[n] for n in ("NAK_PSN_SEQ", "NAK_INV_REQ",
                                                "NAK_REM_ACCESS", "NAK_REM_OP")] \
        == [0b011_00000, 0b011_00001, 0b011_00010, 0b011_00011]
    # IBTA 9.7.5.2.8: code 0 is 655.36 ms, then 0.01 ms growing by steps of x1.5 / x4/3.
    ms = opcodes.RNR_TIMER_MS
    assert len(ms) == 32 and ms[0] == 655.36 and ms[1] == 0.01 and ms[12] == 0.64
    assert ms[31] == 491.52 and ms[18] == 5.12
    assert all(ms[i] < ms[i + 1] for i in range(1, 31))


def test_opcode_for_is_the_table_lookup_for_every_position():
    """opcode_for answers from a table built at import; for every kind, position and
    ending it names the opcode whose flags are exactly those (or refuses, as IBTA has
    none), which the test finds by scanning TABLE itself."""
    import itertools

    naming = Op.KIND | Op.POSITION | Op.WITH_IMM | Op.WITH_INV
    for kind in (Op.SEND, Op.WRITE, Op.READ_RESPONSE):
        for first, last, imm, inv in itertools.product((False, True), repeat=4):
            want = (kind | (Op.FIRST if first else 0) | (Op.LAST if last else 0)
                    | (Op.MIDDLE if not first and not last else 0)
                    | (Op.WITH_IMM if last and imm else 0) | (Op.WITH_INV if last and inv else 0))
            names = [op.name for op in opcodes.TABLE if op.flags & naming == want]
            if names:
                assert opcode_for(kind, first, last, imm, inv) == names[0]
            else:
                with pytest.raises(ValueError):
                    opcode_for(kind, first, last, imm, inv)


# -- the work-request opcode table ---------------------------------------------------------

# ibv_post_send(3) and ibv_poll_cq(3), typed in again: the ibv_wc_opcode each modelled
# ibv_wr_opcode completes with, and the opcodes ``*_WITH_IMM`` / SEND / atomic / inline.
WR_WC = {"RDMA_WRITE": "RDMA_WRITE", "RDMA_WRITE_WITH_IMM": "RDMA_WRITE", "SEND": "SEND",
         "SEND_WITH_IMM": "SEND", "SEND_WITH_INV": "SEND", "RDMA_READ": "RDMA_READ",
         "ATOMIC_CMP_AND_SWP": "COMP_SWAP", "ATOMIC_FETCH_AND_ADD": "FETCH_ADD",
         "LOCAL_INV": "LOCAL_INV", "BIND_MW": "BIND_MW", "ATOMIC_WRITE": "ATOMIC_WRITE"}


def test_the_work_request_table_has_one_record_per_ibv_wr_opcode():
    from softhca.protocol.enums import WrOpcode

    assert set(opcodes.WR_OPCODES) == set(WrOpcode)
    table = opcodes.WR_OPCODES
    assert {op.name for op, info in table.items() if info.supported} == set(WR_WC)
    for name, wc in WR_WC.items():
        info = table[WrOpcode[name]]
        assert info.wc_opcode.name == wc, name
        assert info.imm == name.endswith("WITH_IMM"), name
        assert info.send == name.startswith("SEND"), name
        # ATOMIC_WRITE is acknowledged as a WRITE is, not answered by a response.
        assert info.responded == (name == "RDMA_READ" or name.startswith("ATOMIC_")
                                  and name != "ATOMIC_WRITE"), name
        # "valid only for Send and RDMA Write" (ibv_post_send(3)).
        assert info.inline == (name.startswith("SEND") or name.startswith("RDMA_WRITE")), name
    assert table[WrOpcode.ATOMIC_CMP_AND_SWP].atomic == "COMPARE_SWAP"
    assert table[WrOpcode.ATOMIC_FETCH_AND_ADD].atomic == "FETCH_ADD"
    assert [op for op, info in table.items() if info.atomic] == [
        WrOpcode.ATOMIC_CMP_AND_SWP, WrOpcode.ATOMIC_FETCH_AND_ADD]
    # Every atomic packet opcode the table names is an IBTA atomic request.
    assert {info.atomic for info in table.values() if info.atomic} == with_flags(Op.ATOMIC)
