"""iSER, unmodified, on softhca: tgt's target daemon (``tgtd``, Debian's tgt) in one
network namespace and libiscsi's initiators (Debian's libiscsi-bin, and iscsicheck, a
libiscsi program of ours: provider/tests/iscsicheck.c) in the other, each side under
``softhca run``, their rdma_cm our librdmacm. tgtd binds its iSER portal on 0.0.0.0 and
on `::` (AFONLY), as it does on a kernel device; the initiators connect to the server's
IPv4 address with an iser:// URL.

One server process runs tgtd in the foreground and sets its target up with tgtadm on
tgtd's own control socket (``-C``: a port of its own, so no other tgtd on this machine
answers), a 64 MiB file as LUN 1, every initiator address admitted and, tgt's rule for
iSER, the initiator's name bound. One client process runs each program in turn, its
output and exit status between markers. Each verdict is the program's own: iscsi-inq's
and iscsi-readcapacity16's exit 0 and what they report (the LUN's size is the file's),
iscsicheck's compare line after 64 MiB written and read back, iscsi-perf's figures."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import native
import pytest

pytestmark = pytest.mark.readme_row("iSER: tgt 1.0.85")

PROGRAMS = ("tgtd", "tgtadm", "iscsi-inq", "iscsi-readcapacity16", "iscsi-perf")
ISCSICHECK = native.REPO / "provider" / "build" / "iscsicheck"
CM_LIB = native.REPO / "provider" / "build" / "librdmacm.so.1"
WIRE = 23861             # both daemons' wire port (rdma_cm: one port per fabric)
TARGET = "iqn.2026-11.org.softhca:lun"
INITIATOR = "iqn.2026-11.org.softhca:client"
SIZE = 64 << 20
SECTION = re.compile(r"^=== (\S+)\n(.*?)^=== \1 exit (\d+)$", re.M | re.S)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable(*PROGRAMS)
    if why:
        pytest.skip(why)
    for built in (CM_LIB, ISCSICHECK):
        if not built.is_file():
            pytest.skip(f"{built} is not built: `make provider` builds it (iscsicheck "
                        "needs libiscsi-dev's header)")
    with native.place(tmp_path_factory.mktemp("iser")) as p:
        if p.kind != "netns":
            pytest.skip("needs two network namespaces: the two daemons' rdma_cm shares "
                        "one wire port, which two daemons on loopback cannot")
        yield p


def _server_script(tmp, control: int) -> str:
    lun = tmp / "lun1.img"
    with open(lun, "wb") as f:
        f.truncate(SIZE)
    adm = f"tgtadm -C {control} --lld iser"
    script = tmp / "tgtd.sh"
    script.write_text("\n".join([
        "#!/bin/sh",
        f"tgtd -f -C {control} 2>&1 &",
        # tgtadm answers once tgtd's control socket is up
        f"for i in $(seq 50); do {adm} --mode sys --op show >/dev/null 2>&1 && break; "
        "sleep 0.1; done",
        f"{adm} --mode target --op new --tid 1 --targetname {TARGET} || exit 1",
        f"{adm} --mode logicalunit --op new --tid 1 --lun 1 --backing-store {lun} || exit 1",
        f"{adm} --mode target --op bind --tid 1 --initiator-address ALL || exit 1",
        f"{adm} --mode target --op bind --tid 1 --initiator-name {INITIATOR} || exit 1",
        f"{adm} --mode sys --op show | grep -A2 '^LLDs'",
        "echo 'tgtd ready'",
        "wait",
    ]) + "\n")
    script.chmod(0o755)
    return str(script)


def _client_script(tmp, addr: str) -> str:
    url = f"iser://{addr}/{TARGET}/1"
    runs = {
        "iscsi-inq": f"iscsi-inq -i {INITIATOR} {url}",
        "iscsi-readcapacity16": f"iscsi-readcapacity16 -i {INITIATOR} {url}",
        "iscsicheck": f"{ISCSICHECK} {INITIATOR} {url} {SIZE >> 20} 256",
        # iscsi-perf runs until interrupted: 4 s of 4 KiB READs, 10 in flight
        "iscsi-perf": f"timeout -s INT 4 iscsi-perf -i {INITIATOR} -m 10 {url}",
    }
    lines = ["#!/bin/sh"]
    for name, cmd in runs.items():
        lines += [f"echo '=== {name}'", f"{cmd} 2>&1", f"echo \"=== {name} exit $?\""]
    script = tmp / "initiators.sh"
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture(scope="module")
def results(where, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("iser-run")
    tmp.chmod(0o755)
    control = 1000 + os.getpid() % 30000
    argv = where.argv(where.server, ["sh", _server_script(tmp, control)], port=WIRE)
    srv = native._start(argv, stderr=subprocess.STDOUT)
    try:
        head = native.read_until(srv, "tgtd ready", timeout=30)
        assert "tgtd ready" in head, f"tgtd's target was not set up:\n{head}"
        cli = where.run(where.client, ["sh", _client_script(tmp, where.server.addr)],
                        port=WIRE, timeout=90)
    finally:
        # tgtd runs until it is killed (its SIGTERM waits for sessions to end)
        try:
            os.killpg(srv.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        rest, _ = srv.communicate(timeout=20)
    server_out = head + (rest or "")
    sections = {m.group(1): (int(m.group(3)), m.group(2)) for m in SECTION.finditer(cli.output)}
    print(f"--- tgtd (server):\n{server_out}\n--- initiators (client):\n{cli.output}")
    return server_out, cli, sections


def _section(results, name: str) -> tuple[int, str]:
    server_out, cli, sections = results
    assert name in sections, (f"{name} printed no section (client exit {cli.returncode}):"
                              f"\n{cli.output}\n--- tgtd:\n{server_out}")
    return sections[name]


def test_tgtd_iser_portal_is_ready(results):
    """tgtd's iSER driver is `ready`: its portal's binds on 0.0.0.0 and `::` both took."""
    server_out, _, _ = results
    assert re.search(r"^\s+iser: ready$", server_out, re.M), server_out


def test_iscsi_inq(results):
    status, out = _section(results, "iscsi-inq")
    assert status == 0, out
    assert "Peripheral Device Type:DIRECT_ACCESS" in out, out
    assert re.search(r"^Product:VIRTUAL-DISK", out, re.M), out


def test_iscsi_readcapacity16(results):
    """The LUN's capacity is the backing file's: 64 MiB of 512-byte blocks, the last
    LBA 131071."""
    status, out = _section(results, "iscsi-readcapacity16")
    assert status == 0, out
    assert f"RETURNED LOGICAL BLOCK ADDRESS:{SIZE // 512 - 1}" in out, out
    assert "LOGICAL BLOCK LENGTH IN BYTES:512" in out, out
    assert f"Total size:{SIZE}" in out, out


def test_64_mib_written_read_back_and_compared(results):
    """iscsicheck writes 64 MiB of a pattern in 256 KiB WRITE(16)s (tgtd fetches the
    data with RDMA READs of the initiator's buffers), reads it back in READ(16)s (tgtd
    RDMA WRITEs it) and compares every block with the pattern computed anew."""
    status, out = _section(results, "iscsicheck")
    assert status == 0, out
    assert f"wrote {SIZE} bytes in" in out and f"read {SIZE} bytes in" in out, out
    assert f"compare ok: {SIZE // 512} blocks of 512 bytes as written" in out, out


def test_iscsi_perf(results):
    """iscsi-perf logs in and reads until interrupted (timeout's SIGINT: it prints
    "finished." and timeout reports 124), printing its figures each second."""
    status, out = _section(results, "iscsi-perf")
    assert "Login Failed" not in out, out
    assert status == 124, out
    assert "capacity is 131072 blocks or 67108864 byte (64 MB)" in out, out
    rates = [int(v) for v in re.findall(r"iops average (\d+)", out)]
    assert rates and rates[-1] > 0, out


def test_no_cm_message_refused(results):
    """Each of the four programs disconnects and destroys its id while tgtd does the
    same: the DREQs cross, and a DREP (or DREQ) comes for an id already gone. The IB CM
    drops such a DREP and answers such a DREQ without a word; neither daemon's log may
    say it refused a CM message."""
    server_out, cli, _ = results
    for name, out in (("tgtd's daemon", server_out), ("the initiators' daemon", cli.output)):
        assert "CM message refused" not in out, f"{name}:\n{out}"
