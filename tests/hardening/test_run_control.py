"""``softhca run``'s TCP port, attacked from another process as from another host: the
embedded daemon takes wire links there (the peer token), and a control session only
with ``run --token-file`` and that token. Without it a control HELLO is refused EACCES
(so ``softhca faults --target`` and ``softhca trace`` get nothing), and ``run --trace``
still follows the program, through the UNIX socket. Addresses are 127.0.0.x only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys

import native
import pytest

from softhca import client as sh
from softhca.protocol.errors import RDMAError
from softhca.protocol.frames import FrameDecoder, frame_bytes

pytestmark = pytest.mark.skipif(native.unavailable() is not None,
                                reason=native.unavailable() or "")
HOST = "127.0.0.2"


@contextlib.contextmanager
def running(tmp_path, *run_args: str):
    """``softhca run --listen 127.0.0.2:PORT [run_args] -- sleep 60``, listening; its
    address. Everything it started is killed on the way out."""
    port = native.free_port()
    argv = [sys.executable, "-m", "softhca.tools.cli", "run", "--listen", f"{HOST}:{port}",
            *run_args, "--", "sleep", "60"]
    proc = native._start(argv, stderr=subprocess.STDOUT)
    try:
        native.wait_listening(proc, port, timeout=20)
        yield f"{HOST}:{port}"
    finally:
        native._reap(proc)


def faults_list(address: str, *token_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softhca.tools.cli", "faults", "--target",
                           address, *token_args, "list"], capture_output=True, text=True,
                          timeout=30, cwd=native.REPO)


async def raw_control_hello(address: str) -> dict:
    """A control HELLO that ignores what the challenge asks (no proof): the daemon's answer."""
    host, _, port = address.rpartition(":")
    r, w = await asyncio.open_connection(host, int(port))
    dec = FrameDecoder(1 << 20)
    try:
        frames: list = []
        while not frames:
            frames = dec.feed(await asyncio.wait_for(r.read(1 << 16), 10))
        w.write(frame_bytes({"t": "hello", "version": 1, "role": "control"}))
        frames = frames[1:]
        while not frames:
            data = await asyncio.wait_for(r.read(1 << 16), 10)
            assert data, "closed with no answer"
            frames = dec.feed(data)
        return frames[0].header
    finally:
        w.close()


def test_run_serves_no_control_session_on_its_tcp_port(tmp_path):
    with running(tmp_path) as address:
        h = asyncio.run(raw_control_hello(address))
        assert h["t"] == "err" and h["errno"] == "EACCES", h
        assert "token" in h["msg"] and "UNIX socket" in h["msg"], h

        async def attach():
            with pytest.raises(RDMAError) as e:
                await sh.connect(address)
            return e.value
        e = asyncio.run(attach())
        assert e.errno_name == "EACCES" and "token" in e.message, e

        out = faults_list(address)
        assert out.returncode != 0, out
        assert "EACCES" in out.stderr and "token" in out.stderr, out.stderr


def test_run_trace_still_follows_the_program(tmp_path):
    """--trace attaches through the UNIX socket: the run starts and the file is made."""
    trace = tmp_path / "trace.txt"
    argv = [sys.executable, "-m", "softhca.tools.cli", "run", "--listen", f"{HOST}:0",
            "--trace", str(trace), "--", "true"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=native.REPO)
    assert out.returncode == 0, out.stderr
    assert trace.exists()


def test_run_token_file_lets_that_token_in_and_no_other(tmp_path):
    good, bad = tmp_path / "token", tmp_path / "wrong"
    good.write_bytes(os.urandom(16).hex().encode())
    bad.write_bytes(os.urandom(16).hex().encode())
    good.chmod(0o600)
    bad.chmod(0o600)
    with running(tmp_path, "--token-file", str(good)) as address:
        ok = faults_list(address, "--token-file", str(good))
        assert ok.returncode == 0, ok.stderr
        wrong = faults_list(address, "--token-file", str(bad))
        assert wrong.returncode != 0 and "EACCES" in wrong.stderr, wrong.stderr
        none = faults_list(address)
        assert none.returncode != 0 and "EACCES" in none.stderr, none.stderr


def test_run_refuses_a_token_file_others_can_read(tmp_path):
    token = tmp_path / "token"
    token.write_bytes(b"secret")
    token.chmod(0o644)
    argv = [sys.executable, "-m", "softhca.tools.cli", "run", "--listen", f"{HOST}:0",
            "--token-file", str(token), "--", "true"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=native.REPO)
    assert out.returncode == 2, out
    assert "readable by every user" in out.stderr, out.stderr
