"""The UD QP: datagrams of one packet each, addressed per WR by an address handle.

As Linux rxe models it (rxe_req.c, rxe_resp.c, rxe_net.c):

- ibv_post_send(3) takes SEND and SEND_WITH_IMM with ``wr.ud``: an AH of the QP's PD,
  the remote QPN and Q_Key. A remote Q_Key with bit 31 set sends the QP's own Q_Key
  instead. Each message is one UD_SEND_ONLY packet with a DETH (Q_Key, source QP).
- A message longer than the port's MTU is not sent and still completes SUCCESS
  (IBTA C10-93.1.1, which rxe follows: "the CI shall not emit any packets for this
  message ... shall not generate an error").
- The receiver drops, silently, a packet whose Q_Key is not its QP's, a message for
  which no receive is posted, and one its receive cannot hold (the GRH and payload).
- A receive gets the 40-byte GRH first, as rxe copies the packet's network header into
  the buffer: for RoCEv2 over IPv6 the IPv6 header (version 6, the AH's traffic class,
  flow label 0 as rxe's prepare6 sets it, payload length = the UDP length, next header
  17 = UDP, the AH's hop limit, SGID, DGID); over IPv4 (both GIDs IPv4-mapped) 20 zero
  bytes then the IPv4 header. Its completion: byte_len includes the 40 bytes, src_qp
  is the DETH's, wc_flags has IBV_WC_GRH (and WITH_IMM), slid, sl and pkey_index 0.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Any

from ..protocol.enums import QpState, WcFlags, WcOpcode, WrOpcode
from ..protocol.errors import einval
from ..protocol.packets import Packet
from ..protocol.records import SendWR
from .datagram import UD_TRANSITIONS, DatagramQP
from .hca import PD

GRH_BYTES = 40
# The port's MTU (ibv_query_port active_mtu, IBV_MTU_4096): what bounds a UD message.
PORT_MTU = 4096
# The headers around a UD payload inside the UDP datagram: UDP 8, BTH 12, DETH 8, ICRC 4.
_UDP, _BTH, _DETH, _IMMDT, _ICRC = 8, 12, 8, 4, 4
_IPPROTO_UDP = 17
_QKEY_OWN = 1 << 31


@dataclass(frozen=True)
class AddressHandle:
    """ibv_create_ah(3): an AH of ``pd``; ``route`` is the daemon's (where packets go)."""

    pd: PD
    sgid: bytes
    dgid: bytes
    traffic_class: int = 0
    hop_limit: int = 64
    flow_label: int = 0
    route: Any = None


@dataclass(frozen=True)
class Addressed:
    """A packet a UD QP sends, with the route of its AH (the wire plane's)."""

    route: Any
    packet: Packet


def udp_length(payload: int, imm: bool) -> int:
    """The UDP length of a UD packet of ``payload`` bytes: headers, the payload padded to
    4 bytes (the BTH pad count), the ICRC."""
    return _UDP + _BTH + _DETH + (_IMMDT if imm else 0) + payload + (-payload % 4) + _ICRC


def _v4(gid: bytes) -> bytes | None:
    mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    return mapped.packed if mapped is not None else None


def grh(sgid: bytes, dgid: bytes, traffic_class: int, hop_limit: int, payload: int,
        imm: bool) -> bytes:
    """The 40 bytes a UD receive buffer starts with (the module docstring)."""
    length = udp_length(payload, imm)
    src4, dst4 = _v4(sgid), _v4(dgid)
    if src4 is not None and dst4 is not None:
        head = struct.pack(">BBHHHBBH4s4s", 0x45, traffic_class, 20 + length, 0, 0x4000,
                           hop_limit, _IPPROTO_UDP, 0, src4, dst4)
        total = sum(struct.unpack(">10H", head))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        return bytes(20) + head[:10] + struct.pack(">H", ~total & 0xFFFF) + head[12:]
    first = (6 << 28) | (traffic_class << 20)       # flow label 0
    return struct.pack(">IHBB", first, length, _IPPROTO_UDP, hop_limit) + sgid + dgid


class UDQP(DatagramQP):
    """A UD QP of ``pd``."""

    TRANSITIONS = UD_TRANSITIONS
    TYPE = "a UD"
    OPCODES = {WrOpcode.SEND: WcOpcode.SEND, WrOpcode.SEND_WITH_IMM: WcOpcode.SEND}
    connected = False

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mtu = PORT_MTU

    def check_wr(self, wr: SendWR) -> None:
        ah = wr.ah
        if not isinstance(ah, AddressHandle):
            raise einval("a UD send WR needs wr.ud.ah, an address handle")
        if ah.pd is not self.pd:
            raise einval("the WR's address handle is of another PD than the QP's")

    def emit(self, wr: SendWR, data: bytes, out: list) -> None:
        psn = self.take_psns(1)
        if len(data) > self.mtu:
            self.drop()         # C10-93.1.1: no packet, no error
            return
        ah: AddressHandle = wr.ah
        qkey = self.qkey if wr.remote_qkey & _QKEY_OWN else wr.remote_qkey
        imm = wr.opcode == WrOpcode.SEND_WITH_IMM
        op = "UD_SEND_ONLY_WITH_IMM" if imm else "UD_SEND_ONLY"
        out.append(Addressed(ah.route, Packet(
            wr.remote_qpn, psn, op, data, imm=wr.imm_data if imm else None,
            deth=(qkey, self.qp_num), grh=(ah.sgid, ah.dgid, ah.traffic_class, ah.hop_limit))))

    def take(self, p: Packet) -> None:
        if p.deth is None or p.grh is None or p.deth[0] != self.qkey or not self._rq \
                or self.state == QpState.ERR:
            self.drop()
            return
        sgid, dgid, tclass, hop = p.grh
        imm = p.imm is not None
        data = grh(sgid, dgid, tclass, hop, len(p.payload), imm) + p.payload
        self.deliver(data, WcOpcode.RECV, len(data), p.imm,
                     WcFlags.GRH | (WcFlags.WITH_IMM if imm else 0), p.deth[1], p.psn)
