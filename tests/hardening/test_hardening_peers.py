"""Hardening, round two (peers and sessions): packet injection, pre-HELLO sockets, fault rules and
taps that belong to a session, the token file's mode.

Each test performs an attack and asserts that it is refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import signal
import socket
import subprocess
import sys
import time

import pytest
from test_hardening import read_frames

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, frame_bytes
from softhca.protocol.handshake import make_hello
from softhca.protocol.packets import Packet, packet_header
from softhca.server.daemon import PROCESS_PEER_TOKEN, host_class
from softhca.server.wire import loopback_source, peer_origins

from e2e import connect_pair, make_side, rdma, sge


async def wire_link(address: str, src: str | None, token: bytes | None = PROCESS_PEER_TOKEN):
    """A raw wire link past the HELLO, naming ``src`` as its daemon (or none); by default
    proving the peer token of this process's daemons (an insider, past the first check)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder(1 << 20)
    (challenge,) = await read_frames(reader, dec)
    writer.write(frame_bytes(make_hello(challenge.header, "wire", token, src)))
    (welcome,) = await read_frames(reader, dec)
    assert welcome.header["t"] == "welcome", welcome.header
    return writer


def forged_write(qpn: int, rkey: int, addr: int, data: bytes, sqp: int | None) -> bytes:
    h = packet_header("mlx5_0", Packet(qpn, 0, "RDMA_WRITE_ONLY", data,
                                       reth=(rkey, addr, len(data))))
    if sqp is not None:
        h["sqp"] = sqp
    return frame_bytes(h, data)


async def wait_counter(node, name: str, at_least: int) -> dict:
    for _ in range(200):
        c = await node.counters()
        if c[name] >= at_least:
            return c
        await asyncio.sleep(0.01)
    return c


async def test_an_injected_write_is_dropped_and_counted_and_the_victims_next_write_lands():
    async with sh.embedded() as inode, sh.embedded() as tnode, sh.embedded() as other:
        i, t = await make_side(inode), await make_side(tnode)
        await connect_pair(i, t)
        victim = await t.reg_mr(b"\x00" * 64)
        evil = b"INJECTED BY ATTACKER!"        # 21 bytes
        assert len(evil) == 21
        attacks = [
            # The attack: a wire link that names no daemon at all.
            (None, None),
            # Claiming another daemon's address, with the right source QP.
            (other.address, i.qp.qp_num),
            # The right daemon's address, another source QP.
            (inode.address, (i.qp.qp_num + 1) & 0xFFFFFF),
            # The right daemon's address and no source QP.
            (inode.address, None),
        ]
        for src, sqp in attacks:
            w = await wire_link(tnode.address, src)
            w.write(forged_write(t.qp.qp_num, victim.rkey, victim.addr, evil, sqp))
            await w.drain()
            w.close()
        c = await wait_counter(tnode, "packets_wrong_peer", len(attacks))
        assert c["packets_wrong_peer"] == len(attacks)
        assert await victim.read() == b"\x00" * 64, "the victim's data is intact"
        # The victim's own next write (PSN 0, as the forged one) lands: nothing was
        # taken for a duplicate.
        mine = b"the victim's own bytes"
        src_mr = await i.reg_mr(mine)
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src_mr)], victim.rkey,
                                  victim.addr, wr_id=7))
        (wc,) = await i.scq.poll_n(1, 10)
        assert (wc.wr_id, wc.status) == (7, sh.IBV_WC_SUCCESS)
        assert (await victim.read())[:len(mine)] == mine
        assert (await tnode.counters())["duplicates_discarded"] == 0


async def test_qp_numbers_and_key_variants_start_unpredictably():
    seen_qpn, seen_variant, seen_index = set(), set(), set()
    for _ in range(4):
        async with sh.embedded() as node:
            side = await make_side(node)
            mr = await side.reg_mr(16)
            qpn = side.qp.qp_num
            # Verbs formats: a 24-bit QPN, not QP0/QP1; the rkey's low 8 bits the variant.
            assert 1 < qpn < 1 << 24 and mr.rkey < 1 << 32 and mr.rkey == mr.lkey
            seen_qpn.add(qpn)
            seen_variant.add(mr.rkey & 0xFF)
            seen_index.add(mr.rkey >> 8)
    # Four daemons counting from fixed starts would give one value each; random starts
    # give four distinct 24-bit values but for a chance of about 4e-7.
    assert len(seen_qpn) == 4 and len(seen_index) == 4
    assert len(seen_variant) >= 2


async def test_a_separate_peer_token_keeps_client_tokens_off_the_wire_plane():
    async with sh.embedded(token=b"client-token", peer_token=b"peer-token") as node:
        # A client's token opens a control session, not a wire link.
        with pytest.raises(AssertionError, match="EACCES"):
            await wire_link(node.address, "127.0.0.1:1", b"client-token")
        w = await wire_link(node.address, "127.0.0.1:1", b"peer-token")
        w.close()
        # And the peer token is no client credential.
        with pytest.raises(sh.RDMAError) as e:
            await sh.connect(node.address, token=b"peer-token")
        assert e.value.errno_name == "EACCES"


async def test_idle_sockets_never_lock_out_a_token_holder_or_a_peer_daemon():
    from softhca.server.link import open_link

    async with sh.embedded(token=b"tok", peer_token=b"peer") as node:
        host, port = node.address.rsplit(":", 1)
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(1024)]
        await asyncio.sleep(0.05)
        d = node.daemon
        assert d.connections == 1, "sockets without a HELLO take no authenticated slot"
        assert len(d._pre_hello) <= d.limits.max_pre_hello
        t0 = time.perf_counter()
        client, link = await asyncio.gather(
            sh.connect(node.address, token=b"tok"),
            open_link(host, int(port), "wire", b"peer", timeout=5, max_frame=1 << 20,
                      src="127.0.0.1:1"))
        took = time.perf_counter() - t0
        print(f"\n1024 idle sockets: a token holder and a peer link got in within "
              f"{took * 1e3:.1f} ms; {d.counters['pre_hello_evicted']} idle sockets evicted")
        assert took < 2.0
        assert (await client.open_device()).name == "mlx5_0"
        assert link.welcome["role"] == "wire"
        assert d.counters["pre_hello_evicted"] >= 1024 - d.limits.max_pre_hello
        link.writer.close()
        await client.close()
        for _, w in idle:
            w.close()


async def test_a_socket_that_never_says_hello_is_closed_after_the_short_timeout():
    from softhca.server.daemon import Limits

    async with sh.embedded(limits=Limits(hello_timeout=0.2)) as node:
        host, port = node.address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        dec = FrameDecoder(1 << 20)
        (challenge,) = await read_frames(reader, dec)
        t0 = time.perf_counter()
        (err,) = await read_frames(reader, dec)
        assert err.header["errno"] == "ETIMEDOUT" and time.perf_counter() - t0 < 1.0
        writer.close()


# -- the token file and the no-auth warning ----------------------------------------------

def serve_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softhca.tools.cli", "serve", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_world_readable_token_file_is_refused_unless_allowed(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    r = serve_cli("--listen", "127.0.0.1:0", "--token-file", str(token))
    assert r.returncode == 2
    assert "readable by every user (mode 0644)" in r.stderr and "chmod o-rw" in r.stderr
    peer = tmp_path / "peer"
    peer.write_text("peer\n")
    peer.chmod(0o646)
    token.chmod(0o600)
    r = serve_cli("--listen", "127.0.0.1:0", "--token-file", str(token),
                  "--peer-token-file", str(peer))
    assert r.returncode == 2 and "--peer-token-file" in r.stderr and "readable" in r.stderr
    # Allowed by name: the daemon starts (and stops at SIGTERM).
    token.chmod(0o644)
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                             "127.0.0.1:0", "--token-file", str(token),
                             "--allow-readable-token", "--ready-file", str(ready)],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


@pytest.mark.parametrize("listen, words", [("127.0.0.1:0", "any local process"),
                                           ("0.0.0.0:0", "any host that can reach 0.0.0.0:")])
def test_the_no_auth_warning_names_who_can_reach_the_daemon(tmp_path, listen, words):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                             listen, "--allow-no-auth", "--ready-file", str(ready)],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    log = proc.stderr.read()
    (line,) = [x for x in log.splitlines() if "event=no_auth" in x]
    assert words in line, line


# -- fault rules belong to a session -------------------------------------------------------

async def test_a_sessions_fault_rules_match_its_own_qps_and_go_with_it():
    async with sh.embedded() as inode, sh.embedded() as tnode:
        i, t = await make_side(inode), await make_side(tnode)
        await connect_pair(i, t)
        src = await i.reg_mr(b"x" * 4096)
        dst = await t.reg_mr(4096)
        # Another session on the initiator's daemon drops everything, on every QP: its
        # rule matches its own QPs only, so the pair's traffic is untouched.
        other = await sh.connect(inode.address)
        rule = await other.faults.add(action="drop")
        assert rule["daemon_wide"] is False
        assert await i.node.faults.list() == [], "another session's rule is not ours"
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey, dst.addr,
                                  wr_id=1))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_SUCCESS
        c = await inode.counters()
        assert c["retransmissions"] == 0 and c["fault_rules"] == 1
        # It goes with its session.
        await other.close()
        for _ in range(200):
            if (await inode.counters())["fault_rules"] == 0:
                break
            await asyncio.sleep(0.01)
        assert (await inode.counters())["fault_rules"] == 0
        # A daemon-wide rule is asked for by name and reaches every session's QPs.
        other = await sh.connect(inode.address)
        wide = await other.faults.add(action="drop", count=1, daemon_wide=True)
        assert wide["daemon_wide"] is True
        await other.close()
        assert [r["id"] for r in await i.node.faults.list()] == [wide["id"]]
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey, dst.addr,
                                  wr_id=2))
        (wc,) = await i.scq.poll_n(1, 20)
        assert wc.status == sh.IBV_WC_SUCCESS
        assert (await i.node.faults.list())[0]["fired"] == 1, "it outlived its session"
        assert await i.node.faults.clear(daemon_wide=True) == 1


async def test_the_rule_count_is_bounded():
    from softhca.server.faults import MAX_RULES

    async with sh.embedded() as node:
        for n in range(MAX_RULES):
            await node.faults.add(action="delay", seconds=0, qp=n + 2)
        with pytest.raises(sh.RDMAError) as e:
            await node.faults.add(action="drop")
        assert e.value.errno_name == "ENOMEM" and f"{MAX_RULES} rules" in e.value.message
        assert await node.faults.clear() == MAX_RULES


async def send_latency(i, t, src, dst, n: int) -> float:
    t0 = time.perf_counter()
    for k in range(n):
        await t.qp.post_recv(sh.RecvWR(wr_id=k, sg=[sge(dst)]))
        await i.qp.post_send(sh.SendWR(wr_id=k, opcode=sh.IBV_WR_SEND, sg=[sge(src)]))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_SUCCESS
        await t.rcq.poll_n(1, 10)
    return (time.perf_counter() - t0) / n


async def test_rules_that_cannot_match_cost_nothing():
    """20,000 no-op rules once raised SEND latency 25-fold; now a daemon holds at
    most MAX_RULES, and those on other QPs or opcodes are never looked at."""
    from softhca.server.faults import MAX_RULES

    async with sh.embedded() as inode, sh.embedded() as tnode:
        i, t = await make_side(inode), await make_side(tnode)
        await connect_pair(i, t)
        src, dst = await i.reg_mr(b"s" * 64), await t.reg_mr(64)
        await send_latency(i, t, src, dst, 20)         # warm up
        base = await send_latency(i, t, src, dst, 100)
        daemon = inode.daemon
        # Installed directly: MAX_RULES rules through the control path would only slow
        # the test. Half on other QPs, half on this QP's READ responses (never sent).
        for n in range(MAX_RULES // 2):
            daemon.faults.add({"action": "delay", "seconds": 0,
                               "qp": (i.qp.qp_num + 1 + n) % (1 << 24)})
            daemon.faults.add({"action": "delay", "seconds": 0, "qp": i.qp.qp_num,
                               "opcode": "RDMA_READ_RESPONSE"})
        looked_at = []
        matches = daemon.faults._matches
        daemon.faults._matches = lambda r, *a: looked_at.append(r) or matches(r, *a)
        loaded = await send_latency(i, t, src, dst, 100)
        assert looked_at == [], "no rule that cannot match is even looked at"
        print(f"\nSEND round trip: {base * 1e3:.2f} ms without rules, {loaded * 1e3:.2f} ms "
              f"with {len(daemon.faults.rules)} rules that cannot match")
        assert loaded < base * 2 + 0.002
        assert all(r.fired == 0 for r in daemon.faults.rules)


# -- taps show a session its own traffic --------------------------------------------------

async def test_a_packet_or_trace_subscriber_sees_only_its_own_sessions_qps():
    async with sh.embedded() as inode, sh.embedded() as tnode:
        i, t = await make_side(inode), await make_side(tnode)
        await connect_pair(i, t)
        secret = b"another session's payload"
        src, dst = await i.reg_mr(secret), await t.reg_mr(len(secret))
        spy = await sh.connect(tnode.address)
        spy_sub = await spy.subscribe("packets", "trace")
        own_sub = await t.node.subscribe("packets", "trace")
        wide = await sh.connect(tnode.address)
        wide_sub = await wide.subscribe("packets", "trace", daemon_wide=True)
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey, dst.addr))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_SUCCESS

        async def drain(sub):
            out = []
            while (ev := await sub.next(0.3)) is not None:
                out.append(ev)
            return out

        spied, own, seen = await drain(spy_sub), await drain(own_sub), await drain(wide_sub)
        assert spied == [], "a session sees no other session's traffic"
        for evs in (own, seen):
            kinds = {e.kind for e in evs}
            assert kinds == {"packet", "trace"}, kinds
            assert any(secret in bytes(e.data) for e in evs if e.kind == "packet")
        await spy.close()
        await wide.close()


def test_the_wire_check_compares_hosts_as_addresses():
    assert host_class("127.0.0.1") == host_class("::1") == host_class("localhost") \
        == host_class("::ffff:127.0.0.1") == "loopback"
    # Another loopback address is a host of its own: the address a softhca run daemon
    # takes on one machine (its links leave from it).
    assert host_class("127.0.0.2") == "127.0.0.2" != host_class("127.0.0.3")
    assert host_class("::ffff:10.200.0.2") == host_class("10.200.0.2") == "10.200.0.2"
    assert host_class("10.200.0.2") != host_class("10.200.0.3")
    # A daemon dialed at a loopback address may send from 127.0.0.1 (a wildcard one).
    assert peer_origins("127.0.0.2", 4791) == {("127.0.0.2", 4791), ("loopback", 4791)}
    assert peer_origins("10.200.0.2", 4791) == {("10.200.0.2", 4791)}
    assert loopback_source("127.0.0.2:4791", "127.0.0.3") == "127.0.0.2"
    assert loopback_source("127.0.0.1:4791", "127.0.0.3") is None
    assert loopback_source("127.0.0.2:4791", "10.200.0.1") is None
    assert loopback_source("0.0.0.0:4791", "127.0.0.3") is None


async def test_a_qp_connected_by_host_name_takes_its_peers_packets_once_resolved():
    name = socket.gethostname()
    if not all(ipaddress.ip_address(i[4][0]).is_loopback for i in socket.getaddrinfo(name, 1)):
        pytest.skip(f"this host's name {name} does not resolve to loopback")
    async with sh.embedded() as inode, sh.embedded() as tnode:
        i, t = await make_side(inode), await make_side(tnode)
        # The host's name is not an address: the daemons resolve it (WirePlane.set_origins, server/wire.py).
        ti, it = t.qp.info(), i.qp.info()
        await i.qp.connect(sh.QPInfo(name, ti.port, ti.dev, ti.qp_num, ti.psn))
        await t.qp.connect(sh.QPInfo(name, it.port, it.dev, it.qp_num, it.psn))
        src, dst = await i.reg_mr(b"resolved" * 8), await t.reg_mr(64)
        await asyncio.sleep(0.1)
        await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey, dst.addr))
        (wc,) = await i.scq.poll_n(1, 10)
        assert wc.status == sh.IBV_WC_SUCCESS and await dst.read() == b"resolved" * 8
        assert (await tnode.counters())["packets_wrong_peer"] == 0
        assert (await inode.counters())["packets_wrong_peer"] == 0
