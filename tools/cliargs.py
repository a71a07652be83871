"""What every ``softhca`` subcommand parses the same way: counts, durations, addresses.

The token file a client command names is read by ``client.token_file.read_token``, which
softhca's pyverbs reads ``SOFTHCA_TOKEN_FILE`` with too.

Standard library only, so that building the parser (``softhca --help``) stays fast.
"""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """A count: decimal or 0x..., above zero."""
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def nonneg_int(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def positive_float(text: str) -> float:
    """A duration or a size: finite, above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def daemon_address(text: str) -> str:
    """A daemon's ``HOST:PORT`` (--target), checked as the client will read it, so that
    a port out of range is a usage error before anything connects."""
    from ..protocol.address import split_address

    try:
        split_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text
