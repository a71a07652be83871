"""``softhca bench [engine]``: its options and output; the bench itself is tools/bench/,
loaded only when the subcommand runs."""

from __future__ import annotations

import argparse
import json
import sys

from ..cliargs import positive_float, positive_int
from . import EXIT_FAIL, EXIT_OK, EXIT_USAGE

# Saved runs --compare reads as the new side at most: enough for a median over repeated
# runs, and a bound on what one command line makes it read.
MAX_COMPARE_RUNS = 16


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="measure speeds (no pass/fail: numbers only)",
        description="Without 'engine': the end-to-end bench. Two `softhca serve` processes on "
        "loopback; goodput of RDMA_WRITE, RDMA_READ and SEND at 4 KiB, 64 KiB and 1 MiB with "
        "plain MRs, a T10-DIF wire domain and crypto table row C, and of plain 1 MiB "
        "RDMA_WRITE at path MTU 1024, each beside its ceilings "
        "measured in the same run (an asyncio TCP stream between two processes, the engine's "
        "transform alone); 64-byte latency p50/p99; many QPs over many control sessions. "
        "With ucx_perftest installed (Debian's ucx-utils), UCX's put over TCP on loopback "
        "in the same run, the plain rows beside it as ratios.")
    # The defaults are bench.E2EOptions' (tests/tools/test_bench.py holds them equal); written
    # out here so that building the parser never imports the bench.
    p.add_argument("--json", action="store_true", help="print a JSON document instead of a table")
    p.add_argument("--json-out", metavar="FILE",
                   help="also write the JSON document to FILE (the table still prints)")
    p.add_argument("--quick", action="store_true",
                   help="a few seconds in all, for tests: tiny runs, fewer QPs and samples "
                   "(options given explicitly still apply)")
    p.add_argument("--seconds", type=positive_float, metavar="S",
                   help="time per goodput measurement, at most (default 1)")
    p.add_argument("--mib", type=positive_float, metavar="N",
                   help="MiB per goodput measurement, at most (default 256)")
    p.add_argument("--depth", type=positive_int, metavar="N",
                   help="WRs in flight per QP (default 64; at most 4 MiB in flight, so "
                   "fewer of 1 MiB)")
    p.add_argument("--latency-samples", type=positive_int, metavar="N",
                   help="64-byte RDMA_WRITEs timed one by one (default 2000)")
    p.add_argument("--sessions", type=positive_int, metavar="N",
                   help="control sessions of the many-QPs run, half per daemon "
                   "(default 100)")
    p.add_argument("--qp-pairs", type=positive_int, metavar="N",
                   help="connected QP pairs of the many-QPs run (default 1000)")
    p.add_argument("--writes-per-qp", type=positive_int, metavar="N",
                   help="RDMA_WRITEs per QP of the many-QPs run (default 4)")
    p.add_argument("--progress", action="store_true", help="say what runs, on stderr")
    p.add_argument("--no-trains", action="store_true",
                   help="run the daemons with `softhca serve --no-trains` (every packet its "
                   "own frame), to compare with packet trains")
    p.add_argument("--provider", action="store_true",
                   help="also run perftest's ib_write_bw (1 MiB) and ib_send_lat (64 B) through "
                   "the libibverbs provider, each side under `softhca run`, beside the "
                   "client's rows (root, the built provider and perftest; skipped otherwise)")
    p.add_argument("--c", action="store_true", dest="c_programs",
                   help="also run C programs between two network namespaces joined by a veth "
                   "pair, each side under `softhca run` with its own daemon: qperf -cm1 "
                   "rc_lat, rc_bw and rc_rdma_write_bw, perftest ib_send_lat -s 64 and "
                   "ib_write_bw -s 1M, iSER 256 KiB writes and reads (tgtd, iscsicheck), "
                   "each beside kernel TCP between the same namespaces (qperf tcp_lat, "
                   "tcp_bw) as a ratio (root, the built provider, qperf and perftest; "
                   "skipped, saying why, otherwise; the iSER rows alone without tgt)")
    _add_compare(p, "softhca bench --json")
    p.add_argument("--compare-ratio", choices=("tcp_stream", "engine", "min", "figure"),
                   default="tcp_stream",
                   help="which ratio --compare divides: to the TCP stream (default: no "
                   "softhca change moves that ceiling), to the engine, to the lower, or "
                   "the figures themselves (MB/s and us; for runs of one machine, where "
                   "the ceiling's own noise is set aside)")
    p.set_defaults(func=run)
    # "engine" names what is measured, not a daemon (TARGET means a daemon's address in
    # every other command); "goals" measures nothing, it reads saved runs.
    what = p.add_subparsers(dest="what", metavar="[engine | goals]")
    e = what.add_parser("engine", help="the engine's transforms beside their C primitives",
                           description="MB/s of the engine's TX/RX pipeline for T10-DIF, CRC32C, "
                           "CRC64_XP10, AES-XTS and crypto table row C, each beside one call of "
                           "the primitive it uses over the same bytes.")
    e.add_argument("--json", action="store_true", help="print a JSON document instead of a table")
    e.add_argument("--json-out", metavar="FILE",
                   help="also write the JSON document to FILE (the table still prints)")
    e.add_argument("--mib", type=positive_float, default=4.0, metavar="N",
                   help="MiB of data per measurement (default 4)")
    e.add_argument("--repeat", type=positive_int, default=5, metavar="R",
                   help="timed runs per measurement, the best is kept (default 5)")
    _add_compare(e, "softhca bench engine --json")
    e.set_defaults(func=run_engine)
    g = what.add_parser("goals",
                        help="saved runs of both benches against softhca's performance goals",
                        description="Reads saved `softhca bench --json` and `softhca bench "
                        "engine --json` documents (the --json-out files), each file's bench "
                        "told by its own \"benchmark\" member, and prints one row per "
                        "performance goal (docs/performance.md): the goal, each run's value, "
                        "min, median, and \"met\" "
                        "or \"missed by F\" (F = goal / median for a >= goal, median / goal "
                        "for a <= one); runs on different engines (SOFTHCA_ENGINE) are judged "
                        "apart. Nothing runs. A run without a goal's field (saved before the "
                        "bench measured it) says so in its cell. A missing or malformed file "
                        "is refused (exit 2).")
    g.add_argument("runs", nargs="+", metavar="RUN.json",
                   help="saved runs of either bench, in any order")
    g.add_argument("--json", action="store_true", help="print a JSON document instead of a table")
    g.set_defaults(func=run_goals)


def _add_compare(p: argparse.ArgumentParser, saved_by: str) -> None:
    p.add_argument("--compare", nargs="+", metavar=("SAVED", "NEW"),
                   help=f"beside the output of `{saved_by}` saved in SAVED, "
                   "print per row the saved ratio, the new ratio and new/saved (the ratio of "
                   "ratios). With NEW (other saved outputs, up to "
                   f"{MAX_COMPARE_RUNS}) nothing runs, and with several the new ratio is "
                   "each row's median over them; without NEW, this run is the new one. A "
                   "missing or malformed file is refused before anything runs (exit 2)")


def _load_compare(args: argparse.Namespace, bench, kind: str) -> list[dict] | None:
    """The --compare documents, checked before anything runs: [] without --compare, None
    (after saying why on stderr) when a file is missing, malformed or of the other bench."""
    if not args.compare:
        return []
    name = "softhca bench" + (" engine" if kind == bench.ENGINE_KIND else "")
    if len(args.compare) > 1 + MAX_COMPARE_RUNS:
        print(f"{name} --compare: SAVED and at most {MAX_COMPARE_RUNS} NEW files, not "
              f"{len(args.compare) - 1}", file=sys.stderr)
        return None
    try:
        docs = []
        for path in args.compare:
            doc = bench.load_saved(path)
            if bench.doc_kind(doc, path) != kind:
                other = "softhca bench" + (" engine" if kind == bench.E2E_KIND else "")
                raise bench.CompareError(f"saved by `{other} --json`, not by `{name} "
                                         f"--json`: {path}")
            if kind == bench.E2E_KIND:
                bench.compare_rows(doc, args.compare_ratio, path)
            docs.append(doc)
    except bench.CompareError as e:
        print(f"{name} --compare: {e}", file=sys.stderr)
        return None
    return docs


def _show_compare(args: argparse.Namespace, bench, saved: dict, new: dict | list[dict],
                  new_path: str | list[str]) -> dict:
    """The comparison; its table printed (after a blank line when the run's table came
    first) unless --json, when the caller prints it as JSON."""
    ratio = getattr(args, "compare_ratio", "tcp_stream")
    c = bench.compare(saved, new, ratio, args.compare[0], new_path)
    if not args.json:
        print(("\n" if new_path == "this run" else "") + bench.compare_to_table(c))
    return c


def _compare_saved(args: argparse.Namespace, bench, docs: list[dict]) -> int:
    """--compare SAVED NEW [NEW ...]: saved runs side by side, nothing run; several NEW
    are read as the median of each row."""
    news, paths = docs[1:], args.compare[1:]
    c = _show_compare(args, bench, docs[0], news if len(news) > 1 else news[0],
                      paths if len(paths) > 1 else paths[0])
    if args.json:
        print(json.dumps(c, indent=2))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from .. import bench

    docs = _load_compare(args, bench, bench.E2E_KIND)
    if docs is None:
        return EXIT_USAGE
    if len(docs) >= 2:
        return _compare_saved(args, bench, docs)
    base = bench.QUICK if args.quick else bench.E2EOptions()
    given = {name: getattr(args, name) for name in ("seconds", "mib", "depth",
                                                    "latency_samples", "sessions", "qp_pairs",
                                                    "writes_per_qp")
             if getattr(args, name) is not None}
    if given.get("sessions", 2) < 2:
        print("softhca bench: --sessions needs at least 2 (one per daemon)", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "no_trains", False):
        given["trains"] = False
    if getattr(args, "provider", False):
        given["provider"] = True
    if getattr(args, "c_programs", False):
        given["c_programs"] = True
    opts = dataclasses.replace(base, **given)

    def progress(what: str) -> None:
        if args.progress:
            print(f"softhca bench: {what}", file=sys.stderr, flush=True)

    try:
        doc = bench.run_e2e(opts, progress)
    except (bench.BenchError, bench.ProcessError) as e:
        print(f"softhca bench: {e}", file=sys.stderr)
        return EXIT_FAIL
    return _emit_run(args, bench, doc, bench.e2e_to_json(doc), bench.e2e_to_table(doc), docs)


def run_engine(args: argparse.Namespace) -> int:
    from .. import bench

    docs = _load_compare(args, bench, bench.ENGINE_KIND)
    if docs is None:
        return EXIT_USAGE
    if len(docs) >= 2:
        return _compare_saved(args, bench, docs)
    report = bench.run_engine(mib=args.mib, repeat=args.repeat)
    text = bench.to_json(report)
    return _emit_run(args, bench, json.loads(text), text, bench.to_table(report), docs)


def run_goals(args: argparse.Namespace) -> int:
    from ..bench import goals

    try:
        rep = goals.report(args.runs)
    except goals.GoalsError as e:
        print(f"softhca bench goals: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(rep, indent=2) if args.json else goals.to_table(rep))
    return EXIT_OK


def _emit_run(args: argparse.Namespace, bench, doc: dict, text: str, table: str,
              docs: list[dict]) -> int:
    """A bench run out: to --json-out FILE (the run alone, so the file can be a later
    run's SAVED), the table unless --json, then the comparison with SAVED if asked, and
    the JSON document (with its ``compare`` member) with --json."""
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    if not args.json:
        print(table)
    if docs:
        text = json.dumps({**doc, "compare": _show_compare(args, bench, docs[0], doc,
                                                           "this run")}, indent=2)
    if args.json:
        print(text)
    return EXIT_OK

