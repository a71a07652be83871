"""``softhca trace`` against a running daemon, as a user runs it: a separate process.

The daemons are embedded in the test's event loop (tests/support/e2e.py), so the command runs
as a subprocess started with asyncio while the test moves traffic; its output (JSON
lines, or the text grouped per transfer) is checked against the stages the engine
goes through. The rendering is also checked on hand-made events.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys

import pytest

import softhca.client as sh
from softhca.tools import crypto_table, oracle, trace
from softhca.tools.cli import main

from e2e import SIG_CRYPTO_FLAGS, SIG_FLAGS, two_nodes, whole

TIMEOUT = 30.0
DIF_512 = sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
                                dif=sh.Mlx5SigT10Dif(bg=0xFFFF, app_tag=0x5A5A, ref_tag=0x1000,
                                                     flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
                                block_size=sh.MLX5DV_BLOCK_SIZE_512)
BLOCKS = 4


def dif_image(data: bytes) -> bytes:
    return oracle.protect_blocks(data, 512, lambda blk, b: oracle.t10dif_pi(
        blk, bg=0xFFFF, app=0x5A5A, ref=0x1000 + b))


class TraceProcess:
    """``softhca trace --target ADDRESS ...`` in a subprocess, ready once it has said it
    is attached (its subscription is in place before the test moves traffic)."""

    def __init__(self, address: str, *args: str) -> None:
        self.argv = [sys.executable, "-m", "softhca.tools.cli", "trace", "--target", address,
                     *args]
        self.proc: asyncio.subprocess.Process | None = None
        self.first_err = ""

    async def __aenter__(self) -> TraceProcess:
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self.first_err = (await asyncio.wait_for(self.proc.stderr.readline(), TIMEOUT)).decode()
        return self

    async def finish(self) -> tuple[int, str, str]:
        out, err = await asyncio.wait_for(self.proc.communicate(), TIMEOUT)
        return self.proc.returncode, out.decode(), self.first_err + err.decode()

    async def __aexit__(self, *exc) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def dif_write(p, data: bytes):
    """An RDMA_WRITE of data + T10-DIF (512B blocks) to a target MKEY whose wire domain
    is that T10-DIF: on the target, RX wire, check, strip, scatter."""
    mr = await p.target.reg_mr(len(data))
    mkey = await p.target.mkey(SIG_FLAGS, sges=whole(mr),
                               sig=sh.Mlx5SigBlockAttr(wire=DIF_512, check_mask=0xFF))
    src = await p.initiator.reg_mr(dif_image(data))
    return mkey, src


async def test_json_lines_list_each_stage_with_its_bytes(rng):
    async with two_nodes() as p:
        data = rng.randbytes(BLOCKS * 512)
        mkey, src = await dif_write(p, data)
        async with TraceProcess(p.target.node.address, "--json", "--count", "4") as tr:
            assert "attached to" in tr.first_err
            assert (await p.write(whole(src), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
            rc, out, err = await tr.finish()
    assert rc == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["stage"] for e in events] == ["wire", "check", "strip", "scatter"]
    for e in events:
        assert (e["kind"], e["op"], e["direction"], e["role"]) == \
            ("trace", "RDMA_WRITE", "RX", "responder")
        assert e["key"] == mkey.rkey and e["dev"] == "mlx5_0"
        assert e["daemon"] == p.target.node.address and isinstance(e["psn"], int)
        assert "t" not in e
        # Bytes in hex, the first 64 of them, with the whole length.
        assert e["truncated"] and len(e["data"]) == 128
    wire, check, strip, scatter = events
    assert wire["length"] == BLOCKS * 520 and scatter["length"] == BLOCKS * 512
    assert bytes.fromhex(wire["data"]) == dif_image(data)[:64]
    assert bytes.fromhex(scatter["data"]) == data[:64]
    assert (wire["stream"], scatter["stream"]) == ("wire", "memory")
    assert check["detail"]["results"] == [sh.MLX5DV_MKEY_NO_ERR] * BLOCKS
    assert check["detail"]["check_mask"] == 0xFF and strip["detail"]["pi_size"] == 8


async def test_json_max_bytes_0_gives_every_byte(rng):
    async with two_nodes() as p:
        data = rng.randbytes(BLOCKS * 512)
        mkey, src = await dif_write(p, data)
        async with TraceProcess(p.target.node.address, "--json", "--count", "4",
                                "--max-bytes", "0") as tr:
            await p.write(whole(src), mkey.rkey, 0)
            rc, out, _ = await tr.finish()
    assert rc == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert not any(e["truncated"] for e in events)
    assert bytes.fromhex(events[0]["data"]) == dif_image(data)
    assert bytes.fromhex(events[-1]["data"]) == data


async def test_text_groups_the_stages_under_one_header(rng):
    async with two_nodes() as p:
        data = rng.randbytes(BLOCKS * 512)
        mkey, src = await dif_write(p, data)
        async with TraceProcess(p.target.node.address, "--count", "4") as tr:
            await p.write(whole(src), mkey.rkey, 0)
            rc, out, err = await tr.finish()
    assert rc == 0, err
    # stdout is a pipe: no colour unless asked.
    assert "\x1b[" not in out
    lines = out.splitlines()
    qp = p.target.qp.qp_num
    assert re.fullmatch(rf"QP 0x{qp:x} RDMA_WRITE responder psn 0x[0-9a-f]+, rkey "
                        rf"0x{mkey.rkey:x}, RX  \[mlx5_0 {re.escape(p.target.node.address)}\]",
                        lines[0]), lines[0]
    stage_lines = [ln for ln in lines[1:] if re.match(r"  \S", ln)]
    assert [ln.split()[0] for ln in stage_lines] == ["wire", "check", "strip", "scatter"]
    assert re.match(rf"  wire +wire +mkey\+0x0 +{BLOCKS * 520}B$", stage_lines[0])
    assert "check_mask 0xff: blk 0 NO_ERR, blk 1 NO_ERR, blk 2 NO_ERR, blk 3 NO_ERR" in out
    assert "PI 8B per block removed" in out
    # The blocks, cut into fields: data, then guard, app tag and ref tag (REF_REMAP).
    guard = oracle.t10dif_crc(data[:512], 0xFFFF)
    assert re.search(rf"blk 0 +data 512B .* \| guard 0x{guard:04x} app 0x5a5a ref 0x00001000",
                     out)
    assert re.search(r"blk 3 +data 512B .* \| guard 0x[0-9a-f]{4} app 0x5a5a ref 0x00001003", out)


async def test_color_marks_each_field(rng):
    async with two_nodes() as p:
        mkey, src = await dif_write(p, rng.randbytes(BLOCKS * 512))
        async with TraceProcess(p.target.node.address, "--count", "4", "--color") as tr:
            await p.write(whole(src), mkey.rkey, 0)
            rc, out, _ = await tr.finish()
    assert rc == 0
    for code, text in (("33", "guard 0x"), ("32", "app 0x5a5a"), ("34", "ref 0x00001000"),
                       ("37", "data 512B")):
        assert f"\x1b[{code}m{text}" in out, text


async def test_crypto_row_c_read_shows_data_unit_tweak_and_ciphertext(rng):
    """Crypto example 2 (row C) traced: the encrypt stage with its data unit size and
    first tweak, and the wire blocks all ciphertext."""
    async with two_nodes() as p:
        key, data = crypto_table.new_key(rng, 64), rng.randbytes(BLOCKS * 512)
        mr = await p.target.reg_mr(data)
        attr = crypto_table.crypto_attr(await p.target.dek(key), True, crypto_table.BEFORE, 520)
        mkey = await p.target.mkey(SIG_CRYPTO_FLAGS, sges=whole(mr), crypto=attr,
                                   sig=sh.Mlx5SigBlockAttr(wire=crypto_table.SIG, check_mask=0xFF))
        dst = await p.initiator.reg_mr(BLOCKS * 520)
        async with TraceProcess(p.target.node.address, "--count", "4", "--blocks", "5") as tr:
            assert (await p.read(whole(dst), mkey.rkey, 0)).status == sh.IBV_WC_SUCCESS
            rc, out, err = await tr.finish()
    assert rc == 0, err
    lines = out.splitlines()
    assert re.match(r"QP 0x[0-9a-f]+ RDMA_READ responder psn 0x[0-9a-f]+, rkey 0x[0-9a-f]+, TX", lines[0])
    stage_lines = [ln for ln in lines[1:] if re.match(r"  \S", ln)]
    assert [ln.split()[0] for ln in stage_lines] == ["gather", "generate", "encrypt", "wire"]
    assert f"data_unit_size 520B, first tweak 0x{crypto_table.TWEAK:032x}" in stage_lines[2]
    assert "PI 8B per block, all generated" in stage_lines[1]
    wire_at = lines.index(stage_lines[3])
    wire_blocks = lines[wire_at + 1:]
    assert len(wire_blocks) == BLOCKS
    assert all("enc 520B" in ln and "all ciphertext" in ln for ln in wire_blocks)
    assert "app 0xbeef ref 0x00002003" in out       # the generated PI, before encryption


async def test_seconds_ends_a_quiet_trace():
    async with sh.embedded() as node:
        async with TraceProcess(node.address, "--seconds", "0.5") as tr:
            rc, out, err = await tr.finish()
    assert (rc, out) == (0, "")
    assert "stops after 0.5 s" in err


async def test_the_daemon_closing_ends_the_trace(tmp_path):
    """A `softhca serve` process stopped under the trace: the trace says so and ends."""
    ready = tmp_path / "ready"
    serve = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "softhca.tools.cli", "serve", "--listen", "127.0.0.1:0",
        "--ready-file", str(ready), "--log-level", "error",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        for _ in range(int(TIMEOUT / 0.05)):
            if ready.exists() and ready.read_text().strip():
                break
            await asyncio.sleep(0.05)
        async with TraceProcess(ready.read_text().strip()) as tr:
            assert "attached to" in tr.first_err
            serve.terminate()
            rc, out, err = await tr.finish()
    finally:
        if serve.returncode is None:
            serve.kill()
        await serve.wait()
    assert rc == 0 and out == ""
    assert "closed the connection" in err


async def test_token_file(tmp_path, rng):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    async with sh.embedded(token=b"s3cret") as node:
        async with TraceProcess(node.address, "--token-file", str(token), "--seconds",
                                "0.3") as tr:
            assert "attached to" in tr.first_err
            rc, _, _ = await tr.finish()
        assert rc == 0
        async with TraceProcess(node.address, "--seconds", "0.3") as tr:
            rc, _, err = await tr.finish()
        assert rc == 1 and "cannot attach" in err


async def test_nothing_listening_is_a_clear_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with TraceProcess(f"127.0.0.1:{port}", "--seconds", "1") as tr:
        rc, out, err = await tr.finish()
    assert rc == 1 and out == ""
    assert f"softhca trace: cannot attach to 127.0.0.1:{port}: ECONNREFUSED" in err


def test_usage_errors_return_2(tmp_path, capsys):
    assert main(["trace"]) == 2                                     # --target is required
    assert main(["trace", "--target", "x:1", "--count", "0"]) == 2
    assert main(["trace", "--target", "x:1", "--seconds", "-1"]) == 2
    assert main(["trace", "--target", "x:1", "--color", "--no-color"]) == 2
    assert main(["trace", "--target", "x:1", "--token-file", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert "--count: 0 is not a positive integer" in err
    assert "cannot read" in err


# -- the rendering, on hand-made events -----------------------------------------------

def ev(stage: str, direction: str, stream: str, data: bytes, offset: int = 0, **detail):
    return ({"t": "event", "kind": "trace", "dev": "mlx5_0", "daemon": "127.0.0.1:1",
             "qp": 0x11, "role": "requester", "wr_id": 7, "op": "SEND",
             "direction": direction, "stage": stage, "key": 0x200, "stream": stream,
             "offset": offset, "detail": detail}, data)


def crc32_image(data: bytes, tail: bytes = b"") -> bytes:
    return oracle.protect_blocks(data, 512, lambda blk, b: oracle.crc_pi(blk, 0, 0)) + tail


def test_grouping_cuts_transfers_at_their_first_and_last_stage():
    mem = crc32_image(bytes(range(256)) * 4)
    events = [
        ev("gather", "TX", "memory", mem),
        ev("check", "TX", "wire", mem[:1024], domain_pi=4, check_mask=0xF0, results=[0, 0]),
        ev("strip", "TX", "wire", bytes(1024), pi_size=4),
        ev("wire", "TX", "wire", bytes(1024)),
        # An MR's TX has a gather stage only: it ends when the next transfer starts.
        ev("gather", "TX", "memory", b"abc"),
        ev("gather", "TX", "memory", b"defg"),
    ]
    ts = trace.group_events(events)
    assert [t.names() for t in ts] == [["gather", "check", "strip", "wire"], ["gather"],
                                       ["gather"]]


def test_geometry_from_lengths_offsets_and_a_tail():
    """Blocks 2.. of an MKEY whose memory holds data + CRC32: 2 blocks and a 100-byte tail
    (plain data), starting at memory offset 2 * 516 and wire offset 2 * 512."""
    data = os.urandom(2 * 512)
    tail = os.urandom(100)
    mem = crc32_image(data, tail)
    t = trace.group_events([
        ev("gather", "TX", "memory", mem, offset=2 * 516),
        ev("strip", "TX", "wire", data + tail, offset=2 * 512, pi_size=4),
        ev("wire", "TX", "wire", data + tail, offset=2 * 512),
    ])[0]
    geo = trace.geometry(t)
    assert (geo.block, geo.pi, geo.n, geo.first) == (512, {"memory": 4, "wire": 0}, 2, 2)
    assert geo.kinds == {"memory": "crc", "wire": ""}
    text = "\n".join(trace.render_transfer(t, trace.Style(False)))
    assert re.search(r"blk 2 +data 512B .* \| crc 0x[0-9a-f]{8}", text)
    assert re.search(r"blk 3 +data 512B", text)
    assert "tail     100B" in text and "(no PI)" in text
    assert "QP 0x11 SEND requester wr_id 7, lkey 0x200, TX" in text


def test_an_8_byte_pi_that_is_a_crc64_is_shown_as_one():
    data = os.urandom(2 * 512)
    mem = oracle.protect_blocks(data, 512, lambda blk, b: oracle.crc_pi(blk, 2, 0xFFFFFFFFFFFFFFFF))
    t = trace.group_events([
        ev("gather", "TX", "memory", mem),
        ev("check", "TX", "wire", data, domain_pi=8, check_mask=0xFF, results=[0, 0]),
        ev("strip", "TX", "wire", data, pi_size=8),
        ev("wire", "TX", "wire", data),
    ])[0]
    assert trace.geometry(t).kinds["memory"] == "crc64"
    assert "| crc64 0x" in "\n".join(trace.render_transfer(t, trace.Style(False)))


def test_check_failures_are_named_per_block():
    data = os.urandom(2 * 512)
    mem = crc32_image(data)
    err = {"err_type": 1, "actual_value": 0x1234, "expected_value": 0x4321, "offset": 516}
    t = trace.group_events([
        ev("gather", "TX", "memory", mem),
        ev("check", "TX", "wire", data, domain_pi=4, check_mask=0xF0, results=[0, 1],
           error=err),
        ev("strip", "TX", "wire", data, pi_size=4),
        ev("wire", "TX", "wire", data),
    ])[0]
    text = "\n".join(trace.render_transfer(t, trace.Style(False)))
    assert ("memory PI       check_mask 0xf0: blk 0 NO_ERR, blk 1 BAD_GUARD; first error "
            "BAD_GUARD actual 0x1234 expected 0x4321 at offset 516") in text


@pytest.mark.parametrize("names, states", [
    # Row C TX: the wire stream is ciphertext from the encrypt stage on.
    (["gather", "generate", "encrypt", "wire"],
     [(False, False), (False, False), (True, True), (True, True)]),
    # Row B TX: encrypted memory, then a PI generated in the clear over the ciphertext.
    (["gather", "encrypt", "generate", "wire"],
     [(False, False), (True, True), (True, False), (True, False)]),
    # Row J TX: memory is enc(data)+SIG, stripped, then decrypted.
    (["gather", "check", "strip", "decrypt", "wire"],
     [(True, False), (True, True), (True, True), (False, False), (False, False)]),
    # Row H TX: memory is enc(data+SIG), decrypted first.
    (["gather", "decrypt", "check", "strip", "wire"],
     [(True, True)] + [(False, False)] * 4),
])
def test_which_bytes_are_ciphertext(names, states):
    t = trace.Transfer(("g",), [trace.Stage({"stage": n, "direction": "TX"}, b"")
                                for n in names])
    assert trace.cipher_states(t) == states
