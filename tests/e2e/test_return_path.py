"""Address selection on one host (tests/containers/test_address_selection.py
has the same across network namespaces):

- a QP's peer that never connects back: the WR's IBV_WC_RETRY_EXC_ERR carries
  vendor_err NO_RETURN_LINK, the initiator's daemon logs ``peer_no_return`` once, and a
  trace subscriber gets a ``notice`` event (``softhca trace`` prints it); a peer that is
  simply gone gives RETRY_EXC_ERR with no such claim;
- two QPs of one daemon reached through a forwarded port the daemon cannot connect to
  itself (the forwarder stops taking connections once the client's are in, as a
  published container port is out of the daemon's reach): they connect all the same;
- ``sh.route_address`` and ``sh.embedded(peer=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import subprocess
import sys

import pytest

import softhca.client as sh
from softhca.protocol.records import VENDOR_ERR_NO_RETURN_LINK, WC

CLI = [sys.executable, "-m", "softhca.tools.cli"]
# ibv_qp_attr.timeout 8 (about 1 ms) and 2 retries: RETRY_EXC_ERR within a second.
FAST = {"timeout": 8, "retry_cnt": 2}


async def side(node: sh.Node):
    ctx = await node.open_device("mlx5_0")
    pd = await ctx.alloc_pd()
    cq = await ctx.create_cq(16)
    qp = await pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq))
    return pd, cq, qp


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def write_once(pd, cq, qp, rkey: int, addr: int) -> WC:
    src = await pd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE)
    wr = sh.SendWR(wr_id=7, opcode=sh.IBV_WR_RDMA_WRITE, sg=[sh.SGE(src.addr, 64, src.lkey)])
    wr.set_wr_rdma(rkey, addr)
    await qp.post_send(wr)
    [wc] = await cq.poll(timeout=20.0)
    return wc


async def test_a_peer_that_cannot_connect_back_is_named(caplog):
    caplog.set_level(logging.INFO, logger="softhca")
    async with sh.embedded() as target, sh.embedded() as initiator:
        tpd, _, tqp = await side(target)
        ipd, icq, iqp = await side(initiator)
        sub = await initiator.subscribe("trace", daemon_wide=True)
        dst = await tpd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE)
        # The target's QP is told the initiator is at a port where nothing listens: its
        # daemon cannot open the link back, as to a daemon listening on 127.0.0.1 of
        # another host.
        info = iqp.info()
        await tqp.connect(sh.QPInfo(info.host, closed_port(), info.dev, info.qp_num,
                                    info.psn))
        await iqp.connect(tqp.info(), **FAST)
        wc = await write_once(ipd, icq, iqp, dst.rkey, dst.addr)
        assert wc.status == sh.IBV_WC_RETRY_EXC_ERR
        assert wc.vendor_err == VENDOR_ERR_NO_RETURN_LINK == 0x5F01
        assert "vendor_err=0x5f01 (NO_RETURN_LINK: the peer's daemon never connected back" \
            in repr(wc)
        notice = await asyncio.wait_for(_next_notice(sub), 10)
    said = [r.getMessage() for r in caplog.records if "event=peer_no_return" in r.getMessage()]
    assert len(said) == 1, said
    assert f"peer={target.address}" in said[0] and f"listen={initiator.address}" in said[0]
    assert notice["event"] == "peer_no_return" and notice["qp"] == iqp.qp_num
    assert notice["peer"] == target.address and notice["vendor_err"] == 0x5F01
    assert f"never connected back to this daemon at {initiator.address}" in notice["message"]


async def _next_notice(sub) -> dict:
    async for ev in sub:
        if ev.kind == "notice":
            return ev.header
    raise AssertionError("the subscription ended")


async def test_a_peer_that_is_gone_is_not_called_unable_to_connect_back():
    async with sh.embedded() as initiator:
        ipd, icq, iqp = await side(initiator)
        info = iqp.info()
        await iqp.connect(sh.QPInfo(info.host, closed_port(), "mlx5_0", 0x123456, 0), **FAST)
        wc = await write_once(ipd, icq, iqp, 0x1234, 0)
    assert (wc.status, wc.vendor_err) == (sh.IBV_WC_RETRY_EXC_ERR, 0)


async def test_softhca_trace_prints_the_notice():
    async with sh.embedded() as target, sh.embedded() as initiator:
        trace = await asyncio.create_subprocess_exec(
            *CLI, "trace", "--target", initiator.address, "--no-color", "--seconds", "60",
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert b"attached" in await asyncio.wait_for(trace.stdout.readline(), 30)
        tpd, _, tqp = await side(target)
        ipd, icq, iqp = await side(initiator)
        dst = await tpd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE)
        info = iqp.info()
        await tqp.connect(sh.QPInfo(info.host, closed_port(), info.dev, info.qp_num,
                                    info.psn))
        await iqp.connect(tqp.info(), **FAST)
        assert (await write_once(ipd, icq, iqp, dst.rkey, dst.addr)).vendor_err == 0x5F01
        await asyncio.sleep(0.5)
        trace.send_signal(signal.SIGINT)     # Ctrl-C ends a trace (status 0)
        out, _ = await asyncio.wait_for(trace.communicate(), 30)
        assert trace.returncode == 0
    text = out.decode()
    assert f"QP {iqp.qp_num:#x} peer_no_return: the peer's daemon at {target.address} never " \
           f"connected back to this daemon at {initiator.address}" in text, text


@contextlib.asynccontextmanager
async def forwarder(upstream: str):
    """A port on 127.0.0.1 forwarded to ``upstream``; ``close()`` stops taking new
    connections and keeps relaying those it has."""
    host, port = upstream.rsplit(":", 1)

    async def pump(r, w):
        with contextlib.suppress(ConnectionError):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        w.close()

    async def forward(r, w):
        ur, uw = await asyncio.open_connection(host, int(port))
        tasks.append(asyncio.ensure_future(asyncio.gather(pump(r, uw), pump(ur, w))))

    tasks: list = []
    server = await asyncio.start_server(forward, "127.0.0.1", 0)
    try:
        yield server
    finally:
        server.close()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_qps_of_one_daemon_reached_through_a_forwarded_port():
    async with sh.embedded() as daemon_node:
        async with forwarder(daemon_node.address) as fwd:
            dialed = f"127.0.0.1:{fwd.sockets[0].getsockname()[1]}"
            a, b = await sh.connect(dialed), await sh.connect(dialed)
            # From now on the forwarded port takes no connection: the daemon cannot
            # reach itself there, as it cannot reach a port Docker publishes on the host.
            fwd.close()
            await fwd.wait_closed()
            try:
                apd, acq, aqp = await side(a)
                bpd, _, bqp = await side(b)
                assert aqp.info().port == bqp.info().port == int(dialed.rsplit(":")[1])
                dst = await bpd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE
                                       | sh.IBV_ACCESS_REMOTE_WRITE)
                await aqp.connect(bqp.info(), **FAST)
                await bqp.connect(aqp.info(), **FAST)
                src = await apd.reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE)
                await src.write(b"through a forwarded port")
                wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_RDMA_WRITE,
                               sg=[sh.SGE(src.addr, 24, src.lkey)])
                wr.set_wr_rdma(dst.rkey, dst.addr)
                await aqp.post_send(wr)
                [wc] = await acq.poll(timeout=20.0)
                assert wc.status == sh.IBV_WC_SUCCESS, wc
                assert await dst.read(24) == b"through a forwarded port"
            finally:
                await a.close()
                await b.close()


def test_route_address_is_the_source_address_towards_the_peer():
    assert sh.route_address("127.0.0.1:4791") == "127.0.0.1"
    with pytest.raises(sh.RDMAError) as e:
        sh.route_address("no-such-host.invalid:4791")
    assert e.value.errno_name == "EHOSTUNREACH"


async def test_embedded_with_a_peer_listens_where_the_peer_routes_back():
    async with sh.embedded(peer="127.0.0.2:4791") as node:
        assert node.daemon.host == sh.route_address("127.0.0.2:4791")
    async with sh.embedded() as node:
        assert node.daemon.host == "127.0.0.1"
