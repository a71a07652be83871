"""Installing softhca as `make` does prints no warning the project causes.

`make` runs ``pip install -e '.[fast,test]'``: pip builds an editable wheel with the
setuptools that ``[build-system]`` asks for, in an isolated environment. Two things used to
show up in that output: setuptools' deprecation of ``project.license`` as a TOML table (now
the SPDX string), and the "Editable installation" notice setuptools emits, as a warning, for
every editable install of a package-dir mapping (the five folders installed as
``softhca.<folder>``), which the Makefile filters. The install runs twice in a scratch venv:
as it is, where that notice must be the only warning, and with the Makefile's own filter,
where nothing at all may be printed.

A regular (non-editable) install, as a wheel gives, runs ``python -m softhca`` from the
repository root as from anywhere: the tree's ``softhca/`` folder, first on ``sys.path``
there, takes its subpackages from the installed copy.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _makefile_filter() -> str:
    m = re.search(r'^QUIET_EDITABLE := PYTHONWARNINGS="([^"]+)"$',
                  (ROOT / "Makefile").read_text(), re.M)
    assert m, "the Makefile defines QUIET_EDITABLE"
    return m.group(1)


def _install(python: Path, warnings_filter: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    if warnings_filter:
        env["PYTHONWARNINGS"] = warnings_filter
    return subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall",
         "--disable-pip-version-check", "-e", str(ROOT)],
        capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def scratch_python(tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    # As the Makefile does: the current pip, which shows what the build backend prints.
    up = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
                        capture_output=True, text=True, timeout=300)
    if up.returncode != 0:
        pytest.skip(f"pip cannot be upgraded here (no package index?): "
                    f"{(up.stderr.strip().splitlines() or ['?'])[-1]}")
    return python


def test_make_install_prints_no_warning(scratch_python):
    plain = _install(scratch_python, None)
    if plain.returncode != 0 and re.search(r"(?i)no matching distribution|connection|"
                                           r"network is unreachable", plain.stderr):
        pytest.skip(f"setuptools cannot be fetched for the isolated build: "
                    f"{plain.stderr.strip().splitlines()[-1]}")
    assert plain.returncode == 0, plain.stderr
    # As it is: the editable notice is the one warning, never a deprecation of ours.
    kinds = re.findall(r"(\w*Warning): ([^\n]*)", plain.stderr)
    assert kinds, "setuptools no longer warns on editable installs: drop the filter"
    assert {k for k, _ in kinds} <= {"BuildBackendWarning", "InformationOnly"}, plain.stderr
    assert {text.strip() for _, text in kinds} == {"Editable installation."}, plain.stderr
    assert "license" not in plain.stderr.lower(), plain.stderr

    # As `make` runs it: silent.
    quiet = _install(scratch_python, _makefile_filter())
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "" and quiet.stderr.strip() == "", quiet.stderr
    print(f"\nplain install: {len(kinds)} notice(s) {sorted({t for _, t in kinds})}; "
          f"with the Makefile's filter: no output ({sys.version.split()[0]})")


# -- a regular (non-editable) install, run from the repository root ------------------------

@pytest.fixture(scope="module")
def installed_python(tmp_path_factory) -> Path:
    """A scratch venv with softhca installed from the tree as a wheel would be (no
    editable finder); its dependencies come from this interpreter (PYTHONPATH below)."""
    where = tmp_path_factory.mktemp("installed")
    venv.EnvBuilder(with_pip=True).create(where)
    python = where / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps",
         "--disable-pip-version-check", str(ROOT)],
        capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and re.search(r"(?i)no matching distribution|connection|"
                                          r"network is unreachable", done.stderr):
        pytest.skip(f"setuptools cannot be fetched for the isolated build: "
                    f"{done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return python


@pytest.mark.parametrize("where", ["the repository root", "another directory"])
def test_python_m_softhca_with_a_regular_install(installed_python, tmp_path, where):
    """From the repository root the tree's softhca/ (two files) comes first on sys.path;
    the subpackages must still be the installed ones (softhca/__init__.py extends its
    __path__), not a ModuleNotFoundError for softhca.tools."""
    cwd = ROOT if where == "the repository root" else tmp_path
    deps = next(p for p in sys.path if p.endswith("site-packages"))
    env = {**os.environ, "PYTHONPATH": deps}
    env.pop("PYTHONWARNINGS", None)
    version = subprocess.run([str(installed_python), "-m", "softhca", "--version"], cwd=cwd,
                             env=env, capture_output=True, text=True, timeout=120)
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("softhca "), version.stdout
    where_tools = subprocess.run(
        [str(installed_python), "-c", "import softhca.tools.cli as c; print(c.__file__)"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert where_tools.returncode == 0, where_tools.stderr
    installed = Path(installed_python).parent.parent.resolve()
    assert installed in Path(where_tools.stdout.strip()).resolve().parents, where_tools.stdout
