"""softhca's GIDs: an address vector leads back to a daemon and one of its devices.

softhca carries RDMA between daemons over TCP, so a port's GID has to name a daemon and a
device rather than an Ethernet interface. GID index 0 of a device is the link-local IPv6
address fe80::<IPv4 of the daemon>:<TCP port>:<device index>. A QP moved to RTR with a
GlobalRoute whose dgid is such a GID sends to that daemon's device; its ibv_modify_qp
fails with EINVAL for any other dgid. (The daemon itself knows nothing of GIDs: this is
the address resolution a RoCE stack does with ARP/ND, done here by decoding.)
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from .pyverbs_error import PyverbsRDMAError

PREFIX = bytes.fromhex("fe80000000000000")


def _ipv4(host: str) -> bytes:
    try:
        return ipaddress.IPv4Address(host).packed
    except ValueError:
        pass
    try:
        return socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        raise PyverbsRDMAError(f"softhca GIDs need an IPv4 daemon address, {host!r} has none",
                               errno.EOPNOTSUPP) from None


def gid_raw(host: str, port: int, dev_index: int) -> bytes:
    return PREFIX + _ipv4(host) + port.to_bytes(2, "big") + dev_index.to_bytes(2, "big")


MAPPED = bytes(10) + b"\xff\xff"


def mapped_gid(host: str) -> bytes:
    """The IPv4-mapped GID ::ffff:<IPv4> of ``host`` (RoCE v2's GID of an IPv4 address)."""
    return MAPPED + _ipv4(host)


def route(raw: bytes, default_port: int | None = None) -> tuple[str, int, int]:
    """(daemon IPv4, TCP port, device index) of a softhca GID. An IPv4-mapped GID
    names a daemon by address only: it leads to that address's daemon on
    ``default_port`` (the port of the caller's own daemon), device 0."""
    if len(raw) == 16 and raw[:12] == MAPPED and default_port is not None:
        return socket.inet_ntoa(raw[12:]), default_port, 0
    if len(raw) != 16 or raw[:8] != PREFIX:
        raise PyverbsRDMAError(f"dgid {format_gid(raw)} is not a softhca GID (fe80::<IPv4>:"
                               "<port>:<device>): no daemon is reachable through it",
                               errno.EINVAL)
    host = socket.inet_ntoa(raw[8:12])
    return host, int.from_bytes(raw[12:14], "big"), int.from_bytes(raw[14:16], "big")


def format_gid(raw: bytes) -> str:
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def same_daemon(host: str, port: int, other_host: str, other_port: int) -> bool:
    return port == other_port and _ipv4(host) == _ipv4(other_host)
