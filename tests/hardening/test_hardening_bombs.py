"""Cheap refusals: msgpack bombs cost a bounded amount of CPU before they are refused.

Each bomb is a frame whose header is within the frame size limit and announces or
holds far more structure than any request needs. The daemon unpacks headers under
protocol/frames.py's REQUEST_LIMITS; the CPU each bomb costs there is measured
(process time, best of several), and each is sent to a daemon too, which refuses it
with a clear error and keeps serving.
"""

from __future__ import annotations

import gc
import struct
import time

import msgpack
from test_hardening import raw, read_frames

import softhca.client as sh
from softhca.protocol.frames import REQUEST_LIMITS, FrameDecoder, FrameError

# A bomb is refused within BOUND_S of CPU, or, on a slower machine, within LEGIT_RATIO of
# what decoding the largest legitimate request (post_send, 256 WRs x 32 SGEs) costs in the
# same run: refusing must never cost more than serving real work does (no amplification).
# The absolute bound alone sat inside this machine's noise (4.8 to 6 ms for the
# 16384-container refusals, with the legitimate request at 5.8 to 6.3 ms).
BOUND_S = 0.005
LEGIT_RATIO = 1.25
REPEATS = 15


def frame(header: bytes) -> bytes:
    return struct.pack(">II", 4 + len(header), len(header)) + header


def big_array(n: int) -> bytes:
    return b"\x82\xa1t\xa1x\xa1a\xdd" + n.to_bytes(4, "big")


BOMBS = {
    # An 8-million-item array, within the frame size rule.
    "8M-item array": big_array(8_000_000) + b"\xc0" * 8_000_000,
    "1M-entry map": b"\x82\xa1t\xa1x\xa1a\xdf" + (1 << 20).to_bytes(4, "big")
                    + b"\xa1a\xc0" * (1 << 20),
    "100k levels of nesting": b"\x82\xa1t\xa1x\xa1a" + b"\x91" * 100_000 + b"\xc0",
    "15 MiB str": b"\x82\xa1t\xa1x\xa1a\xdb" + (15 << 20).to_bytes(4, "big")
                  + b"a" * (15 << 20),
    # Within the header size limit, the costliest shapes: empty containers (each
    # costs a Python object) and long runs of the cheapest values.
    "256 KiB of empty lists": msgpack.packb({"t": "x", "a": [[[] for _ in range(4096)]
                                                            for _ in range(63)]}),
    "256 KiB of empty maps": msgpack.packb({"t": "x", "a": [[{} for _ in range(4096)]
                                                           for _ in range(63)]}),
    "256 KiB of ints": msgpack.packb({"t": "x", "a": [[1] * 4096 for _ in range(63)]}),
    "256 KiB of 1-char strs": msgpack.packb({"t": "x", "a": [["a"] * 4096
                                                            for _ in range(31)]}),
    "a 9,000-entry array": msgpack.packb({"t": "x", "a": [0] * 9000}),
    "a 129-entry map": msgpack.packb({"t": "x", **{f"k{i}": 0 for i in range(128)}}),
    "an 8 KiB str": msgpack.packb({"t": "x", "a": "a" * 8192}),
    "a 16 KiB bin": msgpack.packb({"t": "x", "a": b"a" * 16384}, use_bin_type=True),
}
# The largest real request: a post_send of 256 WRs of 32 SGEs each.
LEGIT = msgpack.packb({"t": "post_send", "id": 1, "qp": 1, "wrs": [
    {"wr_id": (1 << 64) - 1, "opcode": 0, "send_flags": 2,
     "sg": [[(1 << 64) - 1, (1 << 31) - 1, (1 << 32) - 1]] * 32} for _ in range(256)]})


def cost(header: bytes) -> tuple[float, str]:
    """The CPU (s) the daemon's decoder spends on a frame of ``header``, and its verdict."""
    data = frame(header)
    best, verdict = float("inf"), ""
    # Without the cyclic GC while timing: a collection the 16384 new lists set off walks
    # every object of this process (the whole test session's, in `make test`), a cost of
    # the heap's size, not of the frame. Best of REPEATS: other noise only adds.
    gc.collect()
    gc.disable()
    try:
        for _ in range(REPEATS):
            dec = FrameDecoder(16 << 20, REQUEST_LIMITS)
            t0 = time.process_time()
            try:
                dec.feed(data)
                verdict = "accepted"
            except FrameError as e:
                verdict = f"{e.errno_name}: {e.message}"
            best = min(best, time.process_time() - t0)
    finally:
        gc.enable()
    return best, verdict


def test_msgpack_bombs_are_refused_within_bounded_cpu():
    rows = {name: cost(h) for name, h in BOMBS.items()}
    legit = cost(LEGIT)
    width = max(map(len, rows))
    print(f"\nmsgpack bombs, CPU before the verdict (best of {REPEATS}):")
    for name, (s, verdict) in rows.items():
        print(f"  {name:<{width}} {len(BOMBS[name]):>9} B  {s * 1e3:6.2f} ms  {verdict[:90]}")
    print(f"  {'post_send 256 WRs x 32 SGEs':<{width}} {len(LEGIT):>9} B  "
          f"{legit[0] * 1e3:6.2f} ms  {legit[1]}")
    worst = max(rows.items(), key=lambda kv: kv[1][0])
    bound = max(BOUND_S, LEGIT_RATIO * legit[0])
    print(f"  costliest: {worst[0]}, {worst[1][0] * 1e3:.2f} ms (bound {bound * 1e3:.2f} ms: "
          f"{BOUND_S * 1e3:g} ms or {LEGIT_RATIO:g} x the legitimate request)")
    assert legit[1] == "accepted", "the largest real request still fits"
    for name in ("8M-item array", "1M-entry map", "100k levels of nesting", "15 MiB str",
                 "256 KiB of empty lists", "256 KiB of empty maps", "a 9,000-entry array",
                 "a 129-entry map", "an 8 KiB str", "a 16 KiB bin"):
        assert rows[name][1] != "accepted", name
    assert worst[1][0] <= bound


async def test_a_daemon_refuses_each_bomb_and_keeps_serving():
    async with sh.embedded() as node:
        refused = {}
        for name, header in BOMBS.items():
            if name.startswith("256 KiB of ints") or name.startswith("256 KiB of 1-char"):
                continue        # within every limit: a malformed request, not a bomb
            reader, writer, dec = await raw(node.address)
            # An oversized header is refused from the frame's first 8 bytes and the
            # connection closed: the rest is not sent into the reset (which could lose
            # the refusal on its way back).
            writer.write(frame(header)[:300_000])
            frames = await read_frames(reader, dec)
            refused[name] = frames[0].header.get("errno") if frames else None
            writer.close()
        t0 = time.perf_counter()
        assert (await node.open_device()).name == "mlx5_0"
        print(f"\nbombs sent to a daemon: {refused}; a client answered "
              f"{(time.perf_counter() - t0) * 1e3:.1f} ms later")
        assert all(e in ("EPROTO", "EMSGSIZE") for e in refused.values()), refused




def test_an_oversized_header_is_refused_from_its_first_eight_bytes():
    """The H field of a frame announcing a header over the limit is refused as soon as
    it arrives, before any of the frame is buffered (fed in two pieces too)."""
    bomb = frame(BOMBS["8M-item array"])
    for cut in (8, 5):
        dec = FrameDecoder(16 << 20, REQUEST_LIMITS)
        try:
            dec.feed(bomb[:cut])
            dec.feed(bomb[cut:8])
            verdict = "accepted"
        except FrameError as e:
            verdict = f"{e.errno_name}: {e.message}"
        print(f"\nfirst 8 bytes of an 8 MB header (cut at {cut}): {verdict}; buffered "
              f"{dec.buffered} bytes")
        assert verdict.startswith("EMSGSIZE") and dec.buffered == 0
