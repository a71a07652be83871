"""rdma-core's own test_rdmacm of three releases (v44, v55, v59), unmodified, inside
``softhca run``, on softhca's pyverbs layer.

Upstream's RDMACMBaseTest finds the device's IP address as on a RoCE host: it lists
``/sys/class/infiniband/<dev>/device/net/`` (from v55 on it asks ``rdma link show -j``
first: iproute2's own tool, whose RDMA netlink the preload library of ``softhca run``
answers) and asks ``ip -j addr show <if>`` for the address. ``softhca run`` gives the
program a sysfs tree, and a netlink answer, where the netdev is the interface of the
daemon's address (``lo`` here, so 127.0.0.1). Each test then forks a passive and an active side with
multiprocessing's 'fork' after the parent has opened a Context: each child opens its
own rdma_cm ids over the parent's embedded daemon (client/pyverbs/_sync.py).

``run_tests.py -v test_rdmacm``'s own summary line is the verdict, printed with its
time in the report after the pytest run (section "upstream pyverbs"). Multicast skips on
upstream's own check (the device has no multicast support).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from native import unavailable
from test_upstream_pyverbs import RELEASES, REPORT, _judge, _plain_env
from upstream_fetch import tests_dir as fetch_tests
from upstream_report import parse

# Upstream tests that error for a known reason, each named with it: the pytest test is
# an xfail only while every error is one of these. None today.
PENDING: dict[str, dict[str, str]] = {rel: {} for rel in RELEASES}
REFUSED = "cannot make the program's mount namespace"


@pytest.mark.parametrize("release", RELEASES)
def test_rdmacm_inside_softhca_run(release):
    why = unavailable()
    if why:
        pytest.skip(why)
    tests = fetch_tests(release)
    if isinstance(tests, str):
        pytest.skip(tests)
    env = _plain_env()
    env.update(SOFTHCA_PYVERBS_MARK_EOPNOTSUPP="1")
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "run", "--",
                        sys.executable, "run_tests.py", "-v", "test_rdmacm"],
                       cwd=tests, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    if r.returncode == 2 and REFUSED in r.stderr:
        pytest.skip(r.stderr.strip().splitlines()[-1])
    run = parse(r.stderr)
    REPORT.append(f"rdma-core {release} softhca run -- run_tests.py -v test_rdmacm "
                  f"({took:.1f} s): {run.summary}")
    assert run.summary, r.stderr[-3000:]
    results = {o.test.rsplit(".", 1)[1]: o for o in run.outcomes}
    # Every test that forks a passive and an active side ran and passed, the UD one
    # (RDMA_PS_UDP, SIDR) included: v59 turns a child's EOPNOTSUPP into a skip, which
    # must not count as a pass here.
    for name in ("test_rdmacm_async_udp_traffic", "test_rdmacm_sync_traffic", "test_rdmacm_async_traffic",
                 "test_rdmacm_async_read", "test_rdmacm_async_write",
                 "test_rdmacm_async_reject_traffic", "test_rdmacm_async_traffic_external_qp"):
        assert results[name].result == "ok", (name, run.summary)
    # Only upstream's own multicast check skips, never an EOPNOTSUPP of softhca's there.
    for name, o in results.items():
        if "multicast" in name:
            assert o.result == "skip-env", (name, o)
    _judge(release, run, PENDING[release])
