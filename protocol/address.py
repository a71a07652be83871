"""Daemon addresses as the command line and the API take them: ``HOST:PORT``.

One reading for the client's connect and the capture's endpoints: the host may be an
IPv6 address in brackets, and without a ``:`` the whole text is the host.
"""

from __future__ import annotations


def split_address(address: str, default_port: int = 0) -> tuple[str, int]:
    """``host:port`` as (host, port), ``default_port`` when no port is given; raises
    ValueError when the port is not a number."""
    host, sep, port = address.rpartition(":")
    if not sep:
        return address.strip("[]"), default_port
    if not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT (the port is not a number)")
    if int(port) > 65535:
        raise ValueError(f"{address!r}: port {int(port)} is out of range (0 to 65535)")
    return host.strip("[]"), int(port)
