"""Errors that cross the control plane: an errno name and a sentence.

Every failing verbs call is reported the way rdma-core reports it: an errno
(``wr_complete`` returns one, pyverbs raises PyverbsRDMAError carrying it). The
sentence names the verbs rule that was broken, hyper-h2 style, so a user reading
"rkey 0x1200 lacks IBV_ACCESS_REMOTE_WRITE" knows what to fix.
"""

from __future__ import annotations

import errno as _errno
import os
import re
import socket

# The errno names the daemon may answer with (docs/architecture.md, control plane).
ERRNO_NAMES = ("EINVAL", "EOPNOTSUPP", "ENOENT", "EEXIST", "ENOMEM", "EACCES", "EPROTO",
               "EBUSY", "E2BIG", "EMSGSIZE", "EPERM", "ETIMEDOUT", "ECONNRESET",
               "ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH")
# What a failed connect(2) is reported as, when it is one of these; other causes are
# ECONNRESET, the errno of a connection that could not be had.
_CONNECT_ERRNOS = {getattr(_errno, name): name for name in
                   ("ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "ETIMEDOUT", "ECONNRESET")}


class RDMAError(Exception):
    """A verbs call failed: ``errno_name`` (e.g. "EINVAL"), ``errno`` (its number), ``message``."""

    def __init__(self, errno_name: str, message: str) -> None:
        if errno_name not in ERRNO_NAMES:
            raise ValueError(f"unknown errno name {errno_name!r}")
        self.errno_name = errno_name
        self.errno = getattr(_errno, errno_name)
        self.message = message
        super().__init__(f"{errno_name}: {message}")

    def __reduce__(self):
        return (type(self), (self.errno_name, self.message))


def einval(message: str) -> RDMAError:
    return RDMAError("EINVAL", message)


def eopnotsupp(message: str) -> RDMAError:
    return RDMAError("EOPNOTSUPP", message)


def connect_error(host: str, port: int, exc: OSError) -> RDMAError:
    """The RDMAError for a connection to ``host:port`` that failed with ``exc``: the
    errno that happened (ECONNREFUSED, EHOSTUNREACH, ENETUNREACH, ETIMEDOUT) and its
    reason, or "cannot resolve host" for a failed name lookup (a socket.gaierror,
    whose numbers are getaddrinfo's EAI_* codes, not errnos)."""
    if isinstance(exc, socket.gaierror):
        reason = exc.strerror or str(exc)
        return RDMAError("EHOSTUNREACH", f"cannot resolve host {host!r}: {reason}")
    number = exc.errno
    if number is None:
        # asyncio tried several addresses and lists each failure: "Multiple exceptions:
        # [Errno 111] Connect call failed ..., [Errno 99] ..."; the first one counts.
        found = re.search(r"\[Errno (\d+)\]", str(exc))
        number = int(found.group(1)) if found else None
    name = _CONNECT_ERRNOS.get(number, "ECONNRESET")
    reason = os.strerror(number) if number else str(exc)
    return RDMAError(name, f"cannot connect to {host}:{port}: {reason}")
