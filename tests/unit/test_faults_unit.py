"""The fault rule engine alone: determinism, message and block location."""

from __future__ import annotations

from softhca.protocol.packets import Packet
from softhca.server.faults import Faults

MTU = 1024


def stream(n_msgs: int = 50) -> list[Packet]:
    """RDMA_WRITE messages of 3 packets each, PSNs running on."""
    pkts, psn = [], 0
    for m in range(n_msgs):
        for pos in ("FIRST", "MIDDLE", "LAST"):
            pkts.append(Packet(0x11, psn, f"RDMA_WRITE_{pos}", bytes([m % 256]) * MTU,
                               reth=(1, 0, 3 * MTU) if pos == "FIRST" else None))
            psn += 1
    return pkts


def run(rules: list[dict], pkts: list[Packet]) -> list[tuple]:
    f = Faults()
    for r in rules:
        f.add(r)
    out = []
    for p in pkts:
        for e in f.apply("out", 0x22, MTU, [p]):
            out.append((e.packet.psn, e.packet.payload, e.stale_icrc_of is not None, e.delay))
    out += [(e.packet.psn, e.packet.payload, False, 0.0) for _, e in f.flush_held()]
    return out


RULES = [{"action": "drop", "probability": 0.1, "seed": 7},
         {"action": "duplicate", "probability": 0.1, "seed": 8},
         {"action": "reorder", "probability": 0.1, "seed": 9, "window": 2},
         {"action": "corrupt", "probability": 0.2, "seed": 10, "block": 1, "block_size": 520,
          "field": "guard"}]


def test_same_rules_seed_and_traffic_give_the_same_faults():
    pkts = stream()
    first, second = run(RULES, pkts), run(RULES, pkts)
    assert first == second
    assert len(first) != len(pkts) or first != [(p.psn, p.payload, False, 0.0) for p in pkts]


def test_another_seed_gives_other_faults():
    pkts = stream()
    other = [{**r, "seed": r["seed"] + 100} for r in RULES]
    assert run(RULES, pkts) != run(other, pkts)


def test_message_packet_and_block_select_the_bytes():
    # Message 2, block 1 (wire bytes 520..1039): its guard is bytes 1032..1033, in packet 2
    # of the message (bytes 1024..2047), at 8..9 of that packet.
    f = Faults()
    f.add({"action": "corrupt", "message": 2, "block": 1, "block_size": 520, "field": "guard",
           "set": 0xABCD})
    out = [e.packet for p in stream(3) for e in f.apply("out", 0x22, MTU, [p])]
    changed = [(q.psn, i) for p, q in zip(stream(3), out, strict=True)
               for i in range(len(p.payload)) if p.payload[i] != q.payload[i]]
    assert changed == [(4, 8), (4, 9)]
    assert out[4].payload[8:10] == b"\xab\xcd"
    # A retransmission of that packet is the same message: it matches again.
    again = f.apply("out", 0x22, MTU, [stream(3)[4]])
    assert again[0].packet.payload[8:10] == b"\xab\xcd"
    assert f.rules[0].fired == 2


def test_a_data_byte_needs_only_its_offset_in_the_message():
    # No block: offset 2100 is byte 2100 of message 3, the 53rd byte of its third packet
    # (bytes 2048..3071 at an MTU of 1024); message 3's bytes are all 2.
    f = Faults()
    rule = f.add({"action": "corrupt", "message": 3, "offset": 2100, "xor": 0xFF})
    assert "block" not in rule.spec and rule.spec["field"] == "data"
    pkts = stream(4)
    out = [e.packet for p in pkts for e in f.apply("out", 0x22, MTU, [p])]
    changed = [(q.psn, i, q.payload[i]) for p, q in zip(pkts, out, strict=True)
               for i in range(len(p.payload)) if p.payload[i] != q.payload[i]]
    assert changed == [(8, 2100 - 2048, 2 ^ 0xFF)]


def test_a_corrupt_rule_says_what_it_needs():
    import pytest

    from softhca.protocol.errors import RDMAError
    from softhca.server.faults import validate_rule

    for bad, said in (({"action": "corrupt"}, "needs 'block' and 'block_size'"),
                      ({"action": "corrupt", "field": "guard"}, "needs 'block' and 'block_size'"),
                      ({"action": "corrupt", "block": 1}, "needs 'block' and 'block_size'"),
                      ({"action": "corrupt", "offset": 3, "xor": 0x100}, "below 0x100"),
                      ({"action": "corrupt", "offset": 3, "pi_size": 4}, "pi_size goes with")):
        with pytest.raises(RDMAError) as e:
            validate_rule(bad)
        assert said in e.value.message, (bad, e.value.message)
