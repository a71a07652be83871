"""Python stays the reference: the differential test of softhca's data paths.

Two configurations of the data path that must be indistinguishable from outside (the
engine's native transforms against its Python ones, packet trains against packet by
packet; ``PAIRS`` in tests/support/differential.py, where another pair joins with one
line) run the same seeded workloads (tests/support/diff_workload.py: RC QP pairs with
every modelled RC opcode, sizes across path MTUs 1024 and 4096 up to 1 MiB, several
SGEs, signature and AES-XTS MKEYs, RNR, drop / duplicate / reorder fault rules, and
WRs that must fail), each configuration on fresh ``softhca serve`` daemons of its own,
both at once. Each workload must give:

- the same completions, per QP in order: wr_id, status, opcode, byte_len, imm_data,
  wc_flags, vendor_err, the invalidated key and the QP (by name); an error status, and
  the flushes that follow it, are compared in order too;
- the same memory afterwards: every MR's bytes on both daemons, and each signature
  MKEY's mlx5dv_mkey_check(3);
- the same packets on the wire, from the daemons' own captures (``serve --capture``).
  Identities are random per run by design (QPNs, keys, initial PSNs, MR addresses) and
  ACK coalescing and go-back-N retransmissions depend on timing, so packets are
  compared as tests/support/diff_wire.py says: per QP and direction, the requests and
  the READ responses / atomic ACKs as the packets that first carry each PSN, in PSN
  order, with QPNs and keys mapped to the run's names, VAs to offsets in their MR or
  MKEY, PSNs relative to the requester's initial PSN, and every other BTH field, every
  extension header field and every payload byte as they are; ACKs by their last
  acknowledged PSN and MSN and the set of syndromes; an error NAK ends that QP's
  comparison (requests up to its PSN, responses before it). The Ethernet, IPv4 and UDP
  headers and the ICRC (which covers the DestQP, PSN, R_Key and VA) are left out of
  the comparison; the ICRC of every frame is recomputed and must match its bytes.

``test_the_comparison_catches_a_real_difference`` changes one run's capture (a payload
byte, an ImmDt, an opcode, a missing packet, an ACK), completions or memory by hand and
requires the comparison to fail on each: a comparison that cannot fail proves nothing.

Each pair's count of workloads, WRs, failures and packets compared is printed in the
run's summary (section "differential"). ``SOFTHCA_DIFFERENTIAL_EXAMPLES`` (default 12
workloads per pair) asks for more, ``SOFTHCA_DIFFERENTIAL_SEED`` (default 1619) for
other workloads. A failing workload is cut down (one QP pair, the shortest prefix of
its WRs) and printed.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
from collections import Counter

import diff_wire as dw
import diff_workload as dwl
import differential as dt
import pytest

import softhca.client as sh

EXAMPLES = int(os.environ.get("SOFTHCA_DIFFERENTIAL_EXAMPLES", "12"))
SEED = int(os.environ.get("SOFTHCA_DIFFERENTIAL_SEED", "1619"))

# Lines for pytest's terminal summary, section "differential" (tests/conftest.py).
REPORT: list[str] = []


def workloads(pair: dt.Pair, n: int = EXAMPLES) -> list[dwl.Workload]:
    return [dwl.generate(SEED * 1000 + i, pair.features) for i in range(n)]


@pytest.mark.parametrize("pair", dt.PAIRS, ids=[p.name for p in dt.PAIRS])
async def test_pair_is_indistinguishable(pair: dt.Pair, tmp_path):
    why = pair.missing() if callable(pair.missing) else None
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {why}")
        pytest.skip(why)
    wls = workloads(pair)
    ra, rb = await asyncio.gather(
        dt.run_config(pair.a, wls, str(tmp_path / "a")),
        dt.run_config(pair.b, wls, str(tmp_path / "b")))
    failures, packets = [], 0
    for wl, x, y in zip(wls, ra, rb, strict=True):
        oa, ob = dt.observe(x), dt.observe(y)
        packets += oa.packets
        diffs = dt.compare(oa, ob)
        if diffs:
            failures.append((wl, diffs))
    REPORT.append(f"differential {pair.name} ({pair.a.name} / {pair.b.name}): {len(wls)} "
                  f"workloads, {sum(w.wr_count for w in wls):,} WRs, {len(failures)} "
                  f"failures; packets compared {packets:,}")
    if failures:
        wl, diffs = failures[0]
        small, why = await dt.minimise(pair, wl, str(tmp_path / "minimise"))
        pytest.fail(f"{pair.name}: {len(failures)} of {len(wls)} workloads differ "
                    f"(seeds {[w.seed for w, _ in failures]}); the first:\n  "
                    + "\n  ".join(diffs) + "\ncut down to:\n" + dt.describe(small)
                    + ("\n  " + "\n  ".join(why) if why else "\n  (no smaller cut differs)"))


# -- the generator covers what the test claims ------------------------------------------------

def test_workloads_are_seeded_and_cover_the_claims():
    assert dwl.generate(7) == dwl.generate(7)
    assert dwl.generate(7) != dwl.generate(8)
    # Over the default examples of the two pairs, everything the docstring names occurs.
    seen: Counter = Counter()
    for pair in dt.PAIRS:
        for wl in workloads(pair):
            for p in wl.pairs:
                seen[("mtu", p.mtu)] += 1
                seen["rnr"] += p.rnr
                for rule in p.faults:
                    seen[("fault", rule["action"])] += 1
                    seen[("fault on", rule["on"])] += 1
                for w in p.wrs:
                    seen[("opcode", w.opcode)] += 1
                    seen["multi-sge"] += len(w.sg) > 1
                    seen["inline"] += w.inline
                    total = sum(n for _, _, n in w.sg)
                    seen[("size", "zero")] += total == 0
                    seen[("size", "mtu+1")] += total == p.mtu + 1
                    seen[("size", ">=256K")] += total >= 256 << 10
                    if w.remote is not None and w.remote[0] == "bogus":
                        seen[("fails", "bogus key")] += 1
                    if w.remote is not None and w.remote[0].endswith(".ro"):
                        seen[("fails", "no remote write")] += 1
                    if w.remote is not None and w.remote[1] < 0:
                        seen[("fails", "read past the MR")] += 1
            for m in wl.mkeys:
                seen[("mkey", m.kind)] += 1
    want = [("mtu", 1024), ("mtu", 4096), "rnr", "multi-sge", "inline", ("size", "zero"),
            ("size", "mtu+1"), ("size", ">=256K"), ("fails", "bogus key"),
            ("fails", "no remote write"), ("fails", "read past the MR")]
    want += [("opcode", op) for op in (
        sh.IBV_WR_SEND, sh.IBV_WR_SEND_WITH_IMM, sh.IBV_WR_SEND_WITH_INV, sh.IBV_WR_RDMA_WRITE,
        sh.IBV_WR_RDMA_WRITE_WITH_IMM, sh.IBV_WR_RDMA_READ, sh.IBV_WR_ATOMIC_CMP_AND_SWP,
        sh.IBV_WR_ATOMIC_FETCH_AND_ADD, sh.IBV_WR_ATOMIC_WRITE)]
    want += [("fault", a) for a in ("drop", "duplicate", "reorder")]
    want += [("fault on", on) for on in ("requester", "responder")]
    want += [("mkey", kind) for kind in (*dwl.MKEY_KINDS, "inv")]
    missing = [w for w in want if not seen[w]]
    assert not missing, f"the default workloads never have {missing}"


# -- the comparison can fail ----------------------------------------------------------------

def _mutation_workload() -> dwl.Workload:
    """One QP pair, MTU 1024, no fault and no failing WR: multi-packet SENDs and WRITEs,
    ImmDt, a READ and an atomic, so that every mutation below has something to change."""
    mtu = 1024
    wrs = [dwl.WrSpec(sh.IBV_WR_SEND_WITH_IMM, [("m.src", 0, 3 * mtu + 5)], imm=0xC0FFEE),
           dwl.WrSpec(sh.IBV_WR_RDMA_WRITE, [("m.src", 8, 2 * mtu)], ("m.tgt", 64)),
           dwl.WrSpec(sh.IBV_WR_RDMA_WRITE_WITH_IMM, [("m.src", 16, mtu + 1)], ("m.tgt", 0),
                      imm=0xBEEF),
           dwl.WrSpec(sh.IBV_WR_RDMA_READ, [("m.sink", 0, 5 * mtu)], ("m.tgt", 128)),
           dwl.WrSpec(sh.IBV_WR_ATOMIC_FETCH_AND_ADD, [("m.sink", 8 * mtu, 8)],
                      ("m.tgt", 8 * mtu), compare_add=5),
           dwl.WrSpec(sh.IBV_WR_SEND, [("m.src", 24, 100)])]
    recvs = [[("m.recv", 0, 4 * mtu)], [("m.recv", 4 * mtu, 64)], [("m.recv", 5 * mtu, 128)]]
    mrs = [dwl.MrSpec("m.src", 0, 4 * mtu, dwl.LOCAL, 1),
           dwl.MrSpec("m.sink", 0, 9 * mtu, dwl.LOCAL, 2),
           dwl.MrSpec("m.tgt", 1, 9 * mtu, dwl.ALL, 3),
           dwl.MrSpec("m.recv", 1, 6 * mtu, dwl.LOCAL, 4)]
    return dwl.Workload(MUTATION_SEED, mrs, [], [
        dwl.PairSpec("m", 0, mtu, wrs, recvs, chunks=[len(wrs)])])


MUTATION_SEED = -1


def _frames_to(raw: dt.Raw, pred) -> list[int]:
    """Indexes of ``raw``'s frames for which ``pred(frame)`` holds."""
    return [i for i, fr in enumerate(raw.frames) if pred(fr)]


def _replace(raw: dt.Raw, i: int, frame: bytes | None) -> dt.Raw:
    out = copy.copy(raw)
    out.frames = list(raw.frames)
    if frame is None:
        # Every transmission of that packet goes: it never reached the wire.
        gone = raw.frames[i]
        out.frames = [fr for fr in raw.frames
                      if (fr.src_port, fr.dest_qp, fr.psn, fr.opcode)
                      != (gone.src_port, gone.dest_qp, gone.psn, gone.opcode)]
    else:
        out.frames[i] = dw.parse_frame(frame, raw.frames[i].ts)
    return out


def _mutations(raw: dt.Raw):
    """(what, the mutated copy of ``raw``) for each real difference made by hand."""
    frames = raw.frames
    multi = _frames_to(raw, lambda fr: fr.opcode in ("SEND_MIDDLE", "RDMA_WRITE_MIDDLE",
                                                      "SEND_FIRST", "RDMA_WRITE_FIRST")
                       and fr.payload)
    assert multi, "the mutation workload has no multi-packet message"
    i = multi[len(multi) // 2]
    start, end = dw.payload_span(frames[i].raw)
    b = bytearray(frames[i].raw)
    b[start + (end - start) // 3] ^= 0x01
    yield "a flipped payload byte (ICRC made right)", _replace(raw, i, dw.with_icrc(bytes(b)))

    imm = _frames_to(raw, lambda fr: fr.imm is not None)
    assert imm, "the mutation workload has no ImmDt"
    at = dw.header_offset(frames[imm[0]].raw, dw.Op.IMMDT)
    b = bytearray(frames[imm[0]].raw)
    b[at + 3] ^= 0x80
    yield "a wrong ImmDt", _replace(raw, imm[0], dw.with_icrc(bytes(b)))

    swap = {"SEND_FIRST": "SEND_MIDDLE", "SEND_MIDDLE": "SEND_FIRST",
            "RDMA_WRITE_MIDDLE": "RDMA_WRITE_LAST", "RDMA_WRITE_LAST": "RDMA_WRITE_MIDDLE",
            "SEND_ONLY": "SEND_LAST", "SEND_LAST": "SEND_ONLY"}
    j = _frames_to(raw, lambda fr: fr.opcode in swap)[0]
    yield ("a different opcode", _replace(raw, j, dw.set_opcode(frames[j].raw,
                                                               swap[frames[j].opcode])))

    yield "a missing request packet", _replace(raw, multi[0], None)

    resp = _frames_to(raw, lambda fr: fr.opcode.startswith("RDMA_READ_RESPONSE"))
    assert resp, "the mutation workload has no READ"
    yield "a missing READ response", _replace(raw, resp[-1], None)

    acks = _frames_to(raw, lambda fr: fr.opcode == "ACKNOWLEDGE")
    last = acks[-1]
    yield "no last ACK", _replace(raw, last, None)

    at = dw.header_offset(frames[last].raw, dw.Op.AETH)
    b = bytearray(frames[last].raw)
    b[at] = 0x20 | 14       # an RNR NAK where an ACK was
    yield "an RNR NAK for an ACK", _replace(raw, last, dw.with_icrc(bytes(b)))

    # Completions: one field of one WC, and one WC missing.
    name = next(n for n, wcs in raw.completions.items() if len(wcs) > 2)
    for what, change in (("status", {"status": sh.IBV_WC_REM_ACCESS_ERR}),
                         ("byte_len", {"byte_len": 1}), ("imm_data", {"imm_data": 0x1234}),
                         ("wc_flags", {"wc_flags": sh.IBV_WC_WITH_IMM}),
                         ("opcode", {"opcode": sh.IBV_WC_RDMA_READ})):
        out = copy.copy(raw)
        out.completions = dict(raw.completions)
        wcs = list(raw.completions[name])
        wcs[1] = dataclasses.replace(wcs[1], **change)
        out.completions[name] = wcs
        if wcs[1] != raw.completions[name][1]:
            yield f"a completion's {what}", out
    out = copy.copy(raw)
    out.completions = {**raw.completions, name: raw.completions[name][:-1]}
    yield "a missing completion", out

    # Memory: one byte of one MR.
    mr = max(raw.memory, key=lambda n: len(raw.memory[n]))
    out = copy.copy(raw)
    data = bytearray(raw.memory[mr])
    data[len(data) // 2] ^= 0x10
    out.memory = {**raw.memory, mr: bytes(data)}
    yield "a flipped memory byte", out


async def test_the_comparison_catches_a_real_difference(tmp_path):
    pair = dt.PAIRS[1]
    wl = _mutation_workload()
    (raw,) = await dt.run_config(pair.a, [wl], str(tmp_path / "a"))
    base = dt.observe(raw)
    assert not base.problems, base.problems
    assert base.packets >= 18        # 11 requests, 6 responses, the last ACK
    assert dt.compare(base, dt.observe(raw)) == [], "a run differs from itself"
    caught, missed = [], []
    for what, mutated in _mutations(raw):
        diffs = dt.compare(base, dt.observe(mutated))
        (caught if diffs else missed).append(what)
    assert not missed, f"the comparison did not see: {missed}"
    assert len(caught) >= 12, caught


def test_a_garbled_frame_is_refused():
    """A frame whose ICRC does not match its bytes (a payload byte changed and the ICRC
    not recomputed) is an error of the capture, never compared as if it were good."""
    from softhca.protocol.packets import Packet
    from softhca.protocol.roce import Endpoint, roce_frame

    frame = roce_frame(Packet(0x11, 5, "SEND_ONLY", b"payload!"), Endpoint("127.0.0.1", 1),
                       Endpoint("127.0.0.1", 2))
    assert dw.parse_frame(frame).payload == b"payload!"
    bad = bytearray(frame)
    bad[-6] ^= 1
    with pytest.raises(dw.FrameError, match="ICRC"):
        dw.parse_frame(bytes(bad))
    # The byte before the last of the payload ("d") is the one changed.
    assert dw.parse_frame(dw.with_icrc(bytes(bad))).payload == b"payloae!"
