"""MRs backed by a local program's own memory (the ``reg_mr_shared`` request).

The provider (provider/mem.c) moves the pages of a registration onto memfds at the
same virtual addresses and names them by their numbers in the program, as pieces in
address order (pages an earlier registration already moved stay on its memfd, so a
registration may span several). The daemon opens each as /proc/<pid>/fd/<n>, the pid
being the UNIX socket's SO_PEERCRED (a program can only name its own files), checks
that it is a memfd sealed against shrinking (a file cut under the daemon's mapping
would fault the daemon), maps the pieces side by side into one reserved range, and
registers the bytes at the program's virtual address. Every access then goes through
the engine's MR checks, which bound it by the registration: a work request naming an
address outside it is refused like any other.

The daemon keeps no fd of the program's: each is closed once mapped. The mapping goes
when the MR's last view does (deregistration, the session's end).
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
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
MAP_FAILED = ctypes.c_void_p(-1).value
MAP_FIXED = 0x10
MAP_NORESERVE = 0x4000
PROT_NONE = 0


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

    def array(self) -> np.ndarray:
        view = (ctypes.c_uint8 * self.size).from_address(self.base)
        view._mapping = self        # the array keeps the view, the view keeps this
        return np.frombuffer(view, dtype=np.uint8)

    def __del__(self) -> None:
        if self.base is not None:
            _libc.munmap(self.base, self.size)


def _open_memfd(pid: int, fd: int, need: int) -> int:
    """An fd of the daemon's own for the program's memfd ``fd``, checked."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        target = os.readlink(path)
        own = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise RDMAError("EFAULT", f"ibv_reg_mr: the program's fd {fd} cannot be opened "
                                  f"({e.strerror})") from None
    try:
        st = os.fstat(own)
        if not target.startswith("/memfd:") or not stat.S_ISREG(st.st_mode):
            raise einval(f"ibv_reg_mr: the program's fd {fd} is {target}, not a memfd")
        if not fcntl.fcntl(own, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
            raise einval(f"ibv_reg_mr: memfd {fd} is not sealed against shrinking "
                         "(F_SEAL_SHRINK), so it could be cut under the daemon")
        if st.st_size < need:
            raise einval(f"ibv_reg_mr: memfd {fd} holds {st.st_size} bytes, a piece "
                         f"needs {need}")
    except BaseException:
        os.close(own)
        raise
    return own


def _map(pid: int, pieces: tuple[tuple[int, int, int], ...]) -> np.ndarray:
    m = _Mapping(sum(length for _, _, length in pieces))
    pos = 0
    for fd, offset, length in pieces:
        own = _open_memfd(pid, fd, offset + length)
        try:
            m.place(pos, own, offset, length)
        finally:
            os.close(own)
        pos += length
    return m.array()


def op_reg_mr_shared(verbs, r: control.RegMrShared, rid: int) -> dict | None:
    cred = getattr(verbs.session, "peer_cred", None)
    if cred is None:
        raise RDMAError("EOPNOTSUPP", "reg_mr_shared: a program's memory is shared over "
                                      "the daemon's UNIX socket only (serve --unix)")
    pd = verbs.get(r.pd, "pd")
    n = r.length
    if n <= 0:
        raise einval(f"ibv_reg_mr length {n} must be positive")
    check_mr_range(r.addr, n)       # before anything of the program's is mapped
    total = sum(length for _, _, length in r.pieces)
    # The pieces are exactly the registration's pages: nothing more is mapped.
    pages = (r.offset + n + PAGE - 1) // PAGE * PAGE
    if r.offset >= PAGE or total != pages:
        raise einval(f"ibv_reg_mr: {n} bytes at offset {r.offset} are {pages} bytes of "
                     f"pages, the pieces named hold {total}")
    verbs.charge_registration(n)
    buf = _map(cred[0], r.pieces)[r.offset:r.offset + n]
    mr = pd.hca.reg_mr(pd, n, r.access, at=(r.addr, buf))
    verbs.registered_bytes += n
    verbs.daemon.registered_bytes += n
    log.debug("shared MR %s", kv(event="reg_mr_shared", peer=verbs.peer, addr=hex(r.addr),
                                 length=n, pieces=len(r.pieces), lkey=hex(mr.lkey)))
    return {"mr": verbs.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
            "length": mr.length}
