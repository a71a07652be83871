"""The token file of a client: ``--token-file`` of the client commands (faults, trace,
capture, the pytest plugin) and ``SOFTHCA_TOKEN_FILE`` of softhca's pyverbs, read the same
way (the daemon reads its own, with its checks, in server/serve.py).
"""

from __future__ import annotations


class TokenFileError(ValueError):
    """The token file named on the command line cannot be read."""


def read_token(path: str | None) -> bytes | None:
    """The shared token in ``path`` (trailing whitespace ignored, as ``serve --token-file``),
    None without a path."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read().rstrip()
    except OSError as e:
        raise TokenFileError(f"cannot read {path}: {e.strerror}") from None
