"""The man pages' examples across two hosts: the target is the remote daemon at
SOFTHCA_TARGET, the initiator a daemon on this host.

Each test runs the very example function of the single-host end-to-end suite
(tests/e2e/test_e2e_*.py) on a pair whose two sides live on different hosts, so the two
suites cannot drift apart; the expected images come from softhca.tools.oracle there. Every
test is bounded by SOFTHCA_TWONODE_TIMEOUT on top of the examples' own completion
timeouts (tests/support/e2e.py: cq.poll_n with a timeout).
"""

from __future__ import annotations

import pytest
import test_e2e_crypto_examples as crypto
import test_e2e_layouts as layouts
import test_e2e_sig_block_examples as sig_block

import softhca.client as sh

from twonode.remote import remote_two_nodes, within

# mlx5dv_wr_set_mkey_sig_block(3): examples 1, 1.1, 2, 2.1.
SIG_BLOCK = {
    "1": sig_block.test_e2e_sig_block_example_1,
    "1.1": sig_block.test_e2e_sig_block_example_1_1,
    "2": sig_block.test_e2e_sig_block_example_2,
    "2.1": sig_block.test_e2e_sig_block_example_2_1,
}
# mlx5dv_wr_set_mkey_crypto(3): examples 1, 1.1, 2, 2.1 (the table rows are below).
CRYPTO = {
    "1": crypto.test_e2e_crypto_example_1,
    "1.1": crypto.test_e2e_crypto_example_1_1,
    "2": crypto.test_e2e_crypto_example_2,
    "2.1": crypto.test_e2e_crypto_example_2_1,
}
# mlx5dv_wr_mkey_configure(3): the list and the interleaved layout.
LAYOUTS = {
    "list": layouts.test_e2e_mkey_configure_list_layout_example,
    "interleaved": layouts.test_e2e_mkey_configure_interleaved_layout_example,
}


@pytest.mark.parametrize("example", SIG_BLOCK)
async def test_twonode_sig_block_example(remote_pair, rng, example):
    await within(SIG_BLOCK[example](remote_pair, rng), f"sig_block example {example}")


@pytest.mark.parametrize("row", list("ABCDEFGHIJ"))
async def test_twonode_crypto_table_row(remote_pair, rng, row):
    await within(crypto.run_row(remote_pair, row, rng), f"crypto table row {row}")


@pytest.mark.parametrize("row", ["C", "E", "I"])
async def test_twonode_crypto_table_row_mtu_256(twonode_target, rng, row):
    """Data units and blocks spanning many packets between the two hosts."""
    async with remote_two_nodes(twonode_target, mtu=sh.IBV_MTU_256) as pair:
        await within(crypto.run_row(pair, row, rng), f"crypto table row {row}, MTU 256")


@pytest.mark.parametrize("example", CRYPTO)
async def test_twonode_crypto_example(remote_pair, rng, example):
    await within(CRYPTO[example](remote_pair, rng), f"crypto example {example}")


@pytest.mark.parametrize("layout", LAYOUTS)
async def test_twonode_mkey_configure_layout(remote_pair, rng, layout):
    await within(LAYOUTS[layout](remote_pair, rng), f"{layout} layout example")
