"""Side features never stop the data path: a capture whose file cannot grow, a tap that
raises, a subscriber that breaks; and start-up errors name their real cause.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import softhca.client as sh

from e2e import make_side, rdma, sge

FSIZE_LIMIT = 256 << 10
PEER_TOKEN = b"side-feature-test-peer-token"


def _limit_file_size() -> None:
    # A stand-in for a full disk: the capture file may not grow past FSIZE_LIMIT (the
    # write fails EFBIG; Python ignores SIGXFSZ).
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def start_target(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    peer = tmp_path / "peer_token"
    fd = os.open(peer, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(PEER_TOKEN)
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, "-m", "softhca.tools.cli", "serve", "--listen", "127.0.0.1:0",
         "--ready-file", str(ready), "--peer-token-file", str(peer), *args],
        stderr=subprocess.PIPE, text=True, preexec_fn=_limit_file_size)
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    return proc, ready.read_text().strip()


async def test_a_full_capture_file_stops_the_capture_not_the_traffic(tmp_path):
    """The attack (a full disk): ``serve --capture FILE`` whose FILE may not grow past
    256 KiB, then 20 RDMA WRITEs of 1 MiB. All 20 complete and land; the capture is
    stopped with one log line and counted."""
    pcap = tmp_path / "full.pcap"
    proc, address = start_target(tmp_path, "--capture", str(pcap))
    n, size = 20, 1 << 20
    try:
        async with sh.embedded(peer_token=PEER_TOKEN) as inode:
            tnode = await sh.connect(address)
            t, i = await make_side(tnode), await make_side(inode)
            await t.qp.connect(i.qp.info(), path_mtu=sh.IBV_MTU_4096)
            await i.qp.connect(t.qp.info(), path_mtu=sh.IBV_MTU_4096)
            dst = await t.reg_mr(size)
            t0 = time.perf_counter()
            done = landed = 0
            for k in range(n):
                data = os.urandom(size)
                src = await i.reg_mr(data)
                await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey,
                                          dst.addr, wr_id=k))
                (wc,) = await i.scq.poll_n(1, 20)
                done += wc.status == sh.IBV_WC_SUCCESS
                landed += await dst.read() == data
                await src.close()
            took = time.perf_counter() - t0
            c = await tnode.counters()
            await tnode.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    stopped = [ln for ln in err.splitlines() if "event=side_feature_stopped" in ln]
    print(f"\nfull capture file ({FSIZE_LIMIT >> 10} KiB limit, RLIMIT_FSIZE): {done} of {n} "
          f"1 MiB WRITEs completed, {landed} landed intact, in {took:.2f} s; capture file "
          f"{pcap.stat().st_size} bytes; side_features_stopped="
          f"{c['side_features_stopped']}; log: {stopped}")
    assert (done, landed) == (n, n)
    assert c["side_features_stopped"] == 1 and len(stopped) == 1
    assert "File too large" in stopped[0] and "EFBIG" in stopped[0]
    assert "Traceback" not in err


async def test_a_tap_or_subscriber_that_raises_is_stopped_alone():
    """A wire tap that raises EIO, and a trace subscriber whose connection breaks: each
    stopped (counted), the WRITEs beside them complete."""
    async with sh.embedded() as tnode, sh.embedded() as inode:
        t, i = await make_side(tnode), await make_side(inode)
        await t.qp.connect(i.qp.info())
        await i.qp.connect(t.qp.info())
        calls = []

        def broken_tap(direction, dev, p):
            calls.append(direction)
            raise OSError(5, "Input/output error")

        inode.daemon.taps.append(broken_tap)
        sub = await sh.connect(inode.address)
        await sub.subscribe("trace", daemon_wide=True)
        sub_session = next(iter(inode.daemon.events.subscribers))

        def broken_push(header, payload=b""):
            raise ConnectionResetError(104, "Connection reset by peer")
        sub_session.push = broken_push
        dst = await t.reg_mr(4096)
        for k in range(5):
            src = await i.reg_mr(os.urandom(4096))
            await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey, dst.addr,
                                      wr_id=k))
            (wc,) = await i.scq.poll_n(1, 10)
            assert wc.status == sh.IBV_WC_SUCCESS
            assert await dst.read() == await src.read()
        c = await inode.counters()
        print(f"\na tap raising EIO and a subscriber whose push fails: 5 of 5 WRITEs; tap "
              f"called {len(calls)} time(s); side_features_stopped="
              f"{c['side_features_stopped']}")
        assert len(calls) == 1 and broken_tap not in inode.daemon.taps
        assert c["side_features_stopped"] == 2
        assert not inode.daemon.events.subscribers
        await sub.close()


def test_an_unwritable_capture_names_its_cause_at_start(tmp_path):
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                        "127.0.0.1:0", "--capture", "/dev/full"],
                       capture_output=True, text=True, timeout=30)
    print(f"\nserve --capture /dev/full: exit {r.returncode}; {r.stderr.strip()}")
    assert r.returncode == 1
    assert "event=capture_failed file=/dev/full" in r.stderr
    assert "No space left on device" in r.stderr and "listen_failed" not in r.stderr




async def test_a_capture_that_falls_behind_drops_packets_not_the_traffic(tmp_path):
    """The attack: traffic faster than the capture can write, stood in for by a queue
    of 8 KiB (the daemon's is 64 MiB). A 64 KiB WRITE, one train of 64 packets, does
    not fit: its packets are left out of the capture and counted (capture_dropped), the
    WRITE completes, and the file holds every other packet whole."""
    from softhca.server.capture import CaptureTap, read_pcap

    pcap = tmp_path / "small.pcap"
    async with sh.embedded() as tnode, sh.embedded() as inode:
        t, i = await make_side(tnode), await make_side(inode)
        await t.qp.connect(i.qp.info(), path_mtu=sh.IBV_MTU_1024)
        await i.qp.connect(t.qp.info(), path_mtu=sh.IBV_MTU_1024)
        tap = CaptureTap(inode.daemon, pcap, queue_bytes=8 << 10)
        src, dst = await i.reg_mr(os.urandom(64 << 10)), await t.reg_mr(64 << 10)
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey, dst.addr, 1))
        (wc,) = await i.scq.poll_n(1, 20)
        assert wc.status == sh.IBV_WC_SUCCESS
        assert await dst.read(64 << 10) == await src.read(64 << 10)
        tap.close()
        c = inode.daemon.stats()
    frames = read_pcap(pcap)
    print(f"\n8 KiB capture queue: {c['capture_dropped']} packets dropped, {len(frames)} "
          f"written, of {c['packets_sent'] + c['packets_received']}")
    assert c["capture_dropped"] >= 64 and c["side_features_stopped"] == 0
    assert len(frames) + c["capture_dropped"] == c["packets_sent"] + c["packets_received"]
    assert tap.count == len(frames)
