"""Every public name of ``softhca.client`` says what it does, and every call that sends a
request to the daemon says how it fails.

- Each public class and function of ``softhca.client`` (its ``__all__`` without the C
  enum constants) has its own docstring; a dataclass's generated signature
  (``SGE(addr: int, ...)``) does not count.
- Each public method and property of those classes, inherited ones included as long
  as softhca defines them, has its own docstring.
- Each of them that sends a request to the daemon (it calls ``.request(``, or another
  method of its class that does) names its errors: an "Errors" paragraph or an errno
  name (EINVAL, ENOENT, ...).

The checkers are plain functions, so the second half feeds them small broken classes
and checks that they report exactly the break.
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import textwrap
import types

import softhca.client
from softhca.protocol.enums import C_NAMES
from softhca.protocol.errors import ERRNO_NAMES

_ERRNO = re.compile(r"\bErrors\b|\b(?:" + "|".join(ERRNO_NAMES) + r")\b")


def own_doc(obj) -> str | None:
    """The docstring written on ``obj`` itself: for a class, the one in its source (not
    a base's, not the signature dataclasses generate); for a function, its own."""
    if inspect.isclass(obj):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
        except (OSError, TypeError):
            return obj.__dict__.get("__doc__")
        return ast.get_docstring(tree.body[0])
    return getattr(obj, "__doc__", None)


def _function(value):
    """The function behind a class attribute (method, classmethod, staticmethod,
    property getter), or None for data."""
    if isinstance(value, property):
        return value.fget
    if isinstance(value, (classmethod, staticmethod)):
        return value.__func__
    return value if inspect.isfunction(value) else None


def public_members(cls, own: str = "softhca.") -> dict[str, object]:
    """Public methods and properties of ``cls`` that softhca defines (its own and its
    softhca bases'), by name, the most derived definition winning."""
    out: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith(own):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and _function(value) is not None:
                out[name] = value
    return out


def _calls(func) -> tuple[bool, set[str]]:
    """(whether ``func`` calls ``<anything>.request(``, the ``self.<name>(`` it calls)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError):
        return False, set()
    requests, own = False, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "request":
                requests = True
            elif isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                own.add(node.func.attr)
    return requests, own


def requesters(cls, own: str = "softhca.") -> set[str]:
    """The public methods of ``cls`` that send a request to the daemon, directly or
    through another method of the class (``to_init`` through ``modify``)."""
    funcs = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith(own):
            for name, value in vars(klass).items():
                f = _function(value)
                if f is not None:
                    funcs[name] = f
    direct, calls = {}, {}
    for name, f in funcs.items():
        direct[name], calls[name] = _calls(f)
    sending = {n for n, d in direct.items() if d}
    grew = True
    while grew:
        more = {n for n, c in calls.items() if n not in sending and c & sending}
        grew = bool(more)
        sending |= more
    return {n for n in sending if not n.startswith("_")}


def public_objects(module) -> dict[str, object]:
    """``module.__all__`` without the C constants (ints under their C names)."""
    return {name: getattr(module, name) for name in module.__all__
            if not (name in C_NAMES and not inspect.isclass(getattr(module, name)))}


def missing_docstrings(module, own: str = "softhca.") -> list[str]:
    """Public classes, functions, methods and properties of ``module`` without their own
    docstring; requesting methods and functions without their errors. Methods count
    when a class of a module named ``own...`` defines them."""
    missing = []
    for name, obj in public_objects(module).items():
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        doc = own_doc(obj)
        if not doc or not doc.strip():
            missing.append(name)
        if inspect.isfunction(obj) and _calls(obj)[0] and not _ERRNO.search(doc or ""):
            missing.append(f"{name}: errors")
        if not inspect.isclass(obj) or issubclass(obj, enum.Enum):
            continue
        sending = requesters(obj, own)
        for attr, value in public_members(obj, own).items():
            fdoc = _function(value).__doc__
            if not fdoc or not fdoc.strip():
                missing.append(f"{name}.{attr}")
            elif attr in sending and not _ERRNO.search(fdoc):
                missing.append(f"{name}.{attr}: errors")
    return sorted(set(missing))


def test_every_public_name_of_the_client_has_a_docstring_with_its_errors():
    assert missing_docstrings(softhca.client) == []


def test_the_checker_sees_the_client():
    """The checker looks where the requests are: QP.modify and its callers send."""
    objs = public_objects(softhca.client)
    assert {"QP", "MKey", "Node", "SGE", "Mlx5CryptoAttr", "connect"} <= set(objs)
    assert {"modify", "to_init", "to_rtr", "to_rts", "connect", "post_send", "wr_complete",
            "post_mkey_configure", "close"} <= requesters(softhca.client.QP)
    assert not {"info", "wr_start", "wr_set_mkey_crypto"} & requesters(softhca.client.QP)
    assert "poll_n" in requesters(softhca.client.CQ)
    assert "next" not in requesters(softhca.client.Subscription)
    # Inherited from protocol.records.SendWR, and part of the client's SendWR.
    assert "set_wr_rdma" in public_members(softhca.client.SendWR)


# -- the checker reports what it must ------------------------------------------------------

class _Base:
    def request(self, verb):
        """Send."""


def _module(**objs):
    return types.SimpleNamespace(__all__=list(objs), **objs)


def _missing(**objs) -> list[str]:
    return missing_docstrings(_module(**objs), own=__name__)


def test_a_method_without_a_docstring_is_reported():
    class Thing(_Base):
        """A thing."""

        def shown(self):
            """Shown."""

        def hidden(self):
            pass

    assert _missing(Thing=Thing) == ["Thing.hidden"]


def test_a_class_with_only_a_generated_docstring_is_reported():
    import dataclasses

    @dataclasses.dataclass
    class Record:
        a: int = 0

    assert Record.__doc__      # dataclasses made one up
    assert _missing(Record=Record) == ["Record"]


def test_a_requesting_method_without_its_errors_is_reported():
    class Thing(_Base):
        """A thing."""

        async def quiet(self):
            """Sends a request."""
            await self.request("x")

        async def through(self):
            """Sends one through quiet."""
            await self.quiet()

        async def told(self):
            """Sends a request. Errors: EINVAL when it is wrong."""
            await self.request("x")

        async def errno_only(self):
            """Sends a request; ENOENT after close."""
            await self.request("x")

        def local(self):
            """Sends nothing."""

    assert _missing(Thing=Thing) == ["Thing.quiet: errors",
                                                       "Thing.through: errors"]


def test_a_function_and_a_property_are_checked():
    class Thing:
        """A thing."""

        @property
        def value(self):
            return 1

    async def connect():
        """Connects."""
        return await Thing().request()

    assert _missing(Thing=Thing, connect=connect) == \
        ["Thing.value", "connect: errors"]
