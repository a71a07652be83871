"""MRs of the embedded daemon's own process (the ``reg_mr_process`` request): with the
daemon in the same process as the program, the program's memory is the daemon's, so
``ibv_reg_mr`` of an address registers those very bytes, and a peer's RDMA WRITE lands
in the caller's buffer.

Only a session that proves it runs in the daemon's process may ask: the daemon object
of an embedded daemon carries a random ``process_secret`` that the in-process client
reads from the object and sends; nothing else has it (it never leaves the process but
over the loopback control connection of that process). Any other daemon, or a request
without it, is EOPNOTSUPP, as registering process memory over a remote daemon is.

The range must be mapped writable in the process (/proc/self/maps, read once per
registration: an unmapped range is EFAULT instead of a fault of the process later).
The memory stays the program's: freeing it while registered is the program's error, as
freeing memory a device may DMA into is.
"""

from __future__ import annotations

import ctypes
import hmac

import numpy as np

from ..engine.hca import check_mr_range
from ..protocol import control
from ..protocol.errors import RDMAError, einval
from .logs import kv, log

MAPS = "/proc/self/maps"


def _writable_ranges() -> list[tuple[int, int]]:
    out = []
    with open(MAPS) as f:
        for line in f:
            parts = line.split(maxsplit=2)
            lo, hi = parts[0].split("-")
            if parts[1][:2] == "rw":
                out.append((int(lo, 16), int(hi, 16)))
    return out


def check_mapped(addr: int, length: int) -> None:
    """EFAULT unless [addr, +length) is mapped read-write in this process."""
    pos, end = addr, addr + length
    for lo, hi in sorted(_writable_ranges()):
        if lo <= pos < hi:
            pos = hi
            if pos >= end:
                return
    raise RDMAError("EFAULT", f"ibv_reg_mr: [{addr:#x}, +{length}) is not read-write memory "
                              "of this process")


def process_buffer(verbs, secret: bytes, addr: int, length: int) -> np.ndarray:
    """The process's ``length`` bytes at ``addr`` as an array, once the session proved
    it is in this process; the errors of the module docstring."""
    mine = getattr(verbs.daemon, "process_secret", None)
    if mine is None or not hmac.compare_digest(bytes(secret), mine):
        raise RDMAError("EOPNOTSUPP", "ibv_reg_mr of a program's own memory: only with the "
                                      "embedded daemon in the program's process (or the "
                                      "provider over the UNIX socket)")
    if length <= 0 or addr == 0:
        raise einval(f"ibv_reg_mr of {length} bytes at {addr:#x}")
    check_mr_range(addr, length)
    check_mapped(addr, length)
    return np.frombuffer((ctypes.c_uint8 * length).from_address(addr), dtype=np.uint8)


def op_reg_mr_process(verbs, r: control.RegMrProcess, rid: int) -> dict:
    pd = verbs.get(r.pd, "pd")
    buf = process_buffer(verbs, r.secret, r.addr, r.length)
    verbs.charge_registration(r.length)
    mr = pd.hca.reg_mr(pd, r.length, r.access, at=(r.addr, buf))
    verbs.registered_bytes += r.length
    verbs.daemon.registered_bytes += r.length
    log.debug("process MR %s", kv(event="reg_mr_process", peer=verbs.peer, addr=hex(r.addr),
                                  length=r.length, lkey=hex(mr.lkey)))
    return {"mr": verbs.add("mr", mr), "lkey": mr.lkey, "rkey": mr.rkey, "addr": mr.addr,
            "length": mr.length}


HANDLERS = {
    control.RegMrProcess: op_reg_mr_process,
}
