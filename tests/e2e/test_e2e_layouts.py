"""The layout examples of mlx5dv_wr_mkey_configure(3), end to end between two daemons
over TCP, through softhca.client only (tests/support/e2e.py).

The target's MKEY scatters an RDMA_WRITE from the initiator where the page says and
gathers the same bytes back for an RDMA_READ; bytes the layout does not name stay zero.
"""

from __future__ import annotations

import softhca.client as sh

from e2e import whole

INDIRECT = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
# The page's examples: mlx5dv_wr_set_mkey_access_flags(IBV_ACCESS_REMOTE_READ |
# IBV_ACCESS_REMOTE_WRITE).
RW = sh.IBV_ACCESS_REMOTE_READ | sh.IBV_ACCESS_REMOTE_WRITE


async def write_then_read(pair, mkey: sh.MKey, data: bytes) -> bytes:
    """RDMA_WRITE ``data`` to the MKEY at offset 0, then RDMA_READ as much back into a
    fresh MR; returns what was read."""
    i = pair.initiator
    src = await i.reg_mr(data)
    wc = await pair.write(whole(src), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_WRITE), wc
    back = await i.reg_mr(len(data))
    wc = await pair.read(whole(back), mkey.rkey, 0)
    assert (wc.status, wc.opcode) == (sh.IBV_WC_SUCCESS, sh.IBV_WC_RDMA_READ), wc
    return await back.read()


async def test_e2e_mkey_configure_list_layout_example(pair, rng):
    """"The first 64 bytes will go to memory referenced by mr1. The next 4096 bytes will
    go to memory referenced by mr2." """
    t = pair.target
    mr1, mr2 = await t.reg_mr(256), await t.reg_mr(8192)
    mkey = await t.mkey(INDIRECT, access=RW, max_entries=2,
                        sges=[sh.SGE(mr1.addr, 64, mr1.lkey), sh.SGE(mr2.addr, 4096, mr2.lkey)])
    data = rng.randbytes(64 + 4096)

    back = await write_then_read(pair, mkey, data)
    m1, m2 = await mr1.read(), await mr2.read()
    assert m1[:64] == data[:64]
    assert m2[:4096] == data[64:]
    assert m1[64:] == bytes(256 - 64)
    assert m2[4096:] == bytes(8192 - 4096)
    assert back == data


async def test_e2e_mkey_configure_interleaved_layout_example(pair, rng):
    """"The first 512 bytes will go to memory referenced by mr1 at offset 0. The next 8
    bytes will go to memory referenced by mr2 at offset 0. The next 512 bytes will go to
    memory referenced by mr1 at offset 516. The next 8 bytes will go to memory referenced
    by mr2 at offset 8." """
    t = pair.target
    mr1, mr2 = await t.reg_mr(2048), await t.reg_mr(64)
    # "one entry will be consumed for strided header": two entries need max_entries 3.
    mkey = await t.mkey(INDIRECT, access=RW, max_entries=3,
                        interleaved=(2, [sh.Mlx5MrInterleaved(mr1.addr, 512, 4, mr1.lkey),
                                         sh.Mlx5MrInterleaved(mr2.addr, 8, 0, mr2.lkey)]))
    data = rng.randbytes(2 * 520)

    back = await write_then_read(pair, mkey, data)
    m1, m2 = await mr1.read(), await mr2.read()
    assert m1[0:512] == data[0:512]
    assert m2[0:8] == data[512:520]
    assert m1[516:1028] == data[520:1032]
    assert m2[8:16] == data[1032:1040]
    # The skipped 4 bytes and everything past the layout are untouched.
    assert m1[512:516] == bytes(4)
    assert m1[1028:] == bytes(2048 - 1028)
    assert m2[16:] == bytes(64 - 16)
    assert back == data
