"""Signature pipelining and SQD: mlx5dv_create_qp(3) MLX5DV_QP_CREATE_SIG_PIPELINING,
mlx5dv_qp_cancel_posted_send_wrs(3), IBV_EVENT_SQ_DRAINED (ibv_get_async_event(3)).

The scenario is rdma-core's test_mlx5_mkey.py test_mkey_sig_pipelining_good/bad: an
RDMA_WRITE of 512 bytes through an MKEY whose memory domain carries a CRC32 (checked or
not), then a 16-byte SEND with IBV_SEND_FENCE, both with wr_id 1. Expected CRCs come
from the test's oracle, never from the engine.
"""

from __future__ import annotations

import pytest
from test_rc import Pair, packets_of, status_of

import softhca.client as sh
from softhca.engine.mkey_configure import MkeyConfigureBuilder
from softhca.engine.rc import RecvWR, SendWR
from softhca.protocol.attrs import SGE, SigBlockAttr, SigBlockDomain, SigCrc
from softhca.protocol.enums import (
    AccessFlags,
    BlockSize,
    EventType,
    MkeyErrType,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    QpAttrMask,
    QpState,
    SendFlags,
    SigCrcType,
    SigMask,
    SigType,
    WcOpcode,
    WcStatus,
    WrOpcode,
)
from softhca.protocol.errors import RDMAError
from softhca.tools import oracle

SIG_FENCE = int(SendFlags.SIGNALED | SendFlags.FENCE)
PIPELINING = {"sig_pipelining": True}


def crc32_pi(block: bytes) -> bytes:
    return oracle.crc_pi(block, SigCrcType.CRC32, 0xFFFFFFFF)


class Transaction:
    """test_mkey_sig_pipelining's players on the engine: the client (QP ``a``) writes 512
    bytes through its signature MKEY, then answers with a fenced SEND of 16 bytes."""

    def __init__(self, rng, *, check: bool, good_pi: bool, qp=PIPELINING) -> None:
        self.p = p = Pair(qp=qp)
        self.data = rng.randbytes(512)
        pi = crc32_pi(self.data)
        if not good_pi:
            pi = bytes(b ^ 0xFF for b in pi)
        self.src = p.mr(p.pda, self.data + pi)
        self.mkey = p.ha.create_mkey(p.pda, MkeyInitAttrFlags.INDIRECT
                                     | MkeyInitAttrFlags.BLOCK_SIGNATURE, 1)
        mem = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, 0xFFFFFFFF),
                             block_size=BlockSize.SIZE_512)
        MkeyConfigureBuilder(p.pda, Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE).post_configure(
            self.mkey, access=AccessFlags.LOCAL_WRITE,
            sges=[SGE(self.src.addr, 516, self.src.lkey)],
            sig=SigBlockAttr(mem=mem, wire=None,
                             check_mask=SigMask.CRC32 if check else 0),
            wr_id=9, wr_flags=SendFlags.INLINE)
        self.dst = p.mr(p.pdb, 512)
        self.resp = p.mr(p.pda, b"R" * 16)
        self.resp_dst = p.mr(p.pdb, 16)

    def data_wr(self) -> SendWR:
        return SendWR(1, WrOpcode.RDMA_WRITE, [SGE(0, 512, self.mkey.lkey)], 0,
                      rkey=self.dst.rkey, remote_addr=self.dst.addr)

    def resp_wr(self) -> SendWR:
        return SendWR(1, WrOpcode.SEND, [SGE(self.resp.addr, 16, self.resp.lkey)], SIG_FENCE)

    def start(self) -> None:
        p = self.p
        p.b.post_recv(RecvWR(5, [SGE(self.resp_dst.addr, 16, self.resp_dst.lkey)]))
        p.a.post_send(self.data_wr(), p.now)
        p.a.post_send(self.resp_wr(), p.now)
        p.run()


def test_bad_signature_stops_in_sqd_before_the_fenced_send(rng):
    t = Transaction(rng, check=True, good_pi=False)
    t.start()
    p = t.p
    assert p.a.state == QpState.SQD
    assert p.a.take_events() == [EventType.SQ_DRAINED]
    assert p.a.take_events() == []
    # "No completion is expected" on either side; the WRITE itself went through.
    assert p.wcs == {"a_send": [], "a_recv": [], "b_send": [], "b_recv": []}
    assert t.dst.read() == t.data
    assert t.mkey.mkey_check().err_type == MkeyErrType.BAD_GUARD
    # Only the SEND had not started: the WRITE with the same wr_id is done.
    assert p.a.cancel_posted_send_wrs(1) == 1
    assert p.a.cancel_posted_send_wrs(2) == 0
    p.a.post_send(t.resp_wr(), p.now)
    p.run()
    assert p.wcs["a_send"] == [] and p.a.state == QpState.SQD   # SQD starts nothing
    p.a.modify({"qp_state": QpState.RTS, "cur_qp_state": QpState.SQD},
               QpAttrMask.STATE | QpAttrMask.CUR_STATE)
    p.run()
    # The canceled SEND completes as a NOP, signaled, with its own opcode; then the repost.
    assert [(w.wr_id, w.status, w.opcode) for w in p.wcs["a_send"]] == \
        [(1, WcStatus.SUCCESS, WcOpcode.SEND)] * 2
    assert status_of(p.wcs["b_recv"]) == [(5, WcStatus.SUCCESS)]
    assert p.wcs["b_recv"][0].byte_len == 16 and t.resp_dst.read() == b"R" * 16
    assert p.a.take_events() == []


def test_good_signature_runs_through(rng):
    t = Transaction(rng, check=True, good_pi=True)
    t.start()
    p = t.p
    assert p.a.state == QpState.RTS and p.a.take_events() == []
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    assert status_of(p.wcs["b_recv"]) == [(5, WcStatus.SUCCESS)]
    assert t.mkey.mkey_check().err_type == MkeyErrType.NO_ERR


@pytest.mark.parametrize("qp", [{}, PIPELINING])
def test_no_stop_without_pipelining_or_without_a_check(rng, qp):
    # Without the create flag the error is only latched; with it but check_mask 0 there
    # is no error to stop for.
    t = Transaction(rng, check=not qp, good_pi=False, qp=qp)
    t.start()
    p = t.p
    assert p.a.state == QpState.RTS and p.a.take_events() == []
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    want = MkeyErrType.BAD_GUARD if not qp else MkeyErrType.NO_ERR
    assert t.mkey.mkey_check().err_type == want


def test_cancel_refusals(rng):
    t = Transaction(rng, check=True, good_pi=False)
    p = t.p
    with pytest.raises(RDMAError) as e:
        p.a.cancel_posted_send_wrs(1)      # RTS
    assert e.value.errno_name == "EINVAL"
    p.b.post_recv(RecvWR(5, [SGE(t.resp_dst.addr, 16, t.resp_dst.lkey)]))
    p.a.post_send(t.data_wr(), p.now)
    p.a.post_send(t.resp_wr(), p.now)
    p.a.post_local(1, True, WcOpcode.DRIVER1, now=p.now)
    p.run()
    assert p.a.state == QpState.SQD
    with pytest.raises(RDMAError) as e:
        p.a.cancel_posted_send_wrs(1)
    assert e.value.errno_name == "EOPNOTSUPP"
    # Refused whole: nothing was canceled, ERR flushes both.
    p.a.modify_to_err()
    assert [(w.wr_id, w.status) for w in p.a.poll_send_cq()] == \
        [(1, WcStatus.WR_FLUSH_ERR)] * 2


def test_modify_to_sqd_raises_sq_drained_only_when_asked_and_drained(rng):
    p = Pair()
    src = p.mr(p.pda, rng.randbytes(4096))
    dst = p.mr(p.pdb, 4096)
    p.a.post_send(SendWR(3, WrOpcode.RDMA_WRITE, [SGE(src.addr, 4096, src.lkey)],
                         int(SendFlags.SIGNALED), rkey=dst.rkey, remote_addr=dst.addr), p.now)
    packets_of(p.a, p.now)          # the WRITE has started: its packets are out
    p.a.modify({"qp_state": QpState.SQD, "en_sqd_async_notify": 1},
               QpAttrMask.STATE | QpAttrMask.EN_SQD_ASYNC_NOTIFY)
    assert packets_of(p.a, p.now) == [] and p.a.take_events() == []   # not drained yet
    p.run()
    assert status_of(p.wcs["a_send"]) == [(3, WcStatus.SUCCESS)]
    assert p.a.take_events() == [EventType.SQ_DRAINED]
    p.a.modify({"qp_state": QpState.RTS}, QpAttrMask.STATE)
    p.a.modify({"qp_state": QpState.SQD}, QpAttrMask.STATE)
    p.run()
    assert p.a.take_events() == []
    with pytest.raises(RDMAError) as e:
        p.a.modify({"qp_state": QpState.SQD, "en_sqd_async_notify": 2},
                   QpAttrMask.STATE | QpAttrMask.EN_SQD_ASYNC_NOTIFY)
    assert e.value.errno_name == "EINVAL"


# -- through the daemon, as the upstream test drives it ---------------------------------

async def players(node, *, check: bool, create_flags: int):
    """Client and server contexts on one device of one daemon, QPs connected."""
    out = []
    for _ in range(2):
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(64)
        qp = await pd.create_qp(sh.QPInitAttr(
            scq=cq, rcq=cq, cap=sh.QPCap(max_send_wr=16, max_recv_wr=16,
                                         max_inline_data=512),
            send_ops_flags=sh.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE, create_flags=create_flags))
        mr = await pd.reg_mr(1024, sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE)
        mkey = await pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                                    | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 3)
        out.append((ctx, cq, qp, mr, mkey))
    (_, _, cqp, _, _), (_, _, sqp, _, _) = out
    await cqp.connect(sqp.info())
    await sqp.connect(cqp.info())
    client, server = out
    mem = sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_CRC,
                                crc=sh.Mlx5SigCrc(crc_type=sh.MLX5DV_SIG_CRC_TYPE_CRC32),
                                block_size=sh.MLX5DV_BLOCK_SIZE_512)
    sig = sh.Mlx5SigBlockAttr(mem=mem, check_mask=sh.MLX5DV_SIG_MASK_CRC32 if check else 0)
    for (_, cq, qp, _mr, mkey), kw in ((client, {"sges": [sh.SGE(client[3].addr, 516,
                                                                client[3].lkey)],
                                                "sig": sig,
                                                "access": sh.IBV_ACCESS_LOCAL_WRITE}),
                                      (server, {"sges": [sh.SGE(server[3].addr, 512,
                                                                server[3].lkey)],
                                                "access": sh.IBV_ACCESS_LOCAL_WRITE
                                                | sh.IBV_ACCESS_REMOTE_WRITE})):
        await qp.post_mkey_configure(mkey, wr_flags=sh.IBV_SEND_SIGNALED | sh.IBV_SEND_INLINE,
                                     **kw)
        assert (await cq.poll_n(1))[0].status == sh.IBV_WC_SUCCESS
    return client, server


async def post_transaction(client, server):
    _, _, cqp, cmr, cmkey = client
    _, _, sqp, smr, smkey = server
    await sqp.post_recv(sh.RecvWR(sg=[sh.SGE(smr.addr, 16, smr.lkey)]))
    data = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_RDMA_WRITE, sg=[sh.SGE(0, 512, cmkey.lkey)],
                     send_flags=0)
    data.set_wr_rdma(smkey.rkey, 0)
    await cqp.post_send(data)
    await cqp.post_send(resp_wr(cmr))


def resp_wr(cmr) -> sh.SendWR:
    return sh.SendWR(wr_id=1, opcode=sh.IBV_WR_SEND, sg=[sh.SGE(cmr.addr, 16, cmr.lkey)],
                     send_flags=sh.IBV_SEND_SIGNALED | sh.IBV_SEND_FENCE)


PIPE_FLAGS = sh.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE | sh.MLX5DV_QP_CREATE_SIG_PIPELINING


async def test_sig_pipelining_bad_through_the_daemon():
    async with sh.embedded() as node:
        client, server = await players(node, check=True, create_flags=PIPE_FLAGS)
        cctx, ccq, cqp, cmr, cmkey = client
        sctx, scq, _, _, smkey = server
        await post_transaction(client, server)
        ev = await cctx.get_async_event(10)
        assert ev.event_type == sh.IBV_EVENT_SQ_DRAINED
        assert ev.qp is cqp and ev.qp_num == cqp.qp_num
        await ev.ack()
        with pytest.raises(sh.RDMAError) as e:
            await ev.ack()
        assert e.value.errno_name == "EINVAL"
        assert await sctx.get_async_event(0) is None          # the server's context: none
        assert await ccq.poll(1) == [] and await scq.poll(1) == []
        assert (await cqp.query())["qp_state"] == sh.IBV_QPS_SQD
        assert (await cmkey.mkey_check()).err_type == sh.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD
        assert await cqp.cancel_posted_send_wrs(1) == 1
        await cqp.post_send(resp_wr(cmr))
        await cqp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RTS, cur_qp_state=sh.IBV_QPS_SQD),
                         sh.IBV_QP_STATE | sh.IBV_QP_CUR_STATE)
        wcs = await ccq.poll_n(2)
        assert [(w.wr_id, w.status, w.opcode) for w in wcs] == \
            [(1, sh.IBV_WC_SUCCESS, sh.IBV_WC_SEND)] * 2
        rwc = (await scq.poll_n(1))[0]
        assert rwc.status == sh.IBV_WC_SUCCESS and rwc.byte_len == 16
        with pytest.raises(sh.RDMAError) as e:
            await cqp.cancel_posted_send_wrs(1)      # RTS again
        assert e.value.errno_name == "EINVAL"


async def test_sig_pipelining_good_through_the_daemon():
    async with sh.embedded() as node:
        client, server = await players(node, check=False, create_flags=PIPE_FLAGS)
        cctx, ccq, _, _, _ = client
        await post_transaction(client, server)
        assert (await ccq.poll_n(1))[0].status == sh.IBV_WC_SUCCESS
        assert (await server[1].poll_n(1))[0].status == sh.IBV_WC_SUCCESS
        assert await cctx.get_async_event(0.1) is None


async def test_unmodelled_create_flags_are_eopnotsupp():
    async with sh.embedded() as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(4)
        with pytest.raises(sh.RDMAError) as e:
            await pd.create_qp(sh.QPInitAttr(scq=cq, rcq=cq,
                                             create_flags=sh.MLX5DV_QP_CREATE_TUNNEL_OFFLOADS))
        assert e.value.errno_name == "EOPNOTSUPP" and "TUNNEL_OFFLOADS" in e.value.message
