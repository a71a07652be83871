"""The manual pages' examples, end to end between two daemons, each ending in PASS or FAIL.

Every example starts two embedded daemons (softhca.client's ``embedded``), each on
its own loopback port and each driven through its own control session: a *target*
that owns the MKEY and an *initiator* with plain MRs, one RC QP on each, connected
over TCP with a 1024-byte path MTU so that messages span several packets. Every
operation is the verb the example names, posted through the client: SEND with the
MKEY as lkey and a RECV on the far side, RECV with the MKEY as the SGE, RDMA_READ and
RDMA_WRITE by the initiator with the target MKEY's rkey (address 0: MKEYs are
zero-based). The wire image shown is what crossed TCP: taps on both daemons
(``Daemon.taps``) see every packet sent during the operation, and the payloads of
the data packets the sending daemon put on the wire, in PSN order and once each,
are the wire image; completions are polled and must be IBV_WC_SUCCESS.

What an example must produce is computed here from the man pages alone, not by
the engine: the PI with crcmod from the parameters of docs/semantics.md section 3,
and AES-XTS with cryptography's own XTS mode, one context per data unit. The
demo never imports the tests, so it can run where only the package is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import os
import random
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

import crcmod
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .. import client as sh
from ..protocol.attrs import (
    SGE,
    CryptoAttr,
    MrInterleaved,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from ..protocol.enums import (
    BLOCK_SIZE_BYTES,
    AccessFlags,
    BlockSize,
    CryptoKeySize,
    MkeyErrType,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    SigCrcType,
    SigMask,
    SignatureCryptoOrder,
    SigT10difBgType,
    SigT10difFlags,
    SigType,
    WcOpcode,
    WcStatus,
)
from ..protocol.errors import RDMAError
from ..protocol.packets import PSN_MOD, Packet

SIG_PAGE = "mlx5dv_wr_set_mkey_sig_block(3)"
CRYPTO_PAGE = "mlx5dv_wr_set_mkey_crypto(3)"
CONF_PAGE = "mlx5dv_wr_mkey_configure(3)"

M16, M32, M64 = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF
AFTER = SignatureCryptoOrder.SIGNATURE_AFTER_CRYPTO_ON_TX
BEFORE = SignatureCryptoOrder.SIGNATURE_BEFORE_CRYPTO_ON_TX
LOCAL = AccessFlags.LOCAL_WRITE
REMOTE = AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE
INDIRECT = MkeyInitAttrFlags.INDIRECT
SIG_FLAGS = INDIRECT | MkeyInitAttrFlags.BLOCK_SIGNATURE
# mlx5dv_wr_set_mkey_crypto(3): initial_tweak is "normally the LBA of the first
# block"; any 16 bytes do, and a value with every byte distinct shows byte order bugs.
TWEAK = 0x1122334455667788_99AABBCCDDEEFF00
DUS = {512: BlockSize.SIZE_512, 520: BlockSize.SIZE_520}

# The configurations are those of tests/test_sig_block_examples.py and
# tests/test_crypto_examples.py, so the demo shows what the tests assert.
CRC32_512 = SigBlockDomain(sig_type=SigType.CRC, crc=SigCrc(SigCrcType.CRC32, M32),
                           block_size=BlockSize.SIZE_512)
DIF_4K = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_4096,
                        dif=SigT10dif(bg=0xFFFF, app_tag=0x5A5A, ref_tag=0x1000,
                                      flags=SigT10difFlags.REF_REMAP))
SIG_EXAMPLE_1 = SigBlockAttr(mem=CRC32_512, wire=None, check_mask=SigMask.CRC32)
SIG_EXAMPLE_2 = SigBlockAttr(mem=None, wire=DIF_4K, check_mask=0xFF)
# The crypto table's SIG (and SIG2) is a T10DIF on 512-byte blocks; SIG1 is a
# CRC64_XP10, a different 8-byte PI, so that rows E and I really convert one
# signature into another.
SIG = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_512,
                     dif=SigT10dif(bg=0, app_tag=0xBEEF, ref_tag=0x2000,
                                   flags=SigT10difFlags.REF_REMAP))
SIG1 = SigBlockDomain(sig_type=SigType.CRC, block_size=BlockSize.SIZE_512,
                      crc=SigCrc(SigCrcType.CRC64_XP10, M64))


# -- the oracle: what the man pages say the bytes are ---------------------------

# docs/semantics.md section 3: (crcmod polynomial with its x^width term, reflected, final xor).
_CRC_PARAMS = {
    "t10dif": (0x18BB7, False, 0),
    "crc32": (0x104C11DB7, False, M32),
    "crc32c": (0x11EDC6F41, True, M32),
    "crc64": (0x1AD93D23594C93659, True, M64),
}
# The check values of "123456789" in the same table: an oracle that disagrees with
# the contract's own numbers must not judge anything.
_CRC_CHECK = {
    ("t10dif", 0): 0xD0DB, ("t10dif", M16): 0x8E3C,
    ("crc32", M32): 0xFC891918, ("crc32", 0): 0x765E7680,
    ("crc32c", M32): 0xE3069283, ("crc32c", 0): 0xA71C05DF,
    ("crc64", M64): 0xAE8B14860A799888, ("crc64", 0): 0x87FF3F9B2B57C87B,
}
_CRC_KIND = {SigCrcType.CRC32: ("crc32", 4), SigCrcType.CRC32C: ("crc32c", 4),
             SigCrcType.CRC64_XP10: ("crc64", 8)}


@functools.cache
def crc(kind: str, seed: int) -> Callable[[bytes], int]:
    """The CRC whose register starts at ``seed``, with the algorithm's final xor."""
    poly, rev, xorout = _CRC_PARAMS[kind]
    # crcmod's initCrc is the register value after the final xor, so undo it.
    fn = crcmod.mkCrcFun(poly, initCrc=seed ^ xorout, rev=rev, xorOut=xorout)
    if fn(b"123456789") != _CRC_CHECK[(kind, seed)]:
        raise RuntimeError(f"demo oracle {kind} seed {seed:#x} disagrees with docs/semantics.md")
    return fn


def ip_csum(data: bytes, bg: int) -> int:
    """RFC 1071 over big-endian words, bg as the starting sum (docs/semantics.md section 3)."""
    if len(data) % 2:
        data += b"\0"
    s = bg + sum(int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data), 2))
    while s > M16:
        s = (s & M16) + (s >> 16)
    return ~s & M16


def pi_size(d: SigBlockDomain | None) -> int:
    if d is None:
        return 0
    return 8 if d.sig_type == SigType.T10DIF else _CRC_KIND[d.crc.crc_type][1]


def guard_of(d: SigBlockDomain, block: bytes) -> int:
    if d.sig_type == SigType.T10DIF:
        if d.dif.bg_type == SigT10difBgType.CSUM:
            return ip_csum(block, d.dif.bg)
        return crc("t10dif", d.dif.bg)(block)
    kind, size = _CRC_KIND[d.crc.crc_type]
    # mlx5dv_wr_set_mkey_sig_block(3): "only the 32 least significant bits are
    # used for CRC32/CRC32C".
    return crc(kind, d.crc.seed & ((1 << 8 * size) - 1))(block)


def ref_of(d: SigBlockDomain, b: int) -> int:
    # mlx5dv_wr_set_mkey_sig_block(3): ref_tag is "the value of the first block",
    # and REF_REMAP means "Increment reference tag per block".
    step = b if d.dif.flags & SigT10difFlags.REF_REMAP else 0
    return (d.dif.ref_tag + step) & M32


def pi_of(d: SigBlockDomain, block: bytes, b: int) -> bytes:
    """Block b's PI: T10DIF guard|app|ref or the CRC, each big-endian (docs/semantics.md 2)."""
    if d.sig_type == SigType.T10DIF:
        return (guard_of(d, block).to_bytes(2, "big") + d.dif.app_tag.to_bytes(2, "big")
                + ref_of(d, b).to_bytes(4, "big"))
    return guard_of(d, block).to_bytes(pi_size(d), "big")


def protect(data: bytes, d: SigBlockDomain) -> bytes:
    """``data`` cut into blocks, each followed by its PI; a tail stays plain data."""
    bs = BLOCK_SIZE_BYTES[d.block_size]
    n = len(data) // bs
    out = bytearray()
    for b in range(n):
        block = data[b * bs:(b + 1) * bs]
        out += block + pi_of(d, block, b)
    return bytes(out + data[n * bs:])


def xts(key: bytes, data: bytes, unit: int, encrypt: bool, tweak: int = TWEAK) -> bytes:
    """IEEE 1619 XTS-AES: unit k with tweak ``tweak + k`` as 16 little-endian bytes
    (mlx5dv_wr_set_mkey_crypto(3): "The tweak is incremented after each data_unit_size")."""
    out = bytearray()
    for k, start in enumerate(range(0, len(data), unit)):
        t = ((tweak + k) % (1 << 128)).to_bytes(16, "little")
        cipher = Cipher(algorithms.AES(key), modes.XTS(t))
        ctx = cipher.encryptor() if encrypt else cipher.decryptor()
        out += ctx.update(data[start:start + unit]) + ctx.finalize()
    return bytes(out)


# -- the two daemons -------------------------------------------------------------------

# How long one operation's completions may take before the example FAILs.
OP_TIMEOUT = 5.0
# How long a whole example may take (daemons, setup, every operation).
EXAMPLE_TIMEOUT = 60.0
PATH_MTU = sh.IBV_MTU_1024
PATH_MTU_BYTES = 128 << PATH_MTU     # enum ibv_mtu: 1 is 256 bytes, 3 is 1024
# The packets that carry an operation's bytes (IBTA RC opcodes, protocol/packets.py).
DATA_OPCODES = ("SEND_", "RDMA_WRITE_", "RDMA_READ_RESPONSE_")


class Side:
    """One daemon and the application's view of it, through softhca.client only: a
    control session, device mlx5_0, a PD, send and receive CQs and one RC QP able to
    post MKEY configure WRs."""

    def __init__(self, role: str, node: sh.Node, ctx: sh.Context, pd: sh.PD, scq: sh.CQ,
                 rcq: sh.CQ, qp: sh.QP) -> None:
        self.role, self.node, self.ctx, self.pd = role, node, ctx, pd
        self.scq, self.rcq, self.qp = scq, rcq, qp
        # The MKEYs this side created, with whether they carry signature attributes
        # (mlx5dv_mkey_check(3) applies to those only).
        self.mkeys: dict[int, tuple[sh.MKey, bool]] = {}

    @classmethod
    async def open(cls, role: str, node: sh.Node) -> Side:
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        scq, rcq = await ctx.create_cq(256), await ctx.create_cq(256)
        qp = await pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=scq, rcq=rcq,
            cap=sh.QPCap(max_send_wr=64, max_recv_wr=64, max_send_sge=4, max_recv_sge=4),
            send_ops_flags=Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE))
        return cls(role, node, ctx, pd, scq, rcq, qp)

    @property
    def daemon(self):
        return self.node.daemon

    @property
    def address(self) -> str:
        return self.node.address

    async def reg_mr(self, data: bytes | int, access: int = REMOTE) -> sh.MR:
        mr = await self.pd.reg_mr(data if isinstance(data, int) else len(data), access)
        if not isinstance(data, int):
            await mr.write(data)
        return mr

    async def create_dek(self, key: bytes) -> sh.DEK:
        size = CryptoKeySize.SIZE_256 if len(key) == 64 else CryptoKeySize.SIZE_128
        return await self.ctx.create_dek(sh.Mlx5DEKInitAttr(pd=self.pd, key_size=size, key=key))

    async def mkey(self, flags: int, *, access: int, max_entries: int = 4, sges=None,
                   interleaved=None, sig: SigBlockAttr | None = None,
                   crypto: CryptoAttr | None = None) -> sh.MKey:
        """mlx5dv_create_mkey, then one configure WR on this side's QP as
        mlx5dv_wr_mkey_configure(3)'s examples post it: IBV_SEND_INLINE, one setter per
        attribute given, and ibv_wr_complete."""
        mkey = await self.pd.create_mkey(flags, max_entries)
        await self.qp.post_mkey_configure(mkey, access=access, sges=sges,
                                          interleaved=interleaved, sig=sig, crypto=crypto)
        self.mkeys[mkey.handle] = (mkey, sig is not None)
        return mkey


async def connect_sides(a: Side, b: Side) -> None:
    """RESET -> INIT -> RTR -> RTS on both QPs, each towards the other's daemon."""
    await a.qp.connect(b.qp.info(), path_mtu=PATH_MTU)
    await b.qp.connect(a.qp.info(), path_mtu=PATH_MTU)


def whole(mr: sh.MR) -> list[SGE]:
    return [SGE(mr.addr, mr.length, mr.lkey)]


def on_mkey(mkey: sh.MKey, length: int) -> list[SGE]:
    """An SGE on an MKEY: zero-based, its length counted in wire bytes (docs/semantics.md 4, 5)."""
    return [SGE(0, length, mkey.lkey)]


class Capture:
    """Every packet the two daemons send while one operation runs (``Daemon.taps``)."""

    def __init__(self, sides: tuple[Side, ...]) -> None:
        self.sides = sides
        self.sent: list[tuple[str, Packet]] = []
        self._taps: list[tuple[Side, Callable]] = []

    def __enter__(self) -> Capture:
        for side in self.sides:
            def tap(direction: str, dev: str, pkt: Packet, role: str = side.role) -> None:
                if direction == "tx":
                    self.sent.append((role, pkt))
            side.daemon.taps.append(tap)
            self._taps.append((side, tap))
        return self

    def __exit__(self, *exc) -> None:
        for side, tap in self._taps:
            side.daemon.taps.remove(tap)
        self._taps.clear()

    def wire(self, sender: Side, receiver: Side) -> Wire:
        """The data packets ``sender`` sent to ``receiver``'s QP, once each in PSN order."""
        data = [p for role, p in self.sent if role == sender.role
                and p.dest_qp == receiver.qp.qp_num and p.opcode.startswith(DATA_OPCODES)]
        others = [(role, p) for role, p in self.sent if not p.opcode.startswith(DATA_OPCODES)]
        first: dict[int, Packet] = {}
        for p in data:
            first.setdefault(p.psn, p)
        base = data[0].psn if data else 0
        packets = sorted(first.values(), key=lambda p: (p.psn - base) % PSN_MOD)
        return Wire(b"".join(p.payload for p in packets), packets, len(data) - len(packets),
                    others, sender.role, receiver.role, receiver.qp.qp_num)


@dataclass(frozen=True)
class Wire:
    """One operation as it crossed TCP: its bytes (the data packets' payloads in PSN
    order, duplicates removed), those packets, and the other packets either side sent."""

    data: bytes
    packets: list[Packet]
    retransmitted: int
    others: list[tuple[str, Packet]]
    sender: str
    receiver: str
    dest_qp: int

    def summary(self) -> str:
        n = len(self.packets)
        if not n:
            text = f"no data packets to QP 0x{self.dest_qp:x}"
        else:
            a, z = self.packets[0], self.packets[-1]
            span = (f"{a.opcode} psn 0x{a.psn:x}" if n == 1 else
                    f"{a.opcode} psn 0x{a.psn:x} .. {z.opcode} psn 0x{z.psn:x}")
            text = (f"{n} packet{'s' if n != 1 else ''} {span} to QP 0x{self.dest_qp:x}, "
                    f"{len(self.data)}B, {self.sender} -> {self.receiver}")
        if self.retransmitted:
            text += f"; {self.retransmitted} retransmitted"
        counts: dict[tuple[str, str], int] = {}
        for role, p in self.others:
            counts[(role, p.opcode)] = counts.get((role, p.opcode), 0) + 1
        for (role, op), k in counts.items():
            text += f"; {k} {op} from the {role}"
        return text


def crypto_attr(dek, encrypt_on_tx: bool, order: int, unit: int) -> CryptoAttr:
    return CryptoAttr(encrypt_on_tx=encrypt_on_tx, signature_crypto_order=order,
                      data_unit_size=DUS[unit], initial_tweak=TWEAK.to_bytes(16, "little"),
                      dek=dek)


def new_key(rng: random.Random, size: int) -> bytes:
    # mlx5dv_dek_create refuses equal key halves (docs/semantics.md 8): draw until they differ.
    while True:
        key = rng.randbytes(size)
        if key[:size // 2] != key[size // 2:]:
            return key


# -- showing images ----------------------------------------------------------------

class Style:
    """ANSI colours, only when the output is a terminal (and NO_COLOR is unset)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _c(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled else text

    def bold(self, t: str) -> str:
        return self._c("1", t)

    def dim(self, t: str) -> str:
        return self._c("2", t)

    def pi(self, t: str) -> str:
        return self._c("36", t)

    def enc(self, t: str) -> str:
        return self._c("35", t)

    def ok(self, t: str) -> str:
        return self._c("1;32", t)

    def bad(self, t: str) -> str:
        return self._c("1;31", t)


@dataclass(frozen=True)
class Shape:
    """How an image is cut: blocks of ``block`` data bytes, each followed by the PI
    of ``sig`` (if any); ``enc`` says what is ciphertext: "none", "data" (the data
    but not the PI: enc(data)+SIG) or "all" (data and PI: enc(data+SIG))."""

    block: int = 512
    sig: SigBlockDomain | None = None
    enc: str = "none"

    @property
    def width(self) -> int:
        return self.block + pi_size(self.sig)


def preview(buf: bytes) -> str:
    if len(buf) <= 6:
        return " ".join(f"{x:02x}" for x in buf)
    return " ".join(f"{x:02x}" for x in buf[:4]) + " .. " + " ".join(f"{x:02x}" for x in buf[-2:])


def pi_fields(sig: SigBlockDomain, pi: bytes) -> list[tuple[str, int, int]]:
    """(name, value, hex digits) of each PI field."""
    if sig.sig_type == SigType.T10DIF:
        return [("guard", int.from_bytes(pi[0:2], "big"), 4),
                ("app", int.from_bytes(pi[2:4], "big"), 4),
                ("ref", int.from_bytes(pi[4:8], "big"), 8)]
    name = {SigCrcType.CRC32: "crc32", SigCrcType.CRC32C: "crc32c",
            SigCrcType.CRC64_XP10: "crc64"}[sig.crc.crc_type]
    return [(name, int.from_bytes(pi, "big"), 2 * len(pi))]


def block_text(blk: bytes, shape: Shape, style: Style) -> str:
    if shape.enc == "all":
        return style.enc(f"enc {len(blk)}B") + " " + preview(blk)
    data, pi = blk[:shape.block], blk[shape.block:]
    head = style.enc(f"enc {len(data)}B") if shape.enc == "data" else f"data {len(data)}B"
    text = f"{head} {preview(data)}"
    if shape.sig is not None and pi:
        text += " | " + style.pi(" ".join(f"{n} 0x{v:0{w}x}" for n, v, w in pi_fields(shape.sig, pi)))
    return text


def image_lines(buf: bytes, shape: Shape, style: Style) -> list[str]:
    """Block by block, the first three and the last when there are more than four."""
    w = shape.width
    n, tail = divmod(len(buf), w)
    shown: list[int | None] = list(range(n)) if n <= 4 else [0, 1, 2, None, n - 1]
    lines = []
    for b in shown:
        if b is None:
            lines.append(style.dim(f"... {n - 4} more blocks ..."))
        else:
            lines.append(f"blk {b:<2} @{b * w:<6} " + block_text(buf[b * w:(b + 1) * w], shape, style))
    if tail:
        lines.append(f"tail   @{n * w:<6} data {tail}B {preview(buf[n * w:])} (plain: no PI)")
    return lines


def segments_line(buf: bytes, cuts: list[int], style: Style) -> str:
    """An MR shown as the ranges [cuts[i], cuts[i+1]): its bytes, or "zeros"."""
    parts = []
    for a, b in zip([0, *cuts], [*cuts, len(buf)], strict=True):
        if a == b:
            continue
        piece = buf[a:b]
        body = style.dim("zeros") if not any(piece) else f"{b - a}B {preview(piece)}"
        parts.append(f"[{a},{b}) {body}")
    return " | ".join(parts)


def first_difference(got: bytes, want: bytes, shape: Shape | None) -> str:
    """Where two images first differ, named by block and PI field when cut in blocks."""
    if len(got) != len(want):
        return f"{len(got)} bytes, expected {len(want)}"
    i = next(k for k in range(len(got)) if got[k] != want[k])
    if shape is None:
        return f"byte {i} is 0x{got[i]:02x}, expected 0x{want[i]:02x}"
    b, o = divmod(i, shape.width)
    start = b * shape.width + shape.block
    if o < shape.block or shape.enc == "all" or shape.sig is None \
            or start + pi_size(shape.sig) > len(got):
        return f"blk {b} byte {o} is 0x{got[i]:02x}, expected 0x{want[i]:02x}"
    end = start + pi_size(shape.sig)
    for (name, g, width), (_, e, _) in zip(pi_fields(shape.sig, got[start:end]),
                                           pi_fields(shape.sig, want[start:end]), strict=True):
        if g != e:
            return f"blk {b} {name} 0x{g:0{width}x}, expected 0x{e:0{width}x}"
    return f"blk {b} byte {o} differs"


# -- describing configurations -------------------------------------------------------

def flag_names(value: int, enum) -> str:
    return "|".join(m.name for m in enum if value & m) or "0"


def domain_text(d: SigBlockDomain | None) -> str:
    if d is None:
        return "none"
    bs = BLOCK_SIZE_BYTES[d.block_size]
    if d.sig_type == SigType.T10DIF:
        f = d.dif
        return (f"T10DIF {SigT10difBgType(f.bg_type).name} bg 0x{f.bg:04x} app_tag "
                f"0x{f.app_tag:04x} ref_tag 0x{f.ref_tag:08x} "
                f"flags {flag_names(f.flags, SigT10difFlags)}, {bs}B blocks")
    return f"{SigCrcType(d.crc.crc_type).name} seed {d.crc.seed:#x}, {bs}B blocks"


def sig_text(s: SigBlockAttr) -> str:
    return (f"sig_block: mem {domain_text(s.mem)}; wire {domain_text(s.wire)}; "
            f"check_mask 0x{s.check_mask:02x}, copy_mask computed")


def crypto_text(c: CryptoAttr, key: bytes) -> str:
    order = SignatureCryptoOrder(c.signature_crypto_order).name
    return (f"crypto: AES-XTS-{len(key) * 4} (DEK of {len(key)}B), encrypt_on_tx "
            f"{c.encrypt_on_tx}, {order}, data_unit_size {BLOCK_SIZE_BYTES[c.data_unit_size]}B, "
            f"initial_tweak 0x{TWEAK:032x}")


# -- running an example ----------------------------------------------------------------

@dataclass
class Outcome:
    name: str
    reasons: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.reasons


# -- what an example showed, as data (softhca demo --html) ------------------------------

@dataclass(frozen=True)
class Stage:
    """One pipeline stage of one transfer, as a daemon's "trace" event reported it."""

    side: str               # target or initiator: whose daemon ran it
    role: str               # requester or responder
    op: str                 # the operation (SEND, RDMA_READ, ...)
    direction: str          # TX (memory to wire) or RX (wire to memory)
    stage: str              # gather, encrypt, decrypt, check, strip, generate, scatter, wire
    stream: str             # memory or wire: where the bytes are after the stage
    offset: int
    length: int
    detail: dict
    preview: str
    time: float = 0.0       # the daemons' loop clock (one loop for both embedded daemons)


@dataclass
class Step:
    """One thing an example showed, in order: a ``note`` (a labelled line), the MKEY
    ``config``, an ``image`` cut in blocks by ``shape``, MR ``segments``, an ``op``
    (the wire summary and the pipeline stages both daemons traced), a ``check`` or an
    ``mkey_check`` (``ok`` None: nothing to judge), or a ``raw`` line printed as is."""

    kind: str
    label: str = ""
    text: str = ""
    ok: bool | None = None
    why: str = ""
    data: bytes = b""
    shape: Shape | None = None
    cuts: tuple[int, ...] = ()
    stages: tuple[Stage, ...] = ()
    info: dict = field(default_factory=dict)


@dataclass
class Record:
    """Everything one example showed, kept beside its printed text for the HTML report."""

    name: str
    outcome: Outcome
    steps: list[Step] = field(default_factory=list)
    traced: bool = False


# While set (tools/report.py), every Example created appends its Record here.
RECORDING: contextvars.ContextVar[list[Record] | None] = contextvars.ContextVar(
    "softhca_demo_recording", default=None)


class _Tee:
    """An example's output while it is recorded: everything still goes to the real
    output; lines written to it directly (not through say, image, check ...) are kept
    as raw steps."""

    def __init__(self, out: TextIO, ex: Example) -> None:
        self._out, self._ex = out, ex

    def write(self, text: str) -> int:
        n = self._out.write(text)
        if self._ex._depth == 0 and self._ex.record is not None:
            for line in text.splitlines():
                if line.strip():
                    self._ex.record.steps.append(Step("raw", text=line.rstrip()))
        return n

    def flush(self) -> None:
        self._out.flush()

    def isatty(self) -> bool:
        return hasattr(self._out, "isatty") and self._out.isatty()


class Example:
    """The state of one example while it runs: its two daemons' sides, its seeded
    random source, and what it printed and found wrong."""

    def __init__(self, name: str, out: TextIO, style: Style) -> None:
        self.name = name
        self.out = out
        self.style = style
        # A str seed is hashed with SHA-512 by random.seed: the same bytes on every
        # run and whether the example runs alone (--only) or with the others.
        self.rng = random.Random(f"softhca demo {name}")
        self.target: Side
        self.initiator: Side
        self.outcome = Outcome(name)
        # The structured record of what is shown, when a report is being made: the
        # printed text is the same either way.
        self.record: Record | None = None
        self.subs: list[tuple[Side, sh.Subscription]] = []
        self._depth = 0
        sink = RECORDING.get()
        if sink is not None:
            self.record = Record(name, self.outcome)
            sink.append(self.record)
            self.out = _Tee(out, self)

    def _add(self, step: Step) -> None:
        if self.record is not None:
            self.record.steps.append(step)

    @contextlib.contextmanager
    def _recording(self, step: Step | None) -> Iterator[None]:
        """Record ``step`` (unless an outer step records this output already), and not
        the lines printed meanwhile."""
        if self._depth == 0 and step is not None:
            self._add(step)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def say(self, label: str, text: str = "") -> None:
        kind = "mkey_check" if label == "mkey_check" else "note"
        with self._recording(Step(kind, label, text)):
            self.out.write(f"  {label:<10} {text}".rstrip() + "\n")

    def lines(self, label: str, lines: list[str]) -> None:
        with self._recording(Step("note", label, "\n".join(lines))):
            self.say(label)
            for line in lines:
                self.out.write(f"      {line}\n")

    def image(self, label: str, buf: bytes, shape: Shape) -> None:
        with self._recording(Step("image", label, data=bytes(buf), shape=shape)):
            self.lines(f"{label}, {len(buf)}B", image_lines(buf, shape, self.style))

    def segments(self, label: str, buf: bytes, cuts: list[int], text: str | None = None) -> None:
        """An MR as the ranges between ``cuts`` (the layout examples)."""
        with self._recording(Step("segments", label, data=bytes(buf), cuts=tuple(cuts))):
            self.say(label, segments_line(buf, cuts, self.style) if text is None else text)

    def mkey_config(self, mkey, flags: int, access: int, layout: str,
                    sig: SigBlockAttr | None = None, crypto: CryptoAttr | None = None,
                    key: bytes = b"") -> None:
        info = {"mkey": mkey.lkey, "flags": flag_names(flags, MkeyInitAttrFlags),
                "access": flag_names(access, AccessFlags), "layout": layout, "sig": sig,
                "crypto": crypto, "key_bytes": len(key)}
        with self._recording(Step("config", "config", info=info)):
            self.say("config", f"target MKEY 0x{mkey.lkey:x}: "
                     f"{flag_names(flags, MkeyInitAttrFlags)}"
                     f", access {flag_names(access, AccessFlags)}, {layout}")
            if sig is not None:
                self.say("", sig_text(sig))
            if crypto is not None:
                self.say("", crypto_text(crypto, key))

    def check(self, ok: bool, what: str, why: str = "", label: str = "check") -> bool:
        kind = "mkey_check" if label == "mkey_check" else "check"
        with self._recording(Step(kind, label, what, ok=ok, why="" if ok else why)):
            mark = self.style.ok("ok ") if ok else self.style.bad("BAD")
            self.say(label, f"{mark} {what}" + ("" if ok else f": {why}"))
        if not ok:
            self.outcome.reasons.append(f"{what}: {why}")
        return ok

    async def traced(self) -> tuple[Stage, ...]:
        """The pipeline stages both daemons traced since the last call. A request on
        each control session first: the daemon writes its events before the reply, so
        every event of the operation just completed has arrived when it returns."""
        stages: list[Stage] = []
        for side, sub in self.subs:
            await side.node.counters()
            while (ev := await sub.next(0.001)) is not None:
                if ev.kind != "trace":
                    continue
                h = ev.header
                stages.append(Stage(side.role, str(h.get("role", "")), str(h.get("op", "")),
                                    str(h.get("direction", "")), str(h.get("stage", "")),
                                    str(h.get("stream", "")), int(h.get("offset", 0)),
                                    len(ev.data), dict(h.get("detail") or {}),
                                    preview(ev.data), float(h.get("time", 0.0))))
        # In the order they ran: the sender's TX before the receiver's RX.
        return tuple(sorted(stages, key=lambda st: st.time))

    def same(self, what: str, got: bytes, want: bytes, shape: Shape | None = None) -> bool:
        ok = got == want
        return self.check(ok, what, "" if ok else first_difference(got, want, shape))

    # -- the verbs, posted through the client and watched on the wire --------------------

    async def _run(self, sender: Side, receiver: Side, post: Callable[[], Awaitable[None]],
                   waits: list[tuple[Side, sh.CQ, WcOpcode]]) -> Wire:
        """Post an operation with taps on both daemons, wait for its completions, print
        its packets and completions; the bytes ``sender`` put on the wire are returned."""
        with Capture((self.target, self.initiator)) as cap:
            await post()
            wcs: list[tuple[Side, WcOpcode, sh.WC | None]] = []
            for side, cq, want in waits:
                try:
                    wcs.append((side, want, (await cq.poll_n(1, OP_TIMEOUT))[0]))
                except RDMAError as e:
                    if e.errno_name != "ETIMEDOUT":
                        raise
                    wcs.append((side, want, None))
        wire = cap.wire(sender, receiver)
        stages = await self.traced() if self.subs else ()
        with self._recording(Step("op", "wire", wire.summary(), stages=stages,
                                  info={"packets": len(wire.packets), "bytes": len(wire.data),
                                        "sender": wire.sender, "receiver": wire.receiver})):
            self.say("wire", wire.summary())
        ok = all(wc is not None and wc.status == WcStatus.SUCCESS and wc.opcode == want
                 for _, want, wc in wcs)

        def shown(side: Side, wc: sh.WC | None) -> str:
            if wc is None:
                return f"{side.role} no completion within {OP_TIMEOUT:g} s"
            return (f"{side.role} {WcOpcode(wc.opcode).name} {WcStatus(wc.status).name}"
                    + (f" {wc.byte_len}B" if wc.opcode == WcOpcode.RECV else ""))

        text = ", ".join(shown(side, wc) for side, _, wc in wcs)
        want = ", ".join(f"{side.role} {w.name} SUCCESS" for side, w, _ in wcs)
        self.check(ok, text, f"expected {want}", label="completion")
        return wire

    async def send(self, src: Side, local: list[SGE], dst: Side, recv: list[SGE]) -> Wire:
        """A RECV posted on ``dst``, then a SEND from ``src``: both completions."""
        await dst.qp.post_recv(sh.RecvWR(wr_id=1, sg=recv))
        wr = sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND, sg=local)
        return await self._run(src, dst, lambda: src.qp.post_send(wr),
                               [(src, src.scq, WcOpcode.SEND), (dst, dst.rcq, WcOpcode.RECV)])

    async def rdma_read(self, local: list[SGE], mkey: sh.MKey) -> Wire:
        """The initiator RDMA_READs the target's MKEY (rkey, address 0) into ``local``;
        the target's daemon sends the READ responses."""
        i = self.initiator
        wr = sh.SendWR(wr_id=3, opcode=sh.IBV_WR_RDMA_READ, sg=local)
        wr.set_wr_rdma(mkey.rkey, 0)
        return await self._run(self.target, i, lambda: i.qp.post_send(wr),
                               [(i, i.scq, WcOpcode.RDMA_READ)])

    async def rdma_write(self, local: list[SGE], mkey: sh.MKey) -> Wire:
        """The initiator RDMA_WRITEs ``local`` to the target's MKEY (rkey, address 0)."""
        i = self.initiator
        wr = sh.SendWR(wr_id=4, opcode=sh.IBV_WR_RDMA_WRITE, sg=local)
        wr.set_wr_rdma(mkey.rkey, 0)
        return await self._run(i, self.target, lambda: i.qp.post_send(wr),
                               [(i, i.scq, WcOpcode.RDMA_WRITE)])

    async def mkey_check(self, mkey: sh.MKey,
                         expect: tuple[int, int, int, int] | None = None) -> None:
        """mlx5dv_mkey_check(3) on both sides: the target's MKEY ``mkey`` against
        ``expect`` (err_type, actual_value, expected_value, offset; None for NO_ERR),
        and every MKEY the initiator has (none in these examples)."""
        def text(e: tuple[int, int, int, int]) -> str:
            if e[0] == MkeyErrType.NO_ERR:
                return "NO_ERR"
            # Values are 16, 32 or 64 bits wide (docs/semantics.md 7): pad to the width that holds both.
            digits = len(f"{max(e[1], e[2]):x}")
            w = 4 if digits <= 4 else 8 if digits <= 8 else 16
            return (f"{MkeyErrType(e[0]).name} actual 0x{e[1]:0{w}x} expected "
                    f"0x{e[2]:0{w}x} offset {e[3]}")

        has_sig = self.target.mkeys.get(mkey.handle, (mkey, True))[1]
        if not has_sig:
            # mlx5dv_mkey_check(3) reports signature errors; an MKEY without signature
            # attributes has none to report (EINVAL).
            try:
                err = await mkey.mkey_check()
                result = "NO_ERR" if err.err_type == MkeyErrType.NO_ERR else repr(err)
            except RDMAError as e:
                result = e.errno_name
            self.say("mkey_check", f"target MKEY 0x{mkey.lkey:x}: no signature attributes, "
                     f"nothing to check ({result})")
        else:
            err = await mkey.mkey_check()
            s = err.sig_err
            got = (int(err.err_type), int(s.actual_value), int(s.expected_value), int(s.offset))
            want = tuple(int(v) for v in (expect or (MkeyErrType.NO_ERR, 0, 0, 0)))
            # With NO_ERR the other fields carry no information: only the type is compared.
            ok = got == want if expect is not None else got[0] == MkeyErrType.NO_ERR
            self.check(ok, f"target MKEY 0x{mkey.lkey:x}: {text(got)}",
                       f"expected {text(want)}", label="mkey_check")
        if not self.initiator.mkeys:
            none = "initiator: no MKEY (plain MRs only), nothing to check"
            with self._recording(Step("mkey_check", "mkey_check", none)):
                self.say("", none)
        for other, sig in self.initiator.mkeys.values():
            if sig:
                err = await other.mkey_check()
                ok = err.err_type == MkeyErrType.NO_ERR
                what = f"initiator MKEY 0x{other.lkey:x}: {MkeyErrType(err.err_type).name}"
                with self._recording(Step("mkey_check", "mkey_check", what, ok=ok,
                                          why="" if ok else "expected NO_ERR")):
                    self.check(ok, what, "expected NO_ERR", label="")


@dataclass(frozen=True)
class Entry:
    name: str
    page: str
    where: str
    result: str
    fn: Callable[[Example], Awaitable[None]]


EXAMPLES: list[Entry] = []


def example(name: str, page: str, where: str, result: str):
    def register(fn: Callable[[Example], Awaitable[None]]) -> Callable[[Example], Awaitable[None]]:
        EXAMPLES.append(Entry(name, page, where, result, fn))
        return fn
    return register


# -- mlx5dv_wr_set_mkey_sig_block(3) ---------------------------------------------------

@example("sig_block 1", SIG_PAGE, "Example 1",
         "SEND with the MKEY as local key: each CRC32 validated against its 512 bytes, "
         "stripped, and only the 512 bytes of data per block sent to the wire.")
async def _sig_block_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(8 * 512)
    memory = protect(data, CRC32_512)
    mr = await t.reg_mr(memory)
    mkey = await t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=SIG_EXAMPLE_1)
    ex.mkey_config(mkey, SIG_FLAGS, LOCAL, f"list layout: {len(memory)}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_1)
    mem_shape, plain = Shape(512, CRC32_512), Shape(512)
    ex.image("target memory", memory, mem_shape)
    dst = await i.reg_mr(len(data))
    # The SGE length counts wire bytes (docs/semantics.md 5): 8 blocks of 512.
    wire = await ex.send(t, on_mkey(mkey, len(data)), i, whole(dst))
    ex.image("wire (SEND)", wire.data, plain)
    got = await dst.read()
    ex.image("initiator memory (RECV)", got, plain)
    await ex.mkey_check(mkey)
    ex.same("wire holds the data alone, CRC32 stripped", wire.data, data, plain)
    ex.same("initiator received the data", got, data, plain)
    # "validate each CRC32": with one stored CRC32 wrong the data still moves and the
    # MKEY latches a BAD_GUARD for that block (mlx5dv_mkey_check(3)).
    b = 3
    bad = bytearray(memory)
    bad[b * 516 + 512] ^= 0x01
    await mr.write(bytes(bad))
    await dst.write(bytes(len(data)))
    ex.say("tamper", f"one CRC32 byte of blk {b} flipped in target memory; SEND again")
    wire = await ex.send(t, on_mkey(mkey, len(data)), i, whole(dst))
    ex.same("the data still moves (a signature error is not a transport error)", wire.data,
            data, plain)
    ex.same("initiator received the data again", await dst.read(), data, plain)
    stored = int.from_bytes(bad[b * 516 + 512:b * 516 + 516], "big")
    await ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD,
                               guard_of(CRC32_512, data[b * 512:(b + 1) * 512]), stored, b * 516))


@example("sig_block 1.1", SIG_PAGE, "Example 1.1",
         "RECV on the same MKEY: the wire data scattered with a CRC32 generated after every "
         "512 bytes.")
async def _sig_block_1_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(8 * 512)
    mr = await t.reg_mr(8 * 516)
    mkey = await t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=SIG_EXAMPLE_1)
    ex.mkey_config(mkey, SIG_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_1)
    src = await i.reg_mr(data)
    plain = Shape(512)
    ex.image("initiator memory", data, plain)
    wire = await ex.send(i, whole(src), t, on_mkey(mkey, len(data)))
    ex.image("wire (SEND)", wire.data, plain)
    got = await mr.read()
    ex.image("target memory (RECV)", got, Shape(512, CRC32_512))
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's data", wire.data, data, plain)
    ex.same("target memory is data + CRC32 every 512 bytes", got,
            protect(data, CRC32_512), Shape(512, CRC32_512))


@example("sig_block 2", SIG_PAGE, "Example 2",
         "A remote RDMA_READ of the MKEY: the data transmitted with a T10DIF generated "
         "every 4K of data.")
async def _sig_block_2(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(4 * 4096)
    mr = await t.reg_mr(data)
    mkey = await t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=SIG_EXAMPLE_2)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_2)
    plain, dif = Shape(4096), Shape(4096, DIF_4K)
    ex.image("target memory", data, plain)
    dst = await i.reg_mr(4 * 4104)
    wire = await ex.rdma_read(whole(dst), mkey)
    ex.image("wire (RDMA_READ response)", wire.data, dif)
    got = await dst.read()
    ex.image("initiator memory", got, dif)
    await ex.mkey_check(mkey)
    want = protect(data, DIF_4K)
    ex.same("wire is data + T10DIF (crcmod guard, app 0x5a5a, ref 0x1000 + blk)", wire.data,
            want, dif)
    ex.same("initiator memory holds data + the same T10DIF", got, want, dif)
    ex.same("target memory is not changed by being read", await mr.read(), data, plain)


@example("sig_block 2.1", SIG_PAGE, "Example 2.1",
         "A remote RDMA_WRITE to the MKEY: each T10DIF validated against its 4K of data, "
         "stripped, and the data alone scattered.")
async def _sig_block_2_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(4 * 4096)
    mr = await t.reg_mr(len(data))
    mkey = await t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=SIG_EXAMPLE_2)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_2)
    plain, dif = Shape(4096), Shape(4096, DIF_4K)
    image = protect(data, DIF_4K)
    src = await i.reg_mr(image)
    ex.image("initiator memory", image, dif)
    wire = await ex.rdma_write(whole(src), mkey)
    ex.image("wire (RDMA_WRITE)", wire.data, dif)
    got = await mr.read()
    ex.image("target memory", got, plain)
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's data + T10DIF", wire.data, image, dif)
    ex.same("target memory is the data alone, T10DIF stripped", got, data, plain)
    # "validate each T10DIF field": a wrong guard in block 2 is reported at that block.
    b = 2
    bad = bytearray(image)
    bad[b * 4104 + 4096] ^= 0x01
    await src.write(bytes(bad))
    await mr.write(bytes(len(data)))
    ex.say("tamper", f"one guard byte of blk {b} flipped in initiator memory; RDMA_WRITE again")
    await ex.rdma_write(whole(src), mkey)
    ex.same("the data is still scattered (the writer's completion says nothing)",
            await mr.read(), data, plain)
    stored = int.from_bytes(bad[b * 4104 + 4096:b * 4104 + 4098], "big")
    await ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD,
                               guard_of(DIF_4K, data[b * 4096:(b + 1) * 4096]), stored, b * 4104))


# -- mlx5dv_wr_set_mkey_crypto(3) --------------------------------------------------------

CRYPTO_FLAGS = INDIRECT | MkeyInitAttrFlags.CRYPTO
SIG_CRYPTO_FLAGS = SIG_FLAGS | MkeyInitAttrFlags.CRYPTO


@example("crypto 1", CRYPTO_PAGE, "Example 1 (row F)",
         "SEND with the MKEY as local key: the encrypted memory decrypted with the DEK and "
         "the plaintext sent to the wire.")
async def _crypto_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    memory = xts(key, data, 512, encrypt=True)
    mr = await t.reg_mr(memory)
    attr = crypto_attr(await t.create_dek(key), False, BEFORE, 512)
    mkey = await t.mkey(CRYPTO_FLAGS, access=LOCAL, sges=whole(mr), crypto=attr)
    ex.mkey_config(mkey, CRYPTO_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   crypto=attr, key=key)
    ex.image("target memory", memory, Shape(512, enc="all"))
    dst = await i.reg_mr(len(data))
    wire = await ex.send(t, on_mkey(mkey, len(data)), i, whole(dst))
    ex.image("wire (SEND)", wire.data, Shape(512))
    got = await dst.read()
    ex.image("initiator memory (RECV)", got, Shape(512))
    await ex.mkey_check(mkey)
    ex.same("wire is the plaintext whose cryptography XTS encryption is in memory", wire.data,
            data)
    ex.same("initiator received the plaintext", got, data)


@example("crypto 1.1", CRYPTO_PAGE, "Example 1.1",
         "RECV on the same MKEY: the wire data encrypted with the DEK and scattered.")
async def _crypto_1_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    # An AES-128-XTS DEK here (32 bytes), so both key sizes are shown.
    key, data = new_key(ex.rng, 32), ex.rng.randbytes(8 * 512)
    mr = await t.reg_mr(len(data))
    attr = crypto_attr(await t.create_dek(key), False, BEFORE, 512)
    mkey = await t.mkey(CRYPTO_FLAGS, access=LOCAL, sges=whole(mr), crypto=attr)
    ex.mkey_config(mkey, CRYPTO_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   crypto=attr, key=key)
    src = await i.reg_mr(data)
    ex.image("initiator memory", data, Shape(512))
    wire = await ex.send(i, whole(src), t, on_mkey(mkey, len(data)))
    ex.image("wire (SEND)", wire.data, Shape(512))
    got = await mr.read()
    ex.image("target memory (RECV)", got, Shape(512, enc="all"))
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's plaintext", wire.data, data)
    ex.same("target memory is enc(data), tweak + k for unit k", got,
            xts(key, data, 512, encrypt=True))


async def _row_c(ex: Example, key: bytes, memory: bytes | int):
    t = ex.target
    mr = await t.reg_mr(memory)
    sig = SigBlockAttr(mem=None, wire=SIG, check_mask=0xFF)
    attr = crypto_attr(await t.create_dek(key), True, BEFORE, 520)
    mkey = await t.mkey(SIG_CRYPTO_FLAGS, access=REMOTE, sges=whole(mr), sig=sig, crypto=attr)
    ex.mkey_config(mkey, SIG_CRYPTO_FLAGS, REMOTE,
                   f"list layout: {mr.length}B of MR 0x{mr.lkey:x}", sig, attr, key)
    return mr, mkey


@example("crypto 2", CRYPTO_PAGE, "Example 2 (row C)",
         "A remote RDMA_READ: a T10DIF generated every 512B of data, data and T10DIF "
         "encrypted together (520B data units) and transmitted.")
async def _crypto_2(ex: Example) -> None:
    i = ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    mr, mkey = await _row_c(ex, key, data)
    ex.image("target memory", data, Shape(512))
    dst = await i.reg_mr(8 * 520)
    wire = await ex.rdma_read(whole(dst), mkey)
    ex.image("wire (RDMA_READ response)", wire.data, Shape(512, SIG, "all"))
    got = await dst.read()
    ex.image("initiator memory", got, Shape(512, SIG, "all"))
    clear = xts(key, got, 520, encrypt=False)
    ex.image("initiator memory decrypted by cryptography XTS", clear, Shape(512, SIG))
    await ex.mkey_check(mkey)
    want = xts(key, protect(data, SIG), 520, encrypt=True)
    ex.same("wire is enc(data+T10DIF) per 520B unit", wire.data, want, Shape(512, SIG, "all"))
    ex.same("initiator memory holds the wire image", got, want, Shape(512, SIG, "all"))
    ex.same("decrypted, it is data + T10DIF (crcmod guard, app 0xbeef, ref 0x2000 + blk)",
            clear, protect(data, SIG), Shape(512, SIG))


@example("crypto 2.1", CRYPTO_PAGE, "Example 2.1",
         "A remote RDMA_WRITE: the data decrypted, each T10DIF validated against its 512B, "
         "stripped, and the data alone scattered.")
async def _crypto_2_1(ex: Example) -> None:
    i = ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    mr, mkey = await _row_c(ex, key, len(data))
    image = xts(key, protect(data, SIG), 520, encrypt=True)
    src = await i.reg_mr(image)
    ex.image("initiator memory", image, Shape(512, SIG, "all"))
    wire = await ex.rdma_write(whole(src), mkey)
    ex.image("wire (RDMA_WRITE)", wire.data, Shape(512, SIG, "all"))
    got = await mr.read()
    ex.image("target memory", got, Shape(512))
    await ex.mkey_check(mkey)
    ex.same("wire is the initiator's enc(data+T10DIF)", wire.data, image, Shape(512, SIG, "all"))
    ex.same("target memory is the data alone", got, data, Shape(512))
    # A ciphertext byte changed on the wire decrypts to garbage in its 16-byte XTS
    # block: the T10DIF check after decryption must catch it at that 520B unit.
    u = 5
    bad = bytearray(image)
    bad[u * 520 + 17] ^= 0x80
    await src.write(bytes(bad))
    ex.say("tamper", f"one ciphertext byte of unit {u} flipped in initiator memory; "
           "RDMA_WRITE again")
    await ex.rdma_write(whole(src), mkey)
    clear = xts(key, bytes(bad), 520, encrypt=False)[u * 520:(u + 1) * 520]
    await ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD, guard_of(SIG, clear[:512]),
                               int.from_bytes(clear[512:514], "big"), u * 520))


# The table of mlx5dv_wr_set_mkey_crypto(3):
# row: (Memory, Op1, Op2, Op3, Wire, encrypt_on_tx, signature_crypto_order as printed)
CRYPTO_TABLE = {
    "A": ("data", "Encrypt on TX", "SIG.mem = none", "SIG.wire = none", "enc(data)", True,
          "Doesn't matter"),
    "B": ("data", "Encrypt On TX", "SIG.mem = none", "SIG.wire = SIG", "enc(data)+SIG", True,
          "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "C": ("data", "SIG.mem = none", "SIG.wire = SIG", "Encrypt on TX", "enc(data+SIG)", True,
          "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "D": ("data+SIG", "SIG.mem = SIG", "SIG.wire = none", "Encrypt on TX", "enc(data)", True,
          "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "E": ("data+SIG1", "SIG.mem = SIG1", "SIG.wire = SIG2", "Encrypt on TX", "enc(data+SIG2)",
          True, "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
    "F": ("enc(data)", "Decrypt on TX", "SIG.mem = none", "SIG.wire = none", "data", False,
          "Doesn't matter"),
    "G": ("enc(data)", "Decrypt on TX", "SIG.mem = none", "SIG.wire = SIG", "data+SIG", False,
          "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "H": ("enc(data+SIG)", "Decrypt on TX", "SIG.mem = SIG", "SIG.wire = none", "data", False,
          "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "I": ("enc(data+SIG1)", "Decrypt on TX", "SIG.mem = SIG1", "SIG.wire = SIG2", "data+SIG2",
          False, "SIGNATURE_AFTER_CRYPTO_ON_TX"),
    "J": ("enc(data)+SIG", "SIG.mem = SIG", "SIG.wire = none", "Decrypt on TX", "data", False,
          "SIGNATURE_BEFORE_CRYPTO_ON_TX"),
}
ROW_BLOCKS = 6


@dataclass(frozen=True)
class RowImages:
    memory: bytes
    mem_shape: Shape
    wire: bytes
    wire_shape: Shape
    mem_sig: SigBlockDomain | None
    wire_sig: SigBlockDomain | None
    order: int
    unit: int


def row_images(row: str, key: bytes, data: bytes) -> RowImages:
    """The memory and wire images a row names, built by the oracle; the PI of a
    memory SIG1 is a CRC64_XP10 and every other SIG a T10DIF (as the tests do)."""
    def enc(d: bytes, unit: int) -> bytes:
        return xts(key, d, unit, encrypt=True)

    plain, p_sig, p_sig1 = Shape(512), Shape(512, SIG), Shape(512, SIG1)
    builders = {
        "A": lambda: RowImages(data, plain, enc(data, 512), Shape(512, enc="all"),
                               None, None, AFTER, 512),
        "B": lambda: RowImages(data, plain, protect(enc(data, 512), SIG), Shape(512, SIG, "data"),
                               None, SIG, AFTER, 512),
        "C": lambda: RowImages(data, plain, enc(protect(data, SIG), 520), Shape(512, SIG, "all"),
                               None, SIG, BEFORE, 520),
        "D": lambda: RowImages(protect(data, SIG), p_sig, enc(data, 512), Shape(512, enc="all"),
                               SIG, None, BEFORE, 512),
        "E": lambda: RowImages(protect(data, SIG1), p_sig1, enc(protect(data, SIG), 520),
                               Shape(512, SIG, "all"), SIG1, SIG, BEFORE, 520),
        "F": lambda: RowImages(enc(data, 512), Shape(512, enc="all"), data, plain,
                               None, None, BEFORE, 512),
        "G": lambda: RowImages(enc(data, 512), Shape(512, enc="all"), protect(data, SIG), p_sig,
                               None, SIG, AFTER, 512),
        "H": lambda: RowImages(enc(protect(data, SIG), 520), Shape(512, SIG, "all"), data, plain,
                               SIG, None, AFTER, 520),
        "I": lambda: RowImages(enc(protect(data, SIG1), 520), Shape(512, SIG1, "all"),
                               protect(data, SIG), p_sig, SIG1, SIG, AFTER, 520),
        "J": lambda: RowImages(protect(enc(data, 512), SIG), Shape(512, SIG, "data"), data, plain,
                               SIG, None, BEFORE, 512),
    }
    return builders[row]()


async def _crypto_row(ex: Example, row: str) -> None:
    t, i = ex.target, ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(ROW_BLOCKS * 512)
    r = row_images(row, key, data)
    eot = CRYPTO_TABLE[row][5]
    sig = None
    if r.mem_sig or r.wire_sig:
        sig = SigBlockAttr(mem=r.mem_sig, wire=r.wire_sig, check_mask=0xFF)
    flags = SIG_CRYPTO_FLAGS if sig else CRYPTO_FLAGS
    mr = await t.reg_mr(r.memory)
    attr = crypto_attr(await t.create_dek(key), eot, r.order, r.unit)
    mkey = await t.mkey(flags, access=REMOTE, sges=whole(mr), sig=sig, crypto=attr)
    ex.mkey_config(mkey, flags, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   sig, attr, key)
    if SIG1 in (r.mem_sig, r.wire_sig):
        ex.say("", "SIG1 = CRC64_XP10, SIG2 = SIG = T10DIF: one signature converted into another")
    ex.image(f"target memory {CRYPTO_TABLE[row][0]}", r.memory, r.mem_shape)
    # TX: the initiator reads the MKEY; the target's READ responses carry the wire image.
    dst = await i.reg_mr(len(r.wire))
    wire = await ex.rdma_read(whole(dst), mkey)
    ex.image(f"wire {CRYPTO_TABLE[row][4]} (RDMA_READ response)", wire.data, r.wire_shape)
    got = await dst.read()
    ex.image("initiator memory after RDMA_READ", got, r.wire_shape)
    await ex.mkey_check(mkey)
    ex.same(f"TX gives the wire image {CRYPTO_TABLE[row][4]}", wire.data, r.wire, r.wire_shape)
    ex.same("initiator memory holds the wire image", got, r.wire, r.wire_shape)
    # RX: the same bytes written back through the MKEY over a zeroed target MR.
    await mr.write(bytes(mr.length))
    ex.say("back", "target MR zeroed; the initiator RDMA_WRITEs the wire image to the MKEY")
    wire = await ex.rdma_write(whole(dst), mkey)
    got = await mr.read()
    ex.image("target memory after RDMA_WRITE of the wire image", got, r.mem_shape)
    await ex.mkey_check(mkey)
    ex.same("the RDMA_WRITE carried the wire image", wire.data, r.wire, r.wire_shape)
    ex.same(f"RX gives back the memory image {CRYPTO_TABLE[row][0]}", got, r.memory,
            r.mem_shape)


for _row in CRYPTO_TABLE:
    _mem, _op1, _op2, _op3, _wire, _eot, _order = CRYPTO_TABLE[_row]
    example(f"crypto row {_row}", CRYPTO_PAGE, f"table row {_row}",
            f"Memory {_mem} -> {_op1}, {_op2}, {_op3} -> Wire {_wire}; encrypt_on_tx {_eot}, "
            f"signature_crypto_order {_order}.")(functools.partial(_crypto_row, row=_row))


# -- mlx5dv_wr_mkey_configure(3) ------------------------------------------------------------

RW = AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE


@example("mkey_configure list", CONF_PAGE, "List data layout configuration",
         "An RDMA_WRITE to the MKEY: the first 64 bytes go to mr1, the next 4096 bytes to mr2.")
async def _layout_list(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    mr1, mr2 = await t.reg_mr(256), await t.reg_mr(8192)
    # The page's example: 2 setters, access REMOTE_READ | REMOTE_WRITE, list of two SGEs.
    mkey = await t.mkey(INDIRECT, access=RW, max_entries=2,
                        sges=[SGE(mr1.addr, 64, mr1.lkey), SGE(mr2.addr, 4096, mr2.lkey)])
    ex.mkey_config(mkey, INDIRECT, RW, f"list layout: 64B of mr1 0x{mr1.lkey:x}, "
                   f"4096B of mr2 0x{mr2.lkey:x}")
    data = ex.rng.randbytes(64 + 4096)
    src = await i.reg_mr(data)
    ex.segments("initiator", data, [64], f"memory {len(data)}B {preview(data)}")
    wire = await ex.rdma_write(whole(src), mkey)
    ex.segments("wire bytes", wire.data, [64],
                f"RDMA_WRITE {len(wire.data)}B {preview(wire.data)}")
    m1, m2 = await mr1.read(), await mr2.read()
    ex.segments("target mr1", m1, [64])
    ex.segments("target mr2", m2, [4096])
    await ex.mkey_check(mkey)
    ex.same("the wire carried the initiator's bytes", wire.data, data)
    ex.same("mr1[0,64) is the first 64 bytes", m1[:64], data[:64])
    ex.same("mr2[0,4096) is the next 4096 bytes", m2[:4096], data[64:])
    ex.same("the rest of mr1 and mr2 is untouched", m1[64:] + m2[4096:],
            bytes(256 - 64 + 8192 - 4096))
    back = await i.reg_mr(len(data))
    ex.say("back", "the initiator RDMA_READs the MKEY")
    wire = await ex.rdma_read(whole(back), mkey)
    ex.same("an RDMA_READ of the MKEY gathers the same bytes back", wire.data, data)
    ex.same("and scatters them into the initiator's MR", await back.read(), data)


@example("mkey_configure interleaved", CONF_PAGE, "Interleaved data layout configuration",
         "An RDMA_WRITE to the MKEY: 512 bytes to mr1 @0, 8 bytes to mr2 @0, 512 bytes to "
         "mr1 @516, 8 bytes to mr2 @8.")
async def _layout_interleaved(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    mr1, mr2 = await t.reg_mr(2048), await t.reg_mr(64)
    # "one entry will be consumed for strided header": 2 entries need max_entries 3.
    mkey = await t.mkey(INDIRECT, access=RW, max_entries=3,
                        interleaved=(2, [MrInterleaved(mr1.addr, 512, 4, mr1.lkey),
                                         MrInterleaved(mr2.addr, 8, 0, mr2.lkey)]))
    ex.mkey_config(mkey, INDIRECT, RW, f"interleaved layout x2: 512B skip 4 of mr1 0x{mr1.lkey:x}"
                   f", 8B skip 0 of mr2 0x{mr2.lkey:x}")
    data = ex.rng.randbytes(2 * 520)
    src = await i.reg_mr(data)
    ex.segments("initiator", data, [512, 520, 1032], f"memory {len(data)}B {preview(data)}")
    wire = await ex.rdma_write(whole(src), mkey)
    ex.segments("wire bytes", wire.data, [512, 520, 1032],
                f"RDMA_WRITE {len(wire.data)}B {preview(wire.data)}")
    m1, m2 = await mr1.read(), await mr2.read()
    ex.segments("target mr1", m1, [512, 516, 1028])
    ex.segments("target mr2", m2, [8, 16])
    await ex.mkey_check(mkey)
    ex.same("the wire carried the initiator's bytes", wire.data, data)
    ex.same("first 512 bytes at mr1 offset 0", m1[0:512], data[0:512])
    ex.same("next 8 bytes at mr2 offset 0", m2[0:8], data[512:520])
    ex.same("next 512 bytes at mr1 offset 516", m1[516:1028], data[520:1032])
    ex.same("next 8 bytes at mr2 offset 8", m2[8:16], data[1032:1040])
    ex.same("the skipped and unused bytes are untouched", m1[512:516] + m1[1028:] + m2[16:],
            bytes(4 + 2048 - 1028 + 48))
    back = await i.reg_mr(len(data))
    ex.say("back", "the initiator RDMA_READs the MKEY")
    wire = await ex.rdma_read(whole(back), mkey)
    ex.same("an RDMA_READ of the MKEY gathers the same bytes back", wire.data, data)
    ex.same("and scatters them into the initiator's MR", await back.read(), data)


# -- selection and the run ---------------------------------------------------------------

class UnknownExample(ValueError):
    pass


def _norm(name: str) -> str:
    # "sig_block 1.1", "sig-block-1.1" and "SIG_BLOCK_1.1" name the same example.
    return "".join(ch for ch in name.lower() if ch not in " _-")


def select(only: list[str] | None) -> list[Entry]:
    """The examples named by ``only``: an exact name, else every example whose name
    starts with it ("crypto row" runs the ten rows)."""
    if not only:
        return list(EXAMPLES)
    chosen: list[Entry] = []
    for want in only:
        key = _norm(want)
        exact = [e for e in EXAMPLES if _norm(e.name) == key]
        found = exact or [e for e in EXAMPLES if _norm(e.name).startswith(key)]
        if not found:
            names = ", ".join(e.name for e in EXAMPLES)
            raise UnknownExample(f"no example named {want!r}; the examples are: {names}")
        chosen += [e for e in found if e not in chosen]
    return chosen


def use_color(out: TextIO) -> bool:
    return "NO_COLOR" not in os.environ and hasattr(out, "isatty") and out.isatty()


async def _play(entry: Entry, ex: Example) -> None:
    """Two embedded daemons for one example: set up, connected, the example run, closed."""
    async with sh.embedded() as tnode, sh.embedded() as inode:
        ex.target = await Side.open("target", tnode)
        ex.initiator = await Side.open("initiator", inode)
        await connect_sides(ex.target, ex.initiator)
        if ex.record is not None:
            # The report draws the pipeline stages each daemon traced (softhca trace's
            # events); without a subscriber the daemons do no trace work at all.
            ex.subs = [(side, await side.node.subscribe("trace"))
                       for side in (ex.target, ex.initiator)]
            ex.record.traced = True
        ex.say("daemons", f"target daemon {tnode.address} QP 0x{ex.target.qp.qp_num:x}, "
               f"initiator daemon {inode.address} QP 0x{ex.initiator.qp.qp_num:x}; "
               f"RC over TCP, path MTU {PATH_MTU_BYTES}")
        await entry.fn(ex)


async def run_one(entry: Entry, index: int, total: int, out: TextIO, style: Style) -> Outcome:
    out.write(style.bold(f"[{index}/{total}] {entry.name}: {entry.page}, {entry.where}") + "\n")
    out.write(f"  Result: {entry.result}\n")
    ex = Example(entry.name, out, style)
    return await judge(ex, _play(entry, ex), EXAMPLE_TIMEOUT, "example", out, style)


async def judge(ex, play, timeout: float, noun: str, out: TextIO, style: Style) -> Outcome:
    """Run ``play`` for ``ex`` (an example or a fault case) within ``timeout``, then print
    PASS or FAIL with the first reason. Any daemon or verbs error fails this one only."""
    try:
        await asyncio.wait_for(play, timeout)
    except asyncio.TimeoutError:
        ex.check(False, f"the {noun} ran to its end", f"not done within {timeout:g} s")
    except Exception as e:  # noqa: BLE001 - reported as this one's FAIL, the run goes on
        ex.check(False, f"the {noun} ran to its end", f"{type(e).__name__}: {e}")
    o = ex.outcome
    if o.passed:
        out.write(f"  {style.ok('PASS')}  {o.name}\n\n")
    else:
        more = f" (and {len(o.reasons) - 1} more)" if len(o.reasons) > 1 else ""
        out.write(f"  {style.bad('FAIL')}  {o.name}: {o.reasons[0]}{more}\n\n")
    return o


async def _run_all(entries: list[Entry], out: TextIO, style: Style) -> list[Outcome]:
    return [await run_one(e, k, len(entries), out, style) for k, e in enumerate(entries, 1)]


def run(only: list[str] | None = None, out: TextIO | None = None,
        color: bool | None = None) -> list[Outcome]:
    """Run the selected examples, printing each; raises UnknownExample for a bad name.
    Synchronous: the daemons and the client run on an event loop of their own."""
    out = out or sys.stdout
    style = Style(use_color(out) if color is None else color)
    entries = select(only)
    outcomes = asyncio.run(_run_all(entries, out, style))
    failed = [o for o in outcomes if not o.passed]
    n = len(outcomes)
    summary = (f"{n} example{'s' if n != 1 else ''}: {n - len(failed)} PASS, "
               f"{len(failed)} FAIL")
    out.write((style.bad(summary) if failed else style.ok(summary)) + "\n")
    if failed:
        out.write("failed: " + ", ".join(o.name for o in failed) + "\n")
    return outcomes
