"""``softhca run``'s refusals, said before anything starts (tools/native.py), and the sysfs
tree it writes, read back as libibverbs reads it."""

from __future__ import annotations

import json

from softhca.tools import native
from softhca.tools.cli import main


def test_no_program_is_a_usage_error(capsys):
    assert main(["run"]) == 2
    assert "name a program: softhca run -- PROGRAM" in capsys.readouterr().err


def test_missing_provider_is_said(tmp_path, capsys):
    assert main(["run", "--provider", str(tmp_path), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "no provider at" in err and "make provider" in err


def test_bad_fault_rules_are_refused(tmp_path, capsys):
    lib = tmp_path / native.PROVIDER_LIB
    lib.write_bytes(b"")
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"action": "explode"}]))
    assert main(["run", "--provider", str(tmp_path), "--faults", str(rules), "--",
                 "true"]) == 2
    assert f"--faults {rules}" in capsys.readouterr().err


def test_trace_with_target_is_refused(tmp_path, capsys):
    """--trace is the embedded daemon's; a running daemon is traced by softhca trace."""
    (tmp_path / native.PROVIDER_LIB).write_bytes(b"")
    assert main(["run", "--provider", str(tmp_path), "--target", str(tmp_path / "sock"),
                 "--trace", str(tmp_path / "t.txt"), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "--trace is the embedded daemon's" in err and "softhca trace --target" in err
    assert not (tmp_path / "t.txt").exists()


def test_an_unwritable_trace_file_is_refused_before_the_program_runs(tmp_path, capsys):
    (tmp_path / native.PROVIDER_LIB).write_bytes(b"")
    marker = tmp_path / "ran"
    bad = tmp_path / "no-such-dir" / "t.txt"
    assert main(["run", "--provider", str(tmp_path), "--trace", str(bad), "--", "touch",
                 str(marker)]) == 2
    assert f"--trace {bad}: No such file or directory" in capsys.readouterr().err
    assert not marker.exists()


def test_sysfs_tree(tmp_path):
    native.write_sysfs(tmp_path, ["mlx5_0", "mlx5_1"], "10.200.0.1", 4791)
    verbs = tmp_path / "class" / "infiniband_verbs"
    assert (verbs / "abi_version").read_text() == "6\n"
    assert (verbs / "uverbs1" / "ibdev").read_text() == "mlx5_1\n"
    assert (verbs / "uverbs0" / "dev").read_text() == "1:3\n"
    port = tmp_path / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    # fe80:: then 10.200.0.1, port 4791 (0x12b7), device index 1
    assert (port / "gids" / "0").read_text() == "fe80:0000:0000:0000:0ac8:0001:12b7:0001\n"
    assert (port / "gid_attrs" / "types" / "0").read_text() == "RoCE v2\n"
    assert (port / "pkeys" / "0").read_text() == "0xffff\n"
    dev = tmp_path / "class" / "infiniband" / "mlx5_0"
    assert (dev / "node_type").read_text() == "1: CA\n"
    assert (dev / "device" / "modalias").read_text() == "softhca:\n"


def test_bad_crypto_config_is_refused(tmp_path, capsys):
    (tmp_path / native.PROVIDER_LIB).write_bytes(b"")
    cfg = tmp_path / "crypto.json"
    cfg.write_text(json.dumps({"mode": "sealed"}))
    assert main(["run", "--provider", str(tmp_path), "--crypto-config", str(cfg), "--",
                 "true"]) == 2
    err = capsys.readouterr().err
    assert f"crypto configuration {cfg}" in err and "'sealed'" in err, err


def test_program_env_puts_softhcas_libmlx5_first(tmp_path, monkeypatch):
    """provider/build goes first on LD_LIBRARY_PATH (softhca's libmlx5.so.1 before
    Debian's), and the user's entries stay after it."""
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/a:/opt/b")
    env = native.program_env(tmp_path / "sys", "/run/x.sock", tmp_path)
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path}:/opt/a:/opt/b"
    assert env["RDMAV_DRIVERS"] == f"{tmp_path}/libsofthca"
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert native.program_env(tmp_path / "sys", "/run/x.sock", tmp_path)[
        "LD_LIBRARY_PATH"] == str(tmp_path)


def test_provider_directory_from_softhca_provider(tmp_path, monkeypatch, capsys):
    """Given no --provider, SOFTHCA_PROVIDER names the directory (the images set it to
    /opt/softhca-provider, as an installed softhca has no source tree): the refusal
    names the file it looked for there."""
    monkeypatch.setenv("SOFTHCA_PROVIDER", str(tmp_path / "opt"))
    assert main(["run", "--", "true"]) == 2
    assert f"no provider at {tmp_path / 'opt' / native.PROVIDER_LIB}" in capsys.readouterr().err
    # --provider still wins over it.
    assert main(["run", "--provider", str(tmp_path / "given"), "--", "true"]) == 2
    assert f"no provider at {tmp_path / 'given'}" in capsys.readouterr().err
