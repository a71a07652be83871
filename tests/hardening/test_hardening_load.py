"""Hardening, round two (the event loop and memory under one client's load): no single
client freezes or bloats the daemon.

Each test performs the attack and asserts the fix; the timing and memory bounds are
measured in the test and printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from rawclient import Raw, silent_peer

import softhca.client as sh
from softhca.engine import transfer
from softhca.engine.hca import MAX_MR_SIZE
from softhca.protocol.attrs import SGE, MrInterleaved
from softhca.protocol.enums import AccessFlags, MkeyInitAttrFlags
from softhca.protocol.errors import RDMAError

from e2e import make_side, rdma, serve, two_nodes, whole

RW = AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE | AccessFlags.LOCAL_WRITE


# -- defect 2: the MKEY layout is O(entries), bounded ----------------------------------

def _expand(entries, repeat, mrs):
    """An independent model of an interleaved layout: the memory bytes in MKEY order,
    built by walking every repetition of every entry (small layouts only)."""
    out = bytearray()
    for r in range(repeat):
        for addr, count, skip, mr in zip(*entries, mrs, strict=True):
            start = addr - mr.addr + r * (count + skip)
            out += mr.read(count, start)
    return bytes(out)


def test_interleaved_layout_matches_its_expansion_at_every_window(node, rng):
    mr1, mr2 = node.reg_mr(rng.randbytes(4096)), node.reg_mr(rng.randbytes(512))
    repeat = 9
    addrs, counts, skips = (mr1.addr + 3, mr2.addr + 1, mr1.addr + 2000), (37, 5, 11), (4, 0, 2)
    mrs = (mr1, mr2, mr1)
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=4)
    node.configure(mkey, access=RW, interleaved=(repeat, [
        MrInterleaved(a, c, s, m.lkey) for a, c, s, m in zip(addrs, counts, skips, mrs,
                                                                strict=True)]))
    expected = _expand((addrs, counts, skips), repeat, mrs)
    assert mkey.layout.length == len(expected) == repeat * 53
    for off in (0, 1, 36, 37, 42, 53, 100, 200, len(expected) - 1):
        for n in (0, 1, 16, 53, 54, 106, 200, len(expected) - off):
            n = min(n, len(expected) - off)
            got = transfer.tx(node.pd, mkey.rkey, off, n, remote=True)
            assert got == expected[off:off + n], (off, n)
    # Scatter through the same windows lands where the expansion says.
    data = rng.randbytes(len(expected) - 40)
    transfer.rx(node.pd, mkey.rkey, 20, data, remote=True)
    after = _expand((addrs, counts, skips), repeat, mrs)
    assert after[20:20 + len(data)] == data
    assert after[:20] == expected[:20] and after[20 + len(data):] == expected[20 + len(data):]


def test_interleaved_repeat_2_to_32_is_not_expanded(node):
    """The attack: repeat_count 4294967295. Configure is O(entries) and a transfer
    O(entries) plus the bytes it moves."""
    mr = node.reg_mr(1 << 20)
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=3)
    t0 = time.perf_counter()
    node.configure(mkey, access=RW, interleaved=(
        0xFFFFFFFF, [MrInterleaved(mr.addr, 0, 0, mr.lkey), MrInterleaved(mr.addr, 0, 0, mr.lkey)]))
    took = time.perf_counter() - t0
    print(f"configure of repeat_count 4294967295: {took * 1e3:.2f} ms")
    assert took < 0.05 and mkey.layout.length == 0


def test_interleaved_4m_repeats_transfer_in_numpy(node, rng):
    """bytes_count=1, repeat 4M (a 494 MB attack): the layout is two entries,
    and a transfer of the whole MKEY is strided copies, checked against numpy slicing."""
    n = 4 << 20
    mr = node.reg_mr(rng.randbytes(2 * n))
    pi = node.reg_mr(rng.randbytes(n))
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=3)
    t0 = time.perf_counter()
    node.configure(mkey, access=RW, interleaved=(n, [MrInterleaved(mr.addr, 1, 1, mr.lkey),
                                                     MrInterleaved(pi.addr, 1, 0, pi.lkey)]))
    conf = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = np.frombuffer(transfer.tx(node.pd, mkey.rkey, 1, 2 * n - 2, remote=True), np.uint8)
    tx_s = time.perf_counter() - t0
    print(f"configure {conf * 1e3:.2f} ms, 8 MiB gather {tx_s * 1e3:.1f} ms")
    expect = np.empty(2 * n, np.uint8)
    expect[0::2] = np.frombuffer(mr.read(), np.uint8)[0::2]
    expect[1::2] = np.frombuffer(pi.read(), np.uint8)
    assert np.array_equal(got, expect[1:-1])
    assert conf < 0.05 and tx_s < 1.0
    data = rng.randbytes(2 * n)
    transfer.rx(node.pd, mkey.rkey, 0, data, remote=True)
    assert mr.read()[0::2] == data[0::2] and pi.read() == data[1::2]


def test_layout_entries_and_total_size_are_bounded(node):
    mr = node.reg_mr(1 << 30)       # untouched pages: no RSS
    mkey = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=2)
    with pytest.raises(RDMAError) as e:
        node.configure(mkey, access=RW, interleaved=(
            4, [MrInterleaved(mr.addr, 8, 0, mr.lkey)] * 2))
    assert e.value.errno_name == "EINVAL" and "max_entries" in e.value.message
    with pytest.raises(RDMAError) as e:
        node.configure(mkey, access=RW, sges=[SGE(mr.addr, 8, mr.lkey)] * 3)
    assert e.value.errno_name == "EINVAL" and "max_entries" in e.value.message
    big = node.create_mkey(MkeyInitAttrFlags.INDIRECT, max_entries=2048)
    n = MAX_MR_SIZE // (1 << 30) + 1
    with pytest.raises(RDMAError) as e:
        node.configure(big, access=RW, sges=[SGE(mr.addr, 1 << 30, mr.lkey)] * n)
    assert e.value.errno_name == "EINVAL" and "max_mr_size" in e.value.message
    assert not big.valid and big.layout is None


# -- a `softhca serve` subprocess, raw frames, a latency probe, RSS ---------------------

def rss(proc: subprocess.Popen, field: str = "VmRSS") -> int:
    """Bytes of the process's resident set (VmHWM: its peak)."""
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for pid {proc.pid}")


async def start_probe(address: str, stop: asyncio.Event) -> asyncio.Task:
    """A second client, connected before this returns, and the task of its round trips
    (seconds) until ``stop``: at least one, the first asked at once. Connected first, so
    that the attack the caller starts next meets a client already there; a connect
    racing the attack could end after ``stop`` on a loaded machine, leaving no round
    trip to judge the daemon by."""
    node = await sh.connect(address)

    async def round_trips() -> list[float]:
        times = []
        try:
            while True:
                t0 = time.perf_counter()
                await node.request("devices")
                times.append(time.perf_counter() - t0)
                if stop.is_set():
                    return times
                await asyncio.sleep(0.005)
        finally:
            await node.close()

    return asyncio.create_task(round_trips())


PROBE_BOUND_S = 0.050
PROBE_OUTLIER_S = 0.250


async def test_pipelined_waiting_polls_are_bounded_and_do_not_stall_others(tmp_path):
    """The attack: 100k poll_cq(timeout=3600) on an empty CQ in one write, then a
    disconnect. Past the session's waiting-request limit they are refused ENOMEM, the
    cleanup is linear, and a second client is answered within 50 ms throughout."""
    with serve(tmp_path) as (proc, address):
        raw = await Raw.open(address)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        cq = (await raw.call("create_cq", ctx=ctx, cqe=16))["cq"]
        burst = b"".join(raw.frame("poll_cq", cq=cq, num=1, timeout=3600)
                         for _ in range(100_000))
        # While the daemon works through the burst (the attacker not reading: its
        # replies stop the daemon reading it at the reply budget) ...
        stop = asyncio.Event()
        prober = await start_probe(address, stop)
        await asyncio.sleep(0.2)
        raw.writer.write(burst)
        await raw.writer.drain()
        await asyncio.sleep(2.0)
        stop.set()
        burst_times = await prober
        errnos: dict[str, int] = {}
        while sum(errnos.values()) < 100_000 - 1024:
            h = (await raw.next()).header
            errnos[h.get("errno", h["t"])] = errnos.get(h.get("errno", h["t"]), 0) + 1
        # ... and while it ends the session's 1024 waiting polls.
        stop = asyncio.Event()
        prober = await start_probe(address, stop)
        await asyncio.sleep(0.2)
        raw.writer.close()
        await asyncio.sleep(1.0)
        stop.set()
        close_times = await prober
        times = burst_times + close_times
        within = sum(t < PROBE_BOUND_S for t in times) / len(times)
        print(f"replies {errnos}; probe: {len(times)} round trips, {within:.1%} within "
              f"{PROBE_BOUND_S * 1e3:.0f} ms; worst {max(burst_times) * 1e3:.1f} ms during "
              f"the burst, {max(close_times) * 1e3:.1f} ms during the cleanup")
        assert errnos == {"ENOMEM": 100_000 - 1024}
        # The daemon yields every few milliseconds of CPU; on a loaded machine the OS
        # may still hold its process off the CPU for longer, hence the outlier margin
        # (before the fix, the cleanup alone stalled every client for 55 s).
        assert len(times) > 10 and within >= 0.95 and max(times) < PROBE_OUTLIER_S


async def test_waiting_async_event_requests_share_the_bound():
    """get_async_event waits count with poll_cq waits against the session's limit."""
    from softhca.server.daemon import Limits

    async with sh.embedded(limits=Limits(max_waits=4)) as node:
        ctx = await node.open_device()
        cq = await ctx.create_cq(16)
        waits = [asyncio.create_task(cq.poll(1, timeout=30)) for _ in range(2)]
        waits += [asyncio.create_task(node.request("get_async_event", ctx=ctx.handle,
                                                   timeout=30)) for _ in range(2)]
        await asyncio.sleep(0.2)
        for call in (cq.poll(1, timeout=30),
                     node.request("get_async_event", ctx=ctx.handle, timeout=30)):
            with pytest.raises(sh.RDMAError) as e:
                await call
            assert e.value.errno_name == "ENOMEM" and "4 requests waiting" in e.value.message
        assert await cq.poll(1) == []       # a poll that does not wait is always served
        for w in waits:
            w.cancel()


async def test_pipelined_large_reads_wait_for_the_reply_budget(tmp_path):
    """The attack: sixty pipelined 8 MiB mr_read in one write, the replies unread. The
    budget is checked before each read runs, so the daemon holds about one reply."""
    with serve(tmp_path) as (proc, address):
        raw = await Raw.open(address)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        pd = (await raw.call("alloc_pd", ctx=ctx))["pd"]
        n = 8 << 20
        mr = (await raw.call("reg_mr", pd=pd, length=n, access=1))["mr"]
        await raw.call("mr_write", mr=mr, offset=0)
        base = rss(proc)
        burst = b"".join(raw.frame("mr_read", mr=mr, offset=0, length=n) for _ in range(60))
        print(f"burst of 60 mr_read: {len(burst)} bytes in one write")
        raw.writer.write(burst)
        await raw.writer.drain()
        await asyncio.sleep(2.0)
        grown = rss(proc, "VmHWM") - base
        bound = 64 << 20
        print(f"serve RSS {base / 2**20:.0f} MiB before, peak grew {grown / 2**20:.0f} MiB "
              f"(bound {bound / 2**20:.0f} MiB; 60 replies are 480 MiB)")
        assert grown < bound
        for _ in range(60):
            fr = await raw.next()
            assert fr.kind == "ok" and len(fr.payload) == n
        raw.writer.close()


# -- defect 5: CQ overrun --------------------------------------------------------------

async def test_cq_overrun_raises_cq_err_and_errors_its_qps():
    """The attack: a CQ of cqe=64 never polled while its QP completes thousands of
    signaled WRs. The CQ keeps 64 completions, IBV_EVENT_CQ_ERR arrives on its context,
    and the QP using it is in ERR."""
    async with two_nodes(connect=True) as pair:
        ini = pair.initiator
        small = await ini.ctx.create_cq(64)
        qp = await ini.pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=small, rcq=small,
            cap=sh.QPCap(max_send_wr=256, max_recv_wr=16, max_send_sge=1, max_recv_sge=1),
            sq_sig_all=True))
        peer = await pair.target.pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=pair.target.scq, rcq=pair.target.rcq,
            cap=sh.QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)))
        await qp.connect(peer.info())
        await peer.connect(qp.info())
        src = await ini.pd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE)
        dst = await pair.target.pd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE
                                          | sh.IBV_ACCESS_REMOTE_WRITE)
        [session] = ini.node.daemon.sessions
        cq_host = session.verbs.get(small.handle, "cq")
        posted = 0
        for _ in range(30):
            try:
                await qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr,
                                         wr_id=posted + i) for i in range(100)])
            except sh.RDMAError:
                break       # the QP is in ERR (or its send queue is full)
            posted += 100
            await asyncio.sleep(0.05)
        ev = await ini.ctx.get_async_event(timeout=10)
        assert ev is not None and ev.event_type == sh.IBV_EVENT_CQ_ERR and ev.cq is small
        await ev.ack()
        assert (await qp.query())["qp_state"] == sh.IBV_QPS_ERR
        held = await small.poll(4096)
        print(f"posted {posted} signaled WRs; the CQ held {len(held)}, cqe 64")
        assert posted > 64 and len(held) == 64
        assert cq_host.error and len(cq_host.entries) == 0
        # The other QPs of the session are not touched.
        assert (await ini.qp.query())["qp_state"] == sh.IBV_QPS_RTS


# -- defect 7: the messages ------------------------------------------------------------

@pytest.mark.parametrize("value, says", [
    (-1, "must be an unsigned integer in [0, 18446744073709551615], got -1"),
    (1 << 64, "must be an unsigned integer in [0, 18446744073709551615], got 1844674407"),
    ("512", "must be int, got str"),
    (True, "must be int, got bool"),
])
def test_a_configure_field_out_of_range_says_the_range(value, says):
    from softhca.protocol.attrs import CryptoAttr
    from softhca.protocol.control import attr_from_wire
    from softhca.protocol.frames import FrameError
    with pytest.raises(FrameError) as e:
        attr_from_wire(CryptoAttr, {"data_unit_size": value}, "crypto")
    assert e.value.errno_name == "EPROTO"
    assert e.value.message.startswith(f"crypto.data_unit_size {says}"), e.value.message


# -- defect 6: a peer daemon that never reads ------------------------------------------


async def test_a_peer_that_never_reads_bounds_the_link_and_the_qps_fail():
    """The attack: QPs sending to a peer that accepts and never reads. The link's send
    buffer stays bounded, the QPs end in RETRY_EXC_ERR, and when the session closes
    its link is closed and nothing of it is kept."""
    from softhca.server.daemon import WireLink

    server, port, _ = await silent_peer()
    async with server, sh.embedded() as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(4096)
        n_qps, size = 40, 1 << 20
        mr = await pd.reg_mr(size, sh.IBV_ACCESS_LOCAL_WRITE)
        qps = []
        for i in range(n_qps):
            qp = await pd.create_qp(sh.QPInitAttr(
                qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                cap=sh.QPCap(max_send_wr=8, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)))
            await qp.connect(sh.QPInfo(qp_num=0x100 + i, psn=0, host="127.0.0.1", port=port,
                                       dev="mlx5_0"),
                             path_mtu=sh.IBV_MTU_4096, timeout=12, retry_cnt=2)
            qps.append(qp)
        daemon = node.daemon
        link = daemon.links[("127.0.0.1", port)]
        peak = 0
        for i, qp in enumerate(qps):
            await qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, whole(mr), 0x1234, 0x1000,
                                     wr_id=i * 4 + k) for k in range(4)])
            peak = max(peak, link.buffered())
        wcs = []
        deadline = time.monotonic() + 60
        while len(wcs) < n_qps * 4 and time.monotonic() < deadline:
            wcs += await cq.poll(4096, timeout=1.0)
            peak = max(peak, link.buffered())
        statuses = {sh.WcStatus(w.status).name for w in wcs}
        dropped = daemon.counters["packets_dropped_link_full"]
        bound = WireLink.MAX_BUFFERED + WireLink.MAX_BACKLOG
        print(f"{n_qps} QPs x 4 WRs of 1 MiB to a peer that never reads: link buffer peak "
              f"{peak / 2**20:.1f} MiB (bound {bound / 2**20:.0f} MiB: socket and backlog, "
              f"checked before it grows), {dropped} packets dropped, completions {statuses}")
        assert len(wcs) == n_qps * 4
        assert peak <= bound
        assert "RETRY_EXC_ERR" in statuses and statuses <= {"RETRY_EXC_ERR", "WR_FLUSH_ERR"}
        await node.close()
        for _ in range(100):
            if link.closed and not daemon.sessions:
                break
            await asyncio.sleep(0.02)
        assert link.closed and ("127.0.0.1", port) not in daemon.links
        assert link.buffered() == 0 or link.writer.transport.is_closing()


# -- defect 2: no request holds the event loop -----------------------------------------

async def test_requests_that_would_hold_the_loop_are_bounded():
    """A read beyond one reply frame, a post of more WRs than one request carries, and
    a configure request with more layout entries than one request checks are refused
    before any work; the client splits a long WR list itself."""
    async with two_nodes(max_wr=1024) as pair:
        ini, node = pair.initiator, pair.initiator.node
        mr = await ini.pd.reg_mr(1 << 20, sh.IBV_ACCESS_LOCAL_WRITE)
        mkey = await ini.pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 1 << 16)
        for verb, fields, errno in [
            ("mr_read", {"mr": mr.handle, "offset": 0, "length": 64 << 20}, "EMSGSIZE"),
            ("post_send", {"qp": ini.qp.handle,
                           "wrs": [rdma(sh.IBV_WR_RDMA_WRITE, [], 0, 0).to_wire()] * 257},
             "EPROTO"),
            ("mkey_configure", {"qp": ini.qp.handle, "calls": [
                ["configure", 0, int(sh.IBV_SEND_INLINE), mkey.handle, 1, 0, 0],
                ["layout_list", [[mr.addr, 1, mr.lkey]] * 4097]]}, "EINVAL"),
        ]:
            with pytest.raises(sh.RDMAError) as e:
                await node.request(verb, **fields)
            assert e.value.errno_name == errno, (verb, e.value)
            print(f"{verb}: {e.value}")
        # 600 WRs in one ibv_post_send: the client sends three requests, all posted.
        dst = await pair.target.pd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE
                                          | sh.IBV_ACCESS_REMOTE_WRITE)
        await ini.qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, [], dst.rkey, dst.addr, wr_id=i,
                                     send_flags=sh.IBV_SEND_SIGNALED) for i in range(600)])
        wcs = await ini.scq.poll_n(600, 30)
        assert [w.wr_id for w in wcs] == list(range(600))
        assert {w.status for w in wcs} == {sh.IBV_WC_SUCCESS}


# -- defect 7: RDMA_READ under loss; an errored READ's byte_len -------------------------

def _read_pair(rng, size: int):
    from test_rc import Pair

    from softhca.protocol.enums import SendFlags, WrOpcode
    from softhca.protocol.records import SendWR
    p = Pair()
    data = rng.randbytes(size)
    remote, local = p.mr(p.pdb, data), p.mr(p.pda, size)
    wr = SendWR(4, WrOpcode.RDMA_READ, [SGE(local.addr, size, local.lkey)],
                int(SendFlags.SIGNALED), rkey=remote.rkey, remote_addr=remote.addr)
    return p, data, local, wr


def test_a_gap_in_read_responses_is_re_requested_at_once(rng):
    """One READ response lost: the responses behind it make the requester ask again
    from the missing PSN at once, so the READ completes well inside one ACK timeout."""
    from softhca.protocol.enums import WcStatus
    from softhca.protocol.opcodes import Op, with_flags
    responses = with_flags(Op.READ_RESPONSE)
    p, data, local, wr = _read_pair(rng, 8000)
    dropped: list[int] = []
    seen = [0]

    def lose_the_third_response(pkts):
        out = []
        for pkt in pkts:
            if pkt.opcode in responses:
                seen[0] += 1
                if seen[0] == 3:
                    dropped.append(pkt.psn)
                    continue
            out.append(pkt)
        return out

    lose_the_third_response.held = []
    p.a.post_send(wr, p.now)
    p.run(fault=lose_the_third_response, done=lambda: bool(p.wcs["a_send"]))
    [wc] = p.wcs["a_send"]
    print(f"READ of 8000 bytes, response PSN {dropped[0]:#x} lost: completed after "
          f"{p.now * 1e3:.2f} ms (ACK timeout {p.a.timeout_s * 1e3:.0f} ms), "
          f"{p.a.stats['read_rerequests']} re-request")
    assert wc.status == WcStatus.SUCCESS and local.read() == data
    assert p.a.stats['read_rerequests'] == 1 and p.a.stats["ack_timeouts"] == 0
    assert p.now < p.a.timeout_s / 10


def test_reads_complete_at_30_percent_loss(rng):
    """At 30% loss each gap used to wait a full ACK timeout and the
    READs ended in RETRY_EXC_ERR; re-requesting at once they all complete."""
    from test_rc import Faults, Pair

    from softhca.protocol.enums import SendFlags, WcStatus, WrOpcode
    from softhca.protocol.records import SendWR
    p = Pair()
    blobs = [rng.randbytes(16 * 1024) for _ in range(20)]
    remotes = [p.mr(p.pdb, b) for b in blobs]
    locals_ = [p.mr(p.pda, len(b)) for b in blobs]
    for i, (r, lo) in enumerate(zip(remotes, locals_, strict=True)):
        p.a.post_send(SendWR(i, WrOpcode.RDMA_READ, [SGE(lo.addr, lo.length, lo.lkey)],
                             int(SendFlags.SIGNALED), rkey=r.rkey, remote_addr=r.addr), p.now)
    faults = Faults(rng, drop=0.3)
    p.run(fault=faults, done=lambda: len(p.wcs["a_send"]) == len(blobs))
    statuses = [w.status for w in p.wcs["a_send"]]
    print(f"20 READs of 16 KiB at 30% loss ({faults.fired['drop']} packets dropped): "
          f"{p.a.stats['read_rerequests']} re-requests, {p.a.stats['ack_timeouts']} ACK "
          f"timeouts, {p.now:.2f} s")
    assert statuses == [WcStatus.SUCCESS] * len(blobs) and p.a.stats["read_rerequests"] > 0
    assert all(lo.read() == b for lo, b in zip(locals_, blobs, strict=True))


def test_an_errored_read_reports_byte_len_0(rng):
    from softhca.protocol.enums import WcStatus
    p, data, local, wr = _read_pair(rng, 64)
    wr.rkey ^= 0x100       # no such rkey on the responder
    p.a.post_send(wr, p.now)
    p.run()
    [wc] = p.wcs["a_send"]
    assert wc.status == WcStatus.REM_ACCESS_ERR and wc.byte_len == 0


async def test_qps_to_a_peer_that_never_reads_keep_serve_rss_bounded(tmp_path):
    """400 QPs sending to a peer that never reads grew `softhca
    serve` by 234 MB, kept after the session closed. Now each link's buffer is bounded,
    so the growth is the QPs' own send queues (400 x 64 KiB), and what a closed session
    held is freed: a second session doing the same grows the daemon no further."""
    server, port, _ = await silent_peer()
    async with server:
        with serve(tmp_path) as (proc, address):
            base = rss(proc)
            peaks = []
            for _ in range(2):
                node = await sh.connect(address)
                ctx = await node.open_device()
                pd = await ctx.alloc_pd()
                cq = await ctx.create_cq(1 << 16)
                mr = await pd.reg_mr(64 << 10, sh.IBV_ACCESS_LOCAL_WRITE)
                for i in range(400):
                    qp = await pd.create_qp(sh.QPInitAttr(
                        qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                        cap=sh.QPCap(max_send_wr=4, max_recv_wr=1, max_send_sge=1,
                                     max_recv_sge=1)))
                    await qp.connect(sh.QPInfo("127.0.0.1", port, "mlx5_0", 0x100 + i),
                                     path_mtu=sh.IBV_MTU_4096, timeout=14, retry_cnt=7)
                    await qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, whole(mr), 0x1234, 0x1000,
                                             wr_id=i)])
                await asyncio.sleep(1.5)    # retransmissions into the full link
                peaks.append(rss(proc) - base)
                await node.close()
                await asyncio.sleep(0.5)
            bound, again = 64 << 20, 8 << 20
            print(f"400 QPs x 64 KiB to a peer that never reads: serve RSS "
                  f"+{peaks[0] / 2**20:.0f} MiB, after a close and a second session "
                  f"+{peaks[1] / 2**20:.0f} MiB (bounds {bound / 2**20:.0f} MiB, and "
                  f"{again / 2**20:.0f} MiB more the second time; it once measured "
                  f"+234 MB)")
            assert peaks[0] < bound and peaks[1] < peaks[0] + again


async def test_qps_failing_together_share_one_heap_trim(monkeypatch):
    """QPs that go to ERR free the messages their WRs gathered; the daemon gives the heap
    back with one malloc_trim for all the QPs that fail within TRIM_DELAY_S, not one per
    QP, and one again for a QP that fails later."""
    from softhca.server import daemon as daemon_mod

    trims = []
    monkeypatch.setattr(daemon_mod, "_return_free_memory", lambda: trims.append(1))
    async with sh.embedded() as node:
        sides = [await make_side(node) for _ in range(4)]
        for s in sides:
            await s.qp.to_init()
        for s in sides[:3]:
            await s.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR), sh.IBV_QP_STATE)
        await asyncio.sleep(3 * daemon_mod.TRIM_DELAY_S)
        assert len(trims) == 1
        await sides[3].qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR), sh.IBV_QP_STATE)
        await asyncio.sleep(3 * daemon_mod.TRIM_DELAY_S)
        assert len(trims) == 2
