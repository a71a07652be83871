"""A port's GID table (ibv_query_gid(3), ibv_query_gid_ex(3), ibv_query_gid_table(3)).

Every populated entry is a RoCE v2 GID that leads back to this device
(client/pyverbs/_route.py): index 0 is the softhca GID of the address this context
dialed, then one for each other IPv4 address the daemon answers on (the daemon's
query_device ``addresses``), then the IPv4-mapped GID ::ffff:<the dialed IPv4>,
which is how RoCE v2 writes an IPv4 address as a GID. The table holds
``gid_tbl_len`` entries (the daemon's); the rest are empty: a zero GID to
ibv_query_gid, ENODATA to ibv_query_gid_ex, absent from ibv_query_gid_table.
"""

from __future__ import annotations

import errno

from . import _route
from . import enums as e
from .pyverbs_error import PyverbsRDMAError

PORT = 1
ZERO = bytes(16)


def table(ctx, attr: dict | None = None) -> tuple[list[bytes], int]:
    """(the populated GIDs in index order, gid_tbl_len) of ``ctx``'s port."""
    a = attr if attr is not None else ctx._raw_attr()
    node = ctx._node
    gids = [_route.gid_raw(node.host, node.port, ctx._dev_index)]
    for addr in a.get("addresses", ()):
        raw = _route.gid_raw(addr, node.port, ctx._dev_index)
        if raw not in gids:
            gids.append(raw)
    mapped = _route.mapped_gid(node.host)
    if mapped not in gids:
        gids.append(mapped)
    size = max(int(a.get("gid_tbl_len", 1)), 1)
    return gids[:size], size


def query_gid(ctx, port_num: int, index: int) -> bytes:
    """The GID at ``index`` (zero when empty); EINVAL outside the port or its table."""
    gids, size = table(ctx)
    if port_num != PORT or not 0 <= index < size:
        raise PyverbsRDMAError(f"Failed to query gid {index} of port {port_num}",
                               errno.EINVAL)
    return gids[index] if index < len(gids) else ZERO


def query_gid_type(ctx, port_num: int, index: int) -> int:
    if query_gid(ctx, port_num, index) == ZERO:
        raise PyverbsRDMAError(f"Failed to query gid type of index {index}: it is empty",
                               errno.ENODATA)
    return e.IBV_GID_TYPE_SYSFS_ROCE_V2


def _entry(entry_cls, raw: bytes, index: int):
    return entry_cls(int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little"),
                     index, PORT, e.IBV_GID_TYPE_ROCE_V2, 0)


def entries(ctx, entry_cls, max_entries: int) -> list:
    """ibv_query_gid_table(3): the populated entries; -EINVAL when they need more
    than ``max_entries`` (pyverbs passes the negative errno on as is)."""
    gids, _ = table(ctx)
    if max_entries < len(gids):
        raise PyverbsRDMAError("Failed to query gid tables of the device", -errno.EINVAL)
    return [_entry(entry_cls, raw, i) for i, raw in enumerate(gids)]


def query_gid_ex(ctx, entry_cls, port_num: int, index: int):
    """ibv_query_gid_ex(3): EINVAL for another port or an index outside the table,
    ENODATA for an empty index."""
    gids, size = table(ctx)
    if port_num != PORT or not 0 <= index < size:
        raise PyverbsRDMAError(f"Failed to query gid table of port {port_num} in index "
                               f"{index}", errno.EINVAL)
    if index >= len(gids):
        raise PyverbsRDMAError(f"Failed to query gid table of port {port_num} in index "
                               f"{index}", errno.ENODATA)
    return _entry(entry_cls, gids[index], index)
