"""Completions pushed (the CQ push and its credits): a client's CQs receive their completions as the daemon
makes them, ``cq.poll`` answers from those without a request, and the room they take
is credited back with cq_credit. Each attack on the credits and on the bound has its
test; the CQ's cqe still bounds what is unpolled, exactly as ibv_create_cq(3) says.
"""

from __future__ import annotations

import asyncio

import pytest
import rawclient
from hypothesis import given, settings
from hypothesis import strategies as st

import softhca.client as sh
from softhca.protocol.frames import frame_bytes
from softhca.protocol.records import SEND_WR, RecvWR, SendWR
from softhca.server.daemon import Limits

from e2e import connect_pair, make_side, rdma, two_nodes, whole


def session_of(node: sh.Node):
    [session] = node.daemon.sessions
    return session


def record_verbs(session) -> list[str]:
    """The verbs of every control request the session handles from now on."""
    seen: list[str] = []
    call = session.verbs.call

    def recording(request, rid):
        seen.append(request.VERB)
        return call(request, rid)

    session.verbs.call = recording
    return seen


async def until(cond, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.001)


async def writes(pair, n: int, *, signaled: bool = True, wr_id: int = 0) -> None:
    ini, tgt = pair.initiator, pair.target
    src = await ini.reg_mr(64)
    dst = await tgt.reg_mr(64)
    flags = sh.IBV_SEND_SIGNALED if signaled else 0
    await ini.qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr,
                                 wr_id=wr_id + k, send_flags=flags) for k in range(n)])


# -- pushed, not polled for ------------------------------------------------------------

async def test_a_completion_made_after_the_last_request_is_polled_without_one():
    async with two_nodes() as pair:
        ini = pair.initiator
        session = session_of(ini.node)
        cq_host = session.verbs.get(ini.scq.handle, "cq")
        assert cq_host.push_mode
        await writes(pair, 1, wr_id=41)
        seen = record_verbs(session)
        # The ACK comes after post_send's reply: the daemon makes the completion then and
        # pushes it, while this client sends nothing.
        await until(lambda: cq_host.pushed == 1)
        # ... and it reaches this client's read loop, still without a request.
        await until(lambda: ini.node._conn.available(ini.scq.handle) == 1)
        assert seen == []
        [wc] = await ini.scq.poll(timeout=0)
        assert (wc.wr_id, wc.status, wc.opcode) == (41, sh.IBV_WC_SUCCESS,
                                                   sh.IBV_WC_RDMA_WRITE)
        # The poll sent no request; the room it freed goes back without a reply.
        await until(lambda: cq_host.pushed == 0)
        assert seen == ["cq_credit"]
        assert await ini.scq.poll(timeout=0) == []
        assert seen == ["cq_credit"]


async def test_a_waiting_poll_is_answered_by_the_push():
    async with two_nodes() as pair:
        ini = pair.initiator
        seen = record_verbs(session_of(ini.node))
        for k in range(20):
            await writes(pair, 1, wr_id=k)
            [wc] = await ini.scq.poll(timeout=10)
            assert wc.wr_id == k and wc.status == sh.IBV_WC_SUCCESS
        # Each round is its post (and reg_mr's for the buffers); a poll asks nothing,
        # except that a wait outliving HOLD_AFTER_S (a slow machine) is held on the
        # daemon too: at most one request per poll, never one per completion taken.
        assert seen.count("post_send") == 20
        assert seen.count("poll_cq") <= 20
        assert set(seen) <= {"post_send", "reg_mr", "poll_cq", "cq_credit"}


async def test_completions_made_by_a_post_are_there_when_its_reply_is():
    """A post in ERR completes with IBV_WC_WR_FLUSH_ERR at once: the daemon pushes the
    completion before the reply, so a poll right after the call finds it, every time."""
    async with two_nodes() as pair:
        ini = pair.initiator
        await ini.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR))
        src = await ini.reg_mr(64)
        for k in range(50):
            await ini.qp.post_send(sh.SendWR(wr_id=k, opcode=sh.IBV_WR_SEND, sg=whole(src)))
            await ini.qp.post_recv(sh.RecvWR(wr_id=1000 + k, sg=whole(src)))
            [s] = await ini.scq.poll(timeout=0)
            [r] = await ini.rcq.poll(timeout=0)
            assert (s.wr_id, s.status) == (k, sh.IBV_WC_WR_FLUSH_ERR)
            assert (r.wr_id, r.status) == (1000 + k, sh.IBV_WC_WR_FLUSH_ERR)


async def test_poll_checks_its_arguments_and_the_cq_locally():
    async with two_nodes() as pair:
        cq = await pair.initiator.ctx.create_cq(4)
        for num, timeout in ((0, 0), (1 << 17, 0), (1, -1), (1, 3601), (True, 0)):
            with pytest.raises(sh.RDMAError) as e:
                await cq.poll(num, timeout)
            assert e.value.errno_name == "EPROTO", (num, timeout)
        await cq.close()
        for call in (cq.poll(), cq.poll(1, timeout=1)):
            with pytest.raises(sh.RDMAError) as e:
                await call
            assert e.value.errno_name == "ENOENT"


async def test_completions_received_before_the_connection_ended_are_still_polled():
    async with two_nodes() as pair:
        ini = pair.initiator
        await ini.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR))
        src = await ini.reg_mr(64)
        await ini.qp.post_send(sh.SendWR(wr_id=5, opcode=sh.IBV_WR_SEND, sg=whole(src)))
        ini.node._conn.writer.transport.abort()
        await until(lambda: ini.node._conn.error is not None)
        [wc] = await ini.scq.poll(timeout=1)
        assert wc.wr_id == 5
        with pytest.raises(sh.RDMAError) as e:
            await ini.scq.poll(timeout=1)
        assert e.value.errno_name == "ECONNRESET"


# -- the CQ's bound, with the entries in the client --------------------------------------

async def _cq_of_4(pair):
    """The initiator's RC QP (8 send WRs) on a CQ of 4 entries, connected to a QP of the
    target's, and a 64-byte MR on each side: (cq, qp, src, dst)."""
    cq = await pair.initiator.ctx.create_cq(4)
    qp = await pair.initiator.pd.create_qp(sh.QPInitAttr(
        qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq, cap=sh.QPCap(max_send_wr=8, max_recv_wr=1)))
    peer = await pair.target.pd.create_qp(sh.QPInitAttr(
        qp_type=sh.IBV_QPT_RC, scq=pair.target.scq, rcq=pair.target.rcq,
        cap=sh.QPCap(max_send_wr=1, max_recv_wr=1)))
    await qp.connect(peer.info())
    await peer.connect(qp.info())
    return cq, qp, await pair.initiator.reg_mr(64), await pair.target.reg_mr(64)


async def test_polled_entries_give_their_room_back():
    async with two_nodes() as pair:
        ini = pair.initiator
        cq, qp, src, dst = await _cq_of_4(pair)
        for rnd in range(10):       # 40 completions through a CQ of 4
            await qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr,
                                     wr_id=4 * rnd + k) for k in range(4)])
            wcs = await cq.poll_n(4, 10)
            assert [w.wr_id for w in wcs] == [4 * rnd + k for k in range(4)]
            assert all(w.status == sh.IBV_WC_SUCCESS for w in wcs)
        assert (await qp.query())["qp_state"] == sh.IBV_QPS_RTS
        assert await ini.ctx.get_async_event(timeout=0) is None


async def test_pushed_entries_not_polled_still_overrun_the_cq():
    """cqe 4: four completions pushed and left unpolled in the client fill the CQ; the
    fifth is an overrun (IBV_EVENT_CQ_ERR, the QP to ERR), as with a CQ nobody polls."""
    async with two_nodes() as pair:
        ini = pair.initiator
        cq, qp, src, dst = await _cq_of_4(pair)
        cq_host = session_of(ini.node).verbs.get(cq.handle, "cq")
        wr = [rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr, wr_id=k)
              for k in range(5)]
        await qp.post_send(wr[:4])
        await until(lambda: cq_host.pushed == 4)
        assert not cq_host.error
        await qp.post_send(wr[4])
        ev = await ini.ctx.get_async_event(timeout=10)
        assert ev is not None and ev.event_type == sh.IBV_EVENT_CQ_ERR and ev.cq is cq
        await ev.ack()
        assert (await qp.query())["qp_state"] == sh.IBV_QPS_ERR
        held = await cq.poll(100)
        assert [w.wr_id for w in held] == [0, 1, 2, 3]
        assert cq_host.error
        await until(lambda: cq_host.pushed == 0)      # the poll's credit came back


# -- credits attacked ---------------------------------------------------------------------

class Raw(rawclient.Raw):
    """The raw session, with a cq_credit sender."""

    async def credit(self, credits) -> dict:
        """A cq_credit, then a devices call: the credit's error reply, if any, comes
        first (requests are answered in order), else only the devices reply."""
        self.writer.write(frame_bytes({"t": "cq_credit", "id": 0, "credits": credits}))
        self.writer.write(frame_bytes({"t": "devices", "id": next(self.ids)}))
        h = (await self.next()).header
        if h["t"] == "err":
            assert (await self.next()).header["t"] == "ok"
        return h


async def test_credits_attacked():
    async with sh.embedded() as node:
        other = await node.open_device()
        await other.alloc_pd()
        other_cq = await other.create_cq(8)
        victim = session_of(node)
        victim_cq = victim.verbs.get(other_cq.handle, "cq")
        raw = await Raw.open(node.address)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        cq = (await raw.call("create_cq", ctx=ctx, cqe=8, push=True))["cq"]
        [attacker] = node.daemon.sessions - {victim}
        mine = attacker.verbs.get(cq, "cq")
        # Nothing was pushed: any credit is more than was given.
        h = await raw.credit([[cq, 1]])
        assert (h["t"], h["errno"], h["id"]) == ("err", "EPROTO", 0)
        assert "1 entries of CQ" in h["msg"] and "0 were pushed" in h["msg"]
        # A handle this session does not have, and the other session's CQ's handle
        # (handles are per session: here it names nothing).
        for stranger in (cq + 7, other_cq.handle):
            assert stranger != cq
            h = await raw.credit([[stranger, 1]])
            assert (h["t"], h["errno"]) == ("err", "ENOENT"), stranger
        # Malformed pairs.
        for bad in ([[cq]], [["x", 1]], [[cq, 0]], [[cq, True]], [7], [[cq, 1 << 40]]):
            h = await raw.credit(bad)
            assert (h["t"], h["errno"]) == ("err", "EPROTO"), bad
        # A batch with one over-credit applies none of it.
        mine.pushed = 3         # as if three were pushed
        h = await raw.credit([[cq, 2], [cq, 2]])
        assert (h["t"], h["errno"]) == ("err", "EPROTO") and mine.pushed == 3
        h = await raw.credit([[cq, 2], [cq, 1]])
        assert h["t"] == "ok" and "devices" in h     # no reply to the credit itself
        assert mine.pushed == 0
        # The other session's CQ was never touched.
        assert victim_cq.pushed == 0 and not victim_cq.error
        raw.writer.close()


async def test_a_flood_of_credits_neither_grows_the_daemon_nor_stalls_others():
    high = 64 << 10
    async with sh.embedded(limits=Limits(reply_high_water=high)) as node:
        session_of_first = session_of(node)
        raw = await Raw.open(node.address)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        cq = (await raw.call("create_cq", ctx=ctx, cqe=8, push=True))["cq"]
        [flooder] = node.daemon.sessions - {session_of_first}
        # 100,000 over-credits in one write, none of the error replies read.
        frame = frame_bytes({"t": "cq_credit", "id": 0, "credits": [[cq, 1]]})
        raw.writer.write(frame * 100_000)
        loop = asyncio.get_running_loop()
        worst = 0.0
        for _ in range(50):
            t0 = loop.time()
            await node.request("devices")
            worst = max(worst, loop.time() - t0)
            buffered = flooder.writer.transport.get_write_buffer_size()
            # The budget is checked before each frame runs: one error reply past it.
            assert buffered <= high + 512, buffered
            await asyncio.sleep(0.005)
        print(f"worst round trip of another session during the flood: {worst * 1e3:.1f} ms")
        assert worst < 1.0
        assert flooder.verbs.get(cq, "cq").pushed == 0
        raw.writer.close()


async def test_a_client_that_never_reads_holds_at_most_the_cqs_completions():
    """The client stops reading while its signaled WRs complete: the daemon pushes at
    most cqe of them (uncredited), overruns the CQ as it would with nobody polling, and
    stops reading the client's posts once its unsent bytes pass the high-water mark.
    When the client reads again it gets exactly cqe completions, none lost."""
    high, cqe = 32 << 10, 64
    async with sh.embedded(limits=Limits(reply_high_water=high)) as tnode, \
            sh.embedded(limits=Limits(reply_high_water=high)) as inode:
        tgt, ini = await make_side(tnode), await make_side(inode)
        await connect_pair(tgt, ini)
        cq = await ini.ctx.create_cq(cqe)
        qp = await ini.pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
            cap=sh.QPCap(max_send_wr=256, max_recv_wr=1)))
        peer = await tgt.pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=tgt.scq, rcq=tgt.rcq,
            cap=sh.QPCap(max_send_wr=1, max_recv_wr=1)))
        await qp.connect(peer.info())
        await peer.connect(qp.info())
        src = await ini.reg_mr(64)
        dst = await tgt.reg_mr(64)
        session = session_of(inode)
        cq_host = session.verbs.get(cq.handle, "cq")
        conn = inode._conn
        conn.writer.transport.pause_reading()
        wrs = [rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr, wr_id=k)
               for k in range(100)]
        posts = [asyncio.ensure_future(qp.post_send(wrs)) for _ in range(40)]
        await until(lambda: cq_host.error)
        await asyncio.sleep(0.2)
        assert cq_host.pushed == cqe
        buffered = session.writer.transport.get_write_buffer_size()
        print(f"unsent to the client that does not read: {buffered} bytes")
        assert buffered <= high + cqe * 64 + 4096
        conn.writer.transport.resume_reading()
        await asyncio.gather(*posts, return_exceptions=True)
        held = await cq.poll_n(cqe, 10)
        assert [w.wr_id for w in held] == list(range(cqe))
        assert all(w.status == sh.IBV_WC_SUCCESS for w in held)
        assert await cq.poll(4096, timeout=0.3) == []


# -- the post's fast decode accepts exactly what the checked one does ---------------------

class _Map(dict):
    """A map that is not exactly a dict: from_wire takes its checked path."""


_FIELD = st.one_of(st.integers(min_value=0, max_value=12),
                   st.integers(min_value=-2, max_value=(1 << 64) + 1), st.booleans(),
                   st.none(), st.text(max_size=2), st.floats(allow_nan=False),
                   st.lists(st.lists(st.integers(min_value=-1, max_value=(1 << 32) + 1),
                                     max_size=4), max_size=3))
_VALID_SEND = {"wr_id": 1, "opcode": int(sh.IBV_WR_RDMA_WRITE), "sg": [[4096, 64, 5]],
               "send_flags": 2, "rkey": 9, "remote_addr": 8192, "compare_add": 0, "swap": 0,
               "invalidate_rkey": 0}


def _decoded(cls, w):
    try:
        return ("ok", cls.from_wire(w, "wr[0]"))
    except sh.RDMAError as e:
        return (e.errno_name, e.message)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from([*SEND_WR, "extra"]), _FIELD, max_size=3),
       st.sets(st.sampled_from(sorted(SEND_WR)), max_size=2))
def test_send_wr_fast_decode_matches_the_checked_one(changes, dropped):
    w = {k: v for k, v in {**_VALID_SEND, **changes}.items() if k not in dropped}
    assert _decoded(SendWR, w) == _decoded(SendWR, _Map(w))


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional={"wr_id": _FIELD, "sg": _FIELD, "x": _FIELD}))
def test_recv_wr_fast_decode_matches_the_checked_one(w):
    assert _decoded(RecvWR, w) == _decoded(RecvWR, _Map(w))


def test_a_valid_wr_decodes_to_its_fields():
    wr = sh.SendWR(wr_id=(1 << 64) - 1, opcode=sh.IBV_WR_RDMA_WRITE_WITH_IMM, imm_data=7,
                   sg=[sh.SGE(1, 2, 3), sh.SGE(4, 5, 6)])
    wr.set_wr_rdma(9, 10)
    got = SendWR.from_wire(wr.to_wire())
    assert (got.wr_id, got.opcode, got.imm_data, got.rkey, got.remote_addr) == (
        (1 << 64) - 1, sh.IBV_WR_RDMA_WRITE_WITH_IMM, 7, 9, 10)
    assert got.sg == [sh.SGE(1, 2, 3), sh.SGE(4, 5, 6)]
    assert RecvWR.from_wire({"wr_id": 3, "sg": [[1, 2, 3]]}).sg == [sh.SGE(1, 2, 3)]
