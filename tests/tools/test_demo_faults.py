"""``softhca demo faults``: the fault injection walk-through, and its verdicts.

The walk-through runs every case between two embedded daemons and judges it against
its own oracle (crcmod T10-DIF, cryptography XTS, docs/semantics.md's check order), so
these tests check that every case is run and passes with the facts it must show,
that ``--list`` and ``--only`` work for it, and that a disagreeing oracle or
a fault the engine does not inject really makes a case FAIL with exit status 1.
"""

from __future__ import annotations

import re

from softhca.server.faults import Faults
from softhca.tools import demo_faults
from softhca.tools.cli import main

CASE_NAMES = ["guard", "app tag", "ref tag", "data byte", "link error", "read response",
              "crypto row C", "app escape", "lossy link", "retry exceeded", "rnr exceeded"]


def verdicts(out: str) -> dict[str, str]:
    """Case name -> PASS or FAIL, from each case's last line."""
    return {m.group(2): m.group(1)
            for m in re.finditer(r"^  (PASS|FAIL)  (.+?)(?::.*)?$", out, re.M)}


def test_every_case_passes_and_shows_what_it_found(capsys):
    assert main(["demo", "faults"]) == 0
    out = capsys.readouterr().out
    assert verdicts(out) == dict.fromkeys(CASE_NAMES, "PASS")
    assert not re.search(r"^\s*FAIL", out, re.M) and " BAD " not in out
    assert out.rstrip().endswith("11 cases: 11 PASS, 0 FAIL")
    assert "\x1b[" not in out
    # Case 1: the rule as faults.add returned it, block 3 before and after, the
    # target's mkey_check with actual, expected and offset 3*520.
    assert "{'id': 1, 'direction': 'out', 'action': 'corrupt', 'opcode': 'RDMA_WRITE', " \
        "'block': 3, 'block_size': 520, 'field': 'guard'" in out
    assert re.search(r"mkey_check ok  target MKEY 0x[0-9a-f]+: BAD_GUARD actual 0x[0-9a-f]{4} "
                     r"expected 0x[0-9a-f]{4} offset 1560", out)
    assert re.search(r"\^ guard 0x[0-9a-f]{4} -> 0x[0-9a-f]{4}", out)
    assert "completion ok  initiator wr 4 RDMA_WRITE SUCCESS" in out
    assert re.search(r"BAD_APPTAG actual 0xbeef expected 0xbeff offset 2600", out)
    assert re.search(r"BAD_REFTAG actual 0x2000 expected 0x2010 offset 0\n", out)
    assert re.search(r"\^ data byte 100: 0x[0-9a-f]{2} -> 0x[0-9a-f]{2}", out)
    assert re.search(r"BAD_GUARD actual 0x[0-9a-f]{4} expected 0x[0-9a-f]{4} offset 3640", out)
    # Case 5: a link error is dropped, retransmitted, and the signature check is clean.
    assert "target: packets_bad_icrc 0 -> 1 (+1)" in out
    assert "initiator: retransmissions 0 -> 1 (+1)" in out
    assert re.search(r"mkey_check ok  target MKEY 0x[0-9a-f]+: NO_ERR\n", out)
    # Cases 6 and 7: the initiator's own MKEY, and row C after decryption.
    assert re.search(r"initiator MKEY 0x[0-9a-f]+: BAD_GUARD actual 0x[0-9a-f]{4} expected "
                     r"0xdead offset 2080", out)
    assert re.search(r"\^ ciphertext byte 33: ", out)
    assert re.search(r"BAD_GUARD actual 0x[0-9a-f]{4} expected 0x[0-9a-f]{4} offset 3120", out)
    # Case 8: escaped, then the contrast caught.
    assert "NO_ERR (block 2 escaped)" in out
    # Cases 9 to 11: the link's recovery and its limits.
    assert "200 send completions, wr 0..199 once each in order, all SUCCESS" in out
    assert re.search(r"target: .*duplicates_discarded 0 -> \d+", out)
    assert "initiator wr 1 RETRY_EXC_ERR, wr 2 WR_FLUSH_ERR, wr 3 WR_FLUSH_ERR" in out
    assert "initiator wr 2 RNR_RETRY_EXC_ERR" in out
    assert "rnr_retries 0 -> 3 (+3)" in out
    assert "target wr 1 WR_FLUSH_ERR" in out


def test_list_names_the_eleven_cases(capsys):
    assert main(["demo", "faults", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 11
    assert [line[:28].rstrip() for line in lines] == CASE_NAMES
    # Without the positional, --list still lists the man pages' examples.
    assert main(["demo", "--list"]) == 0
    assert "sig_block 1" in capsys.readouterr().out


def test_only_selects_cases_and_an_unknown_name_is_a_usage_error(capsys):
    assert main(["demo", "faults", "--only", "GUARD", "--only", "r"]) == 0
    out = capsys.readouterr().out
    assert list(verdicts(out)) == ["guard", "ref tag", "read response", "retry exceeded",
                                   "rnr exceeded"]
    assert "5 cases: 5 PASS, 0 FAIL" in out
    assert main(["demo", "faults", "--only", "no such case"]) == 2
    assert "no fault case named" in capsys.readouterr().err


def test_a_wrong_oracle_is_a_fail_and_exit_1(monkeypatch, capsys):
    """The oracle's guard one bit off: its expected mkey_check no longer agrees."""
    real = demo_faults.guard_of
    monkeypatch.setattr(demo_faults, "guard_of", lambda d, blk: real(d, blk) ^ 0x0001)
    assert main(["demo", "faults", "--only", "guard"]) == 1
    out = capsys.readouterr().out
    assert verdicts(out) == {"guard": "FAIL"}
    assert re.search(r"FAIL  guard: target MKEY 0x[0-9a-f]+: BAD_GUARD actual 0x[0-9a-f]{4} "
                     r"expected 0x[0-9a-f]{4} offset 1560: expected BAD_GUARD .* offset 0", out)
    assert out.rstrip().endswith("1 case: 0 PASS, 1 FAIL\nfailed: guard")


def test_a_corruption_the_daemon_does_not_make_is_a_fail(monkeypatch, capsys):
    """A broken fault path (the packet left as it was): nothing is caught, and it FAILs."""
    monkeypatch.setattr(Faults, "_corrupt", lambda self, r, p, *a: p)
    assert main(["demo", "faults", "--only", "app tag"]) == 1
    out = capsys.readouterr().out
    assert verdicts(out) == {"app tag": "FAIL"}
    assert re.search(r"mkey_check BAD target MKEY 0x[0-9a-f]+: NO_ERR: expected BAD_APPTAG", out)
