"""The daemon's log lines: one per event, ``time level logger message key=value...``.

``softhca serve`` sets this format up for everything it logs (``setup_logging``). A
daemon embedded in an application (``softhca.client.embedded``) leaves the
application's logging alone when it has any; without any, Python would print a bare
``refused event=refused ...`` through its last-resort handler, so the daemon's own
warnings get a stderr handler in the same format (``default_handler``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

log = logging.getLogger("softhca.server")


def kv(**fields: Any) -> str:
    """A structured log line's fields: ``key=value`` pairs, values repr'd when needed."""
    return " ".join(f"{k}={v}" if isinstance(v, (int, float)) or (isinstance(v, str)
                    and v and " " not in v and "=" not in v) else f"{k}={v!r}"
                    for k, v in fields.items())

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
LOGGER = "softhca"


def setup_logging(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper()),
                        format=LOG_FORMAT)


def default_handler() -> None:
    """Warnings and errors of softhca's loggers to stderr in LOG_FORMAT, unless the
    process already routes them somewhere (a handler on them or on the root)."""
    logger = logging.getLogger(LOGGER)
    if logger.hasHandlers():
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
