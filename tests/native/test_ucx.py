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
  posix,cma``) to have UCX choose among the network ones.

The runs of one setting share one ``softhca run`` per side (each start of one is a few
seconds of a daemon's start-up, more than a run takes): the server side starts each
test's ``ucx_perftest`` server on a port of its own, in turn once the one before
listens, and the client side runs the tests' clients one after the other, each one's
output and exit status between markers, each judged on its own."""

from __future__ import annotations

import re
import shlex
import shutil

import native
import pytest

pytestmark = [
    pytest.mark.readme_row("UCX (`ucx_perftest` UCP and UCT tests)"),
    pytest.mark.readme_row("UCX 1.13 (`ucx-utils`)"),
]

TESTS = ["tag_lat", "tag_bw", "ucp_put_bw", "ucp_get", "ucp_am_bw"]
# Each run's iterations and warm-up: 400 operations, more than a verbs transport's send
# queue holds (UCX 1.13's RC_VERBS_TX_QUEUE_LEN and UD_VERBS_TX_QUEUE_LEN, 256), so each
# run wraps it; the verdict is that the run completes, not its figures.
ITERS = ["-n", "300", "-w", "100"]
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


# What each run's environment holds: UCX's settings of a choice replace these, and UCX's
# log at info level names the transports each endpoint's lanes use ("ep_cfg[0]: ...").
UCX_CLEARED = ("UCX_TLS", "UCX_ALLOC_PRIO", "UCX_NET_DEVICES")
SECTION = re.compile(r"^=== (\S+) (server|client)\n(.*?)^=== \1 \2 exit (\d+)$", re.M | re.S)


def _env_prefix(settings: dict[str, str]) -> str:
    unset = " ".join(f"-u {name}" for name in UCX_CLEARED)
    sets = " ".join(shlex.quote(f"{k}={v}") for k, v in {"UCX_LOG_LEVEL": "info",
                                                          **settings}.items())
    return f"env {unset} {sets}"


def _listening(port: int) -> str:
    """A shell test: a socket of this network namespace listens on TCP ``port``."""
    return (f"grep -qE ':{port:04X} [0-9A-F]+:0000 0A' /proc/net/tcp /proc/net/tcp6 "
            "2>/dev/null")


def run_batch(where, settings: dict[str, str],
              runs: dict[str, list[str]]) -> tuple[object, object, dict]:
    """Every run of ``runs`` ({name: ucx_perftest's arguments}) under one ``softhca run``
    per side with UCX's ``settings``: (server, client, {(name, side): (exit, output)})."""
    env = _env_prefix(settings)
    ports = {name: native.free_port() for name in runs}
    server = []
    for name, args in runs.items():
        port = ports[name]
        server += [f"out_{port}=$(mktemp)",
                   f"{env} ucx_perftest {shlex.join(args)} -p {port} >$out_{port} 2>&1 &",
                   f"pid_{port}=$!",
                   f"for i in $(seq 300); do {_listening(port)} && break; sleep 0.05; done"]
    server.append("status=0")
    for name in runs:
        port = ports[name]
        server += [f"wait $pid_{port}; rc=$?; [ $rc = 0 ] || status=1",
                   f"echo '=== {name} server'; cat $out_{port}; rm -f $out_{port}",
                   f"echo \"=== {name} server exit $rc\""]
    server.append("exit $status")
    client = []
    for name, args in runs.items():
        client += [f"echo '=== {name} client'",
                   f"{env} ucx_perftest {where.server.addr} {shlex.join(args)} "
                   f"-p {ports[name]} 2>&1",
                   f"echo \"=== {name} client exit $?\""]
    last = ports[list(runs)[-1]]
    srv, cli = where.pair(["sh", "-c", "\n".join(server)], ["sh", "-c", "\n".join(client)],
                          last, timeout=60 + 40 * len(runs))
    sections = {(m.group(1), m.group(2)): (int(m.group(4)), m.group(3))
                for m in SECTION.finditer(srv.output + "\n" + cli.output)}
    return srv, cli, sections


# UCX's own choice with its shared-memory transports (sysv, posix, cma; both sides on
# one host) runs each test alone, the program itself under each side's ``softhca run``:
# with several servers under one shell (each ``softhca run`` a PID namespace of its own)
# its endpoints did not wire up (ucp_ep_create: Endpoint timeout) on either side.
ALONE = {"ucx_default"}


def run_alone(where, settings: dict[str, str], name: str,
              args: list[str]) -> tuple[object, object, dict]:
    """One run, ``ucx_perftest`` itself the program of each side's ``softhca run``, in
    run_batch's form."""
    port = native.free_port()
    env = ["env", *(f"-u{n}" for n in UCX_CLEARED),
           *(f"{k}={v}" for k, v in {"UCX_LOG_LEVEL": "info", **settings}.items())]
    srv, cli = where.pair([*env, "ucx_perftest", *args, "-p", str(port)],
                          [*env, "ucx_perftest", where.server.addr, *args, "-p", str(port)],
                          port)
    return srv, cli, {(name, "server"): (srv.returncode, srv.output),
                      (name, "client"): (cli.returncode, cli.output)}


@pytest.fixture(scope="module")
def batches(where):
    """Each setting's batch, run when a test first asks for it; one that raised (a time-out)
    raises again for its other tests rather than being run again."""
    done: dict[str, tuple | Exception] = {}

    def get(key: str, settings: dict[str, str], runs: dict[str, list[str]]):
        if key not in done:
            try:
                done[key] = run_batch(where, settings, runs)
            except Exception as e:      # kept for the batch's other tests
                done[key] = e
        if isinstance(done[key], Exception):
            raise done[key]
        return done[key]
    return get


def _judged(batch, name: str) -> str:
    """The client's output of run ``name``, after both sides' exit 0 and its Final row."""
    srv, cli, sections = batch
    whole = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert (name, "client") in sections and (name, "server") in sections, whole
    (srv_rc, srv_out), (cli_rc, cli_out) = sections[name, "server"], sections[name, "client"]
    print(f"{name}: client (exit {cli_rc})\n{cli_out}\nserver (exit {srv_rc})\n{srv_out}")
    assert cli_rc == 0 and srv_rc == 0, (cli_out, srv_out)
    assert "Final:" in cli_out, cli_out
    return cli_out


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
def test_ucx_perftest(where, batches, test, choice):
    if choice in ALONE:
        batch = run_alone(where, CHOICES[choice], test, ["-t", test, *ITERS])
    else:
        batch = batches(choice, CHOICES[choice], {t: ["-t", t, *ITERS] for t in TESTS})
    out = _judged(batch, test)
    # UCX says which transports carried it: softhca's device among them (for UCX's own
    # choice on one host, beside its shared-memory ones), the chosen one when named.
    lanes = [line for line in out.splitlines() if "ep_cfg[" in line]
    assert lanes and all("/mlx5_0:1" in line for line in lanes), lanes
    want = {"rc_verbs": "rc_verbs/", "ud_verbs": "ud_verbs/",
            "ucx_default_no_shm": "rc_verbs/"}.get(choice)
    if want:
        assert all(want in line for line in lanes), lanes


# UCT level, one transport on softhca's port by name: what each transport has (UD has
# active messages only; rc_verbs has no "get short", so get is bcopy).
UCT = [("put_bw", "rc_verbs", []), ("get", "rc_verbs", ["-D", "bcopy"]),
       ("am_bw", "rc_verbs", []), ("am_bw", "ud_verbs", [])]
UCT_IDS = [f"{t}-{tl}" for t, tl, _ in UCT]


@pytest.mark.parametrize("test,tl,extra", UCT, ids=UCT_IDS)
def test_ucx_perftest_uct(batches, test, tl, extra):
    batch = batches("uct", {}, {
        name: ["-t", uct_test, *more, "-x", transport, "-d", "mlx5_0:1", *ITERS]
        for name, (uct_test, transport, more) in zip(UCT_IDS, UCT, strict=True)})
    _judged(batch, f"{test}-{tl}")
