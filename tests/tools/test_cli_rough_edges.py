"""The command line's rough edges: Ctrl-C, what serve refuses at
start-up, a mistyped option of a subcommand, ports out of range, the bench's words, the
fault rules' opcode names, addresses in the trace, and an unreadable token file."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import softhca.client as sh
from softhca.protocol.opcodes import NAMES
from softhca.server.faults import OPCODE_FAMILIES, validate_rule
from softhca.tools.cli import main

CLI = [sys.executable, "-m", "softhca.tools.cli"]


# -- Ctrl-C --------------------------------------------------------------------------

def interrupt(args: list[str], marker: str | None, delay: float = 0.0,
              timeout: float = 60) -> tuple[int, str]:
    """Run ``softhca ARGS`` as a terminal runs a foreground job (a process group of its
    own), wait for ``marker`` on its stdout (then ``delay`` s), and send SIGINT to the
    whole group, as Ctrl-C does; its exit status and stderr."""
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        if marker is not None:
            for line in proc.stdout:
                if marker in line:
                    break
            else:
                pytest.fail(f"softhca {' '.join(args)} ended before printing {marker!r}")
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


@pytest.mark.parametrize("args, marker, delay", [
    # The demo prints each example's heading as it starts it: interrupted mid-run.
    (["demo"], "[2/20]", 0.0),
    (["demo", "faults"], "[1/", 0.0),
    # The bench starts two `softhca serve` processes and its helpers, then measures.
    (["bench", "--quick"], None, 4.0),
    # 2,000 repeats take about a minute: the Ctrl-C at 3 s always finds it running
    # (100 took 2.96 s on a loaded machine, and the bench ended before its Ctrl-C).
    (["bench", "engine", "--repeat", "2000"], None, 3.0),
    (["soak", "--seconds", "60"], None, 3.0),
])
def test_ctrl_c_ends_a_command_with_one_line_and_status_130(args, marker, delay):
    status, err = interrupt(args, marker, delay)
    assert (status, err) == (130, f"softhca {args[0]}: interrupted\n")


def test_ctrl_c_leaves_no_process_of_the_bench_behind(tmp_path):
    """The bench's daemons and helpers run in sessions of their own (a Ctrl-C reaches the
    bench alone) and the bench ends them on its way out."""
    before = _children_of_any_softhca()
    status, _ = interrupt(["bench", "--quick"], None, 4.0)
    assert status == 130
    deadline = time.monotonic() + 10
    while (left := _children_of_any_softhca() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"still running: {left}"


def _children_of_any_softhca() -> set[str]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "softhca.tools.bench " in cmd or "softhca.tools.cli serve" in cmd:
                out.add(f"{d.name}: {cmd}")
    return out


# -- serve refuses at start what would fail later ---------------------------------------

@pytest.mark.parametrize("args, said", [
    (["--max-frame", "10"], "--max-frame 10 is too small: at least 65536"),
    (["--max-frame", "65535"], "--max-frame 65535 is too small: at least 65536"),
    (["--hca", "mlx5_0", "--hca", "mlx5_0"], "--hca mlx5_0 is given 2 times"),
    (["--hca", "mlx5_0", "--hca", "mlx5_1", "--hca", "mlx5_1"], "--hca mlx5_1 is given 2"),
    (["--hca", "bad name!"], "--hca 'bad name!' is not a device name"),
    (["--hca", "a/b"], "--hca 'a/b' is not a device name"),
    (["--hca", ".."], "--hca '..' is not a device name"),
    (["--hca", ""], "--hca '' is not a device name"),
    (["--hca", "x" * 64], "is not a device name: 1 to 63"),
    (["--listen", "127.0.0.1:99999"], "port 99999 is out of range (0 to 65535"),
    (["--listen", "127.0.0.1:65536"], "port 65536 is out of range"),
])
def test_serve_refuses_at_start_up(args, said, capsys):
    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("softhca serve: ") and said in err, err


def test_serve_accepts_the_limits_themselves(tmp_path):
    """The smallest --max-frame, a 63-byte name and two distinct devices serve."""
    ready = tmp_path / "ready"
    name = "d" * 63
    proc = subprocess.Popen([*CLI, "serve", "--listen", "127.0.0.1:0", "--ready-file",
                             str(ready), "--max-frame", "65536", "--hca", "mlx5_0",
                             "--hca", name], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "slow"

        async def devices() -> list[str]:
            async with await sh.connect(ready.read_text().strip()) as node:
                return node.devices

        assert asyncio.run(devices()) == ["mlx5_0", name]
    finally:
        proc.terminate()
        proc.wait(10)


# -- a subcommand's own usage, a client's port out of range ----------------------------

@pytest.mark.parametrize("argv, usage, extra", [
    (["serve", "--lisen", "1"], "usage: softhca serve ", "--lisen 1"),
    (["faults", "list", "--target", "h:1", "--jsn"], "usage: softhca faults ", "--jsn"),
    (["bench", "engine", "--repeet", "2"], "usage: softhca bench engine ", "--repeet 2"),
    (["bench", "--quik"], "usage: softhca bench ", "--quik"),
    (["demo", "--onyl"], "usage: softhca demo ", "--onyl"),
])
def test_a_mistyped_option_shows_its_subcommands_usage(argv, usage, extra, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert err.endswith(f"error: unrecognized arguments: {extra}\n"), err


@pytest.mark.parametrize("command", [["trace"], ["capture", "--out", "x.pcap"],
                                     ["faults", "list"]])
def test_a_targets_port_out_of_range_is_a_usage_error(command, capsys):
    assert main([*command, "--target", "127.0.0.1:99999"]) == 2
    assert "port 99999 is out of range" in capsys.readouterr().err


def test_bench_names_engine_not_a_target(capsys):
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert "[engine | goals]" in out and "TARGET" not in out, out


# -- fault rules list whole opcode names ----------------------------------------------

def test_a_bad_opcode_is_answered_with_whole_opcode_names():
    with pytest.raises(sh.RDMAError) as e:
        validate_rule({"action": "drop", "opcode": "RDMA_WRTE"})
    listed = set(re.findall(r"\b[A-Z][A-Z_]+[A-Z]\b", e.value.message.split("not valid:")[1]))
    # Every IBTA RC opcode name softhca carries, and the families, and nothing else: no
    # fragment such as RDMA_WRITE_LAST_WITH or COMPARE.
    assert listed == set(NAMES) | set(OPCODE_FAMILIES), listed ^ (set(NAMES) | set(OPCODE_FAMILIES))
    for fragment in ("RDMA_WRITE_LAST_WITH", "COMPARE", "FETCH", "ATOMIC", "SEND_ONLY_WITH"):
        with pytest.raises(sh.RDMAError):
            validate_rule({"action": "drop", "opcode": fragment})


# -- the trace's addresses -----------------------------------------------------------

async def test_trace_labels_each_address_it_prints():
    """A WRITE into a plain MR: the wire stage's address is the one the RETH named
    (``reth va``, in hex), the scatter's its offset from the MR's first byte (``mr+``);
    a RECV's wire stage is at the receive SGE's address (``sge va``); a gather from an
    MR is at its offset in it. Each expected value is worked out here from the MRs'
    addresses and the WRs' SGEs."""
    async with sh.embedded() as node:
        trace = await asyncio.create_subprocess_exec(
            *CLI, "trace", "--target", node.address, "--count", "6", "--no-color",
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        ca, cb = await node.open_device("mlx5_0"), await node.open_device("mlx5_0")
        pa, pb = await ca.alloc_pd(), await cb.alloc_pd()
        cqa, cqb = await ca.create_cq(8), await cb.create_cq(8)
        qa = await pa.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cqa, rcq=cqa))
        qb = await pb.create_qp(sh.QPInitAttr(qp_type=sh.IBV_QPT_RC, scq=cqb, rcq=cqb))
        await qa.connect(qb.info())
        await qb.connect(qa.info())
        src = await pa.reg_mr(4096, sh.IBV_ACCESS_LOCAL_WRITE)
        dst = await pb.reg_mr(8192, sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE)
        # The trace says when it has subscribed; the transfer comes after.
        attached = await asyncio.wait_for(trace.stdout.readline(), 30)
        assert b"softhca trace: attached to" in attached, attached
        wr = sh.SendWR(wr_id=1, opcode=sh.IBV_WR_RDMA_WRITE, sg=[sh.SGE(src.addr, 5, src.lkey)])
        wr.set_wr_rdma(dst.rkey, dst.addr + 0x1230)
        await qa.post_send(wr)
        assert (await cqa.poll(timeout=5.0))[0].status == sh.IBV_WC_SUCCESS
        await qb.post_recv(sh.RecvWR(wr_id=2, sg=[sh.SGE(dst.addr + 0x40, 64, dst.lkey)]))
        await qa.post_send(sh.SendWR(wr_id=3, opcode=sh.IBV_WR_SEND,
                                     sg=[sh.SGE(src.addr + 8, 7, src.lkey)]))
        assert (await cqa.poll(timeout=5.0))[0].status == sh.IBV_WC_SUCCESS
        out, _ = await asyncio.wait_for(trace.communicate(), 30)
    text = out.decode()
    stages = [ln.split(None, 2) for ln in text.splitlines() if re.match(r"  \S", ln)]
    where = [(name, rest.rsplit(None, 1)[0].strip()) for name, _stream, rest in stages]
    assert where == [("gather", "mr+0x0"),
                     ("wire", f"reth va 0x{dst.addr + 0x1230:x}"), ("scatter", "mr+0x1230"),
                     ("gather", "mr+0x8"),
                     ("wire", f"sge va 0x{dst.addr + 0x40:x}"), ("scatter", "mr+0x40")], text


# -- a token file the daemon's uid cannot read -------------------------------------------

@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root and setpriv(1) to run the daemon as another uid")
def test_an_unreadable_token_file_names_the_daemons_uid():
    """As in the daemon's container: a secret owned by root, mode 0600, and the daemon
    running as uid 10001 (docker/Dockerfile)."""
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        token = Path(d) / "token"
        token.write_text("secret\n")
        os.chmod(token, 0o600)
        r = subprocess.run(["setpriv", "--reuid", "10001", "--regid", "10001",
                            "--clear-groups", *CLI, "serve", "--token-file", str(token)],
                           capture_output=True, text=True, timeout=30,
                           env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"softhca serve: cannot read --token-file {token}: "
                               "Permission denied (this daemon runs as uid 10001"), r.stderr
    assert "owned by uid 0, gid 0, mode 0600" in r.stderr, r.stderr


def test_serve_help_says_what_strict_blocks_refuses(capsys):
    """The sentence used to end "a transfer through it as a misaligned one is"."""
    assert main(["serve", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert ("a signature MKEY's layout at configure (EINVAL), and a transfer through it "
            "that is not whole blocks, which fails as one with a misaligned start does "
            "(docs/blocks.md)") in text, text
    assert "as a misaligned one is" not in text
