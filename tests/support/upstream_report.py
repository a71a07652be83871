"""Reads what ``run_tests.py -v`` (unittest at verbosity 2) wrote to stderr: each test's
outcome, its summary line, and per module the counts the report prints.

A test's line starts ``test_x (tests.test_mod.Class.test_x)`` (its docstring's first line
may follow on the next line) and ends ``... ok``, ``... skipped 'why'``, ``... ERROR``,
``... FAIL``, ``... expected failure`` or ``... unexpected success`` (on a line of its
own when the test printed something first). softhca's pyverbs,
run with SOFTHCA_PYVERBS_MARK_EOPNOTSUPP, writes EOPNOTSUPP_MARK into that line whenever
it raises EOPNOTSUPP: a skipped test whose line holds the mark was skipped because softhca
answered EOPNOTSUPP; any other skip is the test's own environment check. The outcome
words are unittest's own, so an error is never read as anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

EOPNOTSUPP_MARK = "{softhca:EOPNOTSUPP}"
_START = re.compile(r"^(\w+) \((tests\.[\w.]+)\)", re.M)
_WORD = re.compile(r"^(ok|skipped (.*)|ERROR|FAIL|expected failure|unexpected success)\s*$")


@dataclass
class Outcome:
    test: str          # tests.test_mod.Class.test_x
    result: str        # "ok", "skip-eopnotsupp", "skip-env", "error", "fail"
    reason: str = ""


@dataclass
class Run:
    summary: str                               # "Ran N tests in Xs | OK (skipped=M)"
    outcomes: list[Outcome] = field(default_factory=list)

    def summary_counts(self) -> int:
        """errors + failures as unittest's summary line counts them."""
        return sum(int(n) for n in re.findall(r"(?:errors|failures)=(\d+)", self.summary))

    @property
    def ok(self) -> bool:
        return self.summary.split(" | ")[-1].startswith("OK")

    def by_module(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for o in self.outcomes:
            row = table.setdefault(o.test.split(".")[1], {"ok": 0, "skip-eopnotsupp": 0,
                                                          "skip-env": 0, "error": 0, "fail": 0})
            row[o.result] += 1
        return table

    def env_reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            if o.result == "skip-env":
                counts[o.reason] = counts.get(o.reason, 0) + 1
        return counts


def _unquote(s: str) -> str:
    s = s.strip()
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"" else s


def _outcome(seg: str) -> tuple[str, str | None, bool] | None:
    """The outcome word after the test's `` ... ``: at the end of that line, or alone on
    a later line when the test printed something first (``cat: ...: No such file``)."""
    at = seg.find(" ... ")
    if at < 0:
        return None
    rest = seg[at + 5:]
    for line in rest.splitlines():
        m = _WORD.match(line.replace(EOPNOTSUPP_MARK, ""))
        if m:
            return m.group(1), m.group(2), EOPNOTSUPP_MARK in seg
    return None


def parse(stderr: str) -> Run:
    lines = [ln for ln in stderr.splitlines() if re.match(r"^(Ran \d+ tests|OK|FAILED)", ln)]
    run = Run(" | ".join(lines[-2:]))
    starts = list(_START.finditer(stderr))
    for i, m in enumerate(starts):
        seg = stderr[m.start():starts[i + 1].start() if i + 1 < len(starts) else len(stderr)]
        found = _outcome(seg)
        if found is None:
            continue
        word, why, marked = found
        if word == "ok":
            result, reason = "ok", ""
        elif word.startswith("skipped"):
            result = "skip-eopnotsupp" if marked else "skip-env"
            reason = _unquote(why or "")
        elif word in ("ERROR",):
            result, reason = "error", ""
        else:
            result, reason = "fail", word
        run.outcomes.append(Outcome(m.group(2), result, reason))
    return run
