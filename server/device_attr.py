"""ibv_query_device(3) / ibv_query_device_ex(3) of a session's device, and the
addresses its port's GID table is made of.

The attributes are the daemon's limits and what the engine models: RDMA ATOMIC WRITE
(IB_UVERBS_DEVICE_ATOMIC_WRITE in device_cap_flags_ex, as rxe reports it) and ODP as
rxe models it for RC. On-demand paging needs no page faults here: an MR's memory is
the daemon's own and always resident, so an IBV_ACCESS_ON_DEMAND MR works for every
operation the engine has, and ibv_advise_mr's prefetch has nothing to fault in
(docs/semantics.md). Implicit ODP (an MR of the whole address space) is not modelled:
no IBV_ODP_SUPPORT_IMPLICIT.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

from ..engine.hca import MAX_MR_SIZE
from ..protocol import control
from ..protocol.control import MAX_CQE

# include/uapi/rdma/ib_user_verbs.h: IB_UVERBS_DEVICE_ATOMIC_WRITE.
DEVICE_ATOMIC_WRITE = 1 << 40
# enum ibv_odp_general_caps IBV_ODP_SUPPORT; enum ibv_odp_transport_cap_bits SEND, RECV,
# WRITE, READ, ATOMIC and (1 << 7) ATOMIC_WRITE.
ODP_SUPPORT = 1
ODP_RC_CAPS = 1 | 2 | 4 | 8 | 16 | 1 << 7
# The GIDs a port's table holds at most (ibv_query_port(3) gid_tbl_len).
GID_TBL_LEN = 16
_SIOCGIFADDR = 0x8915


def device_attr(verbs, hca) -> dict:
    lim = verbs.daemon.limits
    return {"fw_ver": "softhca-1", "vendor_id": 0x02C9, "vendor_part_id": 4123,
            "max_qp": 1 << 16, "max_qp_wr": lim.max_qp_wr, "max_msg_sz": lim.max_msg_size,
            "max_sge": control.MAX_SGE, "max_cqe": MAX_CQE, "max_mr_size": MAX_MR_SIZE,
            "max_pd": 1 << 16, "max_qp_rd_atom": 16, "phys_port_cnt": 1,
            "node_guid": hash(hca.name) & 0xFFFFFFFFFFFF,
            "device_cap_flags_ex": DEVICE_ATOMIC_WRITE,
            "odp_caps": {"general_caps": ODP_SUPPORT, "rc_odp_caps": ODP_RC_CAPS},
            "gid_tbl_len": GID_TBL_LEN, "addresses": answering_addresses(verbs.daemon)}


def answering_addresses(daemon) -> list[str]:
    """The IPv4 addresses the daemon's TCP listener answers on: its bound address, or
    every interface's when it listens on the wildcard."""
    out: list[str] = []
    server = getattr(daemon, "_server", None)
    for sock in (server.sockets if server is not None else ()):
        if sock.family != socket.AF_INET:
            continue
        addr = sock.getsockname()[0]
        for a in (_interface_addresses() if addr == "0.0.0.0" else [addr]):
            if a not in out:
                out.append(a)
    return out[:GID_TBL_LEN]


def _interface_addresses() -> list[str]:
    out = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue        # no IPv4 address on it
            out.append(str(ipaddress.IPv4Address(raw[20:24])))
    return out
