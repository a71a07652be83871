"""rdma-core's own pyverbs tests of three releases (v44, v55, v59), unmodified, on
softhca's pyverbs layer.

Each release's tests directory is fetched at test time from its package registry into a
cache outside the repository (tests/support/upstream_fetch.py); without the registry the
release's tests skip, saying why. ``run_tests.py -v`` is run as upstream runs it, once
per release per pytest session, with ``softhca pyverbs path`` first on PYTHONPATH, so its
own summary line is the verdict. The runs the selected tests need are started together when
the first of them is asked for, as many at a time as the machine has cores (each run is one
single-threaded Python process, and pytest itself only waits for them); the huge-page runs,
which change nr_hugepages for the whole machine, start only once every other run has ended. tests/support/upstream_report.py reads unittest's
verbose lines: per module, passed, skipped because softhca answered EOPNOTSUPP, skipped by
the test's own environment check (the reasons are listed), errors and failures; the
report is printed after the pytest run (tests/conftest.py, section "upstream pyverbs").

Two facts of this machine are answered as a host with softhca's devices would: from v55
on every RDMATestCase asks iproute2's ``rdma link show -j`` which links exist, and the
kernel here has no RDMA netlink: the run has softhca's preload library
(provider/preload/netlink.c, as ``softhca run`` gives every program) answer the RDMA
netlink of the real ``rdma`` from a sysfs tree (SYSFS_PATH) of softhca's device with no
netdev, as the pyverbs layer's devices have none. And from v55 on test_get_pkey_index
reads the P_Key from /sys/class/infiniband/<dev>/ports/1/pkeys/0: as root each run has a
private sysfs view holding softhca's answer there (tests/support/upstream_sysfs.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path

import pytest
from upstream_fetch import tests_dir as fetch_tests
from upstream_report import Run, parse
from upstream_sysfs import wrap, write_tree

from softhca.tools.pyverbs import path as pyverbs_path

RELEASES = ("v44", "v55", "v59")
PRELOAD = Path(__file__).resolve().parents[2] / "provider" / "build" / "libsofthca-preload.so"
NR_HUGEPAGES = Path("/proc/sys/vm/nr_hugepages")
FREE_HUGEPAGES = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")

# Upstream tests that error for a known reason outside softhca, each named with it. The
# run's summary is still reported as unittest wrote it; the pytest test is an xfail only
# while every error is one of these (any other error or failure fails it), and passes
# once the run ends OK. None today.
PENDING: dict[str, dict[str, str]] = {rel: {} for rel in RELEASES}
# Pending only where the run cannot have its private sysfs view (not root, no unshare:
# tests/support/upstream_sysfs.py).
NO_SYSFS_VIEW = {"test_device.DeviceTest.test_get_pkey_index":
                 "reads /sys/class/infiniband/mlx5_0/ports/1/pkeys/0 with cat, and this run "
                 "could not give it softhca's sysfs view"}

# unittest's summary line and the per-module tables, printed after the pytest run.
REPORT: list[str] = []
_RUNS: dict[tuple, Run] = {}
# The runs started and not yet judged: run_tests.py's CompletedProcess, by run_upstream's key.
_STARTED: dict[tuple, Future] = {}
_POOL = ThreadPoolExecutor(max_workers=min(3, len(os.sched_getaffinity(0))),
                           thread_name_prefix="upstream-run")
_VIEW: list[list[str]] = []      # the sysfs view's command prefix, once per session


def _sysfs_view(tmp: Path) -> list[str]:
    if not _VIEW:
        from softhca.client.pyverbs.device import Context

        with Context(name="mlx5_0") as ctx:
            pkey = ctx.query_pkey(1, 0)
        _VIEW.append(wrap(write_tree(tmp / "sysfs-view", {"mlx5_0": pkey})) or [])
        REPORT.append("sysfs view of softhca's P_Keys: "
                      + ("mounted in each run's private namespace" if _VIEW[0]
                         else "not available here (the P_Key test errors)"))
    return _VIEW[0]


def _netlink_tree(tmp: Path) -> Path:
    """The tree the preload library's RDMA netlink answers from: softhca's device
    mlx5_0, port 1 ACTIVE, and no netdev (no interface holds 0.0.0.0)."""
    from softhca.tools.native import write_sysfs

    root = tmp / "netlink-sysfs"
    if not root.exists():
        write_sysfs(root, ["mlx5_0"], "0.0.0.0", 0)
    return root


def _release(release: str) -> Path | str:
    """The release's tests directory, or why its tests skip."""
    if release != "v44" and not PRELOAD.is_file():
        return (f"the preload library is not built ({PRELOAD}): `make provider` builds "
                "it (from v55 on every test asks `rdma link show -j`, which it answers)")
    return fetch_tests(release)


# The runs each test of this module asks for first, by its name: (names, mode).
_NEEDS = {"test_whole_directory": [((), "wrapped")],
          "test_mlx5_mkey_passes_whole": [((), "wrapped")],
          "test_mlx5_crypto_in_both_import_modes": [((), "wrapped"),
                                                    (("test_mlx5_crypto",), "plaintext")]}


def _start_selected(session, tmp: Path) -> None:
    """Starts, once, every run the selected tests of this module will ask for (all but
    the huge-page ones), the whole-directory runs, the longest, first."""
    if _STARTED:
        return
    wanted: list[tuple[str, tuple, str]] = []
    for item in session.items:
        release = getattr(item, "callspec", None) and item.callspec.params.get("upstream")
        for names, mode in _NEEDS.get(getattr(item, "originalname", ""), ()):
            if release and item.module.__name__ == __name__ \
                    and (release, names, mode) not in wanted:
                wanted.append((release, names, mode))
    for release, names, mode in sorted(wanted, key=lambda w: (bool(w[1]), w[0])):
        tests = _release(release)
        if not isinstance(tests, str):
            _start(release, tests, tmp, names, mode)


@pytest.fixture(scope="module", params=RELEASES)
def upstream(request, tmp_path_factory):
    got = _release(request.param)
    if isinstance(got, str):
        pytest.skip(got)
    _start_selected(request.session, tmp_path_factory.getbasetemp())
    return request.param, got


def _crypto_info(tmp: Path) -> Path:
    info = tmp / "crypto.json"
    if not info.exists():
        subprocess.run([sys.executable, "-c", "from softhca.tools.cli import main; raise "
                        f"SystemExit(main(['crypto-test-info', '--out', {str(info)!r}]))"],
                       check=True, capture_output=True, timeout=120)
    return info


def _plain_env() -> dict:
    """An embedded daemon (no SOFTHCA_TARGET) and softhca's pyverbs first."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(pyverbs_path())
    return env


def _env(tmp: Path, mode: str) -> dict:
    env = _plain_env()
    if PRELOAD.is_file():
        env.update(LD_PRELOAD=str(PRELOAD), SYSFS_PATH=str(_netlink_tree(tmp)))
    env.update(SOFTHCA_PYVERBS_MARK_EOPNOTSUPP="1",
               SOFTHCA_CRYPTO_CONFIG=json.dumps({"mode": mode}),
               MLX5_CRYPTO_TEST_INFO=str(_crypto_info(tmp)))
    return env


def _start(release: str, tests: Path, tmp: Path, names: tuple = (), mode: str = "wrapped",
           label: str = "") -> tuple:
    """Starts ``run_tests.py -v [names]`` in the background, once per (release, names,
    mode, label) per session; its key."""
    key = (release, names, mode, label)
    if key not in _STARTED:
        # The sysfs view, the netlink tree and the crypto info are made here, in pytest's
        # own thread, before any run needs them.
        cmd = [*_sysfs_view(tmp), sys.executable, "run_tests.py", "-v", *names]
        _STARTED[key] = _POOL.submit(subprocess.run, cmd, cwd=tests, env=_env(tmp, mode),
                                     capture_output=True, text=True, timeout=1500)
    return key


def _settle() -> None:
    """Waits until no run is going (before nr_hugepages changes under them)."""
    wait(list(_STARTED.values()))


def run_upstream(release: str, tests: Path, tmp: Path, names: tuple = (),
                 mode: str = "wrapped", label: str = "") -> Run:
    """``run_tests.py -v [names]`` once per (release, names, mode, label) per session."""
    key = _start(release, tests, tmp, names, mode, label)
    if key not in _RUNS:
        r = _STARTED[key].result()
        run = _RUNS[key] = parse(r.stderr)
        what = " ".join(names) or "whole directory"
        REPORT.append(f"rdma-core {release} run_tests.py -v {what} ({mode} crypto"
                      f"{', ' + label if label else ''}): {run.summary}")
        assert run.summary, r.stderr[-3000:]
    return _RUNS[key]


def _short(test: str) -> str:
    return test.split(".", 1)[1]


def _judge(release: str, run: Run, pending: dict[str, str] | None = None) -> None:
    """Pass when the run ended OK; xfail when every error is ``pending``'s (default:
    PENDING's, and NO_SYSFS_VIEW's without the view); fail otherwise."""
    bad = {_short(o.test) for o in run.outcomes if o.result in ("error", "fail")}
    # Every error and failure the summary counts is one the report names.
    assert len(bad) == run.summary_counts(), (run.summary, sorted(bad))
    if run.ok:
        assert not bad
        return
    if pending is None:
        pending = {**PENDING.get(release, {}),
                   **({} if _VIEW and _VIEW[0] else NO_SYSFS_VIEW)}
    assert bad <= set(pending), f"{run.summary}; not pending: {sorted(bad - set(pending))}"
    pytest.xfail(f"{run.summary}: " + "; ".join(f"{t}: {pending[t]}" for t in sorted(bad)))


def _table(release: str, run: Run) -> None:
    REPORT.append(f"  {release} module: passed / EOPNOTSUPP skips / env skips / errors+fails")
    total = [0, 0, 0, 0]
    for mod, c in sorted(run.by_module().items()):
        row = [c["ok"], c["skip-eopnotsupp"], c["skip-env"], c["error"] + c["fail"]]
        total = [a + b for a, b in zip(total, row, strict=True)]
        REPORT.append(f"    {mod}: {' / '.join(map(str, row))}")
    REPORT.append(f"    total: {' / '.join(map(str, total))}")
    REPORT.append(f"  {release} environment-check skip reasons (count):")
    for why, n in sorted(run.env_reasons().items(), key=lambda kv: (-kv[1], kv[0])):
        REPORT.append(f"    {n} x {why}")


def test_whole_directory(upstream, tmp_path_factory):
    """run_tests.py over the whole directory: its summary line is the verdict."""
    release, tests = upstream
    run = run_upstream(release, tests, tmp_path_factory.getbasetemp())
    _table(release, run)
    passed = sum(o.result == "ok" for o in run.outcomes)
    assert passed >= 70, run.summary
    _judge(release, run)


def test_mlx5_mkey_passes_whole(upstream, tmp_path_factory):
    """The 11 MKEY tests of v44 pass on every release; v55 on adds an ODP one, which
    skips on its own environment check (softhca's odp_caps are 0)."""
    release, tests = upstream
    run = run_upstream(release, tests, tmp_path_factory.getbasetemp())
    mkey = {_short(o.test): o.result for o in run.outcomes if ".test_mlx5_mkey." in o.test}
    ok = [t for t, r in mkey.items() if r == "ok"]
    assert len(ok) >= 11, mkey
    assert {r for t, r in mkey.items() if r != "ok"} <= {"skip-env"}, mkey
    REPORT.append(f"  {release} test_mlx5_mkey: {len(ok)} of {len(mkey)} passed")


def test_mlx5_crypto_in_both_import_modes(upstream, tmp_path_factory):
    """Wrapped import (the whole-directory run) and plaintext import: no error in either,
    and each crypto test passes in one of them (a test of the other mode skips)."""
    release, tests = upstream
    tmp = tmp_path_factory.getbasetemp()
    wrapped = run_upstream(release, tests, tmp)
    plain = run_upstream(release, tests, tmp, ("test_mlx5_crypto",), mode="plaintext")
    outcomes = [{_short(o.test): o.result for o in r.outcomes if ".test_mlx5_crypto." in o.test}
                for r in (wrapped, plain)]
    assert outcomes[0].keys() == outcomes[1].keys() and len(outcomes[0]) >= 7
    for per_mode in outcomes:
        assert set(per_mode.values()) <= {"ok", "skip-env", "skip-eopnotsupp"}, per_mode
    assert {t for o in outcomes for t, r in o.items() if r == "ok"} == set(outcomes[0])
    assert plain.ok, plain.summary


@pytest.fixture
def hugepages():
    """Sets nr_hugepages (root, where /proc/sys/vm is writable) and restores it, once no
    other run is going."""
    _settle()
    try:
        before = NR_HUGEPAGES.read_text()
        NR_HUGEPAGES.write_text(before)
    except OSError as e:
        pytest.skip(f"cannot set {NR_HUGEPAGES}: {e}")

    def set_to(n: int) -> int:
        NR_HUGEPAGES.write_text(f"{n}\n")
        return int(FREE_HUGEPAGES.read_text())
    yield set_to
    NR_HUGEPAGES.write_text(before)


def test_huge_page_module_with_and_without_free_huge_pages(upstream, tmp_path_factory,
                                                           hugepages):
    release, tests = upstream
    tmp = tmp_path_factory.getbasetemp()
    runs = {}
    for n in (0, 4):
        free = hugepages(n)
        if n and free < 1:
            pytest.skip(f"nr_hugepages={n} gave no free 2 MiB huge page")
        runs[n] = run_upstream(release, tests, tmp, ("test_mlx5_huge_page",),
                               label=f"{free} free 2 MiB huge pages")
    # Without huge pages HUGE must fail (the test expects the error) on every release.
    without = {o.test.rsplit(".", 1)[1]: o.result for o in runs[0].outcomes}
    assert without.get("test_obj_on_huge") == "ok", runs[0].summary
    for run in runs.values():
        _judge(release, run)


@pytest.fixture(scope="module")
def debian_root():
    got = fetch_tests("v44")
    if isinstance(got, str):
        pytest.skip(got)
    return got.parent / "x"


def test_the_real_pyverbs_is_not_importable(debian_root):
    """softhca's pyverbs is the one imported; the package's compiled one is not on the
    path (it is present in the extracted tree, so the check means something)."""
    real = debian_root / "usr/lib/python3/dist-packages"
    assert (real / "pyverbs").is_dir()
    probe = ("import sys, pyverbs, pyverbs.device, pyverbs.providers.mlx5.mlx5dv as m; "
             f"print(pyverbs.__name__, m.__name__, any({str(real)!r} in p for p in sys.path))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       timeout=60, env=_plain_env(),
                       cwd=debian_root / "usr/share/doc/rdma-core")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["softhca.client.pyverbs",
                                "softhca.client.pyverbs.providers.mlx5.mlx5dv", "False"]


def test_ib_devices_example_lists_softhca(debian_root):
    example = debian_root / "usr/share/doc/python3-pyverbs/examples/ib_devices.py"
    r = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                       timeout=60, env=_plain_env())
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()[2:]]
    assert [row[0] for row in rows] == ["mlx5_0"], r.stdout
