"""Two daemons for one example or fault case, and what it showed.

Every example of ``softhca demo`` (and every case of ``softhca demo faults``) starts
two embedded daemons (softhca.client's ``embedded``), each on its own loopback port
and each driven through its own control session: a *target* that owns the MKEY and an
*initiator* with plain MRs, one RC QP on each (``Side``), connected over TCP with a
1024-byte path MTU so that messages span several packets. Every operation is the verb
the example names, posted through the client. The wire image shown is what crossed
TCP: taps on both daemons (``Daemon.taps``, ``Capture``) see every packet sent during
the operation, and the payloads of the data packets the sending daemon put on the
wire, in PSN order and once each, are the wire image (``Wire``); completions are
polled and must be IBV_WC_SUCCESS. ``Example`` prints what it shows and judges it,
and keeps it as data (``Record``) while the HTML report is being made.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from .. import client as sh
from ..protocol.attrs import SGE, CryptoAttr, SigBlockAttr
from ..protocol.enums import (
    AccessFlags,
    CryptoKeySize,
    MkeyErrType,
    MkeyInitAttrFlags,
    Mlx5dvQpExSendOps,
    WcOpcode,
    WcStatus,
)
from ..protocol.errors import RDMAError
from ..protocol.packets import PSN_MOD, Packet
from .render import (
    Shape,
    Style,
    crypto_text,
    first_difference,
    flag_names,
    image_lines,
    preview,
    segments_line,
    sig_text,
    use_color,
)

LOCAL = AccessFlags.LOCAL_WRITE
REMOTE = AccessFlags.LOCAL_WRITE | AccessFlags.REMOTE_READ | AccessFlags.REMOTE_WRITE
INDIRECT = MkeyInitAttrFlags.INDIRECT
SIG_FLAGS = INDIRECT | MkeyInitAttrFlags.BLOCK_SIGNATURE
CRYPTO_FLAGS = INDIRECT | MkeyInitAttrFlags.CRYPTO
SIG_CRYPTO_FLAGS = SIG_FLAGS | MkeyInitAttrFlags.CRYPTO

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
    async def open(cls, role: str, node: sh.Node, *, cqe: int = 256, max_send_wr: int = 64,
                   max_recv_wr: int = 64, max_sge: int = 4) -> Side:
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        scq, rcq = await ctx.create_cq(cqe), await ctx.create_cq(cqe)
        qp = await pd.create_qp(sh.QPInitAttr(
            qp_type=sh.IBV_QPT_RC, scq=scq, rcq=rcq,
            cap=sh.QPCap(max_send_wr=max_send_wr, max_recv_wr=max_recv_wr,
                         max_send_sge=max_sge, max_recv_sge=max_sge),
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


@contextlib.asynccontextmanager
async def two_daemons(ex: Example, *, trace: bool = False, **connect) -> AsyncIterator[None]:
    """Two embedded daemons for one example or case: ``ex.target`` and ``ex.initiator``
    opened, their QPs taken RESET -> INIT -> RTR -> RTS towards each other (``connect``:
    more attributes for both), and closed at the end."""
    async with sh.embedded() as tnode, sh.embedded() as inode:
        ex.target = await Side.open("target", tnode)
        ex.initiator = await Side.open("initiator", inode)
        await ex.target.qp.connect(ex.initiator.qp.info(), path_mtu=PATH_MTU, **connect)
        await ex.initiator.qp.connect(ex.target.qp.info(), path_mtu=PATH_MTU, **connect)
        if trace and ex.record is not None:
            # The report draws the pipeline stages each daemon traced (softhca trace's
            # events); without a subscriber the daemons do no trace work at all.
            ex.subs = [(side, await side.node.subscribe("trace"))
                       for side in (ex.target, ex.initiator)]
            ex.record.traced = True
        ex.say("daemons", f"target daemon {tnode.address} QP 0x{ex.target.qp.qp_num:x}, "
               f"initiator daemon {inode.address} QP 0x{ex.initiator.qp.qp_num:x}; "
               f"RC over TCP, path MTU {PATH_MTU_BYTES}")
        yield


def whole(mr: sh.MR) -> list[SGE]:
    return [SGE(mr.addr, mr.length, mr.lkey)]


def on_mkey(mkey: sh.MKey, length: int) -> list[SGE]:
    """An SGE on an MKEY: zero-based, its length counted in wire bytes (docs/semantics.md 4, 5)."""
    return [SGE(0, length, mkey.lkey)]


def in_psn_order(packets: list[Packet]) -> list[Packet]:
    """The first copy of each PSN, in PSN order from the first packet's (across the
    24-bit wrap): a retransmitted packet counts once."""
    first: dict[int, Packet] = {}
    for p in packets:
        first.setdefault(p.psn, p)
    base = packets[0].psn if packets else 0
    return sorted(first.values(), key=lambda p: (p.psn - base) % PSN_MOD)


class Capture:
    """Every packet the two daemons send and accept while one operation runs
    (``Daemon.taps``): sent before the sender's "out" fault rules, accepted after them and
    before the receiver's "in" rules (a packet failing its integrity check is dropped
    before the tap)."""

    def __init__(self, sides: tuple[Side, ...]) -> None:
        self.sides = sides
        self.sent: list[tuple[str, Packet]] = []
        self.accepted: list[tuple[str, Packet]] = []
        self._taps: list[tuple[Side, Callable]] = []

    def __enter__(self) -> Capture:
        for side in self.sides:
            def tap(direction: str, dev: str, pkt: Packet, role: str = side.role) -> None:
                (self.sent if direction == "tx" else self.accepted).append((role, pkt))
            side.daemon.taps.append(tap)
            self._taps.append((side, tap))
        return self

    def __exit__(self, *exc) -> None:
        for side, tap in self._taps:
            side.daemon.taps.remove(tap)
        self._taps.clear()

    @staticmethod
    def _data(seen: list[tuple[str, Packet]], role: str, qp: int) -> list[Packet]:
        return [p for r, p in seen if r == role and p.dest_qp == qp
                and p.opcode.startswith(DATA_OPCODES)]

    def wire(self, sender: Side, receiver: Side) -> Wire:
        """The data packets ``sender`` sent to ``receiver``'s QP, once each in PSN order."""
        data = self._data(self.sent, sender.role, receiver.qp.qp_num)
        others = [(role, p) for role, p in self.sent if not p.opcode.startswith(DATA_OPCODES)]
        packets = in_psn_order(data)
        return Wire(b"".join(p.payload for p in packets), packets, len(data) - len(packets),
                    others, sender.role, receiver.role, receiver.qp.qp_num)

    def image_in(self, receiver: Side) -> bytes:
        """The data ``receiver`` accepted on its QP, each PSN's first copy, in PSN order."""
        pkts = self._data(self.accepted, receiver.role, receiver.qp.qp_num)
        return b"".join(p.payload for p in in_psn_order(pkts))


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
            mark = self.style("pass", "ok ") if ok else self.style("bad", "BAD")
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
            # Values are 16, 32 or 64 bits wide (docs/semantics.md 7): pad to the width
            # that holds both.
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
        out.write(f"  {style('pass', 'PASS')}  {o.name}\n\n")
    else:
        more = f" (and {len(o.reasons) - 1} more)" if len(o.reasons) > 1 else ""
        out.write(f"  {style('bad', 'FAIL')}  {o.name}: {o.reasons[0]}{more}\n\n")
    return o


# -- choosing and running a catalogue (the examples, the fault cases) --------------------

class UnknownExample(ValueError):
    """A name given to --only that names no example (or fault case)."""


def _norm(name: str) -> str:
    # "sig_block 1.1", "sig-block-1.1" and "SIG_BLOCK_1.1" name the same example.
    return "".join(ch for ch in name.lower() if ch not in " _-")


def select_entries(catalogue: Sequence, only: list[str] | None, noun: str, plural: str) -> list:
    """The entries named by ``only``: an exact name, else every entry whose name starts
    with it ("crypto row" runs the ten rows); all of them without ``only``."""
    if not only:
        return list(catalogue)
    chosen: list = []
    for want in only:
        key = _norm(want)
        found = [e for e in catalogue if _norm(e.name) == key] or \
            [e for e in catalogue if _norm(e.name).startswith(key)]
        if not found:
            names = ", ".join(e.name for e in catalogue)
            raise UnknownExample(f"no {noun} named {want!r}; the {plural} are: {names}")
        chosen += [e for e in found if e not in chosen]
    return chosen


def run_all(entries: list, run_one: Callable[..., Awaitable[Outcome]], noun: str,
            out: TextIO | None, color: bool | None) -> list[Outcome]:
    """Run ``entries`` one after the other, each printed by ``run_one``, then the count of
    PASS and FAIL. Synchronous: the daemons and the client run on an event loop of their
    own."""
    out = out or sys.stdout
    style = Style(use_color(out) if color is None else color)

    async def play() -> list[Outcome]:
        return [await run_one(e, k, len(entries), out, style) for k, e in enumerate(entries, 1)]

    outcomes = asyncio.run(play())
    failed = [o for o in outcomes if not o.passed]
    n = len(outcomes)
    summary = f"{n} {noun}{'s' if n != 1 else ''}: {n - len(failed)} PASS, {len(failed)} FAIL"
    out.write((style("bad", summary) if failed else style("pass", summary)) + "\n")
    if failed:
        out.write("failed: " + ", ".join(o.name for o in failed) + "\n")
    return outcomes
