"""``serve --rc-window N``: the packets an RC requester may have unacknowledged.

The window's effect on one requester is checked packet by packet in test_trains.py; here
two real ``softhca serve`` processes take the option, and whole messages of many times
the window cross intact both ways, with nothing retransmitted. A value out of bounds is
refused before the daemon starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import softhca.client as sh
from softhca.engine.hca import DEFAULT_RC_WINDOW, RC_WINDOW_MAX, RC_WINDOW_MIN
from softhca.engine.rc_responder import ACK_EVERY
from softhca.tools.daemons import Daemons

from e2e import connect_pair, make_side, rdma, sge

CLI = [sys.executable, "-m", "softhca.tools.cli"]
SIZE = 1 << 20


@pytest.mark.parametrize("window", ["16", "128"])
async def test_messages_far_larger_than_the_window_cross_intact(tmp_path, window):
    """1 MiB at MTU 1024 is 1,024 packets: 64 windows of the smallest, 8 of rxe's."""
    with Daemons(2, str(tmp_path), ("--rc-window", window)) as (ta, ia):
        tnode, inode = await sh.connect(ta), await sh.connect(ia)
        target, initiator = await make_side(tnode), await make_side(inode)
        await connect_pair(target, initiator, mtu=sh.IBV_MTU_1024)
        src, back = os.urandom(SIZE), os.urandom(SIZE)
        local = await initiator.pd.reg_mr(SIZE, sh.IBV_ACCESS_LOCAL_WRITE)
        await local.write(src)
        remote = await target.pd.reg_mr(SIZE, sh.IBV_ACCESS_LOCAL_WRITE
                                        | sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_REMOTE_READ)
        await initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(local)], remote.rkey,
                                          remote.addr, 1))
        (wc,) = await initiator.send_wc()
        assert wc.status == sh.IBV_WC_SUCCESS
        assert bytes(await remote.read(SIZE)) == src
        await remote.write(back)
        await initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_READ, [sge(local)], remote.rkey,
                                          remote.addr, 2))
        (wc,) = await initiator.send_wc()
        assert wc.status == sh.IBV_WC_SUCCESS
        assert bytes(await local.read(SIZE)) == back
        # A SEND of the same size the other way: the target's requester has the window too.
        await initiator.qp.post_recv(sh.RecvWR(wr_id=3, sg=[sge(local)]))
        await target.qp.post_send(sh.SendWR(wr_id=4, opcode=sh.IBV_WR_SEND, sg=[sge(remote)]))
        assert (await target.send_wc())[0].status == sh.IBV_WC_SUCCESS
        assert (await initiator.recv_wc())[0].byte_len == SIZE
        assert bytes(await local.read(SIZE)) == back
        for node in (tnode, inode):
            c = await node.counters()
            assert c["retransmitted_packets"] == 0 and c["ack_timeouts"] == 0, c
            await node.close()


def test_the_default_window_and_its_bounds():
    # 4 MiB at MTU 4096, the bench's most bytes in flight per QP; no smaller than the
    # responder's ACK cadence (our packets carry no AckReq); far below half the 24-bit
    # PSN space.
    assert DEFAULT_RC_WINDOW == 1024
    assert RC_WINDOW_MIN >= ACK_EVERY
    assert RC_WINDOW_MAX * 4096 <= 64 << 20 and RC_WINDOW_MAX < 1 << 22


@pytest.mark.parametrize("bad", ["0", "-1", "15", str(RC_WINDOW_MAX + 1), "1.5", "lots", "8388608"])
def test_serve_refuses_a_window_out_of_bounds(bad, tmp_path):
    proc = subprocess.run([*CLI, "serve", "--listen", "127.0.0.1:0", "--rc-window", bad],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc
    assert "--rc-window" in proc.stderr and bad in proc.stderr, proc.stderr
