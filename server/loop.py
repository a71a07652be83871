"""The event loop a daemon runs on: uvloop where it is installed, else asyncio's own.

uvloop's loop costs a fraction of the default selector loop's per wake-up and per
socket write, which is most of what a daemon does per message (docs/performance.md,
"Where the time goes"); `softhca serve`, `softhca run`'s embedded daemon and the bench's
clients all run on it, so that what a C program under `softhca run` measures is the
daemon `softhca serve` would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["run_loop"]


def run_loop(coro: Coroutine[Any, Any, Any]) -> Any:
    """``coro`` to its end on uvloop when it is installed, else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
