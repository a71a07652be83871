"""Wire capture (softhca capture): RC packets as RoCEv2 frames in a pcap that tshark decodes.

The encoder is checked by hand against the IBTA layouts (BTH, RETH, AETH, AtomicETH),
the IPv4 checksum against RFC 791's arithmetic, and the ICRC against a RoCEv2 packet
captured from a ConnectX-4 Lx NIC and against an independent re-computation. Then
traffic of known opcodes between two embedded daemons is captured four ways (the
`softhca capture` CLI as a process, the Capture coroutine, a CaptureTap in each
daemon) and each pcap is decoded by tshark (Debian's ``tshark`` package, installed by
the session fixture when missing and running as root, else the test is skipped): the
opcodes, destination QPs and PSNs it prints are the traffic sent, and it finds no
malformed packet. `softhca serve --capture` is run as a process too.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import struct
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_serve import start as start_serve

import softhca.client as sh
from softhca.protocol import roce as cap
from softhca.protocol.packets import OPCODES, Packet, decode_packet, packet_header
from softhca.protocol.roce import (
    Endpoint,
    bth,
    extension_headers,
    ipv4_checksum,
    packet_record,
    roce_frame,
)
from softhca.protocol.roce import roce_icrc as icrc
from softhca.server.capture import CaptureTap, PcapWriter, read_pcap
from softhca.tools import capture as tool_capture

from e2e import Pair, make_side, rdma, sge, whole

TIMEOUT = 10.0

# -- the encoder, by hand ---------------------------------------------------------------------


def test_opcode_numbers_are_the_ibta_rc_table():
    assert set(cap.OPCODE_NUMBERS) == set(OPCODES)
    # IBTA 9.2, table 38 (RC): 00000 SEND First ... 10111 SEND Only with Invalidate.
    ibta = ["SEND_FIRST", "SEND_MIDDLE", "SEND_LAST", "SEND_LAST_WITH_IMM", "SEND_ONLY",
            "SEND_ONLY_WITH_IMM", "RDMA_WRITE_FIRST", "RDMA_WRITE_MIDDLE", "RDMA_WRITE_LAST",
            "RDMA_WRITE_LAST_WITH_IMM", "RDMA_WRITE_ONLY", "RDMA_WRITE_ONLY_WITH_IMM",
            "RDMA_READ_REQUEST", "RDMA_READ_RESPONSE_FIRST", "RDMA_READ_RESPONSE_MIDDLE",
            "RDMA_READ_RESPONSE_LAST", "RDMA_READ_RESPONSE_ONLY", "ACKNOWLEDGE",
            "ATOMIC_ACKNOWLEDGE", "COMPARE_SWAP", "FETCH_ADD", None, "SEND_LAST_WITH_INV",
            "SEND_ONLY_WITH_INV"]
    for number, name in enumerate(ibta):
        if name is not None:
            assert cap.OPCODE_NUMBERS[name] == number, name


def test_bth_bytes_by_hand():
    # RDMA WRITE Last (0x08), 5 bytes of payload: pad count 3, AckReq set.
    p = Packet(0x123456, 0xABCDEF, "RDMA_WRITE_LAST", b"12345")
    assert bth(p, 3) == bytes([
        0x08,                       # OpCode
        0b0_1_11_0000,              # SE 0, MigReq 1, PadCnt 3, TVer 0
        0xFF, 0xFF,                 # P_Key
        0x00, 0x12, 0x34, 0x56,     # resv8a, DestQP
        0x80, 0xAB, 0xCD, 0xEF])    # AckReq 1, resv7, PSN
    # A middle packet asks for no ACK; a READ request does.
    assert bth(Packet(1, 2, "SEND_MIDDLE", b"x" * 8))[8] == 0x00
    assert bth(Packet(1, 2, "RDMA_READ_REQUEST", reth=(1, 2, 3)))[8] == 0x80
    assert bth(Packet(1, 2, "ACKNOWLEDGE", aeth=("ACK", 0)))[:2] == bytes([0x11, 0x40])


def test_extension_headers_by_hand():
    # RETH: VA (64), R_Key (32), DMA Length (32); ImmDt after it.
    p = Packet(1, 0, "RDMA_WRITE_ONLY_WITH_IMM", b"", reth=(0xAABBCCDD, 0x1122334455667788,
                                                            0x1000), imm=0xCAFEF00D)
    assert extension_headers(p) == bytes.fromhex("1122334455667788" "aabbccdd" "00001000"
                                                 "cafef00d")
    # AETH: syndrome (ACK 000 + credit 0x1F "invalid"; NAK 011 + code), MSN (24).
    for syndrome, byte in (("ACK", 0x1F), ("RNR", 0x20 | 12), ("NAK_PSN_SEQ", 0x60),
                           ("NAK_INV_REQ", 0x61), ("NAK_REM_ACCESS", 0x62),
                           ("NAK_REM_OP", 0x63)):
        p = Packet(1, 0, "ACKNOWLEDGE", aeth=(syndrome, 0x010203))
        assert extension_headers(p) == bytes([byte, 1, 2, 3]), syndrome
    # AtomicETH: VA, R_Key, Swap (Add) Data, Compare Data = 28 bytes.
    p = Packet(1, 0, "COMPARE_SWAP", atomic=(0x01020304, 0x1000, 0x2222, 0x1111))
    h = extension_headers(p)
    assert len(h) == 28
    assert struct.unpack(">QIQQ", h) == (0x1000, 0x01020304, 0x2222, 0x1111)
    # AETH then AtomicAckETH (the original remote value).
    p = Packet(1, 0, "ATOMIC_ACKNOWLEDGE", aeth=("ACK", 7), atomic_ack=0x1111)
    assert extension_headers(p) == bytes([0x1F, 0, 0, 7]) + (0x1111).to_bytes(8, "big")
    # IETH: the R_Key to invalidate.
    assert extension_headers(Packet(1, 0, "SEND_ONLY_WITH_INV", b"", ieth=0x99)) \
        == bytes.fromhex("00000099")


def test_ipv4_checksum():
    # The classic worked example: 192.168.0.1 -> 192.168.0.199, checksum 0xb861.
    header = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")
    assert ipv4_checksum(header) == 0xB861
    built = cap.ipv4_header("10.0.0.1", "10.0.0.2", 100, ident=7)
    assert ipv4_checksum(built) == 0      # a valid header sums to all ones
    assert built[0] == 0x45 and built[9] == 17 and struct.unpack(">H", built[2:4])[0] == 120


# A RoCEv2 CNP captured from a ConnectX-4 Lx NIC (Ethernet frame, ICRC last): the ICRC
# the hardware computed, with TOS 0xc2 and the BECN bit set, both masked by the ICRC.
CX4_CNP = bytes.fromhex(
    "e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2"
    "003c 718c 4000 4011 9161 0a00 1101 0a00"
    "1201 0000 12b7 0028 0000 8100 ffff 4000"
    "0118 0000 0000 0000 0000 0000 0000 0000"
    "0000 0000 0000 82fd 002a")


def test_icrc_of_a_hardware_capture():
    assert icrc(CX4_CNP[14:-4]) == CX4_CNP[-4:]
    assert ipv4_checksum(CX4_CNP[14:34]) == 0


def independent_icrc(frame: bytes) -> bytes:
    """IBTA Annex A17.3.3 written again: masked pseudo header, CRC32, LSB first."""
    ip = frame[14:]
    masked = (b"\xff" * 8 + ip[:1] + b"\xff" + ip[2:8] + b"\xff" + ip[9:10] + b"\xff\xff"
              + ip[12:20] + ip[20:26] + b"\xff\xff" + ip[28:32] + b"\xff" + ip[33:-4])
    return zlib.crc32(masked).to_bytes(4, "little")


@pytest.mark.parametrize("p", [
    Packet(0x11, 0, "SEND_ONLY", b"hello, wire"),
    Packet(0x12, 0xFFFFFF, "RDMA_WRITE_FIRST", bytes(range(256)) * 4, reth=(5, 0x1000, 3000)),
    Packet(0x13, 3, "ACKNOWLEDGE", aeth=("NAK_REM_ACCESS", 9)),
    Packet(0x14, 4, "ATOMIC_ACKNOWLEDGE", aeth=("ACK", 1), atomic_ack=0xDEADBEEF),
    Packet(0x15, 5, "SEND_LAST_WITH_IMM", b"abc", imm=1),
])
def test_frame_layout_and_icrc(p):
    src, dst = Endpoint("10.1.2.3", 4791), Endpoint("10.1.2.4", 5000)
    frame = roce_frame(p, src, dst, ident=3)
    assert frame[:6] == bytes.fromhex("020102041388") and frame[6:12] == src.mac
    assert frame[12:14] == b"\x08\x00"
    ip = frame[14:34]
    assert ipv4_checksum(ip) == 0
    assert ip[12:16] == ipaddress.IPv4Address("10.1.2.3").packed
    assert struct.unpack(">H", ip[2:4])[0] == len(frame) - 14
    sport, dport, length, check = struct.unpack(">HHHH", frame[34:42])
    assert dport == 4791 and length == len(frame) - 34 and check == 0
    assert sport == 0xC000 | (p.dest_qp & 0x3FFF)
    pad = -len(p.payload) % 4
    assert (frame[43] >> 4) & 3 == pad
    assert (len(frame) - 42) % 4 == 0
    assert frame[-4 - pad - len(p.payload):-4 - pad] == p.payload
    assert frame[-4:] == independent_icrc(frame)


def test_packet_record_directions_and_event_input():
    p = Packet(0x22, 9, "SEND_ONLY", b"data")
    tx = packet_record("tx", ("mlx5_0", p), local="10.0.0.1:4791", peer="10.0.0.2:4792")
    rx = packet_record("rx", ("mlx5_0", p), local="10.0.0.1:4791", peer="10.0.0.2:4792")
    assert tx[26:30] == bytes([10, 0, 0, 1]) and tx[30:34] == bytes([10, 0, 0, 2])
    assert rx[26:30] == bytes([10, 0, 0, 2]) and rx[30:34] == bytes([10, 0, 0, 1])
    assert tx[6:12] == Endpoint("10.0.0.1", 4791).mac == rx[:6]
    # A "packet" event as the client receives it: the daemon named, the peer not.
    ev = sh.Event("packet", {"t": "event", "kind": "packet", "dir": "rx", "dev": "mlx5_0",
                             "daemon": "10.9.8.7:4791", "time": 1.0,
                             "pkt": packet_header("mlx5_0", p)}, p.payload)
    frame = packet_record("rx", ev)
    assert frame[30:34] == bytes([10, 9, 8, 7])             # rx: to the capturing daemon
    assert frame[26:29] == bytes([127, 0, 0])               # from a stand-in peer
    assert frame[42:-4] == tx[42:-4]                        # same BTH, payload
    # A wildcard or unknown address is never the one shown.
    assert packet_record("tx", p, local="0.0.0.0:1")[26:30] == bytes([127, 0, 0, 1])
    with pytest.raises(ValueError):
        packet_record("up", p)


def test_pcap_writer_format(tmp_path):
    path = tmp_path / "x.pcap"
    with PcapWriter(path) as w:
        w.write(1700000000.25, b"\x01" * 60)
        w.write(1700000001.9999996, b"\x02" * 70)
    data = path.read_bytes()
    assert struct.unpack("<IHHiIII", data[:24]) == (0xA1B2C3D4, 2, 4, 0, 0, 262144, 1)
    assert struct.unpack("<IIII", data[24:40]) == (1700000000, 250000, 60, 60)
    assert struct.unpack("<IIII", data[100:116]) == (1700000002, 0, 70, 70)
    assert [f for _, f in read_pcap(path)] == [b"\x01" * 60, b"\x02" * 70]


def test_pcap_records_refuse_another_file_and_a_record_cut_short(tmp_path):
    """The pure reader (protocol) names what is wrong; the file reader (server) adds the
    file's name."""
    whole = cap.pcap_file_header(100) + cap.pcap_record(1.5, b"\x03" * 120, 100)
    assert cap.pcap_records(whole) == [(1.5, b"\x03" * 100)]       # cut at the snaplen
    with pytest.raises(ValueError, match="shorter than its 24-byte header"):
        cap.pcap_records(whole[:20])
    with pytest.raises(ValueError, match="record header cut short at byte 24"):
        cap.pcap_records(whole[:30])
    with pytest.raises(ValueError, match="record at byte 24 is cut short"):
        cap.pcap_records(whole[:-1])
    with pytest.raises(ValueError, match="not a microsecond Ethernet pcap"):
        cap.pcap_records(struct.pack("<I", 0xA1B23C4D) + whole[4:])     # nanoseconds
    path = tmp_path / "short.pcap"
    path.write_bytes(whole[:-1])
    with pytest.raises(ValueError, match=f"^{path}: the record at byte 24"):
        read_pcap(path)


# -- tshark: the session fixture in tests/conftest.py, shared with tests/e2e ----------------

FIELDS = ("eth.src", "ip.src", "ip.dst", "udp.dstport", "infiniband.bth.opcode",
          "infiniband.bth.destqp", "infiniband.bth.psn", "infiniband.aeth.syndrome",
          "ip.checksum.status")


@dataclass(frozen=True)
class Row:
    mac: str
    src: str
    dst: str
    opcode: int
    qp: int
    psn: int
    syndrome: int | None


def tshark_rows(tshark: str, path: Path) -> list[Row]:
    """tshark's decode of ``path``: the RoCEv2 fields of each frame (no decode-as given:
    UDP port 4791 is InfiniBand by default)."""
    out = subprocess.run([tshark, "-n", "-r", str(path), "-o", "ip.check_checksum:TRUE",
                          "-T", "fields", *[a for f in FIELDS for a in ("-e", f)]],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = []
    for line in out.splitlines():
        mac, src, dst, dport, op, qp, psn, syn, ipcheck = line.split("\t")
        assert dport == "4791" and ipcheck == "1", line     # 1: IPv4 checksum good
        rows.append(Row(mac, src, dst, int(op), int(qp, 16), int(psn),
                        int(syn, 0) if syn else None))
    return rows


def assert_not_malformed(tshark: str, path: Path) -> None:
    bad = subprocess.run([tshark, "-n", "-r", str(path), "-Y", "_ws.malformed"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert bad.strip() == "", f"tshark finds malformed packets in {path.name}:\n{bad}"
    expert = subprocess.run([tshark, "-n", "-r", str(path), "-q", "-z", "expert,warn"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert "Errors" not in expert and "Warns" not in expert, expert


def mac(ep: Endpoint) -> str:
    return ":".join(f"{b:02x}" for b in ep.mac)


# -- traffic of known opcodes --------------------------------------------------------------------

@dataclass(frozen=True)
class Seen:
    """One packet as the daemon reported it (its "packets" event)."""

    dir: str
    opcode: str
    qp: int
    psn: int
    syndrome: str | None


async def collect(sub) -> list[Seen]:
    seen = []
    while (ev := await sub.next(0.3)) is not None:
        _, p = decode_packet(ev.header["pkt"], ev.data)
        seen.append(Seen(ev.header["dir"], p.opcode, p.dest_qp, p.psn,
                         p.aeth[0] if p.aeth else None))
    return seen


# The initiator's requests, in order: (opcode, PSNs it takes). MTU 1024.
REQUESTS = [
    ("SEND_FIRST", 1), ("SEND_MIDDLE", 1), ("SEND_LAST", 1),          # SEND 2500 bytes
    ("SEND_ONLY_WITH_IMM", 1),                                          # SEND_WITH_IMM 101
    ("RDMA_WRITE_FIRST", 1), ("RDMA_WRITE_MIDDLE", 1), ("RDMA_WRITE_LAST", 1),   # 3000
    ("RDMA_WRITE_FIRST", 1), ("RDMA_WRITE_LAST_WITH_IMM", 1),          # WRITE_WITH_IMM 1030
    ("RDMA_READ_REQUEST", 3),                                           # READ 2100
    ("COMPARE_SWAP", 1),
    ("RDMA_WRITE_ONLY", 1),                                             # to an unknown rkey
]


def expected_requests(start_psn: int = 0) -> list[tuple[str, int]]:
    out, psn = [], start_psn
    for op, n in REQUESTS:
        out.append((op, psn))
        psn = (psn + n) % (1 << 24)
    return out


async def traffic(pair: Pair) -> None:
    """The WRs behind REQUESTS, one at a time, each completion awaited."""
    t, i = pair.target, pair.initiator
    tgt = await t.reg_mr(8192)
    src = await i.reg_mr(b"softhca capture. " * 256)
    dst = await i.reg_mr(8192)

    async def send(length: int, **kw) -> None:
        await t.qp.post_recv(sh.RecvWR(wr_id=1, sg=[sge(tgt, 4096)]))
        await i.qp.post_send(sh.SendWR(wr_id=2, sg=[sge(src, length)], **kw))
        assert (await i.send_wc())[0].status == sh.IBV_WC_SUCCESS
        assert (await t.recv_wc())[0].byte_len == length

    await send(2500)
    await send(101, opcode=sh.IBV_WR_SEND_WITH_IMM, imm_data=0x1234ABCD)
    assert (await pair.write([sge(src, 3000)], tgt.rkey, tgt.addr)).status == sh.IBV_WC_SUCCESS
    await t.qp.post_recv(sh.RecvWR(wr_id=3, sg=[]))
    await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE_WITH_IMM, [sge(src, 1030)], tgt.rkey,
                              tgt.addr, 4, imm_data=0x55))
    assert (await i.send_wc())[0].status == sh.IBV_WC_SUCCESS
    assert (await t.recv_wc())[0].imm_data == 0x55
    assert (await pair.read([sge(dst, 2100)], tgt.rkey, tgt.addr)).status == sh.IBV_WC_SUCCESS
    assert await dst.read(2100) == (b"softhca capture. " * 256)[:2100]
    await tgt.write((0x1111).to_bytes(8, "little"), 4096)
    wr = sh.SendWR(wr_id=5, opcode=sh.IBV_WR_ATOMIC_CMP_AND_SWP, sg=[sge(dst, 8)])
    wr.set_wr_atomic(tgt.rkey, tgt.addr + 4096, 0x1111, 0x2222)
    await i.qp.post_send(wr)
    assert (await i.send_wc())[0].status == sh.IBV_WC_SUCCESS
    wc = await pair.write([sge(src, 16)], tgt.rkey ^ 0x5A5A00, tgt.addr)
    assert wc.status == sh.IBV_WC_REM_ACCESS_ERR


OP = cap.OPCODE_NUMBERS
SYN = cap.AETH_SYNDROMES


def check_responses(seen: list[Seen], initiator_qp: int) -> None:
    """The target's answers: an ACK for each SEND/WRITE message's last PSN, the READ
    response packets, the atomic ACK, and the NAK (remote access error) last."""
    assert all(s.qp == initiator_qp for s in seen)
    special = [(s.opcode, s.psn, s.syndrome) for s in seen if s.opcode != "ACKNOWLEDGE"]
    assert special == [("RDMA_READ_RESPONSE_FIRST", 9, "ACK"),
                       ("RDMA_READ_RESPONSE_MIDDLE", 10, None),
                       ("RDMA_READ_RESPONSE_LAST", 11, "ACK"),
                       ("ATOMIC_ACKNOWLEDGE", 12, "ACK")]
    acks = [(s.psn, s.syndrome) for s in seen if s.opcode == "ACKNOWLEDGE"]
    assert acks[-1] == (13, "NAK_REM_ACCESS")
    for last in (2, 3, 6, 8):
        assert (last, "ACK") in acks
    assert all(syn == "ACK" for _, syn in acks[:-1])


def rows_of(seen: list[Seen]) -> list[tuple[int, int, int, int | None]]:
    return [(OP[s.opcode], s.qp, s.psn, SYN[s.syndrome] if s.syndrome else None)
            for s in seen]


def decoded(rows: list[Row]) -> list[tuple[int, int, int, int | None]]:
    return [(r.opcode, r.qp, r.psn, r.syndrome) for r in rows]


async def start_cli_capture(address: str, out: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "softhca.tools.cli", "capture", "--target", address,
        "--out", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(proc.stderr.readline(), 30)
    assert b"capturing" in line, line + await proc.stderr.read()
    return proc


async def read_lines(stream, n: int, timeout: float) -> list[str]:
    lines = []
    deadline = time.monotonic() + timeout
    while len(lines) < n:
        line = await asyncio.wait_for(stream.readline(), max(deadline - time.monotonic(), 0.1))
        if not line:
            break
        lines.append(line.decode().rstrip())
    return lines


async def test_captured_traffic_decodes_in_tshark(tshark, tmp_path):
    async with sh.embedded() as tnode, sh.embedded() as inode:
        target = await make_side(tnode)
        await make_side(inode)          # a first QP, so that the two QP numbers differ
        initiator = await make_side(inode)
        assert target.qp.qp_num != initiator.qp.qp_num
        # The initiator starts at PSN 0 (given, not its random default), so that the
        # PSNs below are the table's.
        await target.qp.connect(initiator.qp.info(psn=0), path_mtu=sh.IBV_MTU_1024)
        await initiator.qp.connect(target.qp.info(), path_mtu=sh.IBV_MTU_1024, sq_psn=0)
        pair = Pair(target, initiator)

        files = {name: tmp_path / f"{name}.pcap"
                 for name in ("cli_initiator", "coro_target", "tap_initiator", "tap_target")}
        taps = [CaptureTap(inode.daemon, files["tap_initiator"]),
                CaptureTap(tnode.daemon, files["tap_target"])]
        truth = await inode.subscribe("packets")     # what the initiator's daemon saw
        cli = await start_cli_capture(inode.address, files["cli_initiator"])
        coro = tool_capture.Capture(tnode.address, files["coro_target"], quiet=True)
        coro_task = asyncio.ensure_future(coro.run())
        await asyncio.wait_for(coro.ready.wait(), TIMEOUT)

        await traffic(pair)
        await asyncio.sleep(0.3)            # the last ACKs, the events in flight
        seen = await collect(truth)
        for tap in taps:
            tap.close()
        assert taps[0].count == len(seen)

        # The CLI prints one line per packet; once it has them all, Ctrl-C.
        lines = await read_lines(cli.stdout, len(seen), TIMEOUT)
        cli.send_signal(signal.SIGINT)
        rest = (await asyncio.wait_for(cli.stdout.read(), TIMEOUT)).decode().splitlines()
        assert await asyncio.wait_for(cli.wait(), TIMEOUT) == 0
        assert rest[-1] == f"{len(seen)} packet(s) written to {files['cli_initiator']}"
        assert lines[0].split()[:6] == ["tx", "SEND_FIRST", "qp", f"{target.qp.qp_num:#08x}",
                                        "psn", "0x000000"]
        coro_task.cancel()
        await asyncio.gather(coro_task, return_exceptions=True)
        assert coro.count == taps[1].count == len(seen)

    requests = [s for s in seen if s.dir == "tx"]
    responses = [s for s in seen if s.dir == "rx"]
    tqp, iqp = target.qp.qp_num, initiator.qp.qp_num
    # The traffic sent, as the test posted it and as the daemons reported it.
    assert [(s.opcode, s.psn) for s in requests] == expected_requests()
    assert all(s.qp == tqp for s in requests)
    check_responses(responses, iqp)

    ip = "127.0.0.1"
    i_ep, t_ep = Endpoint(ip, inode.port), Endpoint(ip, tnode.port)
    for name, path in files.items():
        rows = tshark_rows(tshark, path)
        assert_not_malformed(tshark, path)
        assert len(rows) == len(seen), name
        # Who sent each frame: the initiator's MAC (or, for the target's subscription
        # capture, a stand-in peer) on requests, the target's on responses.
        if name.endswith("_initiator"):
            req = [r for r in rows if r.mac == mac(i_ep)]
            resp = [r for r in rows if r.mac != mac(i_ep)]
        else:
            resp = [r for r in rows if r.mac == mac(t_ep)]
            req = [r for r in rows if r.mac != mac(t_ep)]
        assert decoded(req) == rows_of(requests), name
        assert decoded(resp) == rows_of(responses), name
        if name.startswith("tap"):
            # The daemon knows its peers: the real addresses and MACs on both sides.
            assert {r.mac for r in req} == {mac(i_ep)} and {r.mac for r in resp} == {mac(t_ep)}
            assert {(r.src, r.dst) for r in rows} == {(ip, ip)}
        else:
            assert all(r.src != r.dst for r in rows), name     # a 127.0.0.x stand-in peer
    # The initiator's two captures interleave the directions alike.
    assert decoded(tshark_rows(tshark, files["cli_initiator"])) \
        == decoded(tshark_rows(tshark, files["tap_initiator"])) == rows_of(seen)


# -- softhca serve --capture ----------------------------------------------------------------------

def ib_fields(frame: bytes) -> tuple[int, int, int]:
    """(opcode, DestQP, PSN) read back from a frame's BTH."""
    op, _, _, qp, psn = struct.unpack(">BBHII", frame[42:54])
    return op, qp & 0xFFFFFF, psn & 0xFFFFFF


async def test_serve_capture_option_writes_the_daemons_traffic(tmp_path):
    pcap = tmp_path / "serve.pcap"
    peer = tmp_path / "peer_token"
    peer.write_bytes(b"capture-test-peer-token")
    peer.chmod(0o600)
    proc, address = start_serve(tmp_path, "--capture", str(pcap), "--peer-token-file", str(peer))
    try:
        cli_pcap = tmp_path / "cli.pcap"
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "softhca.tools.cli", "capture", "--target", address,
            "--out", str(cli_pcap), "--count", "2", "--quiet",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert b"capturing" in await asyncio.wait_for(cli.stderr.readline(), 30)
        async with await sh.connect(address) as snode, \
                sh.embedded(peer_token=b"capture-test-peer-token") as inode:
            target = await make_side(snode)
            initiator = await make_side(inode)
            await target.qp.connect(initiator.qp.info())
            await initiator.qp.connect(target.qp.info())
            mr = await target.reg_mr(64)
            src = await initiator.reg_mr(b"\x07" * 64)
            await initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), mr.rkey,
                                              mr.addr, 1))
            assert (await initiator.send_wc())[0].status == sh.IBV_WC_SUCCESS
            out, _ = await asyncio.wait_for(cli.communicate(), TIMEOUT)
            assert cli.returncode == 0 and out.decode().strip() == \
                f"2 packet(s) written to {cli_pcap}"
            frames = [f for _, f in read_pcap(pcap)]       # flushed per packet
            want = [(OP["RDMA_WRITE_ONLY"], target.qp.qp_num, initiator.qp.psn),
                    (OP["ACKNOWLEDGE"], initiator.qp.qp_num, initiator.qp.psn)]
            assert [ib_fields(f) for f in frames] == want
            assert [ib_fields(f) for _, f in read_pcap(cli_pcap)] == want
            # rx from the embedded initiator (its real address), tx back to it.
            serve_port = int(address.rsplit(":", 1)[1])
            assert frames[0][:6] == Endpoint("127.0.0.1", serve_port).mac
            assert frames[0][6:12] == Endpoint("127.0.0.1", inode.port).mac
            assert frames[1][6:12] == Endpoint("127.0.0.1", serve_port).mac
            for f in frames:
                assert f[-4:] == independent_icrc(f)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    log = proc.stderr.read()
    assert "event=capture" in log and "packets=2" in log
    assert len(read_pcap(pcap)) == 2


def test_serve_options_capture_default_and_unwritable(tmp_path):
    from softhca.server import serve
    from softhca.tools import cli

    args = cli.build_parser().parse_args(["serve"])
    assert serve.options_from_args(args).capture is None
    args = cli.build_parser().parse_args(["serve", "--capture", str(tmp_path / "no" / "x")])
    with pytest.raises(ValueError, match="--capture"):
        serve.options_from_args(args)


def test_capture_cli_usage():
    from softhca.tools import cli

    assert cli.main(["capture", "--target", "127.0.0.1:1"]) == 2       # --out missing
    assert cli.main(["capture", "--target", "127.0.0.1:1", "--out", "x", "--peer",
                     "host"]) == 2
