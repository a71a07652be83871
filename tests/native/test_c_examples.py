"""The man pages' MKEY examples as C programs (examples/c), each side under ``softhca
run`` with its own daemon, between two network namespaces (or on loopback), through the
provider and softhca's libmlx5; then the C programs against the same exchange written in
softhca's pyverbs, both ways; and ``softhca run --trace`` showing a C program's blocks.

Each program prints the bytes it holds (``image NAME LEN HEX``), its key and tweak, and
what mlx5dv_mkey_check(3) said; what they must be is computed here, from the bytes the
other side printed: T10-DIF and CRC32 with crcmod, AES-XTS with cryptography's own XTS
mode, the tweak of data unit k being the initial tweak + k as the crypto page defines
it. The programs' own checks (their ``check`` lines and PASS) must hold as well.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

import crcmod
import native
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from softhca.tools.pyverbs import path as pyverbs_path

BUILD = native.REPO / "examples" / "c" / "build"
LIBMLX5 = native.REPO / "provider" / "build" / "libmlx5.so.1"
PYVERBS_PEER = native.REPO / "tests" / "support" / "pyverbs_dif_write.py"
PROGRAMS = ("sig_block_1", "sig_block_1_1", "sig_block_2", "sig_block_2_1", "crypto_1",
            "crypto_1_1", "crypto_2", "crypto_2_1", "crypto_row_c", "mkey_check", "dix",
            "dif_write", "cm_dif")
_ports = itertools.count(20400)
_cm_wire_ports = itertools.count(23400)

# -- what the bytes must be, computed here ------------------------------------------------

# CRC-16/T10-DIF (check 0xd0db) with the register starting at bg; crcmod's initCrc is
# the start value xored with xorOut, which is 0 here.
_T10DIF = {bg: crcmod.mkCrcFun(0x18BB7, initCrc=bg, rev=False, xorOut=0) for bg in (0, 0xFFFF)}
# The signature CRC32 seeded 0xffffffff: CRC-32/BZIP2 (check 0xfc891918).
_CRC32 = crcmod.mkCrcFun(0x104C11DB7, initCrc=0, rev=False, xorOut=0xFFFFFFFF)
assert _T10DIF[0](b"123456789") == 0xD0DB and _CRC32(b"123456789") == 0xFC891918
M32 = 0xFFFFFFFF
ERR = {"BAD_GUARD", "BAD_APPTAG", "BAD_REFTAG", "NO_ERR"}


def dif(block: bytes, b: int, bg: int, app: int, ref: int) -> bytes:
    return (_T10DIF[bg](block).to_bytes(2, "big") + app.to_bytes(2, "big")
            + ((ref + b) & M32).to_bytes(4, "big"))


def protect_dif(data: bytes, blk: int, bg: int, app: int, ref: int) -> bytes:
    return b"".join(data[i * blk:(i + 1) * blk] + dif(data[i * blk:(i + 1) * blk], i, bg, app, ref)
                    for i in range(len(data) // blk))


def protect_crc32(data: bytes) -> bytes:
    return b"".join(data[i:i + 512] + _CRC32(data[i:i + 512]).to_bytes(4, "big")
                    for i in range(0, len(data), 512))


def strip(image: bytes, blk: int, pi: int) -> bytes:
    return b"".join(image[i:i + blk] for i in range(0, len(image), blk + pi))


def xts(key: bytes, tweak: bytes, data: bytes, unit: int, encrypt: bool) -> bytes:
    """IEEE 1619 XTS-AES, data unit k with tweak initial_tweak + k (16 bytes, little
    endian), as mlx5dv_wr_set_mkey_crypto(3) increments it."""
    t0 = int.from_bytes(tweak, "little")
    out = b""
    for k, i in enumerate(range(0, len(data), unit)):
        c = Cipher(algorithms.AES(key), modes.XTS(((t0 + k) % (1 << 128)).to_bytes(16, "little")))
        ctx = c.encryptor() if encrypt else c.decryptor()
        out += ctx.update(data[i:i + unit]) + ctx.finalize()
    return out


# Row C's T10-DIF (tools/crypto_table.py's SIG, and examples/c/row_c.h's)
ROW_C = {"bg": 0, "app": 0xBEEF, "ref": 0x2000}

# -- the programs' output ------------------------------------------------------------------


@dataclass
class Out:
    text: str
    returncode: int
    images: dict[str, bytes] = field(default_factory=dict)
    mkey: dict[str, dict] = field(default_factory=dict)
    checks: list[tuple[bool, str]] = field(default_factory=list)
    key: bytes = b""
    tweak: bytes = b""

    @property
    def passed(self) -> bool:
        # the verdict is the last line of stdout (softhca run's stderr may follow it)
        verdicts = [ln for ln in self.text.splitlines() if ln in ("PASS", "FAIL")]
        return self.returncode == 0 and verdicts == ["PASS"]

    def brief(self) -> str:
        """The output with each image cut short, for an assertion message."""
        return "\n".join(ln[:120] for ln in self.text.splitlines())


def parse(done) -> Out:
    out = Out(done.output, done.returncode)
    for line in done.output.splitlines():
        if m := re.fullmatch(r"image (\S+) (\d+) ([0-9a-f]*)", line):
            data = bytes.fromhex(m.group(3))
            assert len(data) == int(m.group(2)), line[:80]
            out.images[m.group(1)] = data
        elif m := re.fullmatch(r"mkey_check (\S+) err_type=(\w+)(.*)", line):
            assert m.group(2) in ERR, line
            rec = {"err_type": m.group(2)}
            rec.update({k: int(v, 0) for k, v in re.findall(r"(\w+)=(0x[0-9a-f]+|\d+)",
                                                             m.group(3))})
            out.mkey[m.group(1)] = rec
        elif m := re.fullmatch(r"check (ok|FAILED): (.*)", line):
            out.checks.append((m.group(1) == "ok", m.group(2)))
        elif m := re.fullmatch(r"key ([0-9a-f]+)", line):
            out.key = bytes.fromhex(m.group(1))
        elif m := re.fullmatch(r"tweak ([0-9a-f]{32})", line):
            out.tweak = bytes.fromhex(m.group(1))
    return out


def assert_passed(*outs: Out) -> None:
    """Each side ended in PASS with no failed check, and between them they judged
    something (a side that only sends judges nothing)."""
    for o in outs:
        assert o.passed and all(ok for ok, _ in o.checks), o.brief()
    assert any(o.checks for o in outs), outs[0].brief()


# -- running them --------------------------------------------------------------------------

def unavailable() -> str | None:
    why = native.unavailable()
    if why:
        return why
    if not LIBMLX5.is_file():
        return (f"softhca's libmlx5 is not built ({LIBMLX5}): the C examples call mlx5dv_*, "
                "which Debian's libmlx5 answers only for its own devices")
    missing = [p for p in PROGRAMS if not (BUILD / p).is_file()]
    if missing:
        return f"examples/c is not built ({', '.join(missing)}): `make provider` builds it"
    return None


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = unavailable()
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("cex")) as p:
        yield p


def pair(where, name: str, *, server_run_args=(), client_run_args=()) -> tuple[Out, Out]:
    """The example's target (passive) on the server side, its initiator on the client."""
    port = next(_ports)
    prog = str(BUILD / name)
    srv, cli = where.pair([prog, "-p", str(port)], [prog, "-p", str(port), where.server.addr],
                          port, server_run_args=server_run_args,
                          client_run_args=client_run_args)
    return parse(srv), parse(cli)


# -- mlx5dv_wr_set_mkey_sig_block(3) -------------------------------------------------------

def test_sig_block_1(where):
    t, i = pair(where, "sig_block_1")
    assert_passed(t, i)
    mem = t.images["target_memory"]
    data = strip(mem, 512, 4)
    assert len(data) == 8 * 512 and mem == protect_crc32(data)
    # the SEND carried the data alone, CRC32s validated and stripped
    assert i.images["initiator_memory"] == data
    assert t.mkey["clean"] == {"err_type": "NO_ERR"}
    # one stored CRC32 damaged: the data still moves, a bad guard at that block
    bad = t.images["target_memory_tampered"]
    diff = [k for k in range(len(mem)) if mem[k] != bad[k]]
    assert len(diff) == 1 and diff[0] % 516 >= 512
    b = diff[0] // 516
    assert i.images["initiator_memory_again"] == data
    assert t.mkey["tampered"] == {
        "err_type": "BAD_GUARD", "actual": _CRC32(data[b * 512:(b + 1) * 512]),
        "expected": int.from_bytes(bad[b * 516 + 512:b * 516 + 516], "big"),
        "offset": b * 516}


def test_sig_block_1_1(where):
    t, i = pair(where, "sig_block_1_1")
    assert_passed(t, i)
    data = i.images["initiator_memory"]
    assert t.images["target_memory"] == protect_crc32(data)
    assert t.mkey["after_recv"]["err_type"] == "NO_ERR"


def test_sig_block_2(where):
    t, i = pair(where, "sig_block_2")
    assert_passed(t, i)
    data = t.images["target_memory"]
    assert len(data) == 4 * 4096
    assert i.images["initiator_memory"] == protect_dif(data, 4096, 0xFFFF, 0x5A5A, 0x1000)
    assert t.mkey["after_read"]["err_type"] == "NO_ERR"


def test_sig_block_2_1(where):
    t, i = pair(where, "sig_block_2_1")
    assert_passed(t, i)
    image = i.images["initiator_memory"]
    data = strip(image, 4096, 8)
    assert image == protect_dif(data, 4096, 0xFFFF, 0x5A5A, 0x1000)
    assert t.images["target_memory"] == data
    assert t.mkey["after_write"]["err_type"] == "NO_ERR"


def test_mkey_check_after_damaged_blocks(where):
    """Each image the initiator wrote is judged here: the first damaged field of the
    first damaged block is what mlx5dv_mkey_check must report, with the value computed
    from the data (actual), the one the PI held (expected) and the block's offset."""
    t, i = pair(where, "mkey_check")
    assert_passed(t, i)
    rounds = ("bad_guard", "clean", "bad_apptag", "bad_reftag")
    for name in rounds:
        image = i.images[f"initiator_memory_{name}"]
        want = {"err_type": "NO_ERR"}
        for b in range(8):
            blk, pi = image[b * 520:b * 520 + 512], image[b * 520 + 512:b * 520 + 520]
            good = dif(blk, b, 0xFFFF, 0x5A5A, 0x1000)
            if pi == good:
                continue
            # mlx5dv_mkey_check(3): guard, then app tag, then ref tag
            for kind, lo, hi in (("BAD_GUARD", 0, 2), ("BAD_APPTAG", 2, 4),
                                 ("BAD_REFTAG", 4, 8)):
                if pi[lo:hi] != good[lo:hi]:
                    want = {"err_type": kind, "actual": int.from_bytes(good[lo:hi], "big"),
                            "expected": int.from_bytes(pi[lo:hi], "big"), "offset": b * 520}
                    break
            break
        assert t.mkey[name] == want, (name, t.mkey[name], want)
    assert [t.mkey[n]["err_type"] for n in rounds] == ["BAD_GUARD", "NO_ERR", "BAD_APPTAG",
                                                       "BAD_REFTAG"]


def test_dix_interleaved_layout(where):
    t, i = pair(where, "dix")
    assert_passed(t, i)
    data = i.images["initiator_memory"]
    assert t.images["target_data_buffer"] == data
    pis = b"".join(dif(data[b * 512:(b + 1) * 512], b, 0, 0x0D1C, 7) for b in range(16))
    assert t.images["target_pi_buffer"] == pis
    assert i.images["initiator_memory_read"] == data
    assert t.mkey["after_read"]["err_type"] == "NO_ERR"
    assert t.mkey["damaged"] == {"err_type": "BAD_REFTAG", "actual": 7 + 9,
                                 "expected": 0xBAD, "offset": 9 * 520}


# -- mlx5dv_wr_set_mkey_crypto(3) ----------------------------------------------------------

def test_crypto_1(where):
    t, i = pair(where, "crypto_1")
    assert_passed(t, i)
    assert len(t.key) == 64 and t.key[:32] != t.key[32:]
    plain = i.images["initiator_memory"]
    assert t.images["target_memory"] == xts(t.key, t.tweak, plain, 512, True)
    assert t.images["target_memory"] != plain


def test_crypto_1_1(where):
    t, i = pair(where, "crypto_1_1")
    assert_passed(t, i)
    assert len(t.key) == 32
    plain = i.images["initiator_memory"]
    assert t.images["target_memory"] == xts(t.key, t.tweak, plain, 512, True)
    assert i.images["initiator_memory_back"] == plain


def test_crypto_2_row_c_read(where):
    t, i = pair(where, "crypto_2")
    assert_passed(t, i)
    data = t.images["target_memory"]
    want = xts(t.key, t.tweak, protect_dif(data, 512, **ROW_C), 520, True)
    assert i.images["initiator_memory"] == want


def test_crypto_2_1_row_c_write(where):
    t, i = pair(where, "crypto_2_1")
    assert_passed(t, i)
    sent = i.images["initiator_memory"]
    clear = xts(t.key, t.tweak, sent, 520, False)
    data = strip(clear, 512, 8)
    assert clear == protect_dif(data, 512, **ROW_C)
    assert t.images["target_memory"] == data
    assert t.mkey["after_write"]["err_type"] == "NO_ERR"
    bad = i.images["initiator_memory_tampered"]
    units = {k // 520 for k in range(len(bad)) if bad[k] != sent[k]}
    assert len(units) == 1
    u = units.pop()
    dec = xts(t.key, t.tweak, bad, 520, False)[u * 520:(u + 1) * 520]
    assert t.mkey["tampered"] == {"err_type": "BAD_GUARD", "actual": _T10DIF[0](dec[:512]),
                                  "expected": int.from_bytes(dec[512:514], "big"),
                                  "offset": u * 520}


def test_crypto_row_c_through_the_local_key(where):
    t, i = pair(where, "crypto_row_c")
    assert_passed(t, i)
    data = t.images["target_memory"]
    assert len(data) == 6 * 512
    assert i.images["wire_image"] == xts(t.key, t.tweak, protect_dif(data, 512, **ROW_C), 520,
                                         True)
    assert t.images["target_memory_rx"] == data


def test_dif_write_c_to_c(where):
    t, i = pair(where, "dif_write")
    assert_passed(t, i)
    check_dif_write(t, i)


def check_dif_write(t: Out, i: Out) -> None:
    data = i.images["initiator_memory"]
    assert t.images["target_memory"] == protect_dif(data, 512, 0xFFFF, 0x5A5A, 0x1000)
    assert i.images["initiator_memory_read"] == data
    assert i.mkey["after_write"]["err_type"] == "NO_ERR"
    assert i.mkey["after_read"]["err_type"] == "NO_ERR"


# -- rdma_cm with the program's own mlx5dv QP -----------------------------------------------

def test_crc16_t10dif_is_the_catalogued_one():
    # the catalogue's check value for "123456789" (CRC-16/T10-DIF, init 0)
    assert native.crc16_t10dif(b"123456789", 0) == 0xD0DB
    assert native.crc16_t10dif(bytes(range(256)) * 2, 0xFFFF) == _T10DIF[0xFFFF](bytes(range(256)) * 2)


def test_cm_dif_rdma_cm_with_an_mlx5dv_qp_and_a_t10dif_mkey(where):
    """cm_dif.c: rdma_cm connects a QP the program made with mlx5dv_create_qp and moves
    itself (rdma_init_qp_attr, rdma_connect / rdma_accept with qp_num, CONNECT_RESPONSE
    then rdma_establish); the initiator's T10-DIF MKEY adds a PI to each 512-byte block
    of its RDMA_WRITE. Each PI the target received is computed here: the guard a CRC16
    (0x8BB7) seeded 0xffff over the block the initiator printed, the app tag 0x5a5a,
    the ref tag 0x1000 + the block's number (REF_REMAP)."""
    if where.kind != "netns":
        pytest.skip("needs two network namespaces: both daemons listen on one wire port "
                    "(rdma_cm names a daemon by address), which two daemons on loopback "
                    "cannot")
    port, wire = next(_ports), next(_cm_wire_ports)
    prog = str(BUILD / "cm_dif")
    argv = where.argv(where.server, [prog, "-p", str(port)], port=wire)
    srv = native._start(argv, stderr=subprocess.STDOUT)
    try:
        # the target's daemon up; the initiator tries again while the program's
        # rdma_listen is still to come (a REJ)
        native.wait_listening(srv, wire, timeout=30)
        cli = where.run(where.client, [prog, "-p", str(port), where.server.addr], port=wire)
        out, _ = srv.communicate(timeout=native.PROGRAM_TIMEOUT)
    finally:
        native._reap(srv)
    t, i = parse(_Done(out, srv.returncode)), parse(cli)
    assert_passed(t, i)
    for o in (t, i):
        assert re.search(r"^qp 0x[0-9a-f]{6} by mlx5dv_create_qp on mlx5_\d+$", o.text, re.M), \
            o.brief()
    assert "connect request from qp" in t.text and "connect response from qp" in i.text
    data = i.images["initiator_memory"]
    got = t.images["target_memory"]
    assert len(data) == 8 * 512 and len(got) == 8 * 520
    for b in range(8):
        block, pi = data[b * 512:(b + 1) * 512], got[b * 520 + 512:(b + 1) * 520]
        assert got[b * 520:b * 520 + 512] == block, b
        assert int.from_bytes(pi[:2], "big") == native.crc16_t10dif(block, 0xFFFF), (b, pi.hex())
        assert int.from_bytes(pi[2:4], "big") == 0x5A5A, (b, pi.hex())
        assert int.from_bytes(pi[4:], "big") == 0x1000 + b, (b, pi.hex())
    assert i.images["initiator_memory_read"] == data
    assert i.mkey["after_write"] == {"err_type": "NO_ERR"}
    assert i.mkey["after_read"] == {"err_type": "NO_ERR"}


# -- C and pyverbs on one wire --------------------------------------------------------------

class PyverbsSide:
    """tests/support/pyverbs_dif_write.py on one side, on a `softhca serve` of that side
    (the pyverbs layer's daemon, given by SOFTHCA_TARGET), which proves the same peer
    token as the C side's daemon."""

    def __init__(self, where, side, tmp_path) -> None:
        self.where, self.side = where, side
        self.wire_port = native.free_port()
        ready = tmp_path / f"ready-{self.wire_port}"
        argv = where.exec_argv(side, [
            sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
            f"{side.addr}:{self.wire_port}", "--allow-no-auth",
            "--peer-token-file", str(where.peer_token_file), "--ready-file", str(ready)])
        self.daemon = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert self.daemon.poll() is None and time.monotonic() < deadline, "no daemon"
            time.sleep(0.05)
        self.env = dict(os.environ, SOFTHCA_TARGET=f"{side.addr}:{self.wire_port}",
                        PYTHONPATH=str(pyverbs_path()))

    def start(self, args: list[str]) -> subprocess.Popen:
        argv = self.where.exec_argv(self.side, [sys.executable, str(PYVERBS_PEER), *args])
        return subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def close(self) -> None:
        self.daemon.terminate()
        self.daemon.wait(10)


@dataclass
class _Done:
    output: str
    returncode: int


def _finish(proc: subprocess.Popen) -> _Done:
    try:
        out, _ = proc.communicate(timeout=native.PROGRAM_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            out, _ = proc.communicate()
    return _Done(out, proc.returncode)


def test_c_initiator_with_the_mkey_against_a_pyverbs_target(where, tmp_path):
    """dif_write.c's initiator owns the T10-DIF wire MKEY; the target is the pyverbs
    program with a plain MR, on its own daemon in the other namespace."""
    port = next(_ports)
    py = PyverbsSide(where, where.server, tmp_path)
    try:
        srv = py.start(["-p", str(port)])
        try:
            native.wait_listening(srv, port, timeout=30)
            cli = where.run(where.client, [str(BUILD / "dif_write"), "-p", str(port),
                                           where.server.addr])
        finally:
            t = parse(_finish(srv))
    finally:
        py.close()
    i = parse(cli)
    assert "role target (pyverbs)" in t.text and "role initiator" in i.text
    assert_passed(t, i)
    check_dif_write(t, i)


def test_pyverbs_initiator_with_the_mkey_against_a_c_target(where, tmp_path):
    """The reverse: the pyverbs program's initiator owns the MKEY, dif_write.c is the
    target under softhca run."""
    port = next(_ports)
    py = PyverbsSide(where, where.client, tmp_path)
    try:
        argv = where.argv(where.server, [str(BUILD / "dif_write"), "-p", str(port)])
        srv = native._start(argv, stderr=subprocess.STDOUT)
        try:
            native.wait_listening(srv, port, timeout=30)
            i = parse(_finish(py.start(["-p", str(port), where.server.addr])))
            out, _ = srv.communicate(timeout=native.PROGRAM_TIMEOUT)
        finally:
            native._reap(srv)
    finally:
        py.close()
    t = parse(_Done(out, srv.returncode))
    assert "role target" in t.text and "role initiator (pyverbs)" in i.text
    assert_passed(t, i)
    check_dif_write(t, i)


# -- softhca run --trace ------------------------------------------------------------------

def test_trace_shows_a_c_programs_blocks(where, tmp_path):
    """The target's daemon traces sig_block_2's RDMA_READ of the MKEY as it traces a
    Python program's: the TX transfer through the MKEY's key, a generate stage of 8-byte
    PIs, and each block's T10-DIF cut into guard, app tag and ref tag, the values
    computed here from the memory the program printed."""
    trace = tmp_path / "trace.txt"
    t, i = pair(where, "sig_block_2", server_run_args=["--trace", str(trace)])
    assert_passed(t, i)
    text = trace.read_text()
    data = t.images["target_memory"]
    rkey = int(re.search(r"^mkey lkey 0x[0-9a-f]+ rkey (0x[0-9a-f]+)", t.text, re.M).group(1), 16)
    # the transfer's header names the READ it answered and the MKEY's key, TX
    assert re.search(rf"^QP 0x[0-9a-f]+ RDMA_READ responder psn 0x[0-9a-f]+, rkey 0x{rkey:x}, TX",
                     text, re.M), text[:3000]
    assert re.search(r"^  generate wire\s+mkey\+0x0\s+16416B\s+PI 8B per block", text, re.M), text[:3000]
    for b in (0, 3):    # the first blocks and the last are shown
        pi = dif(data[b * 4096:(b + 1) * 4096], b, 0xFFFF, 0x5A5A, 0x1000)
        line = (rf"^\s+blk {b}\s+data 4096B [0-9a-f .]+\| guard 0x{pi[:2].hex()} "
                rf"app 0x{pi[2:4].hex()} ref 0x{pi[4:].hex()}$")
        assert re.search(line, text, re.M), (line, text[:4000])
