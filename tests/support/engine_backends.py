"""The engine's backends: every engine test runs on the Python engine and on the native
accelerator (softhca.accel._native, engine/backend.py), through the ``engine_backend`` fixture
(tests/conftest.py imports it; the engine tests of tests/unit use it module-wide).

Where the native module is not built the native half skips, saying so; with ``CI=true``
it fails instead, so that a CI run cannot lose the accelerator without anyone noticing.
"""

from __future__ import annotations

import os

import pytest

from softhca.engine import backend


def native_missing() -> str | None:
    """Why the native backend cannot run here, or None."""
    if backend.available():
        return None
    return ("the native engine (softhca.accel._native) is not built: `make accel` builds it "
            "(libisal-dev, libssl-dev)")


@pytest.fixture(params=["python", "native"])
def engine_backend(request):
    """Run the test with the engine on one backend, then restore the one it had."""
    if request.param == "native":
        why = native_missing()
        if why is not None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"CI=true: {why}")
            pytest.skip(why)
    with backend.using(request.param):
        yield request.param
