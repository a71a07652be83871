"""The ``softhca`` command line.

One function per subcommand (``cmd_*``), each registered by an ``add_*`` function
on the top-level subparsers, so a new subcommand (serve, faults, trace, ...) is
one more pair and a line in `build_parser`. Subcommands import their module
when they run, so ``softhca --help`` stays fast and a daemon never loads the bench.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence

from ..server.cliargs import (
    TokenFileError,
    positive_float,
    positive_int,
    read_token,
)

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


# -- softhca demo ----------------------------------------------------------------------

def add_demo(sub: argparse._SubParsersAction) -> None:
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
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from . import demo
    from .harness import UnknownExample

    faults = getattr(args, "what", None) == "faults"
    if faults:
        from . import demo_faults
    if args.list:
        for entry in demo_faults.CASES if faults else demo.EXAMPLES:
            print(f"{entry.name:<28} " + (entry.title if faults else
                                          f"{entry.page}, {entry.where}"))
        return EXIT_OK
    html = getattr(args, "html", None)
    try:
        if html:
            from . import report

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


# -- softhca bench ...  ----------------------------------------------------------------

def add_bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help="measure speeds (no pass/fail: numbers only)",
        description="Without TARGET: the end-to-end bench. Two `softhca serve` processes on "
        "loopback; goodput of RDMA_WRITE, RDMA_READ and SEND at 4 KiB, 64 KiB and 1 MiB with "
        "plain MRs, a T10-DIF wire domain and crypto table row C, and of plain 1 MiB "
        "RDMA_WRITE at path MTU 1024, each beside its ceilings "
        "measured in the same run (an asyncio TCP stream between two processes, the engine's "
        "transform alone); 64-byte latency p50/p99; many QPs over many control sessions.")
    # The defaults are bench.E2EOptions' (tests/test_bench.py holds them equal); written
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
    _add_compare(p, "softhca bench --json")
    p.add_argument("--compare-ratio", choices=("tcp_stream", "engine", "min"),
                   default="tcp_stream",
                   help="which ratio --compare divides: to the TCP stream (default: no "
                   "softhca change moves that ceiling), to the engine, or to the lower")
    p.set_defaults(func=cmd_bench)
    targets = p.add_subparsers(dest="target", metavar="[TARGET]")
    e = targets.add_parser("engine", help="the engine's transforms beside their C primitives",
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
    e.set_defaults(func=cmd_bench_engine)


def _add_compare(p: argparse.ArgumentParser, saved_by: str) -> None:
    p.add_argument("--compare", nargs="+", metavar=("SAVED", "NEW"),
                   help=f"beside the output of `{saved_by}` saved in SAVED, "
                   "print per row the saved ratio, the new ratio and new/saved (the ratio of "
                   "ratios). With NEW (another saved output) nothing runs; without it, this "
                   "run is the new one. A missing or malformed file is refused before "
                   "anything runs (exit 2)")


def _load_compare(args: argparse.Namespace, bench, kind: str) -> list[dict] | None:
    """The --compare documents, checked before anything runs: [] without --compare, None
    (after saying why on stderr) when a file is missing, malformed or of the other bench."""
    if not args.compare:
        return []
    name = "softhca bench" + (" engine" if kind == bench.ENGINE_KIND else "")
    if len(args.compare) > 2:
        print(f"{name} --compare: SAVED and at most one NEW file, not {len(args.compare)}",
              file=sys.stderr)
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


def _show_compare(args: argparse.Namespace, bench, saved: dict, new: dict,
                  new_path: str) -> dict:
    """The comparison; its table printed (after a blank line when the run's table came
    first) unless --json, when the caller prints it as JSON."""
    ratio = getattr(args, "compare_ratio", "tcp_stream")
    c = bench.compare(saved, new, ratio, args.compare[0], new_path)
    if not args.json:
        print(("\n" if new_path == "this run" else "") + bench.compare_to_table(c))
    return c


def _compare_saved(args: argparse.Namespace, bench, docs: list[dict]) -> int:
    """--compare SAVED NEW: two saved runs side by side, nothing run."""
    c = _show_compare(args, bench, docs[0], docs[1], args.compare[1])
    if args.json:
        print(json.dumps(c, indent=2))
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    import dataclasses

    from . import bench

    docs = _load_compare(args, bench, bench.E2E_KIND)
    if docs is None:
        return EXIT_USAGE
    if len(docs) == 2:
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
    opts = dataclasses.replace(base, **given)

    def progress(what: str) -> None:
        if args.progress:
            print(f"softhca bench: {what}", file=sys.stderr, flush=True)

    try:
        doc = bench.run_e2e(opts, progress)
    except bench.BenchError as e:
        print(f"softhca bench: {e}", file=sys.stderr)
        return EXIT_FAIL
    return _emit_run(args, bench, doc, bench.e2e_to_json(doc), bench.e2e_to_table(doc), docs)


def cmd_bench_engine(args: argparse.Namespace) -> int:
    from . import bench

    docs = _load_compare(args, bench, bench.ENGINE_KIND)
    if docs is None:
        return EXIT_USAGE
    if len(docs) == 2:
        return _compare_saved(args, bench, docs)
    report = bench.run_engine(mib=args.mib, repeat=args.repeat)
    text = bench.to_json(report)
    return _emit_run(args, bench, json.loads(text), text, bench.to_table(report), docs)


def _emit_run(args: argparse.Namespace, bench, run: dict, text: str, table: str,
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
        text = json.dumps({**run, "compare": _show_compare(args, bench, docs[0], run,
                                                           "this run")}, indent=2)
    if args.json:
        print(text)
    return EXIT_OK


# -- softhca serve ----------------------------------------------------------------------

def add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a daemon hosting simulated HCAs",
                       description="Serve the control plane (verbs calls from applications) "
                       "and the wire plane (RC packets from other daemons) on one TCP port.")
    p.add_argument("--listen", default="127.0.0.1:4791", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:4791; port 0 picks one)")
    p.add_argument("--hca", action="append", metavar="NAME",
                   help="an HCA to host (default mlx5_0); may be repeated")
    p.add_argument("--token-file", metavar="FILE",
                   help="file holding the shared token that control sessions and peer "
                   "daemons must prove (HMAC over a nonce); trailing whitespace is ignored")
    p.add_argument("--peer-token-file", metavar="FILE",
                   help="file holding the token peer daemons' wire links must prove (default: "
                   "the --token-file); with its own, a client's token opens no wire link")
    p.add_argument("--allow-readable-token", action="store_true",
                   help="accept a token file that every user may read (refused otherwise, as "
                   "ssh refuses such a private key)")
    p.add_argument("--allow-no-auth", action="store_true",
                   help="listen on a non-loopback address without a token (anyone who can "
                   "reach the port can read and write the hosted memory)")
    p.add_argument("--max-frame", type=positive_int, default=16 << 20, metavar="BYTES",
                   help="largest frame accepted (default 16 MiB)")
    limits = p.add_argument_group("limits (each hit is a clear error; the daemon keeps serving)")
    limits.add_argument("--max-connections", type=positive_int, default=1024, metavar="N",
                        help="control sessions and wire links at once (default 1024)")
    limits.add_argument("--max-pre-hello", type=positive_int, default=64, metavar="N",
                        help="connections still in the HELLO, apart from those (default 64; "
                        "when full the oldest is closed for the newcomer)")
    limits.add_argument("--hello-timeout", type=positive_float, default=3.0, metavar="S",
                        help="seconds a connection has to complete the HELLO (default 3)")
    limits.add_argument("--max-objects", type=positive_int, default=1 << 16, metavar="N",
                        help="verbs objects per control session (default 65536)")
    limits.add_argument("--max-session-bytes", type=positive_int, default=4 << 30,
                        metavar="BYTES", help="registered MR bytes per session (default 4 GiB)")
    limits.add_argument("--max-daemon-bytes", type=positive_int, default=16 << 30,
                        metavar="BYTES", help="registered MR bytes in all (default 16 GiB)")
    limits.add_argument("--max-msg-size", type=positive_int, default=1 << 31, metavar="BYTES",
                        help="bytes in one message, the port's max_msg_sz (default 2 GiB)")
    limits.add_argument("--max-qp-wr", type=positive_int, default=1 << 14, metavar="N",
                        help="max_send_wr / max_recv_wr of a QP (default 16384)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="default info")
    p.add_argument("--ready-file", metavar="FILE",
                   help="write HOST:PORT here once listening (for scripts using port 0)")
    p.add_argument("--faults", metavar="FILE",
                   help="fault rules to install at start: a JSON list of rules (the fields of "
                   "'softhca faults add'), refused whole if any rule is malformed")
    p.add_argument("--strict-blocks", action="store_true",
                   help="refuse what is not whole protection blocks: a signature MKEY's "
                   "layout at configure (EINVAL), a transfer through it as a misaligned one "
                   "is (docs/blocks.md); without it a trailing partial block passes as plain "
                   "data and is counted (partial_block_* counters)")
    p.add_argument("--no-trains", action="store_true",
                   help="send every RC packet as its own frame, never a packet train "
                   "(a run of one message's packets in one frame, docs/protocol.md); "
                   "for comparison: the traffic is the same")
    p.add_argument("--capture", metavar="FILE",
                   help="write every packet this daemon sends and accepts to FILE, a pcap of "
                   "RoCEv2 frames that Wireshark and tshark decode (see 'softhca capture')")
    p.add_argument("--crypto-config", metavar="FILE",
                   help="the devices' crypto configuration, fixed for the daemon's life: a "
                   'JSON object {"mode": "plaintext" | "wrapped", "import_kek": hex, '
                   '"credential": hex, "import_kek_id": N, "credential_id": N}, every field '
                   "optional (default: plaintext DEK import; see docs/crypto-import.md)")
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ..server import serve

    try:
        options = serve.options_from_args(args)
    except ValueError as e:
        print(f"softhca serve: {e}", file=sys.stderr)
        return EXIT_USAGE
    return serve.run(options)


# -- softhca faults add|list|clear ------------------------------------------------------

FAULTS_EPILOG = """\
rule fields (key=value; numbers may be 0x...):
  action      corrupt | drop | duplicate | delay | reorder | rnr   (required)
  direction   out (default: packets this daemon sends) | in (packets it accepts)
  qp          this daemon's QP number          opcode   e.g. RDMA_WRITE, SEND, RDMA_READ_RESPONSE
  message     the n-th message (from 1)        packet   the n-th packet of the message (from 1)
  block       wire block k (from 0)            block_size  wire bytes per block (520 for T10-DIF/512)
  probability 0..1, with seed                  count    fire at most this many times
  corrupt:    field=data|guard|app_tag|ref_tag, offset (data byte), xor=MASK | set=VALUE,
              icrc=recompute (a corruption before the link) | stale (a link error: dropped)
  delay:      seconds      reorder: window (packets)      rnr: direction=in
A rule installed by a session belongs to it and goes when it closes; this command's
session closes at once, so 'add' needs --daemon-wide: a rule on every session's QPs
that stays until 'clear' removes it.
example:
  softhca faults add --daemon-wide --target 10.200.0.1:4791 action=corrupt \\
      opcode=RDMA_WRITE block=3 block_size=520 field=guard xor=0x1
"""


def add_faults(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("faults", help="install, list or clear fault rules on a running daemon",
                       description="Fault injection on a running daemon's wire path.",
                       epilog=FAULTS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", choices=["add", "list", "clear"])
    p.add_argument("fields", nargs="*", metavar="KEY=VALUE",
                   help="the rule (add) or id=N (clear one rule)")
    p.add_argument("--target", required=True, metavar="HOST:PORT", help="the daemon")
    p.add_argument("--token-file", metavar="FILE", help="the daemon's token")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--daemon-wide", action="store_true",
                   help="add: a rule on every session's QPs, kept until cleared (required: "
                   "this command's own session ends at once)")
    p.set_defaults(func=cmd_faults)


def parse_rule_fields(items: Sequence[str]) -> dict:
    rule: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{item!r} is not KEY=VALUE")
        value: object = text
        try:
            value = int(text, 0)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                pass
        rule[key] = value
    return rule


def cmd_faults(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from .. import client as sh

    try:
        fields = parse_rule_fields(args.fields)
    except ValueError as e:
        print(f"softhca faults: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.op == "add":
        # The rule is checked here first, as the daemon will check it (server/faults.py),
        # so that a typo is named, with the valid values, before anything else.
        from ..protocol.errors import RDMAError
        from ..server.faults import validate_rule
        try:
            validate_rule(fields)
        except RDMAError as e:
            print(f"softhca faults add: {e.errno_name}: {e.message}", file=sys.stderr)
            return EXIT_FAIL        # as when the daemon refuses it
    if args.op == "add" and not args.daemon_wide:
        print("softhca faults add: a rule belongs to the session that installs it and this "
              "command's session ends at once; give --daemon-wide for a rule on every "
              "session's QPs, kept until 'softhca faults clear'",
              file=sys.stderr)
        return EXIT_USAGE
    token = read_token(args.token_file)

    async def run() -> dict:
        async with await sh.connect(args.target, token=token) as node:
            if args.op == "add":
                return {"rule": await node.faults.add(fields, daemon_wide=True)}
            if args.op == "clear":
                # This command's session owns no rules: clearing means the daemon's.
                return {"cleared": await node.faults.clear(fields.get("id"), daemon_wide=True)}
            return {"rules": await node.faults.list(), "counters": await node.counters()}

    try:
        result = asyncio.run(run())
    except sh.RDMAError as e:
        print(f"softhca faults {args.op}: {e.errno_name}: {e.message}", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif "rule" in result:
        print(f"rule {result['rule']['id']} installed: " + _rule_text(result["rule"]))
    elif "cleared" in result:
        print(f"{result['cleared']} rule(s) cleared")
    else:
        for r in result["rules"]:
            print(f"rule {r['id']:<3} fired {r['fired']:<6} {_rule_text(r)}")
        if not result["rules"]:
            print("no fault rules")
        print("counters: " + ", ".join(f"{k} {v}" for k, v in sorted(result["counters"].items())))
    return EXIT_OK


def _rule_text(rule: dict) -> str:
    return " ".join(f"{k}={v:#x}" if k in ("xor", "set", "qp") else f"{k}={v}"
                    for k, v in rule.items() if k not in ("id", "fired", "daemon_wide"))


# -- softhca soak ---------------------------------------------------------------------

SOAK_ATTACKS = ("injection", "huge_layout", "poll_flood", "mr_read_flood", "idle_sockets",
                "rule_flood", "malformed")


def add_soak(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("soak", help="valid traffic beside rotating attacks on two daemons",
                       description="Start two 'softhca serve' processes, run verified RDMA "
                       "WRITEs between them beside a rotating set of attacks (issue 13) on "
                       "one, and report valid WRs, bytes verified, attacks refused, the "
                       "slowest answer to a second client and the daemons' peak RSS. Exit 0 "
                       "when every attack was refused and every byte verified.")
    p.add_argument("--seconds", type=positive_float, default=30.0, metavar="N",
                   help="how long to run (default 30)")
    p.add_argument("--attacks", metavar="A,B,...", default=",".join(SOAK_ATTACKS),
                   help=f"which attacks, in turn (default all: {','.join(SOAK_ATTACKS)})")
    p.add_argument("--seed", type=int, default=0, help="the valid traffic's bytes (default 0)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_soak)


def cmd_soak(args: argparse.Namespace) -> int:
    from . import soak

    return soak.cmd_soak(args)


# -- the parser and main -------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="softhca", description="softhca: a software mlx5-class RDMA HCA simulator")
    parser.add_argument("--version", action="version", version=f"softhca {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in (add_serve, add_faults, add_demo, add_bench, add_soak):
        add(sub)
    # Subcommands that live in their own module, each with add_parser(sub): the
    # observation tools of issue 7. Their module is imported only to build the parser.
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f".{name}", __package__).add_parser(sub)
    return parser


SUBCOMMAND_MODULES = ("trace", "explain", "capture", "crypto_test_info", "pyverbs")


def installed_version() -> str:
    """The version pip installed (pyproject.toml's), from the package's metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("softhca")
    except PackageNotFoundError:    # run from a source tree that was never installed
        return "(not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # `softhca faults add --target H:P key=value ...`: argparse ends a positional
        # list at the first option, so the rule's fields after it come back as extras.
        if extra and getattr(args, "func", None) is cmd_faults \
                and all("=" in x and not x.startswith("-") for x in extra):
            args.fields = list(args.fields) + extra
        elif extra:
            parser.parse_args(argv)     # reports the unrecognized arguments and exits
    except SystemExit as e:
        # argparse exits on --help and on usage errors; main returns the status instead,
        # so that callers (tests, other entry points) get an int either way.
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    try:
        return args.func(args)
    except TokenFileError as e:
        # Every client command's --token-file (faults, trace, capture), read before it
        # connects: a usage error, printed once here.
        print(f"softhca {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `softhca demo | head`: the reader left; do not print a traceback at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
