"""SIDR, the CM's service ID resolution (IBTA 12.11), as rdma_cm uses it for the ids of
the RDMA_PS_UDP port space (rdma_create_id(3)): the active side's rdma_connect sends a
SIDR_REQ with its private data; the passive side's rdma_accept answers with a SIDR_REP
carrying its UD QP's number and Q_Key, its rdma_reject with a SIDR_REP whose status
says rejected. No RTU, no DREQ: a UD id is "connected" once the active side holds the
peer's QPN and Q_Key (its ESTABLISHED event's param.ud).

Private data: IBTA's SIDR_REQ carries 216 bytes, less the rdma_cm header (36 bytes, the
IP addresses and ports) = 180 for the program (rdma_connect(3)); the SIDR_REP 136
(rdma_accept(3), rdma_reject(3): nothing of rdma_cm's rides in it).

The fields of the messages between daemons are checked here; protocol/cm.py's
decode_message applies them to the two kinds.
"""

from __future__ import annotations

from .frames import FrameError

# The Q_Key rdma_cm gives the UD QPs of RDMA_PS_UDP ids (rdma_cma.h's RDMA_UDP_QKEY).
RDMA_UDP_QKEY = 0x01234567
# IBTA 12.11.3's SIDR_REP status values (what an UNREACHABLE event's status carries).
SIDR_SUCCESS, SIDR_UNSUPPORTED, SIDR_REJECT, SIDR_NO_QP = 0, 1, 2, 3

SIDR_PRIVATE_DATA_MAX = {"sidr_req": 180, "sidr_rep": 136}
SIDR_FIELDS = {
    "sidr_req": {"ps": (int, 0, 0xFFFF, True), "port": (int, 1, 65535, True),
                 "sip": (str, 2, 45, True), "sport": (int, 0, 65535, True),
                 "dip": (str, 2, 45, True)},
    "sidr_rep": {"status": (int, 0, 5, True), "qpn": (int, 0, (1 << 24) - 1, True),
                 "qkey": (int, 0, (1 << 32) - 1, True)},
}
_PS_TCP, _PS_UDP = 0x0106, 0x0111


def check_sidr(kind: str, v: dict) -> None:
    """A REQ names a port space of connections (RDMA_PS_TCP), a SIDR_REQ RDMA_PS_UDP;
    an accepting SIDR_REP names a QP. FrameError("EPROTO") otherwise."""
    if kind == "req" and v["ps"] == _PS_UDP:
        raise FrameError("EPROTO", "CM req for port space RDMA_PS_UDP (a SIDR_REQ's)")
    if kind == "sidr_req" and v["ps"] != _PS_UDP:
        raise FrameError("EPROTO", f"CM sidr_req for port space {v['ps']:#x} "
                                   "(only RDMA_PS_UDP resolves by SIDR)")
    if kind == "sidr_rep" and v["status"] == SIDR_SUCCESS and v["qpn"] == 0:
        raise FrameError("EPROTO", "CM sidr_rep accepting with no QP (qpn 0)")
