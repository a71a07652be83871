"""softhca in someone else's project: the wheel built from this tree,
installed into a fresh venv outside the repository, and the README's pytest example
(its test file and its pytest.ini, copied from the README as a reader copies them) run
there with ``pytest -q``: one async test on ``softhca_rc_pair``, one on
``softhca_pyverbs``. The wheel also carries LICENSE, the ``pytest11`` entry point,
``softhca.__version__`` and ``python -m softhca``.

The dependencies come from a wheelhouse ``pip wheel`` makes from pip's cache or the
package index; the venv then installs with ``--no-index`` from it alone. Skipped, saying
why, when neither can be had.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme_example() -> tuple[str, str]:
    """The README's pytest example: the test file and the pytest.ini."""
    text = README.read_text()
    section = text[text.index("### In your tests: the pytest plugin"):]
    test = next(b for b in re.findall(r"```python\n(.*?)```", section, re.S)
                if "softhca_rc_pair" in b)
    ini = re.search(r"```ini\n(.*?)```", section, re.S).group(1)
    return test, ini


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE",
                        "PYTEST_ADDOPTS", "PYTHONWARNINGS")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("wheelhouse")
    r = _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
              "--wheel-dir", str(where), f"{ROOT}[test]"], ROOT, timeout=900)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        if re.search(r"(?i)no matching distribution|connection|resolve|network|index", r.stderr):
            pytest.skip(f"the dependencies' wheels cannot be had here: {last}")
        pytest.fail(r.stderr)
    return where


def test_the_wheel_carries_license_entry_point_and_root_package(wheelhouse):
    [wheel] = wheelhouse.glob("softhca-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
        license_text = z.read(next(n for n in names if n.endswith("/LICENSE"))).decode()
        metadata = z.read(f"{dist_info}/METADATA").decode()
    assert license_text == (ROOT / "LICENSE").read_text()
    assert "License-Expression: MIT" in metadata
    assert re.search(r"^\[pytest11\]\nsofthca = softhca\.tools\.pytest_plugin$", entry_points,
                     re.M), entry_points
    for module in ("softhca/__init__.py", "softhca/__main__.py",
                   "softhca/tools/pytest_plugin.py", "softhca/client/pyverbs_path/pyverbs/"
                   "__init__.py"):
        assert module in names, module


def test_a_scratch_project_runs_the_readme_example(wheelhouse, tmp_path):
    project = tmp_path / "myproject"
    project.mkdir()
    assert ROOT not in project.parents
    venv.EnvBuilder(with_pip=True).create(project / ".venv")
    python = project / ".venv" / "bin" / "python"
    [wheel] = wheelhouse.glob("softhca-*.whl")
    r = _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              "--no-index", "--find-links", str(wheelhouse), str(wheel), "pytest",
              "pytest-asyncio"], project)
    assert r.returncode == 0, r.stderr
    test, ini = readme_example()
    (project / "test_softhca.py").write_text(test)
    (project / "pytest.ini").write_text(ini)

    # The installed softhca, not this tree's.
    r = _run([str(python), "-c", "import softhca, softhca.client; print(softhca.__version__, "
              "softhca.client.__file__, softhca.pyverbs_path())"], project)
    assert r.returncode == 0, r.stderr
    version, client_file, pv_path = r.stdout.split()
    want = re.search(r'^version = "([^"]+)"$', (ROOT / "pyproject.toml").read_text(),
                     re.M).group(1)
    assert version == want
    assert client_file.startswith(str(project / ".venv")), client_file
    assert Path(pv_path, "pyverbs", "__init__.py").is_file()
    r = _run([str(python), "-m", "softhca", "--version"], project)
    assert (r.returncode, r.stdout) == (0, f"softhca {want}\n"), r.stderr

    r = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], project)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^2 passed in [\d.]+s$", r.stdout.strip().splitlines()[-1]), r.stdout
    assert "warning" not in r.stdout.lower(), r.stdout
