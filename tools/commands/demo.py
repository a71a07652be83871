"""``softhca demo [faults]``: the man pages' examples (tools/demo.py), or the fault
injection walk-through (tools/demo_faults.py), each ending in PASS or FAIL."""

from __future__ import annotations

import argparse
import sys

from . import EXIT_FAIL, EXIT_OK, EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the man pages' examples, each ending in PASS or FAIL",
                       description="Run the examples of mlx5dv_wr_set_mkey_sig_block(3), "
                       "mlx5dv_wr_set_mkey_crypto(3) and mlx5dv_wr_mkey_configure(3) end to "
                       "end between two embedded daemons (a target and an initiator) over TCP, "
                       "and judge each against what the page states.")
    p.add_argument("what", nargs="?", choices=["faults"],
                   help="'faults': the fault injection walk-through instead (corrupted wire "
                   "blocks caught by mkey_check, a misbehaving link recovered by RC)")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="run only this example (e.g. 'sig_block 2.1', 'crypto row C'; with "
                   "faults: 'guard', 'lossy link'); a prefix such as 'crypto row' selects "
                   "several; may be repeated")
    p.add_argument("--list", action="store_true", help="list the example names and exit")
    p.add_argument("--html", metavar="FILE",
                   help="also write a self-contained HTML report to FILE: every example's "
                   "configuration, pipeline stages, memory and wire images as block diagrams "
                   "and mkey_check results (the printed text is unchanged)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import demo
    from ..harness import UnknownExample

    faults = getattr(args, "what", None) == "faults"
    if faults:
        from .. import demo_faults
    if args.list:
        for entry in demo_faults.CASES if faults else demo.EXAMPLES:
            print(f"{entry.name:<28} " + (entry.title if faults else
                                          f"{entry.page}, {entry.where}"))
        return EXIT_OK
    html = getattr(args, "html", None)
    try:
        if html:
            from .. import report

            outcomes = report.run(args.only, html, faults=faults)
        else:
            outcomes = (demo_faults if faults else demo).run(args.only)
    except (UnknownExample, OSError) as e:
        # OSError: the report's file cannot be written (tried before anything runs).
        print(f"softhca demo: {e}", file=sys.stderr)
        return EXIT_USAGE
    if html:
        report.main_note(html)
    return EXIT_OK if all(o.passed for o in outcomes) else EXIT_FAIL

