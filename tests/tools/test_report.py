"""``softhca demo --html FILE``: the self-contained HTML report of the walk-through.

Structure (html.parser): every example has its section with its verdict, its
configuration, its pipeline stages as the daemons traced them, and block diagrams
(SVG rectangles) of its images; nothing refers to the network or to another file;
everything from a run is escaped; the printed text is the same as without --html.
Then the browser test: the report opened in headless Chromium (Debian's chromium
package, installed when missing and running as root, else the test is skipped),
rendered to a DOM that holds every example's diagram and to a screenshot that is
kept in the test's tmp_path.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import pytest

from softhca.tools import crypto_table, demo, harness, render, report
from softhca.tools.cli import main

BROWSER_TIMEOUT = 120
INSTALL_TIMEOUT = 600
FEW = ["sig_block 2.1", "crypto row C", "mkey_configure interleaved"]


class Page(HTMLParser):
    """What the tests look at in a report: sections, their SVGs and rectangles, the
    stages of their pipelines, and every attribute that could fetch something."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.sections: dict[str, dict] = {}
        self.current: dict | None = None
        self.depth = 0                  # <section> nesting inside the current example
        self.in_svg = False
        self.refs: list[tuple[str, str, str]] = []       # (tag, attribute, value)
        self.tags: set[str] = set()
        self.styles: list[str] = []
        self._in_style = False
        self.summary: dict[str, str] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        for k, v in a.items():
            if k in ("src", "href", "xlink:href", "srcset", "action", "data", "poster"):
                self.refs.append((tag, k, v))
            if k == "style":
                self.styles.append(v)
        if tag == "style":
            self._in_style = True
        if tag == "p" and "data-pass" in a:
            self.summary = a
        if tag == "section" and "data-example" in a:
            self.current = {"verdict": a["data-verdict"], "svgs": 0, "rects": 0, "kinds": set(),
                            "stages": [], "config": False, "labels": []}
            self.sections[a["data-example"]] = self.current
            self.depth = 1
            return
        if self.current is None:
            return
        if tag == "section":
            self.depth += 1
        if tag == "svg":
            self.current["svgs"] += 1
            self.current["labels"].append(a.get("data-label", ""))
            self.in_svg = True
        if tag == "rect" and self.in_svg:
            self.current["rects"] += 1
            self.current["kinds"].add(a.get("data-kind"))
        if tag == "table" and "config" in a.get("class", ""):
            self.current["config"] = True
        if "data-direction" in a:
            self.current["stages"].append([a["data-direction"]])
        if "data-stage" in a and self.current["stages"]:
            self.current["stages"][-1].append(a["data-stage"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False
        if tag == "svg":
            self.in_svg = False
        if tag == "section" and self.current is not None:
            self.depth -= 1
            if self.depth == 0:
                self.current = None

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)
        self.text.append(data)


def parse(html_text: str) -> Page:
    page = Page()
    page.feed(html_text)
    page.close()
    return page


def assert_self_contained(page: Page, html_text: str) -> None:
    """No script, no external resource: links are in-page anchors only, CSS fetches
    nothing, and the only URL is the SVG namespace (an identifier, never fetched)."""
    assert not page.tags & {"script", "link", "img", "iframe", "object", "embed", "base"}
    for tag, attr, value in page.refs:
        assert value.startswith("#"), f"<{tag} {attr}={value!r}> refers outside the page"
    for css in page.styles:
        assert "url(" not in css and "@import" not in css, css[:200]
    urls = set(re.findall(r"\b(?:https?|file|ftp)://[^\s\"'<>]+", html_text))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls


def without_ports(text: str) -> str:
    """The text without what differs from run to run: ports, QP numbers and keys, which
    a daemon draws at random, and PSNs, which each QP starts at a random one."""
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)
    text = re.sub(r"\bpsn 0x[0-9a-f]+", "psn 0xN", text)
    return re.sub(r"\b(QP|MKEY|MR|mr\d|DEK|qp_num=|[lr]?key[ =])\s?0x[0-9a-f]+", r"\1 0xN", text)


def test_report_of_a_few_examples(tmp_path, capsys):
    path = tmp_path / "report.html"
    args = [x for name in FEW for x in ("--only", name)]
    assert main(["demo", *args, "--html", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"HTML report written to {path}" in captured.err
    # The printed text is exactly that of the same run without --html.
    assert main(["demo", *args]) == 0
    assert without_ports(captured.out) == without_ports(capsys.readouterr().out)

    text = path.read_text(encoding="utf-8")
    page = parse(text)
    assert_self_contained(page, text)
    assert page.summary["data-pass"] == "3" and page.summary["data-fail"] == "0"
    assert list(page.sections) == FEW
    for name, sec in page.sections.items():
        assert sec["verdict"] == "PASS", name
        assert sec["config"], f"{name}: no configuration table"
        assert sec["svgs"] >= 1 and sec["rects"] >= sec["svgs"], (name, sec)
        assert sec["stages"], f"{name}: no pipeline stages"
    # sig_block 2.1: the daemons' trace, in the man page's order (receive, validate the
    # T10-DIF of each 4096-byte block, strip, scatter), and the T10-DIF fields drawn.
    sig = page.sections["sig_block 2.1"]
    assert ["RX", "wire", "check", "strip", "scatter"] in sig["stages"]
    assert {"data", "guard", "app", "ref"} <= sig["kinds"]
    assert sig["labels"][:3] == ["initiator memory", "wire (RDMA_WRITE)", "target memory"]
    # crypto row C: gather, generate the T10-DIF, encrypt data and PI, to the wire; the
    # wire image is ciphertext with its PI encrypted too.
    row_c = page.sections["crypto row C"]
    assert ["TX", "gather", "generate", "encrypt", "wire"] in row_c["stages"]
    assert {"enc", "encpi"} <= row_c["kinds"]
    # The interleaved layout: MR ranges drawn, the skipped bytes as zeros.
    assert {"data", "zeros"} <= page.sections["mkey_configure interleaved"]["kinds"]
    body = "".join(page.text)
    assert re.search(r"guard 0x[0-9a-f]{4}", body) and "app 0x5a5a" in body
    assert re.search(r"target MKEY 0x[0-9a-f]+: BAD_GUARD actual 0x[0-9a-f]{4} expected "
                     r"0x[0-9a-f]{4} offset 8208", body)
    assert "initiator: no MKEY (plain MRs only), nothing to check" in body
    assert "mlx5dv_wr_set_mkey_sig_block(3), Example 2.1" in body
    assert "SIGNATURE_BEFORE_CRYPTO_ON_TX" in body and "data_unit_size" in body
    assert "The man page states:" in body


def test_report_shows_a_fail(tmp_path, wrong_demo_oracle, capsys):
    """An oracle that disagrees: the section says FAIL and why, the summary counts it."""
    path = tmp_path / "fail.html"
    assert main(["demo", "--only", "sig_block 2", "--html", str(path)]) == 1
    capsys.readouterr()
    page = parse(path.read_text(encoding="utf-8"))
    assert page.sections["sig_block 2"]["verdict"] == "FAIL"
    assert page.summary["data-pass"] == "0" and page.summary["data-fail"] == "1"
    assert "blk 1 ref 0x00001001, expected 0x00001000" in "".join(page.text)


def test_everything_from_a_run_is_escaped():
    rec = harness.Record('<script>alert("x")</script>', harness.Outcome("x"))
    rec.outcome.reasons.append("a <b> & c")
    rec.steps += [harness.Step("note", "<i>", "1 < 2 & \"3\""),
                  harness.Step("image", "<svg onload=x>", data=bytes(1040),
                            shape=render.Shape(512, crypto_table.SIG)),
                  harness.Step("raw", text="</pre><script>")]
    text = report.render([rec], {}, title="<t>", intro="&")
    assert "<script" not in text and "<i>" not in text and "<svg onload" not in text
    assert "&lt;script&gt;" in text and "1 &lt; 2 &amp; &quot;3&quot;" in text
    page = parse(text)
    assert_self_contained(page, text)
    assert page.sections['<script>alert("x")</script>']["verdict"] == "FAIL"


def test_unwritable_report_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "no such dir" / "r.html"
    assert main(["demo", "--only", "sig_block 1", "--html", str(bad)]) == 2
    out = capsys.readouterr()
    assert "No such file or directory" in out.err and "PASS" not in out.out


def test_report_of_the_fault_walk_through(tmp_path, capsys):
    path = tmp_path / "faults.html"
    assert main(["demo", "faults", "--only", "guard", "--html", str(path)]) == 0
    capsys.readouterr()
    text = path.read_text(encoding="utf-8")
    page = parse(text)
    assert_self_contained(page, text)
    assert page.sections["guard"]["verdict"] == "PASS" and page.sections["guard"]["config"]
    assert re.search(r"BAD_GUARD actual 0x[0-9a-f]{4} expected 0x[0-9a-f]{4} offset 1560",
                     "".join(page.text))


# -- the browser ----------------------------------------------------------------------------

CHROMIUM_PACKAGE = "chromium"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium: found, or installed with apt-get when running as root."""
    found = shutil.which("chromium") or (os.path.exists("/usr/bin/chromium")
                                         and "/usr/bin/chromium")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip(f"no headless browser: Debian package '{CHROMIUM_PACKAGE}' is not "
                    "installed and installing it needs root")
    cmd = ("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
           f"--no-install-recommends {CHROMIUM_PACKAGE}")
    try:
        done = subprocess.run(cmd, shell=True, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.skip(f"installing Debian package '{CHROMIUM_PACKAGE}' took more than "
                    f"{INSTALL_TIMEOUT} s")
    found = shutil.which("chromium")
    if done.returncode != 0 or not found:
        pytest.skip(f"could not install Debian package '{CHROMIUM_PACKAGE}' "
                    f"(apt-get exit {done.returncode}): {done.stderr.strip()[-300:]}")
    return found


def browser(chromium: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    # No network at all: every host name resolves to nothing, so a page that needed
    # one would show it (and the report must not).
    cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
           "--no-first-run", "--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND",
           f"--user-data-dir={cwd / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=BROWSER_TIMEOUT,
                          cwd=cwd)


def _unfilter(f: int, line: bytearray, prev: bytearray, bpp: int) -> bytearray:
    """One row's PNG filter undone (PNG specification, section 9): each byte plus its
    predictor from the left (``a``), up (``b``) and up-left (``c``) bytes, modulo 256. One
    loop per filter type; Up, the type most rows of a screenshot have, adds the two
    rows as whole integers, byte by byte without carries between bytes."""
    stride = len(line)
    if f == 2:
        low, high = int.from_bytes(b"\x7f" * stride, "big"), int.from_bytes(b"\x80" * stride, "big")
        x, b = int.from_bytes(line, "big"), int.from_bytes(prev, "big")
        return bytearray((((x & low) + (b & low)) ^ ((x ^ b) & high)).to_bytes(stride, "big"))
    if f == 1:
        for i in range(bpp, stride):
            line[i] = (line[i] + line[i - bpp]) & 0xFF
    elif f == 3:
        for i in range(stride):
            line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 0xFF
    elif f == 4:
        for i in range(min(bpp, stride)):
            line[i] = (line[i] + prev[i]) & 0xFF    # a = c = 0: the predictor is b
        # a = line[i - bpp], already unfiltered (zip reads the bytearray as it goes); the
        # range is the shortest of the four, hence not strict.
        left = memoryview(line)
        for i, a, b, c in zip(range(bpp, stride), left, prev[bpp:], prev, strict=False):
            pb, pa = a - c, b - c
            pc = abs(pa + pb)
            pa, pb = abs(pa), abs(pb)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    return line


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """A small PNG decoder (8-bit RGB or RGBA, not interlaced): width, height, and the
    unfiltered rows (RGB)."""
    raw = path.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, ihdr = 8, b"", None
    while pos < len(raw):
        length, kind = struct.unpack(">I4s", raw[pos:pos + 8])
        chunk = raw[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, ctype, _, _, interlace = ihdr
    assert depth == 8 and ctype in (2, 6) and interlace == 0, ihdr
    bpp = 3 if ctype == 2 else 4
    data = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = data[y * (stride + 1)]
        assert f <= 4, f"row {y}: filter type {f}"
        line = _unfilter(f, bytearray(data[y * (stride + 1) + 1:(y + 1) * (stride + 1)]),
                         prev, bpp)
        rgb = bytearray(line)
        if bpp == 4:
            del rgb[3::4]       # the alpha bytes
        rows.append(bytes(rgb))
        prev = line
    return width, height, rows


def test_report_renders_in_headless_chromium(chromium, tmp_path, capsys):
    path = tmp_path / "report.html"
    assert main(["demo", "--html", str(path)]) == 0
    capsys.readouterr()
    names = [e.name for e in demo.EXAMPLES]

    dom = browser(chromium, "--dump-dom", path.as_uri(), cwd=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "</html>" in dom.stdout
    for bad in ("net::ERR_", "Uncaught", "Failed to load resource", "Refused to"):
        assert bad not in dom.stderr, dom.stderr[-2000:]
    page = parse(dom.stdout)
    assert list(page.sections) == names
    for name, sec in page.sections.items():
        assert sec["verdict"] == "PASS", name
        assert sec["svgs"] >= 1 and sec["rects"] >= 1, f"{name}: no diagram in the DOM"
        assert sec["stages"], f"{name}: no pipeline"

    shot = tmp_path / "report.png"
    done = browser(chromium, f"--screenshot={shot}", "--window-size=1400,3000",
                   "--hide-scrollbars", path.as_uri(), cwd=tmp_path)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    # Into pytest's capture: shown with the report of a failing assertion below.
    print(f"report screenshot: {shot} ({shot.stat().st_size} bytes)")
    assert shot.stat().st_size > 20_000
    width, height, rows = png_pixels(shot)
    assert (width, height) == (1400, 3000)
    # Not one colour: the page's background, text and the diagrams' fills (the data
    # blue, the guard orange, the ciphertext slate ...) are all there.
    sample = b"".join(rows[::10])
    colours = {sample[k:k + 3] for k in range(0, len(sample), 3)}
    assert len(colours) > 50, len(colours)
    for rgb in ("dbeafe", "fde047"):   # data, CRC
        assert bytes.fromhex(rgb) in colours, f"no #{rgb} pixel in the screenshot"
