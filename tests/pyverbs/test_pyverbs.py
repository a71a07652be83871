"""softhca's pyverbs (softhca.client.pyverbs) without the upstream package: the sync
bridge, pyverbs' shapes and errors, RC traffic between two contexts of one device, and
EOPNOTSUPP for what is not modelled."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest
from pyverbs_rc import to_rts

import softhca.client.pyverbs.enums as e
import softhca.client.pyverbs.providers.mlx5.mlx5_enums as dve
from softhca.client.pyverbs import _route
from softhca.client.pyverbs.cq import CQ
from softhca.client.pyverbs.device import Context, get_device_list
from softhca.client.pyverbs.mr import MR
from softhca.client.pyverbs.pd import PD
from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
from softhca.client.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from softhca.client.pyverbs.srq import SRQ, SrqInitAttrEx
from softhca.client.pyverbs.wr import SGE, RecvWR, SendWR
from softhca.protocol import enums as pe
from softhca.tools.pyverbs import path as pyverbs_path


@pytest.mark.parametrize("ours, c_prefix, theirs", [
    (e.ibv_wr_opcode, "IBV_WR_", pe.WrOpcode), (e.ibv_wc_status, "IBV_WC_", pe.WcStatus),
    (e.ibv_qp_state, "IBV_QPS_", pe.QpState), (e.ibv_access_flags, "IBV_ACCESS_", None),
    (dve.mlx5dv_qp_create_send_ops_flags, "MLX5DV_QP_EX_", pe.Mlx5dvQpExSendOps),
])
def test_enums_agree_with_the_protocol(ours, c_prefix, theirs):
    """The pyverbs enum tables and softhca's own enums are written separately; every
    name both have must carry one value."""
    if theirs is None:
        theirs = pe.AccessFlags
    common = 0
    for m in theirs:
        name = c_prefix + m.name
        if name in ours.__members__:
            assert int(ours.__members__[name]) == int(m), name
            common += 1
    assert common >= 3


def test_error_shape():
    ex = PyverbsRDMAError("Failed to post send", errno.EINVAL)
    assert ex.error_code == errno.EINVAL
    assert str(ex) == "Failed to post send. Errno: 22, Invalid argument"


def test_gid_routes_back_to_the_daemon():
    raw = _route.gid_raw("127.0.0.1", 4791, 3)
    assert _route.route(raw) == ("127.0.0.1", 4791, 3)
    with pytest.raises(PyverbsRDMAError) as ex:
        _route.route(bytes(16))
    assert ex.value.error_code == errno.EINVAL


def _rc_player(ctx):
    pd = PD(ctx)
    cq = CQ(ctx, 16, None, None, 0)
    mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)),
            QPAttr(port_num=1))
    return pd, cq, mr, qp


def test_rc_send_between_two_contexts_of_one_device():
    assert [d.name for d in get_device_list()] == [b"mlx5_0"]
    a, b = Context(name="mlx5_0"), Context(name="mlx5_0")
    try:
        _, acq, amr, aqp = _rc_player(a)
        _, bcq, bmr, bqp = _rc_player(b)
        assert aqp.qp_state == e.IBV_QPS_INIT
        to_rts(a, aqp, bqp)
        to_rts(b, bqp, aqp)
        bqp.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[SGE(bmr.buf, 64, bmr.lkey)]))
        amr.write("softhca" * 9, 63)
        wr = SendWR(wr_id=5, num_sge=1, sg=[SGE(amr.buf, 63, amr.lkey)],
                    opcode=e.IBV_WR_SEND_WITH_IMM, imm_data=0x04030201)
        aqp.post_send(wr)
        for cq, wr_id in ((acq, 5), (bcq, 7)):
            for _ in range(200):
                n, wcs = cq.poll()
                if n:
                    break
            assert n == 1 and wcs[0].wr_id == wr_id and wcs[0].status == e.IBV_WC_SUCCESS
        assert wcs[0].byte_len == 63 and wcs[0].wc_flags & e.IBV_WC_WITH_IMM
        # imm_data is the __be32 field's bits both ways (pyverbs' convention).
        assert wcs[0].imm_data == 0x04030201
        assert bmr.read(63, 0) == (b"softhca" * 9)[:63]
    finally:
        a.close()
        b.close()


def test_unmodelled_features_raise_eopnotsupp():
    with Context(name="mlx5_0") as ctx:
        pd = PD(ctx)
        cq = CQ(ctx, 4, None, None, 0)
        for make in (lambda: QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RAW_PACKET, scq=cq, rcq=cq)),
                     # XRC SRQs (basic ones are modelled: engine/srq.py).
                     lambda: SRQ(ctx, SrqInitAttrEx(srq_type=e.IBV_SRQT_XRC, pd=pd,
                                                    comp_mask=e.IBV_SRQ_INIT_ATTR_TYPE
                                                    | e.IBV_SRQ_INIT_ATTR_PD)),
                     lambda: MR(pd, 64, e.IBV_ACCESS_ON_DEMAND | e.IBV_ACCESS_LOCAL_WRITE,
                                implicit=True)):
            with pytest.raises(PyverbsRDMAError) as ex:
                make()
            assert ex.value.error_code == errno.EOPNOTSUPP


def test_pyverbs_path_gives_softhcas_pyverbs():
    r = subprocess.run([sys.executable, "-c", "import pyverbs.device as d; print(d.__name__)"],
                       env={"PYTHONPATH": str(pyverbs_path()), "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "softhca.client.pyverbs.device", r.stderr


def _wait(cq, n=1):
    for _ in range(500):
        got, wcs = cq.poll(n)
        if got:
            return wcs
    raise AssertionError("no completion")


def test_mr_list_mkey_and_a_completion_channel():
    """mlx5dv_wr_mr_list registers an indirect layout (posted as the configure WR with
    access and layout setters); a SEND through the MKEY gathers both pieces; the receiver
    waits for it on a completion channel."""
    from softhca.client.pyverbs.cq import CompChannel
    from softhca.client.pyverbs.providers.mlx5.mlx5dv import (
        Mlx5Context,
        Mlx5DVContextAttr,
        Mlx5DVQPInitAttr,
        Mlx5QP,
    )
    from softhca.client.pyverbs.providers.mlx5.mlx5dv_mkey import Mlx5Mkey, Mlx5MkeyConfAttr
    from softhca.client.pyverbs.qp import QPInitAttrEx

    a, b = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0"), Context(name="mlx5_0")
    try:
        apd = PD(a)
        acq = CQ(a, 16, None, None, 0)
        amr = MR(apd, 128, e.IBV_ACCESS_LOCAL_WRITE)
        dv = Mlx5DVQPInitAttr(comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
                              send_ops_flags=dve.MLX5DV_QP_EX_WITH_MR_LIST)
        init = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=acq, rcq=acq, pd=apd,
                            cap=QPCap(4, 4, max_inline_data=64),
                            comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                            send_ops_flags=e.IBV_QP_EX_WITH_SEND)
        aqp = Mlx5QP(a, init, dv)
        aqp.to_init(QPAttr(port_num=1))
        mkey = Mlx5Mkey(apd, dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 2)

        channel = CompChannel(b)
        bcq = CQ(b, 16, None, channel, 0)
        bpd = PD(b)
        bmr = MR(bpd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        bqp = QP(bpd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=bcq, rcq=bcq, cap=QPCap(4, 4)),
                 QPAttr(port_num=1))
        to_rts(a, aqp, bqp)
        to_rts(b, bqp, aqp)

        # A configure WR on a QP created for mr_list only: EOPNOTSUPP, as the engine says.
        aqp.wr_start()
        aqp.wr_mkey_configure(mkey, 1, Mlx5MkeyConfAttr())
        aqp.wr_set_mkey_access_flags(e.IBV_ACCESS_LOCAL_WRITE)
        with pytest.raises(PyverbsRDMAError) as ex:
            aqp.wr_complete()
        assert ex.value.error_code == errno.EOPNOTSUPP

        data = bytes(range(128))
        amr.write(data, 128)
        aqp.wr_start()
        aqp.wr_id, aqp.wr_flags = 3, e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
        aqp.wr_mr_list(mkey, e.IBV_ACCESS_LOCAL_WRITE,
                       [SGE(amr.buf, 8, amr.lkey), SGE(amr.buf + 64, 8, amr.lkey)])
        aqp.wr_complete()
        assert _wait(acq)[0].status == e.IBV_WC_SUCCESS

        bcq.req_notify()
        bqp.post_recv(RecvWR(wr_id=9, num_sge=1, sg=[SGE(bmr.buf, 64, bmr.lkey)]))
        aqp.post_send(SendWR(wr_id=4, num_sge=1, sg=[SGE(0, 16, mkey.lkey)]))
        assert _wait(acq)[0].status == e.IBV_WC_SUCCESS
        channel.get_cq_event(bcq)
        bcq.ack_events(1)
        n, wcs = bcq.poll()       # the completion the event announced is still there
        assert n == 1 and wcs[0].wr_id == 9 and wcs[0].byte_len == 16
        assert bmr.read(16, 0) == data[0:8] + data[64:72]
    finally:
        a.close()
        b.close()


def test_wr_complete_posts_all_or_nothing():
    """QPEx's wr_start .. wr_complete (ibv_wr_post(3)): no work reaches the queue unless
    wr_complete succeeds, and a failure aborts the entire posting. A run longer than the
    send queue (which holds max_send_wr WRs, ibv_create_qp(3)) fails ENOMEM, as mlx5
    reports its overflow, and leaves the queue empty: the next run completes with
    exactly its own WRs. wr_abort discards what was built."""
    from softhca.client.pyverbs.qp import QPEx, QPInitAttrEx

    depth = 4
    a, b = Context(name="mlx5_0"), Context(name="mlx5_0")
    try:
        apd = PD(a)
        acq = CQ(a, 64, None, None, 0)
        amr = MR(apd, 64, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        aqp = QPEx(a, QPInitAttrEx(
            qp_type=e.IBV_QPT_RC, scq=acq, rcq=acq, pd=apd, cap=QPCap(depth, depth),
            comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            send_ops_flags=e.IBV_QP_EX_WITH_RDMA_WRITE))
        aqp.to_init(QPAttr(port_num=1))
        bpd = PD(b)
        bcq = CQ(b, 16, None, None, 0)
        bmr = MR(bpd, 64, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        bqp = QP(bpd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=bcq, rcq=bcq, cap=QPCap(4, 4)),
                 QPAttr(port_num=1, qp_access_flags=e.IBV_ACCESS_REMOTE_WRITE))
        to_rts(a, aqp, bqp)
        to_rts(b, bqp, aqp)

        def build(n):
            for k in range(n):
                aqp.wr_id, aqp.wr_flags = k, e.IBV_SEND_SIGNALED
                aqp.wr_rdma_write(bmr.rkey, bmr.buf)
                aqp.wr_set_sge(SGE(amr.buf, 8, amr.lkey))

        def completions():
            # every completion until none came in 300 polls
            out, quiet = [], 0
            while quiet < 300:
                n, wcs = acq.poll(16)
                quiet = 0 if n else quiet + 1
                out += [(wc.wr_id, wc.status) for wc in wcs[:n]]
            return out

        aqp.wr_start()
        build(depth + 1)
        with pytest.raises(PyverbsRDMAError) as ex:
            aqp.wr_complete()
        assert ex.value.error_code == errno.ENOMEM
        assert completions() == []
        aqp.wr_start()
        build(depth)
        aqp.wr_complete()
        assert completions() == [(k, e.IBV_WC_SUCCESS) for k in range(depth)]

        aqp.wr_start()
        build(3)
        aqp.wr_abort()
        assert completions() == []
        aqp.wr_start()
        build(1)
        aqp.wr_complete()
        assert completions() == [(0, e.IBV_WC_SUCCESS)]
    finally:
        a.close()
        b.close()


def test_signature_pipelining_through_pyverbs():
    """MLX5DV_QP_CREATE_SIG_PIPELINING as rdma-core's test_mkey_sig_pipelining_bad uses
    it: a bad CRC32 on an RDMA WRITE through a signature MKEY, a fenced SEND after it;
    the QP drains to SQD with IBV_EVENT_SQ_DRAINED, the SEND is cancelled and reposted,
    SQD -> RTS resumes and both sides complete."""
    from softhca.client.pyverbs.providers.mlx5.mlx5dv import (
        Mlx5Context,
        Mlx5DVContextAttr,
        Mlx5DVQPInitAttr,
        Mlx5QP,
    )
    from softhca.client.pyverbs.providers.mlx5.mlx5dv_mkey import (
        Mlx5Mkey,
        Mlx5MkeyConfAttr,
        Mlx5SigBlockAttr,
        Mlx5SigBlockDomain,
        Mlx5SigCrc,
    )
    from softhca.client.pyverbs.qp import QPInitAttrEx

    ctxs = [Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0") for _ in range(2)]
    try:
        players = []
        for ctx in ctxs:
            pd = PD(ctx)
            cq = CQ(ctx, 16, None, None, 0)
            mr = MR(pd, 1024, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
            dv = Mlx5DVQPInitAttr(
                comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS
                | dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
                create_flags=dve.MLX5DV_QP_CREATE_SIG_PIPELINING,
                send_ops_flags=dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)
            init = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, pd=pd,
                                cap=QPCap(8, 8, max_inline_data=512),
                                comp_mask=e.IBV_QP_INIT_ATTR_PD
                                | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
                                send_ops_flags=e.IBV_QP_EX_WITH_SEND)
            qp = Mlx5QP(ctx, init, dv)
            attr = QPAttr(port_num=1)
            attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
            qp.to_init(attr)
            mkey = Mlx5Mkey(pd, dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                            | dve.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE, 3)
            players.append((ctx, cq, mr, qp, mkey))
        (cctx, ccq, cmr, cqp, cmkey), (sctx, scq, smr, sqp, smkey) = players
        to_rts(cctx, cqp, sqp)
        to_rts(sctx, sqp, cqp)

        def configure(qp, mkey, mr, length, access, sig=None):
            qp.wr_start()
            qp.wr_flags = e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
            qp.wr_mkey_configure(mkey, 3 if sig else 2, Mlx5MkeyConfAttr())
            qp.wr_set_mkey_access_flags(access)
            qp.wr_set_mkey_layout_list([SGE(mr.buf, length, mr.lkey)])
            if sig:
                qp.wr_set_mkey_sig_block(sig)
            qp.wr_complete()

        crc = Mlx5SigBlockDomain(sig_type=dve.MLX5DV_SIG_TYPE_CRC,
                                 crc=Mlx5SigCrc(crc_type=dve.MLX5DV_SIG_CRC_TYPE_CRC32),
                                 block_size=dve.MLX5DV_BLOCK_SIZE_512)
        # 512 bytes of data and a CRC32 that is not theirs (zeros): a guard error.
        configure(cqp, cmkey, cmr, 512 + 4, e.IBV_ACCESS_LOCAL_WRITE,
                  Mlx5SigBlockAttr(mem=crc, check_mask=dve.MLX5DV_SIG_MASK_CRC32))
        configure(sqp, smkey, smr, 512, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)
        assert _wait(ccq)[0].status == e.IBV_WC_SUCCESS
        assert _wait(scq)[0].status == e.IBV_WC_SUCCESS
        cmr.write(b"\x5a" * 512, 512)

        sqp.post_recv(RecvWR(num_sge=1, sg=[SGE(smr.buf, 16, smr.lkey)]))
        data = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                      sg=[SGE(0, 512, cmkey.lkey)], send_flags=0)
        data.set_wr_rdma(smkey.rkey, 0)
        resp = SendWR(wr_id=1, num_sge=1, sg=[SGE(cmr.buf, 16, cmr.lkey)],
                      send_flags=e.IBV_SEND_SIGNALED | e.IBV_SEND_FENCE)
        cqp.post_send(data)
        cqp.post_send(resp)

        # ibv_get_async_event blocks; a regression must fail the test, not hang it.
        def late(signum, frame):
            raise TimeoutError("no async event within 30 s")

        previous = signal.signal(signal.SIGALRM, late)
        signal.alarm(30)
        try:
            event = cctx.get_async_event()
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        event.ack()
        assert event.event_type == e.IBV_EVENT_SQ_DRAINED and event.element is cqp
        assert ccq.poll(1)[0] == 0 and scq.poll(1)[0] == 0
        assert cmkey.mkey_check().err_type == dve.MLX5DV_MKEY_SIG_BLOCK_BAD_GUARD
        assert cqp.cancel_posted_send_wrs(1) == 1
        cqp.post_send(resp)
        cqp.modify(QPAttr(qp_state=e.IBV_QPS_RTS, cur_qp_state=e.IBV_QPS_SQD),
                   e.IBV_QP_STATE | e.IBV_QP_CUR_STATE)
        assert _wait(ccq)[0].status == e.IBV_WC_SUCCESS
        assert _wait(scq)[0].status == e.IBV_WC_SUCCESS
    finally:
        for ctx in ctxs:
            ctx.close()


CRYPTO_SCRIPT = r"""
import errno, json, struct, sys
from softhca.client.pyverbs.pd import PD
from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
from softhca.client.pyverbs.providers.mlx5.mlx5dv import Mlx5Context, Mlx5DVContextAttr
from softhca.client.pyverbs.providers.mlx5.mlx5dv_crypto import (
    Mlx5CryptoExtLoginAttr, Mlx5CryptoLogin, Mlx5CryptoLoginAttr, Mlx5DEK, Mlx5DEKInitAttr)
import softhca.client.pyverbs.providers.mlx5.mlx5_enums as dve

info = json.load(open(sys.argv[1]))[0]
cred = struct.pack("!6Q", *info["credential"])
key = struct.pack("!5Q", *info["wrapped_key"])
ctx = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0")
caps = ctx.query_mlx5_device().crypto_caps
out = {"wrapped": bool(caps["wrapped_import_method"]
                       & dve.MLX5DV_CRYPTO_WRAPPED_IMPORT_METHOD_CAP_AES_XTS)}
pd = PD(ctx)
attr = Mlx5DEKInitAttr(pd, key=key, key_size=dve.MLX5DV_CRYPTO_KEY_SIZE_128,
                       key_purpose=dve.MLX5DV_CRYPTO_KEY_PURPOSE_AES_XTS, opaque=b"dek")
def errno_of(f):
    try:
        f()
    except PyverbsRDMAError as ex:
        return ex.error_code
    return 0
out["dek_outside_login"] = errno_of(lambda: Mlx5DEK(ctx, attr))
out["state0"] = int(Mlx5Context.query_login_state(ctx))
Mlx5Context.crypto_login(ctx, Mlx5CryptoLoginAttr(cred))
out["state1"] = int(Mlx5Context.query_login_state(ctx))
out["second_login"] = errno_of(lambda: Mlx5Context.crypto_login(ctx, Mlx5CryptoLoginAttr(cred)))
dek = Mlx5DEK(ctx, attr)
out["opaque"] = dek.query().opaque.decode()
dek.close()
Mlx5Context.crypto_logout(ctx)
out["state2"] = int(Mlx5Context.query_login_state(ctx))
login = Mlx5CryptoLogin(ctx, Mlx5CryptoExtLoginAttr(cred, len(cred)))
out["object_state"] = int(login.query())
attr.crypto_login = login
attr.comp_mask = dve.MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN
out["object_opaque"] = Mlx5DEK(ctx, attr).query().opaque.decode()
print(json.dumps(out))
"""


def test_crypto_login_and_wrapped_deks_through_pyverbs(tmp_path):
    """mlx5dv_crypto_login and the login object through softhca's pyverbs, in a process
    whose embedded daemon is in wrapped import mode; the wrapped key and credential come
    from softhca crypto-test-info (cryptography's AES key wrap, not the engine)."""
    import json

    info = tmp_path / "crypto.json"
    subprocess.run([sys.executable, "-c", "from softhca.tools.cli import main; "
                    f"raise SystemExit(main(['crypto-test-info', '--out', {str(info)!r}]))"],
                   check=True, capture_output=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("SOFTHCA_TARGET",)}
    env["SOFTHCA_CRYPTO_CONFIG"] = json.dumps({"mode": "wrapped"})
    r = subprocess.run([sys.executable, "-c", CRYPTO_SCRIPT, str(info)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"wrapped": True, "dek_outside_login": errno.EINVAL,
                   "state0": dve.MLX5DV_CRYPTO_LOGIN_STATE_NO_LOGIN,
                   "state1": dve.MLX5DV_CRYPTO_LOGIN_STATE_VALID,
                   "second_login": errno.EEXIST, "opaque": "dek",
                   "state2": dve.MLX5DV_CRYPTO_LOGIN_STATE_NO_LOGIN,
                   "object_state": dve.MLX5DV_CRYPTO_LOGIN_STATE_VALID,
                   "object_opaque": "dek"}


@pytest.mark.parametrize("free_pages, alloc_type, refused", [
    ("0\n", "HUGE", True), (None, "huge", True), ("0\n", "PREFER_HUGE", False),
    ("0\n", "ANON", False), ("4\n", "HUGE", False)])
def test_mlx_alloc_type_huge_without_huge_pages_is_enomem(monkeypatch, tmp_path, free_pages,
                                                          alloc_type, refused):
    """libmlx5's MLX_CQ_ALLOC_TYPE / MLX_QP_ALLOC_TYPE: HUGE takes the buffer from 2 MiB
    huge pages or fails the create (ENOMEM); PREFER_HUGE and ANON fall back or never try.
    ``free_pages`` None: the kernel has no 2 MiB huge page pool at all."""
    from softhca.client.pyverbs import _objects

    pages = tmp_path / "free_hugepages"
    if free_pages is not None:
        pages.write_text(free_pages)
    monkeypatch.setattr(_objects, "HUGE_PAGES", str(pages))
    monkeypatch.setenv("MLX_CQ_ALLOC_TYPE", alloc_type)
    monkeypatch.setenv("MLX_QP_ALLOC_TYPE", alloc_type)
    with Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        if refused:
            with pytest.raises(PyverbsRDMAError) as exc:
                CQ(ctx, 16)
            assert exc.value.error_code == errno.ENOMEM
            assert "MLX_CQ_ALLOC_TYPE=HUGE" in str(exc.value)
            monkeypatch.delenv("MLX_CQ_ALLOC_TYPE")
        with CQ(ctx, 16) as cq:
            attr = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4))
            if refused:
                with pytest.raises(PyverbsRDMAError) as exc:
                    QP(pd, attr)
                assert exc.value.error_code == errno.ENOMEM
            else:
                QP(pd, attr).close()


def test_create_flags_as_an_mlx5_device_takes_them():
    """IBV_QP_CREATE_BLOCK_SELF_MCAST_LB on a UD QP is taken (rdma-core's tests ask it of
    every device with Mellanox's vendor id, at random): softhca has no multicast, so no
    QP receives its own. Any other create flag is EOPNOTSUPP."""
    from softhca.client.pyverbs.qp import QPInitAttrEx

    with Context(name="mlx5_0") as ctx:
        pd = PD(ctx)
        cq = CQ(ctx, 4, None, None, 0)
        mask = e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_CREATE_FLAGS

        def init(flags):
            return QPInitAttrEx(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq, pd=pd, comp_mask=mask,
                                cap=QPCap(4, 4, 1, 1), create_flags=flags)

        for flags in (0, 2):
            QP(ctx, init(flags)).close()
        for flags in (0x100, 0x400, 2 | 0x800):
            with pytest.raises(PyverbsRDMAError) as ex:
                QP(ctx, init(flags))
            assert ex.value.error_code == errno.EOPNOTSUPP, flags
