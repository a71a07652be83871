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


def check_fields(header: dict, schema: dict[str, tuple], what: str) -> dict:
    """Validate ``header`` against ``schema``; unknown fields are refused."""
    extra = set(header) - set(schema) - {"t", "id"}
    if extra:
        raise FrameError("EPROTO", f"{what} has unknown field(s): "
                                   f"{', '.join(sorted(map(str, extra)))[:120]}")
    out = {}
    for name, (typ, lo, hi, required) in schema.items():
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
