"""ibv_query_device(3) attributes a kernel device keeps fixed: the node GUID survives a
restart of the same daemon configuration and differs between daemons at different
addresses; device_cap_flags are the daemon's, the same through both Python clients.

Expected values are computed here: the GUID from the rule docs/native.md gives (the
interface identifier of the device's GID fe80::<IPv4>:<port>:<device index>), the
flags and attributes from tests/support/device_expect.py (rdma-core's verbs.h values and
the daemon's documented defaults)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

from device_expect import ATOMIC_CAP, ATTRS, FLAGS, FLAGS_EX

import softhca.client as sh

# One daemon, two devices, on a fixed address; prints what each device's
# ibv_query_device says.
_QUERY = """
import asyncio, json, sys
import softhca.client as sh
from softhca.server.daemon import Daemon

async def main(host, port):
    d = Daemon(("mlx5_0", "mlx5_1"), host, port, None)
    await d.start()
    try:
        node = await sh.connect(d.address)
        out = {}
        for name in ("mlx5_0", "mlx5_1"):
            a = await (await node.open_device(name)).query_device()
            out[name] = [a["node_guid"], a["device_cap_flags"], a["device_cap_flags_ex"]]
        await node.close()
    finally:
        await d.close()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(host: str, port: int, hashseed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=hashseed)
    r = subprocess.run([sys.executable, "-c", _QUERY, host, str(port)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _guid(ip: str, port: int, index: int) -> int:
    return int.from_bytes(socket.inet_aton(ip) + port.to_bytes(2, "big")
                          + index.to_bytes(2, "big"), "big")


def test_node_guid_survives_a_restart_and_differs_between_hosts():
    port = _free_port()
    # The same configuration in two processes whose string hashes differ.
    first = _query("127.0.0.1", port, "1")
    again = _query("127.0.0.1", port, "2")
    assert first == again
    assert first["mlx5_0"][0] == _guid("127.0.0.1", port, 0) == 0x7F000001 << 32 | port << 16
    assert first["mlx5_1"][0] == _guid("127.0.0.1", port, 1)
    # Another host (another address) with the same device names and port.
    other = _query("127.0.0.2", port, "1")
    assert other["mlx5_0"][0] == _guid("127.0.0.2", port, 0) != first["mlx5_0"][0]
    for name in ("mlx5_0", "mlx5_1"):
        assert first[name][1] == FLAGS
        assert first[name][2] == FLAGS_EX


def test_wildcard_daemon_guid_comes_from_the_host_name(monkeypatch):
    from softhca.server import device_attr

    guids = {}
    for host in ("node-a", "node-b"):
        monkeypatch.setattr(socket, "gethostname", lambda h=host: h)
        device_attr.node_guid.cache_clear()
        guids[host] = device_attr.node_guid("0.0.0.0", 4791, 1)
        ip = hashlib.sha256(b"softhca node " + host.encode()).digest()[:4]
        assert guids[host] == int.from_bytes(ip, "big") << 32 | 4791 << 16 | 1
    device_attr.node_guid.cache_clear()
    assert guids["node-a"] != guids["node-b"]


async def test_device_cap_flags_through_the_client():
    async with sh.embedded(("mlx5_0",)) as node:
        a = await (await node.open_device("mlx5_0")).query_device()
        assert a["device_cap_flags"] == FLAGS
        assert a["device_cap_flags_ex"] == FLAGS_EX
        assert a["node_guid"] == _guid("127.0.0.1", node.daemon.port, 0)


def test_device_cap_flags_through_pyverbs():
    """pyverbs' Context in a process of its own, against a daemon at a known address:
    the flags and attributes tests/native/test_verbs_programs.py expects of the provider
    (tests/support/device_expect.py), and sys_image_guid equal to node_guid."""
    port = _free_port()
    script = """
import json, sys
from softhca.client.pyverbs.device import Context
with Context(name="mlx5_0") as ctx:
    a = ctx.query_device()
    x = ctx.query_device_ex()
    print(json.dumps([a.device_cap_flags, x.device_cap_flags_ex, a.node_guid,
                      a.sys_image_guid, a.atomic_caps,
                      {n: getattr(a, n) for n in sys.argv[1:]}]))
"""
    serve = subprocess.Popen(
        [sys.executable, "-m", "softhca.tools.cli", "serve", "--listen", f"127.0.0.1:{port}",
         "--allow-no-auth"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        env = dict(os.environ, SOFTHCA_TARGET=f"127.0.0.1:{port}")
        env.pop("SOFTHCA_TOKEN_FILE", None)
        for _ in range(100):
            r = subprocess.run([sys.executable, "-c", script, *ATTRS], env=env, capture_output=True,
                               text=True, timeout=60)
            if r.returncode == 0 or "Connection refused" not in r.stderr:
                break
            time.sleep(0.1)
        assert r.returncode == 0, r.stderr
        flags, flags_ex, guid, sys_guid, atomic, attrs = json.loads(
            r.stdout.strip().splitlines()[-1])
    finally:
        serve.terminate()
        serve.wait(timeout=30)
    assert flags == FLAGS
    assert flags_ex == FLAGS_EX
    assert guid == sys_guid == _guid("127.0.0.1", port, 0)
    assert atomic == ATOMIC_CAP
    assert attrs == ATTRS
