"""``softhca serve`` as a process: start-up, a client session, SIGTERM.

The daemon runs in a subprocess, as a deployment runs it; the test talks to it
through softhca.client only.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import softhca.client as sh

from e2e import make_side, whole


def start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                             "127.0.0.1:0", "--ready-file", str(ready), *args],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not ready.exists() or not ready.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"softhca serve did not start: {proc.stderr.read()}")
        time.sleep(0.05)
    return proc, ready.read_text().strip()


async def test_serve_sigterm_flushes_outstanding_wrs_and_closes(tmp_path):
    proc, address = start(tmp_path, "--hca", "mlx5_0", "--hca", "mlx5_1")
    try:
        async with await sh.connect(address) as node:
            assert node.devices == ["mlx5_0", "mlx5_1"]
            side = await make_side(node)
            # A QP in RTR towards nobody: its posted receives stay outstanding.
            await side.qp.connect(sh.QPInfo("127.0.0.1", 9, "mlx5_0", 0x99))
            await side.qp.post_recv([sh.RecvWR(wr_id=n, sg=whole(await side.reg_mr(64)))
                                     for n in (1, 2)])
            poll = asyncio.ensure_future(side.rcq.poll(num_entries=4, timeout=15))
            await asyncio.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            wcs = await poll
            assert [(w.wr_id, w.status) for w in wcs] == [(1, sh.IBV_WC_WR_FLUSH_ERR),
                                                          (2, sh.IBV_WC_WR_FLUSH_ERR)]
            with pytest.raises(sh.RDMAError) as e:
                for _ in range(50):
                    await side.ctx.alloc_pd()
                    await asyncio.sleep(0.05)
            assert e.value.errno_name == "ECONNRESET"
        assert proc.wait(10) == 0
        log = proc.stderr.read()
        assert "event=listen" in log and "event=shutdown" in log and "event=stopped" in log
        assert "event=no_auth" in log, "a daemon without a token says so at start-up"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_refuses_a_public_address_without_a_token():
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                        "0.0.0.0:0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "without a token" in r.stderr


async def test_serve_with_a_token(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)      # serve refuses a token file every user can read
    proc, address = start(tmp_path, "--token-file", str(token))
    try:
        async with await sh.connect(address, token=b"s3cret") as node:
            ctx = await node.open_device()
            assert (await ctx.query_device())["max_sge"] >= 1
        with pytest.raises(sh.RDMAError) as e:
            await sh.connect(address, token=b"wrong")
        assert e.value.errno_name == "EACCES"
        with pytest.raises(sh.RDMAError) as e:
            await sh.connect(address)
        assert e.value.errno_name == "EACCES"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_serve_help_lists_the_options():
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "serve", "--help"],
                       capture_output=True, text=True, timeout=30, env={**os.environ})
    assert r.returncode == 0
    for opt in ("--listen", "--hca", "--token-file"):
        assert opt in r.stdout


def faults_cli(address: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softhca.tools.cli", "faults", *args,
                           "--target", address], capture_output=True, text=True, timeout=30)


def test_faults_from_a_file_and_from_the_command_line(tmp_path):
    rules = tmp_path / "faults.json"
    rules.write_text('[{"action": "drop", "qp": 17, "probability": 0.5, "seed": 7}]')
    proc, address = start(tmp_path, "--faults", str(rules))
    try:
        r = faults_cli(address, "list")
        assert r.returncode == 0, r.stderr
        assert "rule 1   fired 0" in r.stdout and "action=drop" in r.stdout
        assert "packets_bad_icrc 0" in r.stdout and "retransmissions 0" in r.stdout
        r = faults_cli(address, "add", "--daemon-wide", "action=corrupt", "opcode=RDMA_WRITE",
                       "block=3", "block_size=520", "field=guard", "xor=0x1")
        assert r.returncode == 0 and r.stdout.startswith("rule 2 installed"), r.stderr
        r = faults_cli(address, "add", "--daemon-wide", "action=corrupt", "block=3",
                       "block_size=520", "field=colour")
        assert r.returncode == 1 and "EINVAL" in r.stderr and "field='colour'" in r.stderr
        r = faults_cli(address, "list", "--json")
        listed = json.loads(r.stdout)
        assert [x["id"] for x in listed["rules"]] == [1, 2]
        assert listed["rules"][1]["icrc"] == "recompute", "defaults are shown"
        r = faults_cli(address, "clear", "id=1")
        assert r.returncode == 0 and "1 rule(s) cleared" in r.stdout
        r = faults_cli(address, "clear", "id=1")
        assert r.returncode == 1 and "ENOENT" in r.stderr
        r = faults_cli(address, "clear")
        assert "1 rule(s) cleared" in r.stdout
        assert "no fault rules" in faults_cli(address, "list").stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_serve_refuses_a_malformed_faults_file(tmp_path):
    rules = tmp_path / "faults.json"
    rules.write_text('[{"action": "drop"}, {"action": "corrupt", "block": 2}]')
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                        "127.0.0.1:0", "--faults", str(rules)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2
    assert "rule 2" in r.stderr and "block_size" in r.stderr


async def test_faults_fields_may_follow_the_target():
    async with sh.embedded() as node:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "softhca.tools.cli", "faults", "add", "--daemon-wide",
            "--target", node.address, "action=drop", "probability=0.5", "seed=3",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err
        (rule,) = await node.faults.list()
        assert (rule["action"], rule["probability"], rule["seed"]) == ("drop", 0.5, 3)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "softhca.tools.cli", "faults", "list", "--target",
            node.address, "--bogus", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 2 and b"unrecognized arguments: --bogus" in err
