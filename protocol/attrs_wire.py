"""The attribute structs of protocol/attrs.py as they cross the control socket: a
record as a msgpack-ready map and back, every field typed and bounded on the way in
(unknown fields and wrong types are EPROTO, as every control request's fields are)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .attrs import SGE, CryptoAttr, MrInterleaved, SigBlockAttr, SigBlockDomain, SigCrc, SigT10dif
from .frames import FrameError
from .schema import U64, sge_to_wire

# Which fields hold a nested struct, per struct (protocol/replies.py's ATTR_MAPS walk it).
NESTED: dict[type, dict[str, type]] = {
    SigBlockAttr: {"mem": SigBlockDomain, "wire": SigBlockDomain},
    SigBlockDomain: {"dif": SigT10dif, "crc": SigCrc},
}
# Leaf types by default value type; ``dek`` travels as the DEK's handle.
_HANDLE_FIELDS = {(CryptoAttr, "dek")}


def attr_to_wire(obj: Any) -> Any:
    """A protocol.attrs record as a msgpack-ready map (DEK objects as their handle)."""
    if obj is None:
        return None
    if isinstance(obj, SGE):
        return sge_to_wire(obj)
    if isinstance(obj, MrInterleaved):
        return [int(obj.addr), int(obj.bytes_count), int(obj.bytes_skip), int(obj.lkey)]
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if (type(obj), f.name) in _HANDLE_FIELDS:
            v = getattr(v, "handle", v)
        elif dataclasses.is_dataclass(v):
            v = attr_to_wire(v)
        elif isinstance(v, bool):
            v = bool(v)
        elif isinstance(v, int):
            v = int(v)      # IntEnum members go as plain ints
        out[f.name] = v
    return out


def attr_from_wire(cls: type, data: Any, what: str) -> Any:
    """The inverse of attr_to_wire for ``cls``: unknown fields and wrong types are EPROTO."""
    if not isinstance(data, dict):
        raise FrameError("EPROTO", f"{what} must be a map of {cls.__name__} fields")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = set(data) - set(fields)
    if extra:
        raise FrameError("EPROTO", f"{what} has unknown field(s) "
                                   f"{', '.join(sorted(map(str, extra)))[:100]}")
    kwargs = {}
    nested = NESTED.get(cls, {})
    for name, value in data.items():
        where = f"{what}.{name}"
        if name in nested:
            kwargs[name] = None if value is None else attr_from_wire(nested[name], value, where)
            continue
        if (cls, name) in _HANDLE_FIELDS:
            ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
        else:
            default = fields[name].default
            if default is dataclasses.MISSING and fields[name].default_factory \
                    is not dataclasses.MISSING:
                default = fields[name].default_factory()
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool) \
                    and 0 <= value <= U64
            elif isinstance(default, bytes):
                ok = isinstance(value, bytes) and len(value) <= 64
            else:
                ok = value is None
        if not ok:
            why = (f"must be a handle (int) or nil, got {type(value).__name__}"
                   if (cls, name) in _HANDLE_FIELDS else _wanted(default, value))
            raise FrameError("EPROTO", f"{where} {why}")
        kwargs[name] = value
    return cls(**kwargs)


def _wanted(default: Any, value: Any) -> str:
    """Why a leaf field was refused: its range when the type was right (a -1 in a
    __u32 is out of range, not of the wrong type), else the type it takes."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, int) and not isinstance(default, bool) and is_int:
        return f"must be an unsigned integer in [0, {U64}], got {value}"
    if isinstance(default, bytes) and isinstance(value, bytes):
        return f"must be at most 64 bytes, got {len(value)}"
    want = ("bool" if isinstance(default, bool) else "int" if isinstance(default, int)
            else "bytes" if isinstance(default, bytes) else "nil")
    return f"must be {want}, got {type(value).__name__}"


