"""What the pyverbs modules share: attribute records, resource lifetime, unmodelled classes.

A pyverbs resource (PD, MR, CQ, QP, ...) wraps one object of the async client. Closing it
closes that object in the daemon; closing its Context ends the control session, which
destroys everything the session created (as closing a device file does), so the children
are only marked closed. Garbage collection closes too, as pyverbs' ``__dealloc__`` does,
without waiting for the reply (it may run on any thread).
"""

from __future__ import annotations

import asyncio
import errno
import os

from . import _sync
from .base import PyverbsCM, PyverbsObject
from .pyverbs_error import PyverbsRDMAError


class Record(PyverbsObject):
    """A C struct of plain fields: ``_fields`` in constructor order with defaults; every
    field readable and writable as an attribute."""

    _fields: tuple[tuple[str, object], ...] = ()

    def __init__(self, *args, **kwargs):
        super().__init__()
        if len(args) > len(self._fields):
            raise TypeError(f"{type(self).__name__} takes at most {len(self._fields)} "
                            f"positional arguments")
        names = [n for n, _ in self._fields]
        unknown = set(kwargs) - set(names)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unexpected keyword argument(s) "
                            f"{', '.join(sorted(unknown))}")
        for (name, _), value in zip(self._fields, args, strict=False):
            kwargs.setdefault(name, value)
        for name, default in self._fields:
            setattr(self, name, kwargs.get(name, default))

    def __str__(self):
        return "\n".join(f"{n:<24}: {getattr(self, n)}" for n, _ in self._fields)


def unsupported(what: str) -> PyverbsRDMAError:
    return PyverbsRDMAError(f"{what} is not modelled by softhca", errno.EOPNOTSUPP)


# Where libmlx5 takes a CQ's or QP's buffer, chosen per object kind by the environment
# (MLX_CQ_ALLOC_TYPE, MLX_QP_ALLOC_TYPE, MLX_SRQ_ALLOC_TYPE): HUGE must come from 2 MiB
# huge pages (shmget with SHM_HUGETLB) and the create fails when there are none; PREFER_HUGE
# and ALL fall back to ordinary pages. softhca keeps no ring in the application's memory,
# so only HUGE's refusal is visible, and it is kept.
HUGE_PAGES = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"


def check_alloc_type(component: str, what: str) -> None:
    """Refuse a create as libmlx5 does when ``<component>_ALLOC_TYPE=HUGE`` (case
    insensitive) and the system has no free 2 MiB huge page: ENOMEM."""
    if os.environ.get(f"{component}_ALLOC_TYPE", "").upper() != "HUGE":
        return
    try:
        with open(HUGE_PAGES) as f:
            free = int(f.read().strip() or 0)
    except (OSError, ValueError):
        free = 0
    if free < 1:
        raise PyverbsRDMAError(f"Failed to create {what}: {component}_ALLOC_TYPE=HUGE and "
                               f"no free 2 MiB huge page ({HUGE_PAGES})", errno.ENOMEM)


def unmodelled(name: str, what: str, base: type = PyverbsCM) -> type:
    """A pyverbs class for a feature softhca does not model: importable, and creating one
    raises PyverbsRDMAError(EOPNOTSUPP) as a device without the feature answers, so
    pyverbs code and the upstream tests skip it."""

    def __init__(self, *args, **kwargs):
        raise unsupported(what)

    def close(self):
        pass

    return type(name, (base,), {"__init__": __init__, "close": close,
                                "__doc__": f"{what}: not modelled by softhca (EOPNOTSUPP)."})


class Resource(PyverbsCM):
    """A device object behind a pyverbs object: ``_obj`` (the async client's), ``_ctx``."""

    _obj = None
    _ctx = None

    def _adopt(self, ctx, obj) -> None:
        self._ctx, self._obj = ctx, obj
        ctx._children.add(self)

    @property
    def _alive(self) -> bool:
        return self._obj is not None and self._ctx is not None and self._ctx._node is not None

    def _dependents(self):
        return ()

    def close(self):
        for d in list(self._dependents()):
            d.close()
        obj, self._obj = self._obj, None
        node = self._ctx._node if self._ctx is not None else None
        # In a fork child, the parent's object is only forgotten (as close(2) of an
        # inherited descriptor leaves the parent's file open): it stays the parent's.
        if obj is not None and node is not None and not _sync.inherited(node):
            _sync.run(obj.close(), f"Failed to close {type(self).__name__}")

    def __del__(self):
        obj = self._obj
        ctx = self._ctx
        if obj is None or ctx is None or ctx._node is None:
            return
        self._obj = None
        loop = _sync._loop
        # No coroutine is made for a loop that will not run it (stopped at exit): it
        # would be reported "never awaited"; nor for a fork child's copy of its
        # parent's object, which is the parent's to destroy.
        if (loop is not None and not loop.is_closed() and loop.is_running()
                and not _sync._stopped and not _sync.inherited(ctx._node)):
            try:
                asyncio.run_coroutine_threadsafe(_quiet(obj.close()), loop)
            except RuntimeError:
                pass


async def _quiet(coro):
    try:
        await coro
    except Exception:       # noqa: BLE001 - a collected object; nobody waits for its close
        pass


def delegate(holder: str, name: str, writable: bool = True) -> property:
    """A property reading (and writing) ``self.<holder>.<name>``: pyverbs shows a nested
    struct's fields on its parent too (an AHAttr's GRH, an MR's keys)."""

    def get(self):
        return getattr(getattr(self, holder), name)

    def put(self, value):
        setattr(getattr(self, holder), name, value)

    return property(get, put if writable else None)


class Attributes(PyverbsObject):
    """The attribute struct of a feature softhca does not model: it holds what it is
    given (positionally as ``args``) so code can build it; the object it is for refuses
    with EOPNOTSUPP when created."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.args = args
        for k, v in kwargs.items():
            setattr(self, k, v)


def attributes(name: str) -> type:
    return type(name, (Attributes,), {})


def module_of_unmodelled(namespace: dict, what: str, objects: str, attrs: str = "") -> None:
    """Fill a module with unmodelled object classes and attribute carriers."""
    for n in objects.split():
        namespace[n] = unmodelled(n, what)
    for n in attrs.split():
        namespace[n] = attributes(n)
