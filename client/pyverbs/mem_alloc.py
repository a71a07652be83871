"""pyverbs.mem_alloc: memory of this process (mmap, posix_memalign, raw reads and writes).

These are the C library's calls on this process's memory, through ctypes. softhca cannot
register such memory (its MRs live in the daemon), but pyverbs code uses the helpers
for other buffers too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap as _mm
import os

from .pyverbs_error import PyverbsRDMAError

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                 ctypes.c_size_t]

PROT_EXEC_, PROT_READ_, PROT_WRITE_, PROT_NONE_ = (_mm.PROT_EXEC, _mm.PROT_READ,
                                                   _mm.PROT_WRITE, 0)
MAP_PRIVATE_, MAP_SHARED_ = _mm.MAP_PRIVATE, _mm.MAP_SHARED
MAP_FIXED_ = 0x10
MAP_ANONYMOUS_ = _mm.MAP_ANONYMOUS
MAP_STACK_, MAP_LOCKED_, MAP_HUGETLB_ = 0x20000, 0x2000, 0x40000
MAP_POPULATE_, MAP_NORESERVE_, MAP_GROWSDOWN_ = 0x8000, 0x4000, 0x100


def mmap(addr=0, length=100, prot=_mm.PROT_READ | _mm.PROT_WRITE,
         flags=_mm.MAP_PRIVATE | _mm.MAP_ANONYMOUS, fd=0, offset=0):
    ptr = _libc.mmap(addr, length, prot, flags, fd, offset)
    if ptr in (None, ctypes.c_void_p(-1).value):
        raise MemoryError("Failed to mmap memory")
    return ptr


def munmap(addr, length):
    if _libc.munmap(addr, length) < 0:
        raise MemoryError("Failed to munmap requested memory")


def madvise(addr, length, flags=_mm.MADV_DONTNEED):
    """madvise(2) on this process's memory (rdma-core v55 on)."""
    if _libc.madvise(addr, length, flags) != 0:
        err = ctypes.get_errno()
        raise PyverbsRDMAError(f"Failed to madvise memory: {os.strerror(err)}", err)


def malloc(size):
    ptr = _libc.malloc(size)
    if not ptr:
        raise MemoryError("Failed to allocate memory")
    return ptr


def posix_memalign(size, alignment=8):
    p = ctypes.c_void_p()
    if _libc.posix_memalign(ctypes.byref(p), alignment, size) != 0:
        raise MemoryError("Failed to allocate memory")
    return p.value


def free(ptr):
    _libc.free(ptr)


def writebe32(addr, val, offset=0):
    ctypes.memmove(addr + offset, int(val).to_bytes(4, "big"), 4)


def writebe64(addr, val, offset=0):
    ctypes.memmove(addr + offset, int(val).to_bytes(8, "big"), 8)


def write(addr, data, length, offset=0):
    if isinstance(data, str):
        data = data.encode()
    ctypes.memmove(addr + offset, bytes(data[:length]), length)


def read32(addr, offset=0):
    return int.from_bytes(ctypes.string_at(addr + offset, 4), "little")


def read64(addr, offset=0):
    return int.from_bytes(ctypes.string_at(addr + offset, 8), "little")


def read(addr, length, offset=0):
    return ctypes.string_at(addr + offset, length)
