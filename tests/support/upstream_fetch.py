"""rdma-core's tests of three releases, fetched at test time from package registries into
a cache outside the repository (nothing of rdma-core is committed):

- v44: Debian's ``python3-pyverbs`` (``apt-get download``; tests under
  usr/share/doc/rdma-core/tests, gzipped ones unpacked);
- v55: the crates.io crate ``ibverbs-sys`` 0.3.2+55.0, fetched by ``cargo fetch`` of a
  throwaway manifest (its tree under vendor/rdma-core);
- v59: PyPI's sdist ``pyverbs==59.0`` (``pip download``; its tree under rdma-core/).

Each fetcher returns the ``tests`` directory, or a sentence saying why it could not be
had (no tool, no registry), for the test to skip with. The cache is
``$SOFTHCA_UPSTREAM_CACHE`` or ``~/.cache/softhca-upstream``; a release already there is
not fetched again.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

CACHE = Path(os.environ.get("SOFTHCA_UPSTREAM_CACHE")
             or Path.home() / ".cache" / "softhca-upstream")
DEB_TESTS = Path("usr/share/doc/rdma-core/tests")


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


def _why(what: str, r: subprocess.CompletedProcess) -> str:
    return f"{what} failed: {(r.stderr or r.stdout).strip()[-300:]}"


def _extract(archive: Path, dest: Path, inside: str) -> None:
    """Only the members under ``inside`` (the tests directory), safely: no member may
    leave ``dest``."""
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if f"/{inside}/" in f"/{m.name}"
                   and (m.isfile() or m.isdir())]
        tar.extractall(tmp, members=members, filter="data")
    found = next(tmp.glob(f"*/{inside}"), None) or next(tmp.glob(inside), None)
    if found is None:
        raise FileNotFoundError(f"{archive.name} has no {inside}")
    shutil.rmtree(dest, ignore_errors=True)
    found.rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)


def fetch_v44(root: Path) -> Path | str:
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return "apt-get and dpkg are needed to fetch python3-pyverbs"
    work = root / "deb"
    work.mkdir(parents=True, exist_ok=True)
    r = _run(["apt-get", "download", "python3-pyverbs"], cwd=work)
    if r.returncode != 0 and os.geteuid() == 0:
        _run(["apt-get", "update"])
        r = _run(["apt-get", "download", "python3-pyverbs"], cwd=work)
    debs = sorted(work.glob("python3-pyverbs_44.*.deb"))
    if not debs:
        return _why("apt-get download python3-pyverbs (44)", r) if r.returncode \
            else f"apt offers no python3-pyverbs 44: {sorted(p.name for p in work.glob('*.deb'))}"
    x = root / "x"
    subprocess.run(["dpkg", "-x", str(debs[0]), str(x)], check=True, timeout=120)
    for gz in (x / DEB_TESTS).glob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    (x / DEB_TESTS).rename(root / "tests")
    return root / "tests"


def fetch_v55(root: Path) -> Path | str:
    cargo = shutil.which("cargo")
    if cargo is None:
        return "cargo is needed to fetch the crate ibverbs-sys 0.3.2+55.0"
    proj = root / "fetch"
    (proj / "src").mkdir(parents=True, exist_ok=True)
    (proj / "src" / "lib.rs").write_text("")
    (proj / "Cargo.toml").write_text(
        '[package]\nname = "softhca-upstream-fetch"\nversion = "0.0.0"\nedition = "2021"\n'
        '[dependencies]\nibverbs-sys = "=0.3.2"\n')
    home = root / "cargo-home"
    r = _run([cargo, "fetch"], cwd=proj, env={**os.environ, "CARGO_HOME": str(home)})
    crates = sorted(home.glob("registry/cache/*/ibverbs-sys-0.3.2+55.0.crate"))
    if r.returncode != 0 or not crates:
        return _why("cargo fetch of ibverbs-sys 0.3.2+55.0", r)
    _extract(crates[0], root / "tests", "vendor/rdma-core/tests")
    return root / "tests"


def fetch_v59(root: Path) -> Path | str:
    root.mkdir(parents=True, exist_ok=True)
    r = _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "pyverbs",
              "pyverbs==59.0", "-d", str(root)])
    sdists = sorted(root.glob("pyverbs-59.0.tar.gz"))
    if r.returncode != 0 or not sdists:
        return _why("pip download pyverbs==59.0", r)
    _extract(sdists[0], root / "tests", "rdma-core/tests")
    return root / "tests"


FETCHERS = {"v44": fetch_v44, "v55": fetch_v55, "v59": fetch_v59}


def tests_dir(release: str) -> Path | str:
    """The release's tests directory in the cache, fetched if not there yet."""
    root = CACHE / release
    if (root / "tests" / "run_tests.py").is_file():
        return root / "tests"
    try:
        return FETCHERS[release](root)
    except (OSError, subprocess.SubprocessError, tarfile.TarError) as e:
        return f"fetching rdma-core {release}'s tests failed: {e}"
