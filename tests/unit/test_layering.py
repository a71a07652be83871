"""The tower holds: tools -> client -> server -> engine -> protocol, nothing imports upward.

The walker reads every module of the five packages with ``ast`` (so it sees imports inside
functions too), resolves relative imports against the module's own package, and also
catches absolute ``softhca.<floor>`` imports, which would hide the structure from tools
that read the tree. The second half feeds it small trees with one upward import each and
checks that it reports exactly that import.

Inside each package the modules import one another without a cycle: the graph of their
imports, those inside functions and under ``if TYPE_CHECKING:`` included, has no circle,
and each circle found is named by its modules and one path around it. Small trees check
that the walker finds a circle wherever its imports are written, and none where there is
none.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORS = ["protocol", "engine", "server", "client", "tools"]      # bottom to top
RANK = {name: i for i, name in enumerate(FLOORS)}


def imported_floors(root: Path, path: Path) -> list[tuple[int, str, bool]]:
    """(line, imported floor, written absolutely) for every import of a softhca floor."""
    tree = ast.parse(path.read_text(), str(path))
    # The module's package inside softhca: tools/x.py -> ["tools"], engine/sub/y.py ->
    # ["engine", "sub"]; a relative import of level n drops n - 1 of these.
    package = list(path.relative_to(root).parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                mod = (node.module or "").split(".")
                if mod[0] == "softhca" and len(mod) > 1:
                    found.append((node.lineno, mod[1], True))
                elif mod == ["softhca"]:
                    found.extend((node.lineno, a.name.split(".")[0], True) for a in node.names)
                continue
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            if not base:            # from .. import client  (the softhca level)
                if node.module:
                    found.append((node.lineno, node.module.split(".")[0], False))
                else:
                    found.extend((node.lineno, a.name.split(".")[0], False) for a in node.names)
            else:
                found.append((node.lineno, base[0], False))
        elif isinstance(node, ast.Import):
            for a in node.names:
                mod = a.name.split(".")
                if mod[0] == "softhca" and len(mod) > 1:
                    found.append((node.lineno, mod[1], True))
    return [f for f in found if f[1] in RANK]


def violations(root: Path) -> list[str]:
    out = []
    for floor in FLOORS:
        for path in sorted((root / floor).rglob("*.py")):
            for line, target, absolute in imported_floors(root, path):
                where = f"{path.relative_to(root)}:{line}"
                if RANK[target] > RANK[floor]:
                    out.append(f"{where}: {floor} imports upward from {target}")
                if absolute:
                    out.append(f"{where}: absolute softhca.{target} import (use a relative one)")
    return out


def test_the_tree_imports_only_downward_and_relatively():
    assert violations(ROOT) == []


def test_every_floor_is_a_package_of_the_distribution():
    text = (ROOT / "pyproject.toml").read_text()
    for floor in FLOORS:
        assert (ROOT / floor / "__init__.py").is_file()
        assert f'"softhca.{floor}" = "{floor}"' in text


UPWARD = [
    ("server/daemon.py", "from ..client import api\n", "server imports upward from client"),
    ("engine/rc.py", "def f():\n    from ..server.daemon import Daemon\n",
     "engine imports upward from server"),
    ("protocol/packets.py", "from ..engine import rc\n", "protocol imports upward from engine"),
    ("client/api.py", "from ..tools.demo import x\n", "client imports upward from tools"),
    ("engine/sub/deep.py", "from ...server import daemon\n", "engine imports upward from server"),
    ("protocol/x.py", "import softhca.tools.cli\n", "protocol imports upward from tools"),
    ("server/x.py", "from softhca.engine import hca\n", "absolute softhca.engine import"),
]


@pytest.mark.parametrize("path, source, complaint", UPWARD, ids=[u[0] for u in UPWARD])
def test_the_walker_catches_an_upward_import(tmp_path, path, source, complaint):
    for floor in FLOORS:
        (tmp_path / floor).mkdir()
        (tmp_path / floor / "__init__.py").write_text("")
        # Downward and sideways imports are fine and must not be reported.
        (tmp_path / floor / "ok.py").write_text(
            "from . import ok\n" + "".join(f"from ..{below} import ok as _{below}\n"
                                             for below in FLOORS[: RANK[floor]]))
    target = tmp_path / path
    target.parent.mkdir(parents=True, exist_ok=True)
    if not (target.parent / "__init__.py").exists():
        (target.parent / "__init__.py").write_text("")
    target.write_text(source)
    found = violations(tmp_path)
    assert found and all(f.startswith(path + ":") for f in found), found
    assert any(complaint in f for f in found), found


# The oracle judges the engine: the demo and the tests take expected bytes from it, so
# it must not be computed by what it judges (nor by anything built on the engine).
INDEPENDENT = {"tools/oracle.py": {"protocol"}, "tools/crypto_table.py": {"protocol", "oracle"}}


@pytest.mark.parametrize("module", sorted(INDEPENDENT))
def test_the_oracle_does_not_import_the_engine(module):
    tree = ast.parse((ROOT / module).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            names = [node.module] if node.module else [a.name for a in node.names]
            imported.update(n.split(".")[0] for n in names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            assert not any(m.startswith("softhca") for m in mods), ast.dump(node)
    assert imported <= INDEPENDENT[module], imported


def engine_imports(path: Path) -> set[str]:
    """The engine modules ``path`` imports at run time (inside functions too; not the
    ``if TYPE_CHECKING:`` imports, which only annotations see)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING"
                   for stmt in node.body for n in ast.walk(stmt)}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and id(node) not in typing_only:
            names = [node.module] if node.module else [a.name for a in node.names]
            out.update(n.split(".")[0] for n in names)
    return out


def test_the_engine_modules_import_each_other_without_a_cycle():
    graph = {p.stem: engine_imports(p) for p in (ROOT / "engine").glob("*.py")}
    done: set[str] = set()

    def visit(mod: str, path: tuple[str, ...]) -> None:
        assert mod not in path, "import cycle: " + " -> ".join((*path, mod))
        if mod in done or mod not in graph:
            return
        for dep in sorted(graph[mod]):
            visit(dep, (*path, mod))
        done.add(mod)

    for mod in sorted(graph):
        visit(mod, ())


# -- no import cycle inside a package ----------------------------------------------------
# Every import counts: at module level, inside a function, and under ``if TYPE_CHECKING:``
# (a cycle that only type checkers follow is still two modules that cannot be read, moved
# or tested apart). An import names the module it loads: ``from .x import y`` the module
# ``x`` (or ``x.y`` when that is a submodule), ``from . import x`` the module ``x`` (or the
# package itself when ``x`` is a name it defines).

def package_modules(root: Path, floor: str) -> dict[tuple[str, ...], Path]:
    """Every module of a floor by its dotted parts, a package by its own parts (its
    ``__init__.py``): ("server", "daemon"), ("client", "pyverbs"), ("client",)."""
    out = {}
    for path in sorted((root / floor).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[parts[:-1] if parts[-1] == "__init__" else parts] = path
    return out


def _target(modules, base: tuple[str, ...], name: str | None) -> tuple[str, ...] | None:
    """The module an import of ``name`` from ``base`` loads: the submodule when there is
    one, else ``base`` itself; None outside the floor's modules."""
    if name is not None and (*base, name) in modules:
        return (*base, name)
    return base if base in modules else None


def module_imports(root: Path, path: Path, modules) -> set[tuple[str, ...]]:
    """The modules of the same floor that the module at ``path`` imports."""
    parts = path.relative_to(root).with_suffix("").parts
    package = parts[:-1]
    floor = parts[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                mod = tuple(a.name.split("."))
                if mod[:2] == ("softhca", floor):
                    found.add(_target(modules, mod[1:], None))
        elif isinstance(node, ast.ImportFrom):
            mod = tuple(node.module.split(".")) if node.module else ()
            if node.level == 0:
                if mod[:2] != ("softhca", floor):
                    continue
                base = mod[1:]
            else:
                base = package[: len(package) - (node.level - 1)] + mod
            if base[:1] != (floor,):
                continue            # another floor: the tower's business, above
            found.update(_target(modules, base, a.name) for a in node.names)
    found.discard(None)
    return found


def _cycle_through(graph, start) -> list:
    """One shortest import path from ``start`` back to itself."""
    paths = {dep: (start, dep) for dep in sorted(graph[start])}
    queue = list(paths)
    while queue:
        mod = queue.pop(0)
        if mod == start:
            return list(paths[mod])
        for dep in sorted(graph[mod]):
            if dep not in paths:
                paths[dep] = (*paths[mod], dep)
                queue.append(dep)
    return []


def circles(graph) -> list[list]:
    """The groups of modules that import each other in a circle: Tarjan's strongly
    connected components of more than one module, or of one that imports itself."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    groups = []
    for first in sorted(graph):
        if first in index:
            continue
        index[first] = low[first] = len(index)
        stack.append(first)
        work = [(first, iter(sorted(graph[first])))]
        while work:
            mod, deps = work[-1]
            dep = next(deps, None)
            if dep is not None:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                elif dep in stack:
                    low[mod] = min(low[mod], index[dep])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[mod])
            if low[mod] == index[mod]:
                group = stack[stack.index(mod):]
                del stack[stack.index(mod):]
                if len(group) > 1 or mod in graph[mod]:
                    groups.append(sorted(group))
    return groups


def import_cycles(root: Path, floor: str) -> list[str]:
    """One line per group of modules of ``floor`` that import each other in a circle:
    its modules, then one cycle through them."""
    modules = package_modules(root, floor)
    graph = {m: module_imports(root, p, modules) for m, p in modules.items()}

    def name(mod: tuple[str, ...]) -> str:
        return str(modules[mod].relative_to(root))

    return sorted(", ".join(name(m) for m in group) + ": "
                  + " -> ".join(name(m) for m in _cycle_through(graph, group[0]))
                  for group in circles(graph))


@pytest.mark.parametrize("floor", FLOORS)
def test_no_import_cycle_inside_a_package(floor):
    cycles = import_cycles(ROOT, floor)
    assert not cycles, f"import cycles inside {floor}/:\n" + "\n".join(cycles)


def circle(*names: str) -> str:
    """import_cycles' line for the cycle through engine modules ``names`` in that order."""
    paths = [f"engine/{n}.py" for n in names]
    return ", ".join(sorted(paths)) + ": " + " -> ".join([*paths, paths[0]])


CYCLES = [
    ("module level", {"a.py": "from . import b\n", "b.py": "from .a import x\n"},
     [circle("a", "b")]),
    ("inside a function", {"a.py": "from .b import y\n",
                           "b.py": "def f():\n    from .a import x\n"},
     [circle("a", "b")]),
    ("TYPE_CHECKING", {"a.py": "from .b import y\n",
                       "b.py": "from typing import TYPE_CHECKING\n"
                               "if TYPE_CHECKING:\n    from .a import X\n"},
     [circle("a", "b")]),
    ("three modules", {"a.py": "from .b import y\n", "b.py": "from .c import z\n",
                       "c.py": "from . import a\n", "d.py": "from . import a\n"},
     [circle("a", "b", "c")]),
    ("through a subpackage", {"a.py": "from .sub import helper\n",
                              "sub/__init__.py": "from .helper import h\n",
                              "sub/helper.py": "from .. import a\n"},
     [circle("a", "sub/helper")]),
    ("the package's own __init__", {"__init__.py": "from .a import x\n",
                                     "a.py": "from . import names\n"},
     [circle("__init__", "a")]),
    ("absolute", {"a.py": "import softhca.engine.b\n", "b.py": "from softhca.engine import a\n"},
     [circle("a", "b")]),
    ("two apart", {"a.py": "from . import b\n", "b.py": "from . import a\n",
                   "c.py": "from . import d\n", "d.py": "from . import c\n"},
     [circle("a", "b"), circle("c", "d")]),
    ("none: down, sideways, another floor", {"a.py": "from . import b\nfrom .c import x\n",
                                             "b.py": "from .c import y\n"
                                                     "from ..protocol import a\n",
                                             "c.py": "import os\n"}, []),
]


@pytest.mark.parametrize("files, expected", [c[1:] for c in CYCLES], ids=[c[0] for c in CYCLES])
def test_the_walker_names_an_import_cycle(tmp_path, files, expected):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "protocol").mkdir()
    (tmp_path / "protocol" / "a.py").write_text("from ..engine import a\n")
    for name, source in files.items():
        (tmp_path / "engine" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "engine" / name).write_text(source)
    assert import_cycles(tmp_path, "engine") == expected


# -- protocol/ holds the bytes and does no I/O -------------------------------------------
# No socket, no event loop, no process, no file: a module of protocol/ that wants one has
# found its place on a floor above (a pcap file is written by server/capture.py from the
# bytes protocol/roce.py gives).

IO_MODULES = {"socket", "asyncio", "subprocess", "selectors", "ssl", "os", "io", "shutil",
              "tempfile", "pathlib"}


def io_uses(path: Path) -> list[str]:
    """Each import of an I/O module and each call of the builtin ``open`` in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: import {a.name}" for a in node.names
                    if a.name.split(".")[0] in IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and not node.level \
                and (node.module or "").split(".")[0] in IO_MODULES:
            out.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "open":
            out.append(f"{node.lineno}: open()")
    return out


def test_protocol_does_no_io():
    found = {str(p.relative_to(ROOT)): io_uses(p) for p in sorted((ROOT / "protocol").glob("*.py"))}
    assert {k: v for k, v in found.items() if v} == {}


@pytest.mark.parametrize("source, expected", [
    ("import socket\n", ["1: import socket"]),
    ("from asyncio import sleep\n", ["1: from asyncio import"]),
    ("def f(p):\n    with open(p) as f:\n        pass\n", ["2: open()"]),
    ("import struct\nfrom . import frames\n", []),
], ids=["socket", "asyncio", "open", "none"])
def test_the_io_walker_finds_each_use(tmp_path, source, expected):
    (tmp_path / "m.py").write_text(source)
    assert io_uses(tmp_path / "m.py") == expected
