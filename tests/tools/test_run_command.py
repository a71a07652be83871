"""``softhca run``'s refusals, said before anything starts (tools/native.py), and the sysfs
tree it writes, read back as libibverbs reads it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

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
    # The node GUID is the GID's interface identifier, the one ibv_query_device answers.
    guid = tmp_path / "class" / "infiniband" / "mlx5_1" / "node_guid"
    assert guid.read_text() == "0ac8:0001:12b7:0001\n"
    assert (guid.parent / "sys_image_guid").read_text() == guid.read_text()


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


def test_program_env_preloads_softhcas_channel_library_first(tmp_path, monkeypatch):
    """LD_PRELOAD names provider/build's libsofthca-preload.so first (its
    ibv_create_comp_channel before libibverbs'), the user's preloads kept after it in
    their order, and the library named once when the environment has it already (an
    image's). A provider directory without it (an older build) adds nothing."""
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert "LD_PRELOAD" not in native.program_env(tmp_path / "sys", "/run/x.sock", tmp_path)
    ours = f"{tmp_path}/libsofthca-preload.so"
    (tmp_path / native.PRELOAD_NAME).write_bytes(b"")
    monkeypatch.setenv("LD_PRELOAD", "/opt/a.so:/opt/b.so")
    env = native.program_env(tmp_path / "sys", "/run/x.sock", tmp_path)
    assert env["LD_PRELOAD"] == f"{ours} /opt/a.so /opt/b.so"
    monkeypatch.setenv("LD_PRELOAD", f"/opt/a.so {ours}")
    assert native.program_env(tmp_path / "sys", "/run/x.sock", tmp_path)[
        "LD_PRELOAD"] == f"{ours} /opt/a.so"
    monkeypatch.delenv("LD_PRELOAD")
    assert native.program_env(tmp_path / "sys", "/run/x.sock", tmp_path)[
        "LD_PRELOAD"] == ours


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


def _fake(bin_dir, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _run_with_path(tmp_path, monkeypatch, program: list[str]) -> int:
    """softhca run with tmp_path/bin first on PATH, outside a node's environment."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.delenv("SOFTHCA_SOCKET", raising=False)
    (tmp_path / native.PROVIDER_LIB).write_bytes(b"")
    return main(["run", "--provider", str(tmp_path), "--", *program])


def test_a_refused_unshare_is_said_in_one_line(tmp_path, monkeypatch, capfd):
    """Docker's default profile refuses unshare(CLONE_NEWNS) with EPERM; unshare(1) says
    so and exits 1. softhca run exits non-zero with one line naming that cause, instead
    of passing on a bare status 1, and the program never runs."""
    _fake(tmp_path / "bin", "unshare",
          'echo "unshare: unshare failed: Operation not permitted" >&2\nexit 1\n')
    marker = tmp_path / "ran"
    assert _run_with_path(tmp_path, monkeypatch, ["touch", str(marker)]) == 2
    err = capfd.readouterr().err
    assert err == ("softhca run: cannot make the program's mount namespace (unshare: "
                   "unshare failed: Operation not permitted): softhca run needs root with "
                   "CAP_SYS_ADMIN (mount namespaces) and mount(8)\n"), err
    assert not marker.exists()


def test_a_refused_mount_is_said_in_one_line(tmp_path, monkeypatch, capfd):
    """unshare works but the script's first mount is refused (an AppArmor profile that
    denies mount): mount's own words are the cause. The fake unshare runs the script in
    this namespace, so the fake mount refuses before anything is mounted (and removes
    the script's temporary directory, which the script leaves when a mount fails)."""
    _fake(tmp_path / "bin", "unshare",
          'while [ "${1#-}" != "$1" ]; do\n'
          '  if [ "$1" = --propagation ]; then shift; fi; shift\ndone\nexec "$@"\n')
    _fake(tmp_path / "bin", "mount",
          'rmdir "$3"\necho "mount: $3: permission denied." >&2\nexit 32\n')
    marker = tmp_path / "ran"
    assert _run_with_path(tmp_path, monkeypatch, ["touch", str(marker)]) == 2
    err = capfd.readouterr().err
    # The set-up's temporary directory is in softhca run's own, never in the host's /tmp.
    assert re.match(r"softhca run: cannot make the program's mount namespace \(mount: "
                    r"\S*/softhca-run\.[^/]+/dev\.", err), err
    assert ": permission denied.): softhca run needs root" in err and err.count("\n") == 1
    assert not marker.exists()


def test_in_a_node_environment_the_refusal_says_run_it_directly(tmp_path, monkeypatch):
    """In a softhca image (softhca-node made the daemon's socket and the sysfs tree, and
    the image's environment names them) the way out is to run the program directly."""
    sock = tmp_path / "softhca.sock"
    sock.write_bytes(b"")
    monkeypatch.setenv("SOFTHCA_SOCKET", str(sock))
    monkeypatch.setenv("SYSFS_PATH", str(tmp_path / "sys"))
    said = "unshare: unshare failed: Operation not permitted\n"
    assert native.namespace_refused(said) == (
        "cannot make the program's mount namespace (unshare: unshare failed: Operation not "
        "permitted): run the program directly: this environment (SYSFS_PATH, "
        "SOFTHCA_SOCKET, RDMAV_DRIVERS, LD_LIBRARY_PATH) already gives it softhca's "
        f"provider and the daemon at {sock}")
    sock.unlink()       # no daemon there: the environment alone is no way out
    assert "needs root with CAP_SYS_ADMIN" in native.namespace_refused(said)


def _namespaces_work() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _namespaces_work(), reason="needs root and unshare --mount")
def test_the_program_gets_the_real_stderr_and_its_status(tmp_path, capfd):
    """Set-up goes on a pipe (so that its refusals are caught); the program's stderr is
    softhca run's own, its status is softhca run's, and the ready line is not seen."""
    (tmp_path / native.PROVIDER_LIB).write_bytes(b"")
    assert main(["run", "--provider", str(tmp_path), "--", "sh", "-c",
                 "echo to-out; echo to-err >&2; exit 3"]) == 3
    out, err = capfd.readouterr()
    assert out == "to-out\n" and err == "to-err\n", (out, err)


def _binds(old, new, *, wrap: list[str]) -> subprocess.CompletedProcess:
    """softhca run's per-entry bind program, as the namespace's script runs it, under
    ``wrap`` (a private mount namespace, or a user namespace where mount is refused)."""
    import sys

    return subprocess.run([*wrap, sys.executable, "-I", "-S", "-c", native._BINDS,
                           str(old), str(new)], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not _namespaces_work(), reason="needs root and unshare --mount")
def test_the_bind_program_makes_each_entry_again_as_the_shell_loop_did(tmp_path):
    """A tree like /dev's: a file, a directory with a file in it, a link, infiniband and
    a dot entry. In the new tree the file and the directory are the old ones (bound: a
    write through the new path is in the old file), the link points where the old one
    does, infiniband and the dot entry are left out; the check runs in the namespace."""
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "pts").mkdir(parents=True)
    (old / "pts" / "0").write_text("pty")
    (old / "null").write_text("")
    (old / "fd").symlink_to("/proc/self/fd")
    (old / "infiniband").mkdir()
    (old / ".hidden").write_text("")
    new.mkdir()
    check = (f'set -e; "$@"; echo through-new > {new}/null; cat {old}/null; '
             f"cat {new}/pts/0; echo; readlink {new}/fd; ls -A {new}")
    import sys

    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", check,
                        "-", sys.executable, "-I", "-S", "-c", native._BINDS, str(old),
                        str(new)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n") == ["through-new", "pty", "/proc/self/fd", "fd", "null",
                                    "pts", ""], r.stdout
    # outside the namespace nothing was mounted: the new tree holds the empty stand-ins
    assert (new / "null").read_text() == "" and not (new / "pts" / "0").exists()


@pytest.mark.skipif(not _namespaces_work() or subprocess.run(
    ["unshare", "--user", "true"], capture_output=True).returncode != 0,
    reason="needs root, unshare --mount and a user namespace")
def test_a_refused_bind_is_said_as_mount_says_it(tmp_path):
    """In a user namespace with no mapping mount(2) is refused (EPERM): the program says
    which mount point, in mount(8)'s form that softhca run's one line quotes, and exits
    32 (mount(8)'s status), so that the script stops there."""
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "pts").mkdir(parents=True)
    new.mkdir()
    r = _binds(old, new, wrap=["unshare", "--user"])
    assert r.returncode == 32, r
    assert r.stderr == f"mount: {new}/pts: Operation not permitted.\n", r.stderr


def test_a_run_directory_is_never_seen_with_its_lock_free(tmp_path):
    """A starting softhca run removes the directories of dead ones, those whose lock
    nobody holds. A live run's lock is only ever seen held: ``hold_run_lock`` locks it
    under another name and renames it into place (a lock created, then locked, was free
    in between, and a run starting beside it removed the live one's directory)."""
    live = tmp_path / (native.RUN_PREFIX + "live")
    live.mkdir()
    fd = native.hold_run_lock(live)
    try:
        assert sorted(p.name for p in live.iterdir()) == [native.RUN_LOCK]
        # Mid-way, the instant before the rename: no lock yet, so it is kept as well.
        starting = tmp_path / (native.RUN_PREFIX + "starting")
        starting.mkdir()
        (starting / (native.RUN_LOCK + ".new")).touch()
        assert native.remove_stale_run_dirs(str(tmp_path)) == []
        assert live.is_dir() and starting.is_dir()
    finally:
        os.close(fd)
    # Its process gone (the lock dropped with its descriptor): removed by the next run.
    assert native.remove_stale_run_dirs(str(tmp_path)) == [live]
    assert not live.exists() and starting.is_dir()
