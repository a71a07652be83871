"""Every row of README's tables of what runs on softhca is backed by a test that names it.

A test claims the row it backs with the marker ``readme_row(part)``: ``part`` is the row's
first cell or a piece of it found in that row's first cell alone (on a test function, a
parametrized case or a module's ``pytestmark``). The claims are read from the tests' text
with ``ast``, so a test that is skipped here (the native ones without root) still owns its
row. Every row of the tables below must be claimed, and every claim must name one row.

The quota table is owned whole by ``test_the_quota_table_is_the_daemons_defaults``: its
rows are the daemon's ``DEFAULT_QUOTAS``, kind for kind and number for number.

The second half feeds the checkers small broken inputs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

# The header line of each table whose rows tests own.
OWNED_TABLES = (
    "| verb or program | on softhca |",
    "| middleware | what runs | on softhca |",
    "| `mlx5dv_*` call | on softhca |",
)

# Rows no test runs yet, each with the reason; the check below fails when one of these
# rows is gone or has found an owner, so this list can only shrink.
UNOWNED = {
    "XRC QPs; `ibv_wr_send_tso`; `ibv_create_cq_ex`; device memory, flows, counters":
        "libibverbs answers EOPNOTSUPP for a verb whose op the provider leaves unset; no C "
        "program of ours calls these yet",
    "rdma_cm's multicast (`rdma_join_multicast`, so `mckey`), `rdma_create_srq`, ECE, "
    "rsockets; `rdma_set_option`'s other options":
        "only rdma_set_option's answers are run (tests/native/test_rdmacm.py, "
        "test_rdma_set_option: ENOSYS, EOPNOTSUPP); no program of ours calls the others",
}


def table_rows(markdown: str, header: str) -> list[str]:
    """The first cells of the table under ``header`` (its separator line skipped)."""
    lines = markdown.splitlines()
    at = lines.index(header)
    rows = []
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        rows.append(_first_cell(line))
    return rows


def _first_cell(line: str) -> str:
    # A cell ends at a "|" that is not escaped ("\|" stands inside a cell).
    return re.split(r"(?<!\\)\|", line)[1].strip()


def claims(files: list[tuple[str, str]]) -> list[tuple[str, int, str]]:
    """(file, line, part) of every ``readme_row("part")`` in the files' code."""
    out = []
    for name, text in files:
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "readme_row"):
                arg = node.args[0] if node.args else None
                part = arg.value if isinstance(arg, ast.Constant) else None
                out.append((name, node.lineno, part if isinstance(part, str) else "?"))
    return out


def ownership(rows: list[str], found: list[tuple[str, int, str]],
              unowned: dict[str, str]) -> list[str]:
    """What is wrong: claims naming no row or several, rows nobody claims (not listed in
    ``unowned``), ``unowned`` entries that are no row or are claimed after all."""
    bad = []
    owned: set[str] = set()
    for name, line, part in found:
        hits = [r for r in rows if part in r]
        if len(hits) != 1:
            bad.append(f"{name}:{line}: {part!r} names {len(hits)} rows")
        owned.update(hits)
    for row in rows:
        if row not in owned and row not in unowned:
            bad.append(f"no test claims the row {row[:70]!r}")
    for row in unowned:
        if row not in rows:
            bad.append(f"UNOWNED names no row: {row[:70]!r}")
        elif row in owned:
            bad.append(f"UNOWNED lists a row a test claims: {row[:70]!r}")
    return bad


def _test_files() -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), p.read_text()) for p in sorted((ROOT / "tests").rglob("*.py"))
            if p.resolve() != Path(__file__).resolve()]


def test_every_row_of_the_tables_is_owned_by_a_test():
    text = README.read_text()
    rows = [r for header in OWNED_TABLES for r in table_rows(text, header)]
    assert len(rows) > 30
    assert ownership(rows, claims(_test_files()), UNOWNED) == []


def _number(cell: str) -> int:
    return int(re.match(r"[\d,]+", cell.strip()).group(0).replace(",", ""))


def test_the_quota_table_is_the_daemons_defaults():
    from softhca.server.hosts import DEFAULT_QUOTAS

    lines = README.read_text().splitlines()
    at = lines.index("| KIND | per session | per credential |")
    table = {}
    for line in lines[at + 2:]:
        if not line.startswith("|"):
            break
        kind, session, credential = (c.strip() for c in line.strip("|").split("|"))
        table[kind.strip("`")] = (_number(session), _number(credential))
    assert table == DEFAULT_QUOTAS


def test_the_memory_budget_row_names_each_objects_cost():
    """The ``--memory-budget`` row says what each kind of object costs; those are the
    daemon's OBJECT_BYTES, every kind named."""
    from softhca.server.hosts import OBJECT_BYTES

    row = next(line for line in README.read_text().splitlines()
               if line.startswith("| `--memory-budget BYTES` |"))
    said = re.search(r"objects \((.*?)\) and registered memory", row).group(1)
    names = {"QP": "qp", "SRQ": "srq", "CQ": "cq", "MKEY": "mkey", "DEK": "dek",
             "context": "ctx", "MR": "mr", "crypto login": "crypto_login", "PD": "pd",
             "AH": "ah", "MW": "mw"}
    costs = {}
    for group in re.split(r", (?=an? )", said):
        size = re.search(r"(\d+) (KiB|B)$", group)
        value = int(size.group(1)) * (1024 if size.group(2) == "KiB" else 1)
        for word, kind in names.items():
            if re.search(rf"\b{word}\b", group):
                costs[kind] = value
    assert costs == OBJECT_BYTES


# -- the checkers on small inputs --------------------------------------------------------------

TABLE = """\
| verb or program | on softhca |
|---|---|
| `a`, `b` | works |
| `a` of \\| pipes | refused |
| `c` | works |

after
"""


def test_table_rows_reads_first_cells():
    assert table_rows(TABLE, "| verb or program | on softhca |") == [
        "`a`, `b`", "`a` of \\| pipes", "`c`"]


def test_claims_are_read_from_markers_anywhere():
    source = ('import pytest\npytestmark = pytest.mark.readme_row("`c`")\n'
              '@pytest.mark.readme_row("`a`, `b`")\ndef test_x(): pass\n'
              'CASES = [pytest.param(1, marks=pytest.mark.readme_row("pipes"))]\n')
    assert sorted(claims([("t.py", source)])) == [
        ("t.py", 2, "`c`"), ("t.py", 3, "`a`, `b`"), ("t.py", 5, "pipes")]


@pytest.mark.parametrize("found, unowned, expected", [
    ([("t", 1, "`a`, `b`"), ("t", 2, "pipes"), ("t", 3, "`c`")], {}, []),
    ([("t", 1, "`a`, `b`"), ("t", 2, "pipes")], {}, ["no test claims the row '`c`'"]),
    ([("t", 1, "`a`, `b`"), ("t", 2, "pipes")], {"`c`": "why"}, []),
    ([("t", 1, "`a`"), ("t", 2, "`c`")], {}, ["t:1: '`a`' names 2 rows"]),
    ([("t", 1, "`a`, `b`"), ("t", 2, "pipes"), ("t", 3, "`d`")], {"`c`": "why"},
     ["t:3: '`d`' names 0 rows"]),
    ([("t", 1, "`a`, `b`"), ("t", 2, "pipes"), ("t", 3, "`c`")], {"`c`": "why"},
     ["UNOWNED lists a row a test claims: '`c`'"]),
    ([("t", 1, "`a`, `b`"), ("t", 2, "pipes"), ("t", 3, "`c`")], {"`e`": "why"},
     ["UNOWNED names no row: '`e`'"]),
], ids=["all owned", "one unowned", "listed unowned", "ambiguous", "names none",
        "stale unowned", "unowned gone"])
def test_ownership_reports_each_break(found, unowned, expected):
    rows = table_rows(TABLE, "| verb or program | on softhca |")
    assert ownership(rows, found, unowned) == expected
