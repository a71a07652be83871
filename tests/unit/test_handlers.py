"""The daemon's request handlers are registered one way.

Every handler is a module-level function of (the session's Verbs, the request, its id) in
one of server/verbs.py's ``HANDLER_MODULES``, named in that module's own ``HANDLERS``;
``verbs.HANDLERS`` joins them and refuses a request type named twice. No class of server/
carries a handler method (the mixins the handlers once were), and no handler module names a
function of another module.
"""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path

import pytest

from softhca.protocol import cm as cm_proto
from softhca.protocol import control
from softhca.server import verbs

ROOT = Path(__file__).resolve().parents[2]


def test_every_request_type_has_one_handler_from_one_module():
    assert set(verbs.HANDLERS) == set(control.BY_VERB.values())
    owners = {}
    for mod in verbs.HANDLER_MODULES:
        for kind, handler in mod.HANDLERS.items():
            owners.setdefault(kind, []).append(mod.__name__)
            assert inspect.isfunction(handler), (kind, handler)
            # A function of the module that names it, at its top level (not a method).
            assert handler.__module__ == mod.__name__, (kind, handler.__module__, mod.__name__)
            assert handler.__qualname__ == handler.__name__, handler.__qualname__
            assert list(inspect.signature(handler).parameters)[2:] == ["rid"], handler
    assert {k: v for k, v in owners.items() if len(v) > 1} == {}


def test_the_handler_modules_are_every_server_module_with_handlers():
    """A module that defines an ``op_`` function takes part through HANDLER_MODULES (a
    handler written but never registered would be a request the daemon cannot answer)."""
    with_handlers = set()
    for path in sorted((ROOT / "server").glob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name.startswith("op_") for n in tree.body):
            with_handlers.add(f"softhca.server.{path.stem}")
    assert with_handlers == {m.__name__ for m in verbs.HANDLER_MODULES}


def test_no_server_class_holds_a_handler_method():
    found = []
    for path in sorted((ROOT / "server").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                found += [f"{path.name}:{f.lineno} {node.name}.{f.name}" for f in node.body
                          if isinstance(f, ast.FunctionDef) and f.name.startswith("op_")]
    assert found == []


def _module(name: str, handlers: dict) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.HANDLERS = handlers
    return mod


def test_join_refuses_a_request_type_named_twice():
    def op_a(v, r, rid):
        return {}

    def op_b(v, r, rid):
        return {}

    one = _module("one", {control.AllocPd: op_a})
    two = _module("two", {control.AllocPd: op_b, control.DeallocPd: op_b})
    assert verbs.join_handlers([one]) == {control.AllocPd: op_a}
    with pytest.raises(ValueError, match="AllocPd has a handler in .* and in two"):
        verbs.join_handlers([one, two])


def test_the_cm_requests_are_in_the_table_too():
    cm_requests = {c for c in vars(cm_proto).values()
                   if isinstance(c, type) and c.__name__.startswith("Cm")
                   and c in control.BY_VERB.values()}
    assert cm_requests and cm_requests <= set(verbs.HANDLERS)
