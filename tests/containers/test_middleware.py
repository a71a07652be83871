"""The four middleware of tests/native, unmodified, between the two compose containers:
each program's server side ``docker exec``'d in the target container (10.200.0.1), its
client side in the initiator's run as a node (10.200.0.2), each served by its own
container's daemon over the UNIX socket (softhca-node; the image's environment names the
provider, softhca's libmlx5.so.1 and librdmacm.so.1), the two daemons on their wire port
4791 across the compose network.

- UCX (ucx_perftest): tag_lat, tag_bw, ucp_put_bw, ucp_get and ucp_am_bw, each once, the
  three transport choices in turn: rc_verbs (``UCX_TLS=rc_v``), ud_verbs and UCX's own
  choice (nothing set: its buffers in SysV segments first, docs/native.md "Memory
  already shared"), every choice at least once; tests/native/test_ucx.py runs every
  pairing of the five and the choices between two namespaces, which the containers'
  path (the compose network, a container's user without capabilities) does not change;
- libfabric (fi_pingpong -c): ``-e msg`` and ``-e dgram`` on ``verbs``, ``-e rdm`` on
  ``verbs;ofi_rxm``;
- iSER: tgtd with a 64 MiB LUN in the target container; iscsi-inq and iscsicheck (64 MiB
  written, read back and compared) in the initiator's;
- qperf -cm1: one RC test of each kind of work request: SEND/RECV both ways, RDMA READ,
  RDMA WRITE (the poll test: the peer polls its memory for it), compare and swap and
  fetch and add with their values verified (tests/native/test_qperf.py runs every RC
  test).

The verdicts are the programs' own, as in tests/native (exit statuses, ucx_perftest's
``Final:`` row, fi_pingpong's table, qperf's figure lines, iscsicheck's compare line);
every figure goes to the ``containers`` section of pytest's summary. One node bring-up for
the module; iterations kept small: what a run shows here is that it completes, its data
checked, between containers, not a figure to compare."""

from __future__ import annotations

import re
import subprocess

import compose_fixtures
import native
import pytest

import compose as dc

# The compose stack's fixtures (tests/support/compose_fixtures.py), by name.
stack = compose_fixtures.stack

pytestmark = pytest.mark.docker

TARGET_IP = dc.TARGET_IP


@pytest.fixture(scope="module")
def nodes(stack):
    """(target, node) for every program of the module."""
    with dc.verbs_nodes() as both:
        yield both


def _both(srv: tuple[int, str], cli: tuple[int, str]) -> str:
    return (f"--- target container (exit {srv[0]}):\n{srv[1]}\n"
            f"--- initiator container (exit {cli[0]}):\n{cli[1]}")


# -- UCX ------------------------------------------------------------------------------------

UCX_TESTS = ["tag_lat", "tag_bw", "ucp_put_bw", "ucp_get", "ucp_am_bw"]
UCX_CHOICES = {"rc_verbs": ["UCX_TLS=rc_v"], "ud_verbs": ["UCX_TLS=ud_verbs"],
               "ucx_default": []}
# The five tests, each run once on one of the choices, every choice taken.
UCX_CELLS = [("tag_lat", "rc_verbs"), ("tag_bw", "ud_verbs"), ("ucp_put_bw", "ucx_default"),
             ("ucp_get", "rc_verbs"), ("ucp_am_bw", "ud_verbs")]
# 300 + 100 warm-up operations: more than a verbs transport's send queue holds (UCX
# 1.13's RC_VERBS_TX_QUEUE_LEN and UD_VERBS_TX_QUEUE_LEN, 256), so each run wraps it.
UCX_ITERS, UCX_WARMUP = 300, 100
# ucx_perftest's last row: "Final: <iterations> <latency typical, average, overall>
# <bandwidth average, overall> <message rate average, overall>"
UCX_FINAL = re.compile(r"^Final:\s+(\d+)\s+(.*)$", re.M)


@pytest.mark.parametrize("test,choice", UCX_CELLS, ids=[f"{t}-{c}" for t, c in UCX_CELLS])
def test_ucx_perftest_between_containers(nodes, test, choice):
    target, node = nodes
    port = 13370 + UCX_TESTS.index(test) * len(UCX_CHOICES) + list(UCX_CHOICES).index(choice)
    # info: UCX names the transports each endpoint's lanes use ("ep_cfg[0]: ...").
    env = ["env", "UCX_LOG_LEVEL=info", *UCX_CHOICES[choice]]
    args = ["ucx_perftest", "-t", test, "-n", str(UCX_ITERS), "-w", str(UCX_WARMUP),
            "-p", str(port)]
    srv, cli = dc.exec_pair(target, node, [*env, *args], port,
                            client=[*env, *args, TARGET_IP], timeout=120)
    both = _both(srv, cli)
    print(f"ucx_perftest {test} {choice}\n{both}")
    assert srv[0] == 0 and cli[0] == 0, both
    final = UCX_FINAL.search(cli[1])
    assert final and int(final.group(1)) == UCX_ITERS, both
    # The lanes are on softhca's device, the transport named when one was.
    lanes = [line for line in cli[1].splitlines() if "ep_cfg[" in line]
    assert lanes and all("/mlx5_0:1" in line for line in lanes), both
    want = {"rc_verbs": "rc_verbs/", "ud_verbs": "ud_verbs/"}.get(choice)
    if want:
        assert all(want in line for line in lanes), both
    tls = sorted({m for line in lanes for m in re.findall(r"(\w+)/mlx5_0:1", line)})
    dc.report(f"ucx_perftest {test} {choice} ({'+'.join(tls)}): {final.group(0)}")


def test_ucx_buffers_in_sysv_segments_between_containers(nodes):
    """UCX's buffers in SysV segments only (``UCX_ALLOC_PRIO=md:sysv``: no fallback to
    anonymous memory), registered by programs without CAP_SYS_ADMIN or
    CAP_CHECKPOINT_RESTORE (a container's user 10001): the daemon attaches each segment
    by its shmid (docs/native.md, "Memory already shared")."""
    target, node = nodes
    for cid in (target, node):
        status = dc.exec_output(cid, ["grep", "^CapEff", "/proc/self/status"]).stdout
        assert status.split()[-1] == "0000000000000000", status
    port = 13369
    env = ["env", "UCX_LOG_LEVEL=info", "UCX_ALLOC_PRIO=md:sysv"]
    args = ["ucx_perftest", "-t", "tag_bw", "-n", str(UCX_ITERS), "-w", str(UCX_WARMUP),
            "-p", str(port)]
    srv, cli = dc.exec_pair(target, node, [*env, *args], port,
                            client=[*env, *args, TARGET_IP], timeout=120)
    both = _both(srv, cli)
    print(f"ucx_perftest tag_bw UCX_ALLOC_PRIO=md:sysv\n{both}")
    assert srv[0] == 0 and cli[0] == 0, both
    final = UCX_FINAL.search(cli[1])
    assert final and int(final.group(1)) == UCX_ITERS, both
    dc.report(f"ucx_perftest tag_bw UCX_ALLOC_PRIO=md:sysv: {final.group(0)}")


# -- libfabric ------------------------------------------------------------------------------

FI_ITERS = 100
FI_CTRL_PORT = 47592      # fi_pingpong's out-of-band control port
FI_ROW = re.compile(r"^(\S+)\s+(\d+)\s+=(\d+)\s+\S+\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s+"
                    r"([\d.]+)$", re.M)
FI_HEADER = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec"
FI_CASES = {"msg": ["-p", "verbs", "-e", "msg"],
            "rdm": ["-p", "verbs;ofi_rxm", "-e", "rdm"],
            "dgram": ["-p", "verbs", "-e", "dgram"]}


@pytest.mark.parametrize("ep", list(FI_CASES))
def test_fi_pingpong_between_containers(nodes, ep):
    """fi_pingpong's verdict: exit 0 on both sides and its table, every size with each
    message sent and acknowledged; -c checks each message's bytes on arrival."""
    target, node = nodes
    args = ["fi_pingpong", *FI_CASES[ep], "-I", str(FI_ITERS), "-c"]
    srv, cli = dc.exec_pair(target, node, args, FI_CTRL_PORT, timeout=120)
    both = _both(srv, cli)
    print(f"fi_pingpong {' '.join(FI_CASES[ep])} -I {FI_ITERS} -c\n{both}")
    for name, (rc, out) in (("target", srv), ("initiator", cli)):
        assert rc == 0, f"{name} exited {rc}:\n{both}"
        assert FI_HEADER in out, f"{name} printed no table:\n{both}"
        rows = FI_ROW.findall(out)
        # 64 bytes and up; a datagram endpoint stops at the path MTU's payload.
        assert len(rows) >= 4 and rows[0][0] == "64", f"{name}: {rows}\n{both}"
        for size, sent, acked, _t, _mbs, usec, _rate in rows:
            assert int(sent) == FI_ITERS and int(acked) == FI_ITERS, f"{name} {size}:\n{both}"
            assert float(usec) > 0, f"{name} {size}:\n{both}"
    rows = FI_ROW.findall(cli[1])
    dc.report(f"fi_pingpong -e {ep} initiator: {len(rows)} sizes, "
              + "; ".join(f"{r[0]} B {r[4]} MB/s {r[5]} us/xfer" for r in (rows[0], rows[-1])))


# -- qperf -cm1 -----------------------------------------------------------------------------

# One test per kind of work request; every RC test runs between namespaces
# (tests/native/test_qperf.py), which the containers' path does not change.
QPERF_TESTS = ["rc_bi_bw", "rc_rdma_read_bw", "rc_rdma_write_poll_lat",
               "ver_rc_compare_swap", "ver_rc_fetch_add"]
QPERF_PORT = 19765        # qperf's listen port
# -t: each test's duration. Two seconds: on a loaded machine (two cores, four busy
# processes: the two qperfs polling, the two daemons) a first completion may take longer
# than one, and qperf then computes a rate of 0 from no completion counted in time.
QPERF_SECONDS = 2
SECTION = re.compile(r"^=== (\S+)\n(.*?)^=== \1 exit (\d+)$", re.M | re.S)
QPERF_FIGURE = re.compile(r"^\s+(bw|latency|msg_rate)\s+=\s+([\d.]+) (\S+)$", re.M)


def _sections(out: str) -> dict[str, tuple[int, str]]:
    return {m.group(1): (int(m.group(3)), m.group(2)) for m in SECTION.finditer(out)}


def _script(runs: dict[str, str], tail: str = "") -> list[str]:
    """``sh -c`` of each command in turn, its output and exit status between markers."""
    lines = []
    for name, cmd in runs.items():
        lines += [f"echo '=== {name}'", f"{cmd} 2>&1", f"echo \"=== {name} exit $?\""]
    return ["sh", "-c", "\n".join(lines) + "\n" + tail]


@pytest.fixture(scope="module")
def qperf_results(nodes):
    """Every RC test, each its own ``qperf -cm1 -t 2`` run in turn from the initiator
    container (one failing does not hide the next), then ``qperf ADDR quit``."""
    target, node = nodes
    client = _script({t: f"qperf -cm1 -t {QPERF_SECONDS} {TARGET_IP} {t}"
                      for t in QPERF_TESTS},
                     f"qperf {TARGET_IP} quit >/dev/null 2>&1")
    srv, cli = dc.exec_pair(target, node, ["qperf"], QPERF_PORT, client=client,
                            timeout=len(QPERF_TESTS) * 20)
    print(f"qperf -cm1\n{_both(srv, cli)}")
    return srv, cli, _sections(cli[1])


@pytest.mark.parametrize("test", QPERF_TESTS)
def test_qperf_cm_between_containers(qperf_results, test):
    """qperf's verdict: exit 0 and its one figure line, no "failed" (qperf's word for an
    error, a ver_* test's wrong value included)."""
    srv, cli, sections = qperf_results
    assert test in sections, f"qperf {test} printed no section:\n{_both(srv, cli)}"
    status, out = sections[test]
    assert status == 0 and "failed" not in out, f"qperf {test} exit {status}:\n{out}"
    figures = QPERF_FIGURE.findall(out)
    assert len(figures) == 1 and float(figures[0][1]) > 0, out
    name, value, unit = figures[0]
    dc.report(f"qperf -cm1 -t {QPERF_SECONDS} {test}: {name} = {value} {unit}")


def test_qperf_server_ended(qperf_results):
    """`qperf ADDR quit` ended the server, which ran every test with no error of its own."""
    srv, cli, _ = qperf_results
    assert srv[0] == 0 and cli[0] == 0, _both(srv, cli)


# -- iSER: tgtd and libiscsi ----------------------------------------------------------------

ISER_TARGET = "iqn.2026-11.org.softhca:lun"
ISER_INITIATOR = "iqn.2026-11.org.softhca:client"
LUN_SIZE = 64 << 20
LUN_FILE = "/tmp/softhca-lun1.img"


@pytest.fixture(scope="module")
def iser_results(nodes):
    """tgtd in the foreground in the target container, its target set up with tgtadm: a
    64 MiB file as LUN 1, every initiator address admitted and, tgt's rule for iSER, the
    initiator's name bound; then iscsi-inq and iscsicheck in the initiator container."""
    target, node = nodes
    adm = "tgtadm --lld iser"
    server = "\n".join([
        f"rm -f {LUN_FILE} && truncate -s {LUN_SIZE} {LUN_FILE} || exit 1",
        "tgtd -f 2>&1 &",
        'echo "tgtd pid $!"',
        # tgtadm answers once tgtd's control socket is up
        f"for i in $(seq 100); do {adm} --mode sys --op show >/dev/null 2>&1 && break; "
        "sleep 0.1; done",
        f"{adm} --mode target --op new --tid 1 --targetname {ISER_TARGET} || exit 1",
        f"{adm} --mode logicalunit --op new --tid 1 --lun 1 --backing-store {LUN_FILE} "
        "|| exit 1",
        f"{adm} --mode target --op bind --tid 1 --initiator-address ALL || exit 1",
        f"{adm} --mode target --op bind --tid 1 --initiator-name {ISER_INITIATOR} || exit 1",
        f"{adm} --mode sys --op show | grep -A2 '^LLDs'",
        "echo 'tgtd ready'",
        "wait",
    ])
    srv = subprocess.Popen(["docker", "exec", target, "sh", "-c", server], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pid = None
    try:
        head = native.read_until(srv, "tgtd ready", timeout=60)
        m = re.search(r"^tgtd pid (\d+)$", head, re.M)
        pid = m and m.group(1)
        assert "tgtd ready" in head, f"tgtd's target was not set up:\n{head}"
        url = f"iser://{TARGET_IP}/{ISER_TARGET}/1"
        client = _script({
            "iscsi-inq": f"iscsi-inq -i {ISER_INITIATOR} {url}",
            "iscsicheck": f"iscsicheck {ISER_INITIATOR} {url} {LUN_SIZE >> 20} 256",
        })
        cli = dc.exec_output(node, client, timeout=180)
    finally:
        # tgtd runs until it is killed (its SIGTERM waits for sessions to end)
        if pid:
            dc.exec_output(target, ["kill", "-9", pid])
        try:
            rest, _ = srv.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            rest, _ = srv.communicate()
        dc.exec_output(target, ["rm", "-f", LUN_FILE])
    server_out = head + (rest or "")
    out = cli.stdout + cli.stderr
    print(f"--- tgtd (target container):\n{server_out}\n"
          f"--- initiators (initiator container, exit {cli.returncode}):\n{out}")
    return server_out, out, _sections(out)


def _iser_section(iser_results, name: str) -> str:
    server_out, out, sections = iser_results
    assert name in sections, f"{name} printed no section:\n{out}\n--- tgtd:\n{server_out}"
    status, text = sections[name]
    assert status == 0, f"{name} exited {status}:\n{text}\n--- tgtd:\n{server_out}"
    return text


def test_tgtd_iser_portal_is_ready(iser_results):
    server_out, _, _ = iser_results
    assert re.search(r"^\s+iser: ready$", server_out, re.M), server_out


def test_iscsi_inq_between_containers(iser_results):
    out = _iser_section(iser_results, "iscsi-inq")
    assert "Peripheral Device Type:DIRECT_ACCESS" in out, out
    product = re.search(r"^Product:(VIRTUAL-DISK.*)$", out, re.M)
    assert product, out
    dc.report(f"iscsi-inq over iSER: Peripheral Device Type:DIRECT_ACCESS, "
              f"Product:{product.group(1).strip()}")


def test_64_mib_written_read_back_and_compared_between_containers(iser_results):
    """iscsicheck writes 64 MiB of a pattern in 256 KiB WRITE(16)s (tgtd fetches the data
    with RDMA READs of the initiator container's buffers), reads it back in READ(16)s
    (tgtd RDMA WRITEs it) and compares every block with the pattern computed anew."""
    out = _iser_section(iser_results, "iscsicheck")
    wrote = re.search(rf"^.*wrote {LUN_SIZE} bytes in.*$", out, re.M)
    read = re.search(rf"^.*read {LUN_SIZE} bytes in.*$", out, re.M)
    assert wrote and read, out
    compare = f"compare ok: {LUN_SIZE // 512} blocks of 512 bytes as written"
    assert compare in out, out
    dc.report(f"iscsicheck over iSER: {wrote.group(0).strip()}; {read.group(0).strip()}; "
              f"{compare}")
