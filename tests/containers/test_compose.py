"""Two nodes in real containers: docker/compose.yaml run for real.

The images are built offline (``docker/build-images.sh``, the ``make images`` target),
then compose starts the target at 10.200.0.1 and, once its HEALTHCHECK reports healthy,
the initiator at 10.200.0.2, which runs the two-node suite (tests/twonode) inside its
container. Then the host itself plays the initiator (its embedded daemon on the bridge's
address, 10.200.0.254) against the target container while the test kills, partitions,
and pauses it, and asserts what verbs promise: RETRY_EXC_ERR then WR_FLUSH_ERR within the
bound ``timeout`` and ``retry_cnt`` give when the target is gone for longer than that
budget, and every WR completing SUCCESS exactly once, byte-exact, with retransmissions,
when it comes back within it. Teardown is ``down -v``, and the last test checks that no
container, network or volume of ours is left (images may stay).

Skipped, with the reason, where no Docker engine answers; the network-namespace topology
(tests/containers/test_twonode_netns.py) stays the fallback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import compose_cm as cm
import compose_fixtures
import native
import pytest

import softhca.client as sh

import compose as dc
from e2e import rdma, sge
from twonode import remote

# The compose stack's fixtures (tests/support/compose_fixtures.py), by name.
stack = compose_fixtures.stack
target_up = compose_fixtures.target_up

pytestmark = pytest.mark.docker

# ibv_qp_attr.timeout is an exponent: the ACK timeout is 4.096 us * 2^timeout (IBTA
# 9.7.6.1.3); after retry_cnt retransmissions the next expiry completes RETRY_EXC_ERR.
SHORT_TIMEOUT, SHORT_RETRIES = 14, 3       # 67 ms per try: a budget of 4 x 67 = 268 ms
PATIENT_TIMEOUT, PATIENT_RETRIES = 16, 7   # 268 ms per try: a budget of 8 x 268 = 2.1 s


def ack_timeout_s(exponent: int) -> float:
    return 4.096e-6 * (1 << exponent)


def retry_budget_s(exponent: int, retry_cnt: int) -> float:
    return (retry_cnt + 1) * ack_timeout_s(exponent)


# Scheduling, the docker CLI's own latency and the time the kernel takes to report a dead
# peer: what may pass beyond the verbs bound before the completion is seen here.
SLACK_S = 1.5


def passed_count(out: str) -> int:
    m = re.findall(r"(\d+) passed", out)
    return int(m[-1]) if m else 0


# -- the compose run ------------------------------------------------------------------------

def test_two_node_suite_inside_the_initiator_container(stack):
    start = time.monotonic()
    r = dc.compose("up", "--exit-code-from", "initiator", timeout=600, check=False)
    elapsed = time.monotonic() - start
    out = r.stdout + r.stderr
    dc.report("docker-compose ps:")
    dc.report("  " + dc.compose("ps").stdout.strip().replace("\n", "\n  "))
    for line in dc.addresses():
        dc.report(f"  address: {line}")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    summary = [line.split("|", 1)[-1].strip(" =") for line in plain.splitlines()
               if re.search(r"\d+ (passed|failed)", line)]
    dc.report(f"two-node suite in the initiator container: {summary[-1] if summary else '?'} "
              f"({elapsed:.0f} s with start-up)")
    assert r.returncode == 0, out[-4000:]
    assert passed_count(out) >= 34 and " failed" not in out, out[-4000:]
    addrs = " ".join(dc.addresses())
    assert dc.TARGET_IP in addrs and dc.INITIATOR_IP in addrs, addrs


def test_man_page_examples_against_every_target_at_once(stack):
    dc.compose("--profile", "scale", "up", "-d", "--scale", "extra-target=3", "target",
               "extra-target")
    try:
        cids = dc.container_ids("target", "extra-target")
        assert len(cids) == 4
        dc.wait_healthy(cids)
        start = time.monotonic()
        r = dc.compose("--profile", "scale", "run", "--rm", "-e",
                       f"SOFTHCA_TARGET={dc.TARGET},extra-target:4791", "initiator",
                       "-m", "twonode", "tests/twonode/test_examples.py",
                       "-p", "no:cacheprovider", timeout=600, check=False)
        out = r.stdout + r.stderr
        headers = re.findall(r"softhca two-node: target (\S+),", out)
        n = passed_count(out)
        dc.report(f"man page examples from one initiator against {len(headers)} targets "
                  f"({', '.join(headers)}): {n} passed in {time.monotonic() - start:.0f} s")
        assert r.returncode == 0, out[-4000:]
        assert len(headers) == 4, out[-3000:]
        assert n > 0 and n % 4 == 0 and " failed" not in out, out[-3000:]
    finally:
        dc.compose("--profile", "scale", "rm", "-s", "-f", "extra-target", check=False)


# -- node loss, driven from the host ------------------------------------------------------------

# -- Debian's verbs programs, unmodified, from the initiator container to the target's ----

TARGET_IP = dc.TARGET_IP
# ibv_rc_pingpong's result lines (rdma-core libibverbs/examples/rc_pingpong.c)
PP_BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
PP_ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter$", re.M)
# perftest's result row: "#bytes #iterations BW peak BW average ..."
PERF_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", re.M)


@pytest.fixture(scope="class")
def verbs_nodes(stack):
    """One pair of nodes for TestVerbsPrograms (a node bring-up is some ten seconds),
    made for the class and removed after it, before the tests that stop the target.
    A module-level fixture: pytest deprecates a class-scoped fixture written as a method."""
    with dc.verbs_nodes() as nodes:
        yield nodes


class TestVerbsPrograms:
    """The programs below on one pair of nodes (the fixture verbs_nodes)."""

    def test_ibv_rc_pingpong_between_containers(self, verbs_nodes):
        """Debian's ibv_rc_pingpong, unmodified, each side exec'd in its container and served
        by that container's daemon over its UNIX socket; -c: each side checks the bytes it
        received against the pattern the other sent."""
        target, node = verbs_nodes
        size, iters, port = 4096, 1000, 18515
        prog = ["ibv_rc_pingpong", "-g", "0", "-c", "-s", str(size), "-n", str(iters),
                "-p", str(port)]
        (src, sout), (crc, cout) = dc.exec_pair(target, node, prog, port)
        for name, rc, out in (("target", src, sout), ("initiator", crc, cout)):
            assert rc == 0, f"{name}:\n{out}"
            b, it = PP_BYTES.search(out), PP_ITERS.search(out)
            assert b and it, f"{name} printed no figures:\n{out}"
            # Each iteration's send and receive: 2 * size * iters bytes.
            assert int(b.group(1)) == 2 * size * iters and int(it.group(1)) == iters, out
            dc.report(f"ibv_rc_pingpong {name} container: {b.group(0)}; {it.group(0)}")
        assert "invalid data" not in cout and "invalid data" not in sout, cout + sout
        # The target's GID, as the initiator's program read it, carries the target daemon's
        # address: fe80::<IPv4>:<port>:<device index>, printed by inet_ntop.
        gid = ipaddress.IPv6Address(bytes.fromhex("fe80" + "00" * 6) + ipaddress.IPv4Address(
            TARGET_IP).packed + (4791).to_bytes(2, "big") + bytes(2))
        assert f"GID {gid}" in cout, cout


    def test_ib_write_bw_between_containers(self, verbs_nodes):
        """perftest's ib_write_bw, unmodified, initiator container to target container; it
        links libmlx5.so.1, which the image's LD_LIBRARY_PATH makes softhca's."""
        target, node = verbs_nodes
        for cid in (target, node):
            r = dc.exec_output(cid, ["ldd", "/usr/bin/ib_write_bw"])
            assert "libmlx5.so.1 => /opt/softhca-provider/libmlx5.so.1" in r.stdout, r.stdout
        size, iters, port = 65536, 1000, 18516
        prog = ["ib_write_bw", "-s", str(size), "-n", str(iters), "-p", str(port)]
        (src, sout), (crc, cout) = dc.exec_pair(target, node, prog, port)
        assert src == 0, f"target:\n{sout}"
        assert crc == 0, f"initiator:\n{cout}"
        rows = [m for m in PERF_ROW.finditer(cout) if int(m.group(1)) == size]
        assert rows, f"ib_write_bw printed no row for {size} bytes:\n{cout}"
        assert int(rows[0].group(2)) == iters and float(rows[0].group(4)) > 0, cout
        dc.report(f"ib_write_bw initiator container: {rows[0].group(0).strip()}")


    def test_rdma_cm_programs_between_containers(self, verbs_nodes):
        """rdmacm-utils (rping, ucmatose, udaddy, rdma_server / rdma_client) and perftest's -R,
        unmodified, server in the target container and client in the initiator's, through
        softhca's librdmacm.so.1 and each container's daemon as the CM (compose_cm.py). One
        node bring-up for all; every program is run and judged, then the failures told."""
        target, node = verbs_nodes
        for cid in (target, node):
            r = dc.exec_output(cid, ["ldd", "/usr/bin/rping"])
            assert "librdmacm.so.1 => /opt/softhca-provider/librdmacm.so.1" in r.stdout, r.stdout
        checks = {
            "rping": lambda: cm.check_rping(target, node, 100),
            "ucmatose": lambda: cm.check_ucmatose(target, node),
            "udaddy": lambda: cm.check_udaddy(target, node),
            "rdma_server/rdma_client": lambda: cm.check_rdma_server_client(target, node),
            "ib_write_bw -R": lambda: [cm.check_perftest(target, node, "ib_write_bw", 65536,
                                                         "7177")],
            "ib_send_lat -R": lambda: [cm.check_perftest(target, node, "ib_send_lat", 64,
                                                         "7178")],
        }
        failed = {}
        for name, check in checks.items():
            start = time.monotonic()
            try:
                lines = check()
            except AssertionError as e:
                failed[name] = str(e)
                dc.report(f"{name} between containers: FAILED")
                continue
            dc.report(f"{name} between containers ({time.monotonic() - start:.1f} s): "
                      + " | ".join(line.strip() for line in lines))
        assert not failed, "\n\n".join(f"== {k}\n{v}" for k, v in failed.items())


# -- the user's own program, from the bind-mounted directory --------------------------------

    def test_own_program_from_the_user_directory_between_containers(self, verbs_nodes):
        """A program of one's own, built on this host and put in SOFTHCA_USER_DIR, runs in both
        containers from /mnt/user with nothing set: examples/c/cm_dif.c (rdma_cm, its own
        mlx5dv QP, a T10-DIF MKEY) compiled with cc, the target in the target container and
        the initiator in the initiator's naming 10.200.0.1. The PIs the target received are
        computed here from the data the initiator printed."""
        assert native.crc16_t10dif(b"123456789", 0) == 0xD0DB      # the catalogue's check value
        why = host_build_unavailable()
        if why:
            pytest.skip(why)
        target, node = verbs_nodes
        prog = dc.USER_DIR / "cm_dif"
        dc.run(["cc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-o", str(prog),
                str(EXAMPLES_C / "cm_dif.c"), str(EXAMPLES_C / "cex.c"),
                "-lmlx5", "-libverbs", "-lrdmacm"], check=True)
        prog.chmod(0o755)
        port = "7190"
        for cid in (target, node):
            r = dc.exec_output(cid, ["ls", "-l", "/mnt/user/cm_dif"])
            assert r.returncode == 0, r.stdout + r.stderr
        srv = subprocess.Popen(["docker", "exec", target, "/mnt/user/cm_dif", "-p", port],
                               text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            # the initiator tries again while the target's rdma_listen is still to come
            cli = dc.exec_output(node, ["/mnt/user/cm_dif", "-p", port, dc.TARGET_IP],
                                 timeout=120)
            out, _ = srv.communicate(timeout=120)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.communicate()
        both = f"--- target:\n{out[-3000:]}\n--- initiator:\n{(cli.stdout + cli.stderr)[-3000:]}"
        assert srv.returncode == 0 and out.splitlines()[-1] == "PASS", both
        assert cli.returncode == 0 and cli.stdout.splitlines()[-1] == "PASS", both
        assert "check FAILED" not in out + cli.stdout, both
        data, got = image(cli.stdout, "initiator_memory"), image(out, "target_memory")
        assert len(data) == 8 * 512 and len(got) == 8 * 520
        for b in range(8):
            block, pi = data[b * 512:(b + 1) * 512], got[b * 520 + 512:(b + 1) * 520]
            assert got[b * 520:b * 520 + 512] == block, b
            assert pi == (native.crc16_t10dif(block, 0xFFFF).to_bytes(2, "big") + b"\x5a\x5a"
                          + (0x1000 + b).to_bytes(4, "big")), (b, pi.hex())
        assert image(cli.stdout, "initiator_memory_read") == data
        tries = re.search(r"established after (\d+) connect", cli.stdout)
        dc.report("own program (/mnt/user/cm_dif) between containers: 8 T10-DIF blocks as "
                  f"computed here, established after {tries.group(1) if tries else '?'} connect(s)")

EXAMPLES_C = dc.ROOT / "examples" / "c"


def host_build_unavailable() -> str | None:
    """Why a binary built on this host may not run in the images, or None. The images are
    Debian 12 (bookworm): a program linked against a newer glibc or libibverbs would not
    load there (docker/README.md says how to build inside the image instead)."""
    if shutil.which("cc") is None:
        return "no C compiler on this host (docker/README.md: building inside the image)"
    for h in ("infiniband/mlx5dv.h", "rdma/rdma_cma.h"):
        if not Path("/usr/include", h).is_file():
            return f"no <{h}> on this host (libibverbs-dev, librdmacm-dev)"
    try:
        release = dict(line.split("=", 1) for line in
                       Path("/etc/os-release").read_text().splitlines() if "=" in line)
    except OSError:
        release = {}
    if release.get("VERSION_CODENAME", "").strip('"') != "bookworm":
        return ("this host is not Debian 12 (bookworm), the images' release: a binary built "
                "here may not load in them (docker/README.md: building inside the image)")
    return None


def image(out: str, name: str) -> bytes:
    m = re.search(rf"^image {name} (\d+) ([0-9a-f]*)$", out, re.M)
    assert m, out[-3000:]
    data = bytes.fromhex(m.group(2))
    assert len(data) == int(m.group(1))
    return data


async def _pair(*, timeout: int, retry_cnt: int):
    return remote.remote_two_nodes(dc.TARGET, connect_kw={"timeout": timeout,
                                                          "retry_cnt": retry_cnt})


async def _docker(*argv: str) -> float:
    """Run a docker command off the event loop; the seconds it took."""
    start = time.monotonic()
    await asyncio.to_thread(dc.run, ["docker", *argv], check=True)
    return time.monotonic() - start


async def _stream_until_error(pair, src: sh.MR, dst: sh.MR, *, chunk: int, depth: int,
                              event: asyncio.Event, stop_after: float = 30.0):
    """RDMA_WRITEs, ``depth`` outstanding, until a completion is not SUCCESS. Returns the
    completions in order and the time the first error arrived."""
    i = pair.initiator
    slots = dst.length // chunk
    wcs: list[sh.WC] = []
    posted = 0
    first_error_at = None
    deadline = time.monotonic() + stop_after
    while time.monotonic() < deadline:
        while posted - len(wcs) < depth and first_error_at is None:
            off = (posted % slots) * chunk
            await i.qp.post_send(rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, chunk, off)], dst.rkey,
                                      dst.addr + off, wr_id=posted,
                                      send_flags=sh.IBV_SEND_SIGNALED))
            posted += 1
            if posted == depth * 2:
                event.set()         # the stream is running: the test may strike now
        got = await i.scq.poll(num_entries=depth, timeout=0.5)
        for wc in got:
            wcs.append(wc)
            if wc.status != sh.IBV_WC_SUCCESS and first_error_at is None:
                first_error_at = time.monotonic()
        if first_error_at is not None and len(wcs) == posted:
            break
    return wcs, posted, first_error_at


async def test_lose_the_target_mid_stream_then_restart_it(target_up):
    cid = target_up
    bound = retry_budget_s(SHORT_TIMEOUT, SHORT_RETRIES)
    async with await _pair(timeout=SHORT_TIMEOUT, retry_cnt=SHORT_RETRIES) as pair:
        src = await pair.initiator.reg_mr(1 << 20)
        await src.write(os.urandom(1 << 20))
        dst = await pair.target.reg_mr(1 << 20, sh.IBV_ACCESS_LOCAL_WRITE
                                       | sh.IBV_ACCESS_REMOTE_WRITE)
        running = asyncio.Event()
        stream = asyncio.ensure_future(_stream_until_error(pair, src, dst, chunk=16384,
                                                           depth=32, event=running))
        await asyncio.wait_for(running.wait(), 30)
        await _docker("kill", cid)
        killed_at = time.monotonic()
        wcs, posted, first_error_at = await stream
    statuses = [w.status for w in wcs]
    assert len(wcs) == posted and sorted(w.wr_id for w in wcs) == list(range(posted))
    n_ok = statuses.index(sh.IBV_WC_RETRY_EXC_ERR)
    # Every WR outstanding at the loss: the oldest RETRY_EXC_ERR, the rest flushed.
    assert statuses[:n_ok] == [sh.IBV_WC_SUCCESS] * n_ok
    assert statuses[n_ok + 1:] == [sh.IBV_WC_WR_FLUSH_ERR] * (posted - n_ok - 1)
    assert posted - n_ok >= 2, "the target was lost with fewer than two WRs outstanding"
    waited = first_error_at - killed_at
    dc.report(f"lose the target: {n_ok} SUCCESS, 1 RETRY_EXC_ERR, {posted - n_ok - 1} "
              f"WR_FLUSH_ERR; RETRY_EXC_ERR {waited * 1000:.0f} ms after docker kill "
              f"(bound {bound * 1000:.0f} ms + {SLACK_S:g} s slack)")
    assert waited <= bound + SLACK_S

    # The target comes back: new QPs carry traffic again, byte-exact.
    start = time.monotonic()
    await _docker("start", cid)
    await asyncio.to_thread(dc.wait_healthy, [cid])
    async with await _pair(timeout=SHORT_TIMEOUT, retry_cnt=SHORT_RETRIES) as pair:
        data = os.urandom(256 * 1024)
        src = await pair.initiator.reg_mr(len(data))
        await src.write(data)
        dst = await pair.target.reg_mr(len(data), sh.IBV_ACCESS_LOCAL_WRITE
                                       | sh.IBV_ACCESS_REMOTE_WRITE)
        wc = await pair.write([sge(src)], dst.rkey, dst.addr)
        assert wc.status == sh.IBV_WC_SUCCESS
        assert await dst.read(len(data)) == data
    dc.report(f"  restarted: healthy and a new QP pair wrote 256 KiB byte-exact in "
              f"{time.monotonic() - start:.1f} s")


async def _interrupted_writes(pair, interrupt, resume, *, n: int = 24, chunk: int = 8192,
                              hold: float) -> tuple[list[sh.WC], bytes, bytes, float]:
    """Cut the target off (``interrupt``), post ``n`` writes, hold, ``resume``; the
    completions, what was sent, what arrived, and how long the target was away."""
    data = os.urandom(n * chunk)
    src = await pair.initiator.reg_mr(len(data))
    await src.write(data)
    dst = await pair.target.reg_mr(len(data), sh.IBV_ACCESS_LOCAL_WRITE
                                   | sh.IBV_ACCESS_REMOTE_WRITE)
    away = time.monotonic()
    await interrupt()
    await pair.initiator.qp.post_send([
        rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, chunk, k * chunk)], dst.rkey, dst.addr + k * chunk,
             wr_id=k, send_flags=sh.IBV_SEND_SIGNALED) for k in range(n)])
    await asyncio.sleep(hold)
    await resume()
    away = time.monotonic() - away
    wcs = await pair.initiator.scq.poll_n(n, 60)
    extra = await pair.initiator.scq.poll(num_entries=4, timeout=0.3)
    return wcs + extra, data, await dst.read(len(data)), away


def _net_cut(cid: str):
    async def cut():
        await _docker("network", "disconnect", dc.network_name(), cid)

    async def heal():
        await _docker("network", "connect", "--ip", dc.TARGET_IP, dc.network_name(), cid)
    return cut, heal


def _freeze(cid: str):
    async def pause():
        await _docker("pause", cid)

    async def unpause():
        await _docker("unpause", cid)
    return pause, unpause


@pytest.mark.parametrize("how", ["partition", "pause"])
async def test_short_outage_every_wr_succeeds_exactly_once(target_up, how):
    cid = target_up
    budget = retry_budget_s(PATIENT_TIMEOUT, PATIENT_RETRIES)
    hold = 0.6          # plus the docker commands' own time: well under the 2.1 s budget
    cut, heal = _net_cut(cid) if how == "partition" else _freeze(cid)
    # The outage is the test's input: it must end inside the retry budget.
    # On a slow engine `docker pause` / `unpause` alone can outlast it; such
    # a try says nothing about softhca, so the outage is made again on a new
    # pair, up to three times.
    for attempt in range(1, 4):
        async with await _pair(timeout=PATIENT_TIMEOUT, retry_cnt=PATIENT_RETRIES) as pair:
            before = (await pair.initiator.node.counters())["retransmissions"]
            wcs, sent, arrived, away = await _interrupted_writes(pair, cut, heal, hold=hold)
            retrans = (await pair.initiator.node.counters())["retransmissions"] - before
        dc.report(f"short {how} (try {attempt}): target away {away * 1000:.0f} ms "
                  f"(budget {budget * 1000:.0f} ms), {len(wcs)} completions, "
                  f"retransmissions {retrans}")
        if away < budget:
            break
    assert away < budget, (f"docker made no outage shorter than the "
                           f"{budget * 1000:.0f} ms budget in three tries")
    assert sorted((w.wr_id, w.status) for w in wcs) == [
        (k, sh.IBV_WC_SUCCESS) for k in range(24)]
    assert arrived == sent
    assert retrans > 0


async def test_long_partition_ends_in_retry_exceeded(target_up):
    cid = target_up
    budget = retry_budget_s(SHORT_TIMEOUT, SHORT_RETRIES)
    cut, heal = _net_cut(cid)
    async with await _pair(timeout=SHORT_TIMEOUT, retry_cnt=SHORT_RETRIES) as pair:
        src = await pair.initiator.reg_mr(4096)
        dst = await pair.target.reg_mr(4096, sh.IBV_ACCESS_LOCAL_WRITE
                                       | sh.IBV_ACCESS_REMOTE_WRITE)
        await cut()
        try:
            posted_at = time.monotonic()
            await pair.initiator.qp.post_send([
                rdma(sh.IBV_WR_RDMA_WRITE, [sge(src, 1024)], dst.rkey, dst.addr, wr_id=k,
                     send_flags=sh.IBV_SEND_SIGNALED) for k in range(3)])
            wcs = await pair.initiator.scq.poll_n(3, budget + 10)
            waited = time.monotonic() - posted_at
        finally:
            await heal()
    dc.report(f"long partition: RETRY_EXC_ERR after {waited * 1000:.0f} ms "
              f"(budget {budget * 1000:.0f} ms), then WR_FLUSH_ERR x2")
    assert [(w.wr_id, w.status) for w in wcs] == [
        (0, sh.IBV_WC_RETRY_EXC_ERR), (1, sh.IBV_WC_WR_FLUSH_ERR), (2, sh.IBV_WC_WR_FLUSH_ERR)]
    assert budget * 0.9 <= waited <= budget + SLACK_S


def test_teardown_leaves_nothing_of_ours(stack):
    dc.compose("--profile", "scale", "down", "-v", "--remove-orphans")
    containers, networks = dc.leftovers()
    ps = dc.run(["docker", "ps", "-a", "--format", "{{.Names}}"]).stdout.split()
    nets = dc.run(["docker", "network", "ls", "--format", "{{.Name}}"]).stdout.split()
    dc.report(f"after down -v: docker ps -a: {ps or 'nothing'}; docker network ls: {nets}")
    assert containers == [] and networks == []
    assert not any(n.startswith(dc.PROJECT) for n in ps + nets)
