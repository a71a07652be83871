"""Memory windows end to end through the async client (engine/mw.py): a type 2 window
bound, used by the peer, invalidated and refused after; type 1 bind and rebind; the
bind errors; hardening (another session's window, guessed rkeys).

Expected bytes and keys are computed here: the window's range of the MR, the rkey as
ibv_inc_rkey(3) defines it (low 8 bits + 1, the rest kept), the completion statuses
the verbs pages and rxe give.
"""

from __future__ import annotations

import os

import softhca.client as sh

from e2e import Pair, sge, two_nodes

S = sh.IBV_WC_SUCCESS
RW = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_REMOTE_READ
BINDABLE = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_MW_BIND


def next_key(rkey: int) -> int:
    return (rkey & ~0xFF) | ((rkey & 0xFF) + 1) % 256


async def bind2(side, mw, mr, off, length, access, key_byte):
    """Post IBV_WR_BIND_MW on ``side``'s QP; its completion."""
    wr = sh.bind_wr(mw, mr, mr.addr + off, length, access, rkey=key_byte, wr_id=7)
    await side.qp.post_send(wr)
    (wc,) = await side.send_wc()
    return wc, (mw.rkey & ~0xFF) | key_byte


async def restate(p: Pair) -> None:
    """Both QPs out of ERR (a remote access error moves both there): RESET, reconnect."""
    for side in (p.target, p.initiator):
        await side.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RESET))
    await p.initiator.qp.connect(p.target.qp.info())
    await p.target.qp.connect(p.initiator.qp.info())


async def write(p: Pair, data: bytes, rkey: int, addr: int) -> sh.WC:
    src = await p.initiator.reg_mr(data)
    return await p.write([sge(src)], rkey, addr)


async def test_type2_bound_used_invalidated_refused(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(bytes(256), BINDABLE)
    mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_2)
    # The MR alone grants no remote access.
    assert (await write(pair, b"x" * 8, mr.rkey, mr.addr)).status == sh.IBV_WC_REM_ACCESS_ERR
    await restate(pair)
    wc, rkey = await bind2(t, mw, mr, 64, 32, RW, 0x5A)
    assert (wc.status, wc.opcode, wc.wr_id) == (S, sh.IBV_WC_BIND_MW, 7)
    assert rkey & 0xFF == 0x5A and rkey >> 8 == mw.rkey >> 8
    payload = os.urandom(32)
    assert (await write(pair, payload, rkey, mr.addr + 64)).status == S
    assert await mr.read() == bytes(64) + payload + bytes(160)
    # READ back through the window.
    dst = await pair.initiator.reg_mr(16)
    assert (await pair.read([sge(dst)], rkey, mr.addr + 72)).status == S
    assert await dst.read() == payload[8:24]
    # LOCAL_INV on the target's QP: the rkey is refused after.
    inv = sh.SendWR(wr_id=9, opcode=sh.IBV_WR_LOCAL_INV)
    inv.invalidate_rkey = rkey
    await t.qp.post_send(inv)
    (wc,) = await t.send_wc()
    assert (wc.status, wc.opcode) == (S, sh.IBV_WC_LOCAL_INV)
    wc = await write(pair, b"y" * 8, rkey, mr.addr + 64)
    assert wc.status == sh.IBV_WC_REM_ACCESS_ERR
    assert await mr.read(32, 64) == payload


async def test_type2_window_bounds_access_and_send_with_inv():
    async with two_nodes() as p:
        t, i = p.target, p.initiator
        mr = await t.reg_mr(bytes(128), BINDABLE)
        mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_2)
        wc, rkey = await bind2(t, mw, mr, 0, 64, sh.IBV_ACCESS_REMOTE_WRITE, 1)
        assert wc.status == S
        # A bound type 2 window cannot be bound again before it is invalidated.
        wc, _ = await bind2(t, mw, mr, 0, 64, sh.IBV_ACCESS_REMOTE_WRITE, 2)
        assert wc.status == sh.IBV_WC_MW_BIND_ERR
    async with two_nodes() as p:
        t, i = p.target, p.initiator
        mr = await t.reg_mr(bytes(128), BINDABLE)
        mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_2)
        wc, rkey = await bind2(t, mw, mr, 0, 64, sh.IBV_ACCESS_REMOTE_WRITE, 1)
        # SEND_WITH_INV from the peer invalidates it; the receive says so.
        buf = await t.reg_mr(16)
        await t.qp.post_recv(sh.RecvWR(wr_id=3, sg=[sge(buf)]))
        src = await i.reg_mr(b"inv!")
        wr = sh.SendWR(wr_id=4, opcode=sh.IBV_WR_SEND_WITH_INV, sg=[sge(src)])
        wr.invalidate_rkey = rkey
        await i.qp.post_send(wr)
        (swc,), (rwc,) = await i.send_wc(), await t.recv_wc()
        assert swc.status == S and rwc.status == S
        assert rwc.wc_flags & sh.IBV_WC_WITH_INV and rwc.invalidated_rkey == rkey
        assert (await write(p, b"z" * 8, rkey, mr.addr)).status == sh.IBV_WC_REM_ACCESS_ERR


async def test_type2_bounds_and_access_refused():
    async with two_nodes() as p:
        mr = await p.target.reg_mr(bytes(128), BINDABLE)
        mw = await p.target.pd.alloc_mw(sh.IBV_MW_TYPE_2)
        _, rkey = await bind2(p.target, mw, mr, 32, 32, sh.IBV_ACCESS_REMOTE_READ, 3)
        dst = await p.initiator.reg_mr(64)
        # One byte past the window's end.
        wc = await p.read([sge(dst, 33)], rkey, mr.addr + 32)
        assert wc.status == sh.IBV_WC_REM_ACCESS_ERR
    async with two_nodes() as p:
        mr = await p.target.reg_mr(bytes(128), BINDABLE)
        mw = await p.target.pd.alloc_mw(sh.IBV_MW_TYPE_2)
        _, rkey = await bind2(p.target, mw, mr, 32, 32, sh.IBV_ACCESS_REMOTE_READ, 3)
        # A read-only window refuses a WRITE.
        assert (await write(p, b"w" * 8, rkey, mr.addr + 32)).status == \
            sh.IBV_WC_REM_ACCESS_ERR


async def test_bind_errors_complete_mw_bind_err():
    cases = [
        # An MR without IBV_ACCESS_MW_BIND.
        (sh.IBV_ACCESS_LOCAL_WRITE, 0, 16),
        # A writable window over an MR without LOCAL_WRITE.
        (sh.IBV_ACCESS_MW_BIND, 0, 16),
        # A range leaving the MR.
        (BINDABLE, 120, 16),
        # Type 2 with length 0.
        (BINDABLE, 0, 0),
    ]
    for access, off, length in cases:
        async with two_nodes() as p:
            mr = await p.target.reg_mr(bytes(128), access)
            mw = await p.target.pd.alloc_mw(sh.IBV_MW_TYPE_2)
            wc, _ = await bind2(p.target, mw, mr, off, length, sh.IBV_ACCESS_REMOTE_WRITE, 1)
            assert (wc.status, wc.opcode) == (sh.IBV_WC_MW_BIND_ERR, sh.IBV_WC_BIND_MW), access


async def test_type1_bind_and_rebind(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(bytes(64), BINDABLE)
    mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_1)
    first = mw.rkey
    key = await t.qp.bind_mw(mw, mr, mr.addr, 32, sh.IBV_ACCESS_REMOTE_WRITE, wr_id=5)
    assert key == mw.rkey == next_key(first)
    (wc,) = await t.send_wc()
    assert (wc.status, wc.opcode, wc.wr_id) == (S, sh.IBV_WC_BIND_MW, 5)
    assert (await write(pair, b"A" * 8, key, mr.addr + 8)).status == S
    # Rebind to the second half: a new rkey, the old one refused, the new range works.
    key2 = await t.qp.bind_mw(mw, mr, mr.addr + 32, 32, sh.IBV_ACCESS_REMOTE_WRITE)
    assert key2 == next_key(key)
    (wc,) = await t.send_wc()
    assert wc.status == S
    assert (await write(pair, b"B" * 8, key2, mr.addr + 40)).status == S
    assert await mr.read() == bytes(8) + b"A" * 8 + bytes(24) + b"B" * 8 + bytes(16)
    assert (await write(pair, b"C" * 8, key, mr.addr + 8)).status == sh.IBV_WC_REM_ACCESS_ERR


async def test_type1_unbind_and_verb_errors(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(bytes(64), BINDABLE)
    mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_1)
    key = await t.qp.bind_mw(mw, mr, mr.addr, 64, sh.IBV_ACCESS_REMOTE_WRITE)
    await t.send_wc()
    # ibv_dereg_mr fails while a window is bound to the MR.
    try:
        await mr.close()
        raise AssertionError("dereg_mr with a bound window succeeded")
    except sh.RDMAError as e:
        assert e.errno_name == "EINVAL"
    # A bind of length 0 takes the window's access away.
    key0 = await t.qp.bind_mw(mw, mr, mr.addr, 0, 0)
    await t.send_wc()
    for k in (key, key0):
        assert (await write(pair, b"D" * 8, k, mr.addr)).status == sh.IBV_WC_REM_ACCESS_ERR
        await restate(pair)
    # ibv_bind_mw's own checks: a type 2 window, an MR of another PD.
    mw2 = await t.pd.alloc_mw(sh.IBV_MW_TYPE_2)
    other = await (await t.ctx.alloc_pd()).reg_mr(64, BINDABLE)
    for window, region, errno in ((mw2, mr, "EINVAL"), (mw, other, "EPERM")):
        try:
            await t.qp.bind_mw(window, region, region.addr, 8, 0)
            raise AssertionError("bind_mw accepted")
        except sh.RDMAError as e:
            assert e.errno_name == errno
    # ibv_alloc_mw of an unknown type.
    try:
        await t.pd.alloc_mw(3)
        raise AssertionError("alloc_mw type 3 accepted")
    except sh.RDMAError as e:
        assert e.errno_name == "EINVAL"
    await mw.close()
    await mr.close()            # unbound once its window is gone


async def test_windows_of_another_session_and_guessed_rkeys(pair: Pair):
    """A window is bound only by a QP of its own PD (another session's handle is not
    even visible), and a peer guessing rkeys near a window's finds nothing."""
    t = pair.target
    mr = await t.reg_mr(bytes(64), BINDABLE)
    mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_2)
    _, rkey = await bind2(t, mw, mr, 0, 64, sh.IBV_ACCESS_REMOTE_WRITE, 0x10)
    # The initiator's session posts a bind naming the target's window handle: it is not
    # a window of that session.
    own = await pair.initiator.reg_mr(64, BINDABLE)
    try:
        await pair.initiator.qp.post_send(sh.bind_wr(mw, own, own.addr, 8, 0))
        raise AssertionError("a bind of another session's window was posted")
    except sh.RDMAError as e:
        assert e.errno_name == "ENOENT"
    # Other key bytes of the same window, and keys of neighbouring indexes, are refused.
    for guess in (rkey ^ 0x01, rkey ^ 0xFF, rkey + 0x100, rkey - 0x100):
        wc = await write(pair, b"G" * 8, guess & 0xFFFFFFFF, mr.addr)
        assert wc.status == sh.IBV_WC_REM_ACCESS_ERR
        await restate(pair)
    assert await mr.read() == bytes(64)
    # Two windows of one PD never share a key index.
    keys = {(await t.pd.alloc_mw(sh.IBV_MW_TYPE_2)).rkey >> 8 for _ in range(32)}
    assert len(keys) == 32 and mw.rkey >> 8 not in keys


async def test_windows_count_against_the_session_quota_and_are_not_lkeys():
    from softhca.server.hosts import Limits

    async with sh.embedded(limits=Limits(quotas={"mw": (4, 8)})) as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        windows = [await pd.alloc_mw(sh.IBV_MW_TYPE_2) for _ in range(4)]
        try:
            await pd.alloc_mw(sh.IBV_MW_TYPE_1)
            raise AssertionError("a fifth window past the quota")
        except sh.RDMAError as e:
            assert e.errno_name == "ENOMEM"
        await windows[0].close()
        await pd.alloc_mw(sh.IBV_MW_TYPE_1)     # room again
    async with two_nodes() as p:
        t = p.target
        mr = await t.reg_mr(bytes(64), BINDABLE)
        mw = await t.pd.alloc_mw(sh.IBV_MW_TYPE_2)
        _, rkey = await bind2(t, mw, mr, 0, 64, RW, 0x21)
        # A window's rkey is no lkey: a local SGE naming it is a protection error.
        buf = await t.reg_mr(8)
        await t.qp.post_recv(sh.RecvWR(wr_id=1, sg=[sh.SGE(mr.addr, 8, rkey)]))
        src = await p.initiator.reg_mr(b"12345678")
        await p.initiator.qp.post_send(sh.SendWR(wr_id=2, sg=[sge(src)]))
        (rwc,) = await t.recv_wc()
        assert rwc.status == sh.IBV_WC_LOC_PROT_ERR and await buf.read() == bytes(8)


async def test_a_bind_to_another_sessions_mr_is_refused():
    """Two sessions of one daemon: a window bound to the other session's MR (its lkey
    read off the wire, say) is refused with MW_BIND_ERR, and its memory stays as it
    was."""
    from e2e import connect_pair, make_side

    async with sh.embedded() as node:
        other = await sh.connect(node.address)
        try:
            victim, attacker = await make_side(node), await make_side(other)
            await connect_pair(victim, attacker)
            secret = await victim.reg_mr(b"s" * 64, BINDABLE | sh.IBV_ACCESS_REMOTE_READ)
            mw = await attacker.pd.alloc_mw(sh.IBV_MW_TYPE_2)
            wc, _ = await bind2(attacker, mw, secret, 0, 64, sh.IBV_ACCESS_REMOTE_READ, 5)
            assert wc.status == sh.IBV_WC_MW_BIND_ERR
            assert await secret.read() == b"s" * 64
        finally:
            await other.close()
