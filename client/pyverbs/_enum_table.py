"""Turns the enum tables of enums.py, mlx5_enums.py, ... into pyverbs' enum modules.

pyverbs compiles each C enum to an IntEnum of the same name and also exports every member
at module level (``e.IBV_ACCESS_LOCAL_WRITE``, ``list(e.ibv_access_flags)``); plain
#define constants are plain ints. The upstream tests rely on both forms.
"""

from __future__ import annotations

from enum import IntEnum


def define(enums: dict[str, dict[str, int]], constants: dict[str, int],
           module: str) -> dict[str, object]:
    names: dict[str, object] = {}
    for enum_name, members in enums.items():
        cls = IntEnum(enum_name, members, module=module)
        names[enum_name] = cls
        names.update(cls.__members__)
    names.update(constants)
    return names
