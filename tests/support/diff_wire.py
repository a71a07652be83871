"""The packets half of the differential test (tests/e2e/test_differential.py): a daemon's
``--capture`` pcap read back into RC packets, and those packets made comparable across
two runs whose identities differ.

Each frame is parsed here from its bytes (Ethernet, IPv4, UDP, BTH, the extension
headers the IBTA RC opcode table gives its opcode, payload, pad, ICRC), not by the
encoder that wrote it. Its RoCEv2 ICRC is recomputed and must match: a frame the
capture garbled is an error of the run, never silently compared.

What is compared, per QP and direction (``normalise``):

- **identities mapped**: a DestQP becomes the QP's name in the workload, an R_Key in a
  RETH, AtomicETH or IETH the name of its MR or MKEY, a VA its offset in that MR (an
  MKEY's addresses start at 0), a PSN its distance from the requester's initial PSN;
- **left out**: the Ethernet, IPv4 and UDP headers (the addresses and ports are the
  daemons', the IPv4 identification a capture counter, the UDP source port a hash of
  the DestQP) and the ICRC, which covers the DestQP, PSN, R_Key and VA: it is checked
  per frame instead (above). Every other BTH bit (SE, MigReq, PadCnt, TVer, P_Key,
  AckReq) and every extension header field and payload byte is compared as it is;
- **requests** (SEND, RDMA WRITE, READ request, atomics): the packets that first carry
  each PSN, in PSN order (a packet whose PSN is not past every PSN the stream carried
  is a retransmission: go-back-N, RNR retries and READ re-requests depend on timing; a
  READ request takes as many PSNs as it has responses);
- **READ responses and atomic ACKs**: likewise, in their PSN order;
- **ACKs** (ACKNOWLEDGE: coalescing depends on timing): the last acknowledged PSN with
  its MSN (over every AETH that says ACK, READ responses and atomic ACKs included), and
  the set of ACKNOWLEDGE syndromes seen (NAK_PSN_SEQ left out where a fault rule ran:
  whether a gap is seen before the retransmission timer fires is timing);
- **an error NAK** (NAK_INV_REQ, NAK_REM_ACCESS, NAK_REM_OP) ends both directions of
  that QP's comparison: it is compared itself (PSN, syndrome, MSN); the requests up to
  its PSN and the responses sent before it are compared, nothing after (how many
  later packets left the requester before the NAK reached it is timing), and no last
  ACK is compared (the NAK may stand for the ACKs it coalesced).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from softhca.protocol.opcodes import AETH_SYNDROMES, FLAGS, OPCODE_NUMBERS, Op
from softhca.protocol.roce import pcap_records, roce_icrc

PSN_MOD = 1 << 24
OPCODE_NAMES = {n: name for name, n in OPCODE_NUMBERS.items()}
SYNDROME_NAMES = {}
for _name, _byte in AETH_SYNDROMES.items():
    # "RNR" is the old name of RNR_12: the byte names RNR_12.
    if _name != "RNR":
        SYNDROME_NAMES[_byte] = _name
ERROR_NAKS = frozenset({"NAK_INV_REQ", "NAK_REM_ACCESS", "NAK_REM_OP"})
ETH, IPV4, UDP, BTH = 14, 20, 8, 12


class FrameError(AssertionError):
    """A captured frame that is not a well-formed RoCEv2 RC packet with a good ICRC."""


@dataclass(frozen=True)
class Frame:
    """One captured RC packet, its fields as the bytes say."""

    src_port: int           # the sending daemon's TCP port (the source MAC's last bytes)
    opcode: str
    bth_flags: int          # SE, MigReq, PadCnt, TVer
    pkey: int
    dest_qp: int
    ack_req: bool
    psn: int
    reth: tuple | None = None       # (va, rkey, dma_len)
    atomic: tuple | None = None     # (va, rkey, swap_add, compare)
    aeth: tuple | None = None       # (syndrome name, msn)
    atomic_ack: int | None = None
    imm: int | None = None
    ieth: int | None = None
    payload: bytes = b""
    ts: float = 0.0
    raw: bytes = field(default=b"", repr=False)     # the frame's bytes (for the mutations)


def parse_frame(frame: bytes, ts: float = 0.0) -> Frame:
    """``frame`` (Ethernet II, IPv4, UDP 4791, RoCEv2) as a Frame; FrameError when it is
    not one, or its ICRC is not the one its bytes give."""
    if len(frame) < ETH + IPV4 + UDP + BTH + 4:
        raise FrameError(f"a frame of {len(frame)} bytes is too short for RoCEv2")
    if frame[12:14] != b"\x08\x00" or frame[ETH] != 0x45 or frame[ETH + 9] != 17:
        raise FrameError("not Ethernet / IPv4 (no options) / UDP")
    src_port = struct.unpack(">H", frame[10:12])[0]
    ip_len = struct.unpack(">H", frame[ETH + 2:ETH + 4])[0]
    ip = frame[ETH:ETH + ip_len]
    if len(ip) != ip_len:
        raise FrameError("the IPv4 length runs past the frame")
    if roce_icrc(ip[:-4]) != ip[-4:]:
        raise FrameError("the ICRC does not match the frame's bytes")
    udp_len = struct.unpack(">H", ip[IPV4 + 4:IPV4 + 6])[0]
    if struct.unpack(">H", ip[IPV4 + 2:IPV4 + 4])[0] != 4791 or udp_len != ip_len - IPV4:
        raise FrameError("not UDP to port 4791, or its length is not the packet's")
    ib = ip[IPV4 + UDP:-4]
    number, flags, pkey, qp_word, psn_word = struct.unpack(">BBHII", ib[:BTH])
    if number not in OPCODE_NAMES:
        raise FrameError(f"opcode {number:#x} is not in the RC table")
    op = OPCODE_NAMES[number]
    f = FLAGS[op]
    at = BTH
    fields: dict = {}
    if f & Op.RETH:
        fields["reth"] = struct.unpack(">QII", ib[at:at + 16])
        at += 16
    if f & Op.ATOMICETH:
        fields["atomic"] = struct.unpack(">QIQQ", ib[at:at + 28])
        at += 28
    if f & Op.AETH:
        word = struct.unpack(">I", ib[at:at + 4])[0]
        syndrome = word >> 24
        if syndrome not in SYNDROME_NAMES:
            raise FrameError(f"AETH syndrome {syndrome:#x} is not one softhca sends")
        fields["aeth"] = (SYNDROME_NAMES[syndrome], word & 0xFFFFFF)
        at += 4
    if f & Op.ATOMICACKETH:
        fields["atomic_ack"] = struct.unpack(">Q", ib[at:at + 8])[0]
        at += 8
    if f & Op.IMMDT:
        fields["imm"] = struct.unpack(">I", ib[at:at + 4])[0]
        at += 4
    if f & Op.IETH:
        fields["ieth"] = struct.unpack(">I", ib[at:at + 4])[0]
        at += 4
    pad = (flags >> 4) & 3
    if at + pad > len(ib):
        raise FrameError(f"{op}: its headers and pad run past the packet")
    payload = ib[at:len(ib) - pad]
    if payload and not f & Op.PAYLOAD:
        raise FrameError(f"{op} carries {len(payload)} payload bytes")
    if ib[len(ib) - pad:] != bytes(pad):
        raise FrameError(f"{op}: the pad bytes are not zero")
    return Frame(src_port, op, flags, pkey, qp_word & 0xFFFFFF, bool(psn_word >> 31),
                 psn_word & 0xFFFFFF, payload=payload, ts=ts, raw=bytes(frame),
                 **{k: tuple(v) if isinstance(v, tuple) else v for k, v in fields.items()})


def read_frames(path) -> list[tuple[float, bytes]]:
    with open(path, "rb") as f:
        return pcap_records(f.read())


# -- mutations: a real difference, made by hand in one run's capture -----------------------

def with_icrc(frame: bytes) -> bytes:
    """``frame`` with its ICRC made right again for bytes a mutation changed (a difference
    the ICRC check alone would catch is not the comparison's)."""
    ip_len = struct.unpack(">H", frame[ETH + 2:ETH + 4])[0]
    ip = frame[ETH:ETH + ip_len - 4]
    return frame[:ETH] + ip + roce_icrc(ip) + frame[ETH + ip_len:]


def header_offset(frame: bytes, header: Op) -> int | None:
    """Where extension header ``header`` starts in ``frame``, or None when its opcode
    carries none."""
    op = OPCODE_NAMES[frame[ETH + IPV4 + UDP]]
    f = FLAGS[op]
    if not f & header:
        return None
    at = ETH + IPV4 + UDP + BTH
    for bit, size in ((Op.RETH, 16), (Op.ATOMICETH, 28), (Op.AETH, 4), (Op.ATOMICACKETH, 8),
                      (Op.IMMDT, 4), (Op.IETH, 4)):
        if bit == header:
            return at
        if f & bit:
            at += size
    return None


def payload_span(frame: bytes) -> tuple[int, int]:
    """(start, end) of ``frame``'s payload bytes."""
    op = OPCODE_NAMES[frame[ETH + IPV4 + UDP]]
    f = FLAGS[op]
    at = ETH + IPV4 + UDP + BTH
    for bit, size in ((Op.RETH, 16), (Op.ATOMICETH, 28), (Op.AETH, 4), (Op.ATOMICACKETH, 8),
                      (Op.IMMDT, 4), (Op.IETH, 4)):
        if f & bit:
            at += size
    ip_len = struct.unpack(">H", frame[ETH + 2:ETH + 4])[0]
    pad = (frame[ETH + IPV4 + UDP + 1] >> 4) & 3
    return at, ETH + ip_len - 4 - pad


def opcode_of(frame: bytes) -> str:
    return OPCODE_NAMES[frame[ETH + IPV4 + UDP]]


def set_opcode(frame: bytes, name: str) -> bytes:
    at = ETH + IPV4 + UDP
    return with_icrc(frame[:at] + bytes([OPCODE_NUMBERS[name]]) + frame[at + 1:])


# -- normalisation --------------------------------------------------------------------------

@dataclass
class Identities:
    """One run's names for its random identities: QP numbers per daemon port, keys per
    daemon port (each key with the base address its VAs count from), and each QP's
    initial send PSN and peer."""

    qps: dict[tuple[int, int], str]             # (daemon port, QPN) -> QP name
    keys: dict[tuple[int, int], tuple[str, int]]   # (daemon port, key) -> (name, base VA)
    sq_psn: dict[str, int]                       # QP name -> its first PSN
    peer: dict[str, str]                         # QP name -> its peer QP's name
    port_of: dict[str, int]                      # QP name -> its daemon's port
    mtu: dict[str, int] = field(default_factory=dict)   # QP name -> its path MTU, bytes


def _rel(psn: int, base: int) -> int:
    return (psn - base) % PSN_MOD


def _found(ids: Identities, port: int, key: int) -> tuple[str, int] | None:
    """Key ``key`` as the receiving daemon (``port``) names it, else as the other one
    does (a WR that names the wrong daemon's key on purpose), else None."""
    found = ids.keys.get((port, key))
    if found is None:
        found = next((v for (p, k), v in ids.keys.items() if k == key), None)
    return found


def _key(ids: Identities, port: int, key: int) -> str:
    found = _found(ids, port, key)
    return found[0] if found is not None else "a key no object of the run has"


def _va(ids: Identities, port: int, key: int, va: int) -> int | str:
    found = _found(ids, port, key)
    return va - found[1] if found is not None else "unmapped"


def mapped(ids: Identities, fr: Frame, dest: str, base: int) -> tuple:
    """Frame ``fr`` (to QP ``dest``) with its identities named and its PSN relative to
    ``base``: a tuple of every compared field."""
    port = ids.port_of[dest]        # keys in RETH / AtomicETH / IETH are the receiver's
    reth = atomic = None
    if fr.reth is not None:
        va, rkey, length = fr.reth
        reth = (_key(ids, port, rkey), _va(ids, port, rkey, va), length)
    if fr.atomic is not None:
        va, rkey, swap_add, compare = fr.atomic
        atomic = (_key(ids, port, rkey), _va(ids, port, rkey, va), swap_add, compare)
    ieth = _key(ids, port, fr.ieth) if fr.ieth is not None else None
    return (fr.opcode, fr.bth_flags, fr.pkey, fr.ack_req, _rel(fr.psn, base), reth, atomic,
            fr.aeth, fr.atomic_ack, fr.imm, ieth, bytes(fr.payload))


FIELDS = ("opcode", "bth flags", "P_Key", "AckReq", "PSN (relative)", "RETH", "AtomicETH",
          "AETH", "AtomicAckETH", "ImmDt", "IETH", "payload")


@dataclass
class QpWire:
    """What one QP's traffic looks like for the comparison (see the module's docstring)."""

    requests: list[tuple]           # to this QP, from its peer's requester
    responses: list[tuple]          # READ responses and atomic ACKs to this QP
    last_ack: tuple | None          # (relative PSN, MSN) of the last ACK to this QP
    syndromes: frozenset            # the ACKNOWLEDGE syndromes sent to this QP
    error_nak: tuple | None         # (relative PSN, syndrome, MSN) ending the comparison
    # Packets compared: the requests and responses above, the last ACK, the error NAK.
    packets: int


def normalise(ids: Identities, frames: list[Frame], faults: bool) -> dict[str, QpWire]:
    """The frames every daemon of a run sent ("tx", in capture order), per QP they went
    to, as the comparison takes them (module docstring)."""
    by_dest: dict[str, list[Frame]] = {name: [] for name in ids.sq_psn}
    for fr in frames:
        name = ids.qps.get((_peer_port(ids, fr), fr.dest_qp))
        if name is None:
            raise FrameError(f"a frame to QP {fr.dest_qp:#x} that no QP of the run has")
        by_dest[name].append(fr)
    # The error NAK (if any) sent to each QP, and the responses and ACKs before it.
    naks: dict[str, tuple | None] = {}
    before: dict[str, tuple[list[Frame], list[Frame]]] = {}
    for name, frs in by_dest.items():
        base = ids.sq_psn[name]
        naks[name], responses, acks = None, [], []
        for fr in frs:
            if not FLAGS[fr.opcode] & Op.RESPONSE:
                continue
            if fr.opcode == "ACKNOWLEDGE":
                if fr.aeth[0] in ERROR_NAKS:
                    naks[name] = (_rel(fr.psn, base), fr.aeth[0], fr.aeth[1])
                    break
                acks.append(fr)
            else:
                responses.append(fr)
        before[name] = (responses, acks)
    out = {}
    for name, frs in by_dest.items():
        # Requests to ``name`` count from its peer's first PSN (and end at the error NAK
        # its peer was sent); responses to it from its own first PSN.
        req_base, resp_base = ids.sq_psn[ids.peer[name]], ids.sq_psn[name]
        error_nak = naks[name]
        peer_nak = naks[ids.peer[name]]
        responses, acks = before[name]
        requests = _first_of_each_psn(
            [fr for fr in frs if FLAGS[fr.opcode] & Op.REQUEST], req_base,
            peer_nak[0] if peer_nak is not None else None, ids.mtu.get(name, 0))
        resp = _first_of_each_psn(responses, resp_base,
                                  error_nak[0] if error_nak is not None else None)
        syndromes = {fr.aeth[0] for fr in acks}
        if faults:
            syndromes.discard("NAK_PSN_SEQ")
        # The last acknowledged PSN and MSN: over every packet whose AETH says ACK (a
        # READ response or an atomic ACK acknowledges the WRITEs before it as an
        # ACKNOWLEDGE does; which of them carried it is coalescing, timing).
        last_ack = None
        positive = [fr for fr in acks + responses if fr.aeth and fr.aeth[0] == "ACK"]
        if positive and error_nak is None:
            last = max(positive, key=lambda fr: (_rel(fr.psn, resp_base), fr.aeth[1]))
            last_ack = (_rel(last.psn, resp_base), last.aeth[1])
        out[name] = QpWire([mapped(ids, fr, name, req_base) for fr in requests],
                           [mapped(ids, fr, name, resp_base) for fr in resp],
                           last_ack, frozenset(syndromes), error_nak,
                           len(requests) + len(resp) + (last_ack is not None)
                           + (error_nak is not None))
    return out


def _peer_port(ids: Identities, fr: Frame) -> int:
    """The port of the daemon that received ``fr``: the one the sender is not (the runs
    have two daemons)."""
    ports = sorted(set(ids.port_of.values()))
    return ports[1] if fr.src_port == ports[0] else ports[0]


def _first_of_each_psn(frames: list[Frame], base: int, cut: int | None,
                       mtu: int = 0) -> list[Frame]:
    """The frames that first carry a PSN past every PSN before them (relative to
    ``base``), up to and including ``cut`` when it is given. A READ request takes as
    many PSNs as it has responses (path MTU ``mtu``): a request for the rest of a READ
    (after a lost response) carries one of them and is a retransmission."""
    out, top = [], -1
    for fr in frames:
        rel = _rel(fr.psn, base)
        if rel > top and (cut is None or rel <= cut):
            out.append(fr)
            top = rel
            if fr.opcode == "RDMA_READ_REQUEST" and mtu and fr.reth is not None:
                top += max(1, -(-fr.reth[2] // mtu)) - 1
    return out


def diff_qp(name: str, a: QpWire, b: QpWire, limit: int = 3) -> list[str]:
    """How two runs' traffic of QP ``name`` differs (empty: it does not)."""
    out: list[str] = []
    for what in ("requests", "responses"):
        xs, ys = getattr(a, what), getattr(b, what)
        for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
            if x != y:
                fields = [FIELDS[k] for k in range(len(FIELDS)) if x[k] != y[k]]
                detail = ""
                if "payload" in fields:
                    px, py = x[-1], y[-1]
                    at = next((j for j in range(min(len(px), len(py))) if px[j] != py[j]),
                              min(len(px), len(py)))
                    detail = f" (payload {len(px)} / {len(py)} bytes, first difference at {at})"
                short = [(v if not isinstance(v, bytes) else f"<{len(v)} bytes>") for v in x]
                out.append(f"{name} {what}[{i}] differs in {', '.join(fields)}{detail}: "
                           f"A {short[:11]}")
                if len(out) >= limit:
                    return out
        if len(xs) != len(ys):
            extra = xs[len(ys):] or ys[len(xs):]
            out.append(f"{name} {what}: A has {len(xs)} packets, B {len(ys)}; the first "
                       f"unmatched: {extra[0][:5]}")
    for what in ("last_ack", "syndromes", "error_nak"):
        if getattr(a, what) != getattr(b, what):
            out.append(f"{name} {what}: A {getattr(a, what)}, B {getattr(b, what)}")
    return out
