"""rdma-core's own pyverbs tests, unmodified, on softhca's pyverbs layer.

The tests come from Debian's ``python3-pyverbs`` (``apt-get download`` + ``dpkg -x`` into
a temporary directory; nothing of rdma-core is kept in this repository). They run in a
subprocess with ``softhca pyverbs path`` first on PYTHONPATH and the package's own
compiled pyverbs off the path; each run prints unittest's summary line. Without the
package (no apt, no network) the tests skip, saying why.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from softhca.tools.pyverbs import path as pyverbs_path

PACKAGE = "python3-pyverbs"
TESTS = Path("usr/share/doc/rdma-core/tests")
EXAMPLES = Path("usr/share/doc/python3-pyverbs/examples")
REAL_PYVERBS = Path("usr/lib/python3/dist-packages")

# An upstream test that uses a feature softhca does not model without guarding it (most
# turn EOPNOTSUPP into unittest.SkipTest themselves) ends in softhca's PyverbsRDMAError
# with EOPNOTSUPP. The driver records that, and only that, as a skip with the reason, and
# the report names each such test; any other error or failure fails the run.
UNCAUGHT = "skip (EOPNOTSUPP not caught by the test): "

# Runs unittest over the upstream package the way its run_tests.py loads it, and prints
# one JSON line of outcomes per test after unittest's own summary.
DRIVER = r"""
import errno, json, os, sys, unittest
from importlib.machinery import SourceFileLoader
here = sys.argv[1]
sys.path.insert(0, here)
from args_parser import parser
sys.argv = [sys.argv[0]] + sys.argv[2:]
tests = SourceFileLoader("tests", os.path.join(here, "__init__.py")).load_module()
parser.parse_args()
outcomes = {}
class Result(unittest.TextTestResult):
    def addSuccess(self, t): super().addSuccess(t); outcomes[t.id()] = "ok"
    def addSkip(self, t, r): super().addSkip(t, r); outcomes[t.id()] = "skip: " + str(r)
    def addError(self, t, e):
        if type(e[1]).__name__ == "PyverbsRDMAError" and type(e[1]).__module__.startswith(
                "softhca.") and getattr(e[1], "error_code", None) == errno.EOPNOTSUPP:
            reason = "EOPNOTSUPP not caught by the test: " + str(e[1])
            super().addSkip(t, reason); outcomes[t.id()] = "skip (" + reason.split(": ", 1)[0] \
                + "): " + str(e[1])
            return
        super().addError(t, e); outcomes[t.id()] = "error"
    def addFailure(self, t, e): super().addFailure(t, e); outcomes[t.id()] = "fail"
    def addExpectedFailure(self, t, e): super().addExpectedFailure(t, e); outcomes[t.id()] = "fail"
    def addUnexpectedSuccess(self, t): super().addUnexpectedSuccess(t); outcomes[t.id()] = "fail"
names = sys.argv[1:] or ["tests"]
loader = unittest.defaultTestLoader
suite = unittest.TestSuite(loader.loadTestsFromName(n, tests) if n != "tests"
                           else loader.loadTestsFromModule(tests) for n in names)
unittest.TextTestRunner(resultclass=Result, stream=sys.stderr, verbosity=1).run(suite)
print("OUTCOMES " + json.dumps(outcomes))
"""


def _fetch(tmp: Path) -> Path | str:
    """The extracted package, or the reason it cannot be had."""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return "apt-get and dpkg are needed to fetch python3-pyverbs"

    def download() -> subprocess.CompletedProcess:
        return subprocess.run(["apt-get", "download", PACKAGE], cwd=tmp, capture_output=True,
                              text=True, timeout=180)

    r = download()
    if r.returncode != 0 and os.geteuid() == 0:
        subprocess.run(["apt-get", "update"], capture_output=True, timeout=300)
        r = download()
    debs = sorted(tmp.glob(f"{PACKAGE}_*.deb"))
    if r.returncode != 0 or not debs:
        return f"apt-get download {PACKAGE} failed: {(r.stderr or r.stdout).strip()[:300]}"
    root = tmp / "x"
    subprocess.run(["dpkg", "-x", str(debs[0]), str(root)], check=True, timeout=120)
    for gz in (root / TESTS).glob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    return root


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    got = _fetch(tmp_path_factory.mktemp("pyverbs-deb"))
    if isinstance(got, str):
        pytest.skip(got)
    return got


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(pyverbs_path())
    env.update(extra or {})
    return env


# unittest's summary line of each run and the per-module counts, printed once after the
# pytest run (tests/conftest.py, section "upstream pyverbs") instead of among the dots.
REPORT: list[str] = []


def run_upstream(root: Path, names: list[str], capsys, extra_env: dict | None = None,
                 label: str = "") -> dict[str, str]:
    r = subprocess.run([sys.executable, "-c", DRIVER, str(root / TESTS), *names],
                       cwd=root / TESTS, env=_env(extra_env), capture_output=True, text=True,
                       timeout=900)
    summary = [ln for ln in r.stderr.splitlines()
               if ln.startswith(("Ran ", "OK", "FAILED"))]
    REPORT.append(f"upstream {label or ' '.join(names) or 'all'}: {' | '.join(summary)}")
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("OUTCOMES ")), None)
    assert line is not None, r.stderr[-3000:]
    return json.loads(line[len("OUTCOMES "):])


def test_the_real_pyverbs_is_not_importable(upstream):
    """softhca's pyverbs is the one imported; the package's compiled one is not on the
    path (it is present in the extracted tree, so the check means something)."""
    assert (upstream / REAL_PYVERBS / "pyverbs").is_dir()
    probe = ("import sys, pyverbs, pyverbs.device, pyverbs.providers.mlx5.mlx5dv as m; "
             "print(pyverbs.__name__, m.__name__, "
             f"any({str(upstream / REAL_PYVERBS)!r} in p for p in sys.path))")
    r = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True,
                       text=True, timeout=60, cwd=upstream / TESTS)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["softhca.client.pyverbs",
                                "softhca.client.pyverbs.providers.mlx5.mlx5dv", "False"]


def test_mlx5_mkey(upstream, capsys):
    outcomes = run_upstream(upstream, ["test_mlx5_mkey"], capsys)
    assert len(outcomes) == 11
    assert {t: o for t, o in outcomes.items() if o != "ok"} == {}


@pytest.mark.parametrize("mode, passing", [
    ("wrapped", {"test_mlx5_dek_management", "test_mlx5_crypto_mkey_old_api",
                 "test_mlx5_crypto_wrapped_dek", "test_mlx5_crypto_signature_mkey",
                 "test_mlx5_wrapped_dek_multi_block"}),
    ("plaintext", {"test_mlx5_crypto_plaintext_dek", "test_mlx5_plaintext_dek_multi_block"}),
])
def test_mlx5_crypto(upstream, capsys, tmp_path, mode, passing):
    """The daemon in one crypto import mode; MLX5_CRYPTO_TEST_INFO written by softhca
    crypto-test-info, with the expected ciphertexts, so data validation is on."""
    info = tmp_path / "crypto.json"
    subprocess.run([sys.executable, "-c", "from softhca.tools.cli import main; "
                    f"raise SystemExit(main(['crypto-test-info', '--out', {str(info)!r}]))"],
                   check=True, capture_output=True, timeout=120)
    assert "encrypted_data_for_512_c" in json.loads(info.read_text())[0]
    outcomes = run_upstream(upstream, ["test_mlx5_crypto"], capsys, label=f"crypto {mode}",
                            extra_env={"SOFTHCA_CRYPTO_CONFIG": json.dumps({"mode": mode}),
                                       "MLX5_CRYPTO_TEST_INFO": str(info)})
    ok = {t.rsplit(".", 1)[1] for t, o in outcomes.items() if o == "ok"}
    assert ok == passing, outcomes
    assert all(o.startswith("skip") for t, o in outcomes.items()
               if t.rsplit(".", 1)[1] not in passing), outcomes


def test_every_other_upstream_module(upstream, capsys):
    """Every upstream test passes or skips: on its own, or on softhca's EOPNOTSUPP."""
    outcomes = run_upstream(upstream, [], capsys, label="all modules")
    bad = {t: o for t, o in outcomes.items() if o in ("error", "fail")}
    assert bad == {}, bad
    for name, o in sorted(outcomes.items()):
        if o.startswith(UNCAUGHT):
            # pyverbs' message starts "Failed to create QP: ": the cause is what follows.
            why = re.sub(r"^Failed to [^:]*: |\. Errno: 95, Operation not supported$", "",
                         o[len(UNCAUGHT):])
            REPORT.append(f"  skipped on an EOPNOTSUPP the test does not catch: "
                          f"{name.split('.', 1)[1]}: {why}")
    per_module: dict[str, list[int]] = {}
    for t, o in outcomes.items():
        mod = t.split(".")[1]
        c = per_module.setdefault(mod, [0, 0, 0])
        c[0 if o == "ok" else 1 if o.startswith("skip") else 2] += 1
    REPORT.append("module: passed / skipped / neither")
    for mod, (ok, skip, fail) in sorted(per_module.items()):
        REPORT.append(f"  {mod}: {ok} / {skip} / {fail}")
    passed = sum(c[0] for c in per_module.values())
    assert passed >= 50, per_module


def test_ib_devices_example_lists_softhca(upstream):
    r = subprocess.run([sys.executable, str(upstream / EXAMPLES / "ib_devices.py")],
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["mlx5_0"], r.stdout
