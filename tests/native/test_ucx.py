"""UCX (Debian's ucx-utils) unchanged on softhca, between two network namespaces, each
``ucx_perftest`` under its own ``softhca run``: the UCP tests the middleware's users run
first (tag matching, put, get, active messages), with the verbs transports UCX has for a
device without DevX (rc_verbs and ud_verbs; the mlx5-accelerated ones drive hardware
queues directly and stay out), and with UCX's own choice. Each run prints its figures;
its verdict is ucx_perftest's own (exit status 0 and its "Final:" row), and UCX's own
log line names the transports that carried it.

- ``UCX_TLS=rc_v`` is UCX's name for rc_verbs with ud_verbs as its wire-up transport;
  ``UCX_TLS=rc_verbs`` alone is refused by UCX itself ("no auxiliary transport"), on
  any device, as RC needs one to connect.
- UCX's own choice runs with UCX's defaults, nothing set: its allocator gives SysV
  shared memory first (``md:sysv``), which softhca registers in place (docs/native.md,
  "Memory already shared"). On one host UCX also picks its shared-memory transports
  (sysv, posix, cma) beside rc_verbs, so a fourth run excludes them (``UCX_TLS=^sysv,
  posix,cma``) to have UCX choose among the network ones."""

from __future__ import annotations

import shutil

import native
import pytest

pytestmark = [
    pytest.mark.readme_row("UCX (`ucx_perftest` UCP and UCT tests)"),
    pytest.mark.readme_row("UCX 1.13 (`ucx-utils`)"),
]

TESTS = ["tag_lat", "tag_bw", "ucp_put_bw", "ucp_get", "ucp_am_bw"]
CHOICES = {
    "rc_verbs": {"UCX_TLS": "rc_v"},
    "ud_verbs": {"UCX_TLS": "ud_verbs"},
    "ucx_default": {},
    "ucx_default_no_shm": {"UCX_TLS": "^sysv,posix,cma"},
}


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    if shutil.which("ucx_perftest") is None:
        pytest.skip("ucx_perftest is not installed (Debian's ucx-utils; `make test` "
                    "installs it as root)")
    with native.place(tmp_path_factory.mktemp("ucx")) as p:
        yield p


@pytest.fixture
def ucx_env(monkeypatch):
    """The UCX settings of one run, passed through softhca run's environment."""
    for name in ("UCX_TLS", "UCX_ALLOC_PRIO", "UCX_NET_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    # info: UCX prints the transports each endpoint's lanes use ("ep_cfg[0]: ...").
    monkeypatch.setenv("UCX_LOG_LEVEL", "info")

    def put(settings: dict[str, str]) -> None:
        for k, v in settings.items():
            monkeypatch.setenv(k, v)
    return put


def test_ucx_info_lists_the_verbs_transports(where):
    r = where.run(where.server, ["ucx_info", "-d"])
    print(r.output)
    assert r.returncode == 0, r.output
    md = r.output.split("# Memory domain: mlx5_0", 1)
    assert len(md) == 2, r.output
    domain = md[1].split("# Memory domain:", 1)[0]
    for tl in ("rc_verbs", "ud_verbs"):
        assert f"#      Transport: {tl}" in domain, domain
    assert "failed to open interface" not in domain, domain
    for tl in ("rc_mlx5", "ud_mlx5", "dc_mlx5"):
        assert tl not in domain, domain


@pytest.mark.parametrize("choice", list(CHOICES))
@pytest.mark.parametrize("test", TESTS)
def test_ucx_perftest(where, ucx_env, test, choice):
    ucx_env(CHOICES[choice])
    port = native.free_port()
    args = ["-t", test, "-n", "2000", "-w", "100", "-p", str(port)]
    srv, cli = where.pair(["ucx_perftest", *args],
                          ["ucx_perftest", where.server.addr, *args], port)
    print(f"{test} {choice} {CHOICES[choice]}: client\n{cli.output}\nserver\n{srv.output}")
    assert cli.returncode == 0 and srv.returncode == 0, (cli.output, srv.output)
    assert "Final:" in cli.output, cli.output
    # UCX says which transports carried it: softhca's device among them (for UCX's own
    # choice on one host, beside its shared-memory ones), the chosen one when named.
    lanes = [line for line in cli.output.splitlines() if "ep_cfg[" in line]
    assert lanes and all("/mlx5_0:1" in line for line in lanes), lanes
    want = {"rc_verbs": "rc_verbs/", "ud_verbs": "ud_verbs/",
            "ucx_default_no_shm": "rc_verbs/"}.get(choice)
    if want:
        assert all(want in line for line in lanes), lanes


# UCT level, one transport on softhca's port by name: what each transport has (UD has
# active messages only; rc_verbs has no "get short", so get is bcopy).
UCT = [("put_bw", "rc_verbs", []), ("get", "rc_verbs", ["-D", "bcopy"]),
       ("am_bw", "rc_verbs", []), ("am_bw", "ud_verbs", [])]


@pytest.mark.parametrize("test,tl,extra", UCT, ids=[f"{t}-{tl}" for t, tl, _ in UCT])
def test_ucx_perftest_uct(where, ucx_env, test, tl, extra):
    ucx_env({})
    port = native.free_port()
    args = ["-t", test, *extra, "-x", tl, "-d", "mlx5_0:1", "-n", "2000", "-w", "100",
            "-p", str(port)]
    srv, cli = where.pair(["ucx_perftest", *args],
                          ["ucx_perftest", where.server.addr, *args], port)
    print(f"{test} {tl}: client\n{cli.output}\nserver\n{srv.output}")
    assert cli.returncode == 0 and srv.returncode == 0, (cli.output, srv.output)
    assert "Final:" in cli.output, cli.output
