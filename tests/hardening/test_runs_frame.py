"""The ``runs`` frame (protocol/runs.py) under attack: every bound it has is attacked,
each refusal names the entry and the field, a frame whose check fails is dropped and
counted as the packets it claimed, and nothing is allocated per claimed packet. Then
through a daemon: a peer's runs frame lands as its trains would, a malformed one closes
the link, and a daemon that does not announce runs frames (a daemon of the previous
version) is sent trains only."""

from __future__ import annotations

import asyncio
import tracemalloc

import pytest
from test_hardening import read_frames
from test_hardening_amplify import victim_qp

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, FrameError, frame_bytes
from softhca.protocol.handshake import make_hello
from softhca.protocol.packets import FRAME_RUN_MAX, IntegrityError, Run, packet_header
from softhca.protocol.runs import RUNS_FRAME_MAX, decode_runs, runs_check, runs_frame
from softhca.server import daemon as daemon_mod
from softhca.server import wire as wire_mod

from e2e import connect_pair, make_side, sge


def write(qp: int, psn: int, data: bytes, mtu: int = 4096, va: int = 0) -> Run:
    """A whole RDMA WRITE of ``data`` as one run."""
    n = max(1, -(-len(data) // mtu))
    return Run(qp, psn, n, "RDMA_WRITE", True, True, mtu, memoryview(data),
               reth=(0x1234, va, len(data)))


def mixed() -> list[tuple[Run, int]]:
    """Runs of every shape a sender makes: small WRITEs, a SEND cut in two runs (its
    second ending with ImmDt), READ responses."""
    return [(write(0x11, 7, b"a" * 4096), 0x21), (write(0x12, 100, b"b" * 100), 0x22),
            (Run(0x13, 5, 3, "SEND", True, False, 256, memoryview(b"c" * 768)), 0x23),
            (Run(0x13, 8, 1, "SEND", False, True, 256, memoryview(b"d" * 9), imm=77), 0x23),
            (Run(0x14, 9, 2, "RDMA_READ_RESPONSE", True, True, 1024,
                 memoryview(b"e" * 1500), aeth=("ACK", 3)), 0x24)]


def frame_of(runs: list[tuple[Run, int]], dev: str = "mlx5_0"):
    (fr,) = FrameDecoder().feed(b"".join(bytes(b) for b in runs_frame(dev, runs)))
    return fr


def test_a_runs_frame_decodes_to_the_runs_it_carries():
    runs = mixed()
    fr = frame_of(runs)
    assert fr.kind == "runs"
    dev, back = decode_runs(fr.header, fr.payload)
    assert dev == "mlx5_0"
    assert [sqp for _, sqp in back] == [sqp for _, sqp in runs]
    for (got, _), (want, _) in zip(back, runs, strict=True):
        assert got.packets() == want.packets()
        assert bytes(got.payload) == bytes(want.payload)


def _resigned(header: dict, old: dict) -> dict:
    """``header`` with its check made right again (unless the change was the check),
    so that only the change is refused, not the check."""
    if header["chk"] != old["chk"]:
        return header
    try:
        return {**header, "chk": runs_check(header["dev"], header["r"])}
    except Exception:       # not packable as a check: the change is refused before it
        return header


def _entry(k: int, i: int, v):
    def change(h: dict) -> dict:
        r = [list(e) for e in h["r"]]
        r[k][i] = v
        return {**h, "r": r}
    return change


# (change to the header, what the refusal says). Entry 1 is the 100-byte WRITE, entry 2
# the first SEND run (no RETH, FIRST only), entry 4 the READ responses.
HOSTILE = [
    (lambda h: {**h, "r": h["r"][:1]}, "field 'r'"),
    (lambda h: {**h, "r": h["r"] * (RUNS_FRAME_MAX // len(h["r"]) + 1)}, "field 'r'"),
    (lambda h: {**h, "r": "x"}, "field 'r'"),
    (lambda h: {**h, "dev": ""}, "field 'dev'"),
    (lambda h: {**h, "dev": 5}, "field 'dev'"),
    (lambda h: {**h, "chk": -1}, "field 'chk'"),
    (lambda h: {**h, "chk": True}, "field 'chk'"),
    (_entry(1, 0, 1 << 24), "entry 1: field 'sqp'"),
    (_entry(1, 0, True), "entry 1: field 'sqp'"),
    (_entry(1, 1, -1), "entry 1: field 'qp'"),
    (_entry(1, 2, False), "entry 1: field 'psn'"),
    (_entry(1, 3, 0), "entry 1: field 'n'"),
    (_entry(1, 3, FRAME_RUN_MAX + 1), "entry 1: field 'n'"),
    (_entry(1, 3, True), "entry 1: field 'n'"),
    (_entry(1, 4, "RDMA_READ_REQUEST"), "entry 1: kind must be"),
    (_entry(1, 4, 7), "entry 1: field 'kind'"),
    (_entry(1, 5, 4), "entry 1: field 'pos'"),
    (_entry(1, 6, 1000), "entry 1: mtu 1000 is not an IBTA path MTU"),
    (_entry(1, 6, 8192), "entry 1: field 'mtu'"),
    (_entry(1, 7, -1), "entry 1: field 'length'"),
    (_entry(1, 7, 1 << 30), "entry 1: length 1073741824 runs past"),
    (_entry(1, 7, 99), "carry"),                        # the lengths no longer add up
    (_entry(0, 7, 4095), "carry"),
    (_entry(2, 2, (1 << 24) - 2), "entry 2: PSNs"),      # 3 packets from there wrap
    (_entry(2, 3, 2), "entry 2: train: 768 payload bytes are not 2 packets"),
    (_entry(2, 8, [1, 2, 3]), "entry 2: SEND run at positions 1 must carry"),
    (_entry(1, 8, None), "entry 1: RDMA_WRITE run at positions 3 must carry ['reth']"),
    (_entry(1, 8, [1, 2]), "entry 1: field 'reth'"),
    (_entry(1, 8, [True, 2, 100]), "entry 1: reth[0]"),
    (_entry(1, 8, [1, 1 << 64, 100]), "entry 1: reth[1]"),
    (_entry(1, 11, 5), "entry 1: no RDMA_WRITE opcode ends a message with IETH"),
    (_entry(4, 9, ["NAK_REM_OP", 3]), "entry 4: a READ response's AETH must be an ACK"),
    (_entry(4, 9, ["WHAT", 3]), "entry 4: aeth[0]"),
    (_entry(4, 9, None), "entry 4: RDMA_READ_RESPONSE run at positions 3 must carry"),
    (lambda h: {**h, "r": [*h["r"][:-1], h["r"][-1][:11]]}, "entry 4: must be a list of 12"),
    (lambda h: {**h, "r": [*h["r"][:-1], {"qp": 1}]}, "entry 4: must be a list of 12"),
]


@pytest.mark.parametrize("change, why", HOSTILE)
def test_hostile_runs_frames_are_refused(change, why):
    fr = frame_of(mixed())
    header = _resigned(change(fr.header), fr.header)
    with pytest.raises(FrameError) as e:
        decode_runs(header, fr.payload)
    assert e.value.errno_name == "EPROTO" and why in str(e.value), str(e.value)
    assert not isinstance(e.value, IntegrityError)


def test_the_edges_of_what_is_taken():
    """ImmDt on a run that ends a WRITE is RDMA_WRITE_ONLY_WITH_IMMEDIATE; one packet
    at the last PSN does not wrap; a run of no payload is an empty message."""
    fr = frame_of(mixed())
    for change, check in (
            (_entry(1, 10, 5), lambda b: b[1][0].opcode(0) == "RDMA_WRITE_ONLY_WITH_IMM"),
            (_entry(1, 2, (1 << 24) - 1), lambda b: b[1][0].psn == (1 << 24) - 1)):
        _, back = decode_runs(_resigned(change(fr.header), fr.header), fr.payload)
        assert check(back)
    empty = [(write(0x11, 1, b""), 1), (write(0x11, 2, b"q"), 1)]
    fr = frame_of(empty)
    _, back = decode_runs(fr.header, fr.payload)
    assert [bytes(t.payload) for t, _ in back] == [b"", b"q"]


def test_a_payload_longer_than_the_runs_is_refused():
    fr = frame_of(mixed())
    with pytest.raises(FrameError, match="its runs carry 6473 payload bytes, the frame 6474"):
        decode_runs(fr.header, bytes(fr.payload) + b"x")


def test_a_check_that_does_not_match_drops_every_packet_it_claims():
    runs = mixed()
    fr = frame_of(runs)
    for change in (_entry(0, 2, 8), _entry(4, 9, ["ACK", 4]), lambda h: {**h, "dev": "mlx5_1"},
                   lambda h: {**h, "chk": h["chk"] ^ 1}):
        with pytest.raises(IntegrityError) as e:
            decode_runs(change(fr.header), fr.payload)
        assert e.value.packets == sum(t.n for t, _ in runs)


def test_claims_cost_nothing_per_packet():
    """RUNS_FRAME_MAX entries each claiming FRAME_RUN_MAX packets over a payload of a few
    bytes: refused at the first entry's length, nothing allocated for the claims; a
    frame that claims them within its payload's length allocates per entry, not per
    packet (one Run each, the payloads views)."""
    fr = frame_of(mixed())
    entry = [1, 2, 3, FRAME_RUN_MAX, "RDMA_WRITE", 2, 4096, FRAME_RUN_MAX * 4096,
             None, None, None, None]
    header = {"t": "runs", "dev": "mlx5_0", "r": [entry] * RUNS_FRAME_MAX, "chk": 0}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        with pytest.raises(FrameError, match="entry 0: length"):
            decode_runs(header, fr.payload[:10])
        assert tracemalloc.get_traced_memory()[0] - before < 4096
        many = [(write(0x11, 3 * k, b"z" * 2048, mtu=256), 1) for k in range(RUNS_FRAME_MAX)]
        fr2 = frame_of(many)
        before = tracemalloc.get_traced_memory()[0]
        _, back = decode_runs(fr2.header, fr2.payload)
        used = tracemalloc.get_traced_memory()[0] - before
        assert sum(t.n for t, _ in back) == 8 * RUNS_FRAME_MAX
        assert used < RUNS_FRAME_MAX * 1024, used      # well under the 256 KiB they carry
    finally:
        tracemalloc.stop()


# -- through a daemon -----------------------------------------------------------------------

async def _wire_peer(address: str, src: str):
    """A raw wire link into the embedded daemon at ``address`` (the process's peer
    token), naming ``src``; its welcome too."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder(1 << 20)
    (challenge,) = await read_frames(reader, dec)
    writer.write(frame_bytes(make_hello(challenge.header, "wire",
                                        daemon_mod.PROCESS_PEER_TOKEN, src)))
    (welcome,) = await read_frames(reader, dec)
    return reader, writer, welcome.header


async def _until(node: sh.Node, name: str, want: int) -> int:
    for _ in range(200):
        got = (await node.counters()).get(name, 0)
        if got >= want:
            return got
        await asyncio.sleep(0.02)
    return got


async def test_a_peers_runs_frame_lands_and_a_bad_one_closes_the_link():
    async with sh.embedded() as node:
        peer_port, peer_qpn = 47911, 0x4242
        qp, mr = await victim_qp(node, peer_port, peer_qpn, 100, 1 << 16)
        reader, writer, welcome = await _wire_peer(node.daemon.address,
                                                   f"127.0.0.1:{peer_port}")
        assert welcome["role"] == "wire" and welcome["runs"] == 1
        runs = [(Run(qp.qp_num, 100 + k, 1, "RDMA_WRITE", True, True, 4096,
                     memoryview(bytes([k + 1]) * 1000), reth=(mr.rkey, mr.addr + 1000 * k,
                                                              1000)), peer_qpn)
                for k in range(8)]
        writer.writelines(runs_frame("mlx5_0", runs))
        assert await _until(node, "packets_received", 8) == 8
        assert await mr.read(8000) == b"".join(bytes([k + 1]) * 1000 for k in range(8))
        # A frame whose check is wrong: its 8 packets dropped and counted, the link up.
        (fr,) = FrameDecoder().feed(b"".join(bytes(b) for b in runs_frame("mlx5_0", runs)))
        writer.write(frame_bytes({**fr.header, "chk": fr.header["chk"] ^ 1}, fr.payload))
        assert await _until(node, "packets_bad_icrc", 8) == 8
        # Old frames still come on the same link (a peer of the previous version).
        ack = packet_header("mlx5_0", sh_packet(qp.qp_num))
        ack["sqp"] = peer_qpn
        writer.write(frame_bytes(ack))
        assert await _until(node, "packets_received", 9) == 9
        # A malformed one: the peer is told why and the link closes.
        bad = {**fr.header, "r": fr.header["r"][:1]}
        writer.write(frame_bytes(bad, bytes(fr.payload)[:1000]))
        assert await _until(node, "wire_protocol_errors", 1) == 1
        rest = await asyncio.wait_for(reader.read(), 10)
        assert b"field 'r'" in rest
        writer.close()


def sh_packet(qpn: int):
    from softhca.protocol.packets import Packet
    return Packet(qpn, 0, "ACKNOWLEDGE", b"", aeth=("ACK", 0))


async def _stream_of_writes(monkeypatch, announce: bool) -> tuple[list[str], bytes, list]:
    """Eight 4 KiB RDMA WRITEs posted as one list between two embedded daemons; the
    kinds of frame the target read, its memory and the completions. Without
    ``announce`` the target's welcome lacks "runs", as a daemon of the previous
    version's does."""
    if not announce:
        real = daemon_mod.frame

        def old_welcome(kind, **fields):
            fields.pop("runs", None)
            return real(kind, **fields)
        monkeypatch.setattr(daemon_mod, "frame", old_welcome)
    kinds: list[str] = []
    real_take = wire_mod.WirePlane.take_frames

    def spy(self, frames, origin):
        kinds.extend(fr.kind for fr in frames)
        return real_take(self, frames, origin)
    monkeypatch.setattr(wire_mod.WirePlane, "take_frames", spy)
    async with sh.embedded() as tnode, sh.embedded() as inode:
        t, i = await make_side(tnode), await make_side(inode)
        await connect_pair(t, i, mtu=sh.IBV_MTU_4096)
        data = bytes(range(256)) * 128
        src, dst = await i.reg_mr(data), await t.reg_mr(len(data))
        wrs = []
        for k in range(8):
            wr = sh.SendWR(wr_id=k, opcode=sh.IBV_WR_RDMA_WRITE, sg=[sge(src, 4096, 4096 * k)],
                           send_flags=sh.IBV_SEND_SIGNALED)
            wr.set_wr_rdma(dst.rkey, dst.addr + 4096 * k)
            wrs.append(wr)
        await i.qp.post_send(wrs)
        wcs = await i.send_wc(8)
        return kinds, await dst.read(), [(w.wr_id, w.status) for w in wcs]


async def test_a_daemon_that_announces_no_runs_frames_is_sent_trains(monkeypatch):
    kinds, mem, wcs = await _stream_of_writes(monkeypatch, announce=True)
    assert "runs" in kinds
    old_kinds, old_mem, old_wcs = await _stream_of_writes(monkeypatch, announce=False)
    assert "runs" not in old_kinds and old_kinds.count("train") == 8
    assert mem == old_mem == bytes(range(256)) * 128
    assert wcs == old_wcs == [(k, sh.IBV_WC_SUCCESS) for k in range(8)]
