"""Reliability: 10,000 mixed work requests over 8 QP pairs between two daemons.

Sizes run from 0 to 64 KiB (log-uniform, so every order of magnitude is exercised),
plus fifty messages of 1 MiB. Every WR writes its own destination range, so after
the run one read of each MR, compared with an image built by the test in Python,
shows every byte where it belongs; every signaled WR must complete exactly once,
with SUCCESS, and every RECV with the right byte_len and immediate data.
"""

from __future__ import annotations

import asyncio
import math
import random

import softhca.client as sh

from e2e import connect_pair, make_side, sge

PAIRS = 8
TOTAL_WRS = 10_000
BIG = 50
BIG_SIZE = 1 << 20
MAX_SIZE = 64 << 10
BATCH = 48              # WRs posted per post_send call; the last one of each is signaled
SOURCE = 2 << 20        # random source bytes on each side
OPS = [sh.IBV_WR_RDMA_WRITE, sh.IBV_WR_RDMA_WRITE_WITH_IMM, sh.IBV_WR_SEND,
       sh.IBV_WR_SEND_WITH_IMM, sh.IBV_WR_RDMA_READ]


def plan(rng: random.Random, n: int, n_big: int) -> list[tuple[int, int]]:
    """(opcode, size) for each WR."""
    sizes = [0 if rng.random() < 0.02 else int(math.exp(rng.uniform(0, math.log(MAX_SIZE))))
             for _ in range(n - n_big)]
    sizes += [BIG_SIZE] * n_big
    rng.shuffle(sizes)
    return [(rng.choice(OPS), s) for s in sizes]


async def run_pair(k: int, inode: sh.Node, tnode: sh.Node, n: int, n_big: int) -> dict:
    rng = random.Random(9000 + k)
    i = await make_side(inode, max_wr=1024)
    t = await make_side(tnode, max_wr=1024)
    await connect_pair(i, t, mtu=sh.IBV_MTU_4096)
    wrs = plan(rng, n, n_big)
    out_bytes = sum(s for op, s in wrs if op != sh.IBV_WR_RDMA_READ)
    in_bytes = sum(s for op, s in wrs if op == sh.IBV_WR_RDMA_READ)
    isrc, tsrc = rng.randbytes(SOURCE), rng.randbytes(SOURCE)
    imr = await i.reg_mr(SOURCE + in_bytes)
    tmr = await t.reg_mr(SOURCE + out_bytes)
    await imr.write(isrc)
    await tmr.write(tsrc)
    want_i, want_t = bytearray(imr.length), bytearray(tmr.length)
    want_i[:SOURCE], want_t[:SOURCE] = isrc, tsrc
    t_next, i_next = SOURCE, SOURCE
    signaled: dict[int, int] = {}       # wr_id -> opcode
    recvs: dict[int, tuple[int, int | None]] = {}   # recv wr_id -> (byte_len, imm)
    got_send, got_recv = [], []
    for start in range(0, n, BATCH):
        batch = []
        recv_batch = []
        for j, (op, size) in enumerate(wrs[start:start + BATCH]):
            wr_id = start + j + 1
            last = j == len(wrs[start:start + BATCH]) - 1
            flags = sh.IBV_SEND_SIGNALED if last or rng.random() < 0.7 else 0
            imm = rng.getrandbits(32) if op in (sh.IBV_WR_SEND_WITH_IMM,
                                                sh.IBV_WR_RDMA_WRITE_WITH_IMM) else None
            if op == sh.IBV_WR_RDMA_READ:
                off = rng.randrange(0, SOURCE - size + 1)
                local = [sge(imr, size, i_next)]
                wr = sh.SendWR(wr_id=wr_id, opcode=op, sg=local, send_flags=flags)
                wr.set_wr_rdma(tmr.rkey, tmr.addr + off)
                want_i[i_next:i_next + size] = tsrc[off:off + size]
                i_next += size
            else:
                off = rng.randrange(0, SOURCE - size + 1)
                wr = sh.SendWR(wr_id=wr_id, opcode=op, sg=[sge(imr, size, off)],
                               send_flags=flags, imm_data=imm)
                want_t[t_next:t_next + size] = isrc[off:off + size]
                if op in (sh.IBV_WR_RDMA_WRITE, sh.IBV_WR_RDMA_WRITE_WITH_IMM):
                    wr.set_wr_rdma(tmr.rkey, tmr.addr + t_next)
                if op != sh.IBV_WR_RDMA_WRITE:
                    # SENDs land in their RECV; WRITE_WITH_IMM consumes one for the imm.
                    rsg = [sge(tmr, size, t_next)] if op != sh.IBV_WR_RDMA_WRITE_WITH_IMM else []
                    recv_batch.append(sh.RecvWR(wr_id=wr_id, sg=rsg))
                    recvs[wr_id] = (size, imm)
                t_next += size
            if flags:
                signaled[wr_id] = op
            batch.append(wr)
        if recv_batch:
            await t.qp.post_recv(recv_batch)
        await i.qp.post_send(batch)
        n_sig = sum(1 for w in batch if w.send_flags)
        got_send += await i.scq.poll_n(n_sig, 60)
        if recv_batch:
            got_recv += await t.rcq.poll_n(len(recv_batch), 60)
    assert await imr.read() == bytes(want_i), f"pair {k}: initiator memory differs"
    assert await tmr.read() == bytes(want_t), f"pair {k}: target memory differs"
    return {"signaled": signaled, "recvs": recvs, "send_wcs": got_send, "recv_wcs": got_recv,
            "extra": await i.scq.poll(16) + await t.rcq.poll(16)}


async def test_10000_mixed_wrs_over_8_qp_pairs():
    async with sh.embedded() as inode, sh.embedded() as tnode:
        per = [TOTAL_WRS // PAIRS] * PAIRS
        bigs = [BIG // PAIRS + (1 if k < BIG % PAIRS else 0) for k in range(PAIRS)]
        results = await asyncio.gather(*(run_pair(k, inode, tnode, per[k], bigs[k])
                                         for k in range(PAIRS)))
    assert sum(per) == TOTAL_WRS and sum(bigs) == BIG
    wc_op = {sh.IBV_WR_RDMA_WRITE: sh.IBV_WC_RDMA_WRITE,
             sh.IBV_WR_RDMA_WRITE_WITH_IMM: sh.IBV_WC_RDMA_WRITE,
             sh.IBV_WR_SEND: sh.IBV_WC_SEND, sh.IBV_WR_SEND_WITH_IMM: sh.IBV_WC_SEND,
             sh.IBV_WR_RDMA_READ: sh.IBV_WC_RDMA_READ}
    for k, r in enumerate(results):
        ids = [w.wr_id for w in r["send_wcs"]]
        assert sorted(ids) == sorted(r["signaled"]), f"pair {k}: signaled WRs completed " \
                                                     "not exactly once"
        assert ids == sorted(ids), f"pair {k}: send completions out of order"
        for w in r["send_wcs"]:
            assert (w.status, w.opcode) == (sh.IBV_WC_SUCCESS, wc_op[r["signaled"][w.wr_id]])
        assert sorted(w.wr_id for w in r["recv_wcs"]) == sorted(r["recvs"])
        for w in r["recv_wcs"]:
            size, imm = r["recvs"][w.wr_id]
            assert (w.status, w.byte_len, w.imm_data) == (sh.IBV_WC_SUCCESS, size, imm)
        assert r["extra"] == [], f"pair {k}: completions beyond the ones owed"
