"""UD and UC QPs between two daemons, through the async client only.

Expected values are built here, not by softhca: the GRH is struct-packed from the two
daemons' GIDs (fe80::<IPv4>:<port>:<device index>, as ``query_gid`` documents) with
the IPv6 header layout of RFC 8200 and the header sizes of IBTA 9.2/9.3 (UDP 8, BTH
12, DETH 8, ImmDt 4, ICRC 4, payload padded to 4 bytes), as Linux rxe's prepare6
fills it (traffic class and hop limit from the AH, flow label 0, next header 17).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import tracemalloc
from dataclasses import dataclass

import pytest

import softhca.client as sh
from softhca.protocol.errors import RDMAError

QKEY = 0x11223344
WAIT = 5.0
QUIET = 0.3
ACCESS = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE


@dataclass
class End:
    node: sh.Node
    pd: sh.PD
    scq: sh.CQ
    rcq: sh.CQ
    qp: sh.QP
    mr: sh.MR

    async def recv(self, wr_id: int, length: int, offset: int = 0) -> None:
        await self.qp.post_recv(sh.RecvWR(wr_id=wr_id, sg=[
            sh.SGE(self.mr.addr + offset, length, self.mr.lkey)]))


async def end(node: sh.Node, qp_type: int, depth: int = 64) -> End:
    ctx = await node.open_device("mlx5_0")
    pd = await ctx.alloc_pd()
    scq, rcq = await ctx.create_cq(4096), await ctx.create_cq(4096)
    qp = await pd.create_qp(sh.QPInitAttr(qp_type=qp_type, scq=scq, rcq=rcq, cap=sh.QPCap(
        max_send_wr=depth, max_recv_wr=depth, max_send_sge=2, max_recv_sge=2)))
    return End(node, pd, scq, rcq, qp, await pd.reg_mr(1 << 16, ACCESS))


def gid(node: sh.Node) -> bytes:
    """Device 0's GID, written from its documented form."""
    return (bytes.fromhex("fe80000000000000") + socket.inet_aton(node.host)
            + struct.pack(">HH", node.port, 0))


def expected_grh(src: sh.Node, dst: sh.Node, payload: int, imm: bool, tclass: int = 0,
                 hop: int = 64) -> bytes:
    udp_len = 8 + 12 + 8 + (4 if imm else 0) + payload + (-payload % 4) + 4
    return struct.pack(">IHBB", (6 << 28) | (tclass << 20), udp_len, 17, hop) \
        + gid(src) + gid(dst)


def ud_wr(wr_id, a: End, length, ah, qpn, qkey=QKEY, **kw) -> sh.SendWR:
    wr = sh.SendWR(wr_id=wr_id, sg=[sh.SGE(a.mr.addr, length, a.mr.lkey)], **kw)
    wr.set_wr_ud(ah, qpn, qkey)
    return wr


async def nothing(cq: sh.CQ) -> None:
    assert await cq.poll(16, QUIET) == []


@pytest.fixture
async def ud():
    async with sh.embedded() as na, sh.embedded() as nb:
        a, b = await end(na, sh.IBV_QPT_UD), await end(nb, sh.IBV_QPT_UD)
        await a.qp.ready(QKEY)
        await b.qp.ready(QKEY)
        yield a, b


async def test_ud_ping_pong_grh_src_qp_and_reply_ah(ud):
    a, b = ud
    ah = await a.pd.create_ah(b.qp.info(), traffic_class=0x28, hop_limit=9)
    msg = bytes(range(7, 107))                  # 100 bytes
    await a.mr.write(msg)
    await b.recv(1, 40 + 200)
    await a.qp.post_send(ud_wr(11, a, len(msg), ah, b.qp.qp_num))
    (sw,) = await a.scq.poll_n(1, WAIT)
    assert (sw.wr_id, sw.status, sw.opcode) == (11, sh.IBV_WC_SUCCESS, sh.IBV_WC_SEND)
    (rw,) = await b.rcq.poll_n(1, WAIT)
    assert rw.status == sh.IBV_WC_SUCCESS and rw.opcode == sh.IBV_WC_RECV
    assert rw.byte_len == 40 + 100 and rw.src_qp == a.qp.qp_num
    assert rw.wc_flags == sh.IBV_WC_GRH
    buf = await b.mr.read(140)
    assert buf[:40] == expected_grh(a.node, b.node, 100, False, 0x28, 9)
    assert buf[40:] == msg
    # The pong, through an AH made from the ping's WC and GRH, with immediate data and
    # an odd length (the UDP length counts the pad to 4 bytes).
    back = await b.pd.create_ah_from_wc(rw, buf[:40], dest_dev="mlx5_0")
    assert back.dgid == gid(a.node) and back.sgid == gid(b.node)
    await b.mr.write(b"pong!", 4096)
    await a.recv(2, 40 + 5, 8192)
    wr = sh.SendWR(wr_id=12, opcode=sh.IBV_WR_SEND_WITH_IMM, imm_data=0xCAFE,
                   sg=[sh.SGE(b.mr.addr + 4096, 5, b.mr.lkey)])
    wr.set_wr_ud(back, rw.src_qp, QKEY)
    await b.qp.post_send(wr)
    (pw,) = await a.rcq.poll_n(1, WAIT)
    assert pw.src_qp == b.qp.qp_num and pw.imm_data == 0xCAFE and pw.byte_len == 45
    assert pw.wc_flags == sh.IBV_WC_GRH | sh.IBV_WC_WITH_IMM
    # ibv_init_ah_from_wc's reply AH: hop limit 0xFF, the ping's traffic class.
    assert (await a.mr.read(45, 8192)) == expected_grh(b.node, a.node, 5, True, 0x28, 0xFF) \
        + b"pong!"


async def test_ud_qkey_mismatch_drops_and_high_bit_uses_the_qps_own(ud):
    a, b = ud
    ah = await a.pd.create_ah(b.qp.info())
    await b.recv(1, 4096)
    await a.qp.post_send(ud_wr(1, a, 8, ah, b.qp.qp_num, qkey=QKEY ^ 1))
    assert (await a.scq.poll_n(1, WAIT))[0].status == sh.IBV_WC_SUCCESS
    await nothing(b.rcq)
    # Bit 31 set: the sending QP's own Q_Key (QKEY), which matches.
    await a.qp.post_send(ud_wr(2, a, 8, ah, b.qp.qp_num, qkey=0x80000000))
    (rw,) = await b.rcq.poll_n(1, WAIT)
    assert rw.wr_id == 1 and rw.byte_len == 48


async def test_ud_mtu_bound_no_receive_and_small_receive_are_silent(ud):
    a, b = ud
    ah = await a.pd.create_ah(b.qp.info())
    await b.recv(1, 40 + 100)
    # Over the port MTU (4096): no packet, and still SUCCESS (IBTA C10-93.1.1, rxe).
    await a.qp.post_send(ud_wr(1, a, 4097, ah, b.qp.qp_num))
    # Larger than the receive: dropped, the receive stays posted (rxe class D).
    await a.qp.post_send(ud_wr(2, a, 101, ah, b.qp.qp_num))
    assert [w.status for w in await a.scq.poll_n(2, WAIT)] == [sh.IBV_WC_SUCCESS] * 2
    await nothing(b.rcq)
    await a.qp.post_send(ud_wr(3, a, 4096 - 40 - 56, ah, b.qp.qp_num))  # fits the MTU
    await a.qp.post_send(ud_wr(4, a, 100, ah, b.qp.qp_num))             # fits the receive
    await a.scq.poll_n(2, WAIT)
    (rw,) = await b.rcq.poll_n(1, WAIT)
    assert rw.wr_id == 1 and rw.byte_len == 140
    await nothing(b.rcq)        # the 4000-byte one found no receive: dropped


async def test_ud_loss_under_a_fault_rule_is_simply_loss(ud):
    a, b = ud
    ah = await a.pd.create_ah(b.qp.info())
    await b.recv(1, 4096)
    await a.node.faults.add(action="drop", opcode="UD_SEND_ONLY", count=1)
    for wr_id in (1, 2):
        await a.qp.post_send(ud_wr(wr_id, a, 16, ah, b.qp.qp_num))
    assert [w.status for w in await a.scq.poll_n(2, WAIT)] == [sh.IBV_WC_SUCCESS] * 2
    (rw,) = await b.rcq.poll_n(1, WAIT)
    assert rw.wr_id == 1
    await nothing(b.rcq)
    assert (await a.node.faults.list())[0]["fired"] == 1


@pytest.fixture
async def uc():
    async with sh.embedded() as na, sh.embedded() as nb:
        a, b = await end(na, sh.IBV_QPT_UC), await end(nb, sh.IBV_QPT_UC)
        await a.qp.connect(b.qp.info(), path_mtu=sh.IBV_MTU_1024)
        await b.qp.connect(a.qp.info(), path_mtu=sh.IBV_MTU_1024)
        yield a, b


def write_wr(wr_id, a: End, length, b: End, offset=0, **kw) -> sh.SendWR:
    wr = sh.SendWR(wr_id=wr_id, sg=[sh.SGE(a.mr.addr, length, a.mr.lkey)], **kw)
    wr.set_wr_rdma(b.mr.rkey, b.mr.addr + offset)
    return wr


async def test_uc_write_and_send_and_no_read(uc):
    a, b = uc
    data = bytes((i * 7) % 251 for i in range(3000))         # three packets at MTU 1024
    await a.mr.write(data)
    await a.qp.post_send(write_wr(1, a, 3000, b, opcode=sh.IBV_WR_RDMA_WRITE))
    await b.recv(5, 4096, 8192)
    await a.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND_WITH_IMM, imm_data=7,
                                   sg=[sh.SGE(a.mr.addr, 2500, a.mr.lkey)]))
    assert [(w.wr_id, w.opcode) for w in await a.scq.poll_n(2, WAIT)] == [
        (1, sh.IBV_WC_RDMA_WRITE), (2, sh.IBV_WC_SEND)]
    (rw,) = await b.rcq.poll_n(1, WAIT)
    assert (rw.wr_id, rw.byte_len, rw.imm_data, rw.src_qp) == (5, 2500, 7, 0)
    assert await b.mr.read(3000) == data and await b.mr.read(2500, 8192) == data[:2500]
    for op in (sh.IBV_WR_RDMA_READ, sh.IBV_WR_ATOMIC_FETCH_AND_ADD):
        with pytest.raises(RDMAError) as ex:
            await a.qp.post_send(write_wr(3, a, 8, b, opcode=op))
        assert ex.value.errno_name == "EINVAL"


async def test_uc_lost_packet_loses_its_message_only(uc):
    a, b = uc
    await a.mr.write(b"\x5a" * 3000)
    await a.node.faults.add(action="drop", opcode="UC_RDMA_WRITE_MIDDLE", count=1)
    await a.qp.post_send(write_wr(1, a, 3000, b, opcode=sh.IBV_WR_RDMA_WRITE))
    await a.qp.post_send(write_wr(2, a, 1000, b, 4096, opcode=sh.IBV_WR_RDMA_WRITE))
    # Both complete: nothing is acknowledged or retried.
    assert [w.status for w in await a.scq.poll_n(2, WAIT)] == [sh.IBV_WC_SUCCESS] * 2
    await asyncio.sleep(QUIET)
    assert await b.mr.read(3000) == bytes(3000)                 # the cut message: nothing
    assert await b.mr.read(1000, 4096) == b"\x5a" * 1000        # the next one: whole


async def test_ah_of_another_session_is_refused_and_handles_are_not_counted(ud):
    a, b = ud
    ah = await a.pd.create_ah(b.qp.info())
    other = await a.pd.create_ah(b.qp.info())
    assert abs(other.handle - ah.handle) != 1
    # The same daemon, another control session: a's handle means nothing there.
    async with await sh.connect(f"{a.node.host}:{a.node.port}") as intruder:
        c = await end(intruder, sh.IBV_QPT_UD)
        await c.qp.ready(QKEY)
        with pytest.raises(RDMAError) as ex:
            await c.qp.post_send(ud_wr(1, c, 8, ah.handle, b.qp.qp_num))
        assert ex.value.errno_name == "ENOENT"
    # An AH of another PD of the same session is EINVAL.
    pd2 = await a.pd.ctx.alloc_pd()
    foreign = await pd2.create_ah(b.qp.info())
    with pytest.raises(RDMAError) as ex:
        await a.qp.post_send(ud_wr(2, a, 8, foreign, b.qp.qp_num))
    assert ex.value.errno_name == "EINVAL"


async def test_ud_flood_to_a_qp_without_receives_keeps_no_memory(ud):
    a, b = ud
    ah = await a.pd.create_ah(b.qp.info())
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for round_ in range(8):
            await a.qp.post_send([ud_wr(round_ * 64 + i, a, 4096, ah, b.qp.qp_num)
                                  for i in range(64)])
            await a.scq.poll_n(64, WAIT)
        await asyncio.sleep(QUIET)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    counters = await b.node.counters()
    assert counters["packets_received"] >= 512
    # 2 MiB arrived; what stays is bookkeeping, not the datagrams.
    assert grown < 512 << 10, grown
    await nothing(b.rcq)


async def test_ud_and_uc_capture_as_rocev2_with_deth(ud, tmp_path, tshark):
    """The receiving daemon's capture (serve --capture's tap), decoded by tshark: the
    IBTA opcode numbers, the DETH's Q_Key and source QP, nothing malformed."""
    import subprocess

    from softhca.server.capture import CaptureTap

    a, b = ud
    pcap = tmp_path / "ud.pcap"
    tap = CaptureTap(b.node.daemon, pcap)
    try:
        ah = await a.pd.create_ah(b.qp.info())
        await b.recv(1, 4096)
        await b.recv(2, 4096)
        await a.qp.post_send(ud_wr(1, a, 33, ah, b.qp.qp_num))
        await a.qp.post_send(ud_wr(2, a, 8, ah, b.qp.qp_num, opcode=sh.IBV_WR_SEND_WITH_IMM,
                                   imm_data=5))
        await b.rcq.poll_n(2, WAIT)
        c, d = await end(a.node, sh.IBV_QPT_UC), await end(b.node, sh.IBV_QPT_UC)
        await c.qp.connect(d.qp.info())
        await d.qp.connect(c.qp.info())
        await c.qp.post_send(write_wr(3, c, 1500, d, opcode=sh.IBV_WR_RDMA_WRITE))
        await c.scq.poll_n(1, WAIT)
        await asyncio.sleep(QUIET)
    finally:
        tap.close()
    fields = ("infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.deth.q_key",
              "infiniband.deth.srcqp")
    out = subprocess.run([tshark, "-n", "-r", str(pcap), "-T", "fields",
                          *[x for f in fields for x in ("-e", f)]],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split("\t") for line in out.splitlines()]
    # IBTA 9.2: UD SEND ONLY 0x64 (100), with immediate 0x65; UC RDMA WRITE FIRST 0x26,
    # LAST 0x28 (38, 40).
    assert [(int(r[0]), int(r[1], 16)) for r in rows] == [
        (100, b.qp.qp_num), (101, b.qp.qp_num), (38, d.qp.qp_num), (40, d.qp.qp_num)]
    for r in rows[:2]:
        assert (int(r[2], 16), int(r[3], 16)) == (QKEY, a.qp.qp_num)
    bad = subprocess.run([tshark, "-n", "-r", str(pcap), "-Y", "_ws.malformed"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert bad.strip() == ""


async def test_trace_and_packet_events_show_ud_and_uc(ud):
    """What ``softhca trace`` follows (the "trace" events) and a "packets" subscriber see
    of a UD send and a UC write: the receiver's scatter of GRH + payload, the UC write's
    stage at its rkey, and each packet with its IBTA opcode."""
    a, b = ud
    sub = await b.node.subscribe("trace", "packets", daemon_wide=True)
    ah = await a.pd.create_ah(b.qp.info())
    await b.recv(1, 4096)
    await a.qp.post_send(ud_wr(1, a, 24, ah, b.qp.qp_num))
    await b.rcq.poll_n(1, WAIT)
    c, d = await end(a.node, sh.IBV_QPT_UC), await end(b.node, sh.IBV_QPT_UC)
    await c.qp.connect(d.qp.info())
    await d.qp.connect(c.qp.info())
    await c.qp.post_send(write_wr(2, c, 100, d, opcode=sh.IBV_WR_RDMA_WRITE))
    await c.scq.poll_n(1, WAIT)
    seen = []
    while (ev := await sub.next(QUIET)) is not None:
        seen.append(ev)
    ops = [ev.header["pkt"]["op"] for ev in seen if ev.kind == "packet"]
    assert ops == ["UD_SEND_ONLY", "UC_RDMA_WRITE_ONLY"]
    stages = {(ev.header.get("qp"), ev.header.get("op"), ev.header.get("role"))
              for ev in seen if ev.kind == "trace"}
    assert (b.qp.qp_num, "RECV", "responder") in stages
    assert (d.qp.qp_num, "RDMA_WRITE", "responder") in stages


async def test_uc_zero_length_write_with_imm_checks_no_rkey(uc):
    """A zero-length UC RDMA_WRITE_WITH_IMM with rkey 0 names no memory (IBTA C9-88, as
    rxe): it takes a receive, byte_len 0, its immediate; one byte through rkey 0 is
    dropped, as any UC write its rkey refuses."""
    a, b = uc
    await b.recv(5, 64)
    wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_RDMA_WRITE_WITH_IMM, sg=[], imm_data=9)
    wr.set_wr_rdma(0, 0)
    await a.qp.post_send(wr)
    assert (await a.scq.poll_n(1, WAIT))[0].status == sh.IBV_WC_SUCCESS
    (rw,) = await b.rcq.poll_n(1, WAIT)
    assert (rw.wr_id, rw.status, rw.opcode, rw.byte_len, rw.imm_data) == (
        5, sh.IBV_WC_SUCCESS, sh.IBV_WC_RECV_RDMA_WITH_IMM, 0, 9)
    await b.recv(6, 64)
    wr = sh.SendWR(wr_id=2, opcode=sh.IBV_WR_RDMA_WRITE_WITH_IMM,
                   sg=[sh.SGE(a.mr.addr, 1, a.mr.lkey)], imm_data=10)
    wr.set_wr_rdma(0, 0)
    await a.qp.post_send(wr)
    assert (await a.scq.poll_n(1, WAIT))[0].status == sh.IBV_WC_SUCCESS
    await nothing(b.rcq)


async def test_ud_wr_complete_posts_all_or_nothing():
    """ibv_wr_post(3): none of a posting reaches the queue unless ibv_wr_complete
    succeeds. On a UD QP of max_send_wr 2 (ibv_create_qp(3): the WRs the send queue
    holds) a run of 3 fails ENOMEM, and a run whose second WR has no address handle
    (ibv_wr_set_ud_addr is mandatory on UD) fails EINVAL; neither sends or completes
    anything, and the receiver gets only the run after them."""
    async with sh.embedded() as na, sh.embedded() as nb:
        a, b = await end(na, sh.IBV_QPT_UD, depth=2), await end(nb, sh.IBV_QPT_UD)
        await a.qp.ready(QKEY)
        await b.qp.ready(QKEY)
        ah = await a.pd.create_ah(b.qp.info())
        for k in range(4):
            await b.recv(k, 40 + 8, 64 * k)
        signaled = sh.IBV_SEND_SIGNALED
        err = await refused_error(a.qp.post_send(
            [ud_wr(k, a, 8, ah, b.qp.qp_num, send_flags=signaled) for k in range(3)],
            wr_complete=True))
        assert (err.errno_name, err.bad_wr) == ("ENOMEM", None), err
        no_ah = sh.SendWR(wr_id=1, sg=[sh.SGE(a.mr.addr, 8, a.mr.lkey)], send_flags=signaled)
        err = await refused_error(a.qp.post_send(
            [ud_wr(0, a, 8, ah, b.qp.qp_num, send_flags=signaled), no_ah], wr_complete=True))
        assert (err.errno_name, err.bad_wr) == ("EINVAL", None), err
        await nothing(a.scq)
        await nothing(b.rcq)
        await a.qp.post_send([ud_wr(k, a, 8, ah, b.qp.qp_num, send_flags=signaled)
                              for k in (7, 8)], wr_complete=True)
        assert [(w.wr_id, w.status) for w in await a.scq.poll_n(2, WAIT)] == \
            [(7, sh.IBV_WC_SUCCESS), (8, sh.IBV_WC_SUCCESS)]
        assert [(w.wr_id, w.byte_len) for w in await b.rcq.poll_n(2, WAIT)] == \
            [(0, 48), (1, 48)]
        await nothing(a.scq)
        await nothing(b.rcq)


async def refused_error(call) -> RDMAError:
    with pytest.raises(RDMAError) as e:
        await call
    return e.value
