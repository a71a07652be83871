"""The ``runs`` frame: the runs of several messages, of one QP or of several, in one frame.

A train (protocol/packets.py) carries the packets of one message; a stream of small
messages (a posted list of 4 KiB RDMA WRITEs, each a train of one packet) was still a
frame per message: a header encoded and decoded, a check computed twice, and the trip
through both daemons' frame code each time. A ``runs`` frame carries the runs one link
lets go at once, to QPs of one HCA of the peer daemon, each as the train frame would
have carried it (docs/protocol.md, "Runs frames")::

    {"t": "runs", "dev": "mlx5_0",
     "r": [[sqp, qp, psn, n, kind, pos, mtu, length, reth, aeth, imm, ieth], ...],
     "chk": u32}

then the runs' payloads back to back, ``length`` bytes each, in the order of ``r``.
Each entry is one run with a train's fields (``sqp`` the source QP a packet frame names
beside its header; an absent extension header is nil). ``chk`` is ``zlib.crc32`` of
``msgpack([dev, r])``: every field of every run, not the payloads (the train check's
reasoning: a run is never altered once built, everything that alters packets sees them
cut, and the bytes ride on TCP's checksum).

A receiver decodes the frame to the runs a train frame of each would have given, with
the same checks, and takes them one after the other: nothing downstream (the QPs, the
taps, the counters) can tell the two framings apart. A sender uses it only towards a
daemon whose welcome says ``"runs": 1``; a receiver takes ``pkt`` and ``train`` frames
whatever it announced, so daemons of the previous version interoperate both ways.

What a receiver refuses (EPROTO, the wire peer disconnected), all before any payload is
looked at: ``r`` not a list of 2 .. ``RUNS_FRAME_MAX`` entries; an entry that is not a
list of 12 fields or whose fields a train's header would refuse (a count outside
1 .. ``FRAME_RUN_MAX``, a PSN range that wraps, a kind that is not one of the three,
extension headers other than exactly those its end packets need, a ``length`` that
``n`` packets of ``mtu`` do not carry); lengths that do not add up to the payload. The
work is bounded by the entries, at most ``RUNS_FRAME_MAX``; nothing is allocated per
claimed packet. A frame well formed whose check does not match is dropped and counted
as the packets it claimed (IntegrityError).
"""

from __future__ import annotations

import zlib

import msgpack

from .frames import FrameError, encode_frame, field
from .kinds import FrameKind
from .packets import (
    _EXTENSIONS,
    _FIRST,
    _LAST,
    _TRAIN_NEEDS,
    _U32,
    _U64,
    FRAME_RUN_MAX,
    PSN_MOD,
    RUN_KINDS,
    TRAIN_MTUS,
    IntegrityError,
    Run,
    _check_train_payload,
    _listify,
)

__all__ = ["RUNS_FRAME_MAX", "decode_runs", "runs_frame", "runs_check"]

_RUNS = FrameKind.RUNS.value
# The most runs one frame carries. A sender's frame of this many 4 KiB WRITEs is 512
# KiB of payload and some 8 KiB of header (under REQUEST_LIMITS' 16,384-byte mark, past
# which the unpacker counts containers by a hook each); a receiver refuses more.
RUNS_FRAME_MAX = 128
_FIELDS = 12


def _entry(t: Run, sqp: int) -> list:
    return [sqp, t.dest_qp, t.psn, t.n, t.kind,
            (_FIRST if t.first else 0) | (_LAST if t.last else 0), t.mtu, len(t.payload),
            _listify(t.reth), _listify(t.aeth), t.imm, t.ieth]


def runs_check(dev: str, entries: list) -> int:
    """A runs frame's integrity check: CRC32 over its device and every run's fields."""
    return zlib.crc32(msgpack.packb([dev, entries], use_bin_type=True))


def runs_frame(dev: str, runs: list[tuple[Run, int]]) -> list:
    """The buffers of one ``runs`` frame (for ``transport.writelines``) carrying
    ``runs``, (run, source QPN) pairs of ``RUN_KINDS`` runs to HCA ``dev``, 2 ..
    RUNS_FRAME_MAX of them; the payloads are not copied."""
    entries = [_entry(t, sqp) for t, sqp in runs]
    header = {"t": _RUNS, "dev": dev, "r": entries, "chk": runs_check(dev, entries)}
    return encode_frame(header, [t.payload for t, _ in runs], check=False)


def _bad(msg: str) -> FrameError:
    return FrameError("EPROTO", f"runs: {msg}"[:200])


def decode_runs(header: dict, payload) -> tuple[str, list[tuple[Run, int]]]:
    """A ``runs`` frame as its runs: (destination HCA, [(run, source QPN), ...]), each
    run what the train frame of it would decode to, its payload a view of ``payload``.

    Raises FrameError("EPROTO") naming the bad entry and field, or IntegrityError
    (``packets``: the packets the frame claimed) when every field is well formed but
    the check does not match."""
    dev = header.get("dev")
    if not (type(dev) is str and 0 < len(dev) <= 64):
        dev = field(header, "dev", str, min=1, max=64)
    entries = header.get("r")
    if not (type(entries) is list and 2 <= len(entries) <= RUNS_FRAME_MAX):
        field(header, "r", list, min=2, max=RUNS_FRAME_MAX)
    check = header.get("chk")
    if not (type(check) is int and 0 <= check <= _U32):
        check = field(header, "chk", int, min=0, max=_U32)
    size = len(payload)
    view = payload if isinstance(payload, memoryview) else memoryview(payload)
    out: list[tuple[Run, int]] = []
    pos = claimed = 0
    for k, e in enumerate(entries):
        run, sqp = _run(k, e, view, pos, size)
        pos += len(run.payload)
        claimed += run.n
        out.append((run, sqp))
    if pos != size:
        raise _bad(f"its runs carry {pos} payload bytes, the frame {size}")
    if runs_check(dev, entries) != check:
        raise IntegrityError("EPROTO", f"runs frame of {len(out)} runs ({claimed} packets): "
                                       "check mismatch, dropped", packets=claimed)
    return dev, out


def _run(k: int, e, view: memoryview, pos: int, size: int) -> tuple[Run, int]:
    """Entry ``k`` of a runs frame, whose payload starts at ``pos`` of ``view``."""
    if not (type(e) is list and len(e) == _FIELDS):
        raise _bad(f"entry {k}: must be a list of {_FIELDS} fields")
    sqp, qp, psn, n, kind, pos_bits, mtu, length, reth, aeth, imm, ieth = e
    # The well-formed entry by exact type and range tests (a bool is not an int);
    # anything else takes the checks that name the fault.
    if not (type(sqp) is int and 0 <= sqp < PSN_MOD and type(qp) is int
            and 0 <= qp < PSN_MOD and type(psn) is int and 0 <= psn < PSN_MOD
            and type(n) is int and 0 < n <= FRAME_RUN_MAX and type(kind) is str
            and kind in RUN_KINDS and type(pos_bits) is int and 0 <= pos_bits <= 3
            and type(mtu) is int and mtu in TRAIN_MTUS and type(length) is int
            and 0 <= length <= size - pos):
        _named(k, e, size - pos)
    if psn + n > PSN_MOD:
        raise _bad(f"entry {k}: PSNs [{psn:#x}, +{n}) wrap the 24-bit PSN space")
    first, last = bool(pos_bits & _FIRST), bool(pos_bits & _LAST)
    if (aeth is None and imm is None and ieth is None and n == 1 and pos_bits == 3
            and kind == "RDMA_WRITE" and type(reth) is list and len(reth) == 3
            and 0 < length <= mtu):
        # The run of a small RDMA WRITE, what a stream of them is made of: a whole
        # message in one packet, its RETH by exact type and range tests.
        rkey, va, dma_len = reth
        if (type(rkey) is int and type(va) is int and type(dma_len) is int
                and 0 <= rkey <= _U32 and 0 <= va <= _U64 and 0 <= dma_len <= _U32):
            return Run(qp, psn, 1, kind, True, True, mtu, view[pos:pos + length].toreadonly(),
                       (rkey, va, dma_len)), sqp
    try:
        _check_train_payload(length, n, mtu, first, last)
        ext = {name: _EXTENSIONS[name]({"t": _RUNS, name: v}) if v is not None else None
               for name, v in (("reth", reth), ("aeth", aeth), ("imm", imm), ("ieth", ieth))}
    except FrameError as err:
        raise _bad(f"entry {k}: {err.message}") from None
    need = _TRAIN_NEEDS[kind, pos_bits, imm is not None, ieth is not None, n == 1]
    if type(need) is str:
        raise _bad(f"entry {k}: {need}")
    present = frozenset(name for name, v in ext.items() if v is not None)
    if need != present:
        raise _bad(f"entry {k}: {kind} run at positions {pos_bits} must carry "
                   f"{sorted(need) or 'no extension header'}, has {sorted(present)}")
    if ext["aeth"] is not None and ext["aeth"][0] != "ACK":
        raise _bad(f"entry {k}: a READ response's AETH must be an ACK")
    return Run(qp, psn, n, kind, first, last, mtu, view[pos:pos + length].toreadonly(),
               ext["reth"], ext["aeth"], ext["imm"], ext["ieth"]), sqp


def _named(k: int, e: list, left: int) -> None:
    """Raise the FrameError that names the first bad field of entry ``k``; the slow
    path, taken only when the fast test finds one amiss."""
    names = ("sqp", "qp", "psn", "n", "kind", "pos", "mtu", "length")
    h = {"t": _RUNS, **dict(zip(names, e, strict=False))}
    try:
        field(h, "sqp", int, min=0, max=PSN_MOD - 1)
        field(h, "qp", int, min=0, max=PSN_MOD - 1)
        field(h, "psn", int, min=0, max=PSN_MOD - 1)
        field(h, "n", int, min=1, max=FRAME_RUN_MAX)
        kind = field(h, "kind", str, max=40)
        if kind not in RUN_KINDS:
            raise FrameError("EPROTO", f"kind must be one of {', '.join(RUN_KINDS)}, "
                                       f"got {kind!r}")
        field(h, "pos", int, min=0, max=3)
        mtu = field(h, "mtu", int, min=256, max=4096)
        if mtu not in TRAIN_MTUS:
            raise FrameError("EPROTO", f"mtu {mtu} is not an IBTA path MTU")
        field(h, "length", int, min=0)
    except FrameError as err:
        raise _bad(f"entry {k}: {err.message}") from None
    raise _bad(f"entry {k}: length {e[7]} runs past the {left} payload bytes left")
