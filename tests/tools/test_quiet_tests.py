"""The tests are quiet where the working directory is read-only: the
initiator container runs them from /src as uid 10001, where hypothesis could not make
its ``.hypothesis`` directory and warned twice. tests/conftest.py then points
hypothesis at a directory of that user's own in the temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import hypothesis_home

ROOT = Path(__file__).resolve().parents[2]


def test_a_writable_working_directory_keeps_hypothesis_default(tmp_path):
    assert hypothesis_home(tmp_path) is None


def test_a_read_only_working_directory_moves_hypothesis_to_the_temporary_directory(
        tmp_path, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path
                        else real(p, mode))
    assert hypothesis_home(tmp_path) == Path(tempfile.gettempdir()) / \
        f"softhca-hypothesis-{os.getuid()}"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv(1) to run the tests as uid 10001")
def test_property_tests_from_a_read_only_directory_as_uid_10001_warn_nothing():
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)      # root's, as /src is in the container: not writable by 10001
        r = subprocess.run(
            ["setpriv", "--reuid", "10001", "--regid", "10001", "--clear-groups",
             sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-W", "error::hypothesis.errors.HypothesisWarning",
             str(ROOT / "tests" / "unit" / "test_properties.py")],
            cwd=d, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert not os.path.exists(os.path.join(d, ".hypothesis"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning" not in r.stdout.lower(), r.stdout
