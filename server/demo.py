"""The manual pages' examples, run on the engine, each ending in PASS or FAIL.

Two engine nodes take part: a *target* that owns the MKEY and an *initiator*
with plain MRs. Every operation moves bytes the way the example's verb would:
TX on one node (transfer.tx) produces the wire bytes, RX on the other
(transfer.rx) scatters them. SEND/RECV use the MKEY as a local key; RDMA_READ
and RDMA_WRITE use it as the target's rkey (remote=True).

What an example must produce is computed here from the man pages alone, not by
the engine: the PI with crcmod from the parameters of SEMANTICS.md section 3,
and AES-XTS with cryptography's own XTS mode, one context per data unit. The
demo never imports the tests, so it can run where only the package is installed.
"""

from __future__ import annotations

import functools
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import crcmod
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from softhca.engine import transfer
from softhca.engine.hca import HCA, MR
from softhca.engine.mkey_configure import MkeyConfigureBuilder
from softhca.protocol.attrs import (
    SGE,
    CryptoAttr,
    DEKInitAttr,
    MrInterleaved,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from softhca.protocol.enums import (
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
)

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

# SEMANTICS.md section 3: (crcmod polynomial with its x^width term, reflected, final xor).
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
        raise RuntimeError(f"demo oracle {kind} seed {seed:#x} disagrees with SEMANTICS.md")
    return fn


def ip_csum(data: bytes, bg: int) -> int:
    """RFC 1071 over big-endian words, bg as the starting sum (SEMANTICS.md section 3)."""
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
    """Block b's PI: T10DIF guard|app|ref or the CRC, each big-endian (SEMANTICS.md 2)."""
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


# -- the two nodes ---------------------------------------------------------------

class Node:
    """One engine HCA with a PD and a QP able to post MKEY configure WRs."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.hca = HCA("mlx5_0")
        self.pd = self.hca.alloc_pd()
        self.qp = MkeyConfigureBuilder(self.pd, Mlx5dvQpExSendOps.WITH_MKEY_CONFIGURE)

    def reg_mr(self, data: bytes | int, access: int = REMOTE) -> MR:
        mr = self.hca.reg_mr(self.pd, data if isinstance(data, int) else len(data), access)
        if not isinstance(data, int):
            mr.write(data)
        return mr

    def create_dek(self, key: bytes):
        size = CryptoKeySize.SIZE_256 if len(key) == 64 else CryptoKeySize.SIZE_128
        return self.hca.create_dek(DEKInitAttr(pd=self.pd, key_size=size, key=key))

    def mkey(self, flags: int, *, access: int, max_entries: int = 4, sges=None,
             interleaved=None, sig: SigBlockAttr | None = None,
             crypto: CryptoAttr | None = None):
        """mlx5dv_create_mkey then one configure WR, as mlx5dv_wr_mkey_configure(3)'s
        examples post it: IBV_SEND_INLINE, one setter per attribute given."""
        mkey = self.hca.create_mkey(self.pd, flags, max_entries)
        self.qp.post_configure(mkey, access=access, sges=sges, interleaved=interleaved,
                               sig=sig, crypto=crypto)
        return mkey


def whole(mr: MR) -> list[SGE]:
    return [SGE(mr.addr, mr.length, mr.lkey)]


def send(src: Node, src_key: int, src_off: int, length: int, dst: Node, dst_mr: MR) -> bytes:
    """A SEND of one SGE and the RECV that takes it into a plain MR."""
    wire = transfer.tx(src.pd, src_key, src_off, length)
    transfer.rx(dst.pd, dst_mr.lkey, dst_mr.addr, wire)
    return wire


def send_to_mkey(src: Node, src_mr: MR, length: int, dst: Node, mkey) -> bytes:
    """A SEND from a plain MR and the RECV whose SGE is the MKEY at offset 0."""
    wire = transfer.tx(src.pd, src_mr.lkey, src_mr.addr, length)
    transfer.rx(dst.pd, mkey.lkey, 0, wire)
    return wire


def rdma_read(initiator: Node, mr: MR, target: Node, mkey, length: int) -> bytes:
    """The target answers with its MKEY as rkey; the initiator scatters into its MR."""
    wire = transfer.tx(target.pd, mkey.rkey, 0, length, remote=True)
    transfer.rx(initiator.pd, mr.lkey, mr.addr, wire)
    return wire


def rdma_write(initiator: Node, mr: MR, length: int, target: Node, mkey) -> bytes:
    wire = transfer.tx(initiator.pd, mr.lkey, mr.addr, length)
    transfer.rx(target.pd, mkey.rkey, 0, wire, remote=True)
    return wire


def crypto_attr(dek, encrypt_on_tx: bool, order: int, unit: int) -> CryptoAttr:
    return CryptoAttr(encrypt_on_tx=encrypt_on_tx, signature_crypto_order=order,
                      data_unit_size=DUS[unit], initial_tweak=TWEAK.to_bytes(16, "little"),
                      dek=dek)


def new_key(rng: random.Random, size: int) -> bytes:
    # mlx5dv_dek_create refuses equal key halves (SEMANTICS.md 8): draw until they differ.
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


class Example:
    """The state of one example while it runs: its two nodes, its seeded random
    source, and what it printed and found wrong."""

    def __init__(self, name: str, out: TextIO, style: Style) -> None:
        self.name = name
        self.out = out
        self.style = style
        # A str seed is hashed with SHA-512 by random.seed: the same bytes on every
        # run and whether the example runs alone (--only) or with the others.
        self.rng = random.Random(f"softhca demo {name}")
        self.target = Node("target")
        self.initiator = Node("initiator")
        self.outcome = Outcome(name)

    def say(self, label: str, text: str = "") -> None:
        self.out.write(f"  {label:<10} {text}".rstrip() + "\n")

    def lines(self, label: str, lines: list[str]) -> None:
        self.say(label)
        for line in lines:
            self.out.write(f"      {line}\n")

    def image(self, label: str, buf: bytes, shape: Shape) -> None:
        self.lines(f"{label}, {len(buf)}B", image_lines(buf, shape, self.style))

    def mkey_config(self, mkey, flags: int, access: int, layout: str,
                    sig: SigBlockAttr | None = None, crypto: CryptoAttr | None = None,
                    key: bytes = b"") -> None:
        self.say("config", f"target MKEY 0x{mkey.lkey:x}: {flag_names(flags, MkeyInitAttrFlags)}"
                 f", access {flag_names(access, AccessFlags)}, {layout}")
        if sig is not None:
            self.say("", sig_text(sig))
        if crypto is not None:
            self.say("", crypto_text(crypto, key))

    def check(self, ok: bool, what: str, why: str = "", label: str = "check") -> bool:
        mark = self.style.ok("ok ") if ok else self.style.bad("BAD")
        self.say(label, f"{mark} {what}" + ("" if ok else f": {why}"))
        if not ok:
            self.outcome.reasons.append(f"{what}: {why}")
        return ok

    def same(self, what: str, got: bytes, want: bytes, shape: Shape | None = None) -> bool:
        ok = got == want
        return self.check(ok, what, "" if ok else first_difference(got, want, shape))

    def mkey_check(self, mkey, expect: tuple[int, int, int, int] | None = None) -> None:
        """mlx5dv_mkey_check(3) on the target's MKEY; ``expect`` is (err_type,
        actual_value, expected_value, offset), None for NO_ERR."""
        def text(e: tuple[int, int, int, int]) -> str:
            if e[0] == MkeyErrType.NO_ERR:
                return "NO_ERR"
            # Values are 16, 32 or 64 bits wide (SEMANTICS.md 7): pad to the width that holds both.
            digits = len(f"{max(e[1], e[2]):x}")
            w = 4 if digits <= 4 else 8 if digits <= 8 else 16
            return (f"{MkeyErrType(e[0]).name} actual 0x{e[1]:0{w}x} expected "
                    f"0x{e[2]:0{w}x} offset {e[3]}")

        err = mkey.mkey_check()
        got = (int(err.err_type), int(err.actual_value), int(err.expected_value), int(err.offset))
        want = tuple(int(v) for v in (expect or (MkeyErrType.NO_ERR, 0, 0, 0)))
        # With NO_ERR the other fields carry no information: only the type is compared.
        ok = got == want if expect is not None else got[0] == MkeyErrType.NO_ERR
        self.check(ok, f"target MKEY 0x{mkey.lkey:x}: {text(got)}", f"expected {text(want)}",
                   label="mkey_check")


@dataclass(frozen=True)
class Entry:
    name: str
    page: str
    where: str
    result: str
    fn: Callable[[Example], None]


EXAMPLES: list[Entry] = []


def example(name: str, page: str, where: str, result: str):
    def register(fn: Callable[[Example], None]) -> Callable[[Example], None]:
        EXAMPLES.append(Entry(name, page, where, result, fn))
        return fn
    return register


# -- mlx5dv_wr_set_mkey_sig_block(3) ---------------------------------------------------

@example("sig_block 1", SIG_PAGE, "Example 1",
         "SEND with the MKEY as local key: each CRC32 validated against its 512 bytes, "
         "stripped, and only the 512 bytes of data per block sent to the wire.")
def _sig_block_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(8 * 512)
    memory = protect(data, CRC32_512)
    mr = t.reg_mr(memory)
    mkey = t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=SIG_EXAMPLE_1)
    ex.mkey_config(mkey, SIG_FLAGS, LOCAL, f"list layout: {len(memory)}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_1)
    mem_shape, plain = Shape(512, CRC32_512), Shape(512)
    ex.image("target memory", memory, mem_shape)
    dst = i.reg_mr(len(data))
    # The SGE length counts wire bytes (SEMANTICS.md 5): 8 blocks of 512.
    wire = send(t, mkey.lkey, 0, len(data), i, dst)
    ex.image("wire (SEND)", wire, plain)
    ex.image("initiator memory (RECV)", dst.read(), plain)
    ex.mkey_check(mkey)
    ex.same("wire holds the data alone, CRC32 stripped", wire, data, plain)
    ex.same("initiator received the data", dst.read(), data, plain)
    # "validate each CRC32": with one stored CRC32 wrong the data still moves and the
    # MKEY latches a BAD_GUARD for that block (mlx5dv_mkey_check(3)).
    b = 3
    bad = bytearray(memory)
    bad[b * 516 + 512] ^= 0x01
    mr.write(bytes(bad))
    ex.say("tamper", f"one CRC32 byte of blk {b} flipped in target memory; SEND again")
    wire = send(t, mkey.lkey, 0, len(data), i, dst)
    ex.same("the data still moves (a signature error is not a transport error)", wire, data,
            plain)
    stored = int.from_bytes(bad[b * 516 + 512:b * 516 + 516], "big")
    ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD, guard_of(CRC32_512, data[b * 512:(b + 1) * 512]),
                         stored, b * 516))


@example("sig_block 1.1", SIG_PAGE, "Example 1.1",
         "RECV on the same MKEY: the wire data scattered with a CRC32 generated after every "
         "512 bytes.")
def _sig_block_1_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(8 * 512)
    mr = t.reg_mr(8 * 516)
    mkey = t.mkey(SIG_FLAGS, access=LOCAL, sges=whole(mr), sig=SIG_EXAMPLE_1)
    ex.mkey_config(mkey, SIG_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_1)
    src = i.reg_mr(data)
    plain = Shape(512)
    ex.image("initiator memory", data, plain)
    wire = send_to_mkey(i, src, len(data), t, mkey)
    ex.image("wire (SEND)", wire, plain)
    ex.image("target memory (RECV)", mr.read(), Shape(512, CRC32_512))
    ex.mkey_check(mkey)
    ex.same("target memory is data + CRC32 every 512 bytes", mr.read(),
            protect(data, CRC32_512), Shape(512, CRC32_512))


@example("sig_block 2", SIG_PAGE, "Example 2",
         "A remote RDMA_READ of the MKEY: the data transmitted with a T10DIF generated "
         "every 4K of data.")
def _sig_block_2(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(4 * 4096)
    mr = t.reg_mr(data)
    mkey = t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=SIG_EXAMPLE_2)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_2)
    plain, dif = Shape(4096), Shape(4096, DIF_4K)
    ex.image("target memory", data, plain)
    dst = i.reg_mr(4 * 4104)
    wire = rdma_read(i, dst, t, mkey, dst.length)
    ex.image("wire (RDMA_READ response)", wire, dif)
    ex.image("initiator memory", dst.read(), dif)
    ex.mkey_check(mkey)
    want = protect(data, DIF_4K)
    ex.same("wire is data + T10DIF (crcmod guard, app 0x5a5a, ref 0x1000 + blk)", wire, want, dif)
    ex.same("initiator memory holds data + the same T10DIF", dst.read(), want, dif)


@example("sig_block 2.1", SIG_PAGE, "Example 2.1",
         "A remote RDMA_WRITE to the MKEY: each T10DIF validated against its 4K of data, "
         "stripped, and the data alone scattered.")
def _sig_block_2_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(4 * 4096)
    mr = t.reg_mr(len(data))
    mkey = t.mkey(SIG_FLAGS, access=REMOTE, sges=whole(mr), sig=SIG_EXAMPLE_2)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   SIG_EXAMPLE_2)
    plain, dif = Shape(4096), Shape(4096, DIF_4K)
    image = protect(data, DIF_4K)
    src = i.reg_mr(image)
    ex.image("initiator memory", image, dif)
    wire = rdma_write(i, src, len(image), t, mkey)
    ex.image("wire (RDMA_WRITE)", wire, dif)
    ex.image("target memory", mr.read(), plain)
    ex.mkey_check(mkey)
    ex.same("target memory is the data alone, T10DIF stripped", mr.read(), data, plain)
    # "validate each T10DIF field": a wrong guard in block 2 is reported at that block.
    b = 2
    bad = bytearray(image)
    bad[b * 4104 + 4096] ^= 0x01
    src.write(bytes(bad))
    ex.say("tamper", f"one guard byte of blk {b} flipped in initiator memory; RDMA_WRITE again")
    rdma_write(i, src, len(image), t, mkey)
    stored = int.from_bytes(bad[b * 4104 + 4096:b * 4104 + 4098], "big")
    ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD, guard_of(DIF_4K, data[b * 4096:(b + 1) * 4096]),
                         stored, b * 4104))


# -- mlx5dv_wr_set_mkey_crypto(3) --------------------------------------------------------

CRYPTO_FLAGS = INDIRECT | MkeyInitAttrFlags.CRYPTO
SIG_CRYPTO_FLAGS = SIG_FLAGS | MkeyInitAttrFlags.CRYPTO


@example("crypto 1", CRYPTO_PAGE, "Example 1 (row F)",
         "SEND with the MKEY as local key: the encrypted memory decrypted with the DEK and "
         "the plaintext sent to the wire.")
def _crypto_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    memory = xts(key, data, 512, encrypt=True)
    mr = t.reg_mr(memory)
    attr = crypto_attr(t.create_dek(key), False, BEFORE, 512)
    mkey = t.mkey(CRYPTO_FLAGS, access=LOCAL, sges=whole(mr), crypto=attr)
    ex.mkey_config(mkey, CRYPTO_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   crypto=attr, key=key)
    ex.image("target memory", memory, Shape(512, enc="all"))
    dst = i.reg_mr(len(data))
    wire = send(t, mkey.lkey, 0, len(data), i, dst)
    ex.image("wire (SEND)", wire, Shape(512))
    ex.image("initiator memory (RECV)", dst.read(), Shape(512))
    ex.same("wire is the plaintext whose cryptography XTS encryption is in memory", wire, data)
    ex.same("initiator received the plaintext", dst.read(), data)


@example("crypto 1.1", CRYPTO_PAGE, "Example 1.1",
         "RECV on the same MKEY: the wire data encrypted with the DEK and scattered.")
def _crypto_1_1(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    # An AES-128-XTS DEK here (32 bytes), so both key sizes are shown.
    key, data = new_key(ex.rng, 32), ex.rng.randbytes(8 * 512)
    mr = t.reg_mr(len(data))
    attr = crypto_attr(t.create_dek(key), False, BEFORE, 512)
    mkey = t.mkey(CRYPTO_FLAGS, access=LOCAL, sges=whole(mr), crypto=attr)
    ex.mkey_config(mkey, CRYPTO_FLAGS, LOCAL, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   crypto=attr, key=key)
    src = i.reg_mr(data)
    ex.image("initiator memory", data, Shape(512))
    wire = send_to_mkey(i, src, len(data), t, mkey)
    ex.image("wire (SEND)", wire, Shape(512))
    ex.image("target memory (RECV)", mr.read(), Shape(512, enc="all"))
    ex.same("target memory is enc(data), tweak + k for unit k", mr.read(),
            xts(key, data, 512, encrypt=True))


def _row_c(ex: Example, key: bytes, memory: bytes | int):
    t = ex.target
    mr = t.reg_mr(memory)
    sig = SigBlockAttr(mem=None, wire=SIG, check_mask=0xFF)
    attr = crypto_attr(t.create_dek(key), True, BEFORE, 520)
    mkey = t.mkey(SIG_CRYPTO_FLAGS, access=REMOTE, sges=whole(mr), sig=sig, crypto=attr)
    ex.mkey_config(mkey, SIG_CRYPTO_FLAGS, REMOTE,
                   f"list layout: {mr.length}B of MR 0x{mr.lkey:x}", sig, attr, key)
    return mr, mkey


@example("crypto 2", CRYPTO_PAGE, "Example 2 (row C)",
         "A remote RDMA_READ: a T10DIF generated every 512B of data, data and T10DIF "
         "encrypted together (520B data units) and transmitted.")
def _crypto_2(ex: Example) -> None:
    i = ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    mr, mkey = _row_c(ex, key, data)
    ex.image("target memory", data, Shape(512))
    dst = i.reg_mr(8 * 520)
    wire = rdma_read(i, dst, ex.target, mkey, dst.length)
    ex.image("wire (RDMA_READ response)", wire, Shape(512, SIG, "all"))
    ex.image("initiator memory", dst.read(), Shape(512, SIG, "all"))
    clear = xts(key, dst.read(), 520, encrypt=False)
    ex.image("initiator memory decrypted by cryptography XTS", clear, Shape(512, SIG))
    ex.mkey_check(mkey)
    want = xts(key, protect(data, SIG), 520, encrypt=True)
    ex.same("wire is enc(data+T10DIF) per 520B unit", wire, want, Shape(512, SIG, "all"))
    ex.same("decrypted, it is data + T10DIF (crcmod guard, app 0xbeef, ref 0x2000 + blk)",
            clear, protect(data, SIG), Shape(512, SIG))


@example("crypto 2.1", CRYPTO_PAGE, "Example 2.1",
         "A remote RDMA_WRITE: the data decrypted, each T10DIF validated against its 512B, "
         "stripped, and the data alone scattered.")
def _crypto_2_1(ex: Example) -> None:
    i = ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(8 * 512)
    mr, mkey = _row_c(ex, key, len(data))
    image = xts(key, protect(data, SIG), 520, encrypt=True)
    src = i.reg_mr(image)
    ex.image("initiator memory", image, Shape(512, SIG, "all"))
    wire = rdma_write(i, src, len(image), ex.target, mkey)
    ex.image("wire (RDMA_WRITE)", wire, Shape(512, SIG, "all"))
    ex.image("target memory", mr.read(), Shape(512))
    ex.mkey_check(mkey)
    ex.same("target memory is the data alone", mr.read(), data, Shape(512))
    # A ciphertext byte changed on the wire decrypts to garbage in its 16-byte XTS
    # block: the T10DIF check after decryption must catch it at that 520B unit.
    u = 5
    bad = bytearray(image)
    bad[u * 520 + 17] ^= 0x80
    src.write(bytes(bad))
    ex.say("tamper", f"one ciphertext byte of unit {u} flipped in initiator memory; "
           "RDMA_WRITE again")
    rdma_write(i, src, len(image), ex.target, mkey)
    clear = xts(key, bytes(bad), 520, encrypt=False)[u * 520:(u + 1) * 520]
    ex.mkey_check(mkey, (MkeyErrType.BAD_GUARD, guard_of(SIG, clear[:512]),
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


def _crypto_row(ex: Example, row: str) -> None:
    t, i = ex.target, ex.initiator
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(ROW_BLOCKS * 512)
    r = row_images(row, key, data)
    eot = CRYPTO_TABLE[row][5]
    sig = None
    if r.mem_sig or r.wire_sig:
        sig = SigBlockAttr(mem=r.mem_sig, wire=r.wire_sig, check_mask=0xFF)
    flags = SIG_CRYPTO_FLAGS if sig else CRYPTO_FLAGS
    mr = t.reg_mr(r.memory)
    attr = crypto_attr(t.create_dek(key), eot, r.order, r.unit)
    mkey = t.mkey(flags, access=REMOTE, sges=whole(mr), sig=sig, crypto=attr)
    ex.mkey_config(mkey, flags, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   sig, attr, key)
    if SIG1 in (r.mem_sig, r.wire_sig):
        ex.say("", "SIG1 = CRC64_XP10, SIG2 = SIG = T10DIF: one signature converted into another")
    ex.image(f"target memory {CRYPTO_TABLE[row][0]}", r.memory, r.mem_shape)
    # TX: the initiator reads the MKEY; its MR receives the wire image.
    dst = i.reg_mr(len(r.wire))
    wire = rdma_read(i, dst, t, mkey, len(r.wire))
    ex.image(f"wire {CRYPTO_TABLE[row][4]} = initiator memory after RDMA_READ", wire,
             r.wire_shape)
    if sig is not None:
        ex.mkey_check(mkey)
    ex.same(f"TX gives the wire image {CRYPTO_TABLE[row][4]}", wire, r.wire, r.wire_shape)
    ex.same("initiator memory holds the wire image", dst.read(), r.wire, r.wire_shape)
    # RX: the same bytes written back through the MKEY over a zeroed target MR.
    mr.write(bytes(mr.length))
    rdma_write(i, dst, len(r.wire), t, mkey)
    ex.image("target memory after RDMA_WRITE of the wire image", mr.read(), r.mem_shape)
    if sig is not None:
        ex.mkey_check(mkey)
    ex.same(f"RX gives back the memory image {CRYPTO_TABLE[row][0]}", mr.read(), r.memory,
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
def _layout_list(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    mr1, mr2 = t.reg_mr(256), t.reg_mr(8192)
    # The page's example: 2 setters, access REMOTE_READ | REMOTE_WRITE, list of two SGEs.
    mkey = t.mkey(INDIRECT, access=RW, max_entries=2,
                  sges=[SGE(mr1.addr, 64, mr1.lkey), SGE(mr2.addr, 4096, mr2.lkey)])
    ex.mkey_config(mkey, INDIRECT, RW, f"list layout: 64B of mr1 0x{mr1.lkey:x}, "
                   f"4096B of mr2 0x{mr2.lkey:x}")
    data = ex.rng.randbytes(64 + 4096)
    src = i.reg_mr(data)
    ex.say("initiator", f"memory {len(data)}B {preview(data)}")
    wire = rdma_write(i, src, len(data), t, mkey)
    ex.say("wire", f"RDMA_WRITE {len(wire)}B {preview(wire)}")
    m1, m2 = mr1.read(), mr2.read()
    ex.say("target mr1", segments_line(m1, [64], ex.style))
    ex.say("target mr2", segments_line(m2, [4096], ex.style))
    ex.same("mr1[0,64) is the first 64 bytes", m1[:64], data[:64])
    ex.same("mr2[0,4096) is the next 4096 bytes", m2[:4096], data[64:])
    ex.same("the rest of mr1 and mr2 is untouched", m1[64:] + m2[4096:],
            bytes(256 - 64 + 8192 - 4096))
    back = i.reg_mr(len(data))
    ex.same("an RDMA_READ of the MKEY gathers the same bytes back",
            rdma_read(i, back, t, mkey, len(data)), data)


@example("mkey_configure interleaved", CONF_PAGE, "Interleaved data layout configuration",
         "An RDMA_WRITE to the MKEY: 512 bytes to mr1 @0, 8 bytes to mr2 @0, 512 bytes to "
         "mr1 @516, 8 bytes to mr2 @8.")
def _layout_interleaved(ex: Example) -> None:
    t, i = ex.target, ex.initiator
    mr1, mr2 = t.reg_mr(2048), t.reg_mr(64)
    # "one entry will be consumed for strided header": 2 entries need max_entries 3.
    mkey = t.mkey(INDIRECT, access=RW, max_entries=3,
                  interleaved=(2, [MrInterleaved(mr1.addr, 512, 4, mr1.lkey),
                                   MrInterleaved(mr2.addr, 8, 0, mr2.lkey)]))
    ex.mkey_config(mkey, INDIRECT, RW, f"interleaved layout x2: 512B skip 4 of mr1 0x{mr1.lkey:x}"
                   f", 8B skip 0 of mr2 0x{mr2.lkey:x}")
    data = ex.rng.randbytes(2 * 520)
    src = i.reg_mr(data)
    ex.say("initiator", f"memory {len(data)}B {preview(data)}")
    wire = rdma_write(i, src, len(data), t, mkey)
    ex.say("wire", f"RDMA_WRITE {len(wire)}B {preview(wire)}")
    m1, m2 = mr1.read(), mr2.read()
    ex.say("target mr1", segments_line(m1, [512, 516, 1028], ex.style))
    ex.say("target mr2", segments_line(m2, [8, 16], ex.style))
    ex.same("first 512 bytes at mr1 offset 0", m1[0:512], data[0:512])
    ex.same("next 8 bytes at mr2 offset 0", m2[0:8], data[512:520])
    ex.same("next 512 bytes at mr1 offset 516", m1[516:1028], data[520:1032])
    ex.same("next 8 bytes at mr2 offset 8", m2[8:16], data[1032:1040])
    ex.same("the skipped and unused bytes are untouched", m1[512:516] + m1[1028:] + m2[16:],
            bytes(4 + 2048 - 1028 + 48))
    back = i.reg_mr(len(data))
    ex.same("an RDMA_READ of the MKEY gathers the same bytes back",
            rdma_read(i, back, t, mkey, len(data)), data)


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


def run_one(entry: Entry, index: int, total: int, out: TextIO, style: Style) -> Outcome:
    out.write(style.bold(f"[{index}/{total}] {entry.name}: {entry.page}, {entry.where}") + "\n")
    out.write(f"  Result: {entry.result}\n")
    ex = Example(entry.name, out, style)
    try:
        entry.fn(ex)
    except Exception as e:  # noqa: BLE001 - any engine error fails this example, not the demo
        ex.check(False, "the example ran to its end", f"{type(e).__name__}: {e}")
    o = ex.outcome
    if o.passed:
        out.write(f"  {style.ok('PASS')}  {entry.name}\n\n")
    else:
        more = f" (and {len(o.reasons) - 1} more)" if len(o.reasons) > 1 else ""
        out.write(f"  {style.bad('FAIL')}  {entry.name}: {o.reasons[0]}{more}\n\n")
    return o


def run(only: list[str] | None = None, out: TextIO | None = None,
        color: bool | None = None) -> list[Outcome]:
    """Run the selected examples, printing each; raises UnknownExample for a bad name."""
    out = out or sys.stdout
    style = Style(use_color(out) if color is None else color)
    entries = select(only)
    outcomes = [run_one(e, k, len(entries), out, style) for k, e in enumerate(entries, 1)]
    failed = [o for o in outcomes if not o.passed]
    n = len(outcomes)
    summary = (f"{n} example{'s' if n != 1 else ''}: {n - len(failed)} PASS, "
               f"{len(failed)} FAIL")
    out.write((style.bad(summary) if failed else style.ok(summary)) + "\n")
    if failed:
        out.write("failed: " + ", ".join(o.name for o in failed) + "\n")
    return outcomes
