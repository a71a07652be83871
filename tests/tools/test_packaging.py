"""Installing softhca as `make` does prints no warning the project causes.

`make` runs ``pip install -e '.[fast,test]'``: pip builds an editable wheel with the
setuptools that ``[build-system]`` asks for, in an isolated environment. Two things used to
show up in that output: setuptools' deprecation of ``project.license`` as a TOML table (now
the SPDX string), and the "Editable installation" notice setuptools emits, as a warning, for
every editable install of a package-dir mapping (the five folders installed as
``softhca.<folder>``), which the Makefile filters. The install runs twice in a scratch venv:
as it is, where that notice must be the only warning, and with the Makefile's own filter,
where nothing at all may be printed.

The installs run in scratch venvs made without pip, by this interpreter's pip (`make`'s
own, upgraded by it to the current one) pointed at them with ``--python``: no pip
bootstrapped and upgraded per venv. The module's three installs (the two editable ones,
the regular one below) run at once, each in a venv of its own: each build is pip's
isolated environment and a build backend, mostly waiting on the package index.

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


INDEX_DOWN = re.compile(r"(?i)no matching distribution|connection|network is unreachable")


def _venv(where: Path) -> Path:
    """A scratch venv without pip (the installs below run this interpreter's pip in it)."""
    venv.EnvBuilder(with_pip=False).create(where)
    return where / "bin" / "python"


def _start_install(python: Path, *args: str,
                   warnings_filter: str | None = None) -> subprocess.Popen:
    """``pip install --no-deps`` of the tree into ``python``'s venv, started; pip's
    ``--python`` runs this interpreter's pip under ``python``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    if warnings_filter:
        env["PYTHONWARNINGS"] = warnings_filter
    return subprocess.Popen(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--disable-pip-version-check", *args, str(ROOT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _done(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def installs(tmp_path_factory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """The module's three installs, run at once, each in a venv of its own: editable as
    it is ("plain"), editable with the Makefile's filter ("quiet"), and regular
    ("regular"). {name: (the venv's python, the finished pip)}."""
    pythons = {name: _venv(tmp_path_factory.mktemp(name))
               for name in ("plain", "quiet", "regular")}
    procs = {
        "plain": _start_install(pythons["plain"], "-e"),
        "quiet": _start_install(pythons["quiet"], "-e", warnings_filter=_makefile_filter()),
        "regular": _start_install(pythons["regular"]),
    }
    return {name: (pythons[name], _done(proc)) for name, proc in procs.items()}


def _skip_if_index_down(r: subprocess.CompletedProcess) -> None:
    if r.returncode != 0 and INDEX_DOWN.search(r.stderr):
        pytest.skip(f"setuptools cannot be fetched for the isolated build: "
                    f"{r.stderr.strip().splitlines()[-1]}")


def test_make_install_prints_no_warning(installs):
    _, plain = installs["plain"]
    _skip_if_index_down(plain)
    assert plain.returncode == 0, plain.stderr
    # As it is: the editable notice is the one warning, never a deprecation of ours.
    kinds = re.findall(r"(\w*Warning): ([^\n]*)", plain.stderr)
    assert kinds, "setuptools no longer warns on editable installs: drop the filter"
    assert {k for k, _ in kinds} <= {"BuildBackendWarning", "InformationOnly"}, plain.stderr
    assert {text.strip() for _, text in kinds} == {"Editable installation."}, plain.stderr
    assert "license" not in plain.stderr.lower(), plain.stderr

    # As `make` runs it: silent.
    _, quiet = installs["quiet"]
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.strip() == "" and quiet.stderr.strip() == "", quiet.stderr
    print(f"\nplain install: {len(kinds)} notice(s) {sorted({t for _, t in kinds})}; "
          f"with the Makefile's filter: no output ({sys.version.split()[0]})")


# -- a regular (non-editable) install, run from the repository root ------------------------

@pytest.fixture(scope="module")
def installed_python(installs) -> Path:
    """A scratch venv with softhca installed from the tree as a wheel would be (no
    editable finder); its dependencies come from this interpreter (PYTHONPATH below)."""
    python, done = installs["regular"]
    _skip_if_index_down(done)
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
