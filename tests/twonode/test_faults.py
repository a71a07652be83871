"""PLACE FOR THE FAULT-INJECTION CASES ACROSS TWO HOSTS (issue 4).

Fault rules come with issue 4 (``node.faults.add(...)`` on a daemon's wire path). When
they land, each case below becomes a test here, on ``remote_pair`` (conftest.py) like
test_examples.py: the rule installed on the remote target's daemon (``pair.target.node``)
or on this host's initiator daemon (``pair.initiator.node``), so every corrupted,
dropped or delayed packet really crosses between the two hosts. Until then each case
is listed and skipped with that reason, so the run shows what is still to come.
"""

from __future__ import annotations

import pytest

ISSUE_4 = "fault injection arrives with issue 4 (node.faults); this case is a placeholder"

# TODO(issue 4): one test per entry, from issue 4's "Must show".
FAULT_CASES = {
    "dif-field-corrupted": "T10-DIF wire, RDMA_WRITE of 8 blocks: guard / app tag / ref tag / "
    "data byte of block k corrupted (integrity recomputed) -> BAD_GUARD / BAD_APPTAG / "
    "BAD_REFTAG / BAD_GUARD at offset k*520, initiator SUCCESS, other blocks intact",
    "stale-integrity-dropped": "the same corruption with the integrity check stale -> "
    "dropped, retransmitted, NO_ERR, counters show one drop and one retransmission",
    "read-response-corrupted": "RDMA_READ response corrupted -> caught by the initiator's "
    "own MKEY (wire T10-DIF, memory none)",
    "crypto-row-c-ciphertext": "crypto table row C: ciphertext byte of block k corrupted -> "
    "DIF check fails at block k after decryption",
    "app-escape": "app tag 0xFFFF under APP_ESCAPE: corruption not reported",
    "lossy-link-2000": "2,000 messages with 5% drops, 5% duplicates and reordering: every "
    "byte in place, every WR completed exactly once",
    "all-dropped": "100% drops -> RETRY_EXC_ERR after retry_cnt retries, the rest flushed",
    "rnr-every-receive": "RNR on every receive with rnr_retry 2 -> RNR_RETRY_EXC_ERR",
}


@pytest.mark.skip(reason=ISSUE_4)
@pytest.mark.parametrize("case", FAULT_CASES)
def test_twonode_fault_case(case):
    raise NotImplementedError(FAULT_CASES[case])
