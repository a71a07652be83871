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
import stat

import pytest
from rawclient import Raw

from softhca.protocol.frames import frame_bytes
from softhca.server.daemon import Daemon, Limits
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
                    "not_memfd": ("EINVAL", "not a memfd"),
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
