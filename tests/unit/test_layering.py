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
