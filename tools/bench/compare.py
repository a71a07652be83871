"""``--compare``: a saved run beside a new one.

Speeds on a shared machine move with its load; a ratio to a ceiling measured in the same
run moves much less. So a change is read as a ratio of ratios: the row's ratio in the new
run over its ratio in the saved run. For the end-to-end bench the ratio is to the TCP
stream by default: no softhca change moves that ceiling (the engine ceiling moves with
the engine itself), so new/saved is the row's own change, the machine's speed divided out.
"""

from __future__ import annotations

import json
import math
import statistics

from .common import DEFAULT_MTU, LATENCY_BYTES, sig4, size_text
from .cprograms import RATIOS as C_RATIOS
from .cprograms import ROW_TEXT as C_ROW_TEXT
from .output import table_lines

E2E_KIND, ENGINE_KIND = "softhca end to end", "engine"
# --compare-ratio figure: the figures themselves (MB/s, us), for runs of one machine, where
# the TCP ceiling's own run-to-run noise would otherwise be most of what a ratio moves.
FIGURE = "figure"


class CompareError(ValueError):
    """A document ``--compare`` cannot use; the message is the reason."""


def read_document(path: str) -> dict:
    """A saved ``softhca bench [engine] --json`` document of either bench, read and
    parsed; CompareError (reason first, then the file) when it is missing, not JSON or
    not a document of either bench. ``--compare`` and ``softhca bench goals`` both read
    saved runs through it."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise CompareError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise CompareError(f"is a directory, not a saved --json document: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise CompareError(f"cannot read ({reason}): {path}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CompareError(f"not JSON ({e.msg} at line {e.lineno} column {e.colno}): "
                           f"{path}") from None
    doc_kind(doc, path)
    return doc


def load_saved(path: str) -> dict:
    """A saved document checked for what a comparison reads (read_document, then its
    rows)."""
    doc = read_document(path)
    compare_rows(doc, "tcp_stream", path)
    return doc


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _positive(x) -> bool:
    return _number(x) and x > 0


def doc_kind(doc, path: str = "the document") -> str:
    kind = doc.get("benchmark") if isinstance(doc, dict) else None
    if kind not in (E2E_KIND, ENGINE_KIND):
        raise CompareError(f'not a saved `softhca bench --json` or `softhca bench engine '
                           f'--json` document (its "benchmark" is neither {E2E_KIND!r} nor '
                           f'{ENGINE_KIND!r}): {path}')
    return kind


def compare_rows(doc, ratio: str = "tcp_stream",
                 path: str = "the document") -> dict[str, dict]:
    """label -> {figure, unit, ratio, better} for every row a comparison reads."""
    if doc_kind(doc, path) == ENGINE_KIND:
        return _engine_rows(doc, path)
    return {**_goodput_rows(doc, ratio, path), **_latency_rows(doc, path, ratio),
            **_c_rows(doc, path, ratio)}


def _engine_rows(doc: dict, path: str) -> dict[str, dict]:
    results = doc.get("results")
    if not isinstance(results, list) or not results:
        raise CompareError(f'no "results" rows: {path}')
    rows = {}
    for k, r in enumerate(results):
        if not (isinstance(r, dict) and isinstance(r.get("name"), str)
                and _number(r.get("engine_mb_s")) and _positive(r.get("ratio"))):
            raise CompareError(f"results row {k} lacks a name, a numeric engine_mb_s or a "
                               f"positive ratio: {path}")
        # From the figures when they are there: the ratio of documents saved before
        # it had four significant digits was rounded to three decimals.
        p = r.get("primitive_mb_s")
        ratio_ = r["engine_mb_s"] / p if _positive(p) and r["engine_mb_s"] > 0 else r["ratio"]
        rows[r["name"]] = {"figure": r["engine_mb_s"], "unit": "MB/s", "ratio": ratio_,
                           "better": "higher"}
    return rows


def _goodput_row_ok(g, ratio: str, setup_mtu: int) -> bool:
    return (isinstance(g, dict) and isinstance(g.get("op"), str)
            and isinstance(g.get("config"), str) and isinstance(g.get("size"), int)
            and g["size"] > 0 and _number(g.get("mb_s")) and isinstance(g.get("ratio"), dict)
            and _positive(g["mb_s"] if ratio == FIGURE else g["ratio"].get(ratio))
            and isinstance(g.get("path_mtu", setup_mtu), int))


def _goodput_rows(doc: dict, ratio: str, path: str) -> dict[str, dict]:
    goodput = doc.get("goodput")
    if not isinstance(goodput, list) or not goodput:
        raise CompareError(f'no "goodput" rows: {path}')
    setup = doc.get("setup")
    setup_mtu = setup.get("path_mtu", DEFAULT_MTU) if isinstance(setup, dict) else DEFAULT_MTU
    rows = {}
    for k, g in enumerate(goodput):
        if not _goodput_row_ok(g, ratio, setup_mtu):
            raise CompareError(f"goodput row {k} lacks an op, a config, a size, a numeric "
                               f"mb_s or a positive ratio.{ratio}: {path}")
        mtu = g.get("path_mtu", setup_mtu)
        label = (f"{g['op']} {size_text(g['size'])} {g['config']}"
                 + ("" if mtu == DEFAULT_MTU else f" MTU {mtu}"))
        rows[label] = {"figure": g["mb_s"], "unit": "MB/s",
                       "ratio": g["mb_s"] if ratio == FIGURE else g["ratio"][ratio],
                       "better": "higher"}
    return rows


def _latency_rows(doc: dict, path: str, ratio: str = "tcp_stream") -> dict[str, dict]:
    lat = doc.get("latency")
    if lat is None:
        return {}
    ratios = lat.get("ratio") if isinstance(lat, dict) else None
    rows = {}
    for p in ("p50", "p99"):
        r = ratios.get(f"{p}_to_tcp_round_trip") if isinstance(ratios, dict) else None
        if not (_number(lat.get(f"{p}_us") if isinstance(lat, dict) else None)
                and _positive(r)):
            raise CompareError(f"latency lacks a numeric {p}_us or a positive "
                               f"ratio.{p}_to_tcp_round_trip: {path}")
        label = f"latency {lat.get('size', LATENCY_BYTES)} B {p}"
        us = lat[f"{p}_us"]
        if ratio == FIGURE and not _positive(us):
            raise CompareError(f"latency {p}_us is not positive: {path}")
        rows[label] = {"figure": us, "unit": "us", "ratio": us if ratio == FIGURE else r,
                       "better": "lower"}
        # The same figure over the chain of the same hops, in runs that measured it (by
        # the figures themselves it would be the row above again).
        rc = ratios.get(f"{p}_to_tcp_chain")
        if ratio != FIGURE and _positive(rc):
            rows[f"{label} / chain"] = {"figure": lat[f"{p}_us"], "unit": "us", "ratio": rc,
                                        "better": "lower"}
    return rows


def _c_rows(doc: dict, path: str, ratio: str) -> dict[str, dict]:
    """``--c``'s rows: each C program's figure and its ratio to the kernel TCP ceiling of
    the same run (none in a run without the section, or where it was skipped)."""
    c = doc.get("c_programs")
    if not isinstance(c, dict) or "skipped" in c:
        return {}
    rows = {}
    for name, (program, test, key), _ in C_RATIOS:
        if program == "iser" and "write" not in (c.get("iser") or {}):
            continue        # no iSER rows in the run: skipped, or saved before them
        try:
            figure, r = c[program][test][key], c["ratios"][name]
        except (KeyError, TypeError):
            figure = r = None
        if not (_positive(figure) and _positive(r)):
            raise CompareError(f"c_programs lacks a positive {program}.{test}.{key} or "
                               f"ratios.{name}: {path}")
        lat = key.endswith("_us")
        rows[f"C {C_ROW_TEXT[name]}"] = {"figure": figure, "unit": "us" if lat else "MB/s",
                                         "ratio": figure if ratio == FIGURE else r,
                                         "better": "lower" if lat else "higher"}
    return rows


def compare(saved: dict, new: dict | list[dict], ratio: str = "tcp_stream",
            saved_path: str = "saved", new_path: str | list[str] = "this run") -> dict:
    """Each row of either side: its figure and ratio in both, and new ratio / saved ratio.
    ``new`` may be several runs (with as many paths): each row's new figure and ratio
    are then the median of the runs that have it, its "runs" their ratios, run by run,
    so that one run's noise is not read as a change."""
    news = new if isinstance(new, list) else [new]
    paths = new_path if isinstance(new_path, list) else [new_path]
    kind = _one_kind(saved, saved_path, news, paths)
    a = compare_rows(saved, ratio, saved_path)
    runs = [compare_rows(d, ratio, p) for d, p in zip(news, paths, strict=True)]
    labels = [*a]
    for b in runs:
        labels += [k for k in b if k not in labels]
    sides = [(label, a.get(label), _median_row([b[label] for b in runs if label in b]))
             for label in labels]
    rows = [_compared_row(*side) for side in sides]
    return {"benchmark": kind, "ratio": "engine/primitive" if kind == ENGINE_KIND
            else ratio, "saved": saved_path, "new": new_path,
            "load_average": {"saved": _load(saved), "new": _load(news[0]) if len(news) == 1
                             else [_load(d) for d in news]}, "rows": rows,
            "higher_is_better_summary": _higher_summary(sides)}


def _one_kind(saved: dict, saved_path: str, news: list[dict], paths: list[str]) -> str:
    """The bench every document is a run of; CompareError when they are not one."""
    kinds = {doc_kind(saved, saved_path)} | {doc_kind(d, p)
                                              for d, p in zip(news, paths, strict=True)}
    if len(kinds) != 1:
        raise CompareError("the runs are different benches (" + " and ".join(
            repr(k) for k in sorted(kinds)) + "): " + " and ".join([saved_path, *paths]))
    return next(iter(kinds))


def _compared_row(label: str, old: dict | None, cur: dict | None) -> dict:
    """One row of the comparison: the saved side ``old``, the new side ``cur`` (either
    may be missing) and the new ratio over the saved one where both are there."""
    either = old or cur
    return {"row": label, "better": either["better"], "unit": either["unit"],
            "saved": None if old is None else {"figure": old["figure"],
                                               "ratio": old["ratio"]},
            "new": cur and {k: v for k, v in cur.items() if k in ("figure", "ratio", "runs")},
            "ratio_of_ratios": None if old is None or cur is None
            else sig4(cur["ratio"] / old["ratio"])}


def _higher_summary(sides: list[tuple[str, dict | None, dict | None]]) -> dict | None:
    """The new/saved ratios of the rows in both runs where higher is better: how many,
    their geometric mean, min and max; None when there is none."""
    higher = [cur["ratio"] / old["ratio"] for _, old, cur in sides
              if old is not None and cur is not None and old["better"] == "higher"]
    if not higher:
        return None
    return {"rows": len(higher), "geometric_mean": sig4(math.exp(statistics.fmean(
        math.log(x) for x in higher))), "min": sig4(min(higher)), "max": sig4(max(higher))}


def _median_row(found: list[dict]) -> dict | None:
    """One row over the runs that have it: as it is for one run; for several, the median
    figure and ratio (each its own median: the runs need not agree on which is middle)
    and the ratios run by run."""
    if len(found) <= 1:
        return found[0] if found else None
    return {**found[0], "figure": statistics.median(r["figure"] for r in found),
            "ratio": statistics.median(r["ratio"] for r in found),
            "runs": [r["ratio"] for r in found]}


def _load(doc: dict):
    m = doc.get("machine")
    return m.get("load_average_at_start") if isinstance(m, dict) else None


RATIO_TEXT = {FIGURE: "the figure itself (MB/s, us; runs of one machine only)",
              "tcp_stream": "goodput / TCP stream ceiling", "engine":
              "goodput / engine ceiling", "min": "goodput / the lower ceiling",
              "engine/primitive": "engine / one call of the primitive"}


def _load_text(load) -> str:
    if not load:
        return "unknown"
    if isinstance(load[0], list) or load[0] is None:     # several runs: one each
        return "; ".join(_load_text(x) for x in load)
    return " ".join(str(x) for x in load)


def compare_to_table(c: dict) -> str:
    def fig(side: dict | None, unit: str) -> str:
        return "-" if side is None else f"{side['figure']:.1f} {unit}"

    def rat(side: dict | None) -> str:
        return "-" if side is None else f"{side['ratio']:.4g}"

    several = isinstance(c["new"], list)
    rows = [[r["row"], fig(r["saved"], r["unit"]), fig(r["new"], r["unit"]), rat(r["saved"]),
             rat(r["new"]), *([" ".join(f"{x:.4g}" for x in (r["new"] or {}).get("runs", []))
                              or "-"] if several else []),
             "-" if r["ratio_of_ratios"] is None else f"{r['ratio_of_ratios']:.4g}",
             r["better"]]
            for r in c["rows"]]
    load = c["load_average"]
    news = (f"the median of {len(c['new'])} runs ({', '.join(c['new'])})" if several
            else c["new"])
    out = [f"compare: saved {c['saved']} beside {news}; ratio = {RATIO_TEXT[c['ratio']]} "
           "of the same run; new/saved = new ratio / saved ratio (the change, each run's "
           "machine speed divided out)"]
    if load["saved"] or load["new"]:
        out.append(f"load average at start: saved {_load_text(load['saved'])}, new "
                   f"{_load_text(load['new'])}")
    out += ["", *table_lines(["row", "saved", "new", "saved ratio", "new ratio",
                              *(["new ratio by run"] if several else []), "new/saved",
                              "better"], rows)]
    s = c["higher_is_better_summary"]
    if s:
        out += ["", f"{s['rows']} rows in both runs where higher is better: new/saved "
                f"geometric mean {s['geometric_mean']:.4g}, min {s['min']:.4g}, max "
                f"{s['max']:.4g}"]
    only = [r["row"] for r in c["rows"] if r["ratio_of_ratios"] is None]
    if only:
        out.append("in one run only: " + ", ".join(only))
    return "\n".join(out)
