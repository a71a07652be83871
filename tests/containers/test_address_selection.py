"""Address selection across hosts (the address a daemon binds and advertises), between two network namespaces and
a veth pair (tests/support/netns.py): a `softhca serve` at 10.200.0.1:4791 in one, the
programs in the other, as from a host against the compose target.

- examples/two_process.py --target 10.200.0.1:4791, with no --listen: its embedded
  initiator daemon listens on the address that routes to the target (10.200.0.2), so
  the target connects back, and every check passes;
- two pyverbs QPs of one daemon reached through a forwarded port (127.0.0.1:14796 in
  the initiator's namespace, forwarded to 10.200.0.1:4791, as `docker run -p
  127.0.0.1:14796:4791` publishes one): their GIDs carry 127.0.0.1:14796, which the
  daemon cannot reach from its own namespace; the WRITE completes all the same;
- --listen 127.0.0.1 (an address the target cannot reach): the WRITE ends in
  IBV_WC_RETRY_EXC_ERR, and the completion's vendor_err (NO_RETURN_LINK) and the
  initiator's log line (peer_no_return) say that the target never connected back.

Root and `ip netns` (skipped otherwise, saying why).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import READY_TIMEOUT, two_node_topology, unavailable

import softhca

ROOT = Path(__file__).resolve().parents[2]
FORWARDED = 14796

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))

FORWARDER = """
import asyncio, sys

async def main(port, up_host, up_port):
    async def pump(r, w):
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except ConnectionError:
            pass
        w.close()

    async def forward(r, w):
        ur, uw = await asyncio.open_connection(up_host, up_port)
        await asyncio.gather(pump(r, uw), pump(ur, w))

    server = await asyncio.start_server(forward, "127.0.0.1", port)
    print("forwarding", flush=True)
    await server.serve_forever()

asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
"""


@pytest.fixture
def topology(tmp_path):
    """The namespaces, and a target daemon whose token is also its peer token (as
    examples/two_process.py expects: the embedded initiator proves the token it has)."""
    with two_node_topology(tmp_path, daemon=False) as t:
        token = tmp_path / "token"
        token.write_text(secrets.token_hex(16) + "\n")
        token.chmod(0o600)
        t.token_file = t.peer_token_file = token
        ready, t.daemon_log = tmp_path / "ready", tmp_path / "target.log"
        with open(t.daemon_log, "wb") as log:
            t.daemon = subprocess.Popen(t.exec_argv(t.target_ns, [
                sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                f"0.0.0.0:{t.port}", "--token-file", str(token), "--peer-token-file",
                str(token), "--ready-file", str(ready)]), stdout=log, stderr=subprocess.STDOUT)
        t.pids.add(t.daemon.pid)
        deadline = time.monotonic() + READY_TIMEOUT
        while not (ready.exists() and ready.read_text().strip()):
            assert t.daemon.poll() is None and time.monotonic() < deadline, \
                t.daemon_log.read_text()
            time.sleep(0.05)
        yield t


def in_initiator(t, argv: list[str], env: dict | None = None,
                 timeout: float = 90) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if k not in ("SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE", "PYTHONPATH")}
    full.update(env or {})
    proc = subprocess.Popen(t.exec_argv(t.initiator_ns, argv), cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t.pids.add(proc.pid)
    out, _ = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def test_two_process_against_another_host_needs_no_listen(topology):
    r = in_initiator(topology, [sys.executable, "examples/two_process.py", "--target",
                                topology.target, "--token-file", str(topology.token_file)])
    assert r.returncode == 0, r.stdout + topology.daemon_log.read_text()
    assert f"initiator daemon {topology.initiator_addr}:" in r.stdout, r.stdout
    assert "all checks passed" in r.stdout


def test_pyverbs_qps_of_one_daemon_reached_through_a_forwarded_port(topology, tmp_path):
    script = tmp_path / "forward.py"
    script.write_text(FORWARDER)
    fwd = subprocess.Popen(topology.exec_argv(topology.initiator_ns, [
        sys.executable, str(script), str(FORWARDED), topology.target_addr,
        str(topology.port)]), stdout=subprocess.PIPE, text=True)
    topology.pids.add(fwd.pid)
    try:
        assert fwd.stdout.readline().strip() == "forwarding"
        r = in_initiator(topology, [
            sys.executable, str(ROOT / "tests" / "support" / "pyverbs_same_daemon.py")],
            {"SOFTHCA_TARGET": f"127.0.0.1:{FORWARDED}",
             "SOFTHCA_TOKEN_FILE": str(topology.token_file),
             "PYTHONPATH": softhca.pyverbs_path()})
    finally:
        fwd.kill()
        fwd.wait()
    assert r.returncode == 0, r.stdout + topology.daemon_log.read_text()
    # Both GIDs name the forwarded port, 127.0.0.1 (7f00:0001) port 14796 (39cc).
    assert r.stdout.count("fe80:0000:0000:0000:7f00:0001:39cc:") == 2, r.stdout
    assert "completion status 0 (SUCCESS)" in r.stdout and "b'same daemon'" in r.stdout


def test_an_initiator_the_target_cannot_reach_back_is_told_why(topology):
    r = in_initiator(topology, [sys.executable, "examples/two_process.py", "--target",
                                topology.target, "--token-file", str(topology.token_file),
                                "--listen", "127.0.0.1"], timeout=120)
    assert r.returncode == 1, r.stdout
    assert "status=IBV_WC_RETRY_EXC_ERR" in r.stdout, r.stdout
    assert "vendor_err=0x5f01 (NO_RETURN_LINK: the peer's daemon never connected back" \
        in r.stdout, r.stdout
    # The initiator's own log line, naming the address the target could not reach.
    assert "event=peer_no_return" in r.stdout and "listen=127.0.0.1:" in r.stdout, r.stdout
    assert f"peer={topology.target}" in r.stdout
    # The target's side of the same story.
    assert "event=wire_out_failed peer=127.0.0.1:" in topology.daemon_log.read_text()
