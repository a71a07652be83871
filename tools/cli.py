"""The ``softhca`` command line.

Every subcommand is a module exporting ``add_parser(subparsers)``, which registers it
with ``func=run``, and ``run(args) -> int``; `SUBCOMMANDS` lists them, in the order
``softhca --help`` shows them, so a new subcommand is one module and one entry there.
A module whose work is heavy to load (the daemon, the demo, the bench) is a thin one in
tools/commands/ that imports the work when it runs, so ``softhca --help`` stays fast and
a daemon never loads the bench.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..server.cliargs import TokenFileError
from . import capture, crypto_test_info, explain, pyverbs, soak, trace
from .commands import EXIT_FAIL, EXIT_OK, EXIT_USAGE, bench, demo, faults, run, serve

__all__ = ["EXIT_FAIL", "EXIT_OK", "EXIT_USAGE", "SUBCOMMANDS", "build_parser", "main"]

SUBCOMMANDS = (serve, run, faults, demo, bench, soak, trace, explain, capture,
               crypto_test_info, pyverbs)


# -- the parser and main -------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="softhca", description="softhca: a software mlx5-class RDMA HCA simulator")
    parser.add_argument("--version", action="version", version=f"softhca {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in SUBCOMMANDS:
        command.add_parser(sub)
    return parser


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
        if extra and getattr(args, "func", None) is faults.run \
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
