"""``softhca bench``: speeds, each beside a ceiling measured in the same run.

``softhca bench`` (e2e.py) runs two ``softhca serve`` processes and measures what an
application sees through softhca.client: goodput, latency, many QPs at once, beside
the ceilings of ceilings.py. ``softhca bench engine`` (engine.py) measures the engine's
transforms through the transfer pipeline, beside one call of the C primitive each is
built on. output.py writes either as JSON or a table; compare.py sets a saved run
beside a new one. Numbers only: the benches judge nothing. ``softhca bench goals``
(goals.py) is the one judge, and it only reads saved runs: each of softhca's performance goals
against the median of several.

The names below are the bench's interface to the command line and the tests.
"""

from ..daemons import Daemons, ProcessError
from .common import (
    CONFIGS,
    DEFAULT_MTU,
    QUICK,
    SIZES,
    BenchError,
    E2EOptions,
    size_text,
    wire_size,
)
from .compare import (
    E2E_KIND,
    ENGINE_KIND,
    CompareError,
    compare,
    compare_rows,
    compare_to_table,
    doc_kind,
    load_saved,
)
from .e2e import run_e2e
from .engine import Report, Result, run_engine
from .output import e2e_to_json, e2e_to_table, to_json, to_table

__all__ = [
    "CONFIGS", "DEFAULT_MTU", "E2E_KIND", "ENGINE_KIND", "QUICK", "SIZES", "BenchError",
    "CompareError", "Daemons", "E2EOptions", "ProcessError", "Report", "Result", "compare",
    "compare_rows", "compare_to_table", "doc_kind", "e2e_to_json", "e2e_to_table",
    "load_saved", "run_e2e", "run_engine", "size_text", "to_json", "to_table", "wire_size",
]
