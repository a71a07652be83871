"""The daemon's UNIX socket (serve --unix) and its MRs backed by a program's memfds
(reg_mr_shared, the memfds handed over with SCM_RIGHTS), attacked with what a broken or
hostile local program could send: the test process plays the program, its own memfds
standing for the provider's."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import mmap
import os
import resource
import socket
import stat
import subprocess
import sys
import time

import pytest
from rawclient import Raw

from softhca.protocol.errors import RDMAError
from softhca.protocol.frames import frame_bytes
from softhca.protocol.handshake import make_hello
from softhca.server.daemon import Daemon, Limits
from softhca.server.hosts import DEFAULT_QUOTAS
from softhca.server.shares import Shares
from softhca.server.unix import UnixListener

PAGE = mmap.PAGESIZE
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


@contextlib.asynccontextmanager
async def unix_daemon(tmp_path, **kw):
    d = Daemon(("mlx5_0",), "127.0.0.1", 0, **kw)
    await d.start()
    u = UnixListener(d, str(tmp_path / "softhca.sock"))
    await u.start()
    try:
        yield d, u
    finally:
        await u.close()
        await d.close()


def memfd(pages: int, pattern: int = 0, seal: bool = True) -> int:
    fd = os.memfd_create("softhca-mr", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, pages * PAGE)
    os.pwrite(fd, bytes((pattern + i) & 0xFF for i in range(pages * PAGE)), 0)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


async def share(raw: Raw, fds: list[int], seq: int) -> int:
    """Hands fds over under seq, as the provider does before a reg_mr_shared."""
    h = await raw.hand_over(fds, seq)
    assert h["t"] == "welcome" and h["fds"] == len(fds), h
    return seq


async def session_pd(raw: Raw) -> int:
    ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
    return (await raw.call("alloc_pd", ctx=ctx))["pd"]


async def test_socket_is_owner_only_and_welcome_names_the_wire_address(tmp_path):
    async with unix_daemon(tmp_path) as (d, u):
        st = os.stat(u.path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        raw = await Raw.open_unix(u.path)
        assert raw.welcome["address"] == d.address
        assert raw.welcome["devices"] == ["mlx5_0"]


async def test_shared_mr_is_the_programs_memory_both_ways(tmp_path):
    fds = [memfd(1, 7), memfd(2, 100)]
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            # 5000 bytes from offset 100 of two pieces side by side: the first page of
            # one memfd, the second page of another
            mr = await raw.call("reg_mr_shared", pd=pd, addr=0x7F0000001064, length=5000,
                                access=1, offset=100, fds=await share(raw, fds, 1),
                                pieces=[[0, 0, PAGE], [1, PAGE, PAGE]])
            assert mr["addr"] == 0x7F0000001064 and mr["length"] == 5000
            whole = os.pread(fds[0], PAGE, 0) + os.pread(fds[1], PAGE, PAGE)
            raw.writer.write(raw.frame("mr_read", mr=mr["mr"], offset=0, length=5000))
            got = await raw.next()
            assert got.header["t"] == "ok" and bytes(got.payload) == whole[100:5100]
            # a write across the pieces' seam lands in both of the program's memfds
            data = bytes(range(200, 240))
            raw.writer.write(frame_bytes({"t": "mr_write", "id": next(raw.ids),
                                          "mr": mr["mr"], "offset": PAGE - 100 - 20}, data))
            assert (await raw.next()).header["t"] == "ok"
            assert os.pread(fds[0], 20, PAGE - 20) == data[:20]
            assert os.pread(fds[1], 20, PAGE) == data[20:]
            # a read past the registration is refused, as for any MR
            h = await raw.refused("mr_read", mr=mr["mr"], offset=4990, length=20)
            assert h["errno"] == "EINVAL", h
            await raw.call("dereg_mr", mr=mr["mr"])
            assert d.registered_bytes == 0
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize("case", ["unsealed", "not_memfd", "short", "not_handed_over"])
async def test_files_that_are_not_sealed_memfds_are_refused(tmp_path, case):
    plain = tmp_path / "plain"
    plain.write_bytes(bytes(2 * PAGE))
    fd = {"unsealed": lambda: memfd(2, seal=False),
          "not_memfd": lambda: os.open(plain, os.O_RDWR),
          "short": lambda: memfd(1),
          "not_handed_over": lambda: memfd(2)}[case]()
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            seq = 7 if case == "not_handed_over" else await share(raw, [fd], 7)
            fields = dict(pd=pd, addr=0x10000, length=2 * PAGE, access=1, offset=0,
                          pieces=[[0, 0, 2 * PAGE]])
            h = await raw.refused("reg_mr_shared", fds=seq if case != "not_handed_over"
                                  else 8, **fields)
            want = {"unsealed": ("EINVAL", "not sealed against shrinking"),
                    "not_memfd": ("EINVAL", "a file its owner could cut under the daemon"),
                    "short": ("EINVAL", "holds 4096 bytes"),
                    "not_handed_over": ("EINVAL", "no memfds were handed over under number 8"
                                        )}[case]
            assert h["errno"] == want[0] and want[1] in h["msg"], h
            assert d.registered_bytes == 0
            # a handoff serves one request: refused or not, it is gone
            if case != "not_handed_over":
                h = await raw.refused("reg_mr_shared", fds=seq, **fields)
                assert h["errno"] == "EINVAL" and "no memfds" in h["msg"], h
            await raw.call("alloc_pd", ctx=1)      # the session goes on
    finally:
        os.close(fd)


@pytest.mark.parametrize("pieces,errno", [
    ([[0, 0, 4096]] * 17, "EPROTO"),                     # more pieces than MAX_PIECES
    ([[0, 100, 4096]], "EPROTO"),                        # not page-aligned
    ([[0, 0, 0]], "EPROTO"),                             # empty
    ([[0, 0, 4096, 1]], "EPROTO"),                       # not a triple
    ([[16, 0, 4096]], "EPROTO"),                         # no handoff has a 17th memfd
    ([], "EPROTO"),                                      # none
])
async def test_malformed_pieces_are_refused_before_anything_is_mapped(tmp_path, pieces, errno):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        pd = await session_pd(raw)
        h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=4096, access=1,
                              offset=0, pieces=pieces, fds=0)
        assert h["errno"] == errno, h


async def test_range_beyond_the_pieces_and_quota_are_refused(tmp_path):
    fd = memfd(1)
    try:
        async with unix_daemon(tmp_path, limits=Limits(max_session_bytes=8 * PAGE)) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=PAGE,
                                  access=1, offset=1, pieces=[[0, 0, PAGE]],
                                  fds=await share(raw, [fd], 1))
            assert h["errno"] == "EINVAL" and "the pieces named hold 4096" in h["msg"], h
            # pieces beyond the registration's pages are not mapped either
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=100,
                                  access=1, offset=0, pieces=[[0, 0, 1 << 40]],
                                  fds=await share(raw, [fd], 2))
            assert h["errno"] == "EINVAL" and "the pieces named hold" in h["msg"], h
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=100,
                                  access=1, offset=PAGE, pieces=[[0, 0, 2 * PAGE]],
                                  fds=await share(raw, [fd], 3))
            assert h["errno"] == "EINVAL", h
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=9 * PAGE,
                                  access=1, offset=0, pieces=[[0, 0, 9 * PAGE]],
                                  fds=await share(raw, [fd], 4))
            assert h["errno"] == "ENOMEM" and "this session" in h["msg"], h
    finally:
        os.close(fd)


async def test_shared_mrs_are_for_the_unix_socket_only(tmp_path):
    fd = memfd(1)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open(d.address)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=PAGE,
                                  access=1, offset=0, pieces=[[0, 0, PAGE]], fds=0)
            assert h["errno"] == "EOPNOTSUPP" and "UNIX socket only" in h["msg"], h
    finally:
        os.close(fd)


async def test_a_session_that_ends_unmaps_its_memory(tmp_path):
    fd = memfd(4)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            await raw.call("reg_mr_shared", pd=pd, addr=0x10000, length=4 * PAGE,
                           access=1, offset=0, pieces=[[0, 0, 4 * PAGE]],
                           fds=await share(raw, [fd], 1))
            maps = f"/proc/{os.getpid()}/maps"
            assert "memfd:softhca-mr" in open(maps).read()
            raw.writer.close()
            for _ in range(100):
                if not d.sessions:
                    break
                await asyncio.sleep(0.02)
            gc.collect()
            assert d.registered_bytes == 0
            # the test's own view of its memfd is not mapped: only the daemon's was
            assert "memfd:softhca-mr" not in open(maps).read()
    finally:
        os.close(fd)


async def test_an_iova_range_past_2_64_is_refused_before_anything_is_mapped(tmp_path):
    """An MR's last byte needs an address: iova + length past 2^64 is EINVAL, checked
    before the handed-over memfds are mapped; one that ends at 2^64 - 1 is an MR."""
    fd = memfd(2)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=(1 << 64) - PAGE,
                                  length=2 * PAGE, access=1, offset=0,
                                  fds=await share(raw, [fd], 1), pieces=[[0, 0, 2 * PAGE]])
            assert h["errno"] == "EINVAL" and "passes 2^64" in h["msg"], h
            assert d.registered_bytes == 0
            # one byte past: refused as well
            h = await raw.refused("reg_mr_shared", pd=pd, addr=(1 << 64) - 1, length=2,
                                  access=1, offset=0, fds=await share(raw, [fd], 3),
                                  pieces=[[0, 0, PAGE]])
            assert h["errno"] == "EINVAL" and "passes 2^64" in h["msg"], h
            mr = await raw.call("reg_mr_shared", pd=pd, addr=(1 << 64) - 2 * PAGE,
                                length=2 * PAGE, access=1, offset=0,
                                fds=await share(raw, [fd], 2), pieces=[[0, 0, 2 * PAGE]])
            assert mr["addr"] == (1 << 64) - 2 * PAGE and mr["length"] == 2 * PAGE
    finally:
        os.close(fd)


# -- the socket file: created once, never touched through its name after ------------------

async def test_a_symlink_swapped_in_after_bind_is_never_followed(tmp_path, monkeypatch):
    """In a directory others may write, the socket's name can be replaced by a symlink
    the moment bind made it. Nothing the daemon does through the name afterwards may
    follow it: not a chmod (a root daemon would make any file 0600), not the unlink at
    close (the name is no longer the daemon's)."""
    victim = tmp_path / "victim"
    victim.write_text("not the daemon's")
    victim.chmod(0o644)
    path = tmp_path / "softhca.sock"
    real = socket.socket.bind

    def bind_then_swap(sock, where):
        real(sock, where)
        if sock.family == socket.AF_UNIX and str(where).endswith("softhca.sock"):
            # What the attacker does between the bind and anything after it.
            os.rename(path, tmp_path / "moved.sock")
            os.symlink(victim, path)

    monkeypatch.setattr(socket.socket, "bind", bind_then_swap)
    d = Daemon(("mlx5_0",), "127.0.0.1", 0)
    await d.start()
    u = UnixListener(d, str(path))
    try:
        await u.start()
    finally:
        await u.close()
        await d.close()
    assert stat.S_IMODE(os.stat(victim).st_mode) == 0o644, oct(os.stat(victim).st_mode)
    assert os.path.islink(path), "the attacker's name was unlinked at close"


async def test_close_unlinks_its_own_socket_only(tmp_path):
    async with unix_daemon(tmp_path) as (d, u):
        pass
    assert not os.path.exists(u.path)
    # another daemon's socket now at the name: the first daemon's close leaves it
    async with unix_daemon(tmp_path) as (d, u):
        os.rename(u.path, tmp_path / "old.sock")
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(u.path)
    assert stat.S_ISSOCK(os.lstat(u.path).st_mode)
    other.close()


# -- connections that never say HELLO ------------------------------------------------------

def _serve_unix(tmp_path, *extra: str, nofile: int = 256) -> tuple[subprocess.Popen, str]:
    """A ``softhca serve --unix`` process whose descriptors are limited to ``nofile``."""
    sock, ready = str(tmp_path / "d.sock"), str(tmp_path / "ready")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = subprocess.Popen([sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                             "127.0.0.1:0", "--unix", sock, "--ready-file", ready,
                             "--log-level", "error", *extra], preexec_fn=limit,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not (os.path.exists(ready) and os.path.exists(sock)):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc, sock


def _connect(path: str, patience: float = 2.0) -> socket.socket:
    """A UNIX stream connection, waiting up to ``patience`` s for room in the daemon's
    listen backlog (a non-blocking connect says EAGAIN while it is full)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    end = time.monotonic() + patience
    while True:
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            if time.monotonic() > end:
                s.close()
                raise
            time.sleep(0.01)


async def test_idle_unix_connections_cannot_keep_an_honest_program_out(tmp_path):
    """More idle connections than the daemon has descriptors: each newcomer evicts the
    oldest that has not said HELLO (serve --max-pre-hello), so the daemon keeps
    accepting, holds a bounded number of them, and an honest program's HELLO is
    answered at once."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    proc, sock = _serve_unix(tmp_path, "--max-pre-hello", "16", "--hello-timeout", "30",
                             nofile=256)
    idle: list[socket.socket] = []
    try:
        for _ in range(600):
            idle.append(_connect(sock))
        t0 = time.perf_counter()
        r, w = await asyncio.open_unix_connection(sock=_connect(sock))
        raw = Raw(r, w)
        challenge = await raw.next(5)
        assert challenge.kind == "challenge", challenge.header
        w.write(frame_bytes(make_hello(challenge.header, "control", None)))
        welcome = await raw.next(5)
        took = time.perf_counter() - t0
        assert welcome.kind == "welcome", welcome.header
        assert took < 1.0, f"welcome after {took:.2f} s"
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert fds < 100, f"the daemon holds {fds} descriptors for 600 idle connections"
        w.close()
    finally:
        for s in idle:
            s.close()
        proc.terminate()
        proc.wait(10)


# -- one process of a uid, many sessions ---------------------------------------------------

_NEIGHBOUR = """
import asyncio, sys
from rawclient import Raw

async def main():
    raw = await Raw.open_unix(sys.argv[1])
    ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
    pds = [(await raw.call("alloc_pd", ctx=ctx))["pd"] for _ in range(int(sys.argv[2]))]
    print("ok", len(pds))

try:
    asyncio.run(main())
except BaseException as e:
    print("failed", repr(e))
"""


async def _neighbour(path: str, pds: int) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "support"),
         os.environ.get("PYTHONPATH", "")]))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _NEIGHBOUR, path,
                                                str(pds), env=env,
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return out.decode().strip()


async def _hello_answer(path: str) -> tuple[dict, asyncio.StreamWriter]:
    r, w = await asyncio.open_unix_connection(path)
    raw = Raw(r, w)
    challenge = await raw.next()
    w.write(frame_bytes(make_hello(challenge.header, "control", None)))
    return (await raw.next()).header, w


async def test_one_process_cannot_take_its_uids_every_session(tmp_path):
    """Every process of a uid is its own share within the uid's: one that opens sessions
    and objects until refused leaves room for the others of the same uid, which still
    get a session and create objects."""
    limits = Limits(max_credential_connections=8, quotas={**DEFAULT_QUOTAS, "pd": (64, 8)})
    async with unix_daemon(tmp_path, limits=limits) as (d, u):
        held, answers = [], []
        while len(held) < 9:
            h, w = await _hello_answer(u.path)
            held.append(w)
            answers.append(h.get("errno", h["t"]))
            if h["t"] != "welcome":
                break
        assert answers[-1] == "EBUSY", answers
        sessions = len(answers) - 1
        assert sessions < 8, f"one process held all {sessions} of its uid's sessions"
        # its objects too: one of its sessions makes pds until refused
        held.pop(0).close()
        await asyncio.sleep(0.1)
        raw = await Raw.open_unix(u.path)
        ctx = (await raw.call("open_device", name="mlx5_0"))["ctx"]
        made, refusal = 0, None
        while made < 9 and refusal is None:
            raw.writer.write(raw.frame("alloc_pd", ctx=ctx))
            h = (await raw.next()).header
            if h["t"] == "ok":
                made += 1
            else:
                refusal = h
        assert refusal and refusal["errno"] == "ENOMEM", refusal
        assert made < 8, f"one process made all {made} of its uid's pds"
        # a neighbour of the same uid, meanwhile: a session, a context and the pds left
        got = await _neighbour(u.path, 8 - made)
        assert got == f"ok {8 - made}", got
        for w in held:
            w.close()


def test_a_process_share_nests_inside_its_uids():
    """The arithmetic of the nested shares: a process may hold half of its uid's
    connections and objects, and the uid's limit holds for its processes together."""
    shares = Shares(Limits(max_credential_connections=8, quotas={**DEFAULT_QUOTAS,
                                                                  "pd": (64, 8)}))
    for _ in range(4):
        shares.admit("uid:0/pid:1")
    with pytest.raises(RDMAError) as e:
        shares.admit("uid:0/pid:1")
    assert e.value.errno_name == "EBUSY" and "process 1" in e.value.message, e.value
    for _ in range(4):
        shares.admit("uid:0/pid:2")
    with pytest.raises(RDMAError) as e:
        shares.admit("uid:0/pid:3")
    assert e.value.errno_name == "EBUSY" and "uid:0 holds 8" in e.value.message, e.value
    shares.leave("uid:0/pid:1")
    shares.admit("uid:0/pid:3")
    assert shares.connections == {"uid:0": 8, "uid:0/pid:1": 3, "uid:0/pid:2": 4,
                                  "uid:0/pid:3": 1}
    for pid in (1, 2, 3):
        shares.leave(f"uid:0/pid:{pid}")
    # objects: per process half the uid's quota, the uid's for all together
    for _ in range(4):
        shares.check("uid:0/pid:1", {}, "pd")
        shares.take("uid:0/pid:1", "pd")
    with pytest.raises(RDMAError) as e:
        shares.check("uid:0/pid:1", {}, "pd")
    assert e.value.errno_name == "ENOMEM" and "process 1" in e.value.message, e.value
    for _ in range(4):
        shares.take("uid:0/pid:2", "pd")
    with pytest.raises(RDMAError) as e:
        shares.check("uid:0/pid:3", {}, "pd")
    assert e.value.errno_name == "ENOMEM" and "uid:0 holds 8" in e.value.message, e.value
    for _ in range(4):
        shares.give_back("uid:0/pid:1", "pd")
        shares.give_back("uid:0/pid:2", "pd")
    assert shares.objects == {"uid:0": {"pd": 0}}, "a gone process leaves no entry"
