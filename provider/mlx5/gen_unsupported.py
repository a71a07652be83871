#!/usr/bin/env python3
"""Writes mlx5/unsupported.c: the mlx5dv calls softhca does not model, each failing with
EOPNOTSUPP as its man page says the call fails.

The names are those of libmlx5.map (Debian's libmlx5.so.1 exports) that mlx5.c does not
define; each one's prototype is mlx5dv.h's as the compiler sees it (gcc -E: the macros
of mlx5_api.h, which rename some types, expanded). The body follows the return type:

- a pointer: NULL, errno EOPNOTSUPP (shca_dv_unsupported_ptr);
- int: the errno value EOPNOTSUPP, errno set as well (shca_dv_unsupported);
- void: nothing (the call is logged);
- the calls whose man page says they return -1 on failure (RETURN_MINUS_ONE): -1, errno
  EOPNOTSUPP.

    python3 provider/mlx5/gen_unsupported.py            # rewrites unsupported.c
    python3 provider/mlx5/gen_unsupported.py --check    # exit 1 if it is not current
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "unsupported.c"

# mlx5dv_devx_get_event(3): "-1 and errno set"; mlx5dv_vfio_get_events_fd(3): "-1 ...
# errno" (an fd, where 0 would be one).
RETURN_MINUS_ONE = ("mlx5dv_devx_get_event", "mlx5dv_vfio_get_events_fd")

HEAD = """\
/* The mlx5dv calls softhca does not model, written by gen_unsupported.py (beside this
 * file) from mlx5dv.h's prototypes of the names Debian's libmlx5.so.1 exports
 * (libmlx5.map) that mlx5.c does not define: regenerate rather than edit by hand
 * (tests/unit/test_mlx5_unsupported.py checks it is current). Each answers as its man
 * page says a call fails: pointer-returning ones NULL with errno EOPNOTSUPP,
 * int-returning ones the errno value EOPNOTSUPP (errno set as well), the two that
 * return -1 on failure (mlx5dv_devx_get_event, mlx5dv_vfio_get_events_fd) -1 with errno
 * EOPNOTSUPP, void ones nothing. DevX, steering (flow and DR), device memory, UARs,
 * VARs, packet pacing, scheduling elements, LAG, VFIO and DC streams are mlx5 hardware
 * interfaces with no counterpart in the model. */
#include <errno.h>

#include "mlx5.h"

/* the stubs take their arguments only to have mlx5dv.h's prototypes */
#pragma GCC diagnostic ignored "-Wunused-parameter"
"""


def exported(map_text: str) -> list[str]:
    """The global names of a linker version script, each once."""
    text = re.sub(r"/\*.*?\*/", " ", map_text, flags=re.S)
    names: list[str] = []
    for block in re.findall(r"global:(.*?)(?:local:|\})", text, flags=re.S):
        for name in re.findall(r"([A-Za-z_]\w*)\s*;", block):
            if name not in names:
                names.append(name)
    return names


def defined_in(c_text: str, names: list[str]) -> set[str]:
    """The names c_text defines: at a line's start after its type, or by .symver."""
    out = set()
    for n in names:
        if re.search(rf"^(?:[A-Za-z_][^\n;]*[\s*])?{n}\s*\(", c_text, re.M) \
                or re.search(rf"\b{n}@", c_text):
            out.add(n)
    return out


def preprocessed_header() -> str:
    r = subprocess.run(["gcc", "-E", "-P", "-D_GNU_SOURCE", "-x", "c", "-"],
                       input="#include <infiniband/mlx5dv.h>\n", capture_output=True,
                       text=True, check=True)
    return r.stdout


def _squash(s: str) -> str:
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r"\s*\*\s*", " *", s)          # "T*x", "T * x" -> "T *x"
    s = re.sub(r"\* \*", "**", s)
    s = re.sub(r"\s*,\s*", ", ", s)
    s = re.sub(r"\(\s+", "(", s)
    s = re.sub(r"\b_Bool\b", "bool", s)        # stdbool.h's macro, as mlx5dv.h spells it
    return re.sub(r"\s+\)", ")", s)


def prototype(text: str, name: str) -> tuple[str, str]:
    """(return type, parameter list) of name's declaration in preprocessed C."""
    for m in re.finditer(rf"\b{name}\s*\(", text):
        start = m.start()
        before = text[:start]
        cut = max(before.rfind(";"), before.rfind("}"), before.rfind("{"))
        ret = before[cut + 1:]
        depth, i = 0, m.end() - 1
        while True:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        params = text[m.end():i]
        rest = text[i + 1:].lstrip()
        rest = re.sub(r"^__attribute__\s*\(\(.*?\)\)\s*", "", rest)
        if not rest.startswith(";") or "static" in ret or "typedef" in ret:
            continue
        ret = re.sub(r"^\s*extern\s+", "", _squash(ret))
        return ret, _squash(params)
    raise SystemExit(f"mlx5dv.h declares no {name}")


def stub(name: str, ret: str, params: str) -> str:
    if name in RETURN_MINUS_ONE:
        body = f'\tshca_dv_unsupported("{name}");\n\treturn -1;\n'
    elif ret == "void":
        body = f'\tshca_dv_unsupported("{name}");\n'
    elif ret.endswith("*"):
        body = f'\treturn shca_dv_unsupported_ptr("{name}");\n'
    elif ret == "int":
        body = f'\treturn shca_dv_unsupported("{name}");\n'
    else:
        raise SystemExit(f"{name}: no rule for a {ret!r} result (add one after its man page)")
    return f"{ret}\n{name}({params})\n{{\n{body}}}\n"


def generate() -> str:
    names = exported((HERE / "libmlx5.map").read_text())
    modelled = defined_in((HERE / "mlx5.c").read_text(), names)
    header = preprocessed_header()
    parts = [HEAD]
    for name in sorted(n for n in names if n not in modelled):
        ret, params = prototype(header, name)
        parts.append(stub(name, ret, params))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when unsupported.c differs from what would be written")
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT}: not current; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
