"""pyverbs.base: the base classes every pyverbs object derives from, and helpers."""

from __future__ import annotations

import errno
import logging

from .pyverbs_error import PyverbsRDMAError


def inc_rkey(rkey: int) -> int:
    """ibv_inc_rkey(3): the next rkey of an MW bind, its low 8 bits (the key) incremented."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


def PyverbsRDMAErrno(msg: str) -> PyverbsRDMAError:  # noqa: N802 - pyverbs' name
    # pyverbs reads the C errno of the last failed call; a softhca verb that fails raises
    # its own PyverbsRDMAError with the daemon's errno, so what is left is a generic EIO.
    return PyverbsRDMAError(msg, errno.EIO)


class PyverbsObject:
    def __init__(self, *args, **kwargs):
        self.logger = logging.getLogger(self.__class__.__name__)

    def set_log_level(self, val):
        self.logger.setLevel(val)


class PyverbsCM(PyverbsObject):
    """A pyverbs object with a device resource behind it: a context manager whose
    ``close()`` releases it (and is harmless twice)."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        return self.close()

    def close(self):
        pass
