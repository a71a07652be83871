"""The fault-injection cases (docs/architecture.md, "Fault injection") across two hosts.

Each test runs the very case function of the single-host suite (tests/e2e/test_e2e_faults.py)
on a pair whose target is the remote daemon at SOFTHCA_TARGET: the rules go on the
remote target's daemon or on this host's initiator daemon, so every corrupted, dropped,
duplicated or reordered packet really crosses between the two hosts. Every case clears
its rules when it ends, so a shared target is left as it was found.
"""

from __future__ import annotations

import random

import pytest
import test_e2e_faults as faults

from twonode.remote import within


@pytest.mark.parametrize("field,k", faults.DIF_FIELDS)
async def test_twonode_corrupted_dif_field(remote_pair, rng, field, k):
    await within(faults.case_dif_field(remote_pair, rng, field, k), f"corrupted {field}")


@pytest.mark.parametrize("case", ["stale_icrc", "read_response", "row_c", "app_escape",
                                  "all_dropped", "rnr_every_receive"])
async def test_twonode_fault_case(remote_pair, rng, case):
    await within(getattr(faults, f"case_{case}")(remote_pair, rng), case)


async def test_twonode_lossy_link(remote_pair):
    # Two processes (or hosts) on a possibly busy machine: a 16 ms ACK timeout (timeout
    # 12), so scheduling jitter is not taken for a lost link 8 times in a row.
    await within(faults.case_lossy_link(remote_pair, random.Random(2000), n=600, timeout=12),
                 "lossy link")
