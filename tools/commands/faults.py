"""``softhca faults add|list|clear``: fault rules on a running daemon's wire path."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ...client.token_file import read_token
from ..cliargs import daemon_address
from . import EXIT_FAIL, EXIT_OK, EXIT_USAGE

FAULTS_EPILOG = """\
rule fields (key=value; numbers may be 0x...):
  action      corrupt | drop | duplicate | delay | reorder | rnr   (required)
  direction   out (default: packets this daemon sends) | in (packets it accepts)
  qp          this daemon's QP number          opcode   e.g. RDMA_WRITE, SEND, RDMA_READ_RESPONSE
  message     the n-th message (from 1) of the QP in that direction, counted in one of
              two streams: its requests (SEND, RDMA_WRITE, RDMA_READ request, atomic:
              sent as requester with out, taken as responder with in) or, apart, its
              READ responses (one message per READ: sent as responder with out, taken
              as requester with in); a retransmitted message is not a new one
  packet      the n-th packet of the message (from 1)
  block       wire block k (from 0), with block_size: wire bytes per block, PI included
              (520 for T10-DIF on 512-byte blocks)
  probability 0..1, with seed                  count    fire at most this many times
  corrupt:    field=data (the default) with offset: a data byte, counted from the
                message's first byte, or with block and block_size from the block's
              field=guard|app_tag|ref_tag: needs block and block_size
              xor=MASK (default 0x1) | set=VALUE
              icrc=recompute (default: a corruption before the link, which only a
                signature check notices) | stale (a link error: dropped, retransmitted)
  delay:      seconds      reorder: window (packets)      rnr: direction=in
  cm=req|rep|rej|rtu|dreq|drep|mra with action=drop: drops CM messages of that kind
A rule installed by a session belongs to it and goes when it closes; this command's
session closes at once, so 'add' needs --daemon-wide: a rule on every session's QPs
that stays until 'clear' removes it.
examples:
  softhca faults add --daemon-wide --target 10.200.0.1:4791 action=corrupt \\
      opcode=RDMA_WRITE block=3 block_size=520 field=guard xor=0x1
  softhca faults add --daemon-wide --target 10.200.0.1:4791 action=corrupt \\
      opcode=SEND message=2 offset=100 xor=0xff
  softhca faults add --daemon-wide --target 10.200.0.1:4791 action=drop \\
      opcode=RDMA_READ_RESPONSE message=1 packet=2
  softhca faults add --daemon-wide --target 10.200.0.1:4791 action=drop cm=req count=1
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("faults", help="install, list or clear fault rules on a running daemon",
                       description="Fault injection on a running daemon's wire path.",
                       epilog=FAULTS_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", choices=["add", "list", "clear"])
    p.add_argument("fields", nargs="*", metavar="KEY=VALUE",
                   help="the rule (add) or id=N (clear one rule)")
    p.add_argument("--target", required=True, type=daemon_address, metavar="HOST:PORT",
                   help="the daemon")
    p.add_argument("--token-file", metavar="FILE", help="the daemon's token")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--daemon-wide", action="store_true",
                   help="add: a rule on every session's QPs, kept until cleared (required: "
                   "this command's own session ends at once)")
    p.set_defaults(func=run)


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


def run(args: argparse.Namespace) -> int:
    import asyncio
    import json

    from ... import client as sh

    try:
        fields = parse_rule_fields(args.fields)
    except ValueError as e:
        print(f"softhca faults: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.op == "add":
        # The rule is checked here first, as the daemon will check it (server/faults.py),
        # so that a typo is named, with the valid values, before anything else.
        from ...protocol.errors import RDMAError
        from ...server.faults import validate_rule
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

