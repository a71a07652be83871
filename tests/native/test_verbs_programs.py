"""Debian's unmodified verbs programs on softhca through the provider (``softhca run``):
ibv_devices, ibv_devinfo and ibv_rc_pingpong, each side with its own daemon, between two
network namespaces (or on loopback where namespaces cannot be made). What is expected
comes from the programs' own output formats and from arithmetic on their arguments."""

from __future__ import annotations

import ipaddress
import itertools
import os
import re
import struct
import subprocess
import sys
import time

import device_expect
import native
import pytest

from softhca.tools.pyverbs import path as pyverbs_path

pytestmark = pytest.mark.readme_row("`ibv_devices`, `ibv_devinfo -v`, `ibv_rc_pingpong`")

_ports = itertools.count(20100)
# ibv_rc_pingpong's result lines (rdma-core libibverbs/examples/rc_pingpong.c)
BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter$", re.M)


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable("ibv_devices", "ibv_devinfo", "ibv_rc_pingpong")
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("native")) as p:
        yield p


def expected_gid(addr: str, port: int, index: int = 0) -> str:
    """fe80::<IPv4>:<port>:<device index> as ibv_devinfo prints a GID (inet_ntop)."""
    raw = bytes.fromhex("fe80000000000000") + ipaddress.IPv4Address(addr).packed \
        + port.to_bytes(2, "big") + index.to_bytes(2, "big")
    return str(ipaddress.IPv6Address(raw))


def test_ibv_devices_lists_the_device(where):
    r = where.run(where.server, ["ibv_devices"], port=native.free_port())
    assert r.returncode == 0, r.output
    assert re.search(r"^\s+mlx5_0\s+[0-9a-f]{16}$", r.output, re.M), r.output


@pytest.mark.readme_row("`ibv_get_device_list`, `ibv_open_device`")
def test_ibv_devinfo_v(where):
    wire_port = native.free_port()
    r = where.run(where.server, ["ibv_devinfo", "-v"], port=wire_port)
    assert r.returncode == 0, r.output
    out = r.output
    assert re.search(r"^hca_id:\s+mlx5_0$", out, re.M), out
    assert re.search(r"^\s+vendor_id:\s+0x02c9$", out, re.M), out
    assert re.search(r"^\s+vendor_part_id:\s+4123$", out, re.M), out
    assert re.search(r"^\s+phys_port_cnt:\s+1$", out, re.M), out
    assert re.search(r"^\s+state:\s+PORT_ACTIVE \(4\)$", out, re.M), out
    assert re.search(r"^\s+link_layer:\s+Ethernet$", out, re.M), out
    # The node GUID: the GID's interface identifier, <IPv4>:<port>:<device index>.
    raw = ipaddress.IPv4Address(where.server.addr).packed + wire_port.to_bytes(2, "big")
    guid = ":".join(raw.hex()[i:i + 4] for i in range(0, 12, 4)) + ":0000"
    assert re.search(rf"^\s+node_guid:\s+{guid}$", out, re.M), (guid, out)
    assert re.search(rf"^\s+sys_image_guid:\s+{guid}$", out, re.M), (guid, out)
    # The same flags and attributes as softhca's pyverbs answers
    # (tests/e2e/test_device_attr.py), written down once in tests/support/device_expect.py.
    m = re.search(r"^\s+device_cap_flags:\s+0x([0-9a-fA-F]+)\n((?:\t{5}\S.*\n)*)", out, re.M)
    assert m and int(m.group(1), 16) == device_expect.FLAGS, out
    assert m.group(2).split() == list(device_expect.FLAG_NAMES), out
    m = re.search(r"^\s+device_cap_flags_ex:\s+0x([0-9a-fA-F]+)$", out, re.M)
    assert m and int(m.group(1), 16) == device_expect.FLAGS_EX, out
    for name, value in device_expect.ATTRS.items():
        m = re.search(rf"^\s+{name}:\s+(0x[0-9a-f]+|\d+)$", out, re.M)
        assert m and int(m.group(1), 0) == value, (name, value, out)
    assert re.search(r"^\s+atomic_cap:\s+ATOMIC_HCA \(1\)$", out, re.M), out
    gid = expected_gid(where.server.addr, wire_port)
    assert re.search(rf"^\s+GID\[\s*0\]:\s+{re.escape(gid)}, RoCE v2$", out, re.M), (gid, out)


PINGPONG = [
    pytest.param(["-s", "64", "-n", "200"], 64, 200, id="s64-inline"),
    pytest.param(["-s", "4096", "-n", "200"], 4096, 200, id="s4096"),
    pytest.param(["-s", "65536", "-n", "100"], 65536, 100, id="s65536"),
    pytest.param(["-n", "1000"], 4096, 1000, id="n1000"),
    pytest.param(["-e", "-n", "200"], 4096, 200, id="e-channel"),
]


@pytest.mark.readme_row("RC QPs: `ibv_create_qp`")
@pytest.mark.parametrize("args,size,iters", PINGPONG)
def test_ibv_rc_pingpong(where, args, size, iters):
    port = next(_ports)
    # -g 0: the RoCE GID (Ethernet link layer, as with rxe); -c: each side checks the
    # bytes it received against the pattern the other sent.
    common = ["ibv_rc_pingpong", "-g", "0", "-c", "-p", str(port), *args]
    srv, cli = where.pair(common, [*common, where.server.addr], port)
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{name} ({where.kind}):\n{r.output}"
        b = BYTES.search(r.output)
        it = ITERS.search(r.output)
        assert b and it, f"{name} printed no figures:\n{r.output}"
        # rc_pingpong counts each iteration's send and receive: 2 * size * iters bytes.
        assert int(b.group(1)) == 2 * size * iters, r.output
        assert int(it.group(1)) == iters, r.output
        assert float(b.group(3)) > 0, r.output
    # -c: the client checks the pages it received and says so when one is wrong
    assert "invalid data" not in cli.output, cli.output
    # Each side's GID names the other's daemon.
    assert "remote address" in cli.output and "remote address" in srv.output


def test_pyverbs_program_and_ibv_rc_pingpong(where, tmp_path):
    """softhca's pyverbs layer on the server side (rc_pingpong's exchange and ping-pong,
    written in pyverbs: tests/support/pyverbs_pingpong.py), Debian's ibv_rc_pingpong on
    the client side through the provider; each with its own daemon."""
    port, size, iters = next(_ports), 4096, 200
    wire_port = native.free_port()
    ready = tmp_path / "ready"
    serve = where.exec_argv(where.server, [
        sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
        f"{where.server.addr}:{wire_port}", "--allow-no-auth",
        "--peer-token-file", str(where.peer_token_file),
        "--ready-file", str(ready)])
    daemon = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert daemon.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        env = dict(os.environ, SOFTHCA_TARGET=f"{where.server.addr}:{wire_port}",
                   PYTHONPATH=str(pyverbs_path()))
        peer = where.exec_argv(where.server, [
            sys.executable, str(native.REPO / "tests" / "support" / "pyverbs_pingpong.py"),
            str(port), str(size), str(iters)])
        srv = subprocess.Popen(peer, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        try:
            native.wait_listening(srv, port, timeout=30)
            cli = where.run(where.client, ["ibv_rc_pingpong", "-g", "0", "-p", str(port),
                                           "-s", str(size), "-n", str(iters),
                                           where.server.addr])
            out, _ = srv.communicate(timeout=60)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.communicate()
    finally:
        daemon.terminate()
        daemon.wait(10)
    assert cli.returncode == 0, cli.output
    b = BYTES.search(cli.output)
    assert b and int(b.group(1)) == 2 * size * iters, cli.output
    assert srv.returncode == 0, out
    assert (f"pyverbs_pingpong: {iters} messages of {size} bytes received, 0 bytes differ "
            f"from 0x7b; {iters} sent") in out, out


def test_capture_sees_a_c_programs_packets(where, tmp_path):
    """The daemon's capture applies to a C program's traffic as to any: the client's
    embedded daemon writes every RoCEv2 packet it sends and accepts to a pcap."""
    port, iters = next(_ports), 20
    pcap = tmp_path / "client.pcap"
    common = ["ibv_rc_pingpong", "-g", "0", "-p", str(port), "-s", "64", "-n", str(iters)]
    srv, cli = where.pair(common, [*common, where.server.addr], port,
                          client_run_args=["--capture", str(pcap)])
    assert srv.returncode == 0 and cli.returncode == 0, srv.output + cli.output
    data = pcap.read_bytes()
    magic, _, _, _, _, _, linktype = struct.unpack("<IHHiIII", data[:24])
    assert magic == 0xA1B2C3D4 and linktype == 1, (hex(magic), linktype)  # libpcap, Ethernet
    records, pos, roce = 0, 24, 0
    while pos + 16 <= len(data):
        incl = struct.unpack("<IIII", data[pos:pos + 16])[2]
        frame = data[pos + 16:pos + 16 + incl]
        records += 1
        # Ethernet + IPv4 (20-byte header) + UDP: destination port 4791 is RoCEv2
        if len(frame) >= 38 and frame[12:14] == b"\x08\x00":
            roce += struct.unpack(">H", frame[36:38])[0] == 4791
        pos += 16 + incl
    assert pos == len(data), "the pcap ends inside a record"
    # each iteration: the client's SEND out, the server's SEND in, and their ACKs
    assert roce == records and records >= 2 * iters, (records, roce)
