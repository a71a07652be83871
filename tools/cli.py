"""The ``softhca`` command line.

Every subcommand is a module exporting ``add_parser(subparsers)``, which registers it
with ``func=run``, and ``run(args) -> int``; `SUBCOMMANDS` lists them, in the order
``softhca --help`` shows them, so a new subcommand is one module and one entry there.
A module whose work is heavy to load (the daemon, the demo, the bench) is a thin one in
tools/commands/ that imports the work when it runs, so ``softhca --help`` stays fast and
a daemon never loads the bench. A command line naming its subcommand loads that
subcommand's module alone (``softhca run`` starts every verbs program of tests/native,
and loading the other ten cost each start a tenth of its imports); ``softhca --help``
and a mistyped subcommand load them all, for the list.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from types import ModuleType

from .commands import EXIT_FAIL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_FAIL", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "SUBCOMMANDS",
           "build_parser", "main"]

# Each subcommand's name and its module (relative to this package), in --help's order.
SUBCOMMANDS = {
    "serve": ".commands.serve", "run": ".commands.run", "faults": ".commands.faults",
    "demo": ".commands.demo", "bench": ".commands.bench", "soak": ".soak",
    "trace": ".trace", "explain": ".explain", "capture": ".capture",
    "crypto-test-info": ".crypto_test_info", "pyverbs": ".pyverbs",
}


def command_module(name: str) -> ModuleType:
    """The module of subcommand ``name`` (a key of SUBCOMMANDS), loaded now."""
    return import_module(SUBCOMMANDS[name], __package__)


# -- the parser and main -------------------------------------------------------------

def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of ``only`` (a subcommand's name) alone."""
    parser = argparse.ArgumentParser(
        prog="softhca", description="softhca: a software mlx5-class RDMA HCA simulator")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in [only] if only in SUBCOMMANDS else SUBCOMMANDS:
        command_module(name).add_parser(sub)
    _remember_parsers(sub)
    return parser


class _VersionAction(argparse._VersionAction):
    """``--version``: argparse's, the version looked up only when asked for (the
    package metadata is some milliseconds of every start otherwise)."""

    def __call__(self, parser, namespace, values, option_string=None):
        self.version = f"softhca {installed_version()}"
        super().__call__(parser, namespace, values, option_string)


def _remember_parsers(sub: argparse._SubParsersAction) -> None:
    """Give each subcommand's namespace its own parser (``usage_parser``), nested ones
    (``bench engine``) included, so that a mistyped option of a subcommand is answered
    with that subcommand's usage, not the top level's."""
    for subparser in sub.choices.values():
        subparser.set_defaults(usage_parser=subparser)
        for action in subparser._actions:
            if isinstance(action, argparse._SubParsersAction):
                _remember_parsers(action)


def installed_version() -> str:
    """The version pip installed (pyproject.toml's), from the package's metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("softhca")
    except PackageNotFoundError:    # run from a source tree that was never installed
        return "(not installed)"


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names first, before any option (None: none, or an option
    such as --help or --version comes first, which the whole parser answers)."""
    first = next(iter(argv), None)
    return first if first in SUBCOMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_named_command(argv))
    try:
        args, extra = parser.parse_known_args(argv)
        # `softhca faults add --target H:P key=value ...`: argparse ends a positional
        # list at the first option, so the rule's fields after it come back as extras.
        if extra and args.command == "faults" \
                and all("=" in x and not x.startswith("-") for x in extra):
            args.fields = list(args.fields) + extra
        elif extra:
            # The usage of the subcommand whose option was mistyped (`serve --lisen`).
            getattr(args, "usage_parser", parser).error(
                "unrecognized arguments: " + " ".join(extra))
    except SystemExit as e:
        # argparse exits on --help and on usage errors; main returns the status instead,
        # so that callers (tests, other entry points) get an int either way.
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    import signal

    previous = None
    if args.command not in CTRL_C_HANDLED and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous = signal.signal(signal.SIGINT, _Interrupted(args.command))
    try:
        return args.func(args)
    except KeyboardInterrupt:
        # Ctrl-C: the line is printed; the shell's status for a command ended by SIGINT
        # (128 + 2).
        return EXIT_INTERRUPTED
    except ValueError as e:
        # Every client command's --token-file (faults, trace, capture), read before it
        # connects: a usage error, printed once here. (TokenFileError, looked up only
        # when a ValueError comes: a command that reads no token file never loads it.)
        if not _is_token_file_error(e):
            raise
        print(f"softhca {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `softhca demo | head`: the reader left; do not print a traceback at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAIL
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _is_token_file_error(e: BaseException) -> bool:
    token_file = sys.modules.get(__package__.rpartition(".")[0] + ".client.token_file")
    return token_file is not None and isinstance(e, token_file.TokenFileError)


class _Interrupted:
    """The SIGINT handler of a command run to its end (demo, bench, soak, explain, ...):
    the first Ctrl-C prints one line, sends what the interpreter would still write on
    stderr (asyncio's notes about the tasks it cancels, a child's last words) to
    /dev/null, and raises KeyboardInterrupt where the command is, so that its ``with``
    blocks still stop the daemons and processes it started; a second one exits at once.

    Installed instead of Python's default handler, it also keeps asyncio.run from
    turning Ctrl-C into a cancellation that a command's own error handling could take
    for a failure (asyncio.run only does that when the handler is the default one)."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.seen = False

    def __call__(self, signum, frame) -> None:
        if self.seen:
            os._exit(EXIT_INTERRUPTED)
        self.seen = True
        print(f"softhca {self.command}: interrupted", file=sys.stderr, flush=True)
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
        except (OSError, ValueError):   # stderr is no file descriptor (a test's capture)
            pass
        raise KeyboardInterrupt


# Commands for which Ctrl-C is the ordinary way to end them, each handling it itself:
# serve stops gracefully (server/serve.py), trace and capture end their stream and say
# what they saw (as tcpdump does, status 0), run passes it to the program it runs.
CTRL_C_HANDLED = frozenset({"serve", "trace", "capture", "run"})


if __name__ == "__main__":
    sys.exit(main())
