"""Observing the traffic does not change it: a ``softhca run --trace --capture`` daemon
(the target, its MKEY a T10-DIF wire domain on 1 MiB) takes RDMA_WRITEs of data+PI
and answers RDMA_READs of them from another daemon, with the ACK timeout a C program's
rdma_cm QP has (14: 67 ms), and neither side retransmits a packet: the capture is
written by a thread of its own from a bounded queue, the trace rendered on another,
so neither holds the loop that sends the ACKs (docs/native.md, "What --trace and
--capture cost"). The trace lists each transfer once; the capture holds every packet
the daemon's counters say it sent and took.

The target's objects are made through a control session on the run's TCP port
(``--token-file``), the program itself being ``sleep``: what is observed is the
daemon's work, as for a C program's."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time

import native
import pytest

import softhca.client as sh
from softhca.server.capture import read_pcap
from softhca.server.serve import read_secret
from softhca.tools import oracle

from e2e import SIG_FLAGS, make_side, rdma, whole

BLOCKS = 2048                   # of 512 bytes: 1 MiB of data, 1,064,960 bytes on the wire
ROUNDS = 4
# The QPs' local ACK timeout, a C program's rdma_cm QP's: 4.096 us * 2^14, 67 ms.
TIMEOUT = 14
DIF = sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
                            dif=sh.Mlx5SigT10Dif(bg=0xFFFF, app_tag=0x5A5A, ref_tag=0x1000,
                                                 flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
                            block_size=sh.MLX5DV_BLOCK_SIZE_512)


def _image(data: bytes) -> bytes:
    """data + T10-DIF per 512-byte block, computed here (crcmod's CRC16 T10-DIF)."""
    return oracle.protect_blocks(data, 512, lambda blk, b: oracle.t10dif_pi(
        blk, bg=0xFFFF, app=0x5A5A, ref=0x1000 + b))


@pytest.fixture
def files(tmp_path):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    f = {name: tmp_path / name for name in ("token", "peer-token", "trace.txt", "wire.pcap",
                                            "stats.json")}
    for name in ("token", "peer-token"):
        f[name].write_text(os.urandom(32).hex() + "\n")
        f[name].chmod(0o600)
    return f


async def _transfers(files, observe: bool) -> tuple[float, dict, dict]:
    """ROUNDS of a 1 MiB WRITE into the run's MKEY and a READ back; the MB/s of both
    ways, the run daemon's stats and the initiator daemon's."""
    port = native.free_port()
    extra = ["--trace", str(files["trace.txt"]), "--capture", str(files["wire.pcap"])] \
        if observe else []
    argv = [sys.executable, "-m", "softhca.tools.cli", "run", "--listen", f"127.0.0.1:{port}",
            "--token-file", str(files["token"]), "--peer-token-file", str(files["peer-token"]),
            "--stats", str(files["stats.json"]), *extra, "--", "sh", "-c",
            "echo started; exec sleep 300"]
    proc = native._start(argv, stderr=subprocess.STDOUT)
    try:
        # The program starts once the trace is attached: what follows is traced whole.
        said = proc.stdout.readline()
        assert said == "started\n", said + proc.stdout.read()
        token = files["token"].read_text().strip().encode()
        peer = read_secret("--peer-token-file", str(files["peer-token"]), allow_readable=False)
        async with sh.embedded(peer_token=peer) as inode:
            tnode = await sh.connect(f"127.0.0.1:{port}", token=token)
            try:
                target, initiator = await make_side(tnode), await make_side(inode)
                await target.qp.connect(initiator.qp.info(), path_mtu=sh.IBV_MTU_4096,
                                        timeout=TIMEOUT)
                await initiator.qp.connect(target.qp.info(), path_mtu=sh.IBV_MTU_4096,
                                           timeout=TIMEOUT)
                data = os.urandom(BLOCKS * 512)
                mr = await target.reg_mr(len(data))
                mkey = await target.mkey(SIG_FLAGS, sges=whole(mr),
                                         sig=sh.Mlx5SigBlockAttr(wire=DIF, check_mask=0xFF))
                image = _image(data)
                src = await initiator.reg_mr(image)
                back = await initiator.reg_mr(len(image))
                t0 = time.perf_counter()
                for n in range(ROUNDS):
                    await initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src),
                                                      mkey.rkey, 0, 2 * n))
                    await initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_READ, whole(back),
                                                      mkey.rkey, 0, 2 * n + 1))
                    wcs = await initiator.scq.poll_n(2, 60)
                    assert [w.status for w in wcs] == [sh.IBV_WC_SUCCESS] * 2, wcs
                rate = 2 * ROUNDS * len(image) / (time.perf_counter() - t0) / 1e6
                assert await back.read(len(image)) == image
                assert await mr.read(len(data)) == data
                mine = inode.daemon.stats()
            finally:
                await tnode.close()
        # SIGTERM ends the program; softhca run then writes the stats, closes the trace
        # and the capture.
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        native._reap(proc)
    return rate, json.loads(files["stats.json"].read_text()), mine


def test_trace_and_capture_cost_no_retransmission(files):
    plain, _, _ = asyncio.run(_transfers(files, observe=False))
    rate, theirs, mine = asyncio.run(_transfers(files, observe=True))
    print(f"\n1 MiB T10-DIF WRITE + READ, {ROUNDS} rounds: {plain:.1f} MB/s plain, "
          f"{rate:.1f} MB/s with --trace and --capture; run daemon retransmitted "
          f"{theirs['retransmitted_packets']} packets, ack timeouts "
          f"{theirs['ack_timeouts']}; initiator {mine['retransmitted_packets']}, "
          f"{mine['ack_timeouts']}; capture_dropped {theirs.get('capture_dropped')}")
    for stats in (theirs, mine):
        assert stats["retransmitted_packets"] == 0 and stats["ack_timeouts"] == 0, stats
    # Every packet the run's daemon sent and took is in the capture, none dropped.
    assert theirs["capture_dropped"] == 0
    frames = read_pcap(files["wire.pcap"])
    assert len(frames) == theirs["packets_sent"] + theirs["packets_received"], \
        (len(frames), theirs["packets_sent"], theirs["packets_received"])
    # Each transfer once in the trace (a READ is never listed again for a duplicate
    # request): the WRITEs taken and the READs answered, each PSN once. A
    # trace that fell behind (the daemon never waits for it) lacks some, and says so.
    text = files["trace.txt"].read_text()
    heads = re.findall(r"^QP 0x[0-9a-f]+ (RDMA_\w+) responder psn (0x[0-9a-f]+)", text, re.M)
    psns = [int(p, 16) for _, p in heads]
    assert heads and len(set(psns)) == len(psns), heads
    assert {op for op, _ in heads} <= {"RDMA_WRITE", "RDMA_READ"}, heads
    said = re.findall(r"^softhca trace: (\d+) events dropped", text, re.M)
    if len(heads) < 2 * ROUNDS:
        assert said and int(said[0]) > 0, text[-500:]
    print(f"trace: {len(heads)} of {2 * ROUNDS} transfers listed; {said or 0} events dropped")
