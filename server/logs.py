"""The daemon's structured log: one logger, ``key=value`` fields."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("softhca.server")


def kv(**fields: Any) -> str:
    """A structured log line's fields: ``key=value`` pairs, values repr'd when needed."""
    return " ".join(f"{k}={v}" if isinstance(v, (int, float)) or (isinstance(v, str)
                    and v and " " not in v and "=" not in v) else f"{k}={v!r}"
                    for k, v in fields.items())
