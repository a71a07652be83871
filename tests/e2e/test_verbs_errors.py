"""Values the verbs API itself refuses are EINVAL in the verbs' words;
EPROTO stays for what breaks the protocol: a field of the wrong type, one that no C
type of the call could hold, an unknown field or verb, a malformed frame."""

from __future__ import annotations

import pytest

import softhca.client as sh


async def refused(call) -> sh.RDMAError:
    with pytest.raises(sh.RDMAError) as e:
        await call
    return e.value


async def test_verbs_refusals_are_einval():
    async with sh.embedded() as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        err = await refused(pd.reg_mr(0))
        # ibv_reg_mr(3) fails with EINVAL for an invalid length.
        assert (err.errno_name, err.message) == ("EINVAL", "ibv_reg_mr length 0 must be positive")
        err = await refused(pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 0))
        assert (err.errno_name, err.message) == ("EINVAL", "max_entries 0 must be positive")
        for cqe in (0, (1 << 22) + 1):
            err = await refused(ctx.create_cq(cqe))
            assert err.errno_name == "EINVAL", err
            assert err.message == (f"ibv_create_cq cqe {cqe} is outside [1, max_cqe "
                                   f"{1 << 22}]")
        # The session is still usable, and the refused calls made nothing.
        mr = await pd.reg_mr(16)
        await mr.write(b"x" * 16)
        assert await mr.read() == b"x" * 16


async def test_protocol_violations_stay_eproto():
    async with sh.embedded() as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        for fields in ({"length": -1, "access": 0},          # no size_t holds it
                       {"length": "4096", "access": 0},      # not a number
                       {"length": 64, "access": 0, "x": 1}):  # unknown field
            err = await refused(node.request("reg_mr", pd=pd.handle, **fields))
            assert err.errno_name == "EPROTO", (fields, err)
        err = await refused(node.request("create_cq", ctx=ctx.handle, cqe=1 << 40))
        assert err.errno_name == "EPROTO", err


def test_every_request_is_a_typed_call_with_a_handler():
    """Each verb of the protocol decodes into its own frozen dataclass, and the server's
    dispatch table has exactly one handler per request type."""
    import dataclasses

    from softhca.protocol import control
    from softhca.server.verbs import HANDLERS

    assert set(control.BY_VERB) == set(control.REQUESTS)
    for verb, cls in control.BY_VERB.items():
        assert cls.VERB == verb and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, verb
    assert set(HANDLERS) == set(control.BY_VERB.values())


def test_nested_fields_are_decoded_before_a_handler_runs():
    from softhca.protocol import control
    from softhca.protocol.errors import RDMAError
    from softhca.protocol.records import SendWR

    empty = memoryview(b"")
    rid, req = control.decode_request({"t": "cq_credit", "id": 0, "credits": [[3, 2]]}, empty)
    assert (rid, req) == (0, control.CqCredit(credits=((3, 2),)))
    _, req = control.decode_request({"t": "post_send", "id": 7, "qp": 1, "wrs": [
        SendWR(wr_id=5).to_wire()]}, empty)
    assert type(req.wrs[0]) is SendWR and req.wrs[0].wr_id == 5
    _, req = control.decode_request({"t": "mkey_configure", "id": 1, "qp": 1, "calls": [
        ["configure", 9, 0, 2, 1, 0, 0], ["access_flags", 7]]}, empty)
    assert req.calls == (control.ConfigureCall(9, 0, 2, 1, 0, 0),
                         control.SetterCall("access_flags", 7))
    refusals = [
        ({"t": "cq_credit", "id": 1, "credits": [[3, 0]]}, "EPROTO",
         f"cq_credit: credits[0] must be [cq handle, count 1..{1 << 22}]"),
        ({"t": "mkey_configure", "id": 1, "qp": 1, "calls": [["configure", 1]]}, "EPROTO",
         "mkey_configure call 0: configure takes wr_id, wr_flags, mkey, num_setters, "
         "conf_flags, comp_mask"),
        ({"t": "mkey_configure", "id": 1, "qp": 1, "calls": [["mystery", 1]]}, "EPROTO",
         "mkey_configure call 0: unknown setter 'mystery'"),
        ({"t": "subscribe", "id": 1, "events": ["wire"]}, "EINVAL",
         "subscribe: unknown event kind(s) ['wire']; the kinds are 'packets' and 'trace'"),
        ({"t": "modify_qp", "id": 1, "qp": 1, "mask": 0, "attr": {"qp_state": 9}}, "EPROTO",
         "field 'qp_state' of 'modify_qp.attr' must be int in [0, 6], got int 9"),
    ]
    for header, errno, message in refusals:
        with pytest.raises(RDMAError) as e:
            control.decode_request(header, empty)
        assert (e.value.errno_name, e.value.message) == (errno, message), header


async def test_the_counters_show_the_sessions_dropped_events():
    async with sh.embedded() as node:
        counters = await node.counters()
        assert counters["events_dropped"] == 0


async def test_a_post_partly_taken_names_the_first_wr_not_taken():
    """ibv_post_send(3)/ibv_post_recv(3): the WRs before bad_wr are posted, no other. The
    error carries the refused WR's index in the list (the daemon's err frame names it in
    its request; the client counts the requests before it), over one request and over
    several."""
    async with sh.embedded() as node:
        ctx = await node.open_device()
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(16)
        for depth, total in ((4, 10), (300, 700)):
            qp = await pd.create_qp(sh.QPInitAttr(
                qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                cap=sh.QPCap(max_send_wr=1, max_recv_wr=depth, max_send_sge=1,
                             max_recv_sge=1)))
            await qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_INIT), sh.IBV_QP_STATE)
            err = await refused(qp.post_recv([sh.RecvWR(wr_id=i, sg=[]) for i in range(total)]))
            assert (err.errno_name, err.bad_wr) == ("ENOMEM", depth), err
            assert f"WR {depth % 256} (wr_id {depth})" in err.message, err
            # exactly depth were taken: the queue is full, and one more is refused at 0
            err = await refused(qp.post_recv(sh.RecvWR(wr_id=total, sg=[])))
            assert (err.errno_name, err.bad_wr) == ("ENOMEM", 0), err
        # a request refused whole (a WR of the wrong type) names none
        err = await refused(qp.post_recv([sh.RecvWR(wr_id=-1, sg=[])]))
        assert err.bad_wr is None, err


async def test_a_wr_complete_posting_is_all_or_nothing():
    """ibv_wr_post(3): no work of a posting reaches the queue unless ibv_wr_complete
    succeeds, and a failure aborts the entire posting, so there is no bad_wr and no
    completion of it; the send queue holds max_send_wr WRs (ibv_create_qp(3)), ENOMEM
    past it as mlx5 reports its overflow; IBV_SEND_INLINE is valid only for SEND and
    RDMA_WRITE (ibv_post_send(3)), so an RDMA_READ with it is an invalid argument."""
    from e2e import rdma, sge, two_nodes

    depth = 4
    async with two_nodes(max_wr=depth) as p:
        i = p.initiator
        src, dst = await i.reg_mr(8), await p.target.reg_mr(64)

        def writes(n: int, bad: int = -1) -> list[sh.SendWR]:
            wrs = [rdma(sh.IBV_WR_RDMA_WRITE, [sge(src)], dst.rkey, dst.addr, wr_id=k,
                        send_flags=sh.IBV_SEND_SIGNALED) for k in range(n)]
            if bad >= 0:
                wrs[bad] = rdma(sh.IBV_WR_RDMA_READ, [sge(src)], dst.rkey, dst.addr,
                                wr_id=bad, send_flags=sh.IBV_SEND_SIGNALED | sh.IBV_SEND_INLINE)
            return wrs

        async def completions() -> list[tuple[int, int]]:
            # every completion until none comes for 0.3 s
            out = []
            while wcs := await i.scq.poll(64, 0.3):
                out += [(wc.wr_id, wc.status) for wc in wcs]
            return out

        err = await refused(i.qp.post_send(writes(depth + 1), wr_complete=True))
        assert (err.errno_name, err.bad_wr) == ("ENOMEM", None), err
        assert await completions() == []
        # the queue was left empty: a whole queue's worth goes, and completes, alone
        await i.qp.post_send(writes(depth), wr_complete=True)
        assert await completions() == [(k, sh.IBV_WC_SUCCESS) for k in range(depth)]

        err = await refused(i.qp.post_send(writes(3, bad=1), wr_complete=True))
        assert (err.errno_name, err.bad_wr) == ("EINVAL", None), err
        assert await completions() == []
        # ibv_post_send of the same list keeps its own rule: WR 0 posted, bad_wr 1
        err = await refused(i.qp.post_send(writes(3, bad=1)))
        assert (err.errno_name, err.bad_wr) == ("EINVAL", 1), err
        assert await completions() == [(0, sh.IBV_WC_SUCCESS)]

        # more than one request holds, and nothing at all
        err = await refused(i.qp.post_send(writes(257), wr_complete=True))
        assert (err.errno_name, err.bad_wr) == ("ENOMEM", None), err
        await i.qp.post_send([], wr_complete=True)
        assert await completions() == []
        # the request's own bounds, sent as they are: 1 .. 256 WRs, a bool
        wire = [w.to_wire() for w in writes(257)]
        for fields in ({"wrs": wire, "wr_complete": True}, {"wrs": [], "wr_complete": True},
                       {"wrs": wire[:1], "wr_complete": 1}):
            err = await refused(i.node.request("post_send", qp=i.qp.handle, **fields))
            assert (err.errno_name, err.bad_wr) == ("EPROTO", None), err
        assert await completions() == []
