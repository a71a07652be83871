"""Errors that cross the control plane: an errno name and a sentence.

Every failing verbs call is reported the way rdma-core reports it: an errno
(``wr_complete`` returns one, pyverbs raises PyverbsRDMAError carrying it). The
sentence names the verbs rule that was broken, hyper-h2 style, so a user reading
"rkey 0x1200 lacks IBV_ACCESS_REMOTE_WRITE" knows what to fix.
"""

from __future__ import annotations

import errno as _errno

# The errno names the daemon may answer with (docs/architecture.md, control plane);
# EFAULT: memory a local program named that the daemon cannot reach (docs/native.md);
# EADDRINUSE, EADDRNOTAVAIL, EAGAIN: the connection manager's (rdma_bind_addr(3),
# rdma_listen(3), rdma_connect(3)); EIO: a fork child's call on a session of its parent
# (client/connection.py), as a verb on an object a child inherited without fork support.
ERRNO_NAMES = ("EINVAL", "EOPNOTSUPP", "ENOENT", "EEXIST", "ENOMEM", "EACCES", "EPROTO",
               "EBUSY", "E2BIG", "EMSGSIZE", "EPERM", "ETIMEDOUT", "ECONNRESET",
               "ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EFAULT", "EADDRINUSE",
               "EADDRNOTAVAIL", "EAGAIN", "EIO")


class RDMAError(Exception):
    """A verbs call failed: ``errno_name`` (e.g. "EINVAL"), ``errno`` (its number), ``message``."""

    def __init__(self, errno_name: str, message: str, bad_wr: int | None = None) -> None:
        if errno_name not in ERRNO_NAMES:
            raise ValueError(f"unknown errno name {errno_name!r}")
        self.errno_name = errno_name
        self.errno = getattr(_errno, errno_name)
        self.message = message
        # A post's refusal: the index in the request of the WR refused (the ones before
        # it were taken), so a client's bad_wr can name it (ibv_post_send(3)).
        self.bad_wr = bad_wr
        super().__init__(f"{errno_name}: {message}")

    def __reduce__(self):
        return (type(self), (self.errno_name, self.message, self.bad_wr))


def einval(message: str) -> RDMAError:
    return RDMAError("EINVAL", message)


def eopnotsupp(message: str) -> RDMAError:
    return RDMAError("EOPNOTSUPP", message)
