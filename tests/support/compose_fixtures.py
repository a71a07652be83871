"""The compose stack's fixtures, shared by the modules that drive docker/compose.yaml
(tests/containers: test_compose.py, test_compose_names.py, test_middleware.py), which
import them by name; the commands behind them are tests/support/compose.py's. Not a
conftest.py there: a second module named conftest would shadow tests/conftest.py for
the modules that import from it."""

from __future__ import annotations

import pytest

import compose as dc


@pytest.fixture(scope="module")
def stack():
    """The images built (cached) and no container of ours left before or after the
    module; skipped, saying why, where no Docker engine answers."""
    reason = dc.unavailable()
    if reason:
        pytest.skip(reason)
    with dc.machine_lock():
        dc.build_images()
        dc.compose("--profile", "scale", "down", "-v", "--remove-orphans", check=False)
        try:
            yield
        finally:
            dc.compose("--profile", "scale", "down", "-v", "--remove-orphans", check=False)


@pytest.fixture
def target_up(stack, monkeypatch):
    """The target container running and healthy; the host set up as its initiator."""
    cid = dc.target_running()
    monkeypatch.setenv("SOFTHCA_TOKEN_FILE", str(dc.TOKEN_FILE))
    monkeypatch.setenv("SOFTHCA_PEER_TOKEN_FILE", str(dc.PEER_TOKEN_FILE))
    monkeypatch.delenv("SOFTHCA_PEER_TOKEN", raising=False)
    monkeypatch.delenv("SOFTHCA_TOKEN", raising=False)
    monkeypatch.delenv("SOFTHCA_INITIATOR_ADDR", raising=False)
    return cid

