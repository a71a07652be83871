"""The daemon's side of a CQ's shared completion ring (protocol/cq_ring.py).

The provider makes the ring, a memfd of its own sealed against shrinking, and hands it
over as it hands over registered memory (server/shared_mr.py's handoff); the daemon
maps it and writes the CQ's completions into it. The ring is the program's memory, so
nothing in it is trusted but what bounds check: the daemon keeps the producer index
itself (the one in the ring is only published there), and reads the consumer index
only to learn the room, refusing one that is ahead of the producer or more than the
ring behind it (the CQ goes to error then, as an overrun does: never an out of bounds
write).

Publication order. ``write`` packs the entries' bytes into the mapping and then stores
the producer index, one aligned 8-byte store (a memoryview of native unsigned 64-bit
items: CPython copies the item with one memcpy of 8 bytes, one mov on x86-64, so the
program never sees half an index). x86-64 keeps stores in program order (TSO) and
CPython's stores happen in the order of the statements, so a program that sees the new
producer index sees the entries before it: the store of the index is a release. The C
side (provider/cq.c) loads the producer with acquire order, reads the entries, then
stores the consumer with release order, so the daemon never overwrites an entry the
program is still reading. The daemon runs on x86-64 only for this reason (a weaker
machine would need a fence the interpreter cannot give): ``supported`` says so.

Waking a waiting poll. An empty ibv_poll_cq does not spin (the program would take the
CPU the daemon needs to make the completion: measured in docs/performance.md): it
counts itself in the header's waiters and sleeps on the producer index as a futex(2)
for at most 200 us. After publishing, the daemon reads the waiters of every ring of the
session and, where there are any, wakes them (FUTEX_WAKE; a shared futex, keyed by the
memfd's page, so the two mappings' addresses need not agree): a program polling its
send and receive CQs in turn sleeps on whichever it polled last, and the frame path's
wait, one per connection, woke at a completion of any CQ too. The daemon has no fence between its store of the
index and its load of the count, so on x86-64 that load may pass the store and miss a
thread that counted itself just then; that thread's futex_wait compares the index in
the kernel, well after the store left the store buffer, and at worst sleeps its bound.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import mmap
import os
import platform
import socket
import stat
import struct
from collections.abc import Iterator

from ..protocol.cq_ring import (
    CONSUMER_OFFSET,
    ENTRY_FORMAT,
    PRODUCER_OFFSET,
    WAITERS_OFFSET,
    entry_offset,
    ring_bytes,
)
from ..protocol.errors import RDMAError, einval
from ..protocol.records import WC
from .shared_mr import close_all

__all__ = ["CqRing", "EventSocket", "supported", "take_event_socket"]

_ENTRY = struct.Struct(ENTRY_FORMAT)
# A mapping larger than this is not a CQ's ring (max_cqe entries of 64 bytes, and the
# header, are far below it).
_MAX_BYTES = 1 << 30
# futex(2) on x86-64: the system call's number and FUTEX_WAKE (shared: no PRIVATE flag).
_SYS_FUTEX, _FUTEX_WAKE = 202, 1
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _wake(addr: int) -> None:
    _libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr),
                  ctypes.c_int(_FUTEX_WAKE), ctypes.c_int(0x7FFFFFFF), None, None,
                  ctypes.c_int(0))


def supported() -> bool:
    """Whether this daemon can share rings: its stores reach the program in order
    (x86-64's TSO) and memfds exist."""
    return platform.machine() in ("x86_64", "AMD64") and hasattr(os, "memfd_create")


def check_ring_fd(fd: int, need: int, verb: str, what: str = "CQ") -> int:
    """The size of ``fd`` if it is a memfd sealed against shrinking of at least ``need``
    bytes (the program could otherwise cut it under the daemon's mapping, and the
    daemon's next write would fault); EINVAL naming the fault otherwise."""
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
        st = os.fstat(fd)
    except OSError as e:
        raise RDMAError("EFAULT", f"{verb}: the ring's fd cannot be examined "
                                  f"({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode) or not target.startswith("/memfd:"):
        raise einval(f"{verb}: the ring's fd is {target}, not a memfd")
    if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
        raise einval(f"{verb}: the ring's memfd is not sealed against shrinking "
                     "(F_SEAL_SHRINK), so it could be cut under the daemon")
    if not need <= st.st_size <= _MAX_BYTES:
        raise einval(f"{verb}: the ring's memfd holds {st.st_size} bytes, a ring of this "
                     f"{what} needs {need}")
    return st.st_size


class CqRing:
    """One CQ's ring, mapped: ``write`` publishes entries, ``unpolled`` reads the room."""

    def __init__(self, fd: int, slots: int, verb: str = "ibv_create_cq") -> None:
        size = check_ring_fd(fd, ring_bytes(slots), verb)
        self.slots = slots
        self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # the two indices as native 8-byte items: one load, one store each
        self._index = memoryview(self._map).cast("B")[:CONSUMER_OFFSET + 8].cast("Q")
        self._waiters = memoryview(self._map).cast("B")[
            WAITERS_OFFSET:WAITERS_OFFSET + 4].cast("I")
        # the producer index's address in this mapping: the futex the polls sleep on
        self._anchor = ctypes.c_char.from_buffer(self._map, PRODUCER_OFFSET)
        self._futex = ctypes.addressof(self._anchor)
        self.producer = 0
        self._index[PRODUCER_OFFSET // 8] = 0

    def unpolled(self) -> int | None:
        """Entries written and not yet consumed, by the program's consumer index; None
        when that index is not one a program polling this ring can have (ahead of the
        producer, or more than the ring behind it)."""
        behind = self.producer - self._index[CONSUMER_OFFSET // 8]
        return behind if 0 <= behind <= self.slots else None

    def write(self, wcs: list[WC]) -> None:
        """The entries, then the producer index (the caller checked the room)."""
        m, p, slots = self._map, self.producer, self.slots
        for w in wcs:
            _ENTRY.pack_into(m, entry_offset(p, slots), w.wr_id, int(w.status),
                             int(w.opcode), w.byte_len, w.imm_data or 0, w.qp_num,
                             int(w.wc_flags), w.vendor_err, w.invalidated_rkey, w.src_qp)
            p += 1
        self.producer = p
        self._index[PRODUCER_OFFSET // 8] = p

    def wake(self) -> None:
        """The program's threads asleep in an empty poll of this ring woken, if any:
        a completion came into one of the session's rings (any of them, as a program
        that polls two CQs in turn sleeps on the one it polled last)."""
        if self._waiters[0]:
            _wake(self._futex)

    def move_to(self, new: CqRing) -> int:
        """ibv_resize_cq: the unpolled entries copied to the start of ``new`` (its
        producer after them); their count. The caller checked ``unpolled`` and that
        they fit; the program polls neither ring meanwhile (provider/cq.c)."""
        n = self.unpolled() or 0
        start = self.producer - n
        for i in range(n):
            at = entry_offset(start + i, self.slots)
            to = entry_offset(i, new.slots)
            new._map[to:to + _ENTRY.size] = self._map[at:at + _ENTRY.size]
        new.producer = n
        new._index[PRODUCER_OFFSET // 8] = n
        return n

    def close(self) -> None:
        self._index.release()
        self._waiters.release()
        del self._anchor
        self._map.close()


@contextlib.contextmanager
def handed_fd(verbs, seq: int, verb: str, what: str, offered: str) -> Iterator[int]:
    """The one fd the session's program handed over under ``seq`` (a memfd HELLO on the
    UNIX socket), closed on the way out whatever happens: what is made of it (a mapping,
    a dup) keeps what it needs. EOPNOTSUPP, ``offered`` saying where, on a session
    that can hand over no fds or a daemon that offers no rings; EINVAL when the handoff
    carried more than one (``what`` names it)."""
    inbox = getattr(verbs.session, "memfds", None)
    if inbox is None or not supported():
        raise RDMAError("EOPNOTSUPP", f"{verb}: {offered}")
    fds = inbox.take(seq)
    try:
        if len(fds) != 1:
            raise einval(f"{verb}: {what} is one fd, the handoff {seq} carried {len(fds)}")
        yield fds[0]
    finally:
        close_all(fds)


def take_ring(verbs, seq: int, slots: int, verb: str) -> CqRing:
    """The ring the session's program handed over under ``seq`` (one memfd), mapped."""
    with handed_fd(verbs, seq, verb, "a ring", "completion rings are shared with local "
                   "programs over the daemon's UNIX socket on x86-64 only") as fd:
        return CqRing(fd, slots, verb)


class EventSocket:
    """The write end of a completion channel's event socket, for one ring CQ bound to
    the channel: the daemon writes the CQ's event there itself, as the kernel writes a
    completion event into a channel's file, where a frame would wake the program's
    reader thread only for it to write the same 8 bytes (docs/native.md, "Completion
    channels"). ``event`` is what ibv_get_cq_event reads back: the CQ's user handle."""

    def __init__(self, fd: int, event: int, verb: str) -> None:
        try:
            mode = os.fstat(fd).st_mode
        except OSError as e:
            raise RDMAError("EFAULT", f"{verb}: the channel's fd cannot be examined "
                                      f"({e.strerror})") from None
        if not stat.S_ISSOCK(mode):
            raise einval(f"{verb}: the completion channel's fd is not a socket")
        sock = socket.socket(fileno=os.dup(fd))
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            sock.close()
            raise einval(f"{verb}: the completion channel's fd is not a UNIX stream socket")
        self._sock = sock
        # the program reads a native u64: the rings are offered on x86-64 only
        self._event = struct.pack("<Q", event)

    def signal(self) -> bool:
        """The event written, never blocking: False when the program's socket is full
        (it reads no events) or gone, and the caller sends the event as a frame."""
        try:
            return self._sock.send(self._event, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) == 8
        except OSError:
            return False

    def close(self) -> None:
        self._sock.close()


def take_event_socket(verbs, seq: int, event: int, verb: str) -> EventSocket:
    """The channel's event socket the session's program handed over under ``seq`` (one
    fd; the EventSocket keeps a dup of it)."""
    with handed_fd(verbs, seq, verb, "a channel's handoff", "channel events are written "
                   "for local programs over the daemon's UNIX socket only") as fd:
        return EventSocket(fd, event, verb)
