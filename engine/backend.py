"""Which implementation does the engine's per-block work: the native accelerator or Python.

The native one is softhca.accel._native (accel/native.c, built by ``make``): block
signature check / generate / strip and AES-XTS over every block or data unit of a
transfer in one C call, the GIL released. The Python one (engine/signature.py,
engine/guards.py, engine/xts.py) is the fallback and the reference: the tests require
both to give the same bytes and the same errors.

Chosen once, at import, from ``SOFTHCA_ENGINE``:

- unset or ``auto``: native when the module imports, else Python;
- ``python``: Python, whether or not the module is built;
- ``native``: native, and an ImportError naming the cause when the module is missing,
  so that a build which lost it cannot pass for one that has it.

``use`` switches in a running process (the tests run every engine test on both).
"""

from __future__ import annotations

import operator
import os
from contextlib import contextmanager
from types import ModuleType

import numpy as np

from .xts import XtsCipher, XtsError, as_uint8
from .xts import xts_transform as python_xts_transform

ENV = "SOFTHCA_ENGINE"
CHOICES = ("auto", "native", "python")
_XTS_BLOCK = 16
_MOD_128 = 1 << 128
_MASK_64 = (1 << 64) - 1


def _import_native() -> tuple[ModuleType | None, str]:
    """The module, or None and why not."""
    try:
        from ..accel import _native
    except ImportError as exc:
        return None, str(exc)
    return _native, ""


def _choose() -> tuple[ModuleType | None, str]:
    want = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if want not in CHOICES:
        raise ValueError(f"{ENV}={want!r}: expected one of {', '.join(CHOICES)}")
    if want == "python":
        return None, f"{ENV}=python"
    module, why = _import_native()
    if module is None and want == "native":
        raise ImportError(f"{ENV}=native but softhca.accel._native cannot be imported ({why}); "
                          "`make accel` builds it")
    return module, why


# The module serving the engine now, None for the Python path; and why it is None.
native, why_python = _choose()


def name() -> str:
    """``native`` or ``python``: what the engine runs now."""
    return "native" if native is not None else "python"


def available() -> bool:
    """Whether the native module can be imported in this process (whatever is in use)."""
    return _import_native()[0] is not None


def use(which: str) -> None:
    """Switch the engine to ``native`` or ``python`` (ImportError when native is missing)."""
    global native, why_python
    if which == "python":
        native, why_python = None, "chosen by use()"
    elif which == "native":
        module, why = _import_native()
        if module is None:
            raise ImportError(f"softhca.accel._native cannot be imported ({why})")
        native, why_python = module, ""
    else:
        raise ValueError(f"engine backend {which!r}: expected native or python")


@contextmanager
def using(which: str):
    """``use(which)`` for the duration of a with block."""
    before = name()
    use(which)
    try:
        yield
    finally:
        use(before)


# -- XTS -------------------------------------------------------------------------------

class NativeXts:
    """One XTS key expanded once in C (AES-NI, or OpenSSL's EVP without it): the same
    ``transform_into`` as engine/xts.py XtsCipher, one C call over every data unit."""

    made_for = "native"

    def __init__(self, module: ModuleType, key: bytes) -> None:
        key = bytes(key)
        if len(key) not in (32, 64):
            raise XtsError(f"XTS key must be 32 or 64 bytes (key1||key2), got {len(key)}")
        self._native = module
        self._key = module.XtsKey(key)

    def transform_into(self, src: np.ndarray, unit_size: int, first_unit: int,
                       initial_tweak: int, encrypt: bool, out: np.ndarray | None) -> bytes | None:
        """Into ``out``; or, when ``out`` is None, into new bytes, returned."""
        unit_size = operator.index(unit_size)
        if unit_size < _XTS_BLOCK:
            raise XtsError(f"XTS data unit must be at least {_XTS_BLOCK} bytes, got {unit_size}")
        tail = src.size % unit_size
        if 0 < tail < _XTS_BLOCK:
            raise XtsError(f"trailing XTS data unit of {tail} bytes is shorter than {_XTS_BLOCK}")
        if out is not None and out.size != src.size:
            raise ValueError(f"output of {out.size} bytes for {src.size} bytes of input")
        dusn = (operator.index(initial_tweak) + operator.index(first_unit)) % _MOD_128
        if not src.size:
            return b"" if out is None else None
        return self._native.xts(self._key, src, out, unit_size, dusn & _MASK_64, dusn >> 64,
                                bool(encrypt))


def xts_cipher(key: bytes) -> XtsCipher | NativeXts:
    """The XTS cipher of ``key`` on the engine's current backend. A key the native module
    refuses (OpenSSL refuses key1 == key2, which IEEE 1619-2007 allows) runs in Python."""
    if native is None:
        return XtsCipher(key)
    try:
        return NativeXts(native, key)
    except ValueError as exc:
        if isinstance(exc, XtsError):
            raise
    cipher = XtsCipher(key)
    cipher.made_for = "native"      # kept while the native backend is in use
    return cipher


def is_current(cipher: object) -> bool:
    """Whether a kept cipher was made for the backend in use (``use`` may have switched)."""
    return getattr(cipher, "made_for", "python") == name()


def xts_transform(key: bytes, data, unit_size: int, first_unit: int, initial_tweak: int,
                  encrypt: bool) -> bytes:
    """engine/xts.py xts_transform on the engine's current backend."""
    if native is None:
        return python_xts_transform(key, data, unit_size, first_unit, initial_tweak, encrypt)
    cipher = xts_cipher(key)
    src = as_uint8(data)
    if isinstance(cipher, NativeXts):
        return cipher.transform_into(src, unit_size, first_unit, initial_tweak, encrypt, None)
    out = np.empty(src.size, dtype=np.uint8)
    cipher.transform_into(src, unit_size, first_unit, initial_tweak, encrypt, out)
    return out.tobytes()
