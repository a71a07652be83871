"""The handoff of memory that is already shared (server/shared_mr.py): the kernel's own
shmem file behind a SysV segment is mapped where the program attached it (no copy), and
a file someone can cut under the daemon's mapping is refused whatever it pretends to be:
a /dev/shm file, an unsealed memfd named like a segment, a deleted file named like one on
another filesystem, a directory. Each refusal leaves nothing registered and the session
serving. Raw handoffs, as a hostile program would frame them (tests/support/rawclient.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import time

import pytest
from rawclient import Raw
from test_unix_socket import PAGE, memfd, session_pd, share, unix_daemon

from softhca.protocol.frames import frame_bytes
from softhca.server.hosts import Limits

_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.shmdt.argtypes = [ctypes.c_void_p]
_libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
IPC_PRIVATE, IPC_CREAT, IPC_RMID = 0, 0o1000, 0


class Segment:
    """A SysV segment of ``pages`` pages attached here (and removed: it goes with its
    last user), with an fd of its shmem file as the provider opens it (``fd=False``: none,
    as a program without the privilege has; the daemon attaches it by its id)."""

    def __init__(self, pages: int, fd: bool = True, flags: int = 0) -> None:
        self.size = pages * PAGE
        self.id = _libc.shmget(IPC_PRIVATE, self.size, IPC_CREAT | 0o600 | flags)
        assert self.id >= 0, os.strerror(ctypes.get_errno())
        self.addr = _libc.shmat(self.id, None, 0)
        _libc.shmctl(self.id, IPC_RMID, None)
        self.view = (ctypes.c_uint8 * self.size).from_address(self.addr)
        self.fd = None
        if not fd:
            return
        try:
            self.fd = os.open(f"/proc/self/map_files/{self.addr:x}-{self.addr + self.size:x}",
                              os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            _libc.shmdt(self.addr)
            pytest.skip("/proc/self/map_files needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE")

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        _libc.shmdt(self.addr)


def attachments(shmid: int) -> int:
    """How many mappings of segment ``shmid`` this process has (the in-process daemon's
    included): the inode number /proc/self/maps shows for a SysV mapping is its id."""
    n = 0
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5].startswith("/SYSV") and int(parts[4]) == shmid:
                n += 1
    return n


async def _read_and_write(raw, mr, seg, data: bytes) -> None:
    """Through ``mr``, registered over the segment's bytes PAGE+100 to PAGE+5100: mr_read
    of all 5000 must be the segment's, and ``data`` put by mr_write at 4000 must be in the
    segment's own pages (the attachment sees the daemon's write)."""
    raw.writer.write(raw.frame("mr_read", mr=mr["mr"], offset=0, length=5000))
    got = await raw.next()
    assert bytes(got.payload) == bytes(seg.view[PAGE + 100:PAGE + 5100])
    raw.writer.write(frame_bytes({"t": "mr_write", "id": next(raw.ids),
                                  "mr": mr["mr"], "offset": 4000}, data))
    assert (await raw.next()).header["t"] == "ok"
    assert bytes(seg.view[PAGE + 4100:PAGE + 4100 + len(data)]) == data


async def test_a_sysv_segments_file_is_mapped_where_the_program_attached_it(tmp_path):
    seg = Segment(3)
    try:
        for i in range(seg.size):
            seg.view[i] = (7 * i + 3) & 0xFF
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            seq = await share(raw, [seg.fd], 3)
            # the segment's second and third pages, as a registration at an offset
            mr = await raw.call("reg_mr_shared", pd=pd, addr=0x40000 + 100, length=5000,
                                access=1, offset=100, fds=seq, pieces=[[0, PAGE, 2 * PAGE]])
            await _read_and_write(raw, mr, seg, bytes(range(50, 90)))
            assert d.registered_bytes == 5000
            await raw.call("dereg_mr", mr=mr["mr"])
            assert d.registered_bytes == 0
    finally:
        seg.close()


async def test_a_piece_past_a_segments_end_is_refused(tmp_path):
    seg = Segment(2)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            seq = await share(raw, [seg.fd], 4)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x40000, length=2 * PAGE,
                                  access=1, offset=0, fds=seq, pieces=[[0, PAGE, 2 * PAGE]])
            assert h["errno"] == "EINVAL" and "holds 8192 bytes, a piece needs 12288" \
                in h["msg"], h
            assert d.registered_bytes == 0
    finally:
        seg.close()


def _dev_shm_file(tmp_path):
    path = f"/dev/shm/softhca-test-{os.getpid()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.unlink(path)
    return fd


def _memfd_named_like_a_segment(tmp_path):
    # the kernel names every memfd "/memfd:...": this one is unsealed
    return os.memfd_create("SYSV00000000", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def _deleted_file_named_like_a_segment(tmp_path):
    # "/SYSV0000abcd (deleted)" to readlink, on the root filesystem, not the shmem mount
    path = "/SYSV0000abcd"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        pytest.skip(f"cannot create {path}: {e.strerror}")
    os.unlink(path)
    return fd


def _directory(tmp_path):
    return os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)


@pytest.mark.parametrize("make,why", [
    (_dev_shm_file, "neither a memfd sealed against shrinking nor a SysV segment"),
    (_memfd_named_like_a_segment, "not sealed against shrinking"),
    (_deleted_file_named_like_a_segment,
     "neither a memfd sealed against shrinking nor a SysV segment"),
    (_directory, "not a memfd"),
], ids=["dev_shm", "memfd_named_SYSV", "deleted_file_named_SYSV", "directory"])
async def test_a_file_that_can_be_cut_is_refused_whatever_its_name(tmp_path, make, why):
    fd = make(tmp_path)
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            os.ftruncate(fd, 2 * PAGE)
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            seq = await share(raw, [fd], 9)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x40000, length=2 * PAGE,
                                  access=1, offset=0, fds=seq, pieces=[[0, 0, 2 * PAGE]])
            assert h["errno"] == "EINVAL" and why in h["msg"], h
            assert d.registered_bytes == 0
            # nothing of it is mapped: cutting it now faults nobody
            if not os.path.isdir(f"/proc/self/fd/{fd}"):
                os.ftruncate(fd, 0)
            await raw.call("alloc_pd", ctx=1)       # the session goes on
    finally:
        os.close(fd)


def test_a_segments_file_cannot_be_sealed():
    """Why the daemon cannot make a segment's file safe itself: the kernel sets F_SEAL_SEAL
    on every shmem file that is not a memfd (memfd_create(2)), so F_ADD_SEALS is EPERM."""
    import fcntl
    seg = Segment(1)
    try:
        with pytest.raises(OSError) as e:
            fcntl.fcntl(seg.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        assert e.value.errno == errno.EPERM
    finally:
        seg.close()


# -- a segment named by its shmid, attached by the daemon itself ----------------------------

def sysv(seg: Segment, offset: int, length: int, at: int | None = None) -> list:
    """A reg_mr_shared piece naming ``seg`` by its id, as the provider writes it when no
    fd of the segment can be had: the segment's bytes [offset, offset + length), which
    the caller maps at ``at`` (by default where this process attached them)."""
    return ["sysv", seg.id, offset, length, seg.addr + offset if at is None else at]


async def test_a_segment_named_by_its_shmid_is_attached_and_mapped_in_place(tmp_path):
    seg = Segment(3, fd=False)
    try:
        for i in range(seg.size):
            seg.view[i] = (5 * i + 1) & 0xFF
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            assert raw.welcome["sysv_attach"] == 1
            pd = await session_pd(raw)
            assert attachments(seg.id) == 1
            # the segment's second and third pages, at an offset: no handoff, no fd
            mr = await raw.call("reg_mr_shared", pd=pd, addr=0x40000 + 100, length=5000,
                                access=1, offset=100, fds=77,
                                pieces=[sysv(seg, PAGE, 2 * PAGE)])
            # the daemon's one mapping of it is the registration's (its whole-segment
            # attachment went once the pages were placed)
            assert attachments(seg.id) == 2
            await _read_and_write(raw, mr, seg, bytes(range(90, 130)))
            assert d.registered_bytes == 5000
            await raw.call("dereg_mr", mr=mr["mr"])
            assert d.registered_bytes == 0 and attachments(seg.id) == 1
    finally:
        seg.close()


async def test_a_segment_and_a_memfd_side_by_side_in_one_registration(tmp_path):
    """A registration over a segment's last page and a memfd's first (pieces of both
    kinds, in address order): one range in the daemon."""
    seg = Segment(2, fd=False)
    fd = memfd(1, pattern=0x5A)
    try:
        seg.view[PAGE:2 * PAGE] = bytes([0xA5]) * PAGE
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            seq = await share(raw, [fd], 5)
            mr = await raw.call("reg_mr_shared", pd=pd, addr=0x80000, length=2 * PAGE,
                                access=1, offset=0, fds=seq,
                                pieces=[sysv(seg, PAGE, PAGE), [0, 0, PAGE]])
            raw.writer.write(raw.frame("mr_read", mr=mr["mr"], offset=PAGE - 8, length=16))
            got = await raw.next()
            assert bytes(got.payload) == bytes([0xA5]) * 8 + bytes(0x5A + i for i in range(8))
            await raw.call("dereg_mr", mr=mr["mr"])
    finally:
        os.close(fd)
        seg.close()


def _not_mapped_here(seg: Segment, other: int) -> list:
    # another segment's id, at the address where this process maps ``seg``
    return ["sysv", other, 0, PAGE, seg.addr]


def _nowhere(seg: Segment, other: int) -> list:
    # another segment's id, at an address this process maps nothing at
    return ["sysv", other, 0, PAGE, 0x1000]


def _past_the_mapping(seg: Segment, other: int) -> list:
    # more pages than this process maps there (the segment has 2)
    return sysv(seg, 0, 3 * PAGE)


def _wrong_offset(seg: Segment, other: int) -> list:
    # the segment's second page claimed at the address of its first
    return sysv(seg, PAGE, PAGE, at=seg.addr)


def _no_such_segment(seg: Segment, other: int) -> list:
    return ["sysv", 0x7FFFFFF0, 0, PAGE, seg.addr]


@pytest.mark.parametrize("piece,why", [
    (_not_mapped_here, "but the program maps [0x"),
    (_nowhere, "but the program maps nothing there"),
    (_past_the_mapping, "but the program maps [0x"),
    (_wrong_offset, "but the program maps [0x"),
    (_no_such_segment, "cannot be attached by the daemon"),
], ids=["another_segments_id", "unmapped_address", "past_the_mapping", "wrong_offset",
        "no_such_segment"])
async def test_a_segment_the_caller_does_not_map_there_is_refused(tmp_path, piece, why):
    """The daemon attaches a segment by id only where the caller maps that very segment,
    at that offset, over the whole piece: another segment's id (one that exists, which
    this process never attached), an address the caller maps nothing at, a range past
    its mapping, a wrong offset, an id no segment has. Each refusal leaves nothing
    registered, no attachment of the daemon's, and the session serving."""
    seg = Segment(2, fd=False)
    other = _libc.shmget(IPC_PRIVATE, PAGE, IPC_CREAT | 0o600)
    assert other >= 0, os.strerror(ctypes.get_errno())
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            p = piece(seg, other)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x40000, length=p[3],
                                  access=1, offset=0, fds=3, pieces=[p])
            assert h["errno"] == "EINVAL" and why in h["msg"], h
            assert d.registered_bytes == 0
            assert attachments(seg.id) == 1 and attachments(other) == 0
            await raw.call("alloc_pd", ctx=1)       # the session goes on
    finally:
        _libc.shmctl(other, IPC_RMID, None)
        seg.close()


async def test_a_segment_registration_counts_against_the_budget(tmp_path):
    """The registered-bytes budget bounds a segment named by id as any registration:
    refused ENOMEM before anything is attached."""
    seg = Segment(4, fd=False)
    try:
        async with unix_daemon(tmp_path, limits=Limits(max_session_bytes=3 * PAGE)) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x40000, length=4 * PAGE,
                                  access=1, offset=0, fds=3, pieces=[sysv(seg, 0, 4 * PAGE)])
            assert h["errno"] == "ENOMEM", h
            assert attachments(seg.id) == 1
    finally:
        seg.close()


@pytest.fixture
def huge_page():
    """One huge page free for a SHM_HUGETLB segment: reserved here (root) when none is,
    and the reservation put back after."""
    path = "/proc/sys/vm/nr_hugepages"
    try:
        with open(path) as f:
            before = int(f.read())
        with open("/proc/meminfo") as f:
            free = int(next(line for line in f if line.startswith("HugePages_Free:")).split()[1])
    except (OSError, StopIteration, ValueError) as e:
        pytest.skip(f"no huge pages on this kernel: {e}")
    if free == 0:
        try:
            with open(path, "w") as f:
                f.write(str(before + 1))
        except OSError as e:
            pytest.skip(f"no huge page free and none can be reserved ({e.strerror})")
    try:
        yield
    finally:
        if free == 0:
            with open(path, "w") as f:
                f.write(str(before))


async def test_a_huge_page_segment_named_by_its_shmid_is_refused(tmp_path, huge_page):
    """SHM_HUGETLB: the segment's file is on hugetlbfs, not the kernel's shmem mount, so
    the daemon refuses it (as it refuses an fd of it)."""
    shm_hugetlb = 0o4000
    huge = 2 << 20
    seg_id = _libc.shmget(IPC_PRIVATE, huge, IPC_CREAT | 0o600 | shm_hugetlb)
    if seg_id < 0:
        pytest.skip(f"shmget(SHM_HUGETLB): {os.strerror(ctypes.get_errno())}")
    addr = _libc.shmat(seg_id, None, 0)
    _libc.shmctl(seg_id, IPC_RMID, None)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            h = await raw.refused("reg_mr_shared", pd=pd, addr=0x40000, length=PAGE,
                                  access=1, offset=0, fds=3,
                                  pieces=[["sysv", seg_id, 0, PAGE, addr]])
            assert h["errno"] == "EINVAL" and "SHM_HUGETLB" in h["msg"], h
            assert d.registered_bytes == 0 and attachments(seg_id) == 1
    finally:
        _libc.shmdt(addr)


# -- a program of very many mappings --------------------------------------------------------

SHM_REMAP = 0o40000


class _ManyMappings:
    """A SysV segment of ``pages`` pages attached past ``n`` mappings of this process (pages
    of alternating protection in one reserved range, which the kernel cannot merge): its
    line comes after all of theirs in /proc/self/maps, a file of megabytes."""

    def __init__(self, n: int, pages: int) -> None:
        self.size = (n + pages) * PAGE
        self.base = _libc.mmap(None, self.size, 0, 0x22 | 0x4000, -1, 0)   # PRIVATE|ANON|NORESERVE
        assert self.base not in (None, ctypes.c_void_p(-1).value)
        for k in range(1, n, 2):
            assert _libc.mprotect(self.base + k * PAGE, PAGE, 1) == 0, \
                os.strerror(ctypes.get_errno())
        self.seg_size = pages * PAGE
        self.id = _libc.shmget(IPC_PRIVATE, self.seg_size, IPC_CREAT | 0o600)
        assert self.id >= 0, os.strerror(ctypes.get_errno())
        self.addr = _libc.shmat(self.id, self.base + n * PAGE, SHM_REMAP)
        _libc.shmctl(self.id, IPC_RMID, None)
        assert self.addr == self.base + n * PAGE, os.strerror(ctypes.get_errno())

    def close(self) -> None:
        _libc.shmdt(self.addr)
        _libc.munmap(self.base, self.size)


_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


@pytest.fixture
def many_mappings():
    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    with open("/proc/self/maps") as f:
        have = sum(1 for _ in f)
    n = min(50_000, limit - have - 200) // 2 * 2
    if n < 20_000:
        pytest.skip(f"vm.max_map_count {limit} leaves room for {n} mappings only")
    m = _ManyMappings(n, shared_mr_pieces())
    try:
        with open("/proc/self/maps") as f:
            size = len(f.read())
        assert size > 2 << 20, size            # the file the daemon must not read whole
        yield m
    finally:
        m.close()


def shared_mr_pieces() -> int:
    from softhca.protocol.control import MAX_PIECES
    return MAX_PIECES


async def _register_past_many_mappings(tmp_path, m: _ManyMappings) -> tuple[dict, float]:
    """A registration of the segment's pages, one piece each (as many as a request may
    name: each is looked up in the caller's maps and the daemon's own), and the time a
    second session's request, sent right after it, waits for its answer."""
    async with unix_daemon(tmp_path) as (d, u):
        raw = await Raw.open_unix(u.path)
        other = await Raw.open_unix(u.path)
        pd = await session_pd(raw)
        ctx = (await other.call("open_device", name="mlx5_0"))["ctx"]
        pages = m.seg_size // PAGE
        raw.writer.write(raw.frame(
            "reg_mr_shared", pd=pd, addr=0x40000, length=m.seg_size, access=1, offset=0,
            fds=3, pieces=[["sysv", m.id, k * PAGE, PAGE, m.addr + k * PAGE]
                           for k in range(pages)]))
        await raw.writer.drain()
        t0 = time.monotonic()
        other.writer.write(other.frame("alloc_pd", ctx=ctx))
        waited = asyncio.create_task(other.next())
        reply = (await raw.next()).header
        got = await waited
        elapsed = time.monotonic() - t0
        assert got.header["t"] == "ok", got.header
        if reply["t"] == "ok":
            await raw.call("dereg_mr", mr=reply["mr"])
        assert d.registered_bytes == 0
        return reply, elapsed


async def test_a_segment_past_fifty_thousand_mappings_is_looked_up_not_read(
        tmp_path, many_mappings):
    """The caller's mapping of a segment is asked of the kernel (PROCMAP_QUERY), not read
    out of a /proc/PID/maps of megabytes: sixteen pieces past 50,000 mappings register
    while another session's request waits well under the ~2 s reading the file whole,
    twice a piece, held the event loop."""
    from softhca.server import shared_mr
    with open("/proc/self/maps") as f:
        if shared_mr._vma_query(f.fileno(), many_mappings.addr) is NotImplemented:
            pytest.skip("this kernel has no PROCMAP_QUERY ioctl (Linux 6.11)")
    reply, waited = await _register_past_many_mappings(tmp_path, many_mappings)
    assert reply["t"] == "ok" and reply["length"] == many_mappings.seg_size, reply
    assert waited < 0.3, waited


async def test_without_procmap_query_the_maps_read_is_bounded_and_refused_e2big(
        tmp_path, many_mappings, monkeypatch):
    """On a kernel without PROCMAP_QUERY the daemon reads a caller's maps only up to the
    line of the address, and no more than MAX_MAPS_BYTES: a segment past 50,000 mappings
    is refused E2BIG, naming the bound, and another session is answered meanwhile."""
    from softhca.server import shared_mr
    monkeypatch.setattr(shared_mr, "_procmap_query", [False])
    reply, waited = await _register_past_many_mappings(tmp_path, many_mappings)
    assert reply["t"] == "err" and reply["errno"] == "E2BIG", reply
    assert f"first {shared_mr.MAX_MAPS_BYTES} bytes of /proc/" in reply["msg"], reply
    assert waited < 0.3, waited
    assert attachments(many_mappings.id) == 1


@pytest.mark.parametrize("piece,why", [
    (None, None),
    (_not_mapped_here, "but the program maps [0x"),
    (_nowhere, "but the program maps nothing there"),
    (_wrong_offset, "but the program maps [0x"),
], ids=["registered", "another_segments_id", "unmapped_address", "wrong_offset"])
async def test_without_procmap_query_a_segment_is_checked_by_reading_maps(
        tmp_path, monkeypatch, piece, why):
    """The reading of /proc/PID/maps a kernel without PROCMAP_QUERY needs finds what the
    ioctl does: the segment where the caller maps it, and the same refusals."""
    from softhca.server import shared_mr
    monkeypatch.setattr(shared_mr, "_procmap_query", [False])
    seg = Segment(2, fd=False)
    other = _libc.shmget(IPC_PRIVATE, PAGE, IPC_CREAT | 0o600)
    try:
        async with unix_daemon(tmp_path) as (d, u):
            raw = await Raw.open_unix(u.path)
            pd = await session_pd(raw)
            p = sysv(seg, 0, 2 * PAGE) if piece is None else piece(seg, other)
            fields = dict(pd=pd, addr=0x40000, length=p[3], access=1, offset=0, fds=3,
                          pieces=[p])
            if piece is None:
                mr = await raw.call("reg_mr_shared", **fields)
                assert mr["length"] == 2 * PAGE and attachments(seg.id) == 2
                await raw.call("dereg_mr", mr=mr["mr"])
            else:
                h = await raw.refused("reg_mr_shared", **fields)
                assert h["errno"] == "EINVAL" and why in h["msg"], h
            assert attachments(seg.id) == 1 and attachments(other) == 0
    finally:
        _libc.shmctl(other, IPC_RMID, None)
        seg.close()
