"""The tower holds: tools -> client -> server -> engine -> protocol, nothing imports upward.

The walker reads every module of the five packages with ``ast`` (so it sees imports inside
functions too), resolves relative imports against the module's own package, and also
catches absolute ``softhca.<floor>`` imports, which would hide the structure from tools
that read the tree. The second half feeds it small trees with one upward import each and
checks that it reports exactly that import.
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


# -- no import cycle inside a package ------------------------------------------------------

# The packages whose modules must import each other without a cycle. Every import counts:
# those under ``if TYPE_CHECKING:`` and those inside functions too, since both still tie
# the modules together (a cycle there is a cycle moved out of sight, not removed).
CYCLE_FREE = ["server"]


def module_name(pkg_root: Path, path: Path) -> str:
    """A module's dotted name inside its package: wire.py -> "wire", pyverbs/_sync.py ->
    "pyverbs._sync", the package's own __init__.py -> ""."""
    parts = list(path.relative_to(pkg_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_imports(pkg_root: Path, path: Path, modules: set[str]) -> set[str]:
    """The modules of the same package that ``path`` imports, anywhere in it."""
    tree = ast.parse(path.read_text(), str(path))
    here = list(path.relative_to(pkg_root).parts[:-1])       # the module's subpackage
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        if node.level - 1 > len(here):
            continue                    # above the package: another floor of the tower
        base = here[: len(here) - (node.level - 1)]
        target = base + (node.module.split(".") if node.module else [])
        names = [".".join(target + [a.name]) for a in node.names]
        subs = [n for n in names if n in modules]
        if subs:                        # from . import wire / from .sub import mod
            found.update(subs)
        elif ".".join(target) in modules:
            found.add(".".join(target))
    return found


def import_graph(pkg_root: Path) -> dict[str, set[str]]:
    paths = {module_name(pkg_root, p): p for p in pkg_root.rglob("*.py")}
    modules = set(paths)
    return {mod: package_imports(pkg_root, p, modules) - {mod} for mod, p in paths.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle found, as "a -> b -> a" (one per strongly tied group met)."""
    cycles: list[str] = []
    state: dict[str, int] = {}          # 1: on the current path, 2: done

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph.get(mod, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*path[path.index(dep):], dep]))
            elif dep not in state:
                visit(dep, [*path, dep])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])
    return cycles


@pytest.mark.parametrize("package", CYCLE_FREE)
def test_a_package_has_no_import_cycle(package):
    assert import_cycles(import_graph(ROOT / package)) == []


CYCLES = [
    ("plain", {"a.py": "from .b import x\n", "b.py": "from .a import y\n"}),
    ("type_checking", {"a.py": "from .b import x\n",
                       "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from .a import Y\n"}),
    ("in_a_function", {"a.py": "from . import b\n",
                       "b.py": "def f():\n    from .c import z\n",
                       "c.py": "from .a import w\n"}),
    ("subpackage", {"a.py": "from .sub.d import x\n", "sub/__init__.py": "",
                    "sub/d.py": "from .. import a\n"}),
]


@pytest.mark.parametrize("name, files", CYCLES, ids=[c[0] for c in CYCLES])
def test_the_cycle_walker_catches_a_cycle(tmp_path, name, files):
    pkg = tmp_path / "server"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # Imports of other floors and of the standard library are no edges.
    (pkg / "ok.py").write_text("import asyncio\nfrom ..engine import rc\nfrom . import a\n")
    for rel, source in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(source)
    cycles = import_cycles(import_graph(pkg))
    assert len(cycles) == 1 and cycles[0].startswith("a -> ") and cycles[0].endswith(" -> a"), \
        cycles


def test_the_cycle_walker_passes_a_tree_without_one(tmp_path):
    pkg = tmp_path / "server"
    (pkg / "sub").mkdir(parents=True)
    for rel, source in {"__init__.py": "", "a.py": "from .b import x\nfrom .sub import d\n",
                        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from .c import Y\n",
                        "c.py": "", "sub/__init__.py": "", "sub/d.py": "from ..c import z\n"
                        }.items():
        (pkg / rel).write_text(source)
    graph = import_graph(pkg)
    assert graph["a"] == {"b", "sub.d"} and graph["b"] == {"c"} and graph["sub.d"] == {"c"}
    assert import_cycles(graph) == []
