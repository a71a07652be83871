"""MRs backed by a local program's own memory (the ``reg_mr_shared`` request).

The provider (provider/mem.c) moves the pages of a registration onto memfds at the
same virtual addresses. It hands the memfds themselves to the daemon: per registration
it sends, with ``SCM_RIGHTS``, a hello of role ``memfd`` carrying its session's
``memfd_key`` (random, given in the control session's welcome) and a number of its
choosing, on a connection of that role to the UNIX socket which it keeps for the
context's next registrations; the listener (server/unix.py) files the fds in that
session's ``MemfdInbox`` under the number. A session keeps at most
``MAX_HANDOFF_CONNS`` such connections, each bound to it by its first hello and ended
with it. The ``reg_mr_shared``
request then names the number (``fds``) and the pieces of the registration as
``[index, offset, length]``, index being the memfd's place in that handoff, in address
order (pages an earlier registration already moved stay on its memfd, so a
registration may span several). The daemon never opens another process's files: what
it maps is what the caller itself sent, at the time of the call, so a child that kept
its parent's session (fork, exec) reaches nothing of the parent's.

Memory that is already shared (a SysV segment, ``MAP_SHARED | MAP_ANONYMOUS``, a
program's memfd) is not moved: the provider hands over the object behind it, each piece
at the mapping's file offset. Each fd is checked to be one no one can cut under the
daemon's mapping (which would fault the daemon): a memfd sealed against shrinking, or
the kernel-internal shmem file of a segment or of shared anonymous memory (``_check_fd``
says why those are safe), and long enough; the pieces are mapped side by
side into one reserved range, and the bytes registered at the program's virtual
address. Every access then goes through the engine's MR checks, which bound it by the
registration: a work request naming an address outside it is refused like any other.

The daemon keeps no fd of the program's: a handoff's fds are closed once the request
that names it has mapped them (or failed), when it waits unclaimed past ``TTL_S``, and
with the session. A session holds at most ``MAX_PENDING_FDS`` fds not yet claimed, the
listener ``MAX_PENDING_FDS_ALL`` over all sessions. The mapping goes when the MR's last
view does (deregistration, the session's end).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import functools
import mmap
import os
import re
import select
import socket
import stat

import numpy as np

from ..engine.hca import check_mr_range
from ..protocol import control
from ..protocol.errors import RDMAError, einval
from .logs import kv, log

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mremap.restype = ctypes.c_void_p
_libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int,
                         ctypes.c_void_p]
_libc.shmat.restype = ctypes.c_void_p
_libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
_libc.shmdt.argtypes = [ctypes.c_void_p]
MAP_FAILED = ctypes.c_void_p(-1).value
MAP_FIXED = 0x10
MAP_NORESERVE = 0x4000
PROT_NONE = 0
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
# getsockopt(2) of a UNIX socket: a pidfd of the process that connected (Linux 6.5)
SO_PEERPIDFD = 77


class _Mapping:
    """A reserved address range of the daemon with memfd pieces mapped into it; unmapped
    when the last array viewing it goes."""

    base = None

    def __init__(self, size: int) -> None:
        self.size = size
        base = _libc.mmap(None, size, PROT_NONE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
        if base in (None, MAP_FAILED):
            raise RDMAError("ENOMEM", f"ibv_reg_mr: no {size} bytes of address space in "
                                      f"the daemon ({os.strerror(ctypes.get_errno())})")
        self.base = base

    def place(self, pos: int, fd: int, offset: int, length: int) -> None:
        got = _libc.mmap(self.base + pos, length, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_SHARED | MAP_FIXED, fd, offset)
        if got in (None, MAP_FAILED):
            raise RDMAError("EFAULT", "ibv_reg_mr: mapping the program's memory failed "
                                      f"({os.strerror(ctypes.get_errno())})")

    def place_sysv(self, pos: int, seg: _Segment, offset: int, length: int) -> None:
        """The segment's bytes [offset, offset + length) at ``pos``: a second mapping of
        the same pages (mremap of a shared mapping with old size 0), which holds the
        segment as an attachment of its own until it is unmapped."""
        got = _libc.mremap(seg.addr + offset, 0, length, MREMAP_MAYMOVE | MREMAP_FIXED,
                           self.base + pos)
        if got in (None, MAP_FAILED):
            raise RDMAError("EFAULT", "ibv_reg_mr: mapping the program's SysV segment failed "
                                      f"({os.strerror(ctypes.get_errno())})")

    def array(self) -> np.ndarray:
        view = (ctypes.c_uint8 * self.size).from_address(self.base)
        view._mapping = self        # the array keeps the view, the view keeps this
        return np.frombuffer(view, dtype=np.uint8)

    def __del__(self) -> None:
        if self.base is not None:
            _libc.munmap(self.base, self.size)


# What one session may hold of fds handed over and not yet claimed by a registration
# (four registrations of MAX_PIECES pieces each at once), all sessions together, and
# for how long an unclaimed handoff is kept.
MAX_PENDING_FDS = 64
MAX_PENDING_FDS_ALL = 1024
TTL_S = 10.0
# The memfd connections one session may keep open (server/unix.py): the provider keeps
# one per device context, and opens another only when it has lost that one.
MAX_HANDOFF_CONNS = 4


class MemfdInbox:
    """The fds a control session's process handed over (role ``memfd``), by number."""

    def __init__(self, key: str, total: list[int], uid: int) -> None:
        self.key = key
        self.uid = uid                  # the session's user: only its handoffs count
        self._total = total             # the listener's count, shared by every inbox
        self._pending: dict[int, tuple[list[int], asyncio.TimerHandle]] = {}
        # the memfd connections bound to this session, ended with it
        self.handoffs: set[socket.socket] = set()
        self.closed = False

    def held(self) -> int:
        return sum(len(fds) for fds, _ in self._pending.values())

    def file(self, seq: int, fds: list[int]) -> None:
        """Keeps ``fds`` under ``seq``; on RDMAError the caller closes them."""
        if self.closed:
            raise RDMAError("ENOTCONN", "memfd handoff: the session has ended")
        if seq in self._pending:
            raise RDMAError("EEXIST", f"memfd handoff: number {seq} is already pending")
        if self.held() + len(fds) > MAX_PENDING_FDS:
            raise RDMAError("EBUSY", f"memfd handoff: a session holds at most "
                                     f"{MAX_PENDING_FDS} fds not yet registered")
        if self._total[0] + len(fds) > MAX_PENDING_FDS_ALL:
            raise RDMAError("EBUSY", f"memfd handoff: the daemon holds at most "
                                     f"{MAX_PENDING_FDS_ALL} fds not yet registered")
        timer = asyncio.get_running_loop().call_later(TTL_S, self._expire, seq)
        self._pending[seq] = (fds, timer)
        self._total[0] += len(fds)

    def take(self, seq: int) -> list[int]:
        """The fds filed under ``seq``, now the caller's to close."""
        got = self._pending.pop(seq, None)
        if got is None:
            raise einval(f"ibv_reg_mr: no memfds were handed over under number {seq} "
                         f"(a handoff is kept {TTL_S:g} s, for one registration)")
        fds, timer = got
        timer.cancel()
        self._total[0] -= len(fds)
        return fds

    def _expire(self, seq: int) -> None:
        if seq in self._pending:
            log.info("memfd handoff expired %s", kv(event="memfd_expired", seq=seq))
            close_all(self.take(seq))

    def close(self) -> None:
        self.closed = True
        for conn in self.handoffs:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for seq in list(self._pending):
            close_all(self.take(seq))


def close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


# The names the kernel gives its own shmem files behind a SysV segment and behind
# MAP_SHARED | MAP_ANONYMOUS memory, as /proc/self/fd shows them.
_SHMEM_NAME = re.compile(r"/(SYSV[0-9a-f]{8}|dev/zero) \(deleted\)")


@functools.cache
def _shmem_dev() -> int:
    """The device of the kernel's internal shmem mount, where memfds, SysV segments and
    shared anonymous memory live (one per kernel, whatever the namespaces): learned from
    a memfd of the daemon's own."""
    fd = os.memfd_create("softhca-probe", os.MFD_CLOEXEC)
    try:
        return os.fstat(fd).st_dev
    finally:
        os.close(fd)


def _check_fd(fd: int, i: int, need: int) -> None:
    """The handoff's ``i``th fd (the daemon's own ``fd``) is memory no one can shrink
    under the daemon's mapping, of at least ``need`` bytes: a memfd sealed against
    shrinking, or the kernel-internal shmem file of a SysV segment or of shared anonymous
    memory. Those two cannot be sealed, but no unprivileged process can hold an fd of
    them to truncate them: the only way to one is /proc/PID/map_files, which the kernel
    opens for CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE only. A file of a filesystem
    (/dev/shm, hugetlbfs, a disk) its owner can cut at any time: refused."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
        st = os.fstat(fd)
    except OSError as e:
        raise RDMAError("EFAULT", f"ibv_reg_mr: fd {i} of the handoff cannot be "
                                  f"examined ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise einval(f"ibv_reg_mr: fd {i} of the handoff is {target}, not a memfd")
    if target.startswith("/memfd:"):
        if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
            raise einval(f"ibv_reg_mr: memfd {i} of the handoff is not sealed against "
                         "shrinking (F_SEAL_SHRINK), so it could be cut under the daemon")
    elif not (_SHMEM_NAME.fullmatch(target) and st.st_dev == _shmem_dev()):
        raise einval(f"ibv_reg_mr: fd {i} of the handoff is {target}, neither a memfd "
                     "sealed against shrinking nor a SysV segment or shared anonymous "
                     "memory: a file its owner could cut under the daemon")
    # a mapping may reach into the last, partial page of a file (a SysV segment of a
    # size that is no multiple of pages)
    if (st.st_size + PAGE - 1) // PAGE * PAGE < need:
        raise einval(f"ibv_reg_mr: fd {i} of the handoff holds {st.st_size} bytes, a "
                     f"piece needs {need}")


# A line of /proc/PID/maps: range, permissions, offset, device, inode, name.
_MAPS_LINE = re.compile(r"([0-9a-f]+)-([0-9a-f]+) (\S{4}) ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) "
                        r"(\d+)\s*(.*)")
_SYSV_NAME = re.compile(r"/SYSV[0-9a-f]{8} \(deleted\)")

# The mapping that holds an address is asked of the kernel with the PROCMAP_QUERY ioctl
# of a /proc/PID/maps fd (Linux 6.11, uapi linux/fs.h): a lookup in the process's tree of
# mappings, whatever their number. Reading and parsing the whole file instead costs in
# proportion to them (a program of 60,000 mappings: 3 MB, ~70 ms per piece, with the
# event loop held), so on a kernel without the ioctl the file is read only up to the
# line that holds the address, and at most MAX_MAPS_BYTES of it: a program whose
# mapping lies further is refused E2BIG rather than stall every other session.
PROCMAP_QUERY = 0xC0686611          # _IOWR('f', 17, struct procmap_query)
_VMA_READABLE, _VMA_WRITABLE, _VMA_EXECUTABLE, _VMA_SHARED = 0x1, 0x2, 0x4, 0x8
MAX_MAPS_BYTES = 128 << 10
_NAME_MAX = 512


class _ProcmapQuery(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "query_flags", "query_addr", "vma_start", "vma_end", "vma_flags",
        "vma_page_size", "vma_offset", "inode")] + [
        (name, ctypes.c_uint32) for name in (
            "dev_major", "dev_minor", "vma_name_size", "build_id_size")] + [
        ("vma_name_addr", ctypes.c_uint64), ("build_id_addr", ctypes.c_uint64)]


_libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_procmap_query = [True]             # cleared once the kernel says it has no such ioctl


def _vma_query(fd: int, addr: int):
    """The mapping of the maps file ``fd`` that holds ``addr`` as ``_vma`` gives it, None
    when none does, NotImplemented when the kernel has no PROCMAP_QUERY."""
    name = ctypes.create_string_buffer(_NAME_MAX)
    q = _ProcmapQuery(size=ctypes.sizeof(_ProcmapQuery), query_addr=addr,
                      vma_name_size=_NAME_MAX, vma_name_addr=ctypes.addressof(name))
    if _libc.ioctl(fd, PROCMAP_QUERY, ctypes.byref(q)) < 0:
        err = ctypes.get_errno()
        if err == errno.ENOENT:
            return None
        if err in (errno.ENOTTY, errno.EINVAL):
            return NotImplemented
        raise OSError(err, os.strerror(err))
    perms = "".join(c if q.vma_flags & bit else "-" for c, bit in (
        ("r", _VMA_READABLE), ("w", _VMA_WRITABLE), ("x", _VMA_EXECUTABLE)))
    perms += "s" if q.vma_flags & _VMA_SHARED else "p"
    return (q.vma_start, q.vma_end, perms, q.vma_offset,
            os.makedev(q.dev_major, q.dev_minor), q.inode,
            name.value.decode(errors="replace") if q.vma_name_size else "")


def _vma_scan(f, addr: int):
    """The line of the maps file ``f`` whose range holds ``addr``, parsed, or None: read
    up to it (the lines are in address order), at most MAX_MAPS_BYTES."""
    read = 0
    for line in f:
        read += len(line)
        if read > MAX_MAPS_BYTES:
            raise RDMAError("E2BIG", f"ibv_reg_mr: the address {addr:#x} lies past the "
                                     f"first {MAX_MAPS_BYTES} bytes of {f.name}, more than "
                                     "the daemon reads of it on a kernel without its "
                                     "PROCMAP_QUERY ioctl (Linux 6.11)")
        dash = line.find("-")
        if dash <= 0 or int(line[:dash], 16) > addr:
            return None
        if addr < int(line[dash + 1:line.find(" ", dash)], 16):
            # only the line that holds the address is parsed whole
            m = _MAPS_LINE.match(line)
            return m and (int(m.group(1), 16), int(m.group(2), 16), m.group(3),
                          int(m.group(4), 16),
                          os.makedev(int(m.group(5), 16), int(m.group(6), 16)),
                          int(m.group(7)), m.group(8))
    return None


def _vma(path: str, addr: int):
    """The mapping of the process whose maps file is ``path`` that holds ``addr``:
    (start, end, permissions as maps writes them, offset, device, inode, name), or None.
    OSError when the file cannot be read."""
    with open(path) as f:
        if _procmap_query[0]:
            got = _vma_query(f.fileno(), addr)
            if got is not NotImplemented:
                return got
            _procmap_query[0] = False
        return _vma_scan(f, addr)


class _Caller:
    """The process at the other end of a control session, for the SysV checks: its pid
    (SO_PEERCRED) and a pidfd of it, which tells whether that process still lives after
    its /proc files were read (so the pid was not another's by then)."""

    def __init__(self, session) -> None:
        cred = getattr(session, "peer_cred", None)
        if not cred or cred[0] <= 0:
            raise RDMAError("EOPNOTSUPP", "ibv_reg_mr: a SysV segment is attached for a "
                                          "program on the daemon's UNIX socket only")
        self.pid = cred[0]
        sock = session.writer.get_extra_info("socket")
        try:
            self.pidfd = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        except OSError as e:
            if e.errno == errno.ESRCH:
                raise RDMAError("EFAULT", "ibv_reg_mr: the program has exited") from None
            # an older kernel: the pid's process now (it is the caller while it waits
            # for this reply, unless it has handed its session to another)
            try:
                self.pidfd = os.pidfd_open(self.pid)
            except OSError:
                raise RDMAError("EFAULT", "ibv_reg_mr: the program has exited") from None

    def vma(self, addr: int):
        """The program's mapping that holds ``addr`` (``_vma``)."""
        try:
            return _vma(f"/proc/{self.pid}/maps", addr)
        except OSError as e:
            raise RDMAError("EACCES", f"ibv_reg_mr: the daemon cannot read the program's "
                                      f"/proc/{self.pid}/maps ({e.strerror})") from None

    def alive(self) -> bool:
        return not select.select([self.pidfd], [], [], 0)[0]

    def close(self) -> None:
        os.close(self.pidfd)


class _Segment:
    """A SysV segment attached in the daemon (shmat by its shmid), checked to be the one
    the caller maps at ``addr``, for its bytes [offset, offset + length): the caller is
    in the daemon's IPC namespace (where the shmid names the same segment), and the
    mapping of its that holds [addr, addr + length) is a shared, writable mapping of
    that segment's file (the kernel's shmem mount, not hugetlbfs: not SHM_HUGETLB; the
    inode number is the shmid) at that offset. The attachment is taken first and the
    caller's maps read after, so the shmid cannot name another segment between the two
    (a segment's id is not reused while it exists). Detached by ``close``; its pages
    stay in the registration's own mapping (place_sysv)."""

    def __init__(self, caller: _Caller, i: int, shmid: int, offset: int, length: int,
                 addr: int) -> None:
        here = os.stat("/proc/self/ns/ipc")
        try:
            there = os.stat(f"/proc/{caller.pid}/ns/ipc")
        except OSError as e:
            raise RDMAError("EACCES", f"ibv_reg_mr: the daemon cannot see the program's "
                                      f"IPC namespace ({e.strerror})") from None
        if (here.st_dev, here.st_ino) != (there.st_dev, there.st_ino):
            raise einval(f"ibv_reg_mr: piece {i} is SysV segment {shmid}, but the program "
                         "is in another IPC namespace than the daemon, where that shmid "
                         "names no segment of its")
        self.addr = _libc.shmat(shmid, None, 0)
        if self.addr in (None, MAP_FAILED):
            err = ctypes.get_errno()
            self.addr = None
            raise RDMAError("EACCES" if err == errno.EACCES else "EINVAL",
                            f"ibv_reg_mr: piece {i}: SysV segment {shmid} cannot be attached "
                            f"by the daemon (shmat: {os.strerror(err)})")
        try:
            self.size = self._check_own(i, shmid)
            self._check_caller(caller, i, shmid, offset, length, addr)
        except BaseException:
            self.close()
            raise

    def _check_own(self, i: int, shmid: int) -> int:
        vma = _vma("/proc/self/maps", self.addr)
        if vma is None or vma[0] != self.addr or vma[4] != _shmem_dev() or vma[5] != shmid:
            # a segment of huge pages (SHM_HUGETLB) is a file of hugetlbfs
            raise einval(f"ibv_reg_mr: piece {i}: SysV segment {shmid} is not on the "
                         "kernel's shmem mount (a segment of huge pages, SHM_HUGETLB?), "
                         "which softhca does not share with its daemon")
        return vma[1] - vma[0]

    def _check_caller(self, caller: _Caller, i: int, shmid: int, offset: int, length: int,
                      addr: int) -> None:
        vma = caller.vma(addr)
        ok = (vma is not None and addr + length <= vma[1] and vma[2][:2] == "rw"
              and vma[2][3] == "s" and vma[4] == _shmem_dev() and vma[5] == shmid
              and _SYSV_NAME.fullmatch(vma[6])
              and vma[3] + (addr - vma[0]) == offset)
        if not ok:
            what = "nothing" if vma is None else (
                f"[{vma[0]:#x}, {vma[1]:#x}) {vma[2]} offset {vma[3]:#x} inode {vma[5]} "
                f"{vma[6] or '(anonymous)'}")
            raise einval(f"ibv_reg_mr: piece {i} names SysV segment {shmid} at offset "
                         f"{offset:#x} mapped writable and shared at [{addr:#x}, "
                         f"{addr + length:#x}), but the program maps {what} there")
        if offset + length > self.size:
            raise einval(f"ibv_reg_mr: piece {i}: SysV segment {shmid} holds {self.size} "
                         f"bytes, the piece needs {offset + length}")
        if not caller.alive():
            raise RDMAError("EFAULT", "ibv_reg_mr: the program exited while its SysV "
                                     "segment was checked")

    def close(self) -> None:
        if self.addr is not None:
            # the whole attachment, whatever its page size (munmap of part of a
            # SHM_HUGETLB mapping would be EINVAL)
            _libc.shmdt(self.addr)
            self.addr = None


def _map(fds: list[int], pieces: tuple[tuple, ...], session=None) -> np.ndarray:
    for p in pieces:
        if p[0] != control.SYSV_PIECE and p[0] >= len(fds):
            raise einval(f"ibv_reg_mr: a piece names memfd {p[0]} of a handoff of {len(fds)}")
    m = _Mapping(sum(p[-2] if p[0] == control.SYSV_PIECE else p[2] for p in pieces))
    caller = None
    try:
        pos = 0
        for n, p in enumerate(pieces):
            if p[0] == control.SYSV_PIECE:
                _, shmid, offset, length, addr = p
                if caller is None:
                    caller = _Caller(session)
                seg = _Segment(caller, n, shmid, offset, length, addr)
                try:
                    m.place_sysv(pos, seg, offset, length)
                finally:
                    seg.close()
            else:
                i, offset, length = p
                _check_fd(fds[i], i, offset + length)
                m.place(pos, fds[i], offset, length)
            pos += length
    finally:
        if caller is not None:
            caller.close()
    return m.array()


def op_reg_mr_shared(verbs, r: control.RegMrShared, rid: int) -> dict | None:
    inbox = getattr(verbs.session, "memfds", None)
    if inbox is None:
        raise RDMAError("EOPNOTSUPP", "reg_mr_shared: a program's memory is shared over "
                                      "the daemon's UNIX socket only (serve --unix)")
    # claimed first: whatever fails below, the handoff's fds are closed (a registration
    # of SysV segments the daemon attaches only has none)
    fds = inbox.take(r.fds) if any(p[0] != control.SYSV_PIECE for p in r.pieces) else []
    try:
        return _register(verbs, r, fds)
    finally:
        close_all(fds)


def _register(verbs, r: control.RegMrShared, fds: list[int]) -> dict:
    pd = verbs.get(r.pd, "pd")
    n = r.length
    if n <= 0:
        raise einval(f"ibv_reg_mr length {n} must be positive")
    check_mr_range(r.addr, n)       # before anything of the program's is mapped
    total = sum(p[-2] if p[0] == control.SYSV_PIECE else p[2] for p in r.pieces)
    # The pieces are exactly the registration's pages: nothing more is mapped.
    pages = (r.offset + n + PAGE - 1) // PAGE * PAGE
    if r.offset >= PAGE or total != pages:
        raise einval(f"ibv_reg_mr: {n} bytes at offset {r.offset} are {pages} bytes of "
                     f"pages, the pieces named hold {total}")
    verbs.charge_registration(n)
    buf = _map(fds, r.pieces, verbs.session)[r.offset:r.offset + n]
    mr = pd.hca.reg_mr(pd, n, r.access, at=(r.addr, buf))
    verbs.registered_bytes += n
    verbs.daemon.registered_bytes += n
    log.debug("shared MR %s", kv(event="reg_mr_shared", peer=verbs.peer, addr=hex(r.addr),
                                 length=n, pieces=len(r.pieces), lkey=hex(mr.lkey)))
    return {"mr": verbs.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
            "length": mr.length}


HANDLERS = {
    control.RegMrShared: op_reg_mr_shared,
}
