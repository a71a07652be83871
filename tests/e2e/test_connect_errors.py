"""A connection that cannot be had names its cause (the connection errors a new user meets): the errno that
happened, and "cannot resolve host" for a name that does not resolve."""

from __future__ import annotations

import errno
import socket

import pytest

import softhca.client as sh
from softhca.server.link import connect_error


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_nothing_listening_is_econnrefused():
    port = free_port()
    with pytest.raises(sh.RDMAError) as e:
        await sh.connect(f"127.0.0.1:{port}", timeout=5)
    assert e.value.errno_name == "ECONNREFUSED"
    assert e.value.errno == errno.ECONNREFUSED
    assert e.value.message == f"cannot connect to 127.0.0.1:{port}: Connection refused"


async def test_an_unresolvable_host_says_so():
    # RFC 6761: names under .invalid never resolve.
    with pytest.raises(sh.RDMAError) as e:
        await sh.connect("no-such-host.invalid:4791", timeout=10)
    assert e.value.errno_name == "EHOSTUNREACH"
    assert e.value.message.startswith("cannot resolve host 'no-such-host.invalid': ")
    assert "Unknown error" not in e.value.message


@pytest.mark.parametrize("number, name, reason", [
    (errno.ECONNREFUSED, "ECONNREFUSED", "Connection refused"),
    (errno.EHOSTUNREACH, "EHOSTUNREACH", "No route to host"),
    (errno.ENETUNREACH, "ENETUNREACH", "Network is unreachable"),
    (errno.ETIMEDOUT, "ETIMEDOUT", "Connection timed out"),
])
def test_each_connect_errno_is_kept(number, name, reason):
    err = connect_error("10.0.0.9", 4791, OSError(number, "whatever the OS said"))
    assert (err.errno_name, err.errno) == (name, number)
    assert err.message == f"cannot connect to 10.0.0.9:4791: {reason}"


def test_several_addresses_tried_keep_the_first_errno():
    # asyncio's error when every address of a name failed differently.
    exc = OSError("Multiple exceptions: [Errno 111] Connect call failed ('127.0.0.1', 1), "
                  "[Errno 99] Cannot assign requested address")
    err = connect_error("localhost", 1, exc)
    assert err.errno_name == "ECONNREFUSED"
    assert err.message == "cannot connect to localhost:1: Connection refused"


def test_another_errno_is_a_connection_reset_with_its_reason():
    err = connect_error("h", 1, OSError(errno.EADDRNOTAVAIL, "x"))
    assert err.errno_name == "ECONNRESET"
    assert err.message == "cannot connect to h:1: Cannot assign requested address"


def test_a_failed_lookup_is_not_read_as_an_errno():
    # getaddrinfo's EAI_NONAME is -2: read as an errno it was "Unknown error -2".
    err = connect_error("x", 1, socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert err.errno_name == "EHOSTUNREACH"
    assert err.message == "cannot resolve host 'x': Name or service not known"
