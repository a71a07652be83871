"""The frame codec shared by the control and wire planes (sans-I/O: no sockets, no loop).

A frame on the TCP stream::

    +----------------+----------------+--------------------+------------------+
    | L: u32 BE      | H: u32 BE      | header: H bytes    | payload:         |
    | (rest of frame)| (header length)| msgpack map        | L - 4 - H bytes  |
    +----------------+----------------+--------------------+------------------+

The header is a msgpack map whose ``"t"`` (a str) names the message or packet
kind. The payload is carried raw after the header so bulk data (RDMA WRITE
bodies, READ responses) is never msgpack-encoded or copied by the encoder.

The decoder treats its input as hostile: a length prefix is checked against
``max_frame`` before any of the body is awaited, msgpack is unpacked with
limits no larger than the header itself, and only plain data types are
accepted in a header. Any error poisons the decoder, because a byte stream
whose framing is lost cannot be resynchronised: the connection must close.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import RDMAError

__all__ = [
    "DEFAULT_MAX_FRAME",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "HeaderLimits",
    "REQUEST_LIMITS",
    "encode_frame",
    "field",
    "frame_bytes",
]

DEFAULT_MAX_FRAME = 16 * 1024 * 1024

_U32 = struct.Struct(">I")
_U32X2 = struct.Struct(">II")
_PREFIX = 4  # the L field
_HLEN = 4  # the H field
_MAX_U32 = 0xFFFFFFFF

# Types a decoded header may contain (msgpack's nil, bool, int, float, str, bin,
# array, map). Ext types, timestamps included, are refused: nothing in the
# protocol needs them and they are a way to smuggle objects past the schema.
_SCALARS = (type(None), bool, int, float, str, bytes)
_SCALAR_TYPES = frozenset(_SCALARS)
_KEY_TYPES = frozenset((str, bytes))


class FrameError(RDMAError):
    """A frame could not be encoded or decoded.

    ``errno_name`` is "EPROTO" for a malformed frame and "EMSGSIZE" for one
    larger than the receiver accepts; ``message`` is a sentence saying which.
    """


@dataclass(frozen=True)
class Frame:
    """One decoded frame: its kind (``header["t"]``), the header map and the raw payload."""

    kind: str
    header: dict
    payload: memoryview


def _check_kind(header: Any) -> str:
    """``header["t"]``, after checking that the header is a map with a str ``"t"``."""
    if not isinstance(header, dict):
        raise FrameError("EPROTO", f"frame header must be a map, not {type(header).__name__}")
    kind = header.get("t")
    if not isinstance(kind, str):
        raise FrameError("EPROTO", "frame header must have a str field 't' naming its kind")
    return kind


def _check_header(header: Any) -> str:
    """Return ``header["t"]`` after checking the header is a map of plain data only.

    Iterative rather than recursive, so a deeply nested header cannot raise
    RecursionError instead of FrameError. Every frame of the wire path goes through
    here twice (encode and decode), so the common case, a flat map of scalars, is
    decided by exact type lookups; only containers and subclasses take the slow path.
    """
    kind = _check_kind(header)
    stack: list[Any] = [header]
    while stack:
        obj = stack.pop()
        if type(obj) is list:
            # The usual container (WRs, completions, SGEs): its scalars are passed by a
            # type lookup each, without the generator and isinstance calls below.
            for v in obj:
                if type(v) not in _SCALAR_TYPES:
                    stack.append(v)
        elif isinstance(obj, dict):
            for key, value in obj.items():
                if type(key) not in _KEY_TYPES and not isinstance(key, (str, bytes)):
                    raise FrameError("EPROTO", f"frame header map key of type "
                                               f"{type(key).__name__} is not allowed")
                if type(value) not in _SCALAR_TYPES:
                    stack.append(value)
        elif isinstance(obj, (list, tuple)) and not isinstance(obj, msgpack.ExtType):
            # (ExtType is a namedtuple: without the exclusion it would pass as a list.)
            stack.extend(v for v in obj if type(v) not in _SCALAR_TYPES)
        elif not isinstance(obj, _SCALARS):
            raise FrameError("EPROTO", f"frame header value of type {type(obj).__name__} "
                                       f"is not allowed (only nil, bool, int, float, str, "
                                       f"bytes, list and map)")
    return kind


def _payload_view(payload: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(payload)
    if view.ndim != 1 or view.format != "B":
        # Counting bytes, not items: a view of u32s would otherwise understate L.
        view = view.cast("B")
    return view


def encode_frame(header: dict, payload: bytes | bytearray | memoryview | list = b"", *,
                 check: bool = True) -> list:
    """Encode a frame as buffers for ``transport.writelines``; the payload is not copied.
    A list of buffers as ``payload`` is a payload of their bytes back to back (a runs
    frame's: protocol/runs.py), each still its own buffer.

    The header is checked with the same rules the decoder applies, so this end
    never sends what the other end would refuse. ``check=False`` is for the headers
    protocol/packets.py builds itself from typed fields (a packet's, a train's), which
    are flat maps of ints, strs and lists by construction: the walk would cost about a
    third of the frame's encoding on the wire path.
    """
    if check:
        _check_header(header)
    packed = msgpack.packb(header, use_bin_type=True)
    if type(payload) is list:
        body = [v for v in map(_payload_view, payload) if v.nbytes]
        size = sum(v.nbytes for v in body)
    else:
        view = _payload_view(payload)
        body, size = ([view] if view.nbytes else []), view.nbytes
    length = _HLEN + len(packed) + size
    if length > _MAX_U32:
        raise FrameError("EMSGSIZE", f"frame of {length} bytes does not fit a 32-bit length")
    return [_U32X2.pack(length, len(packed)) + packed, *body]


def frame_bytes(header: dict, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """One frame as a single bytes object (tests, small control messages)."""
    return b"".join(encode_frame(header, payload))


@dataclass(frozen=True)
class HeaderLimits:
    """Structural limits a header must keep while it is unpacked, so that a frame is
    refused after a bounded amount of work, whatever its bytes say (a few bytes of
    msgpack can announce millions of containers; building each costs some 300 ns).

    ``max_header``: bytes of one header; ``max_array``, ``max_map``, ``max_str``,
    ``max_bin``: the entries or bytes of one array, map, str or bin; ``max_containers``:
    arrays and maps in one header in all (counted as they are built, the unpacking
    stops at the first one over).

    Nesting is bounded as it is unpacked by msgpack's parse stack (1,024 levels,
    refused the moment it is reached, after at most 1,024 containers); no request nests
    more than 9 levels, and a value nested deeper than its field expects fails that
    field's check. A tighter depth check would need a pass over every value (some 26 ns
    each, 7 ms for a header at ``max_header``), more than the whole unpacking may cost."""

    max_header: int
    max_array: int
    max_map: int
    max_str: int
    max_bin: int
    max_containers: int


# What the daemon takes from clients and peer daemons, from the largest real requests:
# - a post_send of MAX_WRS_PER_POST (256) WRs of MAX_SGE (32) SGEs each: 256 WR maps,
#   256 SG lists and 8,192 SGE lists ([addr, length, lkey], about 20 bytes each), some
#   175 KB of header, nesting header > wrs > WR > sg > SGE (5 levels);
# - an mkey_configure of MAX_CONFIGURE_ENTRIES (4,096) layout entries and up to 2,048
#   calls: about 6,200 lists, one layout list of 4,096 entries;
# - the widest map: a QP attribute map (ibv_qp_attr, some 30 fields);
# - the longest str: a host name (255 bytes); the longest bin: a crypto login
#   credential (up to 4,096 bytes).
# Each bound is twice what the schema allows, so that a request just over a schema
# limit (4,097 layout entries, 257 WRs) gets that limit's own error and keeps its
# session; only a header no request could be breaks the framing. The costliest header
# they admit (16,384 empty containers, or 256 KiB of the cheapest values) unpacks in
# about 2 ms.
REQUEST_LIMITS = HeaderLimits(max_header=256 << 10, max_array=8192, max_map=128,
                              max_str=4096, max_bin=8192, max_containers=16384)


class _TooManyContainers(Exception):
    pass


def _refuse_ext(code: int, data: bytes):
    # max_ext_len=0 refuses every ext with a body; this refuses the empty ones.
    raise ValueError(f"ext type {code} is not allowed (only nil, bool, int, float, str, "
                     "bytes, list and map)")



def _unpack_header(raw: memoryview, limits: HeaderLimits | None = None) -> dict:
    size = len(raw)
    if limits is None:
        # Without structural limits every bound is the header's own size (an element
        # of a container takes at least one byte, a map entry two), so a few bytes
        # announcing a 4-billion-entry array cannot make the unpacker allocate.
        bounds = dict(max_str_len=size, max_bin_len=size, max_array_len=size,
                      max_map_len=size // 2)
    else:
        if size > limits.max_header:
            raise FrameError("EMSGSIZE", f"frame header of {size} bytes exceeds the "
                                         f"{limits.max_header}-byte limit")
        bounds = dict(max_str_len=min(size, limits.max_str),
                      max_bin_len=min(size, limits.max_bin),
                      max_array_len=min(size, limits.max_array),
                      max_map_len=min(size // 2, limits.max_map))
        if size > limits.max_containers:
            # Every array and map takes at least one byte, so a header no longer than
            # max_containers cannot hold more: only a longer one is counted, by a hook
            # per container (the wire path's headers, a hundred bytes, pay for none).
            left = [limits.max_containers]

            def count(container):
                left[0] -= 1
                if left[0] < 0:
                    raise _TooManyContainers
                return container

            bounds.update(list_hook=count, object_hook=count)
    try:
        header = msgpack.unpackb(raw, raw=False, strict_map_key=True, use_list=True,
                                 max_ext_len=0, ext_hook=_refuse_ext, **bounds)
    except _TooManyContainers:
        raise FrameError("EPROTO", f"frame header has more than {limits.max_containers} "
                                   "arrays and maps") from None
    except msgpack.StackError:
        raise FrameError("EPROTO", "frame header nests deeper than msgpack's parse stack "
                                   "(1024 levels)") from None
    except Exception as exc:  # any unpack failure at all means a malformed header
        raise FrameError("EPROTO", f"frame header is not valid msgpack ({exc!s} "
                                   f"[{type(exc).__name__}])"[:300]) from None
    return header


def unshared(buf: bytearray) -> bool:
    """Whether nothing holds a view of ``buf``: a bytearray with a live export refuses
    to change size (BufferError), and one byte more and back is the cheapest change."""
    try:
        buf.append(0)
    except BufferError:
        return False
    del buf[-1]
    return True


class FrameDecoder:
    """Incremental frame decoder: feed it bytes as they arrive, get whole frames back.

    ``max_frame`` bounds L (everything after the 4-byte prefix). A prefix that
    announces more raises FrameError("EMSGSIZE") as soon as the prefix itself
    has arrived, so a peer cannot make us buffer a huge body first.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME,
                 limits: HeaderLimits | None = None) -> None:
        if max_frame < _HLEN:
            raise ValueError(f"max_frame must be at least {_HLEN}")
        self.max_frame = max_frame
        # Structural limits on headers (a daemon's REQUEST_LIMITS); None: only sizes.
        self.limits = limits
        # Bytes fed and frames completed so far: what a watchdog compares over time to
        # tell an idle connection from one stuck in the middle of a frame.
        self.fed = 0
        self.frames_done = 0
        self._buf = bytearray()
        # A frame cut by a read and continued in place (recv_buffer): its bytes so far
        # are the first ``_have`` of ``_whole``, ``_total`` in all; ``_have`` None when
        # there is none. ``_whole`` is kept for the next such frame unless a view of
        # it is still alive.
        self._whole = bytearray()
        self._total = 0
        self._have: int | None = None
        # The least of a cut frame still to come for it to be continued in place
        # (recv_buffer); 0: never (a reader that cannot read into a given buffer).
        self.direct_min = 0
        self._error: FrameError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buf) if self._have is None else self._have

    def recv_buffer(self) -> memoryview | None:
        """Where the rest of the frame cut by the last read may be read to, in place: a
        writable view of its bytes still to come, in a buffer that holds the whole
        frame, when at least ``direct_min`` are still to come and an eighth of the
        frame has arrived (so a peer that announces a large frame and stalls makes the
        decoder hold at most eight times what it sent); else None. The caller reads
        into it, then calls ``filled`` with the count: the copy of each read into the
        cut frame's buffer that ``feed`` makes is saved."""
        if self._have is None:
            if not self._buf or not self._may_continue(self._buf):
                return None
            self._start_whole(self._buf)
        if self._total - self._have < self.direct_min:
            return None
        return memoryview(self._whole)[self._have:self._total]

    def _may_continue(self, part) -> bool:
        """Whether the cut frame that begins ``part`` may be continued in place."""
        if not self.direct_min or self._error is not None or len(part) < _PREFIX + _HLEN:
            return False
        (length,) = _U32.unpack_from(part, 0)
        total = _PREFIX + length
        if total - len(part) < self.direct_min or 8 * len(part) < total:
            return False
        # Checked as feed checks them, before any buffer is made for the frame.
        self._check_length(length)
        self._check_hlen(length, _U32.unpack_from(part, _PREFIX)[0])
        return True

    def _start_whole(self, part) -> None:
        """The cut frame ``part`` begins, copied to the front of a buffer of its size
        (the last one's again when nothing looks at it any more)."""
        (length,) = _U32.unpack_from(part, 0)
        total = _PREFIX + length
        whole = self._whole
        if len(whole) < total or not unshared(whole):
            whole = self._whole = bytearray(total)
        whole[:len(part)] = part
        self._total, self._have, self._buf = total, len(part), bytearray()

    def filled(self, n: int) -> list[Frame]:
        """``n`` bytes were read into the view ``recv_buffer`` gave: the frame, once
        whole (its payload a view of that buffer), or nothing yet."""
        self.fed += n
        self._have += n
        frames: list[Frame] = []
        try:
            self._whole_done(frames)
        except FrameError as exc:
            self._error = exc
            raise
        self.frames_done += len(frames)
        return frames

    def _whole_done(self, frames: list[Frame]) -> None:
        """The frame continued in place, parsed into ``frames`` once all of it is in."""
        if self._have == self._total:
            self._have = None
            frame, _ = self._parse_one(memoryview(self._whole)[:self._total], 0)
            frames.append(frame)

    def feed(self, data: bytes | bytearray | memoryview, *, stable: bool = False) -> list[Frame]:
        """Add received bytes; return the frames they complete (possibly none).

        A frame that lies whole inside ``data`` is parsed where it lies: when ``data`` is
        ``bytes`` (what ``StreamReader.read`` returns), which nothing can change, its
        payload is a read-only view into it, not a copy. Only the part of a frame cut
        by the end of one read is copied, to be completed by the next, and that frame's
        payload is then a view of the buffer it was completed in, which the decoder
        hands over and never touches again. ``stable``: the caller promises that
        ``data``, whatever its type, does not change while a frame's payload may still
        be looked at (server/wire_in.py reuses a read buffer only when no view of it is
        left), so it is used in place like ``bytes``.
        """
        if self._error is not None:
            raise FrameError(self._error.errno_name,
                             f"decoder stopped after an earlier error: {self._error.message}")
        # A buffer the caller may change later is copied once; bytes are used in place.
        src = memoryview(data if stable or type(data) is bytes else bytes(data))
        self.fed += len(src)
        if src.ndim != 1 or src.format != "B":
            src = src.cast("B")
        frames: list[Frame] = []
        pos, end = 0, len(src)
        try:
            if self._buf or self._have is not None:
                pos = self._complete_pending(src, frames)
            while pos < end:
                frame, used = self._parse_one(src, pos)
                if frame is None:
                    # The frame is cut by the end of this read (its prefix, when whole,
                    # is already checked): keep its start for the next feed, in its
                    # own whole-sized buffer when it may be continued in place.
                    part = src[pos:]
                    if self._may_continue(part):
                        self._start_whole(part)
                    else:
                        self._buf = bytearray(part)
                    break
                frames.append(frame)
                pos += used
        except FrameError as exc:
            self._error = exc
            self._buf, self._have = bytearray(), None  # nothing in them will ever be used
            raise
        self.frames_done += len(frames)
        return frames

    def _complete_pending(self, src: memoryview, frames: list[Frame]) -> int:
        """Top up the frame cut by the previous read from the front of ``src``; append
        it to ``frames`` once whole. Returns how many bytes of ``src`` it took."""
        if self._have is not None:
            # A frame continued in place (recv_buffer), continued here by a feed.
            take = min(self._total - self._have, len(src))
            self._whole[self._have:self._have + take] = src[:take]
            self._have += take
            self._whole_done(frames)
            return take
        buf = self._buf
        pos = min(max(_PREFIX - len(buf), 0), len(src))
        buf += src[:pos]
        if len(buf) < _PREFIX:
            return pos
        (length,) = _U32.unpack_from(buf, 0)
        self._check_length(length)
        if len(buf) < _PREFIX + _HLEN and len(src) - pos >= _PREFIX + _HLEN - len(buf):
            head = bytes(buf) + bytes(src[pos:pos + _PREFIX + _HLEN - len(buf)])
            self._check_hlen(length, _U32.unpack_from(head, _PREFIX)[0])
        take = min(_PREFIX + length - len(buf), len(src) - pos)
        buf += src[pos:pos + take]
        pos += take
        if len(buf) == _PREFIX + length:
            # Handed over whole: the frame's payload is a view of this buffer.
            self._buf = bytearray()
            frame, _ = self._parse_one(memoryview(buf), 0)
            frames.append(frame)
        return pos

    def _check_length(self, length: int) -> None:
        if length > self.max_frame:
            raise FrameError("EMSGSIZE", f"frame of {length} bytes exceeds the "
                                         f"{self.max_frame}-byte limit")
        if length < _HLEN:
            raise FrameError("EPROTO", f"frame length {length} is too short to hold "
                                       f"the {_HLEN}-byte header length")

    def _check_hlen(self, length: int, hlen: int) -> None:
        """The H field, checked as soon as it arrives: a header larger than the frame,
        or than the structural limits allow, is refused before the frame is buffered."""
        if hlen > length - _HLEN:
            raise FrameError("EPROTO", f"header length {hlen} exceeds the {length - _HLEN} "
                                       f"bytes the frame has after it")
        if self.limits is not None and hlen > self.limits.max_header:
            raise FrameError("EMSGSIZE", f"frame header of {hlen} bytes exceeds the "
                                         f"{self.limits.max_header}-byte limit")

    def _parse_one(self, view: memoryview, pos: int) -> tuple[Frame | None, int]:
        """The frame at ``pos`` of ``view`` (a buffer nothing will change), its payload a
        read-only view into it; (None, 0) when the frame is not whole yet."""
        avail = len(view) - pos
        if avail < _PREFIX:
            return None, 0
        (length,) = _U32.unpack_from(view, pos)
        self._check_length(length)
        if avail >= _PREFIX + _HLEN:
            (hlen,) = _U32.unpack_from(view, pos + _PREFIX)
            self._check_hlen(length, hlen)
        if avail < _PREFIX + length:
            return None, 0
        start = pos + _PREFIX + _HLEN
        header = _unpack_header(view[start:start + hlen], self.limits)
        # Unpacked with ext types refused and str/bin map keys only, a header holds
        # plain data already: only its top needs a look (no walk over every value).
        kind = _check_kind(header)
        payload = view[start + hlen:pos + _PREFIX + length].toreadonly()
        return Frame(kind, header, payload), _PREFIX + length


def field(header: dict, name: str, typ: type | tuple[type, ...], *,
          min: int | float | None = None, max: int | float | None = None,
          required: bool = True) -> Any:
    """Return ``header[name]`` after checking its type and range; None if absent and optional.

    ``min``/``max`` bound the value of a number, or the length of a str, bytes
    or list. bool is never accepted as an int (msgpack keeps them apart, and a
    ``True`` QPN is a bug). Raises FrameError("EPROTO", ...) naming the field
    and the frame kind.
    """
    kind = header.get("t", "?")
    types = typ if isinstance(typ, tuple) else (typ,)
    if name not in header:
        if required:
            raise FrameError("EPROTO", f"field '{name}' of '{kind}' is missing")
        return None
    value = header[name]
    if not _fits(value, types, min, max):
        raise FrameError("EPROTO", f"field '{name}' of '{kind}' must be "
                                   f"{_wanted(types, min, max)}, got {_describe(value)}")
    return value


def _fits(value: Any, types: tuple[type, ...], lo: int | float | None,
          hi: int | float | None) -> bool:
    """Whether ``value`` has one of ``types`` (a bool only where bool is named) and its
    value, or its length for a str, bytes or list, lies in [lo, hi]."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        return False
    if lo is None and hi is None:
        return True
    measure = len(value) if isinstance(value, _SIZED) else value
    return (lo is None or measure >= lo) and (hi is None or measure <= hi)


def _wanted(types: tuple[type, ...], lo: int | float | None, hi: int | float | None) -> str:
    """What a field takes, as the refusal says it: its types and their bounds."""
    wanted = " or ".join(t.__name__ for t in types)
    if lo is None and hi is None:
        return wanted
    by_length = all(issubclass(t, _SIZED) for t in types)
    bounds = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
    return wanted + (f" of length in {bounds}" if by_length else f" in {bounds}")


_SIZED = (str, bytes, list, dict)


def _describe(value: Any) -> str:
    if isinstance(value, (bytes, str, list, dict)):
        return f"{type(value).__name__} of length {len(value)}"
    return f"{type(value).__name__} {value!r}"[:80]
