"""ibv_modify_qp without IBV_QP_STATE: a change within the QP's current state, as the
kernel's ib_modify_qp_is_ok takes it (next state = current state) for mlx5 and rxe.
qperf and perftest -R lower IBV_QP_MIN_RNR_TIMER on an RTS QP this way. What the
transition current -> current does not take is still EINVAL, and a refused modify
changes nothing."""

from __future__ import annotations

import pytest

import softhca.client as sh

from e2e import ALL, rdma, two_nodes, whole


async def refused(call) -> sh.RDMAError:
    with pytest.raises(sh.RDMAError) as e:
        await call
    return e.value


async def test_min_rnr_timer_on_an_rts_qp_without_a_state():
    async with two_nodes() as p:
        qp = p.initiator.qp
        state = await qp.modify(sh.QPAttr(min_rnr_timer=1), sh.IBV_QP_MIN_RNR_TIMER)
        assert state == sh.IBV_QPS_RTS
        assert (await qp.query())["qp_state"] == sh.IBV_QPS_RTS
        # RTS -> RTS takes the retry counts only with the state (ibv_modify_qp(3)'s
        # table; the kernel's qp_state_table): refused whole, the QP still works.
        err = await refused(qp.modify(sh.QPAttr(min_rnr_timer=2, retry_cnt=3)))
        assert err.errno_name == "EINVAL", err
        assert "RTS -> RTS does not take retry_cnt" in err.message, err.message
        mr = await p.target.reg_mr(b"w" * 64, ALL)
        local = await p.initiator.reg_mr(b"v" * 64, ALL)
        await qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, whole(local), mr.rkey, mr.addr, 9))
        wc = (await p.initiator.send_wc())[0]
        assert wc.status == sh.IBV_WC_SUCCESS, wc
        assert await mr.read() == b"v" * 64


async def test_access_flags_on_an_init_qp_without_a_state():
    async with two_nodes(connect=False) as p:
        qp = p.initiator.qp
        await qp.to_init()
        state = await qp.modify(sh.QPAttr(qp_access_flags=sh.IBV_ACCESS_REMOTE_ATOMIC),
                                sh.IBV_QP_ACCESS_FLAGS)
        assert state == sh.IBV_QPS_INIT
        # INIT -> INIT takes no path MTU: EINVAL, the QP stays in INIT.
        err = await refused(qp.modify(sh.QPAttr(path_mtu=sh.IBV_MTU_1024)))
        assert err.errno_name == "EINVAL" and "INIT -> INIT does not take path_mtu" \
            in err.message, err.message
        assert (await qp.query())["qp_state"] == sh.IBV_QPS_INIT


async def test_a_reset_qp_without_a_state_takes_nothing():
    async with two_nodes(connect=False) as p:
        qp = p.initiator.qp
        err = await refused(qp.modify(sh.QPAttr(min_rnr_timer=1)))
        assert err.errno_name == "EINVAL", err
        assert "RESET -> RESET does not take min_rnr_timer" in err.message, err.message
        assert (await qp.query())["qp_state"] == sh.IBV_QPS_RESET
