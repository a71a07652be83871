"""The post verbs' seams as a C program meets them (provider/tests/postcheck.c): bad_wr of
a post the queue takes only part of (ibv_post_send(3): WRs before bad_wr were posted,
and only they), ibv_wr_complete of a run the queue cannot take whole (ibv_wr_post(3):
nothing posted unless it succeeds), ibv_wr_start .. ibv_wr_complete as the QP's
critical section against another thread's ibv_post_send, NULL arguments (EINVAL, never a signal), zero-length
RDMA operations with rkey 0 (IBTA C9-88: no R_Key check), and registrations past 2^64."""

from __future__ import annotations

import native
import pytest


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    if not native.POSTCHECK.is_file():
        pytest.skip(f"{native.POSTCHECK} is not built (`make provider`)")
    with native.place(tmp_path_factory.mktemp("posts")) as p:
        yield p


def postcheck(where, mode: str) -> native.Done:
    return where.run(where.server, [str(native.POSTCHECK), mode])


def expect(r: native.Done, lines: list[str]) -> None:
    assert "FAIL" not in r.output, r.output
    for line in lines:
        assert f"postcheck: ok: {line}" in r.output, r.output
    assert r.returncode == 0, r.output


def test_bad_wr_is_the_first_wr_not_taken(where):
    expect(postcheck(where, "badwr"), [
        "ibv_post_send of 20 WRs on a 16-deep send queue: ENOMEM, bad_wr at WR 16",
        "ibv_post_send of 100000 WRs on a 16-deep send queue: ENOMEM, bad_wr at WR 16",
        "ibv_post_send of 3 WRs whose WR 1 has opcode 99: EINVAL, bad_wr at WR 1",
        "ibv_post_send of 3 WRs whose WR 1 has 2 SGEs (max_send_sge 1): EINVAL, "
        "bad_wr at WR 1",
        "ibv_post_recv of 300 WRs on a 16-deep receive queue: ENOMEM, bad_wr at WR 16",
        "ibv_post_recv of 10 WRs whose WR 5 has 2 SGEs (max_recv_sge 1): EINVAL, "
        "bad_wr at WR 5",
        "ibv_post_srq_recv of 300 WRs on a 16-deep SRQ: ENOMEM, bad_wr at WR 16",
        "and WRs 0..15 complete, no other (16 completions)",
        "and WR 0 completes, no other (1 completions)",
        "and WRs 0..15 flush at ERR, no other (16 completions)",
        "and WRs 0..4 flush at ERR, no other (5 completions)",
        "and 16 SENDs take WRs 0..15 of it (16 receives of 32 completions)",
        "and then it has room for one more",
    ])


def test_wr_complete_posts_all_or_nothing(where):
    # ibv_wr_post(3): no work reaches the queue unless ibv_wr_complete succeeds, and a
    # failure aborts the entire posting; the queue holds max_send_wr WRs
    # (ibv_create_qp(3)) and mlx5 reports its overflow as ENOMEM; inline data is valid
    # only for SEND and RDMA_WRITE.
    after = "and a run of 3 after it completes WRs 0..2, no other (Success, 3 completions)"
    r = postcheck(where, "wrbatch")
    expect(r, [
        "ibv_wr_complete of a run of 16 WRITEs on a 16-deep send queue: WRs 0..15 "
        "complete (Success, 16 completions)",
        "ibv_wr_complete of a run of 17 WRITEs on a 16-deep send queue fails: ENOMEM",
        "and no WR of the run of 17 completes (0 completions)",
        "ibv_wr_complete of a run of 300 WRITEs fails: ENOMEM",
        "and no WR of the run of 300 completes (0 completions)",
        "ibv_wr_complete of WRITE, READ with inline data, WRITE fails: EINVAL",
        "and no WR of the run with a bad WR 1 completes (0 completions)",
        "and no WR of an aborted run of 5 completes (0 completions)",
    ])
    assert r.output.count(f"postcheck: ok: {after}") == 4, r.output


def test_wr_start_to_complete_is_the_qps_critical_section(where):
    # ibv_wr_post(3), CONCURRENCY: the provider locks so that ibv_wr_start ..
    # ibv_wr_complete is a per-QP critical section no other thread enters; an
    # ibv_post_send of another thread waits for it, and each WRITE's inline bytes
    # (postcheck's own pattern per slot) are its own.
    expect(postcheck(where, "wrthreads"), [
        "300 ibv_post_send and 300 ibv_wr_complete of one inline RDMA WRITE each, from "
        "two threads on one QP, all complete successfully (0 failed posts, 600 "
        "completions, 0 not successful)",
        "and every WRITE landed its own 64 bytes (0 of 600 slots wrong)",
    ])


def test_null_arguments_are_einval_not_a_signal(where):
    expect(postcheck(where, "nulls"), [
        "ibv_create_qp(pd, NULL) fails: Invalid argument",
        "ibv_create_qp with a NULL send_cq fails: Invalid argument",
        "ibv_create_qp of an RC QP with a NULL recv_cq and no SRQ fails: Invalid argument",
        "ibv_modify_qp(qp, NULL, IBV_QP_STATE) fails: Invalid argument",
        "ibv_query_qp with a NULL init_attr fails: Invalid argument",
        "ibv_query_qp with a NULL attr fails: Invalid argument",
        "ibv_post_send of a WR with sg_list NULL and num_sge 1 fails at it, the WR before "
        "it posted: Invalid argument",
        "ibv_post_recv of a WR with sg_list NULL and num_sge 1 fails at it: "
        "Invalid argument",
        "ibv_create_srq(pd, NULL) fails: Invalid argument",
        "ibv_query_srq(srq, NULL) fails: Invalid argument",
        "ibv_create_ah(pd, NULL) fails: Invalid argument",
    ])


def test_zero_length_rdma_checks_no_rkey(where):
    expect(postcheck(where, "zerolen"), [
        "a zero-length RDMA_WRITE_WITH_IMM with rkey 0 completes successfully",
        "and takes a receive: IBV_WC_RECV_RDMA_WITH_IMM, byte_len 0, imm_data 0x12345678",
        "a zero-length RDMA_WRITE with rkey 0 completes successfully",
        "a zero-length RDMA_READ with rkey 0 completes successfully",
        "and the QP still works: a SEND after them completes on both sides",
    ])


def test_registration_past_2_64_is_einval(where):
    r = postcheck(where, "iova")
    expect(r, [
        "ibv_reg_mr_iova of 8192 bytes at iova 0xfffffffffffff000 (past 2^64) fails: "
        "Invalid argument",
        "ibv_reg_mr_iova of 8192 bytes ending at 2^64 - 1 is registered",
        "ibv_reg_mr of 8192 bytes at 0xfffffffffffff000 (addr + length wraps) fails: "
        "Invalid argument",
    ])
    assert "softhca: ibv_reg_mr_iova" in r.output, r.output
