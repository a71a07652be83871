"""The ``softhca`` command line: the demo's verdicts and the bench's JSON.

The demo runs every example between two embedded daemons over TCP and judges what
crossed the wire against its own oracle (crcmod, cryptography's XTS), so these tests
check that every example is run and passes, that the output shows the daemons and
the packets, and that a broken engine (patched here: the daemons run in this
process) or a disagreeing oracle really makes it FAIL. The bench is only checked
for shape: speeds are never compared, they depend on the machine.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from softhca.engine import backend, signature, transfer
from softhca.engine.hca import DEK
from softhca.protocol.address import split_address
from softhca.protocol.packets import Packet
from softhca.tools import harness
from softhca.tools.cli import main

EXAMPLE_NAMES = [
    "sig_block 1", "sig_block 1.1", "sig_block 2", "sig_block 2.1",
    "crypto 1", "crypto 1.1", "crypto 2", "crypto 2.1",
    *(f"crypto row {r}" for r in "ABCDEFGHIJ"),
    "mkey_configure list", "mkey_configure interleaved",
]
BENCH_ROWS = {
    "T10-DIF generate, 512B blocks",
    "CRC32C generate, 4096B blocks",
    "CRC64_XP10 generate, 4096B blocks",
    "AES-XTS-256 encrypt, 512B units",
    "AES-XTS-256 encrypt, 4096B units",
    "row C TX: T10-DIF gen + XTS 520B",
    "row C RX: XTS 520B + T10-DIF check",
}


def verdicts(out: str) -> dict[str, str]:
    """Example name -> PASS or FAIL, from each example's last line."""
    found = {}
    for m in re.finditer(r"^  (PASS|FAIL)  (.+?)(?::.*)?$", out, re.M):
        found[m.group(2)] = m.group(1)
    return found


def test_demo_passes_every_example(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert verdicts(out) == dict.fromkeys(EXAMPLE_NAMES, "PASS")
    # No FAIL verdict and no failed check anywhere (the summary's "0 FAIL" aside).
    assert not re.search(r"^\s*FAIL", out, re.M) and " BAD " not in out
    assert out.rstrip().endswith(f"{len(EXAMPLE_NAMES)} examples: {len(EXAMPLE_NAMES)} PASS, 0 FAIL")
    # Captured output is not a terminal: no colour codes.
    assert "\x1b[" not in out


def test_demo_shows_images_and_mkey_check(capsys):
    assert main(["demo", "--only", "sig_block 2"]) == 0
    out = capsys.readouterr().out
    assert "mlx5dv_wr_set_mkey_sig_block(3)" in out
    assert re.search(r"blk 0 +@0 +data 4096B .* \| guard 0x[0-9a-f]{4} app 0x5a5a ref 0x00001000", out)
    assert "mkey_check ok  target MKEY" in out and "NO_ERR" in out


def test_demo_only_one_and_a_prefix(capsys):
    assert main(["demo", "--only", "crypto row C"]) == 0
    assert verdicts(capsys.readouterr().out) == {"crypto row C": "PASS"}
    # Names are matched without case, spaces, dashes or underscores; a prefix picks several.
    assert main(["demo", "--only", "SIG-BLOCK-1.1", "--only", "crypto row"]) == 0
    out = capsys.readouterr().out
    assert list(verdicts(out)) == ["sig_block 1.1", *(f"crypto row {r}" for r in "ABCDEFGHIJ")]
    assert "11 examples: 11 PASS, 0 FAIL" in out


def test_demo_unknown_name_is_a_usage_error(capsys):
    assert main(["demo", "--only", "no such example"]) == 2
    assert "no example named" in capsys.readouterr().err


def test_demo_fails_when_generated_pi_is_wrong(monkeypatch, capsys):
    """One bit of every generated guard wrong: the wire no longer matches crcmod's PI."""
    real = signature._generate

    def wrong_guard(*args, **kwargs):
        pi = real(*args, **kwargs)
        pi[:, 0] ^= 0x01
        return pi

    monkeypatch.setattr(signature, "_generate", wrong_guard)
    # The patched generator is the Python engine's; the native one has its own (their
    # agreement is tests/unit/test_engine_backends.py's property).
    with backend.using("python"):
        assert main(["demo", "--only", "sig_block 2"]) == 1
    out = capsys.readouterr().out
    assert verdicts(out) == {"sig_block 2": "FAIL"}
    assert re.search(r"FAIL  sig_block 2: .*blk 0 guard 0x[0-9a-f]{4}, expected 0x[0-9a-f]{4}", out)
    assert "1 example: 0 PASS, 1 FAIL" in out


def test_demo_fails_when_encryption_is_wrong(monkeypatch, capsys):
    real = DEK.transform

    def wrong_cipher(self, *args, **kwargs):
        out = bytearray(real(self, *args, **kwargs))
        out[0] ^= 0x80
        return bytes(out)

    monkeypatch.setattr(DEK, "transform", wrong_cipher)
    assert main(["demo", "--only", "crypto row A"]) == 1
    assert verdicts(capsys.readouterr().out) == {"crypto row A": "FAIL"}


def test_demo_engine_error_is_a_fail_not_a_crash(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(transfer, "tx", broken)
    assert main(["demo", "--only", "sig_block 1", "--only", "sig_block 2"]) == 1
    out = capsys.readouterr().out
    assert verdicts(out) == {"sig_block 1": "FAIL", "sig_block 2": "FAIL"}
    # The SEND's post fails in the target daemon, which says why ...
    assert "engine exploded" in out
    # ... and the READ the target cannot answer ends in a completion that is not SUCCESS.
    assert re.search(r"FAIL  sig_block 2: initiator RDMA_READ \w+: expected initiator "
                     r"RDMA_READ SUCCESS", out)
    assert "2 examples: 0 PASS, 2 FAIL" in out


def test_demo_runs_between_two_daemons(capsys):
    assert main(["demo", "--only", "sig_block 2.1"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"^  daemons +target daemon 127\.0\.0\.1:(\d+) QP 0x[0-9a-f]+, "
                  r"initiator daemon 127\.0\.0\.1:(\d+) QP 0x[0-9a-f]+", out, re.M)
    assert m and m.group(1) != m.group(2), out
    # 4 blocks of 4096 + 8 bytes of T10DIF in 1024-byte packets: 17 RDMA_WRITE packets,
    # seen on the initiator daemon's wire, then the same again after the tamper.
    summaries = re.findall(r"^  wire +17 packets RDMA_WRITE_FIRST psn 0x([0-9a-f]+) \.\. "
                           r"RDMA_WRITE_LAST psn 0x([0-9a-f]+) to QP 0x[0-9a-f]+, 16416B, "
                           r"initiator -> target", out, re.M)
    (a0, z0), (a1, z1) = [(int(a, 16), int(b, 16)) for a, b in summaries]
    # The first PSN is the initiator QP's own (random); 17 packets each, back to back.
    assert [(z0 - a0) % (1 << 24), (a1 - a0) % (1 << 24), (z1 - a0) % (1 << 24)] == \
        [16, 17, 33], out
    assert out.count("completion ok  initiator RDMA_WRITE SUCCESS") == 2
    # Both sides' mkey_check: the target's MKEY, and the initiator that has none.
    assert "mkey_check ok  target MKEY" in out and "BAD_GUARD" in out
    assert "initiator: no MKEY" in out
    assert "1 example: 1 PASS, 0 FAIL" in out


def test_demo_fails_when_the_oracle_disagrees(wrong_demo_oracle, capsys):
    """The wire the daemons produced is judged by the oracle: one byte of the expected
    image wrong (the ref tag of block 1) is a FAIL and exit status 1."""
    assert main(["demo", "--only", "sig_block 2"]) == 1
    out = capsys.readouterr().out
    assert verdicts(out) == {"sig_block 2": "FAIL"}
    assert re.search(r"FAIL  sig_block 2: wire is data \+ T10DIF .*: blk 1 ref 0x00001001, "
                     r"expected 0x00001000", out), out
    assert "1 example: 0 PASS, 1 FAIL" in out


def test_demo_wire_is_payloads_in_psn_order_once_each():
    """Retransmitted and reordered packets: each PSN once, in order across the 24-bit wrap."""
    sender = SimpleNamespace(role="initiator", qp=SimpleNamespace(qp_num=0x21))
    receiver = SimpleNamespace(role="target", qp=SimpleNamespace(qp_num=0x11))
    psns = [0xFFFFFE, 0xFFFFFF, 0x0, 0x1]
    ops = ["RDMA_WRITE_FIRST", "RDMA_WRITE_MIDDLE", "RDMA_WRITE_MIDDLE", "RDMA_WRITE_LAST"]
    pkts = [Packet(0x11, psn, op, bytes([k]) * 4) for k, (psn, op) in enumerate(zip(psns, ops, strict=True))]
    cap = harness.Capture(())
    cap.sent = [("initiator", p) for p in (pkts[0], pkts[1], pkts[2], pkts[1], pkts[2],
                                            pkts[3])]
    cap.sent.append(("target", Packet(0x21, 0x1, "ACKNOWLEDGE", aeth=("ACK", 1))))
    cap.sent.append(("initiator", Packet(0x99, 0x2, "SEND_ONLY", b"other QP")))
    wire = cap.wire(sender, receiver)
    assert wire.data == b"".join(bytes([k]) * 4 for k in range(4))
    assert [p.psn for p in wire.packets] == psns and wire.retransmitted == 2
    assert wire.summary() == ("4 packets RDMA_WRITE_FIRST psn 0xfffffe .. RDMA_WRITE_LAST "
                              "psn 0x1 to QP 0x11, 16B, initiator -> target; 2 retransmitted; "
                              "1 ACKNOWLEDGE from the target")


def test_bench_engine_json(capsys):
    assert main(["bench", "engine", "--json", "--mib", "1", "--repeat", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["results"]
    assert {r["name"] for r in rows} == BENCH_ROWS and len(rows) == len(BENCH_ROWS)
    for r in rows:
        # With the native engine each row also times the Python engine beside it.
        extra = ({"python_mb_s", "native_over_python"} if backend.name().startswith("native")
                 else set())
        assert set(r) == {"name", "engine_mb_s", "primitive", "primitive_mb_s", "ratio"} | extra
        assert r["primitive"]
        for key in ("engine_mb_s", "primitive_mb_s", "ratio"):
            assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (r, key)
    machine = doc["machine"]
    assert machine["python"] and machine["platform"] and machine["cpu_count"] >= 1
    assert set(machine["guard_backends"]) == {"t10dif_crc", "t10dif_csum", "crc32", "crc32c",
                                              "crc64_xp10"}


def test_bench_engine_table(capsys):
    assert main(["bench", "engine", "--mib", "0.25", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    for name in BENCH_ROWS:
        assert name in out


def test_usage_errors_return_2(capsys):
    assert main([]) == 2
    assert main(["bench", "engine", "--mib", "0"]) == 2
    assert main(["bench", "--seconds", "0"]) == 2
    capsys.readouterr()


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "demo", "--only",
                           "mkey_configure list"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "PASS  mkey_configure list" in done.stdout


@pytest.mark.parametrize("argv", [["faults", "list", "--target", "127.0.0.1:1"],
                                  ["trace", "--target", "127.0.0.1:1"],
                                  ["capture", "--target", "127.0.0.1:1", "--out", "x.pcap"]])
def test_an_unreadable_token_file_is_a_usage_error(argv, tmp_path, capsys):
    """Every client command reads --token-file before it connects (nothing listens on
    port 1) and names itself in the error."""
    missing = tmp_path / "no-token"
    argv = [str(tmp_path / a) if a == "x.pcap" else a for a in argv]
    assert main([*argv, "--token-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"softhca {argv[0]}: cannot read {missing}: No such file"), err
    assert not (tmp_path / "x.pcap").exists()


def test_split_address():
    assert split_address("127.0.0.1:4791") == ("127.0.0.1", 4791)
    assert split_address("[::1]:18515") == ("::1", 18515)
    assert split_address("node-b", 4791) == ("node-b", 4791)
    assert split_address("10.0.0.2") == ("10.0.0.2", 0)
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_address("node-b:rdma")


def test_a_named_subcommand_loads_only_its_own_module():
    """``softhca run ...`` (every verbs program of tests/native starts with one) builds
    run's parser alone: none of the other subcommands' modules, not the client, not the
    package metadata (read only for --version); its --help is run's."""
    others = ("softhca.tools.soak", "softhca.tools.trace", "softhca.tools.explain",
              "softhca.tools.capture", "softhca.tools.commands.faults", "softhca.client",
              "importlib.metadata")
    code = ("import sys; from softhca.tools import cli; p = cli.build_parser('run'); "
            "a = p.parse_args(['run', '--', 'true']); "
            f"print(a.command, [m for m in {others!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "run []", done.stdout + done.stderr
    helped = subprocess.run([sys.executable, "-m", "softhca", "run", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: softhca run "), \
        helped.stdout + helped.stderr


def test_the_subcommand_table_names_each_modules_parser():
    """SUBCOMMANDS' names are the ones each module registers, in --help's order: a name
    leading the command line loads the module that parses it."""
    from softhca.tools import cli

    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(cli.SUBCOMMANDS)
    for name in cli.SUBCOMMANDS:
        one = next(a for a in cli.build_parser(name)._actions if a.dest == "command")
        assert list(one.choices) == [name]


def test_building_the_parser_loads_no_engine():
    """softhca --help builds every subcommand's parser (explain and trace included):
    the engine, numpy and the oracle's CRC library load only when a command runs."""
    heavy = ("softhca.engine.signature", "softhca.engine.hca", "numpy", "crcmod")
    code = ("import sys; from softhca.tools.cli import build_parser; build_parser(); "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
