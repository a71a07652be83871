"""RoCEv2 encoding of RC packets, and the pcap files that hold them.

softhca's wire is TCP between daemons (protocol/packets.py); for Wireshark and tshark a
packet becomes the frame a RoCEv2 NIC would put on the wire for it (IBTA Annex A17):

==========  ===========================================================================
Ethernet    made-up locally administered MACs, ``02:o2:o3:o4:pp:pp`` from the daemon's
            IPv4 address (its last three octets) and TCP port
IPv4        the daemons' addresses (for "tx" the capturing daemon is the source and its
            peer the destination, for "rx" the other way round); an address that is not
            known (the peer of a ``softhca capture``, a wildcard listen address) becomes
            127.0.0.x; DF set, TTL 64, a valid header checksum
UDP         destination port 4791; source port ``0xC000 | (DestQP & 0x3FFF)`` (the flow
            entropy a NIC would hash from the QPs); checksum 0 (not used, as RoCEv2 allows)
BTH         opcode per the IBTA RC opcode table, SE 0, MigReq 1, pad count, TVer 0,
            P_Key 0xFFFF, DestQP, AckReq on the last packet of a request, PSN
RETH ...    DETH (UD), RETH, AETH, ImmDt, IETH, AtomicETH and AtomicAckETH where the opcode carries
            them, in the IBTA order; then the payload, padded to 4 bytes
ICRC        CRC32 over the masked pseudo header (8 bytes of 0xFF for the LRH, the IPv4
            header with TOS, TTL and checksum all ones, the UDP header with its checksum
            all ones, the BTH with its reserved byte resv8a all ones) and the rest of the
            packet, stored least significant byte first, as rxe and the NICs do
==========  ===========================================================================
"""

from __future__ import annotations

import functools
import ipaddress
import struct
import zlib
from dataclasses import dataclass
from typing import Any

from .address import split_address
from .opcodes import AETH_SYNDROMES, OPCODE_NUMBERS, Op, with_flags
from .packets import Packet, decode_packet

ROCE_V2_PORT = 4791
LINKTYPE_ETHERNET = 1
PCAP_MAGIC_US = 0xA1B2C3D4          # classic libpcap, microsecond timestamps
SNAPLEN = 262144
ETHERTYPE_IPV4 = 0x0800
IPPROTO_UDP = 17
DEFAULT_PKEY = 0xFFFF
DEFAULT_TTL = 64

# The opcodes whose packet ends a request message: the requester asks for an ACK there.
# UC and UD are never acknowledged.
_ACK_REQUESTED = with_flags(Op.LAST, none_of=Op.RESPONSE | Op.UC | Op.UD)


# -- the encoder ------------------------------------------------------------------------

def bth(p: Packet, pad: int = 0, *, solicited: bool = False, migreq: bool = True,
        pkey: int = DEFAULT_PKEY) -> bytes:
    """The 12-byte Base Transport Header of ``p`` (IBTA 9.2)."""
    ack_req = p.opcode in _ACK_REQUESTED
    return struct.pack(">BBHII", OPCODE_NUMBERS[p.opcode],
                       (solicited << 7) | (migreq << 6) | ((pad & 3) << 4) | 0,   # TVer 0
                       pkey, p.dest_qp & 0xFFFFFF,                  # resv8a 0, DestQP
                       (ack_req << 31) | (p.psn & 0xFFFFFF))         # A, resv7, PSN


def extension_headers(p: Packet) -> bytes:
    """RETH, AETH, ImmDt, IETH, AtomicETH, AtomicAckETH of ``p``, as its opcode orders
    them (IBTA 9.3): RETH before ImmDt; AETH before AtomicAckETH."""
    out = []
    if p.deth is not None:
        # DETH (IBTA 9.3.3): Q_Key, a reserved byte, the source QP; right after the BTH.
        qkey, src_qp = p.deth
        out.append(struct.pack(">II", qkey, src_qp & 0xFFFFFF))
    if p.reth is not None:
        rkey, va, dma_len = p.reth
        out.append(struct.pack(">QII", va, rkey, dma_len))
    if p.atomic is not None:
        rkey, va, swap_add, compare = p.atomic
        out.append(struct.pack(">QIQQ", va, rkey, swap_add, compare))
    if p.aeth is not None:
        syndrome, msn = p.aeth
        out.append(struct.pack(">I", (AETH_SYNDROMES[syndrome] << 24) | (msn & 0xFFFFFF)))
    if p.atomic_ack is not None:
        out.append(struct.pack(">Q", p.atomic_ack))
    if p.imm is not None:
        out.append(struct.pack(">I", p.imm))
    if p.ieth is not None:
        out.append(struct.pack(">I", p.ieth))
    return b"".join(out)


def ipv4_checksum(header: bytes) -> int:
    """RFC 791: the ones' complement of the ones' complement sum of the 16-bit words
    (with the checksum field zero when computing, the sum over a valid header is 0)."""
    if len(header) % 2:
        header += b"\0"
    total = sum(struct.unpack(f">{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@functools.lru_cache(maxsize=1024)
def _packed(ip: str) -> bytes:
    """An IPv4 address's 4 bytes (asked for twice per captured frame: cached)."""
    return ipaddress.IPv4Address(ip).packed


def ipv4_header(src: str, dst: str, payload_len: int, *, ident: int = 0,
                ttl: int = DEFAULT_TTL, tos: int = 0) -> bytes:
    h = struct.pack(">BBHHHBBH4s4s", 0x45, tos, 20 + payload_len, ident & 0xFFFF,
                    0x4000, ttl, IPPROTO_UDP, 0, _packed(src), _packed(dst))
    return h[:10] + struct.pack(">H", ipv4_checksum(h)) + h[12:]


def roce_icrc(ip_packet: bytes) -> bytes:
    """The RoCEv2 ICRC of an IPv4 packet (IPv4 header, UDP header, BTH, the rest; without
    its ICRC): the 4 bytes that end it on the wire (IBTA Annex A17.3.3)."""
    ihl = (ip_packet[0] & 0x0F) * 4
    ip = bytearray(ip_packet[:ihl])
    ip[1] = 0xFF                    # Type of Service (DSCP, ECN)
    ip[8] = 0xFF                    # TTL
    ip[10:12] = b"\xff\xff"         # header checksum
    udp = bytearray(ip_packet[ihl:ihl + 8])
    udp[6:8] = b"\xff\xff"          # UDP checksum
    ib = bytearray(ip_packet[ihl + 8:])
    ib[4] = 0xFF                    # BTH resv8a (FECN, BECN, reserved)
    crc = zlib.crc32(b"\xff" * 8)   # the LRH a RoCEv2 packet does not have
    crc = zlib.crc32(bytes(ip), crc)
    crc = zlib.crc32(bytes(udp), crc)
    crc = zlib.crc32(bytes(ib), crc)
    return struct.pack("<I", crc)


def udp_source_port(dest_qp: int) -> int:
    return 0xC000 | (dest_qp & 0x3FFF)


@dataclass(frozen=True)
class Endpoint:
    """One end of a frame: a daemon's IPv4 address and TCP port (the port only makes the
    MAC address of two daemons on one host differ)."""

    ip: str
    port: int = 0

    @property
    def mac(self) -> bytes:
        o = _packed(self.ip)
        return bytes([0x02, o[1], o[2], o[3]]) + struct.pack(">H", self.port & 0xFFFF)


def roce_frame(p: Packet, src: Endpoint, dst: Endpoint, *, ident: int = 0) -> bytes:
    """``p`` as an Ethernet II / IPv4 / UDP / RoCEv2 frame from ``src`` to ``dst``."""
    pad = -len(p.payload) % 4
    ib = bth(p, pad) + extension_headers(p) + p.payload + b"\0" * pad
    udp_len = 8 + len(ib) + 4
    udp = struct.pack(">HHHH", udp_source_port(p.dest_qp), ROCE_V2_PORT, udp_len, 0)
    ip = ipv4_header(src.ip, dst.ip, udp_len, ident=ident)
    packet = ip + udp + ib
    return dst.mac + src.mac + struct.pack(">H", ETHERTYPE_IPV4) + packet + roce_icrc(packet)


# -- addresses ------------------------------------------------------------------------------

def ipv4_of(host: str | None) -> str | None:
    """``host`` as a unicast IPv4 address, or None when it is not one (a name other than
    localhost, a wildcard, IPv6)."""
    if host is None:
        return None
    if host == "localhost":
        return "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    if addr.version != 4 or addr.is_unspecified or addr.is_multicast:
        return None
    return str(addr)


def stand_in(avoid: str, key: str = "") -> str:
    """A 127.0.0.x address for a host whose IPv4 address is not known: x from ``key``
    (so two unknown peers differ), never ``avoid``."""
    x = 2 + zlib.crc32(key.encode()) % 250 if key else 2
    while f"127.0.0.{x}" == avoid:
        x = 2 + (x - 1) % 250
    return f"127.0.0.{x}"


def endpoint(address: str | Endpoint | None, *, fallback: str | None = None,
             unknown: str | None = None, avoid: str = "127.0.0.1") -> Endpoint | None:
    """``HOST:PORT`` (or an Endpoint) as an Endpoint: the host's IPv4 address, else
    ``fallback``'s, else ``unknown``, else a 127.0.0.x stand-in other than ``avoid``;
    None for None."""
    if address is None or isinstance(address, Endpoint):
        return address
    host, port = split_address(address)
    ip = ipv4_of(host) or ipv4_of(fallback) or unknown or stand_in(avoid, address)
    return Endpoint(ip, port)


def _unpack(item: Any) -> tuple[str, Packet, str | None]:
    """(dev, Packet, capturing daemon's address) of a Packet, a (dev, Packet) pair, a
    client Event or a packet event's header dict with its payload as ``data``."""
    if isinstance(item, Packet):
        return "mlx5_0", item, None
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Packet):
        return item[0], item[1], None
    header = getattr(item, "header", item)
    data = getattr(item, "data", header.get("data", b"") if isinstance(header, dict) else b"")
    if not isinstance(header, dict) or "pkt" not in header:
        raise TypeError(f"not a packet or packet event: {item!r}"[:120])
    dev, p = decode_packet(header["pkt"], data)
    return dev, p, header.get("daemon")


def packet_record(direction: str, item: Any, *, local: str | Endpoint | None = None,
                  peer: str | Endpoint | None = None, ident: int = 0) -> bytes:
    """The Ethernet frame of one captured packet.

    ``item`` is a Packet, a (dev, Packet) pair or a "packet" event (client Event, or its
    header). ``local`` is the capturing daemon (default: the event's ``daemon``), ``peer``
    the other end; either unknown becomes a 127.0.0.x stand-in. ``direction`` "tx" makes
    ``local`` the source, "rx" the destination.
    """
    if direction not in ("tx", "rx"):
        raise ValueError(f"direction must be 'tx' or 'rx', not {direction!r}")
    _, p, daemon = _unpack(item)
    here = (endpoint(local if local is not None else daemon, unknown="127.0.0.1")
            or Endpoint("127.0.0.1"))
    there = endpoint(peer, avoid=here.ip) or Endpoint(stand_in(here.ip))
    src, dst = (here, there) if direction == "tx" else (there, here)
    return roce_frame(p, src, dst, ident=ident)


# -- the pcap file ----------------------------------------------------------------------------

class PcapWriter:
    """A classic libpcap file (LINKTYPE_ETHERNET, microsecond timestamps); ``autoflush``
    makes each record reach the file at once (readable while capturing, whole after a
    kill)."""

    def __init__(self, path, *, snaplen: int = SNAPLEN, autoflush: bool = False,
                 _file=None) -> None:
        self.path = path
        self.snaplen = snaplen
        self.autoflush = autoflush
        self.count = 0
        if _file is not None:
            self._f = _file
            return
        self._f = open(path, "wb")
        self._f.write(struct.pack("<IHHiIII", PCAP_MAGIC_US, 2, 4, 0, 0, snaplen,
                                  LINKTYPE_ETHERNET))
        self.flush()

    @classmethod
    def append_to(cls, f, *, snaplen: int = SNAPLEN) -> PcapWriter:
        """Records appended to ``f``, an open binary file whose header another writer
        wrote (the daemon's capture hands its file to a writer process)."""
        return cls(getattr(f, "name", None), snaplen=snaplen, _file=f)

    def fileno(self) -> int:
        return self._f.fileno()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def write(self, ts: float, frame: bytes) -> None:
        sec = int(ts)
        usec = int(round((ts - sec) * 1e6))
        if usec >= 1_000_000:
            sec, usec = sec + 1, usec - 1_000_000
        cap = frame[:self.snaplen]
        self._f.write(struct.pack("<IIII", sec, usec, len(cap), len(frame)))
        self._f.write(cap)
        self.count += 1
        if self.autoflush:
            self._f.flush()

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> PcapWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_pcap(path) -> list[tuple[float, bytes]]:
    """The (timestamp, frame) records of a classic pcap file (for tests and tools)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, _, _, _, _, _, linktype = struct.unpack("<IHHiIII", data[:24])
    if magic != PCAP_MAGIC_US or linktype != LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: not a microsecond Ethernet pcap")
    out, at = [], 24
    while at < len(data):
        sec, usec, caplen, _ = struct.unpack("<IIII", data[at:at + 16])
        out.append((sec + usec / 1e6, data[at + 16:at + 16 + caplen]))
        at += 16 + caplen
    return out
