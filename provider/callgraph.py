#!/usr/bin/env python3
"""The C call graph between the files of each library of provider/, and its circles.

Each library's sources (the Makefile's SRCS, CM_SRCS and MLX5_SRCS) are compiled by gcc
with -fcallgraph-info, which writes every function a file defines and every call it
makes, after the preprocessor (a call inside a macro counts where the macro is used).
A call from a function of a.c to one defined in b.c is an edge a.c -> b.c; a circle is a
set of files that reach one another (a strongly connected component of more than one
file). Calls through function pointers are not calls here: an ops table is how a lower
file is handed a higher one's function, as libibverbs hands the provider's.

    python3 provider/callgraph.py            # the edges, circles, the longest functions
    python3 provider/callgraph.py --check    # exit status 1 when there is a circle

Stdlib only; run from anywhere (it compiles in the provider folder, with the Makefile's
flags, into a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CFLAGS = ["-O0", "-fPIC", "-std=gnu11", "-D_GNU_SOURCE", "-w"]
LIBRARIES = {"libsofthca-rdmav34.so": "SRCS", "librdmacm.so.1": "CM_SRCS",
             "libmlx5.so.1": "MLX5_SRCS"}

_NODE = re.compile(r'node: \{ title: "([^"]+)" label: "([^"\\]+)\\n([^"]+?):(\d+):\d+"'
                   r'( shape : ellipse)?')
_EDGE = re.compile(r'edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)"')


@dataclass
class Function:
    name: str
    file: str
    line: int
    length: int = 0


@dataclass
class Graph:
    """Files and the calls between them: edges[a][b] are the (caller, callee) pairs."""

    functions: dict[str, Function] = field(default_factory=dict)  # by .ci title
    edges: dict[str, dict[str, set[tuple[str, str]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(set)))
    files: list[str] = field(default_factory=list)


def makefile_sources(makefile: Path, var: str) -> list[str]:
    """The files a `VAR := a.c b.c \\` line of the Makefile names."""
    text = makefile.read_text().replace("\\\n", " ")
    m = re.search(rf"^{var}\s*:?=(.*)$", text, re.M)
    if not m:
        raise SystemExit(f"{makefile}: no {var}")
    return m.group(1).split()


def read_ci(text: str) -> tuple[list[tuple[str, str, str, int]], list[tuple[str, str]]]:
    """The defined functions (title, name, file, line) and the edges of one .ci file."""
    defined = [(t, n, f, int(ln)) for t, n, f, ln, ext in _NODE.findall(text) if not ext]
    return defined, _EDGE.findall(text)


def body_length(path: Path, line: int) -> int:
    """Lines from the one naming a function to its closing brace (comments and string
    and character literals skipped, so a brace inside them does not count)."""
    lines = path.read_text().splitlines()[line - 1:]
    text = "\n".join(lines)
    depth, i, n, seen = 0, 0, len(text), False
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            i = text.find("*/", i + 2) + 2
            continue
        if text.startswith("//", i):
            i = text.find("\n", i)
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c == ";" and not seen:
            return 0  # a declaration, not a definition
        if c == "{":
            depth, seen = depth + 1, True
        elif c == "}":
            depth -= 1
            if seen and depth == 0:
                return text.count("\n", 0, i) + 1
        i += 1
    return 0


def build(folder: Path, sources: list[str], cflags: list[str] | None = None) -> Graph:
    """Compiles sources (paths relative to folder) and joins their call graphs."""
    g = Graph(files=list(sources))
    calls: list[tuple[str, str, str]] = []      # (file, caller title, callee title)
    with tempfile.TemporaryDirectory() as tmp:
        for i, src in enumerate(sources):
            out = Path(tmp) / f"{i}.o"
            cmd = ["gcc", *(cflags if cflags is not None else CFLAGS), "-fcallgraph-info",
                   "-c", src, "-o", str(out), "-dumpbase", f"{i}", "-dumpdir", tmp + "/"]
            r = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"gcc failed on {src}:\n{r.stderr}")
            ci = next(Path(tmp).glob(f"{i}*.ci"))
            defined, edges = read_ci(ci.read_text())
            for title, name, _file, line in defined:
                key = title if ":" in title else name   # statics are titled file:name
                key = f"{src}:{name}" if ":" in title else key
                g.functions[key] = Function(name, src, line,
                                            body_length(folder / src, line))
            for a, b in edges:
                calls.append((src, a, b))
    for src, a, b in calls:
        caller = f"{src}:{a.split(':', 1)[1]}" if ":" in a else a
        callee = f"{src}:{b.split(':', 1)[1]}" if ":" in b else b
        target = g.functions.get(callee)
        if target is None or target.file == src:
            continue  # the C library's or libibverbs', or a call inside the file
        g.edges[src][target.file].add((g.functions[caller].name, target.name))
    return g


def circles(g: Graph) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g.files:
        if v not in index:
            visit(v)
    return out


def report(name: str, g: Graph, out=sys.stdout) -> list[list[str]]:
    print(f"{name}:", file=out)
    for a in sorted(g.edges):
        for b in sorted(g.edges[a]):
            pairs = sorted(g.edges[a][b])
            shown = ", ".join(f"{x}->{y}" for x, y in pairs[:4])
            more = f" (+{len(pairs) - 4})" if len(pairs) > 4 else ""
            print(f"  {a} -> {b}: {shown}{more}", file=out)
    found = circles(g)
    for comp in found:
        print(f"  CIRCLE: {' <-> '.join(comp)}", file=out)
        for a in comp:
            for b in comp:
                if b in g.edges.get(a, {}):
                    x, y = sorted(g.edges[a][b])[0]
                    print(f"    {a} -> {b} ({x} calls {y})", file=out)
    if not found:
        print("  no circle", file=out)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 on a circle")
    ap.add_argument("--longest", type=int, default=5, metavar="N",
                    help="the N longest functions (lines), 0 for none")
    args = ap.parse_args(argv)
    makefile = HERE / "Makefile"
    bad = 0
    everything: dict[str, Function] = {}
    for lib, var in LIBRARIES.items():
        g = build(HERE, makefile_sources(makefile, var))
        bad += len(report(lib, g))
        for f in g.functions.values():
            everything[f"{f.file}:{f.name}"] = f
    if args.longest:
        print("longest functions:")
        for f in sorted(everything.values(), key=lambda f: -f.length)[:args.longest]:
            print(f"  {f.length:4d} {f.file}:{f.line} {f.name}")
    return 1 if bad and args.check else 0


if __name__ == "__main__":
    os.environ.setdefault("LC_ALL", "C")
    sys.exit(main())
