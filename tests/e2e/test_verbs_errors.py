"""Values the verbs API itself refuses are EINVAL in the verbs' words (issue 16, item 4);
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
