"""The pieces of a local program's registration (``reg_mr_shared``, protocol/control.py).

ibv_reg_mr of a program's own memory on the UNIX socket: the registered pages are
``pieces`` of sealed memfds, each ``[memfd, offset, length]`` (the memfd's index among
those the program handed over under the number ``fds``, page-aligned offset and length;
server/shared_mr.py), or of SysV segments the daemon attaches itself (``["sysv", shmid,
offset, length, addr]``), side by side in address order; the registration is their bytes
[offset, offset + length), at the program's virtual address ``addr`` (the MR's iova).
"""

from __future__ import annotations

from .frames import FrameError
from .schema import U64

__all__ = ["MAX_PIECES", "SYSV_PIECE", "decode_pieces"]

MAX_PIECES = 16
# The first item of a SysV segment's piece.
SYSV_PIECE = "sysv"


def _paged(*xs) -> bool:
    """Each an int, a page-aligned u64."""
    return all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= U64
               and x % 4096 == 0 for x in xs)


def _piece(p) -> tuple | None:
    """One piece as a tuple, or None when it has neither form."""
    if isinstance(p, list) and len(p) == 5 and p[0] == SYSV_PIECE:
        shmid, offset, length, addr = p[1:]
        ok = type(shmid) is int and 0 <= shmid < 1 << 31 and _paged(offset, length, addr)
        return (SYSV_PIECE, *p[1:]) if ok and length > 0 else None
    if isinstance(p, list) and len(p) == 3 and type(p[0]) is int:
        memfd, offset, length = p
        ok = 0 <= memfd < MAX_PIECES and _paged(offset, length)
        return (memfd, offset, length) if ok and length > 0 else None
    return None


def decode_pieces(pieces: list) -> tuple[tuple, ...]:
    """``[memfd, offset, length]``: a piece of the handoff's fd ``memfd``; or ``["sysv",
    shmid, offset, length, addr]``: a piece of the SysV segment ``shmid``, which the
    caller maps at ``addr`` (the daemon attaches it itself)."""
    out = []
    for i, p in enumerate(pieces):
        piece = _piece(p)
        if piece is None:
            raise FrameError("EPROTO", f"reg_mr_shared: pieces[{i}] must be [memfd, "
                                       f"offset, length], memfd the index of one in the "
                                       f"handoff, or [\"sysv\", shmid, offset, length, "
                                       f"addr], offset, length and addr page-aligned, got "
                                       f"{p!r}"[:200])
        out.append(piece)
    return tuple(out)
