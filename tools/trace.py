"""``softhca trace``: the live pipeline of a running daemon, per work request.

Attaches to a daemon as a control session, subscribes to its "trace" events (one per
stage a transfer goes through: gather, check, strip, generate, encrypt, decrypt,
wire, scatter; see engine/transfer.py) and prints them grouped per transfer: a header
line naming the QP, the operation, the work request (wr_id) or packet (PSN) and the
key, then one line per stage with its stream, offset and length, and the bytes of the
first and last blocks cut into fields (data, guard, app tag, ref tag, CRC,
ciphertext), coloured on a terminal. ``--json`` prints every event as one JSON object
per line instead, its bytes in hex.

The events carry the stage's bytes but not the MKEY's configuration (which belongs to
another session), so the block geometry is worked out from the transfer itself: the
PI sizes from the check / strip / generate details, the number of blocks from the
check results (or the length difference between the memory and wire streams), the
block size from the lengths and offsets. Which bytes are ciphertext follows from where
the encrypt or decrypt stage sits (docs/semantics.md section 8).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from ..client.token_file import read_token
from ..protocol.enums import BLOCK_SIZE_BYTES, T10DIF_PI_BYTES, MkeyErrType
from .cliargs import daemon_address, nonneg_int, positive_float, positive_int
from .render import Style, preview, t10dif_fields, use_color

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
TX, RX = "TX", "RX"
SIG_STAGES = ("check", "strip", "generate")
CRYPTO_STAGES = ("encrypt", "decrypt")
BLOCK_SIZES = tuple(BLOCK_SIZE_BYTES.values())
# enum mlx5dv_mkey_err_type (REFTAG is numerically before APPTAG).
ERR_NAMES = {int(e): e.name for e in MkeyErrType}
M64 = 0xFFFFFFFFFFFFFFFF
# How long the stream may be quiet before a transfer still open is printed: the stages
# of one transfer are pushed together, so a pause means it is complete (an MR's TX
# transfer has a gather stage only).
IDLE = 0.2
# Header fields that name the transfer an event belongs to.
GROUP_FIELDS = ("daemon", "dev", "qp", "role", "wr_id", "psn", "op", "direction", "key")


# -- grouping events into transfers -------------------------------------------------------

@dataclass
class Stage:
    header: dict
    data: bytes

    @property
    def name(self) -> str:
        return self.header.get("stage", "?")

    @property
    def detail(self) -> dict:
        return self.header.get("detail") or {}


@dataclass
class Transfer:
    """The stages of one transfer through one key, in order."""

    group: tuple
    stages: list[Stage] = field(default_factory=list)

    @property
    def header(self) -> dict:
        return self.stages[0].header

    @property
    def direction(self) -> str:
        return self.header.get("direction", "?")

    def names(self) -> list[str]:
        return [s.name for s in self.stages]


def group_of(h: dict) -> tuple:
    return tuple(h.get(k) for k in GROUP_FIELDS)


def starts_transfer(h: dict) -> bool:
    return (h.get("direction") == TX and h.get("stage") == "gather") or \
        (h.get("direction") == RX and h.get("stage") == "wire")


def ends_transfer(h: dict) -> bool:
    return (h.get("direction") == TX and h.get("stage") == "wire") or \
        (h.get("direction") == RX and h.get("stage") == "scatter")


class Grouper:
    """Feeds events in, hands complete transfers to ``emit``: a transfer ends with its
    last stage (wire on TX, scatter on RX), when the next one starts, or on ``flush``."""

    def __init__(self, emit: Callable[[Transfer], None]) -> None:
        self.emit = emit
        self.pending: Transfer | None = None

    def feed(self, header: dict, data: bytes) -> None:
        g = group_of(header)
        if self.pending is not None and (starts_transfer(header) or g != self.pending.group):
            self.flush()
        if self.pending is None:
            self.pending = Transfer(g)
        self.pending.stages.append(Stage(header, data))
        if ends_transfer(header):
            self.flush()

    def flush(self) -> None:
        if self.pending is not None:
            t, self.pending = self.pending, None
            self.emit(t)


def group_events(events) -> list[Transfer]:
    """(header, data) pairs to transfers, for tests and scripts."""
    out: list[Transfer] = []
    g = Grouper(out.append)
    for h, d in events:
        g.feed(h, d)
    g.flush()
    return out


# -- the block geometry of a transfer ---------------------------------------------------

@dataclass(frozen=True)
class Geometry:
    block: int
    pi: dict            # memory / wire -> PI bytes per block
    kinds: dict         # memory / wire -> t10dif | crc | "" (no PI)
    n: int              # full blocks
    first: int          # MKEY block index of the first


def _stream_event(t: Transfer, stream: str) -> Stage | None:
    """The event holding a whole stream: gather or scatter (memory), wire (wire)."""
    names = {"memory": ("gather", "scatter"), "wire": ("wire",)}[stream]
    for s in t.stages:
        if s.name in names and s.header.get("stream") == stream:
            return s
    return None


def geometry(t: Transfer) -> Geometry | None:
    sig = [s for s in t.stages if s.name in SIG_STAGES]
    if not sig:
        return None
    pi, n = _pi_sizes(t, sig)
    mem, wire = _stream_event(t, "memory"), _stream_event(t, "wire")
    if mem is None or wire is None:
        return None
    lm, lw = len(mem.data), len(wire.data)
    om, ow = int(mem.header.get("offset", 0)), int(wire.header.get("offset", 0))
    pm, pw = pi["memory"], pi["wire"]
    if n is None:
        if pm == pw or (lm - lw) % (pm - pw):
            return None
        n = (lm - lw) // (pm - pw)
    if n <= 0:
        return None
    bs = _block_size(n, (lm, om, pm), (lw, ow, pw))
    if bs is None:
        return None
    kinds = {side: _kind(t, side, bs, pi[side]) for side in ("memory", "wire")}
    return Geometry(bs, pi, kinds, n, ow // (bs + pw))


def _pi_sizes(t: Transfer, sig: list[Stage]) -> tuple[dict, int | None]:
    """The PI bytes per block of each stream, and the number of blocks when a check
    stage reported one result per block."""
    src, dst = ("memory", "wire") if t.direction == TX else ("wire", "memory")
    pi = {"memory": 0, "wire": 0}
    n = None
    for s in sig:
        d = s.detail
        if s.name == "check":
            pi[src] = int(d.get("domain_pi", 0))
            n = len(d.get("results") or [])
        elif s.name == "strip":
            pi[src] = int(d.get("pi_size", 0))
        else:
            pi[dst] = int(d.get("pi_size", 0))
    return pi, n


def _block_size(n: int, memory: tuple[int, int, int], wire: tuple[int, int, int]) -> int | None:
    """The block size that cuts both streams ((length, offset, PI bytes per block) each)
    into ``n`` blocks at the same block index, with the shortest tail; failing that, the
    wire's length shared out over ``n`` blocks (None when it does not divide)."""
    (lm, om, pm), (lw, ow, pw) = memory, wire
    best = None
    for bs in BLOCK_SIZES:
        m, w = bs + pm, bs + pw
        tail = lw - n * w
        if not (0 <= tail <= bs and lm - n * m == tail):
            continue
        if ow % w or om % m or ow // w != om // m:
            continue
        if best is None or tail < best[1]:
            best = (bs, tail)
    if best is not None:
        return best[0]
    if (lw - n * pw) % n:
        return None
    bs = (lw - n * pw) // n
    return bs if bs > 0 else None


def _kind(t: Transfer, side: str, bs: int, pi: int) -> str:
    """How a domain's PI is cut: t10dif (guard | app | ref), crc (one value) or ""."""
    if pi == 0:
        return ""
    if pi != 8:
        return "crc"
    # 8 bytes: a T10-DIF or a CRC64_XP10. A reported APPTAG or REFTAG error says T10-DIF;
    # otherwise a block whose PI is the CRC64_XP10 of its data says CRC64.
    for s in t.stages:
        if s.name == "check" and any(r in (2, 3) for r in s.detail.get("results") or []):
            return "t10dif"
    states = cipher_states(t)
    for s, (_, pi_enc) in zip(t.stages, states, strict=True):
        if s.header.get("stream") != side or pi_enc or s.name == "check":
            continue
        if len(s.data) < bs + 8:
            continue
        block, stored = s.data[:bs], int.from_bytes(s.data[bs:bs + 8], "big")
        # Here, not at the top: building `softhca`'s parser imports this module, and
        # --help should not load the engine.
        from ..engine.guards import guard

        if stored in (guard("crc64_xp10", block, 0), guard("crc64_xp10", block, M64)):
            return "crc64"
        return "t10dif"
    return "t10dif"


def cipher_states(t: Transfer) -> list[tuple[bool, bool]]:
    """Per stage, whether its bytes' data and PI are ciphertext (docs/semantics.md 8): what an
    encrypt stage outputs is; a signature generated afterwards is in the clear; what
    enters a decrypt stage is, and so is the data (not the PI) of the stream before
    the signature stages that feed it."""
    names = t.names()
    states = [(False, False)] * len(names)
    where = [i for i, n in enumerate(names) if n in CRYPTO_STAGES]
    if not where:
        return states
    i = where[0]
    if names[i] == "encrypt":
        state = (False, False)
        for k, n in enumerate(names):
            if k == i:
                state = (True, True)
            elif k > i and n in SIG_STAGES:
                state = (True, False)
            states[k] = state
    else:
        for k in range(i):
            if names[k] in SIG_STAGES:
                states[k] = (True, True)
            else:
                later_sig = any(names[j] in SIG_STAGES for j in range(k + 1, i))
                states[k] = (True, not later_sig)
    return states


# -- rendering ----------------------------------------------------------------------------

def pi_text(pi: bytes, kind: str, style: Style) -> str:
    if kind == "t10dif" and len(pi) == T10DIF_PI_BYTES:
        return " ".join(style(name, f"{name} 0x{value:0{digits}x}")
                        for name, value, digits in t10dif_fields(pi))
    name = "crc64" if kind == "crc64" else "crc"
    return style("crc", f"{name} 0x{int.from_bytes(pi, 'big'):0{2 * len(pi)}x}")


def block_lines(data: bytes, geo: Geometry | None, side: str, state: tuple[bool, bool],
                style: Style, max_blocks: int) -> list[str]:
    """The stage's bytes, block by block (the first ones and the last)."""
    data_enc, pi_enc = state
    if geo is None or geo.n * (geo.block + geo.pi[side]) > len(data):
        if not data:
            return []
        what = style("enc", f"enc {len(data)}B") if data_enc else style("data", f"{len(data)}B")
        return [f"{what} {preview(data)}"]
    bs, pi, kind = geo.block, geo.pi[side], geo.kinds[side]
    w = bs + pi
    n, tail = geo.n, len(data) - geo.n * w
    head = max(1, max_blocks - 1)
    # The first blocks, "...", the last; all of them when that would hide one block only.
    shown: list[int | None] = list(range(n)) if n <= head + 2 else [*range(head), None, n - 1]
    lines = []
    for b in shown:
        if b is None:
            lines.append(style("dim", f"... {n - head - 1} more blocks ..."))
            continue
        blk = data[b * w:(b + 1) * w]
        label = f"blk {geo.first + b:<4}"
        if pi and data_enc and pi_enc:
            lines.append(f"{label} " + style("enc", f"enc {w}B") + f" {preview(blk)}  "
                         + style("dim", f"(data {bs} + PI {pi}, all ciphertext)"))
            continue
        body = (style("enc", f"enc {bs}B") if data_enc else style("data", f"data {bs}B")) \
            + f" {preview(blk[:bs])}"
        if pi:
            body += " | " + pi_text(blk[bs:], kind, style)
        lines.append(f"{label} {body}")
    if tail > 0:
        lines.append(f"tail     {tail}B {preview(data[n * w:])} " + style("dim", "(no PI)"))
    return lines


def _tweak(v) -> str:
    if isinstance(v, str):
        try:
            v = int(v, 16)
        except ValueError:
            return v
    return f"0x{int(v):032x}" if isinstance(v, int) else str(v)


def _results_text(results: list[int], first: int, style: Style) -> str:
    if not results:
        return "no full block"
    named = [ERR_NAMES.get(int(r), str(r)) for r in results]
    if len(named) <= 8:
        return ", ".join(style("ok" if r == "NO_ERR" else "bad", f"blk {first + b} {r}")
                         for b, r in enumerate(named))
    bad = [(b, r) for b, r in enumerate(named) if r != "NO_ERR"]
    if not bad:
        return style("ok", f"{len(named)} blocks NO_ERR")
    shown = ", ".join(style("bad", f"blk {first + b} {r}") for b, r in bad[:8])
    more = f" (+{len(bad) - 8} more)" if len(bad) > 8 else ""
    return f"{shown}{more}; " + style("ok", f"{len(named) - len(bad)} blocks NO_ERR")


PI_COL_NAMES = {"t10dif": ("guard",) * 2 + ("app",) * 2 + ("ref",) * 4}


def _copied_text(cols: list[int], kind: str, pi: int) -> str:
    if not cols:
        return "all generated"
    names = PI_COL_NAMES.get(kind)
    if names and len(names) == pi:
        fields = []
        for c in cols:
            if names[c] not in fields:
                fields.append(names[c])
        return f"copied PI bytes {','.join(map(str, cols))} ({', '.join(fields)}), rest generated"
    return f"copied PI bytes {','.join(map(str, cols))}, rest generated"


def header_line(t: Transfer, style: Style) -> str:
    h = t.header
    op, role = h.get("op", "?"), h.get("role", "?")
    which = f"psn 0x{int(h['psn']):x}" if h.get("psn") is not None else \
        f"wr_id {h.get('wr_id')}" if h.get("wr_id") is not None else ""
    keyname = "rkey" if role == "responder" and op in ("RDMA_WRITE", "RDMA_READ") else "lkey"
    qp = h.get("qp")
    qp_text = f"QP 0x{int(qp):x}" if isinstance(qp, int) else "QP ?"
    key = h.get("key")
    key_text = f"{keyname} 0x{int(key):x}" if isinstance(key, int) else keyname
    text = f"{qp_text} {op} {role} {which}, {key_text}, {t.direction}"
    where = " ".join(str(x) for x in (h.get("dev"), h.get("daemon")) if x)
    return style("head", text) + (style("dim", f"  [{where}]") if where else "")


# What a stage's offset is (the event's ``at``, engine/transfer.py TraceEvent), as the
# trace labels it: an offset into the MKEY's stream or into the MR, or a virtual address
# the RETH named (a remote access into this MR) or a local SGE holds (a receive buffer,
# where a READ's responses land).
WHERE = {"mkey": "mkey+0x{:x}", "mr": "mr+0x{:x}", "reth": "reth va 0x{:x}",
         "sge": "sge va 0x{:x}"}


def where_text(h: dict) -> str:
    """Where a stage's bytes are, labelled: ``mkey+0x200``, ``mr+0x0``, ``reth va
    0x7f..``, ``sge va 0x7f..``; a daemon that does not say (older) gives ``@0x..``."""
    offset = h.get("offset", 0)
    if not isinstance(offset, int):
        return f"@{offset}"
    return WHERE.get(str(h.get("at")), "@0x{:x}").format(offset)


def render_transfer(t: Transfer, style: Style, max_blocks: int = 3) -> list[str]:
    geo = geometry(t)
    states = cipher_states(t)
    src = "memory" if t.direction == TX else "wire"
    lines = [header_line(t, style)]
    for s, state in zip(t.stages, states, strict=True):
        h, d = s.header, s.detail
        stream = h.get("stream", "?")
        name = style("stage", f"{s.name:<9}")
        if s.name == "check":
            mask = d.get("check_mask")
            mask_text = f"check_mask 0x{int(mask):02x}" if isinstance(mask, int) else ""
            first = geo.first if geo else 0
            line = (f"  {name}{src + ' PI':<16}{mask_text}: "
                    + _results_text(d.get("results") or [], first, style))
            err = d.get("error")
            if isinstance(err, dict) and err.get("err_type"):
                et = ERR_NAMES.get(int(err["err_type"]), err["err_type"])
                line += style("bad", f"; first error {et} actual 0x{int(err['actual_value']):x} "
                                     f"expected 0x{int(err['expected_value']):x} at offset "
                                     f"{err['offset']}")
            lines.append(line)
            continue
        extra = ""
        if s.name in CRYPTO_STAGES:
            extra = (f"AES-XTS, data_unit_size {d.get('data_unit_size')}B, first tweak "
                     f"{_tweak(d.get('first_tweak'))}")
        elif s.name == "generate":
            kind = geo.kinds.get(stream, "") if geo else ""
            extra = (f"PI {d.get('pi_size')}B per block, "
                     + _copied_text(list(d.get("copied_cols") or []), kind,
                                    int(d.get("pi_size", 0))))
        elif s.name == "strip":
            extra = f"PI {d.get('pi_size')}B per block removed"
        if d.get("partial_block"):
            # docs/blocks.md: the tail moved as plain data, neither given nor checked PI.
            extra += style("bad", f"  not whole blocks: the last {d['partial_block']}B are a "
                                  "partial block, plain data (partial-block transfer "
                                  f"#{d.get('partial_block_transfers')} on this MKEY)")
        lines.append(f"  {name}{stream:<7}{where_text(h):<22}{len(s.data):>8}B  "
                     f"{extra}".rstrip())
        for bl in block_lines(s.data, geo, stream, state, style, max_blocks):
            lines.append(f"      {bl}")
    return lines


def event_json(header: dict, data: bytes, max_bytes: int) -> dict:
    """One event as a JSON object: the header without its framing, the bytes in hex
    (the first ``max_bytes`` of them; 0 for all) with their length."""
    out = {k: v for k, v in header.items() if k != "t"}
    shown = data if max_bytes <= 0 else data[:max_bytes]
    out["length"] = len(data)
    out["data"] = shown.hex()
    out["truncated"] = len(shown) < len(data)
    return out


def _json_default(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    return str(v)


# -- the subcommand ---------------------------------------------------------------------

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace", help="print a running daemon's pipeline stages live, per work request",
        description="Attach to a running daemon, daemon-wide (every session's QPs; the "
        "daemon logs such a tap), and print every stage each transfer goes "
        "through (gather, check with its per-block result, strip, generate, encrypt or "
        "decrypt with the data unit and tweak, wire, scatter), grouped per work request, "
        "with the bytes of each block cut into data, guard, app tag, ref tag and "
        "ciphertext. Runs until --count events, --seconds, Ctrl-C or the daemon closes.")
    p.add_argument("--target", required=True, type=daemon_address, metavar="HOST:PORT",
                   help="the daemon")
    p.add_argument("--token-file", metavar="FILE", help="the daemon's token")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per event per line (bytes in hex)")
    p.add_argument("--count", type=positive_int, metavar="N", help="stop after N events")
    p.add_argument("--seconds", type=positive_float, metavar="S", help="stop after S seconds")
    p.add_argument("--max-bytes", type=nonneg_int, default=64, metavar="N",
                   help="--json: hex of the first N bytes of each event (default 64; 0: all)")
    p.add_argument("--blocks", type=positive_int, default=3, metavar="N",
                   help="block lines per stage: the first N-1 and the last (default 3)")
    color = p.add_mutually_exclusive_group()
    color.add_argument("--no-color", action="store_true", help="never colour the output")
    color.add_argument("--color", action="store_true",
                       help="colour the output even when it is not a terminal")
    p.set_defaults(func=run)








class Printer:
    """Writes events as JSON lines, or transfers as text blocks."""

    def __init__(self, out: TextIO, as_json: bool, style: Style, max_bytes: int,
                 max_blocks: int) -> None:
        self.out, self.as_json, self.style = out, as_json, style
        self.max_bytes, self.max_blocks = max_bytes, max_blocks
        self.grouper = Grouper(self._transfer)

    def event(self, header: dict, data: bytes) -> None:
        if self.as_json:
            self.out.write(json.dumps(event_json(header, data, self.max_bytes),
                                      default=_json_default) + "\n")
            self.out.flush()
        else:
            self.grouper.feed(header, data)

    def _transfer(self, t: Transfer) -> None:
        self.out.write("\n".join(render_transfer(t, self.style, self.max_blocks)) + "\n")
        self.out.flush()

    def flush(self) -> None:
        self.grouper.flush()


async def _follow(args: argparse.Namespace, token: bytes | None, printer: Printer,
                  err: TextIO) -> int:
    from .. import client as sh

    try:
        node = await sh.connect(args.target, token=token)
    except sh.RDMAError as e:
        print(f"softhca trace: cannot attach to {args.target}: {e.errno_name}: {e.message}",
              file=err)
        return EXIT_FAIL
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.seconds if args.seconds else None
    seen = 0
    try:
        # Other sessions' transfers: asked daemon-wide, by name (a subscriber otherwise
        # sees its own session's QPs only).
        sub = await node.subscribe("trace", daemon_wide=True)
        stop = []
        if args.count:
            stop.append(f"after {args.count} events")
        if args.seconds:
            stop.append(f"after {args.seconds:g} s")
        stop.append("on Ctrl-C")
        print(f"softhca trace: attached to {node.address}, tracing; stops "
              + ", ".join(stop), file=err, flush=True)
        while args.count is None or seen < args.count:
            timeout = IDLE
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    break
                timeout = min(timeout, left)
            try:
                ev = await asyncio.wait_for(anext(sub), timeout)
            except asyncio.TimeoutError:
                printer.flush()
                continue
            except StopAsyncIteration:
                print(f"softhca trace: the daemon at {node.address} closed the connection",
                      file=err, flush=True)
                break
            if ev.kind == "notice" and not printer.as_json:
                # What the daemon says about a QP beside its transfers (a peer that
                # cannot connect back, server/return_path.py).
                printer.flush()
                h = ev.header
                qp = h.get("qp")
                printer.out.write(printer.style("bad", f"QP {qp:#x} " if isinstance(qp, int)
                                                else "") + f"{h.get('event')}: "
                                  f"{h.get('message')}  [{h.get('dev')} {h.get('daemon')}]\n")
                printer.out.flush()
                seen += 1
                continue
            if ev.kind not in ("trace", "notice"):
                continue
            seen += 1
            printer.event(ev.header, ev.data)
    except sh.RDMAError as e:
        print(f"softhca trace: {e.errno_name}: {e.message}", file=err)
        return EXIT_FAIL
    finally:
        printer.flush()
        await node.close()
    return EXIT_OK


class ProcessFollower:
    """A Follower in a process of its own (``softhca run --trace``): the daemon's loop
    only pushes the events (dropping them, counted, for a reader that falls behind,
    server/session.py); reading, grouping, rendering and writing them happen in another
    interpreter, so they take neither the daemon's loop nor its GIL. The child ends when
    its stdin closes (``stop``, or this process dying), after the stream is quiet."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, address: str, path: str) -> ProcessFollower:
        """Subscribed (daemon-wide) when it returns; OSError with the child's reason
        when it could not attach."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _FOLLOW_MAIN, address, path,
            stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode().strip()
        except asyncio.TimeoutError:
            line = "no answer within 60 s"
        if line != "attached":
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise OSError(line.removeprefix("error: ") or "the trace process ended")
        return cls(proc)

    async def stop(self) -> int:
        """Takes what is still coming (until the stream is quiet), closes the session and
        the file; the number of events written."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        out = (await self.proc.stderr.read()).decode().split()
        await self.proc.wait()
        return int(out[-1]) if out and out[-1].isdigit() else 0


# The child of ProcessFollower: argv[1] the daemon, argv[2] the file.
_FOLLOW_MAIN = "import sys; from softhca.tools.trace import follow_main; " \
    "sys.exit(follow_main(sys.argv[1], sys.argv[2]))"


def follow_main(address: str, path: str) -> int:
    """ProcessFollower's child: attach, say "attached" on stderr, follow until stdin
    closes, then print the number of events written."""
    # Below the daemon's priority: where the CPUs are short, the daemon's packets and
    # ACKs come first; the trace falls behind (its events dropped, counted) instead.
    with contextlib.suppress(OSError):
        os.nice(10)

    async def main() -> int:
        try:
            follower = await Follower.start(address, path)
        except OSError as e:
            print(f"error: {e.strerror or e}", file=sys.stderr, flush=True)
            return 1
        except Exception as e:         # noqa: BLE001 - said to the parent, which raises
            print(f"error: {getattr(e, 'errno_name', type(e).__name__)}: "
                  f"{getattr(e, 'message', e)}", file=sys.stderr, flush=True)
            return 1
        print("attached", file=sys.stderr, flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.buffer.read)
        print(await follower.stop(), file=sys.stderr, flush=True)
        return 0

    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main())
    return 1


class Follower:
    """The trace of a daemon this process runs, written to a file as ``softhca trace``
    prints it (``softhca run --trace FILE``: the daemon ``softhca run`` embeds has no
    address a separate ``softhca trace`` could know before the program starts). A
    control session of the daemon's own, subscribed daemon-wide before the program
    starts, so that none of the program's transfers is missed."""

    def __init__(self, node, sub, printer: Printer, out: TextIO) -> None:
        self.node, self.sub, self.printer, self.out = node, sub, printer, out
        self.events = 0
        self.task = asyncio.ensure_future(self._pump())

    @classmethod
    async def start(cls, address: str, path: str, token: bytes | None = None,
                    as_json: bool = False) -> Follower:
        from .. import client as sh

        out = open(path, "w")  # noqa: SIM115 - closed by stop()
        try:
            node = await sh.connect(address, token=token)
            try:
                sub = await node.subscribe("trace", daemon_wide=True)
            except BaseException:
                await node.close()
                raise
        except BaseException:
            out.close()
            raise
        return cls(node, sub, Printer(out, as_json, Style(False), 64, 3), out)

    async def _pump(self) -> None:
        while True:
            try:
                ev = await asyncio.wait_for(anext(self.sub), IDLE)
            except asyncio.TimeoutError:
                self.printer.flush()
                continue
            except StopAsyncIteration:
                return
            if ev.kind == "trace":
                self.events += 1
                self.printer.event(ev.header, ev.data)

    async def stop(self) -> int:
        """Takes what is still coming (until the stream is quiet for IDLE), closes the
        session and the file; the number of events written."""
        seen = -1
        while seen != self.events and not self.task.done():
            seen = self.events
            await asyncio.sleep(IDLE)
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):  # noqa: S110 - the session is ending
            pass
        self.printer.flush()
        # Events the daemon did not send (this reader fell behind its bounded buffer)
        # or this side let go: said, so that a transfer missing from the trace is
        # known to be missing, not taken for one that never happened.
        lost = getattr(getattr(self.node, "_conn", None), "events_dropped", 0)
        with contextlib.suppress(Exception):
            lost += int((await self.node.counters()).get("events_dropped", 0))
        if lost:
            self.out.write(f"softhca trace: {lost} events dropped: the trace fell behind "
                           "the traffic (the daemon never waits for it)\n")
        await self.node.close()
        self.out.close()
        return self.events


def run(args: argparse.Namespace) -> int:
    token = read_token(args.token_file)
    style = Style(use_color(sys.stdout, args.color, args.no_color))
    printer = Printer(sys.stdout, args.json, style, args.max_bytes, args.blocks)
    try:
        return asyncio.run(_follow(args, token, printer, sys.stderr))
    except KeyboardInterrupt:
        printer.flush()
        return EXIT_OK
