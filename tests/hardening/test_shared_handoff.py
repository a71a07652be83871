"""The handoff of memory that is already shared (server/shared_mr.py): the kernel's own
shmem file behind a SysV segment is mapped where the program attached it (no copy), and
a file someone can cut under the daemon's mapping is refused whatever it pretends to be:
a /dev/shm file, an unsealed memfd named like a segment, a deleted file named like one on
another filesystem, a directory. Each refusal leaves nothing registered and the session
serving. Raw handoffs, as a hostile program would frame them (tests/support/rawclient.py).
"""

from __future__ import annotations

import ctypes
import errno
import os

import pytest
from rawclient import Raw
from test_unix_socket import PAGE, session_pd, share, unix_daemon

from softhca.protocol.frames import frame_bytes

_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.shmdt.argtypes = [ctypes.c_void_p]
_libc.shmctl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
IPC_PRIVATE, IPC_CREAT, IPC_RMID = 0, 0o1000, 0


class Segment:
    """A SysV segment of ``pages`` pages attached here (and removed: it goes with its
    last user), with an fd of its shmem file as the provider opens it."""

    def __init__(self, pages: int) -> None:
        self.size = pages * PAGE
        self.id = _libc.shmget(IPC_PRIVATE, self.size, IPC_CREAT | 0o600)
        assert self.id >= 0, os.strerror(ctypes.get_errno())
        self.addr = _libc.shmat(self.id, None, 0)
        _libc.shmctl(self.id, IPC_RMID, None)
        self.view = (ctypes.c_uint8 * self.size).from_address(self.addr)
        try:
            self.fd = os.open(f"/proc/self/map_files/{self.addr:x}-{self.addr + self.size:x}",
                              os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            _libc.shmdt(self.addr)
            pytest.skip("/proc/self/map_files needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE")

    def close(self) -> None:
        os.close(self.fd)
        _libc.shmdt(self.addr)


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
            raw.writer.write(raw.frame("mr_read", mr=mr["mr"], offset=0, length=5000))
            got = await raw.next()
            assert bytes(got.payload) == bytes(seg.view[PAGE + 100:PAGE + 5100])
            data = bytes(range(50, 90))
            raw.writer.write(frame_bytes({"t": "mr_write", "id": next(raw.ids),
                                          "mr": mr["mr"], "offset": 4000}, data))
            assert (await raw.next()).header["t"] == "ok"
            # the daemon wrote the segment's own pages: the attachment sees it
            assert bytes(seg.view[PAGE + 4100:PAGE + 4140]) == data
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
