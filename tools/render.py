"""Text shared by the tools that show bytes: the demo, ``demo faults`` and ``trace``.

One ``Style`` (ANSI colours only on a terminal with NO_COLOR unset, or when forced),
one ``preview`` of a buffer, and the demo's images: a buffer cut in blocks of data
and PI (``Shape``), PI fields by name, MR segments, where two images first differ,
and a configuration in the man pages' words.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TextIO

from ..protocol.attrs import (
    T10DIF_PI_FIELDS,
    CryptoAttr,
    SigBlockAttr,
    SigBlockDomain,
    pi_size,
    t10dif_pi_field,
)
from ..protocol.enums import (
    BLOCK_SIZE_BYTES,
    SigCrcType,
    SignatureCryptoOrder,
    SigT10difBgType,
    SigT10difFlags,
    SigType,
)


class Style:
    """ANSI colours by what is shown; plain text when disabled."""

    CODES = {"head": "1", "dim": "2", "data": "37", "guard": "33", "app": "32", "ref": "34",
             "crc": "33", "pi": "36", "enc": "35", "stage": "36", "ok": "32", "pass": "1;32",
             "bad": "1;31"}

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, what: str, text: str) -> str:
        if not self.enabled:
            return text
        return f"\x1b[{self.CODES[what]}m{text}\x1b[0m"


def use_color(out: TextIO, force: bool = False, never: bool = False) -> bool:
    """Colours when forced, never when told not to, else on a terminal without NO_COLOR
    (https://no-color.org)."""
    if never:
        return False
    if force:
        return True
    return "NO_COLOR" not in os.environ and hasattr(out, "isatty") and out.isatty()


def preview(buf: bytes) -> str:
    """The first four and last two bytes in hex (all of them up to six)."""
    if len(buf) <= 6:
        return " ".join(f"{x:02x}" for x in buf)
    return " ".join(f"{x:02x}" for x in buf[:4]) + " .. " + " ".join(f"{x:02x}" for x in buf[-2:])


# -- images cut in blocks ----------------------------------------------------------------


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


# The short names a T10-DIF PI's fields are shown by.
T10DIF_LABELS = {"guard": "guard", "app_tag": "app", "ref_tag": "ref"}


def t10dif_fields(pi: bytes) -> list[tuple[str, int, int]]:
    """(name, value, hex digits) of each field of a T10-DIF PI."""
    return [(T10DIF_LABELS[field], t10dif_pi_field(pi, field), 2 * (hi - lo))
            for field, (lo, hi) in T10DIF_PI_FIELDS.items()]


def pi_fields(sig: SigBlockDomain, pi: bytes) -> list[tuple[str, int, int]]:
    """(name, value, hex digits) of each PI field."""
    if sig.sig_type == SigType.T10DIF:
        return t10dif_fields(pi)
    name = {SigCrcType.CRC32: "crc32", SigCrcType.CRC32C: "crc32c",
            SigCrcType.CRC64_XP10: "crc64"}[sig.crc.crc_type]
    return [(name, int.from_bytes(pi, "big"), 2 * len(pi))]


def block_text(blk: bytes, shape: Shape, style: Style) -> str:
    if shape.enc == "all":
        return style("enc", f"enc {len(blk)}B") + " " + preview(blk)
    data, pi = blk[:shape.block], blk[shape.block:]
    head = style("enc", f"enc {len(data)}B") if shape.enc == "data" else f"data {len(data)}B"
    text = f"{head} {preview(data)}"
    if shape.sig is not None and pi:
        fields = " ".join(f"{n} 0x{v:0{w}x}" for n, v, w in pi_fields(shape.sig, pi))
        text += " | " + style("pi", fields)
    return text


def image_lines(buf: bytes, shape: Shape, style: Style) -> list[str]:
    """Block by block, the first three and the last when there are more than four."""
    w = shape.width
    n, tail = divmod(len(buf), w)
    shown: list[int | None] = list(range(n)) if n <= 4 else [0, 1, 2, None, n - 1]
    lines = []
    for b in shown:
        if b is None:
            lines.append(style("dim", f"... {n - 4} more blocks ..."))
        else:
            blk = buf[b * w:(b + 1) * w]
            lines.append(f"blk {b:<2} @{b * w:<6} " + block_text(blk, shape, style))
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
        body = style("dim", "zeros") if not any(piece) else f"{b - a}B {preview(piece)}"
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
            f"initial_tweak 0x{int.from_bytes(c.initial_tweak, 'little'):032x}")

