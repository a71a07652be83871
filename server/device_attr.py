"""ibv_query_device(3) / ibv_query_device_ex(3) of a session's device, and the
addresses its port's GID table is made of.

The attributes are the daemon's limits and what the engine models: RDMA ATOMIC WRITE
(IB_UVERBS_DEVICE_ATOMIC_WRITE in device_cap_flags_ex, as rxe reports it) and ODP as
rxe models it for RC. On-demand paging needs no page faults here: an MR's memory is
the daemon's own and always resident, so an IBV_ACCESS_ON_DEMAND MR works for every
operation the engine has, and ibv_advise_mr's prefetch has nothing to fault in
(docs/semantics.md). Implicit ODP (an MR of the whole address space) is not modelled:
no IBV_ODP_SUPPORT_IMPLICIT.

The node GUID (and the system image GUID, the same: one device per system image) is
fixed by the daemon's configuration, as a real HCA's is by its firmware: the interface
identifier of the device's softhca GID (fe80::<IPv4>:<port>:<device index>, the one
``softhca run`` writes to sysfs), as rxe's node GUID is the interface identifier of its
link-local GID (both from the netdev's MAC). A restarted daemon with the same
``--listen`` and ``--hca`` list keeps it; daemons at different addresses differ. A
daemon on the wildcard address has no IPv4 of its own to put there: 4 bytes of a
SHA-256 digest of the host's name stand in for it.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import ipaddress
import socket
import struct

from ..engine.hca import MAX_MR_SIZE
from ..protocol import control
from ..protocol.control import MAX_CQE

# enum ibv_device_cap_flags (rdma-core's verbs.h): what softhca models.
# RC_RNR_NAK_GEN: an RC responder without a receive answers RNR NAK (engine/rc_responder).
# SYS_IMAGE_GUID: sys_image_guid is reported. SRQ_RESIZE: ibv_modify_srq's IBV_SRQ_MAX_WR
# (engine/srq). CURR_QP_STATE_MOD: ibv_modify_qp takes IBV_QP_CUR_STATE (engine/qp_state).
# MEM_WINDOW, MEM_WINDOW_TYPE_2B: ibv_alloc_mw of both types; a type 2 window is honoured
# on the QP that bound it only, and shares its PD (engine/mw). Not set: RESIZE_MAX_WR
# (IBV_QP_CAP is EOPNOTSUPP), PORT_ACTIVE_EVENT (the port is always active, so no
# IBV_EVENT_PORT_ACTIVE is ever raised), AUTO_PATH_MIG, XRC, the checksum offloads, and
# MEM_MGT_EXTENSIONS (no fast-register work request).
DEVICE_CURR_QP_STATE_MOD = 1 << 7
DEVICE_SYS_IMAGE_GUID = 1 << 11
DEVICE_RC_RNR_NAK_GEN = 1 << 12
DEVICE_SRQ_RESIZE = 1 << 13
DEVICE_MEM_WINDOW = 1 << 17
DEVICE_MEM_WINDOW_TYPE_2B = 1 << 24
DEVICE_CAP_FLAGS = (DEVICE_CURR_QP_STATE_MOD | DEVICE_SYS_IMAGE_GUID | DEVICE_RC_RNR_NAK_GEN
                    | DEVICE_SRQ_RESIZE | DEVICE_MEM_WINDOW | DEVICE_MEM_WINDOW_TYPE_2B)
# enum ibv_atomic_cap IBV_ATOMIC_HCA.
ATOMIC_HCA = 1
# include/uapi/rdma/ib_user_verbs.h: IB_UVERBS_DEVICE_ATOMIC_WRITE.
DEVICE_ATOMIC_WRITE = 1 << 40
# enum ibv_odp_general_caps IBV_ODP_SUPPORT; enum ibv_odp_transport_cap_bits SEND, RECV,
# WRITE, READ, ATOMIC and (1 << 7) ATOMIC_WRITE.
ODP_SUPPORT = 1
ODP_RC_CAPS = 1 | 2 | 4 | 8 | 16 | 1 << 7
# The GIDs a port's table holds at most (ibv_query_port(3) gid_tbl_len).
GID_TBL_LEN = 16
_SIOCGIFADDR = 0x8915


# The objects of each kind a device holds, by ibv_device_attr's field and the kind's
# name in the daemon's quotas (server/hosts.py DEFAULT_QUOTAS).
POOL = 1 << 16
_POOLS = {"max_qp": "qp", "max_cq": "cq", "max_mr": "mr", "max_mw": "mw", "max_ah": "ah",
          "max_pd": "pd", "max_srq": "srq"}


def pools(lim) -> dict[str, int]:
    """Each pool's size as one program can use it: the device's, or the session's quota
    of that kind when it is smaller (a program that creates max_qp QPs, as perftest's and
    qperf's scaling tests size themselves, must not meet ENOMEM short of it)."""
    return {attr: min(POOL, lim.quotas.get(kind, (POOL, POOL))[0])
            for attr, kind in _POOLS.items()}


def device_attr(verbs, hca) -> dict:
    lim = verbs.daemon.limits
    pool = pools(lim)
    return {"fw_ver": "softhca-1", "vendor_id": 0x02C9, "vendor_part_id": 4123,
            "max_qp_wr": lim.max_qp_wr, "max_msg_sz": lim.max_msg_size,
            "max_sge": control.MAX_SGE, "max_cqe": MAX_CQE, "max_mr_size": MAX_MR_SIZE,
            "max_qp_rd_atom": 16, "phys_port_cnt": 1,
            # Device-wide pools, each shared by every session (server/hosts.py bounds a
            # session's and a credential's part of it).
            **pool,
            "max_sge_rd": control.MAX_SGE, "max_qp_init_rd_atom": 16,
            # The responder resources of every QP together (max_qp_rd_atom each).
            "max_res_rd_atom": 16 * pool["max_qp"],
            # Any page size from 4 KiB up; atomics are the responder HCA's (engine/rc.py),
            # IBV_ATOMIC_HCA; one P_Key (0xFFFF); the ACK delay, 4.096 us * 2^16.
            "page_size_cap": 0xFFFFF000, "atomic_cap": ATOMIC_HCA, "max_pkeys": 1,
            "local_ca_ack_delay": 16,
            "max_srq_wr": lim.max_qp_wr, "max_srq_sge": control.MAX_SGE,
            "node_guid": node_guid(verbs.daemon.host, verbs.daemon.port,
                                   list(verbs.daemon.hcas).index(hca.name)),
            "device_cap_flags": DEVICE_CAP_FLAGS,
            # ibv_query_device_ex's: the 32 bits of device_cap_flags and the extended ones.
            "device_cap_flags_ex": DEVICE_CAP_FLAGS | DEVICE_ATOMIC_WRITE,
            "odp_caps": {"general_caps": ODP_SUPPORT, "rc_odp_caps": ODP_RC_CAPS},
            "gid_tbl_len": GID_TBL_LEN, "addresses": answering_addresses(verbs.daemon)}


@functools.lru_cache(maxsize=256)
def node_guid(host: str, port: int, index: int) -> int:
    """The node GUID of device ``index`` of the daemon listening at ``host``:``port``
    (the module's docstring). Cached: a host name costs a resolution once, not at every
    ibv_query_device."""
    try:
        ip = socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        ip = bytes(4)
    if ip == bytes(4):
        ip = hashlib.sha256(b"softhca node " + socket.gethostname().encode()).digest()[:4]
    return int.from_bytes(ip + port.to_bytes(2, "big") + index.to_bytes(2, "big"), "big")


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
