"""The RC QP state machine (engine/qp_state.py, RCQP.modify) against ibv_modify_qp(3).

The transitions and attributes below are typed in from the man page's IBV_QPT_RC table
and the kernel's qp_state_table, the timer values from the IBTA encodings; none is
read from the module under test.
"""

from __future__ import annotations

import pytest
from test_rc import SIG, Pair, Tap, atomic_wr, packets_of, put_u64, status_of, u64_at

import softhca.client as sh
from softhca.engine.hca import HCA
from softhca.engine.rc import RCQP, RecvWR, Run, SendWR
from softhca.protocol.attrs import SGE
from softhca.protocol.enums import Mtu, QpAttrMask, QpState, WcStatus, WrOpcode
from softhca.protocol.errors import RDMAError

from e2e import two_nodes

M = QpAttrMask
S = QpState

# ibv_modify_qp(3), IBV_QPT_RC: the attributes each step of RESET -> INIT -> RTR -> RTS
# requires, by their struct ibv_qp_attr field names.
INIT = {"qp_state": S.INIT, "pkey_index": 0, "port_num": 1, "qp_access_flags": 0}
RTR = {"qp_state": S.RTR, "path_mtu": Mtu.MTU_1024, "dest_qp_num": 0x22, "rq_psn": 5,
       "max_dest_rd_atomic": 4, "min_rnr_timer": 1}
RTS = {"qp_state": S.RTS, "sq_psn": 9, "max_rd_atomic": 2, "retry_cnt": 3, "rnr_retry": 4,
       "timeout": 8}
MASK = {"qp_state": M.STATE, "pkey_index": M.PKEY_INDEX, "port_num": M.PORT,
        "qp_access_flags": M.ACCESS_FLAGS, "path_mtu": M.PATH_MTU, "dest_qp_num": M.DEST_QPN,
        "rq_psn": M.RQ_PSN, "max_dest_rd_atomic": M.MAX_DEST_RD_ATOMIC,
        "min_rnr_timer": M.MIN_RNR_TIMER, "sq_psn": M.SQ_PSN,
        "max_rd_atomic": M.MAX_QP_RD_ATOMIC, "retry_cnt": M.RETRY_CNT,
        "rnr_retry": M.RNR_RETRY, "timeout": M.TIMEOUT}


def mask(attr: dict, extra: int = 0) -> int:
    out = extra
    for name in attr:
        out |= MASK[name]
    return out


def qp() -> RCQP:
    return RCQP(HCA().alloc_pd(), 0x11)


def to(q: RCQP, attr: dict, extra: int = 0) -> None:
    q.modify(attr, mask(attr, extra))


def connected() -> RCQP:
    q = qp()
    to(q, INIT)
    to(q, RTR, M.AV)
    to(q, RTS)
    return q


def einval(fn, *words):
    with pytest.raises(RDMAError) as e:
        fn()
    assert e.value.errno_name == "EINVAL", e.value
    for w in words:
        assert w in e.value.message, (w, e.value.message)
    return e.value


def test_the_man_pages_rc_sequence_with_every_required_attribute():
    q = connected()
    assert q.state == S.RTS
    assert (q.dest_qp, q.mtu, q.retry_cnt, q.rnr_retry, q.max_rd_atomic) == (
        0x22, 1024, 3, 4, 2)
    # IBTA: the local ACK timeout is 4.096 us * 2^timeout; RNR timer code 1 is 0.01 ms.
    assert q.timeout_s == pytest.approx(4.096e-6 * 256)
    assert q.rnr_timer_s == pytest.approx(0.01e-3)


@pytest.mark.parametrize("code, ms", [(0, 655.36), (1, 0.01), (5, 0.06), (12, 0.64),
                                      (14, 1.28), (20, 10.24), (31, 491.52)])
def test_min_rnr_timer_codes(code, ms):
    q = qp()
    to(q, INIT)
    to(q, {**RTR, "min_rnr_timer": code}, M.AV)
    assert q.rnr_timer_s == pytest.approx(ms / 1000)


@pytest.mark.parametrize("frm, nxt", [
    (S.RESET, S.RTR), (S.RESET, S.RTS), (S.RESET, S.SQD), (S.INIT, S.RTS),
    (S.INIT, S.SQD), (S.RTR, S.INIT), (S.RTR, S.RTR), (S.RTR, S.SQD), (S.RTS, S.INIT),
    (S.RTS, S.RTR), (S.ERR, S.INIT), (S.ERR, S.RTS), (S.SQD, S.INIT), (S.RTS, S.SQE)])
def test_transitions_ibv_modify_qp_does_not_have(frm, nxt):
    q = qp()
    path = {S.RESET: [], S.INIT: [INIT], S.RTR: [INIT, RTR], S.RTS: [INIT, RTR, RTS],
            S.SQD: [INIT, RTR, RTS, {"qp_state": S.SQD}], S.ERR: [{"qp_state": S.ERR}]}[frm]
    for attr in path:
        to(q, attr, M.AV if attr is RTR else 0)
    assert q.state == frm
    einval(lambda: q.modify({"qp_state": nxt}, M.STATE), frm.name, nxt.name)
    assert q.state == frm


def test_missing_and_foreign_attributes_are_einval_and_change_nothing():
    q = qp()
    to(q, INIT)
    # INIT -> RTR without the peer's QP number and address.
    attr = {k: v for k, v in RTR.items() if k != "dest_qp_num"}
    einval(lambda: to(q, attr), "dest_qp_num", "IBV_QP_DEST_QPN", "IBV_QP_AV")
    # A field the transition does not take (sq_psn belongs to RTR -> RTS).
    einval(lambda: to(q, {**RTR, "sq_psn": 1}, M.AV), "sq_psn", "does not take")
    # A bad value among good ones: nothing is applied, not even the state.
    einval(lambda: to(q, {**RTR, "path_mtu": 9}, M.AV), "path_mtu")
    assert (q.state, q.mtu, q.dest_qp) == (S.INIT, 1024, 0)
    to(q, {**RTR, "path_mtu": Mtu.MTU_4096}, M.AV)
    einval(lambda: to(q, {**RTS, "retry_cnt": 8}), "retry_cnt")
    einval(lambda: to(q, {**RTS, "timeout": 32}), "timeout")
    assert (q.state, q.retry_cnt, q.mtu) == (S.RTR, 7, 4096)
    # A mask bit without its value.
    einval(lambda: q.modify({"qp_state": S.RTS}, M.STATE | M.TIMEOUT), "timeout")


def test_alternate_paths_are_not_modelled():
    q = connected()
    with pytest.raises(RDMAError) as e:
        q.modify({"qp_state": S.RTS}, M.STATE | M.ALT_PATH)
    assert e.value.errno_name == "EOPNOTSUPP"


def test_rts_to_rts_changes_min_rnr_timer_only_where_allowed():
    q = connected()
    to(q, {"qp_state": S.RTS, "min_rnr_timer": 20})
    assert q.rnr_timer_s == pytest.approx(10.24e-3)
    einval(lambda: to(q, {"qp_state": S.RTS, "retry_cnt": 1}), "retry_cnt")


def test_sqd_starts_no_new_wr_and_rts_resumes(rng):
    p = Pair()
    data = rng.randbytes(3000)
    src, dst = p.mr(p.pda, data), p.mr(p.pdb, 3000)
    p.b.post_recv(RecvWR(7, [SGE(dst.addr, 3000, dst.lkey)]))
    p.a.modify({"qp_state": S.SQD}, M.STATE)
    assert p.a.state == S.SQD
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 3000, src.lkey)], SIG), p.now)
    assert packets_of(p.a, p.now) == []
    p.run()
    assert p.wcs["a_send"] == [] and p.wcs["b_recv"] == []
    # SQD -> SQD may change the timers; SQD -> RTS sends again.
    p.a.modify({"qp_state": S.SQD, "retry_cnt": 5}, M.STATE | M.RETRY_CNT)
    p.a.modify({"qp_state": S.RTS}, M.STATE)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    assert status_of(p.wcs["b_recv"]) == [(7, WcStatus.SUCCESS)]
    assert dst.read(3000) == data


def test_sqd_finishes_what_it_started(rng):
    """A message already on the wire when the QP goes to SQD is acknowledged and
    completes; the WR behind it waits for RTS."""
    p = Pair(Mtu.MTU_256)
    data = rng.randbytes(1000)
    src, dst = p.mr(p.pda, data), p.mr(p.pdb, 2000)
    for i in range(2):
        p.b.post_recv(RecvWR(10 + i, [SGE(dst.addr + 1000 * i, 1000, dst.lkey)]))
    p.a.post_send(SendWR(1, WrOpcode.SEND, [SGE(src.addr, 1000, src.lkey)], SIG), p.now)
    first = packets_of(p.a, p.now)
    assert len(first) == 4
    p.a.post_send(SendWR(2, WrOpcode.SEND, [SGE(src.addr, 1000, src.lkey)], SIG), p.now)
    p.a.modify({"qp_state": S.SQD}, M.STATE)
    for pkt in first:
        p.b.receive(Run.of(pkt), p.now)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS)]
    p.a.modify({"qp_state": S.RTS}, M.STATE)
    p.run()
    assert status_of(p.wcs["a_send"]) == [(1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS)]


def test_reset_empties_the_queues_without_completions_and_starts_over(rng):
    q = connected()
    q.post_recv(RecvWR(1, []))
    q.post_send(SendWR(2, WrOpcode.SEND, [], SIG), 0.0)
    to(q, {"qp_state": S.RESET})
    assert q.state == S.RESET
    assert q.poll_cq() == [] and packets_of(q, 0.0) == []
    to(q, INIT)
    to(q, RTR, M.AV)
    assert q.state == S.RTR
    # From ERR too, after the flush completions.
    to(q, {"qp_state": S.ERR})
    to(q, {"qp_state": S.RESET})
    assert q.state == S.RESET


async def test_the_daemon_forwards_sqd_and_reset():
    async with two_nodes() as p:
        q = p.initiator.qp
        assert await q.modify(sh.QPAttr(qp_state=sh.IBV_QPS_SQD)) == sh.IBV_QPS_SQD
        assert await q.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RTS)) == sh.IBV_QPS_RTS
        with pytest.raises(sh.RDMAError) as e:      # RTS -> RTS takes no path_mtu
            await q.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RTS, path_mtu=sh.IBV_MTU_512))
        assert e.value.errno_name == "EINVAL" and "path_mtu" in e.value.message
        assert await q.modify(sh.QPAttr(qp_state=sh.IBV_QPS_RESET)) == sh.IBV_QPS_RESET
        assert (await q.query())["qp_state"] == sh.IBV_QPS_RESET


@pytest.mark.parametrize("enabled, op, allowed", [
    (sh.IBV_ACCESS_REMOTE_WRITE, WrOpcode.RDMA_WRITE, True),
    (sh.IBV_ACCESS_REMOTE_READ, WrOpcode.RDMA_WRITE, False),
    (sh.IBV_ACCESS_REMOTE_READ, WrOpcode.RDMA_READ, True),
    (sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_REMOTE_ATOMIC, WrOpcode.RDMA_READ, False),
    (sh.IBV_ACCESS_REMOTE_ATOMIC, WrOpcode.ATOMIC_FETCH_AND_ADD, True),
    (0, WrOpcode.ATOMIC_FETCH_AND_ADD, False),
])
def test_qp_access_flags_enable_each_remote_operation(enabled, op, allowed):
    """ibv_modify_qp(3) qp_access_flags: "Mask of enabled remote access operations". An
    operation the responder's QP does not enable fails as rxe fails it: NAK Invalid
    Request, REM_INV_REQ_ERR at the requester, the responder in ERR."""
    p = Pair()
    p.b.modify({"qp_state": S.RTS, "qp_access_flags": int(enabled)}, M.STATE | M.ACCESS_FLAGS)
    local, remote = p.mr(p.pda, bytes(8)), p.mr(p.pdb, bytes(range(8)))
    p.a.post_send(SendWR(1, op, [SGE(local.addr, 8, local.lkey)], SIG, rkey=remote.rkey,
                         remote_addr=remote.addr, compare_add=1), p.now)
    p.run()
    want = WcStatus.SUCCESS if allowed else WcStatus.REM_INV_REQ_ERR
    assert status_of(p.wcs["a_send"]) == [(1, want)]
    assert p.b.state == (S.RTS if allowed else S.ERR)


@pytest.mark.parametrize("resources, want", [
    (2, [(1, WcStatus.SUCCESS), (2, WcStatus.SUCCESS)]),
    (1, [(1, WcStatus.RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR)]),
])
def test_max_dest_rd_atomic_is_the_responders_saved_atomic_results(resources, want):
    """Two atomics in flight lose their ATOMIC ACKs and are sent again. A responder with
    max_dest_rd_atomic 2 answers both duplicates from its saved results; with 1 it kept
    only the second's, drops the first duplicate (IBTA: outside the responder's
    resources), and the requester retries it until retry_cnt is spent."""
    p = Pair(timeout_s=0.01, retry_cnt=2, qp={"max_rd_atomic": 2})
    p.b.modify({"qp_state": S.SQD}, M.STATE)
    p.b.modify({"qp_state": S.SQD, "max_dest_rd_atomic": resources},
               M.STATE | M.MAX_DEST_RD_ATOMIC)
    p.b.modify({"qp_state": S.RTS}, M.STATE)
    remote, local = p.mr(p.pdb, 16), p.mr(p.pda, 16)
    put_u64(remote, 0, 5)
    put_u64(remote, 8, 7)
    dropped = []

    def drop_two_acks(pkts):
        out = []
        for q in pkts:
            if q.opcode == "ATOMIC_ACKNOWLEDGE" and len(dropped) < 2:
                dropped.append(q)
            else:
                out.append(q)
        return out
    for i in range(2):
        p.a.post_send(atomic_wr(i + 1, WrOpcode.ATOMIC_FETCH_AND_ADD, local, 8 * i, remote,
                                8 * i, 1), p.now)
    p.run(Tap(drop_two_acks))
    assert len(dropped) == 2
    assert status_of(p.wcs["a_send"]) == want
    # Each atomic was executed once, whatever came back.
    assert (u64_at(remote, 0), u64_at(remote, 8)) == (6, 8)


# -- the states each verb needs -------------------------------------------------------------

@pytest.mark.parametrize("verb, acts", [
    ("ibv_post_send", {QpState.RTS, QpState.SQD}),
    ("ibv_post_recv", {QpState.INIT, QpState.RTR, QpState.RTS, QpState.SQD}),
    ("ibv_wr_mkey_configure", {QpState.RTS}),
    ("mlx5dv_qp_cancel_posted_send_wrs", {QpState.SQD}),
])
def test_each_verb_acts_in_its_states_flushes_in_err_and_is_einval_elsewhere(verb, acts):
    from softhca.engine import qp_state

    flushes = verb != "mlx5dv_qp_cancel_posted_send_wrs"
    for state in QpState:
        if state == QpState.SQE:
            continue
        if state in acts:
            assert qp_state.require(verb, state) is True
        elif state == QpState.ERR and flushes:
            assert qp_state.require(verb, state) is False
        else:
            with pytest.raises(RDMAError) as e:
                qp_state.require(verb, state)
            assert e.value.errno_name == "EINVAL"
            assert f"{verb} needs the QP in" in e.value.message
            assert f"it is in {state.name}" in e.value.message
