"""Address handles (ibv_create_ah(3)) for UD QPs, in the async client.

An AH names a daemon and device (where its packets go) and the GRH fields a RoCEv2
packet carries: the source and destination GIDs, traffic class, hop limit and flow
label. softhca's GID of a device is fe80::<IPv4 of the daemon>:<TCP port>:<device
index> (client/pyverbs/_route.py, ``query_gid``); ``create_ah`` computes both GIDs
that way unless given.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from ..protocol.errors import RDMAError
from .records import QPInfo

__all__ = ["AH", "create_ah", "gid_of"]

_PREFIX = bytes.fromhex("fe80000000000000")


def gid_of(host: str, port: int, dev_index: int) -> bytes:
    """The 16-byte GID of device ``dev_index`` of the daemon at ``host:port``."""
    try:
        v4 = ipaddress.IPv4Address(host).packed
    except ValueError:
        try:
            v4 = socket.inet_aton(socket.gethostbyname(host))
        except OSError:
            raise RDMAError("EOPNOTSUPP", f"softhca GIDs need an IPv4 daemon address, "
                                          f"{host!r} has none") from None
    return _PREFIX + v4 + port.to_bytes(2, "big") + dev_index.to_bytes(2, "big")


class AH:
    """ibv_ah: ``pd``, ``handle``, ``dest`` (host, port, device), ``sgid``, ``dgid``."""

    def __init__(self, pd: Any, handle: int, dest: tuple[str, int, str], sgid: bytes,
                 dgid: bytes) -> None:
        self.pd, self.handle, self.dest, self.sgid, self.dgid = pd, handle, dest, sgid, dgid

    async def close(self) -> None:
        """ibv_destroy_ah(3). Errors: ENOENT when already destroyed."""
        await self.pd.node.request("destroy_ah", ah=self.handle)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _index(node: Any, dev: str) -> int:
    return node.devices.index(dev) if dev in node.devices else 0


async def create_ah(pd: Any, peer: QPInfo, *, sgid: bytes | None = None,
                    dgid: bytes | None = None, traffic_class: int = 0, hop_limit: int = 64,
                    flow_label: int = 0) -> AH:
    """ibv_create_ah(3) in ``pd`` towards the daemon and device of ``peer`` (a QPInfo,
    ``qp.info()``; its QP number is the WR's, not the AH's)."""
    node = pd.node
    if sgid is None:
        sgid = gid_of(node.host, node.port, _index(node, pd.ctx.name))
    if dgid is None:
        dgid = gid_of(peer.host, peer.port, _index(node, peer.dev))
    h, _ = await node.request("create_ah", pd=pd.handle, dest_host=peer.host,
                              dest_port=peer.port, dest_dev=peer.dev, sgid=bytes(sgid),
                              dgid=bytes(dgid), traffic_class=traffic_class,
                              hop_limit=hop_limit, flow_label=flow_label)
    return AH(pd, h["ah"], (peer.host, peer.port, peer.dev), bytes(sgid), bytes(dgid))


async def connect_uc(qp: Any, peer: QPInfo, path_mtu: int, sq_psn: int) -> None:
    """A UC QP through RESET -> INIT -> RTR -> RTS towards ``peer`` (ibv_modify_qp(3)'s
    UC attributes: no timeouts, retries or RNR timer, which UC does not have)."""
    from .records import QPAttr

    await qp.to_init()
    await qp.to_rtr(QPAttr(path_mtu=path_mtu, dest_qp_num=peer.qp_num, rq_psn=peer.psn,
                           dest_host=peer.host, dest_port=peer.port, dest_dev=peer.dev))
    await qp.to_rts(QPAttr(sq_psn=sq_psn))


async def ready_ud(qp: Any, qkey: int, sq_psn: int) -> None:
    """A UD QP through RESET -> INIT (with its Q_Key) -> RTR -> RTS."""
    from .records import QPAttr

    await qp.to_init(QPAttr(qkey=qkey))
    await qp.to_rtr(QPAttr())
    await qp.to_rts(QPAttr(sq_psn=sq_psn))


def reply_route(grh: bytes) -> dict:
    """ibv_init_ah_from_wc(3)'s reading of a UD receive's 40-byte GRH: the AH attributes
    that answer its sender. As libibverbs sets them: dgid the GRH's SGID, the local GID
    the GRH's DGID (its sgid_index), traffic class and flow label from the header, hop
    limit 0xFF; for RoCEv2 over IPv4 (version 4 in byte 20) the IPv4-mapped GIDs of its
    addresses and its TOS."""
    grh = bytes(grh)
    if len(grh) < 40:
        raise RDMAError("EINVAL", f"a GRH is 40 bytes, got {len(grh)}")
    if grh[20] >> 4 == 4:
        mapped = bytes(10) + b"\xff\xff"
        return {"dgid": mapped + grh[32:36], "sgid": mapped + grh[36:40],
                "traffic_class": grh[21], "flow_label": 0, "hop_limit": 0xFF}
    if grh[0] >> 4 != 6:
        raise RDMAError("EINVAL", f"GRH version {grh[0] >> 4} is neither 6 nor 4 (IPv4 at "
                                  "byte 20)")
    first = int.from_bytes(grh[:4], "big")
    return {"dgid": grh[8:24], "sgid": grh[24:40], "traffic_class": (first >> 20) & 0xFF,
            "flow_label": first & 0xFFFFF, "hop_limit": 0xFF}


def gid_route(gid: bytes) -> tuple[str, int, int]:
    """(daemon IPv4, TCP port, device index) of a softhca GID (``gid_of``)."""
    if len(gid) != 16 or gid[:8] != _PREFIX:
        raise RDMAError("EINVAL", f"GID {gid.hex()} is not a softhca GID (fe80::<IPv4>:"
                                  "<port>:<device>): no daemon is reachable through it")
    return (socket.inet_ntoa(gid[8:12]), int.from_bytes(gid[12:14], "big"),
            int.from_bytes(gid[14:16], "big"))


async def create_ah_from_wc(pd: Any, wc: Any, grh: bytes, dest_dev: str | None = None) -> AH:
    """ibv_create_ah_from_wc(3): an AH answering the sender of UD receive ``wc`` whose
    buffer began with ``grh``. The sender's device is named by its GID's index: this
    node's device list gives its name when the sender is this daemon, else ``dest_dev``.

    Errors: EINVAL when ``wc`` has no IBV_WC_GRH, the GRH is not 40 bytes of version 6
    (or 4), its DGID is not this device's GID, or the sender's device is unnamed."""
    from ..protocol.enums import WcFlags

    if not wc.wc_flags & WcFlags.GRH:
        raise RDMAError("EINVAL", "ibv_create_ah_from_wc on RoCE needs a WC with IBV_WC_GRH")
    attrs = reply_route(grh)
    node = pd.node
    own = gid_of(node.host, node.port, _index(node, pd.ctx.name))
    if attrs["sgid"] != own:
        raise RDMAError("EINVAL", "the GRH's DGID is not this device's GID")
    host, port, index = gid_route(attrs["dgid"])
    if dest_dev is None:
        if (host, port) != (gid_route(own)[0], node.port) or index >= len(node.devices):
            raise RDMAError("EINVAL", f"the sender is at {host}:{port} device {index}: name "
                                      "its device (dest_dev=)")
        dest_dev = node.devices[index]
    return await create_ah(pd, QPInfo(host, port, dest_dev, wc.src_qp), **attrs)
