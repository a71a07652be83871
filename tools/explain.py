"""``softhca explain``: the TX and RX pipelines an MKEY's signature and crypto imply.

Given the attributes of mlx5dv_wr_set_mkey_sig_block(3) and mlx5dv_wr_set_mkey_crypto(3)
(flags mirroring their structs, or a row letter of the crypto page's table), print
which operation runs in which order from memory to wire (TX) and from wire to memory
(RX), what one block looks like in memory and on the wire, and which PI bytes are
checked, copied and generated and which bytes are encrypted. No daemon is involved.

Nothing here is written per row: a row letter only selects a configuration, and
every pipeline is derived from the configuration by the rules of docs/semantics.md:

- section 6: TX reads the memory domain and writes the wire domain, RX the reverse;
  per block the input PI is checked (when the input domain has a signature), the
  output PI is produced, copy_mask bytes copied and the rest generated (when the
  output domain has one), or the input PI is stripped (when it has none); the copy
  mask is computed when COPY_MASK is not given;
- section 8: with no signature crypto runs on the one stream; SIGNATURE_AFTER_CRYPTO_ON_TX
  puts crypto on the memory stream (TX: crypto then signature), SIGNATURE_BEFORE_CRYPTO_ON_TX
  on the wire stream (TX: signature then crypto); encrypt_on_tx says which direction
  encrypts, and the stream crypto runs on includes the PI it carries.

The stage names are the engine's trace stages (gather, check, strip, generate,
encrypt, decrypt, wire, scatter), so that ``softhca trace`` shows the same list for
real traffic. Images are written in the crypto page's notation: ``data``,
``data+SIG``, ``enc(data+SIG)``, ``enc(data)+SIG``; SIG1 and SIG2 name the memory
and wire signatures when both domains have a different one, SIG the only one.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..protocol.enums import SigT10difFlags
from . import crypto_table
from .explain_config import (
    CRYPTO_PAGE,
    MEMORY,
    RX,
    TX,
    WIRE,
    Config,
    ConfigError,
    Crypto,
    PiField,
    _signature,
    domain_json,
    field_value_text,
    is_t10dif,
    layout_fields,
    parse_crypto,
    parse_domain,
    parse_mask,
    row_config,
    title,
    to_attr,
    validate,
)

if TYPE_CHECKING:
    from ..engine.signature import DomainSpec, SigConfig

EXIT_OK, EXIT_USAGE = 0, 2
# The configuration's names the tests and scripts reach through this module.
__all__ = ["Config", "ConfigError", "Crypto", "add_parser", "explain", "parse_crypto",
           "parse_domain", "parse_mask", "render_text", "row_config", "run", "to_attr",
           "validate"]


# -- the copy mask (docs/semantics.md section 6, step 2) ---------------------------------------

# The words for the engine's copy_mask_fields: (label, the attributes that must agree).
COPY_FIELD_WORDS = {"guard": ("guard", "bg_type and bg"), "app_tag": ("app tag", "app_tag"),
                    "ref_tag": ("ref tag", "ref_tag")}


def copy_mask_why(mem: DomainSpec | None, wire: DomainSpec | None) -> str:
    """Why the device computes the copy mask it does (the rule is the engine's)."""
    if mem is None or wire is None:
        return "only one domain has a signature: nothing to copy"
    fields = _signature().copy_mask_fields(mem, wire)
    if not fields:
        return "the domains differ in signature type, CRC type or block size"
    if not is_t10dif(mem):
        return f"both domains are {title(mem)}: the CRC is copied"
    why = []
    for name, _, copied in fields:
        label, what = COPY_FIELD_WORDS[name]
        why.append(f"{label} copied (same {what})" if copied else
                   f"{label} generated ({what} differ{'s' if ' and ' not in what else ''})")
    return "T10-DIF in both domains: " + ", ".join(why)


def mask_fields(mask: int, d: DomainSpec) -> list[tuple[PiField, tuple[str, ...]]]:
    """The PI fields a mask selects, each with the bytes of it selected."""
    out = []
    for f in layout_fields(d):
        picked = tuple(f.byte_names[i] for i in range(f.size)
                       if mask >> (7 - (f.first + i)) & 1)
        if picked:
            out.append((f, picked))
    return out


# -- images in the crypto page's notation -----------------------------------------------

@dataclass(frozen=True)
class Part:
    """One piece of a block image: ``data``, a signature's PI, ``enc(...)`` of an inner
    image, or bytes that no longer mean anything (a misplaced check or decrypt)."""

    kind: str                           # data | sig | enc | opaque
    name: str = ""                      # the signature's name (SIG, SIG1, SIG2), or a label
    dom: DomainSpec | None = None
    inner: tuple[Part, ...] = ()
    size: int = 0


Image = tuple[Part, ...]
DATA = Part("data")


def notation(img: Image) -> str:
    def one(p: Part) -> str:
        return {"data": "data", "sig": p.name, "opaque": p.name}.get(
            p.kind, f"enc({notation(p.inner)})")
    return "+".join(one(p) for p in img)


def nbytes(img: Image, block: int | None) -> int | None:
    total = 0
    for p in img:
        n = {"data": block, "sig": p.dom.pi_size if p.dom else 0, "opaque": p.size}.get(
            p.kind, nbytes(p.inner, block) if p.kind == "enc" else 0)
        if n is None:
            return None
        total += n
    return total


def byte_map(img: Image, block: int | None) -> str:
    """``| data 512 | guard 2 | app 2 | ref 4 |``; ciphertext as ``enc( ... )``."""
    def parts(im: Image) -> list[str]:
        out = []
        for p in im:
            if p.kind == "data":
                out.append(f"data {block}" if block else "data")
            elif p.kind == "sig":
                out += [f"{f.name} {f.size}" for f in layout_fields(p.dom)]
            elif p.kind == "enc":
                out.append("enc( " + " | ".join(parts(p.inner)) + " )")
            else:
                out.append(f"{p.name} {p.size}")
        return out
    return "| " + " | ".join(parts(img)) + " |"


def image_json(img: Image, block: int | None) -> dict:
    def parts(im: Image, enc: bool) -> list[dict]:
        out = []
        for p in im:
            if p.kind == "data":
                out.append({"field": "data", "bytes": block, "encrypted": enc})
            elif p.kind == "sig":
                out += [{"field": f.name, "bytes": f.size, "sig": p.name, "encrypted": enc}
                        for f in layout_fields(p.dom)]
            elif p.kind == "enc":
                out += parts(p.inner, True)
            else:
                out.append({"field": "opaque", "bytes": p.size, "label": p.name,
                            "encrypted": enc})
        return out
    return {"image": notation(img), "block_bytes": nbytes(img, block), "map": byte_map(img, block),
            "parts": parts(img, False)}


# -- the derivation ---------------------------------------------------------------------

@dataclass
class Step:
    stage: str                  # the engine's trace stage name
    stream: str                 # memory | wire: where the bytes are after the step
    text: str
    image: Image
    detail: dict = field(default_factory=dict)


@dataclass
class Pipeline:
    direction: str
    steps: list[Step]
    table_ops: list[str]
    checked: list[dict]
    copied: list[dict]
    generated: list[dict]
    crypto: dict | None


class Deriver:
    """Derives both directions' pipelines of one configuration."""

    def __init__(self, cfg: Config, sig: SigConfig | None) -> None:
        self.cfg = cfg
        self.warnings: list[str] = []
        mem, wire = (sig.mem, sig.wire) if sig else (None, None)
        if mem is not None and wire is not None:
            both = "SIG" if mem == wire else None
            self.names = {MEMORY: both or "SIG1", WIRE: both or "SIG2"}
        else:
            self.names = {MEMORY: "SIG" if mem else "none", WIRE: "SIG" if wire else "none"}
        self.domains = {MEMORY: mem, WIRE: wire}
        self.copy_mask = sig.copy_mask if sig else 0
        # PI bytes are copied only between domains of the same structure.
        self.copyable = bool(_signature().copy_mask_fields(mem, wire))
        # The unit a block image is drawn in: the signature's block, else the data unit.
        self.block = sig.block_size if sig else \
            cfg.crypto.dus if cfg.crypto else None
        c = cfg.crypto
        # docs/semantics.md section 8: the stream crypto runs on.
        self.crypto_stream = None if c is None else \
            WIRE if cfg.has_sig and c.order == "before" else MEMORY

    def side_image(self, side: str) -> Image:
        d = self.domains[side]
        return (DATA,) if d is None else (DATA, Part("sig", self.names[side], d))

    def derive(self) -> tuple[Image, Image, Pipeline, Pipeline]:
        """The memory and wire images and both pipelines. The plaintext side is where the
        encrypting direction starts (memory when TX encrypts or there is no crypto, the
        wire when TX decrypts): its image is data plus its own signature, and the other
        side's image is what that direction's pipeline makes of it."""
        c = self.cfg.crypto
        if c is None or c.encrypt_on_tx:
            mem_img = self.side_image(MEMORY)
            tx = self.pipeline(TX, mem_img)
            wire_img = tx.steps[-1].image
            rx = self.pipeline(RX, wire_img)
            back, start = rx.steps[-1].image, mem_img
        else:
            wire_img = self.side_image(WIRE)
            rx = self.pipeline(RX, wire_img)
            mem_img = rx.steps[-1].image
            tx = self.pipeline(TX, mem_img)
            back, start = tx.steps[-1].image, wire_img
        if back != start:
            self.warnings.append(f"the round trip does not give back {notation(start)}: it "
                                 f"gives {notation(back)}")
        return mem_img, wire_img, tx, rx

    def _crypt_op(self, direction: str) -> str:
        return "encrypt" if self.cfg.crypto.encrypt_on_tx == (direction == TX) else "decrypt"

    def pipeline(self, direction: str, start: Image) -> Pipeline:
        src, dst = (MEMORY, WIRE) if direction == TX else (WIRE, MEMORY)
        ind, outd = self.domains[src], self.domains[dst]
        steps: list[Step] = []
        img = start
        if direction == TX:
            steps.append(Step("gather", MEMORY, f"gather memory: {self._img_text(img)}", img))
        else:
            steps.append(Step("wire", WIRE, f"receive wire: {self._img_text(img)}", img))
        crypto = None
        if self.crypto_stream == src:
            img, crypto = self._crypt(direction, src, img, steps)
        checked, copied, generated = [], [], []
        if ind is not None:
            checked = self._check(src, ind, img, steps)
        if outd is not None:
            img, copied, generated = self._generate(src, dst, ind, outd, img, steps)
        elif ind is not None:
            img = self._strip(src, dst, ind, img, steps)
        if self.crypto_stream == dst:
            img, crypto = self._crypt(direction, dst, img, steps)
        if direction == TX:
            steps.append(Step("wire", WIRE, f"wire: {self._img_text(img)}", img))
        else:
            steps.append(Step("scatter", MEMORY, f"scatter memory: {self._img_text(img)}", img))
        # The same order in the crypto page's table vocabulary: SIG.<input side> and
        # SIG.<output side> where the signature runs, the crypto op before or after them.
        sig_ops = [f"SIG.{'mem' if s == MEMORY else 'wire'} = {self.names[s]}"
                   for s in (src, dst)]
        table = sig_ops
        if self.crypto_stream is not None:
            op = f"{self._crypt_op(direction).capitalize()} on {direction}"
            table = [op, *sig_ops] if self.crypto_stream == src else [*sig_ops, op]
        return Pipeline(direction, steps, table, checked, copied, generated, crypto)

    def _img_text(self, img: Image) -> str:
        n = nbytes(img, self.block)
        if not self.cfg.has_sig:
            unit = f" ({n}B per data unit)" if n else ""
            return notation(img) + unit
        return f"{notation(img)} ({n}B per block)"

    def _crypt(self, direction: str, stream: str, img: Image,
               steps: list[Step]) -> tuple[Image, dict]:
        c = self.cfg.crypto
        op = self._crypt_op(direction)
        covers = notation(img)
        if op == "encrypt":
            out: Image = (Part("enc", inner=img),)
        elif len(img) == 1 and img[0].kind == "enc":
            out = img[0].inner
        else:
            size = nbytes(img, self.block) or 0
            out = (Part("opaque", f"[dec({covers})]", size=size),)
            self.warnings.append(f"{direction} decrypts {covers}, which is not ciphertext: the "
                                 "result is garbage")
        width = nbytes(img, self.block)
        notes = []
        if self.cfg.has_sig and width:
            if c.dus == width:
                notes.append(f"one data unit per {width}B block")
            else:
                notes.append(f"data units of {c.dus}B do not line up with the {width}B blocks "
                             f"of the {stream} stream")
        if c.dus % 16:
            notes.append(f"{c.dus} is not a multiple of 16: XTS ciphertext stealing covers the "
                         f"last {c.dus % 16} bytes of each unit")
        text = (f"{op} {covers} with AES-XTS-{c.key_bits} on the {stream} stream, data units of "
                f"{c.dus}B, tweak = initial_tweak + unit (units counted from MKEY offset 0 of "
                f"that stream)")
        if notes:
            text += "; " + "; ".join(notes)
        detail = {"data_unit_size": c.dus, "initial_tweak": f"0x{c.tweak:032x}",
                  "covers": covers, "bytes_per_block": width}
        steps.append(Step(op, stream, text, out, detail))
        return out, {"op": op, "stream": stream, "covers": covers, "data_unit_size": c.dus,
                     "bytes_per_block": width, "position": len(steps)}

    def _check(self, src: str, d: DomainSpec, img: Image, steps: list[Step]) -> list[dict]:
        name, mask = self.names[src], self.cfg.check_mask
        picked = mask_fields(mask, d)
        if not img or img[-1].kind != "sig":
            self.warnings.append(f"the {src} PI is checked where it is not in the clear "
                                 f"({notation(img)}): checking it would fail")
        if not picked:
            what = (f"check_mask 0x{mask:02x} selects none of its bytes: nothing is compared, "
                    "every block is NO_ERR")
        else:
            parts = []
            for f, bytes_ in picked:
                part = field_value_text(d, f)
                if len(bytes_) != f.size:
                    part += f" (byte{'s' if len(bytes_) > 1 else ''} {' '.join(bytes_)} only)"
                parts.append(part)
            what = (f"check_mask 0x{mask:02x}: against the stored PI, " + "; ".join(parts)
                    + "; the first failing block is latched for mlx5dv_mkey_check, the data "
                    "moves anyway")
            if is_t10dif(d) and d.flags & SigT10difFlags.APP_REF_ESCAPE:
                what += ("; a block with app tag 0xffff and ref tag 0xffffffff is not checked "
                         "(APP_REF_ESCAPE)")
            elif is_t10dif(d) and d.flags & SigT10difFlags.APP_ESCAPE:
                what += "; a block with app tag 0xffff is not checked (APP_ESCAPE)"
        steps.append(Step("check", src, f"check {name} ({title(d)}), {what}", img,
                          {"check_mask": mask, "domain": src}))
        return [{"domain": src, "sig": name, "field": f.name, "bytes": list(b)}
                for f, b in picked]

    def _strip(self, src: str, dst: str, d: DomainSpec, img: Image, steps: list[Step]) -> Image:
        name = self.names[src]
        out = self._drop_pi(img, src)
        steps.append(Step("strip", dst, f"strip {name}: its {d.pi_size}B of PI per block are "
                          f"dropped, {notation(out)} remains", out, {"pi_size": d.pi_size}))
        return out

    def _drop_pi(self, img: Image, side: str) -> Image:
        if img and img[-1].kind == "sig":
            return img[:-1]
        d = self.domains[side]
        size = (nbytes(img, self.block) or 0) - d.pi_size
        self.warnings.append(f"the {side} PI is removed from {notation(img)}, where it is not "
                             "in the clear")
        return (Part("opaque", f"[{notation(img)} less {d.pi_size}B]", size=size),)

    def _generate(self, src: str, dst: str, ind: DomainSpec | None, outd: DomainSpec, img: Image,
                  steps: list[Step]) -> tuple[Image, list[dict], list[dict]]:
        name, in_name = self.names[dst], self.names[src]
        copy = self.copy_mask if self.copyable else 0
        copied_sel = mask_fields(copy, outd)
        copied_names = {f.name: b for f, b in copied_sel}
        texts, copied, generated = [], [], []
        for f in layout_fields(outd):
            got = copied_names.get(f.name, ())
            if got:
                copied.append({"domain": dst, "sig": name, "field": f.name, "from": in_name,
                               "bytes": list(got)})
                part = f"{f.label} copied from {in_name}"
                if len(got) != f.size:
                    part += f" (bytes {' '.join(got)}; the rest generated)"
                texts.append(part)
            if len(got) != f.size:
                generated.append({"domain": dst, "sig": name, "field": f.name,
                                  "bytes": [b for b in f.byte_names if b not in got]})
                if not got:
                    texts.append(field_value_text(outd, f))
        base = self._drop_pi(img, src) if ind is not None else img
        out = (*base, Part("sig", name, outd))
        head = f"generate {name}" + (f" in place of {in_name}" if ind is not None else "")
        steps.append(Step("generate", dst, f"{head} ({title(outd)}: " + "; ".join(texts) + ")",
                          out, {"pi_size": outd.pi_size, "copy_mask": copy}))
        return out, copied, generated


def explain(cfg: Config) -> dict:
    """The JSON document of a configuration's pipelines; the text is rendered from it."""
    sig = validate(cfg)
    d = Deriver(cfg, sig)
    mem_img, wire_img, tx, rx = d.derive()
    copy_given = cfg.copy_mask is not None
    copy_why = "given (MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK)" if copy_given else \
        copy_mask_why(sig.mem, sig.wire) if sig else None
    notes = []
    if cfg.crypto is not None and not cfg.has_sig:
        notes.append("no signature: crypto runs on the one stream and signature_crypto_order "
                     "does not matter")
    if cfg.has_sig and cfg.check_mask == 0:
        notes.append("check_mask 0x00: no PI byte is compared (--check-mask 0xff checks them "
                     "all)")

    def pipe(p: Pipeline) -> dict:
        src, dst = (MEMORY, WIRE) if p.direction == TX else (WIRE, MEMORY)
        return {"direction": p.direction, "from": src, "to": dst, "table_ops": p.table_ops,
                "stages": [s.stage for s in p.steps],
                "steps": [{"step": k, "stage": s.stage, "stream": s.stream, "text": s.text,
                           "image": notation(s.image), "bytes_per_block": nbytes(s.image,
                                                                                 d.block),
                           **({"detail": s.detail} if s.detail else {})}
                          for k, s in enumerate(p.steps, 1)],
                "checked": p.checked, "copied": p.copied, "generated": p.generated,
                "crypto": p.crypto}

    return {
        "config": {
            "row": cfg.row,
            "memory": domain_json(sig.mem) if sig and sig.mem else None,
            "wire": domain_json(sig.wire) if sig and sig.wire else None,
            "check_mask": sig.check_mask if sig else None,
            "copy_mask": sig.copy_mask if sig else None,
            "copy_mask_given": copy_given,
            "copy_mask_why": copy_why,
            "crypto": cfg.crypto.to_json() if cfg.crypto else None,
            "crypto_stream": d.crypto_stream,
        },
        "names": d.names,
        "layout": {MEMORY: image_json(mem_img, d.block), WIRE: image_json(wire_img, d.block)},
        "tx": pipe(tx),
        "rx": pipe(rx),
        "notes": notes,
        "warnings": d.warnings,
    }


# -- the text ---------------------------------------------------------------------------

def _fields_text(items: list[dict], with_from: bool = False) -> str:
    """``wire SIG: guard (G1 G0), app (A1 A0)``, one group per domain."""
    groups: dict[tuple[str, str], list[str]] = {}
    for it in items:
        text = f"{it['field']} ({' '.join(it['bytes'])})"
        if with_from:
            text += f" from {it['from']}"
        groups.setdefault((it["domain"], it["sig"]), []).append(text)
    return "; ".join(f"{dom} {sig}: " + ", ".join(t) for (dom, sig), t in groups.items())


def render_text(doc: dict) -> str:
    c = doc["config"]
    lines = []
    if c["row"]:
        lines.append(f"crypto table row {c['row']} of {CRYPTO_PAGE}, as a configuration:")
    else:
        lines.append("configuration:")
    names = doc["names"]

    def dom(side: str) -> str:
        d = c[side]
        if d is None:
            return "none"
        return f"{names[side]} = " + _domain_line(d)

    lines.append(f"  memory domain  {dom(MEMORY)}")
    lines.append(f"  wire domain    {dom(WIRE)}")
    if c["check_mask"] is not None:
        lines.append(f"  check_mask     0x{c['check_mask']:02x}")
        lines.append(f"  copy_mask      0x{c['copy_mask']:02x} ({c['copy_mask_why']})")
    cr = c["crypto"]
    if cr:
        lines.append(f"  crypto         AES-XTS-{cr['key_bits']}, encrypt_on_tx "
                     f"{int(cr['encrypt_on_tx'])}, {cr['signature_crypto_order']}, "
                     f"data_unit_size {cr['data_unit_size']}B, initial_tweak "
                     f"{cr['initial_tweak']}")
        lines.append(f"                 crypto runs on the {c['crypto_stream']} stream")
    else:
        lines.append("  crypto         none")
    lines.append("  as a row of the crypto table (Memory | operations on TX | Wire):")
    lines.append(f"                 {doc['layout'][MEMORY]['image']} | "
                 + " | ".join(doc["tx"]["table_ops"]) + f" | {doc['layout'][WIRE]['image']}")
    lines.append("")
    lines.append("one block:")
    width = max(len(doc["layout"][s]["image"]) for s in (MEMORY, WIRE))
    for side in (MEMORY, WIRE):
        lay = doc["layout"][side]
        size = f"{lay['block_bytes']}B" if lay["block_bytes"] else "any length"
        lines.append(f"  {side:<7} {lay['image']:<{width}}  {lay['map']}  {size}")
    for key in ("tx", "rx"):
        p = doc[key]
        lines.append("")
        lines.append(f"{p['direction']} ({p['from']} -> {p['to']}), in the table's terms: "
                     + ", ".join(p["table_ops"]))
        for s in p["steps"]:
            lines.append(f"  {s['step']}. {s['text']}")
    lines.append("")
    lines.append("bytes:")
    for key in ("tx", "rx"):
        p = doc[key]
        d = p["direction"]
        lines.append(f"  {d} checked    " + (_fields_text(p["checked"]) or "nothing"))
        lines.append(f"  {d} copied     " + (_fields_text(p["copied"], True) or "nothing"))
        lines.append(f"  {d} generated  " + (_fields_text(p["generated"]) or "nothing"))
        k = p["crypto"]
        if k:
            per = f", {k['bytes_per_block']}B per block" if k["bytes_per_block"] and \
                (c[MEMORY] or c[WIRE]) else ""
            lines.append(f"  {d} {k['op']}ed  {k['covers']} on the {k['stream']} stream "
                         f"(step {k['position']}){per}, {k['data_unit_size']}B data units")
        else:
            lines.append(f"  {d} crypto     none")
    for n in doc["notes"]:
        lines.append(f"note: {n}")
    for w in doc["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _domain_line(d: dict) -> str:
    if d["sig_type"] == "T10DIF":
        return (f"T10-DIF, {d['block_size']}B blocks + 8B PI, guard {d['bg_type']} bg "
                f"0x{d['bg']:04x}, app_tag 0x{d['app_tag']:04x}, ref_tag 0x{d['ref_tag']:08x}, "
                f"flags {'|'.join(d['flags']) or '0'}")
    return (f"{d['kind']}, {d['block_size']}B blocks + {d['pi_size']}B PI, seed "
            f"0x{d['seed']:0{2 * d['pi_size']}x}")


# -- the subcommand ---------------------------------------------------------------------

EPILOG = """\
domains (--mem, --wire), as struct mlx5dv_sig_block_domain:
  none
  t10dif:block=512,bg=crc|csum,seed=0|0xffff,app=0x1234,ref=0x10,flags=ref_remap|app_escape
  crc32:block=512,seed=0|0xffffffff    crc32c:...    crc64:block=4096,seed=0|ones
  block sizes: 512, 520, 4048, 4096, 4160 bytes (the default is 512)
masks (--check-mask, --copy-mask): 0x00..0xff (bit 7 is the first PI byte) or names:
  guard (0xc0), app (0x30), ref (0x0f), crc32/crc32c (0xf0), crc64 (0xff), all, none
crypto (--crypto), as struct mlx5dv_crypto_attr:
  none | aes-xts:encrypt_on_tx=0|1,order=after|before,dus=512|520|4048|4096|4160,
                 tweak=N,key=128|256
examples:
  softhca explain --row C
  softhca explain --wire t10dif:block=4096,bg=0xffff,app=0x5a5a,ref=0x1000,flags=ref_remap \\
      --check-mask 0xff
  softhca explain --mem crc32:block=512,seed=0xffffffff --check-mask crc32 --json
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain", help="print the TX and RX pipelines a signature/crypto configuration implies",
        description="Given the attributes of mlx5dv_wr_set_mkey_sig_block(3) and\n"
        "mlx5dv_wr_set_mkey_crypto(3), or a row A..J of the crypto page's table, print\n"
        "which operation runs in which order from memory to wire (TX) and from wire to\n"
        "memory (RX), what a block looks like in memory and on the wire, and which bytes\n"
        "are checked, copied, generated and encrypted. No daemon is needed.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--row", type=_row, metavar="A..J",
                   help="a row of the table of mlx5dv_wr_set_mkey_crypto(3): SIG is a T10-DIF "
                   "on 512B blocks (SIG1 a CRC64_XP10 where both domains have one), check_mask "
                   "0xff; not with --mem, --wire or --crypto")
    p.add_argument("--mem", type=parse_domain, metavar="SPEC",
                   help="the memory domain (default none)")
    p.add_argument("--wire", type=parse_domain, metavar="SPEC",
                   help="the wire domain (default none)")
    p.add_argument("--check-mask", type=parse_mask, metavar="MASK",
                   help="the PI bytes checked in the input domain (default 0, as the struct)")
    p.add_argument("--copy-mask", type=parse_mask, metavar="MASK",
                   help="sets MLX5DV_SIG_BLOCK_ATTR_FLAG_COPY_MASK with this mask (default: "
                   "the mask the device computes)")
    p.add_argument("--crypto", type=parse_crypto, metavar="SPEC",
                   help="the crypto attributes (default none)")
    p.add_argument("--json", action="store_true", help="print a JSON document")
    p.set_defaults(func=run, mem=_UNSET, wire=_UNSET, crypto=_UNSET)


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _row(text: str) -> str:
    row = text.strip().upper()
    if row not in crypto_table.CONFIGS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a row of the crypto table: give "
                                         "A, B, C, D, E, F, G, H, I or J")
    return row


def config_from_args(args: argparse.Namespace) -> Config:
    given = [f"--{n}" for n in ("mem", "wire", "crypto") if getattr(args, n) is not _UNSET]
    if args.row:
        if given:
            raise ConfigError(f"--row selects a whole configuration: it cannot be combined with "
                              f"{', '.join(given)} (only --check-mask and --copy-mask)")
        return row_config(args.row, args.check_mask, args.copy_mask)
    if not given:
        raise ConfigError("nothing to explain: give --row A..J, or --mem, --wire and/or "
                          "--crypto (see softhca explain --help)")

    def value(name: str):
        v = getattr(args, name)
        return None if v is _UNSET else v

    return Config(value("mem"), value("wire"), args.check_mask or 0, args.copy_mask,
                  value("crypto"))


def run(args: argparse.Namespace) -> int:
    try:
        doc = explain(config_from_args(args))
    except ConfigError as e:
        print(f"softhca explain: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return EXIT_OK
