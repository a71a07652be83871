"""Fault injection on the wire between two daemons, through the client API (the fault injection walk-through's cases).

Corrupting what travels shows the T10-PI end-to-end promise: a corruption made
before the link (integrity check recomputed) is caught only by the signature check
of the MKEY that receives it, at the block it hit, with the stored and computed
values; a link error (integrity check left stale) is dropped and recovered by RC
retransmission, and nothing reaches memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

import softhca.client as sh
from softhca.tools import oracle

from e2e import (
    SIG_CRYPTO_FLAGS,
    SIG_FLAGS,
    Pair,
    connect_pair,
    make_side,
    rdma,
    sge,
    two_nodes,
    whole,
)

BLOCKS = 8
W = 520
APP, REF = 0x1234, 0x100
GUARD, APPTAG, REFTAG = (sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD, sh.MLX5DV_MKEY_SIG_BLOCK_BAD_APPTAG,
                         sh.MLX5DV_MKEY_SIG_BLOCK_BAD_REFTAG)


def dif_domain(flags: int = sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP) -> sh.Mlx5SigBlockDomain:
    return sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
                                 dif=sh.Mlx5SigT10Dif(bg=0, app_tag=APP, ref_tag=REF,
                                                      flags=flags),
                                 block_size=sh.MLX5DV_BLOCK_SIZE_512)


def wire_image(data: bytes, app=lambda b: APP) -> bytes:
    return oracle.protect_blocks(data, 512, lambda blk, b: oracle.t10dif_pi(blk, app=app(b),
                                                                   ref=REF + b))


async def write_scene(p, rng, **rule):
    """The target's MKEY (wire T10-DIF on 512-byte blocks, memory none) and an
    initiator MR holding 8 protected blocks; the rule goes on the initiator's daemon."""
    data = rng.randbytes(BLOCKS * 512)
    image = wire_image(data)
    mr = await p.target.reg_mr(len(data))
    mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr),
                               sig=sh.Mlx5SigBlockAttr(wire=dif_domain(), check_mask=0xFF))
    src = await p.initiator.reg_mr(image)
    if rule:
        await p.initiator.node.faults.add(rule)
    wc = await p.write(whole(src), mkey.rkey, 0)
    return data, image, mr, mkey, wc


@contextlib.asynccontextmanager
async def rules_cleared(p):
    """The cases install rules on daemons that may outlive them (a remote target):
    every rule goes when the case ends, passed or failed."""
    try:
        yield
    finally:
        for node in (p.initiator.node, p.target.node):
            with contextlib.suppress(sh.RDMAError):
                await node.faults.clear()


async def fresh_pair(p, **connect_kw) -> Pair:
    """Another QP pair between the same two daemons, connected with ``connect_kw``
    (retry counts, timeouts) the case needs."""
    i, t = await make_side(p.initiator.node), await make_side(p.target.node)
    await connect_pair(i, t, **connect_kw)
    return Pair(t, i)


def blocks_equal_except(got: bytes, want: bytes, k: int | None) -> bool:
    return all(got[b * 512:(b + 1) * 512] == want[b * 512:(b + 1) * 512]
               for b in range(BLOCKS) if b != k)


DIF_FIELDS = [("guard", 3), ("app_tag", 5), ("ref_tag", 0), ("data", 7)]


@pytest.mark.parametrize("field,k", DIF_FIELDS)
async def test_corrupted_wire_block_caught_by_the_targets_mkey_check(rng, field, k):
    async with two_nodes() as p:
        await case_dif_field(p, rng, field, k)


async def case_dif_field(p, rng, field, k):
    async with rules_cleared(p):
        rule = {"action": "corrupt", "opcode": "RDMA_WRITE", "block": k, "block_size": W,
                "field": field, "xor": 0x10 if field != "data" else 0x80,
                "icrc": "recompute", "count": 1}
        if field == "data":
            rule["offset"] = 100
        data, image, mr, mkey, wc = await write_scene(p, rng, **rule)
        assert wc.status == sh.IBV_WC_SUCCESS, "the initiator learns nothing"
        err = await mkey.mkey_check()
        blk = data[k * 512:(k + 1) * 512]
        stored_guard = int.from_bytes(image[k * W + 512:k * W + 514], "big")
        if field == "guard":
            want = (GUARD, oracle.t10dif_crc(blk, 0), stored_guard ^ 0x10)
        elif field == "app_tag":
            want = (APPTAG, APP, APP ^ 0x10)
        elif field == "ref_tag":
            want = (REFTAG, REF + k, (REF + k) ^ 0x10)
        else:
            bad = bytearray(blk)
            bad[100] ^= 0x80
            want = (GUARD, oracle.t10dif_crc(bytes(bad), 0), stored_guard)
        assert (err.err_type, err.sig_err.actual_value, err.sig_err.expected_value,
                err.sig_err.offset) == (*want, k * W)
        got = await mr.read()
        assert blocks_equal_except(got, data, k), "the other blocks land intact"
        if field != "data":
            assert got == data, "only PI was corrupted: the data itself is intact"
        (rule_state,) = await p.initiator.node.faults.list()
        assert rule_state["fired"] >= 1


async def test_stale_integrity_check_is_a_link_error_dropped_and_retransmitted(rng):
    async with two_nodes(mtu=sh.IBV_MTU_1024) as p:
        await case_stale_icrc(p, rng)


async def case_stale_icrc(p, rng):
    async with rules_cleared(p):
        # Block 2's ref tag is bytes 1036..1039: the second of five packets.
        before_t = await p.target.node.counters()
        before_i = await p.initiator.node.counters()
        data, _, mr, mkey, wc = await write_scene(
            p, rng, action="corrupt", opcode="RDMA_WRITE", block=2, block_size=W,
            field="ref_tag", icrc="stale", count=1)
        assert wc.status == sh.IBV_WC_SUCCESS
        assert await mr.read() == data
        assert (await mkey.mkey_check()).err_type == sh.MLX5DV_MKEY_NO_ERR
        after_t = await p.target.node.counters()
        after_i = await p.initiator.node.counters()
        assert after_t["packets_bad_icrc"] - before_t["packets_bad_icrc"] == 1
        assert after_i["retransmissions"] - before_i["retransmissions"] == 1


async def test_corrupted_read_response_caught_by_the_initiators_mkey(rng):
    async with two_nodes() as p:
        await case_read_response(p, rng)


async def case_read_response(p, rng):
    async with rules_cleared(p):
        k = 4
        data = rng.randbytes(BLOCKS * 512)
        src = await p.target.reg_mr(wire_image(data))
        dst = await p.initiator.reg_mr(len(data))
        mkey = await p.initiator.mkey(SIG_FLAGS, sges=whole(dst),
                                      sig=sh.Mlx5SigBlockAttr(wire=dif_domain(),
                                                              check_mask=0xFF))
        await p.target.node.faults.add(action="corrupt", opcode="RDMA_READ_RESPONSE",
                                       block=k, block_size=W, field="guard", set=0xDEAD)
        await p.initiator.qp.post_send(rdma(sh.IBV_WR_RDMA_READ, [sh.SGE(0, BLOCKS * W,
                                                                          mkey.lkey)],
                                            src.rkey, src.addr, wr_id=1))
        (wc,) = await p.initiator.send_wc()
        assert wc.status == sh.IBV_WC_SUCCESS
        err = await mkey.mkey_check()
        assert (err.err_type, err.sig_err.actual_value, err.sig_err.expected_value,
                err.sig_err.offset) == (GUARD, oracle.t10dif_crc(data[k * 512:(k + 1) * 512], 0),
                                        0xDEAD, k * W)
        assert await dst.read() == data


async def test_crypto_row_c_ciphertext_corruption_fails_the_dif_check_after_decryption(rng):
    async with two_nodes() as p:
        await case_row_c(p, rng)


async def case_row_c(p, rng):
    async with rules_cleared(p):
        k = 6
        key = bytes(range(64))
        tweak = 0x0123456789ABCDEF
        data = rng.randbytes(BLOCKS * 512)
        wire = oracle.xts(key, wire_image(data), W, tweak, encrypt=True)
        mr = await p.target.reg_mr(len(data))
        dek = await p.target.dek(key)
        crypto = sh.Mlx5CryptoAttr(
            crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS, encrypt_on_tx=True,
            signature_crypto_order=sh.MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_BEFORE_CRYPTO_ON_TX,
            data_unit_size=sh.MLX5DV_BLOCK_SIZE_520, initial_tweak=tweak.to_bytes(16, "little"),
            dek=dek)
        mkey = await p.target.mkey(SIG_CRYPTO_FLAGS, sges=whole(mr), crypto=crypto,
                                   sig=sh.Mlx5SigBlockAttr(wire=dif_domain(), check_mask=0xFF))
        src = await p.initiator.reg_mr(wire)
        # Clean first: row C's wire image decrypts and checks.
        assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        assert (await mkey.mkey_check()).err_type == sh.MLX5DV_MKEY_NO_ERR
        assert await mr.read() == data
        await p.initiator.node.faults.add(action="corrupt", opcode="RDMA_WRITE", block=k,
                                          block_size=W, field="data", offset=33, xor=0x01)
        assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        err = await mkey.mkey_check()
        assert err.err_type in (GUARD, APPTAG, REFTAG) and err.sig_err.offset == k * W
        assert blocks_equal_except(await mr.read(), data, k)


async def test_app_escape_hides_a_corruption_as_the_hardware_would(rng):
    async with two_nodes() as p:
        await case_app_escape(p, rng)


async def case_app_escape(p, rng):
    async with rules_cleared(p):
        k = 2
        data = rng.randbytes(BLOCKS * 512)
        image = wire_image(data, app=lambda b: 0xFFFF if b == k else APP)
        mr = await p.target.reg_mr(len(data))
        flags = sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP | sh.MLX5DV_SIG_T10DIF_FLAG_APP_ESCAPE
        mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr),
                                   sig=sh.Mlx5SigBlockAttr(wire=dif_domain(flags),
                                                           check_mask=0xFF))
        src = await p.initiator.reg_mr(image)
        await p.initiator.node.faults.add(action="corrupt", opcode="RDMA_WRITE", block=k,
                                          block_size=W, field="guard", xor=0xFF)
        assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        assert (await mkey.mkey_check()).err_type == sh.MLX5DV_MKEY_NO_ERR
        assert (await p.initiator.node.faults.list())[0]["fired"] == 1, "it was corrupted"
        # The same corruption one block further, without the escape, is caught.
        await p.initiator.node.faults.clear()
        await p.initiator.node.faults.add(action="corrupt", opcode="RDMA_WRITE", block=k + 1,
                                          block_size=W, field="guard", xor=0xFF)
        await p.write(whole(src), mkey.rkey, 0)
        err = await mkey.mkey_check()
        assert (err.err_type, err.sig_err.offset) == (GUARD, (k + 1) * W)


async def test_2000_messages_over_a_lossy_duplicating_reordering_link():
    async with two_nodes() as p:
        await case_lossy_link(p, random.Random(2000))


async def case_lossy_link(p, rng, n: int = 2000, timeout: int = 10):
    async with rules_cleared(p):
        # 4 ms ACK timeout by default (timeout 10): each loss costs one, so the run stays
        # short. Across processes or hosts a caller gives the scheduler more room.
        q = await fresh_pair(p, mtu=sh.IBV_MTU_1024, timeout=timeout)
        i, t = q.initiator, q.target
        for node, seed in ((i.node, 1), (t.node, 2)):
            await node.faults.add(action="drop", probability=0.05, seed=seed)
            await node.faults.add(action="duplicate", probability=0.05, seed=seed + 10)
            await node.faults.add(action="reorder", probability=0.05, seed=seed + 20, window=3)
        size_max = 3000
        sizes = [rng.randrange(0, size_max) for _ in range(n)]
        src = await i.reg_mr(rng.randbytes(size_max))
        dst = await t.reg_mr(n * size_max)
        want = bytearray(dst.length)
        image = await src.read()
        recvs, sends = [], []
        for m, size in enumerate(sizes):
            if m % 2:
                sends.append(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, size)], dst.rkey,
                                  dst.addr + m * size_max, wr_id=m))
            else:
                recvs.append(sh.RecvWR(wr_id=m, sg=[sge(dst, size, m * size_max)]))
                sends.append(sh.SendWR(wr_id=m, opcode=sh.IBV_WR_SEND, sg=[sge(src, size)]))
            want[m * size_max:m * size_max + size] = image[:size]
        for start in range(0, n, 100):
            await t.qp.post_recv([r for r in recvs if start <= r.wr_id < start + 100])
            await i.qp.post_send(sends[start:start + 100])
            wcs = await i.scq.poll_n(100, 60)
            assert [w.wr_id for w in wcs] == list(range(start, start + 100))
            assert all(w.status == sh.IBV_WC_SUCCESS for w in wcs)
        rwcs = await t.rcq.poll_n(len(recvs), 60)
        assert sorted(w.wr_id for w in rwcs) == [r.wr_id for r in recvs]
        assert all(w.status == sh.IBV_WC_SUCCESS and w.byte_len == sizes[w.wr_id] for w in rwcs)
        assert await i.scq.poll(timeout=0.1) == [] and await t.rcq.poll() == []
        assert await dst.read() == bytes(want)
        ci, ct = await i.node.counters(), await t.node.counters()
        fired = [r["fired"] for r in await i.node.faults.list() + await t.node.faults.list()]
        assert all(f > 0 for f in fired), fired
        assert ci["retransmissions"] > 0 and ct["duplicates_discarded"] > 0


async def test_all_packets_dropped_retry_exceeded_then_flushed():
    async with two_nodes() as p:
        await case_all_dropped(p)


async def case_all_dropped(p, rng=None):
    async with rules_cleared(p):
        q = await fresh_pair(p, timeout=8, retry_cnt=3)        # 1 ms ACK timeout
        i, t = q.initiator, q.target
        await i.node.faults.add(action="drop", qp=i.qp.qp_num)
        src = await i.reg_mr(1024)
        dst = await t.reg_mr(1024)
        before = await i.node.counters()
        await i.qp.post_send([rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey, dst.addr,
                                   wr_id=w) for w in (1, 2, 3)])
        wcs = await i.scq.poll_n(3, 10)
        assert [(w.wr_id, w.status) for w in wcs] == [
            (1, sh.IBV_WC_RETRY_EXC_ERR), (2, sh.IBV_WC_WR_FLUSH_ERR), (3, sh.IBV_WC_WR_FLUSH_ERR)]
        after = await i.node.counters()
        assert after["ack_timeouts"] - before["ack_timeouts"] == 3 + 1, "retry_cnt, then give up"
        assert after["retransmissions"] - before["retransmissions"] == 3


async def test_rnr_on_every_receive_exhausts_rnr_retry():
    async with two_nodes() as p:
        await case_rnr_every_receive(p)


async def case_rnr_every_receive(p, rng=None):
    async with rules_cleared(p):
        q = await fresh_pair(p, rnr_retry=2, min_rnr_timer=1)
        i, t = q.initiator, q.target
        before = (await i.node.counters())["rnr_retries"]
        await t.node.faults.add(action="rnr", direction="in", qp=t.qp.qp_num)
        src = await i.reg_mr(100)
        await t.qp.post_recv(sh.RecvWR(wr_id=1, sg=whole(await t.reg_mr(100))))
        await i.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND, sg=whole(src)))
        (wc,) = await i.send_wc()
        assert wc.status == sh.IBV_WC_RNR_RETRY_EXC_ERR
        assert (await i.node.counters())["rnr_retries"] - before == 3
        assert (await t.node.faults.list())[0]["fired"] == 3, "first try and two retries"
        # The receive was never consumed: it is flushed with the QP, not completed.
        await t.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR))
        (rwc,) = await t.recv_wc()
        assert (rwc.wr_id, rwc.status) == (1, sh.IBV_WC_WR_FLUSH_ERR)


@pytest.mark.parametrize("rule,words", [
    ({"action": "corrupt", "block": 1, "block_size": 520, "colour": "red"}, "unknown field"),
    ({"action": "explode"}, "action"),
    ({"action": "corrupt", "block": 1}, "block_size"),
    ({"action": "corrupt", "block": 1, "block_size": 520, "field": "data", "offset": 600},
     "past the 512 data bytes"),
    ({"action": "corrupt", "block": 0, "block_size": 520, "field": "app_tag", "set": 1 << 16},
     "does not fit"),
    ({"action": "drop", "probability": 1.5}, "probability"),
    ({"action": "rnr"}, "direction 'in'"),
    ({"action": "drop", "xor": 1}, "only go with action 'corrupt'"),
])
async def test_malformed_rules_are_refused(rule, words):
    async with sh.embedded() as node:
        with pytest.raises(sh.RDMAError) as e:
            await node.faults.add(rule)
        assert e.value.errno_name == "EINVAL" and words in e.value.message
        assert await node.faults.list() == []


async def test_a_block_past_the_message_never_fires(rng):
    async with two_nodes() as p:
        data, _, mr, mkey, wc = await write_scene(
            p, rng, action="corrupt", opcode="RDMA_WRITE", block=BLOCKS + 3, block_size=W,
            field="guard")
        assert wc.status == sh.IBV_WC_SUCCESS and await mr.read() == data
        assert (await p.initiator.node.faults.list())[0]["fired"] == 0


async def test_rules_come_and_go_without_disturbing_traffic_on_other_qps():
    async with sh.embedded() as inode, sh.embedded() as tnode:
        pairs = []
        for _ in range(3):
            i, t = await make_side(inode), await make_side(tnode)
            await connect_pair(i, t)
            pairs.append((i, t, await i.reg_mr(bytes(range(256)) * 64),
                          await t.reg_mr(3 * 16384)))
        victim_qpn = pairs[0][0].qp.qp_num

        async def traffic(i, t, src, dst, rounds=30):
            for r in range(rounds):
                await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(src), dst.rkey,
                                          dst.addr + (r % 3) * 16384, wr_id=r))
                (wc,) = await i.scq.poll_n(1, 20)
                assert (wc.wr_id, wc.status) == (r, sh.IBV_WC_SUCCESS)
            assert await dst.read() == (await src.read()) * 3

        async def churn():
            for _ in range(20):
                await inode.faults.add(action="drop", qp=victim_qpn, probability=0.3, seed=5)
                await asyncio.sleep(0.005)
                await inode.faults.clear()

        await asyncio.gather(churn(), *(traffic(*pr) for pr in pairs))
        assert await inode.faults.list() == []


@pytest.mark.parametrize("mtu, kind", [(sh.IBV_MTU_1024, "crc32-wire"),
                                       (sh.IBV_MTU_256, "xts")])
async def test_lost_read_response_through_a_block_mkey_is_recovered(rng, mtu, kind):
    """A READ through a signature or crypto MKEY whose second response is lost: the
    requester asks again for the rest, from that response's offset (one path MTU in,
    inside a protection block of 516 wire bytes or an XTS data unit of 512); the
    responder answers with the original transfer's responses from there (a new
    transfer cannot start inside a block) and the READ completes with the bytes a READ
    without the loss gets. It used to fail with IBV_WC_REM_INV_REQ_ERR (found by
    tests/e2e/test_differential.py)."""
    async with two_nodes(mtu=mtu) as p:
        t, i = p.target, p.initiator
        data = rng.randbytes(8 * 512)
        disk = await t.reg_mr(data)
        if kind == "xts":
            key = rng.randbytes(64)
            crypto = sh.Mlx5CryptoAttr(
                crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS, encrypt_on_tx=False,
                data_unit_size=sh.MLX5DV_BLOCK_SIZE_512, initial_tweak=bytes(16),
                dek=await t.dek(key))
            mkey = await t.mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                                | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO, sges=whole(disk),
                                crypto=crypto)
            length = 7 * 512
        else:
            crc = sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_CRC,
                                        crc=sh.Mlx5SigCrc(crc_type=sh.MLX5DV_SIG_CRC_TYPE_CRC32,
                                                          seed=0xFFFFFFFF),
                                        block_size=sh.MLX5DV_BLOCK_SIZE_512)
            mkey = await t.mkey(SIG_FLAGS, sges=whole(disk),
                                sig=sh.Mlx5SigBlockAttr(wire=crc, check_mask=0xFF))
            length = 7 * 516
        clean = await i.reg_mr(length)
        assert (await p.read(whole(clean), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
        async with rules_cleared(p):
            await t.node.faults.add(action="drop", qp=t.qp.qp_num,
                                    opcode="RDMA_READ_RESPONSE", message=1, packet=2, count=1)
            lossy = await i.reg_mr(length)
            wc = await p.read(whole(lossy), mkey.rkey, 0)
            assert wc.status == sh.IBV_WC_SUCCESS, wc
            assert [r["fired"] for r in await t.node.faults.list()] == [1]
        assert await lossy.read() == await clean.read()
        assert (await t.node.counters())["duplicate_reads_answered"] >= 1
