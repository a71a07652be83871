"""The rest of the verbs surface end to end: atomics, immediates, invalidation, inline
data, the configure WR's completion, the WR builder's errors, QP attributes."""

from __future__ import annotations

import pytest

import softhca.client as sh

from e2e import Pair, rdma, sge, two_nodes, whole

S = sh.IBV_WC_SUCCESS
U64 = (1 << 64) - 1
REMOTE_INV = (sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
              | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE)


def le64(v: int) -> bytes:
    return v.to_bytes(8, "little")


async def atomic(p: Pair, opcode, target_mr, result_mr, compare_add, swap=0, wr_id=1):
    wr = sh.SendWR(wr_id=wr_id, opcode=opcode, sg=[sge(result_mr, 8)])
    wr.set_wr_atomic(target_mr.rkey, target_mr.addr, compare_add, swap)
    await p.initiator.qp.post_send(wr)
    (wc,) = await p.initiator.send_wc()
    return wc


async def test_atomic_compare_and_swap(pair: Pair):
    tgt = await pair.target.reg_mr(le64(0x1111))
    res = await pair.initiator.reg_mr(8)
    wc = await atomic(pair, sh.IBV_WR_ATOMIC_CMP_AND_SWP, tgt, res, 0x1111, 0x2222)
    assert (wc.status, wc.opcode, wc.byte_len) == (S, sh.IBV_WC_COMP_SWAP, 8)
    assert await res.read() == le64(0x1111) and await tgt.read() == le64(0x2222)
    # A compare that does not match leaves memory alone and returns the original.
    wc = await atomic(pair, sh.IBV_WR_ATOMIC_CMP_AND_SWP, tgt, res, 0x1111, 0x3333, wr_id=2)
    assert wc.status == S
    assert await res.read() == le64(0x2222) and await tgt.read() == le64(0x2222)


async def test_atomic_fetch_and_add_wraps(pair: Pair):
    start = U64 - 5
    tgt = await pair.target.reg_mr(le64(start))
    res = await pair.initiator.reg_mr(8)
    wc = await atomic(pair, sh.IBV_WR_ATOMIC_FETCH_AND_ADD, tgt, res, 10)
    assert (wc.status, wc.opcode) == (S, sh.IBV_WC_FETCH_ADD)
    assert await res.read() == le64(start)
    assert await tgt.read() == le64((start + 10) % (1 << 64))


async def test_atomic_needs_remote_atomic_access(pair: Pair):
    tgt = await pair.target.reg_mr(8, sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE)
    res = await pair.initiator.reg_mr(8)
    wc = await atomic(pair, sh.IBV_WR_ATOMIC_FETCH_AND_ADD, tgt, res, 1)
    assert wc.status == sh.IBV_WC_REM_ACCESS_ERR


async def test_immediates_on_send_and_write(pair: Pair):
    i, t = pair.initiator, pair.target
    src = await i.reg_mr(b"immediate data!!")
    dst = await t.reg_mr(64)
    await t.qp.post_recv([sh.RecvWR(wr_id=1, sg=whole(dst)), sh.RecvWR(wr_id=2, sg=[])])
    await i.qp.post_send(sh.SendWR(wr_id=3, opcode=sh.IBV_WR_SEND_WITH_IMM, sg=whole(src),
                                   imm_data=0xCAFE0001))
    await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE_WITH_IMM, whole(src), dst.rkey,
                              dst.addr + 32, wr_id=4, imm_data=0xCAFE0002))
    r1, r2 = await t.recv_wc(2)
    assert (r1.wr_id, r1.opcode, r1.imm_data, r1.byte_len) == (1, sh.IBV_WC_RECV, 0xCAFE0001, 16)
    assert (r2.wr_id, r2.opcode, r2.imm_data) == (2, sh.IBV_WC_RECV_RDMA_WITH_IMM, 0xCAFE0002)
    assert r1.wc_flags & sh.IBV_WC_WITH_IMM and r2.wc_flags & sh.IBV_WC_WITH_IMM
    assert await dst.read(48) == b"immediate data!!" + bytes(16) + b"immediate data!!"


async def test_send_with_inv_invalidates_the_targets_mkey(pair: Pair):
    i, t = pair.initiator, pair.target
    mr = await t.reg_mr(4096)
    mkey = await t.mkey(REMOTE_INV, access=sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_LOCAL_WRITE,
                        sges=whole(mr))
    src = await i.reg_mr(b"z" * 64)
    assert (await pair.write(whole(src), mkey.rkey, 0)).status == S
    await t.qp.post_recv(sh.RecvWR(wr_id=5, sg=[sge(await t.reg_mr(64))]))
    wr = sh.SendWR(wr_id=6, opcode=sh.IBV_WR_SEND_WITH_INV, sg=whole(src))
    wr.invalidate_rkey = mkey.rkey
    await i.qp.post_send(wr)
    (swc,), (rwc,) = await i.send_wc(), await t.recv_wc()
    assert swc.status == S and rwc.status == S
    assert rwc.wc_flags & sh.IBV_WC_WITH_INV and rwc.invalidated_rkey == mkey.rkey
    # The MKEY is gone for later traffic (docs/semantics.md 4.5).
    assert (await pair.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_REM_ACCESS_ERR


async def test_local_inv_then_local_use_fails(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(4096)
    mkey = await t.mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, sges=whole(mr))
    wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_LOCAL_INV)
    wr.invalidate_rkey = mkey.lkey
    await t.qp.post_send(wr)
    (wc,) = await t.send_wc()
    assert (wc.status, wc.opcode) == (S, sh.IBV_WC_LOCAL_INV)
    await pair.initiator.qp.post_recv(sh.RecvWR(wr_id=2, sg=whole(await pair.initiator.reg_mr(64))))
    await t.qp.post_send(sh.SendWR(wr_id=3, opcode=sh.IBV_WR_SEND, sg=[sh.SGE(0, 64, mkey.lkey)]))
    (wc,) = await t.send_wc()
    assert wc.status == sh.IBV_WC_LOC_PROT_ERR


async def test_inline_send_copies_at_post(pair: Pair):
    i, t = pair.initiator, pair.target
    src = await i.reg_mr(b"original")
    dst = await t.reg_mr(64)
    await t.qp.post_recv(sh.RecvWR(wr_id=1, sg=whole(dst)))
    await i.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND, sg=whole(src),
                                   send_flags=sh.IBV_SEND_INLINE | sh.IBV_SEND_SIGNALED))
    await src.write(b"changed!")
    await i.send_wc()
    (rwc,) = await t.recv_wc()
    assert rwc.byte_len == 8 and await dst.read(8) == b"original"
    big = await i.reg_mr(1024)
    with pytest.raises(sh.RDMAError) as e:
        await i.qp.post_send(sh.SendWR(wr_id=3, opcode=sh.IBV_WR_SEND, sg=whole(big),
                                       send_flags=sh.IBV_SEND_INLINE))
    assert e.value.errno_name == "EINVAL" and "inline" in e.value.message.lower()


async def test_signaled_configure_completes_with_driver1(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(4096)
    mkey = await t.pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 1)
    await t.configure(mkey, access=sh.IBV_ACCESS_LOCAL_WRITE, sges=whole(mr), wr_id=77,
                      wr_flags=sh.IBV_SEND_INLINE | sh.IBV_SEND_SIGNALED)
    (wc,) = await t.send_wc()
    assert (wc.wr_id, wc.status, wc.opcode) == (77, S, sh.IBV_WC_DRIVER1)


async def test_wr_builder_errors_come_from_wr_complete(pair: Pair):
    t = pair.target
    mr = await t.reg_mr(4096)
    mkey = await t.pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 1)
    qp = t.qp
    # Announcing 2 setters and giving 1 (mlx5dv_wr_mkey_configure(3)): EINVAL, nothing applied.
    qp.wr_start()
    qp.wr_flags = sh.IBV_SEND_INLINE
    qp.wr_mkey_configure(mkey, 2, sh.Mlx5MkeyConfAttr())
    qp.wr_set_mkey_layout_list(whole(mr))
    with pytest.raises(sh.RDMAError) as e:
        await qp.wr_complete()
    assert e.value.errno_name == "EINVAL"
    # A sig_block setter on an MKEY created without BLOCK_SIGNATURE: EINVAL.
    qp.wr_start()
    qp.wr_flags = sh.IBV_SEND_INLINE
    qp.wr_mkey_configure(mkey, 1, sh.Mlx5MkeyConfAttr())
    qp.wr_set_mkey_sig_block(sh.Mlx5SigBlockAttr())
    with pytest.raises(sh.RDMAError) as e:
        await qp.wr_complete()
    assert e.value.errno_name == "EINVAL" and "BLOCK_SIGNATURE" in e.value.message
    # Without IBV_SEND_INLINE: EOPNOTSUPP, as the mlx5 provider answers.
    qp.wr_start()
    qp.wr_flags = 0
    qp.wr_mkey_configure(mkey, 1, sh.Mlx5MkeyConfAttr())
    qp.wr_set_mkey_layout_list(whole(mr))
    with pytest.raises(sh.RDMAError) as e:
        await qp.wr_complete()
    assert e.value.errno_name == "EOPNOTSUPP"
    with pytest.raises(sh.RDMAError):
        await qp.wr_complete()          # no ibv_wr_start


async def test_qp_attributes_and_transitions():
    async with two_nodes(connect=False) as p:
        qp = p.initiator.qp
        assert (await qp.query())["qp_state"] == sh.IBV_QPS_RESET
        with pytest.raises(sh.RDMAError) as e:
            await qp.to_rts()
        assert e.value.errno_name == "EINVAL" and "RESET" in e.value.message
        await qp.to_init()
        with pytest.raises(sh.RDMAError) as e:
            await qp.to_rtr(sh.QPAttr(path_mtu=sh.IBV_MTU_1024))
        assert "dest_qp_num" in e.value.message
        peer = p.target.qp.info()
        await qp.to_rtr(sh.QPAttr(path_mtu=sh.IBV_MTU_2048, dest_qp_num=peer.qp_num, rq_psn=0,
                                  dest_host=peer.host, dest_port=peer.port))
        await qp.to_rts(sh.QPAttr(sq_psn=0, timeout=14, retry_cnt=5, rnr_retry=3))
        attr = await qp.query()
        assert (attr["qp_state"], attr["path_mtu"], attr["retry_cnt"], attr["rnr_retry"],
                attr["dest_qp_num"]) == (sh.IBV_QPS_RTS, sh.IBV_MTU_2048, 5, 3, peer.qp_num)
        with pytest.raises(sh.RDMAError) as e:
            await qp.to_rts(sh.QPAttr(retry_cnt=9))
        assert e.value.errno_name == "EPROTO" and "retry_cnt" in e.value.message


async def test_malformed_requests_leave_the_session_usable(pair: Pair):
    node = pair.initiator.node
    for verb, fields, errno in [
        ("no_such_verb", {}, "EPROTO"),
        ("reg_mr", {"pd": pair.initiator.pd.handle, "length": 4096}, "EPROTO"),   # no access
        ("reg_mr", {"pd": pair.initiator.pd.handle, "length": -1, "access": 0}, "EPROTO"),
        ("reg_mr", {"pd": pair.initiator.pd.handle, "length": 64, "access": 0, "x": 1},
         "EPROTO"),
        ("reg_mr", {"pd": 999, "length": 64, "access": 0}, "ENOENT"),
        ("post_send", {"qp": pair.initiator.qp.handle, "wrs": [{"wr_id": 1}]}, "EPROTO"),
        ("open_device", {"name": "mlx5_9"}, "ENOENT"),
    ]:
        with pytest.raises(sh.RDMAError) as e:
            await node.request(verb, **fields)
        assert e.value.errno_name == errno, (verb, e.value)
    mr = await pair.initiator.reg_mr(b"still fine")
    assert await mr.read() == b"still fine"


async def test_a_daemon_with_two_hcas():
    async with sh.embedded(hcas=("mlx5_0", "mlx5_1")) as node:
        assert node.devices == ["mlx5_0", "mlx5_1"]
        c0, c1 = await node.open_device("mlx5_0"), await node.open_device("mlx5_1")
        m0 = await (await c0.alloc_pd()).reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE)
        m1 = await (await c1.alloc_pd()).reg_mr(64, sh.IBV_ACCESS_LOCAL_WRITE)
        await m0.write(b"0" * 64)
        await m1.write(b"1" * 64)
        assert (await m0.read(), await m1.read()) == (b"0" * 64, b"1" * 64)


async def test_zero_length_rdma_checks_no_rkey(pair: Pair):
    """A zero-length RDMA WRITE, WRITE_WITH_IMM or READ names no memory: its RETH need
    carry no valid R_Key or address (IBTA C9-88; rxe's responder skips the check). The
    WRITE_WITH_IMM still takes a receive, completed with byte_len 0 and its immediate;
    nothing is flushed and the QP keeps working."""
    i, t = pair.initiator, pair.target
    dst = await t.reg_mr(64)
    await t.qp.post_recv([sh.RecvWR(wr_id=1, sg=whole(dst)), sh.RecvWR(wr_id=2, sg=whole(dst))])
    for wr_id, op in ((3, sh.IBV_WR_RDMA_WRITE_WITH_IMM), (4, sh.IBV_WR_RDMA_WRITE),
                      (5, sh.IBV_WR_RDMA_READ)):
        await i.qp.post_send(rdma(op, [], 0, 0, wr_id, imm_data=0xC0FFEE,
                                  send_flags=sh.IBV_SEND_SIGNALED))
    assert [(w.wr_id, w.status) for w in await i.send_wc(3)] == [(3, S), (4, S), (5, S)]
    (r,) = await t.recv_wc()
    assert (r.wr_id, r.status, r.opcode, r.byte_len, r.imm_data) == (
        1, S, sh.IBV_WC_RECV_RDMA_WITH_IMM, 0, 0xC0FFEE)
    # the second receive was neither taken nor flushed: a SEND lands in it
    src = await i.reg_mr(b"after")
    await i.qp.post_send(sh.SendWR(wr_id=6, opcode=sh.IBV_WR_SEND, sg=whole(src)))
    assert (await i.send_wc())[0].status == S
    (r,) = await t.recv_wc()
    assert (r.wr_id, r.status, r.byte_len) == (2, S, 5)
    assert await dst.read(5) == b"after"


async def test_zero_length_write_with_a_bad_rkey_still_fails_when_it_has_bytes(pair: Pair):
    """The skip is for zero length only: one byte through rkey 0 is a remote access
    error."""
    src = await pair.initiator.reg_mr(b"x")
    wc = await pair.write(whole(src), 0, 0)
    assert wc.status == sh.IBV_WC_REM_ACCESS_ERR
