"""The provider's memory and its bad inputs: what a peer's verbs put in a program's
malloc'ed memory (provider/tests/memcheck.c checks it byte by byte), registrations
softhca must refuse, a killed program, another user's process, and the private ABI the
provider was declared for against the installed libibverbs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import native
import pytest

LIBIBVERBS = Path("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("memory")) as p:
        yield p


def memcheck(where, mode: str) -> native.Done:
    return where.run(where.server, [str(native.MEMCHECK), mode])


@pytest.mark.readme_row("`ibv_alloc_pd`, `ibv_reg_mr`, `ibv_reg_mr_iova` of heap")
@pytest.mark.readme_row("`ibv_post_send`: SEND")
def test_peer_verbs_land_in_malloced_memory(where):
    r = memcheck(where, "transfer")
    assert r.returncode == 0, r.output
    assert "FAIL" not in r.output, r.output
    for line in ("A: RDMA_READ put the peer's 10000 bytes into malloc'ed memory (0 differ)",
                 "B: RDMA_WRITE put 10000 bytes into malloc'ed memory (0 differ)",
                 "B: SEND put 10000 bytes into malloc'ed memory (0 differ)",
                 "B: the 1024 bytes around the WRITE's target are untouched (0 differ)"):
        assert f"memcheck: ok: {line}" in r.output, r.output


@pytest.mark.readme_row("`ibv_alloc_mw`, `ibv_dealloc_mw`")
def test_memory_windows_rereg_and_resize_from_c(where):
    """provider/mw.c: ibv_rereg_mr, ibv_resize_cq, ibv_alloc_mw, ibv_bind_mw and
    IBV_WR_BIND_MW, IBV_WR_LOCAL_INV of a window, as a C program calls them."""
    r = where.run(where.server, [str(native.MWCHECK), "windows"])
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for line in ("ibv_rereg_mr gives an MR remote write", "the peer's WRITE then lands",
                 "IBV_WR_ATOMIC_WRITE to an unaligned address is EINVAL",
                 "IBV_WR_ATOMIC_WRITE stores the 8 bytes and nothing else",
                 "ibv_resize_cq to 128", "ibv_resize_cq to 0 is EINVAL",
                 "ibv_resize_cq keeps the completions not polled yet, in order",
                 "ibv_bind_mw of a type 1 window gives it ibv_inc_rkey of its rkey",
                 "the peer writes through the type 1 window, nothing around it",
                 "IBV_WR_BIND_MW binds a type 2 window",
                 "the peer writes through the type 2 window", "IBV_WR_LOCAL_INV invalidates it",
                 "a WRITE through it after completes with remote access error",
                 "and moves no byte", "ibv_dealloc_mw"):
        assert f"mwcheck: ok: {line}" in r.output, r.output


@pytest.mark.readme_row("`ibv_alloc_mw`, `ibv_dealloc_mw`")
def test_the_window_and_atomic_write_builders_from_c(where):
    r = where.run(where.server, [str(native.MWCHECK), "builders"])
    assert r.returncode == 0 and "FAIL" not in r.output, r.output
    for line in ("ibv_wr_atomic_write stores its 8 bytes",
                 "ibv_wr_bind_mw binds a type 2 window", "the peer writes through it",
                 "ibv_wr_local_inv invalidates it",
                 "a WRITE through it after is a remote access error"):
        assert f"mwcheck: ok: {line}" in r.output, r.output


@pytest.mark.readme_row("`ibv_reg_mr` of a stack buffer")
def test_unshareable_memory_is_refused_with_a_reason(where):
    r = memcheck(where, "refuse")
    assert r.returncode == 0, r.output
    assert "memcheck: ok: ibv_reg_mr of a stack buffer fails: Invalid argument" in r.output
    assert "memcheck: ok: ibv_reg_mr of read-only memory fails: Invalid argument" in r.output
    assert "memcheck: ok: ibv_reg_mr of unmapped addresses fails: Bad address" in r.output
    # ibv_post_recv(3): the errno, and bad_wr at the first WR that failed
    for verb, queue in (("ibv_post_recv", "a QP of max_recv_sge 1"),
                        ("ibv_post_srq_recv", "an SRQ of max_sge 1")):
        assert (f"memcheck: ok: {verb} of 2 SGEs on {queue} fails: Invalid argument, "
                "bad_wr at wr_id 2") in r.output, r.output
    # the provider's lines saying why
    assert re.search(r"softhca: ibv_reg_mr\(0x[0-9a-f]+, 4096\): EINVAL: the buffer is on "
                     r"the stack", r.output), r.output
    assert re.search(r"softhca: ibv_reg_mr\(0x[0-9a-f]+, 8192\): EINVAL: the pages are "
                     r"mapped r--p \(anonymous\)", r.output), r.output
    assert re.search(r"softhca: ibv_reg_mr\(0x[0-9a-f]+, 8192\): EFAULT: address 0x[0-9a-f]+ "
                     r"is not mapped", r.output), r.output
    assert "softhca: ibv_post_recv: EINVAL: num_sge 2 exceeds the QP's max_recv_sge 1" \
        in r.output, r.output
    assert "softhca: ibv_post_srq_recv: EINVAL: num_sge 2 exceeds the SRQ's max_sge 1" \
        in r.output, r.output


def test_forged_addresses_move_nothing(where):
    r = memcheck(where, "forged")
    assert r.returncode == 0, r.output
    assert "FAIL" not in r.output, r.output
    assert "an SGE leaving its MR completes with local protection error" in r.output
    assert "an RDMA WRITE past the peer's MR completes with remote access error" in r.output
    assert r.output.count("memcheck: ok: no byte moved (0 differ)") == 2, r.output


@pytest.mark.readme_row("asynchronous events (`ibv_get_async_event`")
def test_async_event_of_an_overrun_cq(where):
    r = memcheck(where, "events")
    assert r.returncode == 0, r.output
    assert "memcheck: ok: ibv_get_async_event: CQ error on the overrun CQ" in r.output, r.output


def test_private_abi_matches_the_installed_libibverbs():
    """provider/abi.h declares the structures of private ABI 34; the installed libibverbs
    must export every private symbol the provider takes, at that version."""
    if not native.PROVIDER.is_file() or not LIBIBVERBS.is_file() or not shutil.which("objdump"):
        pytest.skip("needs the built provider, Debian's libibverbs1 and objdump")
    need = set(re.findall(r"\*UND\*\s+\S+\s+\((IBVERBS_PRIVATE_\d+)\)\s+(\S+)",
                          subprocess.run(["objdump", "-T", str(native.PROVIDER)],
                                         capture_output=True, text=True).stdout))
    have = set(re.findall(r"\s(IBVERBS_PRIVATE_\d+)\s+(\S+)$",
                          subprocess.run(["objdump", "-T", str(LIBIBVERBS)],
                                         capture_output=True, text=True).stdout, re.M))
    assert ("IBVERBS_PRIVATE_34", "verbs_register_driver_34") in need, need
    assert need <= have, f"not exported by {LIBIBVERBS}: {sorted(need - have)}"


# -- a daemon of its own: what a killed program leaves, and who may connect ------------

@pytest.fixture
def daemon(tmp_path):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    # in a folder everyone may search, so that only the socket's own mode keeps others out
    sockdir = Path(tempfile.mkdtemp(prefix="softhca-test."))
    sockdir.chmod(0o755)
    sock = sockdir / "softhca.sock"
    ready = tmp_path / "ready"
    logf = open(tmp_path / "daemon.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                             "127.0.0.1:0", "--unix", str(sock), "--ready-file", str(ready)],
                            stdout=logf, stderr=subprocess.STDOUT, cwd=native.REPO)
    deadline = time.monotonic() + 20
    while not (ready.exists() and sock.exists()):
        assert proc.poll() is None and time.monotonic() < deadline, logf.read()
        time.sleep(0.05)
    yield proc, sock, logf
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)
    logf.close()
    shutil.rmtree(sockdir, ignore_errors=True)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _memfd_maps(pid: int) -> int:
    return Path(f"/proc/{pid}/maps").read_text().count("memfd:softhca-mr")


def _rss_kib(pid: int) -> int:
    m = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1))


def test_a_daemon_that_dies_is_a_fatal_device_error(daemon):
    """The program's daemon killed under it: the context gets IBV_EVENT_DEVICE_FATAL (a
    program blocked in ibv_get_async_event learns it) and the verbs after it fail with
    EIO, as on a device that died. memcheck checks both itself."""
    proc, sock, logf = daemon
    run = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "run", "--target",
                            str(sock), "--", str(native.MEMCHECK), "fatal"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           cwd=native.REPO)
    try:
        line = run.stdout.readline()
        assert re.match(r"memcheck: ready pid (\d+)", line), line + run.stdout.read()
        proc.kill()
        proc.wait(10)
        out = run.stdout.read()
        rc = run.wait(30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    # libibverbs' own name of IBV_EVENT_DEVICE_FATAL (ibv_event_type_str)
    assert "ok: the event is local catastrophic error" in out, out
    assert rc == 0, out


def test_kill_9_leaves_nothing_behind(daemon):
    proc, sock, logf = daemon
    fds0, rss0 = _fds(proc.pid), _rss_kib(proc.pid)
    run = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "run", "--target",
                            str(sock), "--", str(native.MEMCHECK), "hold"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           cwd=native.REPO)
    try:
        line = run.stdout.readline()
        m = re.match(r"memcheck: ready pid (\d+)", line)
        assert m, line + run.stdout.read()
        # 64 MiB registered: mapped in the daemon from the program's memfd
        assert _memfd_maps(proc.pid) >= 1
        # The pid it printed is its PID namespace's (softhca run gives it one): this
        # namespace's is found by its command line.
        pids = native.processes_of(native.MEMCHECK.name, "hold")
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)
        assert run.wait(30) == 128 + signal.SIGKILL
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    deadline = time.monotonic() + 10
    while (_memfd_maps(proc.pid) or _fds(proc.pid) > fds0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _memfd_maps(proc.pid) == 0, Path(f"/proc/{proc.pid}/maps").read_text()
    assert _fds(proc.pid) == fds0, os.listdir(f"/proc/{proc.pid}/fd")
    assert _rss_kib(proc.pid) < rss0 + 16 * 1024, (rss0, _rss_kib(proc.pid))
    logf.seek(0)
    log = logf.read()
    assert re.search(r"event=session_cleanup peer='unix:pid=\d+,uid=0' .*mr=1", log), log


def _as_nobody(sock: Path) -> tuple[str, bytes]:
    """What connecting as user nobody gives: ("refused", errno name) when connect()
    fails, ("frame", first bytes) when the daemon answered."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(5)
            try:
                s.connect(str(sock))
            except OSError as e:
                os.write(w, b"refused " + (os.strerror(e.errno) or "").encode())
                os._exit(0)
            data = b""
            while len(data) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            os.write(w, b"frame " + data)
        finally:
            os._exit(0)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    kind, _, rest = out.partition(b" ")
    return kind.decode(), rest


def test_another_users_process_cannot_connect(daemon):
    proc, sock, logf = daemon
    assert sock.stat().st_mode & 0o777 == 0o600
    kind, detail = _as_nobody(sock)
    assert (kind, detail) == ("refused", b"Permission denied")
    # Even through a socket file opened to everyone, SO_PEERCRED refuses the process.
    sock.chmod(0o666)
    kind, detail = _as_nobody(sock)
    assert kind == "frame" and b"EACCES" in detail and b"uid 65534" in detail, (kind, detail)
    logf.seek(0)
    assert re.search(r"event=refused peer='unix:pid=\d+,uid=65534' errno=EACCES", logf.read())
