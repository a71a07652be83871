"""Field specs and checks that the control requests and the WR records share.

A spec is ``(type(s), min, max, required)``: ``check_fields`` validates a header map
against a dict of them with ``frames.field``, refusing unknown fields (EPROTO), so
that whatever reads the result sees only well-typed, in-range values. SGEs travel as
``[addr, length, lkey]``.
"""

from __future__ import annotations

from .attrs import SGE
from .frames import FrameError, field

U32, U64 = (1 << 32) - 1, (1 << 64) - 1
I32 = (1 << 31) - 1
# ibv_query_device(3) max_sge: SGEs in one WR.
MAX_SGE = 32

__all__ = ["I32", "MAX_SGE", "U32", "U64", "check_fields", "sge_to_wire",
           "sges_from_wire"]


# Types whose bound is their length (frames.field's rule), by exact type: what msgpack
# decodes is exactly these, never a subclass.
_SIZED_EXACT = frozenset((str, bytes, list, dict))
_ABSENT = object()


def check_fields(header: dict, schema: dict[str, tuple], what: str) -> dict:
    """Validate ``header`` against ``schema``; unknown fields are refused.

    Every control request and WR is checked here, so a value of exactly its field's
    type within its bounds (all that msgpack gives a well-behaved client) is taken by a
    type lookup and two compares; anything else, and every refusal, goes through
    ``frames.field``, which decides and words it as before."""
    for key in header:
        if key not in schema and key != "t" and key != "id":
            extra = set(header) - set(schema) - {"t", "id"}
            raise FrameError("EPROTO", f"{what} has unknown field(s): "
                                       f"{', '.join(sorted(map(str, extra)))[:120]}")
    out = {}
    get = header.get
    for name, spec in schema.items():
        typ, lo, hi, required = spec
        value = get(name, _ABSENT)
        if value is _ABSENT:
            if required:
                field(header, name, typ, min=lo, max=hi)    # raises: missing
            out[name] = None
            continue
        t = type(value)
        if t is typ or (type(typ) is tuple and t in typ):
            if lo is None and hi is None:
                out[name] = value
                continue
            measure = len(value) if t in _SIZED_EXACT else value
            if (lo is None or measure >= lo) and (hi is None or measure <= hi):
                out[name] = value
                continue
        out[name] = field(header, name, typ, min=lo, max=hi, required=required)
    return out


def sges_from_wire(items: list, what: str) -> list[SGE]:
    out = []
    for i, s in enumerate(items):
        if (not isinstance(s, list) or len(s) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in s)
                or not (0 <= s[0] <= U64 and 0 <= s[1] <= U32 and 0 <= s[2] <= U32)):
            raise FrameError("EPROTO", f"{what} SGE {i} must be [addr u64, length u32, "
                                       f"lkey u32]")
        out.append(SGE(*s))
    return out


def sge_to_wire(s: SGE) -> list:
    return [int(s.addr), int(s.length), int(s.lkey)]
