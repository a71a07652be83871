"""Debian's unmodified verbs programs on softhca through the provider (``softhca run``):
ibv_devices, ibv_devinfo and ibv_rc_pingpong, each side with its own daemon, between two
network namespaces (or on loopback where namespaces cannot be made). What is expected
comes from the programs' own output formats and from arithmetic on their arguments."""

from __future__ import annotations

import ipaddress
import itertools
import re

import native
import pytest

_ports = itertools.count(20100)
# ibv_rc_pingpong's result lines (rdma-core libibverbs/examples/rc_pingpong.c)
BYTES = re.compile(r"^(\d+) bytes in ([\d.]+) seconds = ([\d.]+) Mbit/sec$", re.M)
ITERS = re.compile(r"^(\d+) iters in ([\d.]+) seconds = ([\d.]+) usec/iter$", re.M)
WIRE_PORT = 4791


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
    r = where.run(where.server, ["ibv_devices"], port=WIRE_PORT)
    assert r.returncode == 0, r.output
    assert re.search(r"^\s+mlx5_0\s+[0-9a-f]{16}$", r.output, re.M), r.output


def test_ibv_devinfo_v(where):
    r = where.run(where.server, ["ibv_devinfo", "-v"], port=WIRE_PORT)
    assert r.returncode == 0, r.output
    out = r.output
    assert re.search(r"^hca_id:\s+mlx5_0$", out, re.M), out
    assert re.search(r"^\s+vendor_id:\s+0x02c9$", out, re.M), out
    assert re.search(r"^\s+vendor_part_id:\s+4123$", out, re.M), out
    assert re.search(r"^\s+phys_port_cnt:\s+1$", out, re.M), out
    assert re.search(r"^\s+state:\s+PORT_ACTIVE \(4\)$", out, re.M), out
    assert re.search(r"^\s+link_layer:\s+Ethernet$", out, re.M), out
    gid = expected_gid(where.server.addr, WIRE_PORT)
    assert re.search(rf"^\s+GID\[\s*0\]:\s+{re.escape(gid)}, RoCE v2$", out, re.M), (gid, out)


PINGPONG = [
    pytest.param(["-s", "64", "-n", "200"], 64, 200, id="s64-inline"),
    pytest.param(["-s", "4096", "-n", "200"], 4096, 200, id="s4096"),
    pytest.param(["-s", "65536", "-n", "100"], 65536, 100, id="s65536"),
    pytest.param(["-n", "1000"], 4096, 1000, id="n1000"),
    pytest.param(["-e", "-n", "200"], 4096, 200, id="e-channel"),
]


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
    # Each side's GID names the other's daemon.
    assert "remote address" in cli.output and "remote address" in srv.output
