"""``softhca demo --html FILE``: the examples' run as one self-contained HTML page.

The examples run exactly as ``softhca demo`` runs them (the same text is printed);
each ``harness.Example`` also keeps a structured record of what it shows
(``harness.RECORDING``): the MKEY configuration, every memory and wire image with the
Shape it is cut by, every operation with the pipeline stages the two daemons traced
(``node.subscribe("trace")``), the checks and both sides' mkey_check. This module
turns those records into HTML: inline CSS and inline SVG only, no script, no
font, image or style sheet fetched, so the file can be opened anywhere, offline.
Every text that comes from a run is escaped.
"""

from __future__ import annotations

import datetime
import html
import os
import platform
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

from ..protocol.attrs import CryptoAttr, SigBlockAttr, SigBlockDomain, pi_size
from ..protocol.enums import BLOCK_SIZE_BYTES, MkeyErrType, SignatureCryptoOrder, SigType
from . import demo, harness
from .harness import Record, Stage, Step
from .render import Shape, domain_text, pi_fields, preview

# -- colours: one per kind of byte (the legend draws the same table) ---------------------

COLORS = {
    "data": ("#dbeafe", "#1e3a8a", "#0f172a"),          # fill, stroke, text
    "guard": ("#fdba74", "#9a3412", "#0f172a"),
    "app": ("#86efac", "#166534", "#0f172a"),
    "ref": ("#d8b4fe", "#6b21a8", "#0f172a"),
    "crc": ("#fde047", "#854d0e", "#0f172a"),
    "enc": ("#334155", "#0f172a", "#f8fafc"),
    "encpi": ("#7c2d12", "#0f172a", "#fff7ed"),
    "zeros": ("#f1f5f9", "#94a3b8", "#64748b"),
}
LEGEND = [("data", "data"), ("guard", "T10-DIF guard"), ("app", "T10-DIF app tag"),
          ("ref", "T10-DIF ref tag"), ("crc", "CRC32 / CRC32C / CRC64 PI"),
          ("enc", "ciphertext (AES-XTS)"), ("encpi", "encrypted PI (enc(data+SIG))"),
          ("zeros", "zeros: bytes not written")]
# Fixed widths (px) of the PI fields: the diagrams are not to scale, so an 8-byte PI
# stays readable beside 4096 bytes of data.
FIELD_W = {"guard": 96, "app": 96, "ref": 136, "crc32": 156, "crc32c": 166, "crc64": 206}
STAGE_CLASS = {"gather": "mem", "scatter": "mem", "check": "check", "strip": "strip",
               "generate": "gen", "encrypt": "enc", "decrypt": "enc", "wire": "wire"}

SVG_W = 1000            # viewBox width of a block diagram
LABEL_W = 128           # the column of block labels
ROW_H, ROW_GAP, TOP = 30, 6, 34
MAX_ROWS = 8            # blocks drawn before the middle ones are elided

CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
  background: #f8fafc; color: #0f172a; }
header, main { max-width: 1100px; margin: 0 auto; padding: 0 20px; }
header { padding-top: 18px; }
h1 { font-size: 24px; margin: 8px 0; }
h2 { font-size: 19px; margin: 0 0 4px; }
h3 { font-size: 14px; margin: 14px 0 6px; color: #334155; }
code, pre, .mono { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace;
  font-size: 12.5px; }
.meta { color: #475569; margin: 2px 0; }
.summary { font-size: 18px; font-weight: 600; margin: 10px 0; }
.summary .n-pass { color: #15803d; } .summary .n-fail { color: #b91c1c; }
nav ol { columns: 3; padding-left: 22px; margin: 6px 0 14px; }
nav a { color: #1e3a8a; text-decoration: none; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 4px; color: #fff;
  font-size: 12px; font-weight: 700; vertical-align: 2px; }
.badge.pass { background: #15803d; } .badge.fail { background: #b91c1c; }
.badge.none { background: #64748b; }
section.example { background: #fff; border: 1px solid #cbd5e1; border-radius: 8px;
  margin: 18px 0; padding: 14px 18px; }
section.example.fail { border-color: #b91c1c; }
.where { color: #475569; margin: 0 0 6px; }
blockquote.result { margin: 6px 0 10px; padding: 6px 12px; border-left: 4px solid #94a3b8;
  background: #f1f5f9; }
table.config { border-collapse: collapse; margin: 6px 0; }
table.config th { text-align: left; padding: 2px 12px 2px 0; color: #334155; vertical-align: top;
  white-space: nowrap; }
table.config td { padding: 2px 0; }
.note { margin: 4px 0; } .note b { color: #334155; }
.check { margin: 2px 0; } .check .ok { color: #15803d; font-weight: 700; }
.check .bad, .reasons { color: #b91c1c; font-weight: 700; }
.op { border-left: 4px solid #0e7490; background: #ecfeff; padding: 6px 10px; margin: 8px 0; }
.pipeline { display: flex; flex-wrap: wrap; align-items: center; gap: 4px; margin: 4px 0; }
.pipeline .who { min-width: 250px; color: #334155; font-size: 12.5px; }
.chip { border: 1px solid #64748b; border-radius: 5px; padding: 2px 7px; background: #fff;
  font-size: 12px; }
.chip b { display: block; font-size: 12.5px; }
.chip.mem { background: #dbeafe; } .chip.check { background: #fed7aa; }
.chip.strip { background: #e2e8f0; } .chip.gen { background: #bbf7d0; }
.chip.enc { background: #334155; color: #f8fafc; } .chip.wire { background: #a5f3fc; }
.chip.bad { border: 2px solid #b91c1c; }
.arrow { color: #64748b; }
figure { margin: 8px 0; }
figcaption { font-weight: 600; color: #334155; }
svg.blocks { width: 100%; max-width: 1000px; height: auto; display: block; }
.mkey { margin: 4px 0; padding: 4px 10px; background: #fefce8; border-left: 4px solid #ca8a04; }
.mkeysum { margin: 8px 0; padding: 6px 10px; background: #fefce8; border: 1px solid #fde68a;
  border-radius: 6px; }
pre.raw { margin: 2px 0; white-space: pre-wrap; }
.legend { background: #fff; border: 1px solid #cbd5e1; border-radius: 8px; padding: 8px 12px; }
footer { color: #64748b; font-size: 12px; text-align: center; padding: 20px; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def anchor(name: str) -> str:
    return "ex-" + "".join(ch if ch.isalnum() else "-" for ch in name.lower())


# -- SVG ------------------------------------------------------------------------------------

def _rect(x: float, y: float, w: float, h: float, kind: str, title: str,
          dashed: bool = False) -> str:
    fill, stroke, _ = COLORS[kind]
    dash = ' stroke-dasharray="4 2"' if dashed else ""
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1"{dash} data-kind="{kind}">'
            f"<title>{esc(title)}</title></rect>")


def _text(x: float, y: float, text: str, kind: str = "", *, anchor_: str = "middle",
          size: float = 11.5, weight: str = "normal", color: str | None = None) -> str:
    fill = color or (COLORS[kind][2] if kind else "#0f172a")
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}" '
            f'fill="{fill}" text-anchor="{anchor_}" font-family="ui-monospace, DejaVu Sans Mono, '
            f'Menlo, monospace">{esc(text)}</text>')


def _fit(text: str, width: float, size: float = 11.5) -> str:
    """``text`` cut to what fits ``width`` px of monospace at ``size``."""
    room = max(1, int(width / (size * 0.62)) - 1)
    return text if len(text) <= room else text[:max(1, room - 1)] + "…"


def _fields(shape: Shape, pi: bytes) -> list[tuple[str, str, int, str]]:
    """(colour kind, name, width px, value) of each PI field of a block."""
    out = []
    for name, value, digits in pi_fields(shape.sig, pi):
        kind = name if name in ("guard", "app", "ref") else "crc"
        out.append((kind, name, FIELD_W[name], f"0x{value:0{digits}x}"))
    return out


def _field_layout(shape: Shape) -> list[tuple[str, str, int, int]]:
    """(kind, name, width px, byte offset in the block) for the PI of ``shape``."""
    if shape.sig is None:
        return []
    if shape.sig.sig_type == SigType.T10DIF:
        return [("guard", "guard", FIELD_W["guard"], shape.block),
                ("app", "app", FIELD_W["app"], shape.block + 2),
                ("ref", "ref", FIELD_W["ref"], shape.block + 4)]
    name = pi_fields(shape.sig, bytes(pi_size(shape.sig)))[0][0]
    return [("crc", name, FIELD_W[name], shape.block)]


def _rows(n: int) -> list[int | None]:
    """Which blocks get a row: all when few, else the first ones, a gap, the last."""
    if n <= MAX_ROWS:
        return list(range(n))
    return [*range(MAX_ROWS - 2), None, n - 1]


def image_svg(label: str, buf: bytes, shape: Shape) -> str:
    """One image cut in blocks by ``shape``: a row per block, a rectangle for the block
    with one for its data and one per PI field (or ciphertext), labelled with offsets
    and values."""
    w = shape.width
    n, tail = divmod(len(buf), w)
    rows = _rows(n)
    nrows = len(rows) + (1 if tail else 0)
    bar_x, bar_w = LABEL_W, SVG_W - LABEL_W - 6
    layout = _field_layout(shape)
    pi_w = sum(f[2] for f in layout)
    data_w = bar_w - pi_w
    height = TOP + nrows * (ROW_H + ROW_GAP) + 4
    parts = [f'<svg class="blocks" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {SVG_W} '
             f'{height}" role="img" aria-label="{esc(label)}" data-label="{esc(label)}">',
             f"<title>{esc(label)}: {len(buf)} bytes, {n} blocks of {w}B"
             f"{f' and a {tail}B tail' if tail else ''}</title>"]
    # The byte offsets inside a block, above the first row.
    ticks = [(bar_x, "+0")]
    x = bar_x + data_w
    for _kind, _name, fw, off in layout:
        ticks.append((x, f"+{off}"))
        x += fw
    ticks.append((bar_x + bar_w, f"+{w}"))
    parts.append(_text(6, 14, f"{n} × {w}B" if n else f"{len(buf)}B", anchor_="start",
                       size=11, color="#475569"))
    for k, (tx, t) in enumerate(ticks):
        a = "start" if k == 0 else "end" if k == len(ticks) - 1 else "middle"
        parts.append(_text(tx, 26, t, anchor_=a, size=10.5, color="#475569"))
        parts.append(f'<line x1="{tx:.1f}" y1="28" x2="{tx:.1f}" y2="{TOP - 1}" '
                     f'stroke="#94a3b8" stroke-width="1"/>')
    y = TOP
    for b in rows:
        if b is None:
            parts.append(_text(bar_x + bar_w / 2, y + ROW_H / 2 + 4,
                               f"… blocks {MAX_ROWS - 2} to {n - 2} …", size=11,
                               color="#475569"))
            y += ROW_H + ROW_GAP
            continue
        start = b * w
        blk = buf[start:start + w]
        data, pi = blk[:shape.block], blk[shape.block:]
        parts.append(f'<g class="block" data-block="{b}" data-offset="{start}">')
        parts.append(_text(6, y + 13, f"blk {b}", anchor_="start", size=11.5, weight="bold"))
        parts.append(_text(6, y + 26, f"@{start}", anchor_="start", size=10.5, color="#475569"))
        enc_data = shape.enc in ("all", "data")
        kind = "enc" if enc_data else "data"
        what = "ciphertext" if enc_data else "data"
        parts.append(_rect(bar_x, y, data_w, ROW_H, kind,
                           f"blk {b} {what} {shape.block}B at byte {start}: {preview(data)}"))
        parts.append(_text(bar_x + data_w / 2, y + ROW_H / 2 + 4,
                           _fit(f"{'enc ' if enc_data else 'data '}{len(data)}B  "
                                f"{preview(data)}", data_w), kind))
        x = bar_x + data_w
        if layout and len(pi) == pi_size(shape.sig):
            if shape.enc == "all":
                # enc(data+SIG): the PI is ciphertext too; where it lies is still known.
                parts.append(_rect(x, y, pi_w, ROW_H, "encpi",
                                   f"blk {b} encrypted PI {len(pi)}B at byte "
                                   f"{start + shape.block}: {preview(pi)}", dashed=True))
                parts.append(_text(x + pi_w / 2, y + ROW_H / 2 + 4,
                                   _fit(f"enc PI {len(pi)}B {preview(pi)}", pi_w), "encpi"))
            else:
                for (fk, name, fw, value), (_, _, _, off) in zip(_fields(shape, pi), layout,
                                                                 strict=True):
                    parts.append(_rect(x, y, fw, ROW_H, fk,
                                       f"blk {b} {name} at byte {start + off} "
                                       f"(+{off}): {value}"))
                    parts.append(_text(x + fw / 2, y + ROW_H / 2 + 4,
                                       _fit(f"{name} {value}", fw), fk))
                    x += fw
        parts.append("</g>")
        y += ROW_H + ROW_GAP
    if tail:
        parts.append(_text(6, y + 19, "tail", anchor_="start", size=11.5, weight="bold"))
        tw = max(120.0, bar_w * min(1.0, tail / w))
        parts.append(_rect(bar_x, y, tw, ROW_H, "data",
                           f"tail {tail}B at byte {n * w} (plain: no PI): "
                           f"{preview(buf[n * w:])}"))
        parts.append(_text(bar_x + tw / 2, y + ROW_H / 2 + 4,
                           _fit(f"tail {tail}B @{n * w} (no PI)", tw), "data"))
    parts.append("</svg>")
    return "".join(parts)


def segments_svg(label: str, buf: bytes, cuts: Iterable[int]) -> str:
    """An MR as the ranges between ``cuts``, drawn to scale (the layout examples)."""
    bounds = [0, *cuts, len(buf)]
    ranges = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    bar_x, bar_w = LABEL_W, SVG_W - LABEL_W - 6
    # Every range gets at least 60 px so that a 4-byte gap stays visible; the rest is
    # shared in proportion to the lengths.
    min_w = 60.0
    spare = bar_w - min_w * len(ranges)
    total = max(1, len(buf))
    height = 30 + ROW_H + 22
    parts = [f'<svg class="blocks" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {SVG_W} '
             f'{height}" role="img" aria-label="{esc(label)}" data-label="{esc(label)}">',
             f"<title>{esc(label)}: {len(buf)} bytes</title>",
             _text(6, 14, f"{len(buf)}B", anchor_="start", size=11, color="#475569"),
             _text(6, 30 + 19, "bytes", anchor_="start", size=11.5, weight="bold")]
    x, y = float(bar_x), 30.0
    for a, b in ranges:
        piece = buf[a:b]
        rw = min_w + (spare * (b - a) / total if spare > 0 else 0)
        zeros = not any(piece)
        kind = "zeros" if zeros else "data"
        body = "zeros" if zeros else preview(piece)
        parts.append(_rect(x, y, rw, ROW_H, kind, f"[{a},{b}) {b - a}B: {body}"))
        parts.append(_text(x + rw / 2, y + ROW_H / 2 + 4, _fit(f"{b - a}B {body}", rw), kind))
        parts.append(_text(x + 2, y - 4, f"{a}", anchor_="start", size=10.5, color="#475569"))
        x += rw
    parts.append(_text(bar_x + bar_w, y - 4, f"{len(buf)}", anchor_="end", size=10.5,
                       color="#475569"))
    parts.append("</svg>")
    return "".join(parts)


def legend_svg() -> str:
    per_row = 4
    col_w = SVG_W / per_row
    rows = (len(LEGEND) + per_row - 1) // per_row
    parts = [f'<svg class="blocks legend-svg" xmlns="http://www.w3.org/2000/svg" '
             f'viewBox="0 0 {SVG_W} {rows * 26 + 4}" role="img" aria-label="legend">']
    for k, (kind, text) in enumerate(LEGEND):
        x, y = (k % per_row) * col_w + 4, (k // per_row) * 26 + 4
        parts.append(_rect(x, y, 34, 18, kind, text))
        parts.append(_text(x + 42, y + 13, text, anchor_="start", size=12,
                           color="#0f172a"))
    parts.append("</svg>")
    return "".join(parts)


# -- HTML pieces ----------------------------------------------------------------------------

def _hex(v: int) -> str:
    return f"0x{v:x}"


def _domain(d: SigBlockDomain | None) -> str:
    return domain_text(d)


def config_html(info: dict) -> str:
    rows = [("MKEY", f"0x{info['mkey']:x} (the target's; zero-based)"),
            ("create flags", info["flags"]), ("access", info["access"]),
            ("layout", info["layout"])]
    sig: SigBlockAttr | None = info.get("sig")
    if sig is not None:
        rows += [("sig_block mem", _domain(sig.mem)), ("sig_block wire", _domain(sig.wire)),
                 ("check_mask", f"0x{sig.check_mask:02x} (copy_mask computed)")]
    else:
        rows.append(("sig_block", "none"))
    c: CryptoAttr | None = info.get("crypto")
    if c is not None:
        rows += [("crypto", f"AES-XTS-{info.get('key_bytes', 0) * 4} (DEK of "
                            f"{info.get('key_bytes', 0)}B)"),
                 ("encrypt_on_tx", str(c.encrypt_on_tx)),
                 ("signature_crypto_order",
                  SignatureCryptoOrder(c.signature_crypto_order).name),
                 ("data_unit_size", f"{BLOCK_SIZE_BYTES[c.data_unit_size]}B"),
                 ("initial_tweak", f"0x{int.from_bytes(c.initial_tweak, 'little'):032x} "
                                   "(+1 per data unit)")]
    else:
        rows.append(("crypto", "none"))
    body = "".join(f"<tr><th>{esc(k)}</th><td class=\"mono\">{esc(v)}</td></tr>"
                   for k, v in rows)
    return f'<table class="config">{body}</table>'


def _results_text(detail: dict) -> tuple[str, bool]:
    results = detail.get("results") or []
    bad = [(b, r) for b, r in enumerate(results) if r]
    text = f"{len(results)} block{'s' * (len(results) != 1)}: "
    if not bad:
        return text + "all NO_ERR", False
    names = []
    for b, r in bad[:4]:
        try:
            names.append(f"blk {b} {MkeyErrType(r).name}")
        except ValueError:
            names.append(f"blk {b} error {r}")
    more = f" (+{len(bad) - 4})" if len(bad) > 4 else ""
    return text + ", ".join(names) + more, True


def stage_chip(st: Stage) -> str:
    cls = STAGE_CLASS.get(st.stage, "")
    # The stream the bytes are in after the stage, and where they start in it.
    where = f"→ {st.stream} @{st.offset if st.offset < 1 << 20 else _hex(st.offset)}"
    extra, bad = "", False
    d = st.detail
    if st.stage == "check":
        extra, bad = _results_text(d)
        extra = f"mask 0x{int(d.get('check_mask', 0)):02x}, {extra}"
    elif st.stage in ("encrypt", "decrypt"):
        extra = f"{d.get('data_unit_size')}B units, tweak {d.get('first_tweak')}"
    elif st.stage == "generate":
        cols = d.get("copied_cols") or []
        extra = f"{d.get('pi_size')}B PI" + (f", copied cols {cols}" if cols else "")
    elif st.stage == "strip":
        extra = f"{d.get('pi_size')}B PI removed"
    title = f"{st.stage}: {st.length}B in the {st.stream} stream at {st.offset}: {st.preview}"
    return (f'<span class="chip {cls}{" bad" if bad else ""}" data-stage="{esc(st.stage)}" '
            f'title="{esc(title)}"><b>{esc(st.stage)}</b>{esc(where)}, {st.length}B'
            + (f"<br>{esc(extra)}" if extra else "") + "</span>")


def pipeline_html(stages: tuple[Stage, ...]) -> str:
    """The stages grouped by transfer (daemon, role, operation, direction), in order."""
    groups: list[tuple[tuple[str, str, str, str], list[Stage]]] = []
    for st in stages:
        key = (st.side, st.role, st.op, st.direction)
        for k, g in groups:
            if k == key:
                g.append(st)
                break
        else:
            groups.append((key, [st]))
    rows = []
    for (side, role, op, direction), g in groups:
        arrow = '<span class="arrow">→</span>'
        chips = arrow.join(stage_chip(st) for st in g)
        what = "memory → wire" if direction == "TX" else "wire → memory"
        rows.append(f'<div class="pipeline" data-direction="{esc(direction)}">'
                    f'<span class="who"><b>{esc(side)}</b> daemon, {esc(role)} {esc(op)} '
                    f'{esc(direction)} ({what})</span>{chips}</div>')
    return "".join(rows)


def step_html(step: Step) -> str:
    if step.kind == "config":
        return f"<h3>Configuration</h3>{config_html(step.info)}"
    if step.kind == "image":
        shape = step.shape or Shape()
        return (f'<figure class="image"><figcaption>{esc(step.label)}, {len(step.data)}B'
                f"</figcaption>{image_svg(step.label, step.data, shape)}</figure>")
    if step.kind == "segments":
        return (f'<figure class="image"><figcaption>{esc(step.label)}, {len(step.data)}B'
                f"</figcaption>{segments_svg(step.label, step.data, step.cuts)}</figure>")
    if step.kind == "op":
        pipe = pipeline_html(step.stages)
        stages = (f"<div>Pipeline stages traced by the daemons:</div>{pipe}" if pipe else "")
        return (f'<div class="op"><div><b>wire</b> <span class="mono">{esc(step.text)}</span>'
                f"</div>{stages}</div>")
    if step.kind in ("check", "mkey_check"):
        if step.ok is None:
            mark = '<span class="mark">·</span>'
        else:
            mark = '<span class="ok">ok</span>' if step.ok else '<span class="bad">BAD</span>'
        why = f": {esc(step.why)}" if step.why else ""
        cls = "mkey" if step.kind == "mkey_check" else "check"
        return (f'<div class="{cls}"><b>{esc(step.label or step.kind)}</b> {mark} '
                f'<span class="mono">{esc(step.text)}</span>{why}</div>')
    if step.kind == "raw":
        return f'<pre class="raw">{esc(step.text)}</pre>'
    label = f"<b>{esc(step.label)}</b> " if step.label else ""
    return f'<div class="note">{label}<span class="mono">{esc(step.text)}</span></div>'


@dataclass(frozen=True)
class Meta:
    """What the report says about an example beside its record."""

    heading: str            # e.g. "mlx5dv_wr_set_mkey_sig_block(3), Example 2.1"
    stated: str             # the man page's stated result (or a fault case's why)
    stated_label: str = "The man page states"


def example_html(rec: Record, meta: Meta | None, index: int) -> str:
    passed = rec.outcome.passed
    verdict = "PASS" if passed else "FAIL"
    cls = "pass" if passed else "fail"
    out = [f'<section class="example {cls}" id="{anchor(rec.name)}" '
           f'data-example="{esc(rec.name)}" data-verdict="{verdict}">',
           f'<h2><span class="badge {cls}">{verdict}</span> {index}. {esc(rec.name)}</h2>']
    if meta is not None:
        out.append(f'<p class="where">{esc(meta.heading)}</p>')
        out.append(f'<blockquote class="result"><b>{esc(meta.stated_label)}:</b> '
                   f"{esc(meta.stated)}</blockquote>")
    if not passed:
        out.append('<div class="reasons">Failed: ' +
                   "; ".join(esc(r) for r in rec.outcome.reasons) + "</div>")
    checks = [s for s in rec.steps if s.kind == "mkey_check"]
    if checks:
        items = "".join(f"<li class=\"mono\">{esc(s.text)}"
                        + ("" if s.ok is None else " — " + ("as expected" if s.ok else
                                                             f"NOT as expected: {esc(s.why)}"))
                        + "</li>" for s in checks)
        out.append(f'<div class="mkeysum"><b>mkey_check, both sides, in order:</b>'
                   f"<ul>{items}</ul></div>")
    if not rec.traced and any(s.kind == "op" for s in rec.steps):
        out.append('<p class="meta">No pipeline trace was recorded for this run.</p>')
    out.append('<h3>What ran, in order</h3>')
    out.extend(step_html(s) for s in rec.steps)
    out.append("</section>")
    return "\n".join(out)


def machine_text() -> str:
    try:
        from importlib.metadata import version
        ver = version("softhca")
    except Exception:  # noqa: BLE001 - a version is nice to have, never required
        ver = "?"
    return (f"{platform.node() or 'unknown host'} · {platform.system()} {platform.release()} "
            f"{platform.machine()} · Python {platform.python_version()} · softhca {ver} · "
            f"{os.cpu_count() or 1} CPUs")


def render(records: list[Record], metas: dict[str, Meta], *, title: str,
           intro: str, now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.timezone.utc)
    n = len(records)
    failed = [r for r in records if not r.outcome.passed]
    nav = "".join(f'<li><a href="#{anchor(r.name)}">{esc(r.name)}</a> '
                  f'<span class="badge {"pass" if r.outcome.passed else "fail"}">'
                  f'{"PASS" if r.outcome.passed else "FAIL"}</span></li>' for r in records)
    body = "\n".join(example_html(r, metas.get(r.name), k) for k, r in enumerate(records, 1))
    drawn = any(s.kind in ("image", "segments") for r in records for s in r.steps)
    legend = ('<div class="legend"><b>Legend</b> (diagrams are not to scale: every block gets '
              "one row, PI fields a fixed width; hover a rectangle for its byte offset and "
              f"value){legend_svg()}</div>") if drawn else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)}</title>
<style>{CSS}</style>
</head>
<body>
<header>
<h1>{esc(title)}</h1>
<p class="meta">Run on {esc(machine_text())}</p>
<p class="meta">Date: {esc(now.strftime("%Y-%m-%d %H:%M:%S %Z").strip())}</p>
<p class="summary" data-pass="{n - len(failed)}" data-fail="{len(failed)}">
<span class="n-pass">{n - len(failed)} PASS</span> / <span class="n-fail">{len(failed)} FAIL</span>
of {n}</p>
<p>{esc(intro)}</p>
{legend}
<nav><ol>{nav}</ol></nav>
</header>
<main>
{body}
</main>
<footer>softhca demo --html · self-contained: inline CSS and SVG, no scripts, no network</footer>
</body>
</html>
"""


# -- running and writing ---------------------------------------------------------------------

DEMO_INTRO = ("Every example of mlx5dv_wr_set_mkey_sig_block(3), mlx5dv_wr_set_mkey_crypto(3) "
              "and mlx5dv_wr_mkey_configure(3), run end to end between two embedded daemons "
              "(a target owning the MKEY and an initiator with plain MRs) over TCP, and judged "
              "against what the page states with an independent computation (crcmod, "
              "cryptography's XTS). Images are the bytes as they were: memory read back, the "
              "wire as the daemons' taps saw it.")
FAULTS_INTRO = ("Fault rules installed on one daemon's wire path; for each case the rule, the "
                "block it hit before and after, the completion, mkey_check and the recovery "
                "counters, judged by an independent oracle.")


def _demo_metas() -> dict[str, Meta]:
    return {e.name: Meta(f"{e.page}, {e.where}", e.result) for e in demo.EXAMPLES}


def _faults_metas() -> dict[str, Meta]:
    from . import demo_faults
    return {c.name: Meta(c.title, c.why, "Why") for c in demo_faults.CASES}


def run(only: list[str] | None, path: str, *, faults: bool = False,
        out: TextIO | None = None, color: bool | None = None) -> list[harness.Outcome]:
    """Run the examples (or the fault cases) as ``softhca demo`` does, printing the same
    text, and write the HTML report to ``path``. Raises UnknownExample for a bad name
    before anything runs."""
    if faults:
        from . import demo_faults
        module, metas, title, intro = (demo_faults, _faults_metas(),
                                       "softhca demo faults: fault injection walk-through",
                                       FAULTS_INTRO)
        module.select(only)
    else:
        module, metas, title, intro = (demo, _demo_metas(),
                                       "softhca demo: the man pages' examples", DEMO_INTRO)
        module.select(only)
    # Opened before anything runs, so that a path that cannot be written fails at once
    # (an OSError naming the file).
    with open(path, "w", encoding="utf-8") as f:
        records: list[Record] = []
        token = harness.RECORDING.set(records)
        try:
            outcomes = module.run(only, out=out, color=color)
        finally:
            harness.RECORDING.reset(token)
        f.write(render(records, metas, title=title, intro=intro))
    return outcomes


def main_note(path: str, stream: TextIO | None = None) -> None:
    """The one line ``softhca demo --html`` adds, on stderr (stdout stays as without it)."""
    size = os.path.getsize(path)
    (stream or sys.stderr).write(f"softhca demo: HTML report written to {path} ({size} bytes)\n")
