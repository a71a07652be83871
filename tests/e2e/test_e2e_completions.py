"""docs/semantics.md section 9, row by row, between two daemons over TCP.

Each test provokes one failure through the client API and checks the exact
completion status on each side, the QP states afterwards (an error completion
moves the QP to ERR; a responder fault moves both ends there), and that the
failing WR completes even when it was posted unsignaled.
"""

from __future__ import annotations

import pytest

import softhca.client as sh

from e2e import SIG_FLAGS, TIMEOUT, Pair, connect_pair, make_side, rdma, sge, two_nodes, whole

S = sh.IBV_WC_SUCCESS
CRC32_512 = sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_CRC,
                                  crc=sh.Mlx5SigCrc(crc_type=sh.MLX5DV_SIG_CRC_TYPE_CRC32,
                                                    seed=0xFFFFFFFF),
                                  block_size=sh.MLX5DV_BLOCK_SIZE_512)
MEM_CRC32 = sh.Mlx5SigBlockAttr(mem=CRC32_512, check_mask=sh.MLX5DV_SIG_MASK_CRC32)
DIF_512 = sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
                                dif=sh.Mlx5SigT10Dif(bg=0xFFFF, app_tag=0x1234, ref_tag=7),
                                block_size=sh.MLX5DV_BLOCK_SIZE_512)
WIRE_DIF = sh.Mlx5SigBlockAttr(wire=DIF_512, check_mask=0xFF)
# docs/semantics.md section 5: W = 512 + 8 wire bytes a block; 1035 = one block and a
# 515-byte tail, longer than block_size: it would split the second block's PI.
SPLITTING = 520 + 515
CRYPTO_ONLY = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO


async def state(side) -> int:
    return (await side.qp.query())["qp_state"]


async def one(cq) -> sh.WC:
    (wc,) = await cq.poll_n(1, TIMEOUT)
    return wc


async def assert_both_err(p: Pair) -> None:
    assert await state(p.initiator) == sh.IBV_QPS_ERR
    assert await state(p.target) == sh.IBV_QPS_ERR


# -- row 1: local key faults: LOC_PROT_ERR, nothing on the responder ------------------------

@pytest.mark.parametrize("fault", ["unknown", "invalidated", "other_pd", "outside",
                                   "no_local_write"])
async def test_local_key_fault_loc_prot_err(pair: Pair, fault):
    i, t = pair.initiator, pair.target
    mr = await i.reg_mr(4096)
    dst = await t.reg_mr(4096)
    local = [sge(mr, 1024)]
    opcode = sh.IBV_WR_RDMA_WRITE
    if fault == "unknown":
        local = [sh.SGE(mr.addr, 1024, 0xDEAD42)]
    elif fault == "invalidated":
        await mr.close()            # ibv_dereg_mr: the lkey is gone
    elif fault == "other_pd":
        other = await (await i.ctx.alloc_pd()).reg_mr(4096, sh.IBV_ACCESS_LOCAL_WRITE)
        local = [sge(other, 1024)]
    elif fault == "outside":
        local = [sh.SGE(mr.addr + 4000, 1024, mr.lkey)]
    elif fault == "no_local_write":
        # An RDMA_READ scatters into local memory: the lkey needs LOCAL_WRITE.
        ro = await i.reg_mr(4096, access=sh.IBV_ACCESS_REMOTE_READ)
        local, opcode = [sge(ro, 1024)], sh.IBV_WR_RDMA_READ
    await i.qp.post_send(rdma(opcode, local, dst.rkey, dst.addr, wr_id=9, send_flags=0))
    wc = await one(i.scq)
    assert (wc.wr_id, wc.status) == (9, sh.IBV_WC_LOC_PROT_ERR), "unsignaled, yet completes"
    assert await state(i) == sh.IBV_QPS_ERR
    # "—" on the responder: nothing completes there, its QP keeps working.
    assert await t.rcq.poll(timeout=0.2) == []
    assert await state(t) == sh.IBV_QPS_RTS


# -- row 2: remote key faults: REM_ACCESS_ERR, both QPs to ERR -----------------------------

@pytest.mark.parametrize("fault", ["unknown", "invalidated", "other_pd", "no_remote_write",
                                   "no_remote_read", "outside"])
async def test_remote_key_fault_rem_access_err(pair: Pair, fault):
    i, t = pair.initiator, pair.target
    src = await i.reg_mr(4096)
    dst = await t.reg_mr(4096)
    rkey, addr, opcode = dst.rkey, dst.addr, sh.IBV_WR_RDMA_WRITE
    if fault == "unknown":
        rkey = 0xBAD042
    elif fault == "invalidated":
        await dst.close()
    elif fault == "other_pd":
        other = await (await t.ctx.alloc_pd()).reg_mr(4096, sh.IBV_ACCESS_LOCAL_WRITE
                                                       | sh.IBV_ACCESS_REMOTE_WRITE)
        rkey, addr = other.rkey, other.addr
    elif fault == "no_remote_write":
        ro = await t.reg_mr(4096, access=sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_READ)
        rkey, addr = ro.rkey, ro.addr
    elif fault == "no_remote_read":
        wo = await t.reg_mr(4096, access=sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE)
        rkey, addr, opcode = wo.rkey, wo.addr, sh.IBV_WR_RDMA_READ
    elif fault == "outside":
        addr = dst.addr + 3500
    await t.qp.post_recv(sh.RecvWR(wr_id=77, sg=whole(await t.reg_mr(64))))
    await i.qp.post_send(rdma(opcode, [sge(src, 1024)], rkey, addr, wr_id=5, send_flags=0))
    wc = await one(i.scq)
    assert (wc.wr_id, wc.status) == (5, sh.IBV_WC_REM_ACCESS_ERR)
    await assert_both_err(pair)
    # "nothing posted": the responder's pending receive is flushed, not consumed.
    rwc = await one(t.rcq)
    assert (rwc.wr_id, rwc.status) == (77, sh.IBV_WC_WR_FLUSH_ERR)


# -- rows 3 and 4: a length that splits a PI ------------------------------------------------

async def test_pi_splitting_length_local_loc_len_err(pair: Pair):
    i, t = pair.initiator, pair.target
    mr = await t.reg_mr(8 * 512)
    mkey = await t.mkey(SIG_FLAGS, sges=whole(mr), sig=WIRE_DIF)
    dst = await i.reg_mr(8 * 520)
    await i.qp.post_recv(sh.RecvWR(wr_id=1, sg=whole(dst)))
    await t.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND,
                                   sg=[sh.SGE(0, SPLITTING, mkey.lkey)], send_flags=0))
    wc = await one(t.scq)
    assert (wc.wr_id, wc.status) == (2, sh.IBV_WC_LOC_LEN_ERR)
    assert await state(t) == sh.IBV_QPS_ERR


async def test_pi_splitting_length_remote_rem_inv_req_err(pair: Pair):
    i, t = pair.initiator, pair.target
    mr = await t.reg_mr(8 * 512)
    mkey = await t.mkey(SIG_FLAGS, sges=whole(mr), sig=WIRE_DIF)
    src = await i.reg_mr(bytes(range(256)) * 33)
    await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, SPLITTING)], mkey.rkey, 0,
                              wr_id=3))
    wc = await one(i.scq)
    assert (wc.wr_id, wc.status) == (3, sh.IBV_WC_REM_INV_REQ_ERR)
    await assert_both_err(pair)
    assert await mr.read() == bytes(8 * 512), "nothing was scattered"


async def test_misaligned_start_on_a_signature_mkey_rem_inv_req_err(pair: Pair):
    i, t = pair.initiator, pair.target
    mr = await t.reg_mr(8 * 512)
    mkey = await t.mkey(SIG_FLAGS, sges=whole(mr), sig=WIRE_DIF)
    src = await i.reg_mr(520)
    # A transfer must start at a multiple of W = 520 wire bytes.
    wc = await pair.write([sge(src)], mkey.rkey, 100)
    assert wc.status == sh.IBV_WC_REM_INV_REQ_ERR
    await assert_both_err(pair)


# -- rows 5 and 6: crypto faults ------------------------------------------------------------

async def test_crypto_mkey_without_crypto_attrs_local_loc_prot_err(pair: Pair):
    i, t = pair.initiator, pair.target
    mr = await t.reg_mr(4096)
    mkey = await t.mkey(CRYPTO_ONLY, sges=whole(mr))
    await i.qp.post_recv(sh.RecvWR(wr_id=1, sg=whole(await i.reg_mr(4096))))
    await t.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND,
                                   sg=[sh.SGE(0, 4096, mkey.lkey)]))
    wc = await one(t.scq)
    assert (wc.wr_id, wc.status) == (2, sh.IBV_WC_LOC_PROT_ERR)
    assert await state(t) == sh.IBV_QPS_ERR


@pytest.mark.parametrize("fault", ["no_crypto_attrs", "bad_xts_job"])
async def test_crypto_fault_remote_rem_op_err(pair: Pair, fault):
    i, t = pair.initiator, pair.target
    mr = await t.reg_mr(4096)
    length = 4096
    if fault == "no_crypto_attrs":
        mkey = await t.mkey(CRYPTO_ONLY, sges=whole(mr))
    else:
        dek = await t.dek(bytes(range(64)))
        attr = sh.Mlx5CryptoAttr(crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS,
                                 encrypt_on_tx=True, data_unit_size=sh.MLX5DV_BLOCK_SIZE_512,
                                 dek=dek)
        mkey = await t.mkey(CRYPTO_ONLY, sges=whole(mr), crypto=attr)
        length = 520       # 512 + 8: a last data unit of 8 bytes, below XTS's 16
    dst = await i.reg_mr(4096)
    await i.qp.post_send(rdma(sh.IBV_WR_RDMA_READ, [sge(dst, length)], mkey.rkey, 0, wr_id=4))
    wc = await one(i.scq)
    assert (wc.wr_id, wc.status) == (4, sh.IBV_WC_REM_OP_ERR)
    await assert_both_err(pair)


# -- row 7: SEND larger than the receive ----------------------------------------------------

async def test_send_larger_than_receive(pair: Pair):
    i, t = pair.initiator, pair.target
    src = await i.reg_mr(3000)
    dst = await t.reg_mr(4096)
    await t.qp.post_recv(sh.RecvWR(wr_id=11, sg=[sge(dst, 2000)]))
    await i.qp.post_send(sh.SendWR(wr_id=12, opcode=sh.IBV_WR_SEND, sg=whole(src)))
    swc, rwc = await one(i.scq), await one(t.rcq)
    assert (swc.wr_id, swc.status) == (12, sh.IBV_WC_REM_INV_REQ_ERR)
    assert (rwc.wr_id, rwc.status) == (11, sh.IBV_WC_LOC_LEN_ERR)
    await assert_both_err(pair)


# -- row 8: no receive posted: RNR -------------------------------------------------------------

async def test_no_receive_rnr_retry_exceeded():
    async with two_nodes(connect=False) as p:
        # min_rnr_timer 1 = 0.01 ms (ibv_modify_qp(3) table); rnr_retry 2 then give up.
        await connect_pair(p.target, p.initiator, rnr_retry=2, min_rnr_timer=1)
        src = await p.initiator.reg_mr(100)
        await p.initiator.qp.post_send(sh.SendWR(wr_id=21, opcode=sh.IBV_WR_SEND,
                                                 sg=whole(src)))
        wc = await one(p.initiator.scq)
        assert (wc.wr_id, wc.status) == (21, sh.IBV_WC_RNR_RETRY_EXC_ERR)


async def test_no_receive_retried_forever_until_one_is_posted(pair: Pair):
    i, t = pair.initiator, pair.target
    src = await i.reg_mr(b"late receive" * 10)
    dst = await t.reg_mr(4096)
    await i.qp.post_send(sh.SendWR(wr_id=22, opcode=sh.IBV_WR_SEND, sg=whole(src)))
    # rnr_retry 7 (the harness default) means forever: nothing completes meanwhile.
    assert await i.scq.poll(timeout=0.3) == []
    await t.qp.post_recv(sh.RecvWR(wr_id=23, sg=whole(dst)))
    swc, rwc = await one(i.scq), await one(t.rcq)
    assert (swc.status, rwc.status, rwc.byte_len) == (S, S, 120)
    assert await dst.read(120) == b"late receive" * 10


# -- row 9: no answer from the peer: RETRY_EXC_ERR -------------------------------------------

async def test_no_answer_retry_exceeded_then_flush():
    async with sh.embedded() as inode, sh.embedded() as tnode:
        i, t = await make_side(inode), await make_side(tnode)
        # timeout 8 = 4.096 us * 2^8 = 1 ms; retry_cnt 2.
        await connect_pair(i, t, timeout=8, retry_cnt=2)
        src = await i.reg_mr(4096)
        dst = await t.reg_mr(4096)
        await t.node.close()        # the target's process exits: its QP is gone
        wrs = [rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, 1024)], dst.rkey, dst.addr, wr_id=n,
                    send_flags=0 if n == 32 else sh.IBV_SEND_SIGNALED) for n in (31, 32, 33)]
        await i.qp.post_send(wrs)
        wcs = await i.scq.poll_n(3, TIMEOUT)
        assert [(w.wr_id, w.status) for w in wcs] == [
            (31, sh.IBV_WC_RETRY_EXC_ERR), (32, sh.IBV_WC_WR_FLUSH_ERR),
            (33, sh.IBV_WC_WR_FLUSH_ERR)]


# -- row 10: QP in ERR flushes everything -------------------------------------------------------

async def test_qp_in_err_flushes_outstanding_and_new_wrs(pair: Pair):
    t = pair.target
    recvs = [sh.RecvWR(wr_id=100 + n, sg=whole(await t.reg_mr(64))) for n in range(3)]
    await t.qp.post_recv(recvs)
    await t.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR))
    wcs = await t.rcq.poll_n(3, TIMEOUT)
    assert sorted((w.wr_id, w.status) for w in wcs) == [
        (100 + n, sh.IBV_WC_WR_FLUSH_ERR) for n in range(3)]
    # A WR posted in ERR completes at once with WR_FLUSH_ERR, even unsignaled.
    await t.qp.post_send(sh.SendWR(wr_id=7, opcode=sh.IBV_WR_SEND, sg=[], send_flags=0))
    wc = await one(t.scq)
    assert (wc.wr_id, wc.status) == (7, sh.IBV_WC_WR_FLUSH_ERR)


async def test_wrs_behind_an_error_are_flushed(pair: Pair):
    i, t = pair.initiator, pair.target
    src = await i.reg_mr(4096)
    dst = await t.reg_mr(4096)
    wrs = [rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, 100)], dst.rkey, dst.addr, wr_id=1),
           rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, 100)], 0xBAD042, dst.addr, wr_id=2),
           rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, 100)], dst.rkey, dst.addr, wr_id=3,
                send_flags=0)]
    await i.qp.post_send(wrs)
    wcs = await i.scq.poll_n(3, TIMEOUT)
    assert [(w.wr_id, w.status) for w in wcs] == [
        (1, S), (2, sh.IBV_WC_REM_ACCESS_ERR), (3, sh.IBV_WC_WR_FLUSH_ERR)]


async def test_signature_errors_are_not_completion_errors(pair: Pair):
    """The last sentence of section 9: a failed check completes SUCCESS, mkey_check tells."""
    i, t = pair.initiator, pair.target
    mr = await t.reg_mr(bytes(4 * 516))        # every stored CRC32 is 0: all wrong
    mkey = await t.mkey(SIG_FLAGS, sges=whole(mr), sig=MEM_CRC32)
    dst = await i.reg_mr(4 * 512)
    wc = await pair.read([sge(dst)], mkey.rkey, 0)
    assert wc.status == S
    err = await mkey.mkey_check()
    assert (err.err_type, err.sig_err.offset) == (sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD, 0)


async def test_sq_sig_all_signals_unsignaled_wrs():
    async with two_nodes(sq_sig_all=True) as p:
        src = await p.initiator.reg_mr(64)
        dst = await p.target.reg_mr(64)
        await p.initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey,
                                            dst.addr, wr_id=5, send_flags=0))
        wc = await one(p.initiator.scq)
        assert (wc.wr_id, wc.status, wc.opcode) == (5, S, sh.IBV_WC_RDMA_WRITE)
