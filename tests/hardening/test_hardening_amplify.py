"""No amplification: duplicate READ requests and duplicate trains cost a bounded amount.

A peer daemon (a holder of the peer token, the only one that can open a wire link) that
misbehaves: it replays READ requests it never reads the answers of, or floods a QP with
trains of packets it already sent. The target daemon is a ``softhca serve`` process,
so its RSS is measured alone.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import threading
import time
from pathlib import Path

from rawclient import silent_peer
from test_hardening import read_frames
from test_hardening_load import start_probe

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, frame_bytes
from softhca.protocol.handshake import make_challenge, make_hello
from softhca.protocol.packets import Packet, Run, packet_header, train_header
from softhca.tools.daemons import Daemons
from softhca.tools.soak import rss

from e2e import pd_and_cq

PEER_TOKEN = b"amplification-test-peer-token"
READ_LEN = 64 << 20


def peer_token_file(tmp_path: Path) -> Path:
    path = tmp_path / "attacker_peer_token"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(PEER_TOKEN)
    return path


async def wire_in(address: str, src: str):
    """A wire link into ``address`` proving the peer token, naming ``src``."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder(1 << 20)
    (challenge,) = await read_frames(reader, dec)
    writer.write(frame_bytes(make_hello(challenge.header, "wire", PEER_TOKEN, src)))
    (welcome,) = await read_frames(reader, dec)
    assert welcome.header["t"] == "welcome", welcome.header
    return writer


async def victim_qp(node: sh.Node, peer_port: int, peer_qpn: int, peer_psn: int,
                    mr_len: int):
    """A QP on ``node`` connected to the fake peer, remote READ allowed, and an MR."""
    ctx = await node.open_device()
    pd = await ctx.alloc_pd()
    cq = await ctx.create_cq(64)
    mr = await pd.reg_mr(mr_len, sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_READ
                         | sh.IBV_ACCESS_REMOTE_WRITE)
    qp = await pd.create_qp(sh.QPInitAttr(
        qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
        cap=sh.QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)))
    await qp.to_init(sh.QPAttr(qp_access_flags=sh.IBV_ACCESS_REMOTE_READ
                               | sh.IBV_ACCESS_REMOTE_WRITE))
    await qp.to_rtr(sh.QPAttr(path_mtu=sh.IBV_MTU_4096, dest_qp_num=peer_qpn,
                              rq_psn=peer_psn, dest_host="127.0.0.1", dest_port=peer_port,
                              dest_dev="mlx5_0", max_dest_rd_atomic=4))
    await qp.to_rts(sh.QPAttr(sq_psn=0, timeout=14, retry_cnt=7, rnr_retry=7))
    return qp, mr


def read_request(qpn: int, psn: int, rkey: int, addr: int, length: int, sqp: int) -> bytes:
    h = packet_header("mlx5_0", Packet(qpn, psn, "RDMA_READ_REQUEST", b"",
                                       reth=(rkey, addr, length)))
    h["sqp"] = sqp
    return frame_bytes(h)


async def test_duplicate_read_requests_are_answered_only_from_the_original_record(tmp_path):
    """The attack: one 64 MiB READ request, then 16 duplicates of it and 16 'duplicates'
    naming other ranges, to a QP whose peer never reads the answers. The daemon's RSS
    stays within +64 MiB of what it held before, the forged-RETH duplicates are dropped
    and counted, and a second client is answered meanwhile."""
    server, port, _ = await silent_peer()
    peer_qpn, peer_psn = 0x4242, 0x100
    daemons = Daemons(1, str(tmp_path), ("--peer-token-file", str(peer_token_file(tmp_path))))
    with daemons as (address,):
        pid = daemons.procs[0].pid
        node = await sh.connect(address)
        qp, mr = await victim_qp(node, port, peer_qpn, peer_psn, READ_LEN)
        # Memory with bytes in it (resident), as a READ of real data reads.
        chunk = os.urandom(4 << 20)
        for off in range(0, READ_LEN, len(chunk)):
            await mr.write(chunk, off)
        w = await wire_in(address, f"127.0.0.1:{port}")
        await asyncio.sleep(0.3)
        before = rss(pid)
        stop = asyncio.Event()
        prober = await start_probe(address, stop)
        await asyncio.sleep(0.1)
        # The original READ, then sixteen exact duplicates of it ...
        w.write(read_request(qp.qp_num, peer_psn, mr.rkey, mr.addr, READ_LEN, peer_qpn))
        await w.drain()
        await asyncio.sleep(0.5)
        peak = rss(pid)
        for _ in range(16):
            w.write(read_request(qp.qp_num, peer_psn, mr.rkey, mr.addr, READ_LEN, peer_qpn))
            await w.drain()
            await asyncio.sleep(0.05)
            peak = max(peak, rss(pid))
        # ... and sixteen at an old PSN naming another range than the original's.
        for k in range(16):
            w.write(read_request(qp.qp_num, peer_psn, mr.rkey, mr.addr + 4096 * (k + 1),
                                 READ_LEN, peer_qpn))
        await w.drain()
        for _ in range(40):
            await asyncio.sleep(0.05)
            peak = max(peak, rss(pid))
        stop.set()
        times = await prober
        after = rss(pid)
        c = await node.counters()
        grew = peak - before
        print(f"\n16 duplicate 64 MiB READ requests (+16 with another RETH) to a peer that "
              f"never reads: daemon RSS {before / 2**20:.0f} MiB before, peak "
              f"{peak / 2**20:.0f} MiB (+{grew / 2**20:.0f} MiB, bound +64 MiB), "
              f"{after / 2**20:.0f} MiB after; duplicate READs answered "
              f"{c.get('duplicate_reads_answered', 0)}, dropped "
              f"{c.get('duplicate_reads_dropped', 0)}; packets dropped at the full link "
              f"{c['packets_dropped_link_full']}; second client slowest "
              f"{max(times) * 1e3:.1f} ms, median {statistics.median(times) * 1e3:.2f} ms")
        assert grew <= 64 << 20
        assert c["duplicate_reads_dropped"] >= 16
        assert max(times) < 0.5
        w.close()
        await node.close()
    server.close()


def write_train(qpn: int, psn: int, n: int, mtu: int, rkey: int, addr: int, sqp: int) -> bytes:
    """One RDMA WRITE of ``n`` packets as a train frame (a whole message)."""
    payload = bytes(n * mtu)
    run = Run(qpn, psn, n, "RDMA_WRITE", True, True, mtu, memoryview(payload),
              reth=(rkey, addr, n * mtu))
    h = train_header("mlx5_0", run)
    h["sqp"] = sqp
    return frame_bytes(h, payload)


async def median_probe(address: str, seconds: float) -> list[float]:
    stop = asyncio.Event()
    task = await start_probe(address, stop)
    await asyncio.sleep(seconds)
    stop.set()
    return await task


async def test_duplicate_trains_are_dropped_at_o1_and_another_client_keeps_its_latency(
        tmp_path):
    """The attack: 4,096-packet trains of a WRITE the QP already took (and trains far
    ahead of its window), as fast as the link takes them. Each is dropped whole (counted
    once), and a second client's median answer stays within 3x its baseline, both
    measured here."""
    server, port, _ = await silent_peer()
    peer_qpn, peer_psn, n, mtu = 0x5151, 0x200, 4096, 1024
    daemons = Daemons(1, str(tmp_path), ("--peer-token-file", str(peer_token_file(tmp_path))))
    with daemons as (address,):
        node = await sh.connect(address)
        qp, mr = await victim_qp(node, port, peer_qpn, peer_psn, n * mtu)
        w = await wire_in(address, f"127.0.0.1:{port}")
        dup = write_train(qp.qp_num, peer_psn, n, mtu, mr.rkey, mr.addr, peer_qpn)
        w.write(dup)            # the original: taken, the expected PSN moves past it
        await w.drain()
        await asyncio.sleep(0.5)
        base = await median_probe(address, 1.5)
        ahead = write_train(qp.qp_num, (peer_psn + (1 << 22)) % (1 << 24), n, mtu, mr.rkey,
                            mr.addr, peer_qpn)
        # The flood comes from a thread on a blocking socket (the link's, duplicated),
        # so that this process's event loop, where the probe runs, is not the sender.
        sock = socket.socket(fileno=os.dup(w.get_extra_info("socket").fileno()))
        sock.setblocking(True)
        halt = threading.Event()
        sent = [0]

        def flood() -> None:
            while not halt.is_set():
                sock.sendall(dup if sent[0] % 4 else ahead)
                sent[0] += 1

        thread = threading.Thread(target=flood, daemon=True)
        t0 = time.perf_counter()
        thread.start()
        flooded = await median_probe(address, 3.0)
        halt.set()
        await asyncio.to_thread(thread.join, 10)
        took = time.perf_counter() - t0
        sent = sent[0]
        await asyncio.sleep(0.5)
        c = await node.counters()
        b_med, f_med = statistics.median(base), statistics.median(flooded)
        print(f"\nduplicate-train flood: {sent} trains of {n} packets ({sent * n * mtu / 2**20:.0f}"
              f" MiB) in {took:.1f} s; duplicate_runs_discarded="
              f"{c['duplicate_runs_discarded']}, duplicates_discarded="
              f"{c['duplicates_discarded']}, out_of_window_discarded="
              f"{c['out_of_window_discarded']}, psn_seq_naks_sent={c['psn_seq_naks_sent']}, "
              f"wire_bytes_discarded={c['wire_bytes_discarded']} (throttled "
              f"{c['wire_throttle_ms']} ms); "
              f"second client median {b_med * 1e3:.2f} ms baseline, {f_med * 1e3:.2f} ms "
              f"during the flood (bound 3x), slowest {max(flooded) * 1e3:.1f} ms")
        assert c["duplicate_runs_discarded"] >= sent * 3 // 4 - 2
        assert f_med <= 3 * b_med
        sock.close()
        w.close()
        await node.close()
    server.close()


async def reading_peer():
    """A fake peer daemon that welcomes wire links and reads (and counts) what comes."""
    got = [0]

    async def on_conn(reader, writer):
        challenge, _ = make_challenge(False)
        writer.write(frame_bytes(challenge))
        await reader.read(4096)
        writer.write(frame_bytes({"t": "welcome", "role": "wire", "devices": ["mlx5_0"],
                                  "max_frame": 16 << 20}))
        while data := await reader.read(1 << 20):
            got[0] += len(data)

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], got


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_nak_storm_rewinds_once_per_window(tmp_path):
    """The attack: 20,000 "PSN sequence error" NAKs naming the first PSN of a 32 MiB
    WRITE outstanding to a peer that never acknowledges. IBTA go-back-N rewinds once per
    outstanding window: one retransmission, the rest of the NAKs ignored and counted;
    the daemon's CPU and a second client's answers stay bounded."""
    server, port, got = await reading_peer()
    peer_qpn, size = 0x6161, 32 << 20
    daemons = Daemons(1, str(tmp_path), ("--peer-token-file", str(peer_token_file(tmp_path))))
    with daemons as (address,):
        pid = daemons.procs[0].pid
        node, pd, cq = await pd_and_cq(address)
        mr = await pd.reg_mr(size, sh.IBV_ACCESS_LOCAL_WRITE)
        qp = await pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
            cap=sh.QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)))
        await qp.connect(sh.QPInfo("127.0.0.1", port, "mlx5_0", peer_qpn, 0),
                         path_mtu=sh.IBV_MTU_4096, timeout=20, retry_cnt=7)
        wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_RDMA_WRITE,
                       sg=[sh.SGE(mr.addr, size, mr.lkey)])
        wr.set_wr_rdma(0x1234, 0x10000)
        await qp.post_send(wr)
        await asyncio.sleep(1.0)
        sent_before = got[0]
        w = await wire_in(address, f"127.0.0.1:{port}")
        nak = packet_header("mlx5_0", Packet(qp.qp_num, qp.psn, "ACKNOWLEDGE", b"",
                                             aeth=("NAK_PSN_SEQ", 0)))
        nak["sqp"] = peer_qpn
        one = frame_bytes(nak)
        received = (await node.counters())["packets_received"]
        stop = asyncio.Event()
        prober = await start_probe(address, stop)
        cpu0, t0 = cpu_s(pid), time.perf_counter()
        for _ in range(20):
            w.write(one * 1000)
            await w.drain()
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        # On a loaded machine the daemon may still be behind the sender: it is judged
        # once it has taken every NAK (each counts in packets_received, acted on or not).
        deadline = time.monotonic() + 60
        while (await node.counters())["packets_received"] < received + 20_000:
            assert time.monotonic() < deadline, "the daemon did not take the NAKs in 60 s"
            await asyncio.sleep(0.05)
        cpu, took = cpu_s(pid) - cpu0, time.perf_counter() - t0
        stop.set()
        times = await prober
        c = await node.counters()
        resent = got[0] - sent_before
        print(f"\nNAK storm: 20,000 PSN-sequence-error NAKs against a 32 MiB WRITE "
              f"outstanding: retransmissions={c['retransmissions']}, "
              f"psn_seq_naks_ignored={c['psn_seq_naks_ignored']}, retransmitted_packets="
              f"{c['retransmitted_packets']}, bytes on the link meanwhile "
              f"{resent / 2**20:.1f} MiB; daemon CPU {cpu:.2f} s in {took:.1f} s; second "
              f"client median {statistics.median(times) * 1e3:.2f} ms, slowest "
              f"{max(times) * 1e3:.1f} ms")
        assert c["retransmissions"] <= 2
        assert c["psn_seq_naks_ignored"] >= 20_000 - 2
        assert resent <= 2 * size + (8 << 20)
        assert statistics.median(times) < 0.02
        w.close()
        await node.close()
    server.close()


async def test_a_read_larger_than_the_link_backlog_completes_intact():
    """The backlog's bound does not cut a READ of registered memory short: its responses
    are views of that memory, charged their framing only, so a 96 MiB READ goes whole
    (none dropped at the link) and lands intact."""
    from e2e import sge as whole_sge
    from e2e import two_nodes

    size = 96 << 20
    async with two_nodes(mtu=sh.IBV_MTU_4096) as p:
        remote = await p.target.reg_mr(size)
        chunk = os.urandom(8 << 20)
        for off in range(0, size, len(chunk)):
            await remote.write(chunk, off)
        local = await p.initiator.reg_mr(size)
        t0 = time.perf_counter()
        wc = await p.read([whole_sge(local)], remote.rkey, remote.addr)
        took = time.perf_counter() - t0
        ok = all([await local.read(len(chunk), off) == chunk
                  for off in range(0, size, len(chunk))])
        c = await p.target.node.counters()
        print(f"\n96 MiB READ: status {wc.status}, {took:.2f} s, intact {ok}, packets dropped "
              f"at the link {c['packets_dropped_link_full']}")
        assert wc.status == sh.IBV_WC_SUCCESS and ok
        assert c["packets_dropped_link_full"] == 0
