"""RC packets on the wire plane: the record, its frame header, and the integrity check.

A packet is one frame on a wire connection between two daemons (``docs/protocol.md``);
so is a train, a run of one message's packets (``Run``, at the end of this module), and
``decode`` turns either frame into a run.
The header carries what RoCE's BTH and extension headers carry; the payload is the
frame's raw payload. ``packet_check`` (the ``icrc`` field) plays the RoCE ICRC: a CRC32 over the invariant header
fields and the payload. A receiver that finds it wrong drops the packet, counts it,
and leaves recovery to the requester's retransmission, as on a real link.

Header (a msgpack map):

=========  =====================================================================
``t``      ``"pkt"``
``dev``    destination HCA name (a daemon may host several)
``qp``     destination QP number (BTH DestQP, 24 bits)
``psn``    packet sequence number (BTH PSN, 24 bits)
``op``     opcode name, one of ``OPCODES`` (BTH OpCode)
``reth``   ``[rkey, va, dma_len]`` on RDMA WRITE FIRST/ONLY and READ REQUEST
``aeth``   ``[syndrome, msn]`` on ACKNOWLEDGE, READ RESPONSE FIRST/LAST/ONLY, ATOMIC ACK
``imm``    ImmDt, on the ``*_WITH_IMM`` packets
``ieth``   the rkey to invalidate, on ``SEND_*_WITH_INV``
``ateth``  ``[rkey, va, swap_or_add, compare]`` on the two atomic requests
``atack``  the original value, on ATOMIC_ACKNOWLEDGE
``deth``   ``[qkey, src_qp]`` on the UD opcodes (DETH)
``grh``    ``[sgid, dgid, traffic_class, hop_limit]`` on the UD opcodes: the GIDs
           (16 bytes each) and the fields of the IPv6 header a RoCEv2 NIC would send,
           from which the receiver builds the GRH of its receive buffer
``icrc``   CRC32 (zlib polynomial) of ``msgpack([dev, qp, psn, op, reth, aeth, imm,
           ieth, ateth, atack]`` (then ``[deth, grh]`` on a UD packet) ``) + payload``
=========  =====================================================================
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import msgpack

from .frames import FrameError, field
from .kinds import FrameKind
from .opcodes import FLAGS, NAMES, SYNDROMES, Op, opcode_for

# The frame kinds as plain str: the wire path packs a header per packet, and msgpack and
# the header check take an exact str fastest.
_PKT, _TRAIN = FrameKind.PKT.value, FrameKind.TRAIN.value

PSN_MOD = 1 << 24
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1

# Every opcode name a packet may carry: the IBTA RC opcode table's (protocol/opcodes.py).
OPCODES = NAMES


@dataclass(frozen=True)
class Packet:
    """One RC packet: BTH (dest_qp, psn, opcode), RETH (rkey, addr, dma_len), AETH
    (syndrome, msn), ImmDt, IETH (rkey), AtomicETH (rkey, addr, swap_add, compare)
    and AtomicAckETH (original value), each present where the opcode carries it."""

    dest_qp: int
    psn: int
    opcode: str
    payload: bytes = b""
    reth: tuple | None = None
    aeth: tuple | None = None
    imm: int | None = None
    ieth: int | None = None
    atomic: tuple | None = None
    atomic_ack: int | None = None
    # UD only: DETH (qkey, src_qp) and the route (sgid, dgid, traffic_class, hop_limit).
    deth: tuple | None = None
    grh: tuple | None = None


# The packet fields that carry each extension header.
_HEADER_FIELDS = ((Op.RETH, "reth"), (Op.AETH, "aeth"), (Op.IMMDT, "imm"), (Op.IETH, "ieth"),
                  (Op.ATOMICETH, "ateth"), (Op.ATOMICACKETH, "atack"))


def _needs(op: str) -> tuple[set[str], bool]:
    """The extension headers opcode ``op`` must carry, and whether it may carry a payload
    (IBTA 9.2, the RC opcode table)."""
    flags = FLAGS[op]
    need = {name for bit, name in _HEADER_FIELDS if flags & bit}
    if flags & Op.DETH:
        need |= {"deth", "grh"}
    return need, bool(flags & Op.PAYLOAD)


_NEEDS = {op: _needs(op) for op in OPCODES}


class IntegrityError(FrameError):
    """The frame's check does not match: a link error, its ``packets`` are dropped."""

    def __init__(self, errno_name: str, message: str, packets: int = 1) -> None:
        super().__init__(errno_name, message)
        self.packets = packets


def _listify(t):
    return list(t) if t is not None else None


def packet_check(dev: str, p: Packet) -> int:
    """The integrity check of ``p`` addressed to HCA ``dev`` (the header's ``icrc``; the
    RoCEv2 ICRC of a captured frame is protocol/roce.py's ``roce_icrc``)."""
    head = msgpack.packb([dev, p.dest_qp, p.psn, p.opcode, _listify(p.reth),
                          _listify(p.aeth), p.imm, p.ieth, _listify(p.atomic),
                          p.atomic_ack]
                         + ([_listify(p.deth), _listify(p.grh)] if p.deth or p.grh else []),
                         use_bin_type=True)
    return zlib.crc32(p.payload, zlib.crc32(head))


def packet_header(dev: str, p: Packet, *, icrc_value: int | None = None) -> dict:
    """The frame header for ``p``; ``icrc_value`` overrides the computed check (fault
    injection of a link error leaves a stale one)."""
    h: dict = {"t": _PKT, "dev": dev, "qp": p.dest_qp, "psn": p.psn, "op": p.opcode}
    for name, value in (("reth", p.reth), ("aeth", p.aeth), ("imm", p.imm),
                        ("ieth", p.ieth), ("ateth", p.atomic), ("atack", p.atomic_ack),
                        ("deth", p.deth), ("grh", p.grh)):
        if value is not None:
            h[name] = _listify(value) if isinstance(value, tuple) else value
    h["icrc"] = packet_check(dev, p) if icrc_value is None else icrc_value
    return h


def _uint(v, bits: int, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < (1 << bits):
        raise FrameError("EPROTO", f"{what} of 'pkt' must be a {bits}-bit unsigned int, "
                                   f"got {v!r}"[:120])
    return v


def _tuple(header: dict, name: str, n: int, kinds: tuple) -> tuple | None:
    v = header.get(name)
    # The well-formed case by exact type and range tests; anything else takes the
    # checks below, which name the fault.
    if type(v) is list and len(v) == n and all(
            (type(item) is str and item in SYNDROMES) if kind == "syndrome"
            else (type(item) is int and 0 <= item < 1 << kind)
            for item, kind in zip(v, kinds, strict=True)):
        return tuple(v)
    v = field(header, name, list, min=n, max=n, required=False)
    if v is None:
        return None
    out = []
    for i, (item, kind) in enumerate(zip(v, kinds, strict=True)):
        if kind == "syndrome":
            # (A list or map is unhashable: tested as a str first, it is refused too.)
            if type(item) is not str or item not in SYNDROMES:
                raise FrameError("EPROTO", f"{name}[{i}] of 'pkt' is not a known AETH "
                                           f"syndrome: {item!r}"[:120])
            out.append(item)
        else:
            out.append(_uint(item, kind, f"{name}[{i}]"))
    return tuple(out)


def _bth(header: dict) -> tuple[str, int, int, str, int]:
    """The destination HCA, QP, PSN, opcode and icrc of a ``pkt`` header."""
    get = header.get
    dev, qp, psn, op, check = get("dev"), get("qp"), get("psn"), get("op"), get("icrc")
    # Every packet of the wire path comes here: the well-formed BTH is decided by exact
    # type and range tests; anything else takes field()'s path, which names the fault.
    if (type(dev) is str and 0 < len(dev) <= 64 and type(qp) is int
            and 0 <= qp < PSN_MOD and type(psn) is int and 0 <= psn < PSN_MOD
            and type(op) is str and op in OPCODES and type(check) is int
            and 0 <= check <= _U32):
        return dev, qp, psn, op, check
    dev = field(header, "dev", str, min=1, max=64)
    qp = field(header, "qp", int, min=0, max=PSN_MOD - 1)
    psn = field(header, "psn", int, min=0, max=PSN_MOD - 1)
    op = field(header, "op", str, max=40)
    if op not in OPCODES:
        raise FrameError("EPROTO", f"op of 'pkt' is not an RC opcode: {op!r}"[:120])
    return dev, qp, psn, op, field(header, "icrc", int, min=0, max=_U32)


def _reth(header: dict) -> tuple | None:
    """The RETH: unpacked by position with exact type and range tests (every train
    that begins a WRITE carries one); anything else takes _tuple's checks."""
    v = header.get("reth")
    if type(v) is list and len(v) == 3:
        rkey, va, dma_len = v
        if (type(rkey) is int and type(va) is int and type(dma_len) is int
                and 0 <= rkey <= _U32 and 0 <= va <= _U64 and 0 <= dma_len <= _U32):
            return rkey, va, dma_len
    return _tuple(header, "reth", 3, (32, 64, 32))


def _aeth(header: dict) -> tuple | None:
    """The AETH the same way (every ACK carries one)."""
    v = header.get("aeth")
    if type(v) is list and len(v) == 2:
        syndrome, msn = v
        if type(syndrome) is str and syndrome in SYNDROMES and type(msn) is int and (
                0 <= msn < 1 << 24):
            return syndrome, msn
    return _tuple(header, "aeth", 2, ("syndrome", 24))


# How each extension header's field is read from a frame header.
_EXTENSIONS = {
    "reth": _reth,
    "aeth": _aeth,
    "imm": lambda h: field(h, "imm", int, min=0, max=_U32),
    "ieth": lambda h: field(h, "ieth", int, min=0, max=_U32),
    "ateth": lambda h: _tuple(h, "ateth", 4, (32, 64, 64, 64)),
    "atack": lambda h: field(h, "atack", int, min=0, max=_U64),
    "deth": lambda h: _tuple(h, "deth", 2, (32, 24)),
    "grh": lambda h: _grh(h),
}


def _grh(header: dict) -> tuple:
    """A UD packet's ``grh``: two 16-byte GIDs, an 8-bit traffic class and hop limit."""
    v = field(header, "grh", list, min=4, max=4)
    sgid, dgid, tclass, hop = v
    for i, gid in enumerate((sgid, dgid)):
        if not isinstance(gid, bytes) or len(gid) != 16:
            raise FrameError("EPROTO", f"grh[{i}] of 'pkt' must be a 16-byte GID")
    return sgid, dgid, _uint(tclass, 8, "grh[2]"), _uint(hop, 8, "grh[3]")


def _extensions(header: dict, names) -> dict:
    """The extension headers among ``names`` that ``header`` carries, each checked."""
    return {n: _EXTENSIONS[n](header) if n in header else None for n in names}


def decode_packet(header: dict, payload) -> tuple[str, Packet]:
    """Validate the fields of a ``pkt`` header (a wire frame's, or a capture record's);
    return (destination HCA, Packet). The wire plane takes frames through ``decode``.

    Raises FrameError("EPROTO") naming the bad field, or IntegrityError when every
    field is well formed but the icrc does not match.
    """
    dev, qp, psn, op, check = _bth(header)
    ext = _extensions(header, _EXTENSIONS)
    need, may_carry = _NEEDS[op]
    missing = sorted(n for n in need if ext[n] is None)
    if missing:
        raise FrameError("EPROTO", f"packet {op} lacks its {', '.join(missing)} header")
    if payload and len(payload) and not may_carry:
        raise FrameError("EPROTO", f"packet {op} carries no payload, got {len(payload)} bytes")
    p = Packet(qp, psn, op, bytes(payload), ext["reth"], ext["aeth"], ext["imm"], ext["ieth"],
               ext["ateth"], ext["atack"], ext["deth"], ext["grh"])
    if packet_check(dev, p) != check:
        raise IntegrityError("EPROTO", f"packet {op} psn {psn:#x} to QP {qp:#x}: icrc "
                                       f"mismatch, dropped")
    return dev, p


# -- runs: a message's packets as one item --------------------------------------------------
#
# A run is consecutive packets of one message to one QP. The RC engine takes what arrives
# as runs and gives what it sends as runs; a single packet is a run of one. On the wire a
# run of several packets (of a SEND or RDMA WRITE request, or a READ's responses) goes
# as one ``train`` frame: the headers once, then the packets' payloads back to back, as
# Linux GSO hands a NIC one large segment and GRO gives the stack one coalesced one
# (docs/protocol.md, "Packet trains"); a run of one goes as a ``pkt`` frame, or as a
# train of one (the requester's one-packet SEND or WRITE). Packet i of
# a run is fully determined by the run: its PSN is ``psn + i``, its opcode follows from
# its position (FIRST only at i == 0 of a run that begins its message, LAST only at the
# end of one that ends it, MIDDLE otherwise) and its payload is
# ``payload[i*mtu : (i+1)*mtu]``. Cutting a run into packets (``packets()``) therefore
# gives exactly the packets the RC engine would have sent one by one; everything that
# must see individual packets (fault rules, captures, ``packets`` subscribers) cuts there.

# The messages whose runs may be longer than one packet, by the kind a run (and a train
# frame's ``kind``) names; every other opcode is a message of one packet, and its run's
# kind is the opcode itself.
RUN_KINDS = {"SEND": Op.SEND, "RDMA_WRITE": Op.WRITE, "RDMA_READ_RESPONSE": Op.READ_RESPONSE}
# The path MTUs of IBTA (ibv_mtu): a train frame's packets are cut at one of them.
TRAIN_MTUS = frozenset((256, 512, 1024, 2048, 4096))
# The most packets one train frame may claim: a bound a receiver enforces before looking
# at anything the frame claims (4096 full 4096-byte packets fit DEFAULT_MAX_FRAME).
FRAME_RUN_MAX = 4096
_FIRST, _LAST = 1, 2


@dataclass(frozen=True)
class Run:
    """``n`` consecutive packets of one message to QP ``dest_qp`` from PSN ``psn``.

    ``kind``: a ``RUN_KINDS`` key, or the opcode of a one-packet message (READ request,
    atomic, ACK). ``first``: packet 0 begins the message (it carries the RETH of a
    WRITE, and a READ response's AETH); ``last``: packet n-1 ends it (ImmDt / IETH, and
    a READ response's AETH). ``payload`` is the packets' payloads back to back, cut at
    ``mtu`` (a run of one packet made by ``of``: its payload's length). ``atomic`` and
    ``atomic_ack`` are the AtomicETH and AtomicAckETH of a one-packet run."""

    dest_qp: int
    psn: int
    n: int
    kind: str
    first: bool
    last: bool
    mtu: int
    payload: bytes | memoryview = b""
    reth: tuple | None = None
    aeth: tuple | None = None
    imm: int | None = None
    ieth: int | None = None
    atomic: tuple | None = None
    atomic_ack: int | None = None
    # A UD packet's DETH and route (Packet's); a UD message is always a run of one.
    deth: tuple | None = None
    grh: tuple | None = None

    @classmethod
    def of(cls, p: Packet) -> Run:
        """Packet ``p`` as a run of one, carrying only the headers its opcode carries."""
        kind, first, last = _RUN_OF[p.opcode]
        reth, aeth, imm, ieth, ateth, atack = _CARRIES[p.opcode]
        return cls(p.dest_qp, p.psn, 1, kind, first, last, len(p.payload), p.payload,
                   p.reth if reth else None, p.aeth if aeth else None,
                   p.imm if imm else None, p.ieth if ieth else None,
                   p.atomic if ateth else None, p.atomic_ack if atack else None,
                   p.deth, p.grh)

    @property
    def end_psn(self) -> int:
        """The PSN of the run's last packet."""
        return (self.psn + self.n - 1) % PSN_MOD

    def opcode(self, i: int) -> str:
        kind = RUN_KINDS.get(self.kind)
        if kind is None:
            return self.kind
        return opcode_for(kind, self.first and i == 0, self.last and i == self.n - 1,
                          self.imm is not None, self.ieth is not None)

    def packet(self, i: int) -> Packet:
        """Packet ``i`` of the run, as the requester or responder would have built it."""
        op = self.opcode(i)
        reth, aeth, imm, ieth, ateth, atack = _CARRIES[op]
        m = self.mtu
        return Packet(self.dest_qp, (self.psn + i) % PSN_MOD, op,
                      bytes(self.payload[i * m:(i + 1) * m]),
                      self.reth if reth else None, self.aeth if aeth else None,
                      self.imm if imm else None, self.ieth if ieth else None,
                      self.atomic if ateth else None, self.atomic_ack if atack else None,
                      self.deth, self.grh)

    def packets(self) -> list[Packet]:
        return [self.packet(i) for i in range(self.n)]

    def sub(self, a: int, b: int) -> Run:
        """Packets [a, b) of the run, as a run of their own."""
        if a == 0 and b == self.n:
            return self
        m = self.mtu
        first, last = self.first and a == 0, self.last and b == self.n
        return Run(self.dest_qp, (self.psn + a) % PSN_MOD, b - a, self.kind, first, last,
                   m, self.payload[a * m:b * m], self.reth if first else None, self.aeth,
                   self.imm if last else None, self.ieth if last else None)

    def one_by_one(self) -> list[Run]:
        """The run's packets, each as a run of one."""
        return [self.sub(i, i + 1) for i in range(self.n)]


def _run_of(op: str) -> tuple[str, bool, bool]:
    flags = FLAGS[op]
    # A UC or UD packet always travels as a run of one, named by its own opcode.
    kind = op if flags & (Op.UC | Op.UD) else next(
        (k for k, bit in RUN_KINDS.items() if flags & bit), op)
    return kind, bool(flags & Op.FIRST), bool(flags & Op.LAST)


# Per opcode, as plain values (IntFlag arithmetic costs about a microsecond, and a run
# is cut into packets wherever packets are observed): the kind, first and last of its
# packet as a run of one, and which of the RETH, AETH, ImmDt, IETH, AtomicETH and
# AtomicAckETH it carries.
_RUN_OF = {op: _run_of(op) for op in OPCODES}
_CARRIES = {op: tuple(bool(FLAGS[op] & bit) for bit, _ in _HEADER_FIELDS) for op in OPCODES}


def split(items: list) -> list[Packet]:
    """Packets and runs as the packets they are (GSO segmentation before a tap)."""
    out: list[Packet] = []
    for x in items:
        if type(x) is Run:
            out.extend(x.packets())
        else:
            out.append(x)
    return out


def count(items: list) -> int:
    """How many packets ``items`` (packets and runs) are."""
    return sum(x.n if type(x) is Run else 1 for x in items)


def _train_head(dev: str, t: Run) -> list:
    return [dev, t.dest_qp, t.psn, t.n, t.kind, t.first, t.last, t.mtu, len(t.payload),
            _listify(t.reth), _listify(t.aeth), t.imm, t.ieth]


def train_check(dev: str, t: Run) -> int:
    """A train frame's integrity check: CRC32 over its header fields and payload length,
    not over the payload (docs/protocol.md, "Packet trains": a run is never altered after
    it is built, since everything that can change a packet sees it cut into packets,
    and its bytes ride on TCP's own checksum; a CRC over 1 MiB would cost a third of
    what moving it costs)."""
    return zlib.crc32(msgpack.packb(_train_head(dev, t), use_bin_type=True))


def train_header(dev: str, t: Run) -> dict:
    """The ``train`` frame header for run ``t`` (a ``RUN_KINDS`` kind) addressed to HCA
    ``dev``. A train carries exactly the extension headers its end packets need: the
    RETH when it begins a WRITE, ImmDt / IETH when it ends a message with them, and, for
    READ responses, always its message's AETH (the FIRST and LAST responses carry it)."""
    h: dict = {"t": _TRAIN, "dev": dev, "qp": t.dest_qp, "psn": t.psn, "n": t.n,
               "kind": t.kind, "pos": (_FIRST if t.first else 0) | (_LAST if t.last else 0),
               "mtu": t.mtu}
    for name, value in (("reth", t.reth), ("aeth", t.aeth), ("imm", t.imm),
                        ("ieth", t.ieth)):
        if value is not None:
            h[name] = _listify(value) if isinstance(value, tuple) else value
    h["chk"] = train_check(dev, t)
    return h


def _bad_train_frame(msg: str) -> FrameError:
    return FrameError("EPROTO", f"train: {msg}"[:160])


def _train_shape(header: dict, payload) -> tuple:
    """The fields of a ``train`` header that say which packets it holds, checked: a count
    within FRAME_RUN_MAX, a path MTU, a payload that ``n`` packets of that MTU carry
    exactly, a PSN range that does not wrap. Nothing is allocated per claimed packet."""
    get = header.get
    dev, qp, psn, n, kind, pos, mtu = (get("dev"), get("qp"), get("psn"), get("n"),
                                       get("kind"), get("pos"), get("mtu"))
    # Every train of the wire path comes here: the well-formed fields are decided by
    # exact type and range tests (a bool is not an int), anything else takes field()'s
    # path, which names the fault.
    if not (type(dev) is str and 0 < len(dev) <= 64 and type(qp) is int
            and 0 <= qp < PSN_MOD and type(psn) is int and 0 <= psn < PSN_MOD
            and type(n) is int and 0 < n <= FRAME_RUN_MAX and type(kind) is str
            and kind in RUN_KINDS and type(pos) is int and 0 <= pos <= 3
            and type(mtu) is int and mtu in TRAIN_MTUS):
        dev, qp, psn, n, kind, pos, mtu = _train_fields_named(header)
    first, last = bool(pos & _FIRST), bool(pos & _LAST)
    if psn + n > PSN_MOD:
        raise _bad_train_frame(f"PSNs [{psn:#x}, +{n}) wrap the 24-bit PSN space")
    _check_train_payload(len(payload), n, mtu, first, last)
    return dev, qp, psn, n, kind, pos, first, last, mtu


def _check_train_payload(size: int, n: int, mtu: int, first: bool, last: bool) -> None:
    """EPROTO unless ``size`` bytes are ``n`` packets of ``mtu``: every one full but the
    message's last, which holds 1..mtu bytes (0 only as the lone packet of an empty
    message)."""
    if last:
        ok = (n - 1) * mtu < size <= n * mtu or (n == 1 and first and size == 0)
    else:
        ok = size == n * mtu
    if not ok:
        raise _bad_train_frame(f"{size} payload bytes are not {n} packets of path MTU {mtu}")


def _train_fields_named(header: dict) -> tuple:
    """The fields ``_train_shape`` reads, each checked by ``field()``, which names the
    fault; the slow path, taken only when the fast test there finds one amiss."""
    dev = field(header, "dev", str, min=1, max=64)
    qp = field(header, "qp", int, min=0, max=PSN_MOD - 1)
    psn = field(header, "psn", int, min=0, max=PSN_MOD - 1)
    n = field(header, "n", int, min=1, max=FRAME_RUN_MAX)
    kind = field(header, "kind", str, max=40)
    if kind not in RUN_KINDS:
        raise _bad_train_frame(f"kind must be one of {', '.join(RUN_KINDS)}, "
                               f"got {kind!r}")
    pos = field(header, "pos", int, min=0, max=3)
    mtu = field(header, "mtu", int, min=256, max=4096)
    if mtu not in TRAIN_MTUS:
        raise _bad_train_frame(f"mtu {mtu} is not an IBTA path MTU")
    return dev, qp, psn, n, kind, pos, mtu


def _train_needs(kind: str, pos: int, imm: bool, ieth: bool, n: int) -> frozenset | str:
    """The extension headers a train of ``n`` packets (1 or more than 1: its end packets
    are one or two) of ``kind`` at positions ``pos`` carries exactly (IBTA 9.2: those its
    end packets' opcodes need), or why no opcode fits."""
    t = Run(0, 0, n, kind, bool(pos & _FIRST), bool(pos & _LAST), 256,
            imm=0 if imm else None, ieth=0 if ieth else None)
    try:
        need = _NEEDS[t.opcode(0)][0] | _NEEDS[t.opcode(n - 1)][0]
    except ValueError:
        return (f"no {kind} opcode ends a message with "
                f"{'ImmDt and ' if imm else ''}{'IETH' if ieth else 'ImmDt'}")
    if kind == "RDMA_READ_RESPONSE":
        need = need | {"aeth"}
    return frozenset(need)


# Per (kind, pos, has ImmDt, has IETH, one packet or more), what _train_needs says:
# every train is one of these 96 shapes, so none works the opcode rules out again.
_TRAIN_NEEDS = {(kind, pos, imm, ieth, single): _train_needs(kind, pos, imm, ieth,
                                                             1 if single else 2)
                for kind in RUN_KINDS for pos in range(4)
                for imm in (False, True) for ieth in (False, True) for single in (False, True)}


def _train_frame(header: dict, payload) -> tuple[str, Run]:
    """A ``train`` frame as its run: every field is checked as a packet's is, and the
    run as a whole (``_train_shape``), with exactly the headers its end packets'
    opcodes need."""
    dev, qp, psn, n, kind, pos, first, last, mtu = _train_shape(header, payload)
    check = header.get("chk")
    if not (type(check) is int and 0 <= check <= _U32):
        check = field(header, "chk", int, min=0, max=_U32)
    ext = _EXTENSIONS
    reth = ext["reth"](header) if "reth" in header else None
    aeth = ext["aeth"](header) if "aeth" in header else None
    imm = ext["imm"](header) if "imm" in header else None
    ieth = ext["ieth"](header) if "ieth" in header else None
    need = _TRAIN_NEEDS[kind, pos, imm is not None, ieth is not None, n == 1]
    if type(need) is str:
        raise _bad_train_frame(need)
    present = frozenset(name for name, v in (("reth", reth), ("aeth", aeth), ("imm", imm),
                                             ("ieth", ieth)) if v is not None)
    if need != present:
        raise _bad_train_frame(f"{kind} train at positions {pos} must carry "
                         f"{sorted(need) or 'no extension header'}, has {sorted(present)}")
    if aeth is not None and aeth[0] != "ACK":
        raise _bad_train_frame("a READ response's AETH must be an ACK")
    t = Run(qp, psn, n, kind, first, last, mtu, payload, reth, aeth, imm, ieth)
    if train_check(dev, t) != check:
        raise IntegrityError("EPROTO", f"train of {n} packets from psn {psn:#x} to QP "
                                       f"{qp:#x}: check mismatch, dropped", packets=n)
    return dev, t


def decode(header: dict, payload) -> tuple[str, Run]:
    """A wire frame, either form (docs/protocol.md): a ``pkt`` frame as a run of one, a
    ``train`` frame as the run it carries; return (destination HCA, Run).

    Raises FrameError("EPROTO") naming the bad field or frame kind, or IntegrityError
    (``packets``: how many packets the frame claimed) when every field is well formed
    but the frame's check does not match.
    """
    kind = header.get("t")
    if kind == _PKT:
        dev, p = decode_packet(header, payload)
        return dev, Run.of(p)
    if kind == _TRAIN:
        return _train_frame(header, payload)
    raise FrameError("EPROTO", f"unexpected {kind!r} frame on a wire link (only 'pkt' and "
                               "'train' are allowed)")
