"""MRs backed by a local program's own memory (the ``reg_mr_shared`` request).

The provider (provider/mem.c) moves the pages of a registration onto a memfd at the
same virtual addresses and names the memfd by its number in the program. The daemon
opens it as /proc/<pid>/fd/<n>, the pid being the UNIX socket's SO_PEERCRED (so a
program can only name its own files), checks that it is a memfd sealed against
shrinking (a file cut under the daemon's mapping would fault the daemon), maps it
shared, and registers the bytes at the program's virtual address. Every access then
goes through the engine's MR checks, which bound it by the registration: a work
request naming an address outside it is refused like any other.

When the MR is deregistered or the session ends, the mapping goes with the MR's last
reference; the daemon keeps no fd of the program's.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import stat

import numpy as np

from ..protocol import control
from ..protocol.errors import RDMAError, einval
from .logs import kv, log

PAGE = mmap.PAGESIZE


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
        seals = fcntl.fcntl(own, fcntl.F_GET_SEALS)
        if not seals & fcntl.F_SEAL_SHRINK:
            raise einval(f"ibv_reg_mr: memfd {fd} is not sealed against shrinking "
                         "(F_SEAL_SHRINK), so it could be cut under the daemon")
        if st.st_size < need:
            raise einval(f"ibv_reg_mr: memfd {fd} holds {st.st_size} bytes, the "
                         f"registration needs {need}")
    except BaseException:
        os.close(own)
        raise
    return own


def op_reg_mr_shared(verbs, r: control.RegMrShared, rid: int) -> dict | None:
    cred = getattr(verbs.session, "peer_cred", None)
    if cred is None:
        raise RDMAError("EOPNOTSUPP", "reg_mr_shared: a program's memory is shared over "
                                      "the daemon's UNIX socket only (serve --unix)")
    pd = verbs.get(r.pd, "pd")
    n = r.length
    if n <= 0:
        raise einval(f"ibv_reg_mr length {n} must be positive")
    verbs.charge_registration(n)
    need = r.offset + n
    fd = _open_memfd(cred[0], r.fd, need)
    try:
        size = (need + PAGE - 1) // PAGE * PAGE
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as e:
        raise RDMAError("EFAULT", f"ibv_reg_mr: mapping memfd {r.fd} failed: {e}") from None
    finally:
        os.close(fd)
    buf = np.frombuffer(mapping, dtype=np.uint8, count=n, offset=r.offset)
    mr = pd.hca.reg_mr(pd, n, r.access, at=(r.addr, buf))
    verbs.registered_bytes += n
    verbs.daemon.registered_bytes += n
    log.debug("shared MR %s", kv(event="reg_mr_shared", peer=verbs.peer, addr=hex(r.addr),
                                 length=n, lkey=hex(mr.lkey)))
    return {"mr": verbs.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
            "length": mr.length}
