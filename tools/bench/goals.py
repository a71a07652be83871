"""``softhca bench goals``: saved runs of both benches against softhca's performance goals.

Every goal is a ratio the bench already prints (a figure over a ceiling of the same run,
or one engine ceiling in MB/s), so a goal names the JSON field it reads and nothing is
measured here. Several saved runs of a bench stand side by side, and the verdict is
on their median: one run on a shared machine carries its load, a median of three much
less. A goal a run has no field for (a run saved before the bench measured it, a UCX
peer that was not installed) says so in its cell; it never stops the report.

This module reads plain JSON only: no bench, engine or protocol code is needed to judge
a saved run.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

from .compare import E2E_KIND, ENGINE_KIND, CompareError, read_document

# The path MTU of goodput rows saved before each row carried its own: the setup's, and
# before the setup said, the bench's only one.
DEFAULT_PATH_MTU = 4096
MIB = 1 << 20


# A file the report cannot read; the message is the reason, then the file. The same
# error as --compare's: both read saved runs through compare.read_document.
GoalsError = CompareError


@dataclass(frozen=True)
class Goal:
    """One row of the goals table. ``field`` is the path to the value in a saved run:
    member names, and for a list the members its element must have (a ``dict``).
    ``op`` is ">=" or "<="; None for a figure shown beside a peer with no goal."""

    figure: str
    kind: str
    field: tuple
    op: str | None
    goal: float | None
    # The optional section of a run the field is in (``softhca bench --c``'s
    # "c_programs"): a run without it, or whose section was skipped, is not judged.
    section: str | None = None


def _row(op: str, config: str, size: int, ratio: str) -> tuple:
    return ("goodput", {"op": op, "config": config, "size": size,
                        "path_mtu": DEFAULT_PATH_MTU}, "ratio", ratio)


def _engine(name: str) -> tuple:
    return ("results", {"name": name}, "ratio")


C_SECTION = "c_programs"


def _c(figure: str, ratio: str, op: str, goal: float) -> Goal:
    return Goal(figure, E2E_KIND, (C_SECTION, "ratios", ratio), op, goal, C_SECTION)


ROW_C_WRITE = ("goodput", {"op": "RDMA_WRITE", "config": "row_c", "size": MIB,
                           "path_mtu": DEFAULT_PATH_MTU})

# The performance goals (docs/performance.md), in their table's order and words. The latency ratio is p50 over the
# TCP chain of the same hops (tools/bench/ceilings.py); "the lower ceiling" is the row's
# ratio.min; the engine ceiling of row C's 1 MiB RDMA_WRITE is the target's RX transform.
GOALS = (
    Goal("plain RDMA_WRITE 1 MiB / TCP", E2E_KIND, _row("RDMA_WRITE", "plain", MIB,
                                                       "tcp_stream"), ">=", 0.8),
    Goal("plain RDMA_READ 1 MiB / TCP", E2E_KIND, _row("RDMA_READ", "plain", MIB,
                                                      "tcp_stream"), ">=", 0.8),
    Goal("plain SEND 64 KiB / TCP", E2E_KIND, _row("SEND", "plain", 64 << 10, "tcp_stream"),
         ">=", 0.6),
    Goal("plain RDMA_WRITE 4 KiB / TCP", E2E_KIND, _row("RDMA_WRITE", "plain", 4 << 10,
                                                       "tcp_stream"), ">=", 0.5),
    Goal("T10-DIF RDMA_WRITE 1 MiB / TCP", E2E_KIND, _row("RDMA_WRITE", "t10dif", MIB,
                                                         "tcp_stream"), ">=", 0.8),
    Goal("row C RDMA_WRITE 1 MiB / TCP", E2E_KIND, (*ROW_C_WRITE, "ratio", "tcp_stream"),
         ">=", 0.8),
    Goal("row C RDMA_WRITE 1 MiB / lower ceiling", E2E_KIND, (*ROW_C_WRITE, "ratio", "min"),
         ">=", 0.6),
    Goal("row C RDMA_WRITE 1 MiB: engine ceiling, MB/s", E2E_KIND,
         (*ROW_C_WRITE, "ceilings", "engine"), ">=", 2000.0),
    Goal("64-byte RDMA_WRITE p50 / TCP chain", E2E_KIND,
         ("latency", "ratio", "p50_to_tcp_chain"), "<=", 1.5),
    # C programs between two network namespaces, over kernel TCP between the same
    # namespaces (softhca bench --c: tools/bench/cprograms.py).
    _c("C: qperf rc_lat / tcp_lat", "rc_lat_to_tcp_lat", "<=", 2.0),
    _c("C: ib_send_lat 64 B typical / tcp_lat", "ib_send_lat_to_tcp_lat", "<=", 2.0),
    _c("C: qperf rc_bw 64 KiB / tcp_bw", "rc_bw_to_tcp_bw", ">=", 0.6),
    _c("C: qperf rc_rdma_write_bw 64 KiB / tcp_bw", "rc_rdma_write_bw_to_tcp_bw", ">=", 0.7),
    _c("C: ib_write_bw 1 MiB / tcp_bw", "ib_write_bw_to_tcp_bw", ">=", 0.9),
    _c("C: iSER WRITE 256 KiB / tcp_bw", "iser_write_to_tcp_bw", ">=", 0.5),
    _c("C: iSER READ 256 KiB / tcp_bw", "iser_read_to_tcp_bw", ">=", 0.5),
    Goal("engine T10-DIF generate 512 B / one fastcrc call", ENGINE_KIND,
         _engine("T10-DIF generate, 512B blocks"), ">=", 0.3),
    Goal("engine CRC32C 4 KiB / one call", ENGINE_KIND,
         _engine("CRC32C generate, 4096B blocks"), ">=", 0.5),
    Goal("engine AES-XTS-256 512 B / one context", ENGINE_KIND,
         _engine("AES-XTS-256 encrypt, 512B units"), ">=", 0.4),
    Goal("engine row C TX / one call each", ENGINE_KIND,
         _engine("row C TX: T10-DIF gen + XTS 520B"), ">=", 0.3),
    # Beside the UCX peer, when it ran (tools/bench/ucx.py): no goal, shown only when a
    # run has them.
    Goal("plain RDMA_WRITE 1 MiB / UCX put", E2E_KIND,
         _row("RDMA_WRITE", "plain", MIB, "ucx_put"), None, None),
    Goal("plain RDMA_READ 1 MiB / UCX put", E2E_KIND,
         _row("RDMA_READ", "plain", MIB, "ucx_put"), None, None),
    Goal("plain SEND 64 KiB / UCX put", E2E_KIND,
         _row("SEND", "plain", 64 << 10, "ucx_put"), None, None),
    Goal("64-byte RDMA_WRITE p50 / UCX put round trip", E2E_KIND,
         ("latency", "ratio", "p50_to_ucx_put"), None, None),
)


def field_text(field: tuple) -> str:
    """The path as one line: ``goodput[op="SEND", ...].ratio.tcp_stream``."""
    out = ""
    for step in field:
        if isinstance(step, dict):
            out += "[" + ", ".join(f"{k}={json.dumps(v)}" for k, v in step.items()) + "]"
        else:
            out += ("." if out else "") + step
    return out


class Absent(LookupError):
    """The run has no such field; the message names the first step it lacks."""


def _member(doc: dict, element: dict, key: str):
    if key in element:
        return element[key]
    if key == "path_mtu":
        setup = doc.get("setup")
        return setup.get("path_mtu", DEFAULT_PATH_MTU) if isinstance(setup, dict) \
            else DEFAULT_PATH_MTU
    return None


def lookup(doc: dict, field: tuple) -> float:
    """The number at ``field`` in ``doc``: Absent when a step is missing or the value is
    not a finite number."""
    node, seen = doc, ()
    for step in field:
        if isinstance(step, dict):
            rows = node if isinstance(node, list) else []
            found = [r for r in rows if isinstance(r, dict)
                     and all(_member(doc, r, k) == v for k, v in step.items())]
            if not found:
                raise Absent(f"no {field_text((*seen, step))}")
            node = found[0]
        else:
            if not isinstance(node, dict) or step not in node:
                raise Absent(f"no {field_text((*seen, step))}")
            node = node[step]
        seen = (*seen, step)
    if not (isinstance(node, (int, float)) and not isinstance(node, bool)
            and math.isfinite(node)):
        raise Absent(f"{field_text(field)} is not a number ({json.dumps(node)[:40]})")
    return float(node)


def read_run(path: str) -> dict:
    """A saved ``softhca bench [engine] --json`` document; GoalsError when the file is
    missing, not JSON or not a document of either bench."""
    return read_document(path)


def verdict(op: str | None, goal: float | None, median: float | None) -> dict:
    """met, or missed by F: goal/median for a >= goal, median/goal for a <= one."""
    if op is None:
        return {"verdict": "no goal", "factor": None}
    if median is None:
        return {"verdict": "not measured", "factor": None}
    if (median >= goal) if op == ">=" else (median <= goal):
        return {"verdict": "met", "factor": None}
    if op == ">=" and median <= 0:
        return {"verdict": "missed", "factor": None}
    return {"verdict": "missed", "factor": goal / median if op == ">=" else median / goal}


def _machine(doc: dict) -> dict:
    m = doc.get("machine")
    return m if isinstance(m, dict) else {}


def _engine(doc: dict) -> str | None:
    """The engine the run names; None in runs saved before the bench recorded it."""
    e = _machine(doc).get("engine_backend")
    return e if isinstance(e, str) else None


def run_info(path: str, doc: dict) -> dict:
    load = _machine(doc).get("load_average_at_start")
    return {"file": path, "load_average_at_start": load if isinstance(load, list) else None}


def unjudged(doc: dict, section: str | None) -> str | None:
    """Why a run is not judged on a goal of ``section``: it has no such section (saved
    without the option that runs it) or the section was skipped; None when it is."""
    if section is None:
        return None
    s = doc.get(section)
    if not isinstance(s, dict):
        return f"not judged: no {section} section (a run without `softhca bench --c`)"
    if "skipped" in s:
        return f"not judged: its {section} section was skipped: {str(s['skipped'])[:120]}"
    return None


def _values(g: Goal, docs: list[dict]) -> tuple[list, list, list]:
    """Each run's value of goal ``g`` (None when it has none), why not, and whether that
    is because the run is not judged on it."""
    values, absent, skipped = [], [], []
    for doc in docs:
        why = unjudged(doc, g.section)
        try:
            if why:
                raise Absent(why)
            values.append(lookup(doc, g.field))
            absent.append(None)
        except Absent as e:
            values.append(None)
            absent.append(str(e))
        skipped.append(why is not None)
    return values, absent, skipped


def _rows(kind: str, docs: list[dict]) -> list[dict]:
    rows = []
    for g in GOALS:
        if g.kind != kind:
            continue
        values, absent, skipped = _values(g, docs)
        have = [v for v in values if v is not None]
        if g.op is None and not have:
            continue
        median = statistics.median(have) if have else None
        judged = verdict(g.op, g.goal, median)
        if median is None and all(skipped):
            judged = {"verdict": "not judged", "factor": None}
        rows.append({"figure": g.figure, "field": field_text(g.field),
                     "goal": None if g.op is None else {"op": g.op, "value": g.goal},
                     "values": values, "absent": absent, "not_judged": skipped,
                     "min": min(have) if have else None, "median": median, **judged})
    return rows


def report(paths: list[str]) -> dict:
    """Each goal against the runs of its bench among ``paths`` (either bench, any
    order): every run's value or why it has none, min, median and the verdict. Runs on
    different engines (``machine.engine_backend``: SOFTHCA_ENGINE=python beside the
    native engine) are judged apart, a group each, since a median across two engines
    describes neither. A figure with no goal (beside the UCX peer) is left out when no
    run has it."""
    docs = [(p, read_run(p)) for p in paths]
    groups = []
    for kind in (E2E_KIND, ENGINE_KIND):
        mine = [(p, d) for p, d in docs if d["benchmark"] == kind]
        for engine in dict.fromkeys(_engine(d) for _, d in mine):
            these = [(p, d) for p, d in mine if _engine(d) == engine]
            groups.append({"bench": kind, "engine_backend": engine,
                           "runs": [run_info(p, d) for p, d in these],
                           "rows": _rows(kind, [d for _, d in these])})
    return {"benchmark": "goals", "goals_of": "softhca's performance goals (docs/performance.md)", "groups": groups}


# -- the table --------------------------------------------------------------------------

def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _goal_text(goal: dict | None) -> str:
    if goal is None:
        return "-"
    return f"{goal['op']} {_num(goal['value'])}" + ("x" if goal["op"] == "<=" else "")


def _verdict_text(row: dict) -> str:
    if row["verdict"] == "missed" and row["factor"] is not None:
        return f"missed by {row['factor']:.3g}x"
    if row["verdict"] == "not measured":
        return "not measured (no run has it)"
    if row["verdict"] == "not judged":
        return "not judged (no run has its section)"
    return row["verdict"]


def _cell(value: float | None, not_judged: bool) -> str:
    if value is not None:
        return _num(value)
    return "not judged" if not_judged else "absent"


def _lines(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(len(head))]

    def line(cells: list[str]) -> str:
        # The figure and the verdict read left to right, the numbers align right.
        return "  ".join(c.ljust(w) if k in (0, len(cells) - 1) else c.rjust(w)
                         for k, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    return [line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _run_line(k: int, r: dict) -> str:
    load = r["load_average_at_start"]
    return f"  run {k}: {r['file']}" + (
        f" (load average at start {' '.join(str(x) for x in load)})" if load else "")


TITLES = {E2E_KIND: ("end to end", "softhca bench --json"),
          ENGINE_KIND: ("engine bench", "softhca bench engine --json")}


def to_table(rep: dict) -> str:
    out = ["softhca bench goals: softhca's performance goals against saved runs; verdict on the "
           "median of the runs: met, or missed by F = goal / median (>= goals) or median / "
           "goal (<= goals); runs on different engines are judged apart"]
    for kind, (title, saved_by) in TITLES.items():
        groups = [g for g in rep["groups"] if g["bench"] == kind]
        if not groups:
            judged = sum(g.kind == kind and g.op is not None for g in GOALS)
            out += ["", f"[{title}] no run of `{saved_by}` given: its {judged} goals are not "
                    "measured"]
        for group in groups:
            out += ["", _group_table(title, group)]
    return "\n".join(out)


def _group_table(title: str, group: dict) -> str:
    runs, rows = group["runs"], group["rows"]
    engine = group["engine_backend"]
    out = [f"[{title}, {f'{engine} engine' if engine else 'engine not recorded'}] "
           f"{len(runs)} run{'s' if len(runs) > 1 else ''}:"]
    out += [_run_line(k, r) for k, r in enumerate(runs, 1)]
    head = ["figure", "goal", *(f"run {k}" for k in range(1, len(runs) + 1)), "min",
            "median", "verdict"]
    cells = [[r["figure"], _goal_text(r["goal"]),
              *(_cell(v, skip) for v, skip in zip(r["values"], r["not_judged"], strict=True)),
              _num(r["min"]), _num(r["median"]), _verdict_text(r)] for r in rows]
    out += _lines(head, cells)
    lacking = [f"  run {k}: {why} ({r['figure']})" for r in rows
               for k, why in enumerate(r["absent"], 1) if why]
    if lacking:
        out += ["absent fields (a run saved before the bench measured them, a peer not "
                "installed, or a section the run did not have):", *lacking]
    return "\n".join(out)
