"""Fair shares: one credential cannot take every connection slot, nor a device-wide pool,
nor the daemon's memory.

The daemon is a ``softhca serve`` process whose token file names two tenants (one token
per line), A and B: each is a credential with its own shares.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from test_hardening import read_frames

import softhca.client as sh
from softhca.protocol.frames import FrameDecoder, frame_bytes
from softhca.protocol.handshake import make_hello
from softhca.tools.daemons import Daemons
from softhca.tools.soak import rss

from e2e import pd_and_cq

A, B = b"tenant-a-token-0123456789", b"tenant-b-token-9876543210"


def tenants_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(A + b"\n" + B + b"\n")
    return path


async def half_frame(address: str, token: bytes):
    """A control session logged in with ``token`` that then sends half a frame; the
    answer to its HELLO ("welcome" or the error's errno) and the socket."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder(1 << 20)
    (challenge,) = await read_frames(reader, dec)
    writer.write(frame_bytes(make_hello(challenge.header, "control", token)))
    (answer,) = await read_frames(reader, dec)
    if answer.header["t"] == "welcome":
        writer.write(frame_bytes({"t": "devices", "id": 1})[:7])
        return "welcome", reader, writer, dec
    return answer.header["errno"], reader, writer, dec


async def test_a_second_credential_gets_in_while_one_holds_256_stalled_slots(tmp_path):
    """The attack: tenant A logs in as many connections as it can, each stalled after
    half a frame. A gets 256 (its share) and EBUSY after; B gets in at once; A's stalled
    slots are closed at the frame deadline."""
    extra = ("--token-file", str(tenants_file(tmp_path)), "--frame-deadline", "2")
    with Daemons(1, str(tmp_path), extra) as (address,):
        t0 = time.perf_counter()
        held = [await half_frame(address, A) for _ in range(257)]
        took = time.perf_counter() - t0
        answers = [h[0] for h in held]
        t1 = time.perf_counter()
        b = await sh.connect(address, token=B, timeout=5)
        devices = (await b.request("devices"))[0]["devices"]
        b_took = time.perf_counter() - t1
        # The frame deadline: each stalled connection gets ETIMEDOUT and is closed.
        t2 = time.perf_counter()
        closed = 0
        for ans, reader, _, dec in held:
            if ans != "welcome":
                continue
            frames = await read_frames(reader, dec, timeout=10)
            closed += bool(frames) and frames[0].header.get("errno") == "ETIMEDOUT"
        freed = time.perf_counter() - t2
        c = await b.counters()
        a_again = await half_frame(address, A)
        print(f"\ntenant A: {answers.count('welcome')} connections stalled after half a frame "
              f"in {took:.2f} s, then {answers[256]}; tenant B got in {b_took * 1e3:.1f} ms "
              f"later ({devices}); the frame deadline (2 s) closed {closed} stalled slots "
              f"within {freed:.1f} s; A logs in again: {a_again[0]}; connections_refused="
              f"{c['connections_refused']}")
        assert answers.count("welcome") == 256 and answers[256] == "EBUSY"
        assert devices == ["mlx5_0"] and b_took < 1.0
        assert closed == 256
        assert a_again[0] == "welcome"
        for _, _, w, _ in [*held, a_again]:
            w.close()
        await b.close()


async def dek_flood(ctx: sh.Context, pd: sh.PD, limit: int) -> tuple[int, str]:
    """create_dek until refused (or ``limit``); how many, and the refusal."""
    n = 0
    while n < limit:
        try:
            await ctx.create_dek(sh.Mlx5DEKInitAttr(
                pd=pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256, key=os.urandom(64)))
        except sh.RDMAError as e:
            return n, f"{e.errno_name}: {e.message}"
        n += 1
    return n, "no refusal"


async def test_one_tenants_dek_flood_leaves_another_tenants_create_dek_working(tmp_path):
    """The attack: two sessions of tenant A create DEKs until refused. Each session stops
    at its quota, both together at A's; a session of tenant B still creates one."""
    extra = ("--token-file", str(tenants_file(tmp_path)), "--quota", "dek=1500,2500")
    with Daemons(1, str(tmp_path), extra) as (address,):
        a1, a2 = await sh.connect(address, token=A), await sh.connect(address, token=A)
        sides = []
        for node in (a1, a2):
            ctx = await node.open_device()
            sides.append((ctx, await ctx.alloc_pd()))
        t0 = time.perf_counter()
        n1, why1 = await dek_flood(*sides[0], 10_000)
        n2, why2 = await dek_flood(*sides[1], 10_000)
        took = time.perf_counter() - t0
        b = await sh.connect(address, token=B)
        ctx = await b.open_device()
        pd = await ctx.alloc_pd()
        dek = await ctx.create_dek(sh.Mlx5DEKInitAttr(
            pd=pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256, key=os.urandom(64)))
        print(f"\nDEK flood by tenant A (quota dek=1500 per session, 2500 per credential): "
              f"session 1 created {n1} then {why1!r}; session 2 created {n2} then {why2!r}; "
              f"{n1 + n2} in {took:.1f} s; tenant B's create_dek then: DEK {dek.handle}")
        assert (n1, n2) == (1500, 1000)
        assert "ENOMEM" in why1 and "this session" in why1
        assert "ENOMEM" in why2 and "credential client#0" in why2
        for node in (a1, a2, b):
            await node.close()


async def test_memory_at_a_full_quota_and_the_memory_budget(tmp_path):
    """One session creates QPs until its quota: the daemon's RSS at the full quota is
    measured; registering memory past the daemon's budget is ENOMEM."""
    quota = 4000
    extra = ("--quota", f"qp={quota},{quota}", "--quota", f"cq={quota},{quota}",
             "--memory-budget", str(256 << 20))
    daemons = Daemons(1, str(tmp_path), extra)
    with daemons as (address,):
        pid = daemons.procs[0].pid
        node, pd, cq = await pd_and_cq(address)
        before = rss(pid)
        n, why = 0, ""
        while True:
            try:
                await node.request("create_qp", pd=pd.handle, scq=cq.handle, rcq=cq.handle,
                                   qp_type=int(sh.IBV_QPT_RC), max_send_wr=16,
                                   max_recv_wr=16, max_send_sge=1, max_recv_sge=1,
                                   max_inline_data=0, sq_sig_all=False, send_ops_flags=0)
            except sh.RDMAError as e:
                why = f"{e.errno_name}: {e.message}"
                break
            n += 1
        full = rss(pid)
        per_qp = (full - before) / max(n, 1)
        try:
            await pd.reg_mr(300 << 20, sh.IBV_ACCESS_LOCAL_WRITE)
            budget = "registered"
        except sh.RDMAError as e:
            budget = f"{e.errno_name}: {e.message}"
        mr = await pd.reg_mr(64 << 20, sh.IBV_ACCESS_LOCAL_WRITE)
        print(f"\nQPs up to the quota ({quota}): {n} created, then {why!r}; daemon RSS "
              f"{before / 2**20:.0f} MiB before, {full / 2**20:.0f} MiB at the full quota "
              f"({per_qp / 1024:.1f} KiB per QP); a 300 MiB reg_mr under a 256 MiB budget: "
              f"{budget!r}; a 64 MiB one: MR {mr.handle}")
        assert n == quota and "ENOMEM" in why
        assert full - before < quota * 16 * 1024, "a QP costs some KiB, bounded by its quota"
        assert "ENOMEM" in budget and "--memory-budget" in budget
        await node.close()


async def test_an_idle_session_is_closed_and_a_waiting_one_is_not():
    from softhca.server.daemon import Limits

    async with sh.embedded(limits=Limits(idle_timeout=0.5)) as node:
        idle = await sh.connect(node.address)
        waiting = await sh.connect(node.address)
        ctx = await waiting.open_device()
        cq = await ctx.create_cq(4)
        poll = asyncio.ensure_future(cq.poll(1, timeout=2.0))
        await asyncio.sleep(1.5)
        with_wait = len(node.daemon.sessions)
        wcs = await poll
        print(f"\nidle timeout 0.5 s: after 1.5 s, {with_wait} session left (the one that "
              f"holds a CQ and whose poll_cq waits); the idle ones, holding nothing, closed")
        assert with_wait == 1 and wcs == []
        try:
            await idle.request("devices")
            answered = True
        except sh.RDMAError as e:
            answered = e.errno_name
        assert answered in ("ETIMEDOUT", "ECONNRESET", "EPIPE"), answered
        await waiting.close()


def test_every_object_a_request_creates_has_a_quota_and_a_cost():
    # A kind without a default quota would be bounded only by 1 << 30 objects, and one
    # without an OBJECT_BYTES entry would cost the memory budget nothing: a hostile client
    # could then create address handles or windows until the daemon runs out of memory.
    from softhca.server.hosts import DEFAULT_QUOTAS, OBJECT_BYTES
    from softhca.server.verbs import _CREATORS

    kinds = set(_CREATORS.values())
    assert kinds - set(DEFAULT_QUOTAS) == set()
    assert kinds - set(OBJECT_BYTES) == set()


async def test_address_handles_past_the_quota_are_enomem_and_freed_ones_make_room():
    import softhca.client as sh
    from softhca.server.hosts import Limits

    async with sh.embedded(limits=Limits(quotas={"ah": (3, 6)})) as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(4)
        qp = await pd.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_UD, scq=cq, rcq=cq,
                                              cap=sh.QPCap(max_send_wr=1, max_recv_wr=1)))
        peer = qp.info()
        ahs = [await pd.create_ah(peer) for _ in range(3)]
        try:
            await pd.create_ah(peer)
            raise AssertionError("a fourth address handle past the quota of 3")
        except sh.RDMAError as e:
            assert e.errno_name == "ENOMEM" and "ah" in str(e), e
        await ahs[0].close()
        await pd.create_ah(peer)        # room again


async def test_max_qp_is_the_quota_a_session_can_reach():
    """ibv_query_device's pools are what one program can create: a session's quota of
    QPs set to 8 (``--quota qp=8,16``) makes max_qp 8 (and max_res_rd_atom 16 x 8), eight
    QPs are created and the ninth is ENOMEM; a kind left at its default stays 2^16."""
    import softhca.client as sh
    from softhca.server.hosts import Limits

    async with sh.embedded(limits=Limits(quotas={"qp": (8, 16)})) as node:
        ctx = await node.open_device()
        attr = await ctx.query_device()
        assert attr["max_qp"] == 8 and attr["max_res_rd_atom"] == 16 * 8, attr
        assert attr["max_mr"] == 1 << 16, attr
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(4)
        init = sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                             cap=sh.QPCap(max_send_wr=1, max_recv_wr=1))
        for _ in range(attr["max_qp"]):
            await pd.create_qp(init)
        try:
            await pd.create_qp(init)
            raise AssertionError("a QP past max_qp")
        except sh.RDMAError as e:
            assert e.errno_name == "ENOMEM" and "qp" in str(e), e
