"""The daemon's UNIX socket (serve --unix) and its MRs backed by a program's memfds
(reg_mr_shared), attacked with what a broken or hostile local program could send: the
test process plays the program, its own memfds standing for the provider's."""

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
                                access=1, offset=100,
                                pieces=[[fds[0], 0, PAGE], [fds[1], PAGE, PAGE]])
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


@pytest.mark.parametrize("case", ["unsealed", "not_memfd", "closed", "short"])
async def test_files_that_are_not_sealed_memfds_are_refused(tmp_path, case):
    plain = tmp_path / "plain"
    plain.write_bytes(bytes(2 * PAGE))
    fd = {"unsealed": lambda: memfd(2, seal=False),
          "not_memfd": lambda: os.open(plain, os.O_RDWR),
          "closed": lambda: os.open(plain, os.O_RDWR),
          "short": lambda: memfd(1)}[case]()
    if case == "closed":
        os.close(fd)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=2 * PAGE,
                                  access=1, offset=0, pieces=[[fd, 0, 2 * PAGE]])
            want = {"unsealed": ("EINVAL", "not sealed against shrinking"),
                    "not_memfd": ("EINVAL", "not a memfd"),
                    "closed": ("EFAULT", "cannot be opened"),
                    "short": ("EINVAL", "holds 4096 bytes")}[case]
            assert h["errno"] == want[0] and want[1] in h["msg"], h
            assert d.registered_bytes == 0
            await raw.call("alloc_pd", ctx=1)      # the session goes on
    finally:
        if case != "closed":
            os.close(fd)


@pytest.mark.parametrize("pieces,errno", [
    ([[3, 0, 4096]] * 17, "EPROTO"),                     # more pieces than MAX_PIECES
    ([[3, 100, 4096]], "EPROTO"),                        # not page-aligned
    ([[3, 0, 0]], "EPROTO"),                             # empty
    ([[3, 0, 4096, 1]], "EPROTO"),                       # not a triple
    ([], "EPROTO"),                                      # none
])
async def test_malformed_pieces_are_refused_before_anything_is_mapped(tmp_path, pieces, errno):
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        pd = await session_pd(raw)
        h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=4096, access=1,
                              offset=0, pieces=pieces)
        assert h["errno"] == errno, h


async def test_range_beyond_the_pieces_and_quota_are_refused(tmp_path):
    fd = memfd(1)
    try:
        async with unix_daemon(tmp_path, limits=Limits(max_session_bytes=8 * PAGE)) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=PAGE,
                                  access=1, offset=1, pieces=[[fd, 0, PAGE]])
            assert h["errno"] == "EINVAL" and "the pieces named hold 4096" in h["msg"], h
            # pieces beyond the registration's pages are not mapped either
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=100,
                                  access=1, offset=0, pieces=[[fd, 0, 1 << 40]])
            assert h["errno"] == "EINVAL" and "the pieces named hold" in h["msg"], h
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=100,
                                  access=1, offset=PAGE, pieces=[[fd, 0, 2 * PAGE]])
            assert h["errno"] == "EINVAL", h
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x10000, length=9 * PAGE,
                                  access=1, offset=0, pieces=[[fd, 0, 9 * PAGE]])
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
                                  access=1, offset=0, pieces=[[fd, 0, PAGE]])
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
                           access=1, offset=0, pieces=[[fd, 0, 4 * PAGE]])
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
    before the program's memfd is opened; one that ends at 2^64 - 1 is an MR."""
    fd = memfd(2)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=(1 << 64) - PAGE,
                                  length=2 * PAGE, access=1, offset=0,
                                  pieces=[[fd, 0, 2 * PAGE]])
            assert h["errno"] == "EINVAL" and "passes 2^64" in h["msg"], h
            assert d.registered_bytes == 0
            # the same with a closed fd: refused for the range, not for the fd
            h = await raw.refused("reg_mr_shared", pd=pd, addr=(1 << 64) - 1, length=2,
                                  access=1, offset=0, pieces=[[9999, 0, PAGE]])
            assert h["errno"] == "EINVAL" and "passes 2^64" in h["msg"], h
            mr = await raw.call("reg_mr_shared", pd=pd, addr=(1 << 64) - 2 * PAGE,
                                length=2 * PAGE, access=1, offset=0,
                                pieces=[[fd, 0, 2 * PAGE]])
            assert mr["addr"] == (1 << 64) - 2 * PAGE and mr["length"] == 2 * PAGE
    finally:
        os.close(fd)
