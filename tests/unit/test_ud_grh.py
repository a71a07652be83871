"""The 40 bytes a UD receive buffer starts with, for RoCEv2 over IPv4 (both GIDs
IPv4-mapped): Linux's union rdma_network_hdr puts the IPv4 header in the last 20 bytes
(include/rdma/ib_verbs.h: "if it's IPv4, the header is located in the last 20 bytes"),
the first 20 reserved (zero). Built here from RFC 791's layout, checksum included;
and ibv_init_ah_from_wc's reading of such a GRH (client/ah.py)."""

from __future__ import annotations

import ipaddress
import struct

from softhca.client.ah import reply_route
from softhca.engine.ud import grh


def mapped(v4: str) -> bytes:
    return ipaddress.IPv6Address("::ffff:" + v4).packed


def rfc791(src: str, dst: str, tos: int, ttl: int, udp_len: int) -> bytes:
    h = struct.pack(">BBHHHBBH4s4s", 0x45, tos, 20 + udp_len, 0, 0x4000, ttl, 17, 0,
                    ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
    s = sum(int.from_bytes(h[i:i + 2], "big") for i in range(0, 20, 2))
    s = (s & 0xFFFF) + (s >> 16)
    s = (s & 0xFFFF) + (s >> 16)
    return h[:10] + struct.pack(">H", ~s & 0xFFFF) + h[12:]


def test_ipv4_grh_is_the_ip_header_in_the_last_20_bytes():
    # 13 bytes with ImmDt: UDP 8 + BTH 12 + DETH 8 + ImmDt 4 + 13 + pad 3 + ICRC 4 = 52.
    got = grh(mapped("10.1.2.3"), mapped("10.9.8.7"), 0x2E, 33, 13, True)
    assert got == bytes(20) + rfc791("10.1.2.3", "10.9.8.7", 0x2E, 33, 52)


def test_init_ah_from_wc_reads_either_version():
    v4 = grh(mapped("10.1.2.3"), mapped("10.9.8.7"), 0x2E, 33, 13, True)
    assert reply_route(v4) == {"dgid": mapped("10.1.2.3"), "sgid": mapped("10.9.8.7"),
                               "traffic_class": 0x2E, "flow_label": 0, "hop_limit": 0xFF}
    s, d = bytes(range(16)), bytes(range(16, 32))
    v6 = struct.pack(">IHBB", (6 << 28) | (0x11 << 20) | 0xABCDE, 40, 17, 3) + s + d
    assert reply_route(v6) == {"dgid": s, "sgid": d, "traffic_class": 0x11,
                               "flow_label": 0xABCDE, "hop_limit": 0xFF}
