"""pyverbs.pyverbs_error: pyverbs' three exceptions, with its message format.

``PyverbsRDMAError(msg, error_code)`` is what a failing verb raises; its ``error_code`` is
the errno, and its text ends in ". Errno: N, <strerror>" as rdma-core's pyverbs prints it.
``PyverbsUserError`` is a mistake pyverbs catches before calling the device.
"""

import errno
import os
import sys

# Set by tests/pyverbs/test_upstream_pyverbs.py: each EOPNOTSUPP softhca raises also
# writes this mark to stderr, inside the line unittest's verbose runner is writing for
# the running test, so the report can tell a skip on softhca's EOPNOTSUPP from a skip by
# the test's own environment check. Nothing else changes.
EOPNOTSUPP_MARK = "{softhca:EOPNOTSUPP}"


class PyverbsError(Exception):
    def __init__(self, msg, error_code=-1):
        if error_code != -1:
            msg = f"{msg}. Errno: {error_code}, {os.strerror(error_code)}"
        super().__init__(msg)


class PyverbsRDMAError(PyverbsError):
    def __init__(self, msg, error_code=-1):
        super().__init__(msg, error_code)
        self._error_code = error_code
        if error_code == errno.EOPNOTSUPP and os.environ.get("SOFTHCA_PYVERBS_MARK_EOPNOTSUPP"):
            sys.stderr.write(EOPNOTSUPP_MARK)
            sys.stderr.flush()

    @property
    def error_code(self):
        return self._error_code


class PyverbsUserError(PyverbsError):
    def __init__(self, msg):
        super().__init__(msg)
