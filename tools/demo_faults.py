"""``softhca demo faults``: fault injection on the wire, case by case, each ending in PASS or FAIL.

The T10-PI end-to-end promise: protection information generated where the data is
born travels with it and is checked where the data lands, so a corruption anywhere
in between is caught, at the block it hit. This walk-through tests the promise
end to end: two embedded daemons (a *target* and an *initiator*, as in
``softhca demo``), fault rules installed through the client (``node.faults.add``) on
one daemon's wire path, and for each case the rule, the wire block it hit as the
daemon taps saw it before the rule (the sender's "tx" tap) and after it (the
receiver's "rx" tap), the completion, ``mkey_check``, the rule's ``fired`` count and
the daemons' recovery counters (``node.counters()``) before and after.

What each case must produce is computed here independently of the engine: the wire
image with crcmod's T10-DIF and cryptography's XTS (softhca.tools.oracle), the corrupted
image by applying the rule's change to it, and the mkey_check a device must report by
checking that image as docs/semantics.md sections 6 and 7 say (escapes, GUARD then APPTAG
then REFTAG, the first failing block).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO

from .. import client as sh
from ..protocol.attrs import (
    SGE,
    T10DIF_PI_FIELDS,
    SigBlockAttr,
    SigBlockDomain,
    SigT10dif,
    t10dif_pi_field,
)
from ..protocol.enums import (
    BlockSize,
    MkeyErrType,
    SigT10difFlags,
    SigType,
    WcOpcode,
    WcStatus,
)
from ..protocol.errors import RDMAError
from .crypto_table import BEFORE, SIG, crypto_attr, dec, enc, new_key
from .harness import (
    REMOTE,
    SIG_CRYPTO_FLAGS,
    SIG_FLAGS,
    Capture,
    Example,
    Outcome,
    Side,
    judge,
    on_mkey,
    run_all,
    select_entries,
    two_daemons,
    whole,
)
from .oracle import guard_of, protect, ref_of
from .render import Shape, Style, block_text, pi_fields

BLOCKS = 8
W = 520                       # wire bytes per block: 512 of data and an 8-byte T10-DIF
# How long one operation's completions may take, and a whole case.
OP_TIMEOUT = 5.0
CASE_TIMEOUT = 30.0
# The counters that tell how the link recovered (server/daemon.py, engine/rc.py).
RECOVERY = ("packets_bad_icrc", "retransmissions", "retransmitted_packets", "ack_timeouts",
            "psn_seq_naks_sent", "duplicates_discarded", "rnr_retries")
# The target MKEY's wire domain for the write cases: the crypto table's SIG
# (T10DIF CRC guard bg 0, app 0xbeef, ref 0x2000 + block), memory none.
WIRE_DIF = SigBlockAttr(mem=None, wire=SIG, check_mask=0xFF)
ESC = SigBlockDomain(sig_type=SigType.T10DIF, block_size=BlockSize.SIZE_512,
                     dif=SigT10dif(bg=SIG.dif.bg, app_tag=SIG.dif.app_tag,
                                   ref_tag=SIG.dif.ref_tag,
                                   flags=SigT10difFlags.REF_REMAP | SigT10difFlags.APP_ESCAPE))
DIF = Shape(512, SIG)
CIPHER = Shape(512, SIG, "all")


# -- the oracle: the rule's change, and the check a device must make ---------------------

# docs/semantics.md 2: a T10-DIF PI is guard (2 bytes), app tag (2), ref tag (4), big-endian,
# after the block's data: each field's [start, end) within a 520-byte wire block.
FIELD_AT = {name: (512 + lo, 512 + hi) for name, (lo, hi) in T10DIF_PI_FIELDS.items()}


def corrupt(image: bytes, block: int, field: str, *, xor: int | None = None,
            set: int | None = None, offset: int = 0) -> bytes:
    """``image`` with the rule's change: one data byte at ``offset``, or a PI field,
    xored with ``xor`` or set to ``set`` (a fault rule's corrupt action)."""
    lo, hi = (offset, offset + 1) if field == "data" else FIELD_AT[field]
    a, b = block * W + lo, block * W + hi
    old = int.from_bytes(image[a:b], "big")
    new = old ^ xor if xor is not None else set
    return image[:a] + new.to_bytes(hi - lo, "big") + image[b:]


def strip(image: bytes) -> bytes:
    """The data of a wire image, PI removed (what lands behind a memory domain of none)."""
    return b"".join(image[b * W:b * W + 512] for b in range(len(image) // W))


Check = tuple[int, int, int, int]
NO_ERR: Check = (MkeyErrType.NO_ERR, 0, 0, 0)


def dif_check(image: bytes, d: SigBlockDomain) -> Check:
    """What mlx5dv_mkey_check(3) reports after ``image`` arrives through a wire domain
    ``d`` (check_mask 0xFF): docs/semantics.md 6.1 and 7."""
    for b in range(len(image) // W):
        blk, pi = image[b * W:b * W + 512], image[b * W + 512:(b + 1) * W]
        guard, app, ref = (t10dif_pi_field(pi, f) for f in ("guard", "app_tag", "ref_tag"))
        if d.dif.flags & SigT10difFlags.APP_ESCAPE and app == 0xFFFF:
            continue
        computed = guard_of(d, blk)
        if computed != guard:
            return (MkeyErrType.BAD_GUARD, computed, guard, b * W)
        if d.dif.app_tag != app:
            return (MkeyErrType.BAD_APPTAG, d.dif.app_tag, app, b * W)
        if ref_of(d, b) != ref:
            return (MkeyErrType.BAD_REFTAG, ref_of(d, b), ref, b * W)
    return NO_ERR


def check_text(e: Check) -> str:
    if e[0] == MkeyErrType.NO_ERR:
        return "NO_ERR"
    w = 4 if max(e[1], e[2]) <= 0xFFFF else 8
    return (f"{MkeyErrType(e[0]).name} actual 0x{e[1]:0{w}x} expected 0x{e[2]:0{w}x} "
            f"offset {e[3]}")


# -- one case while it runs ---------------------------------------------------------------

class FaultExample(Example):
    """harness.Example's printing and checks, plus what a fault case shows."""

    def __init__(self, name: str, out: TextIO, style: Style) -> None:
        super().__init__(name, out, style)
        self.rule_sides: dict[int, Side] = {}

    async def add_rule(self, side: Side, **rule) -> dict:
        got = await side.node.faults.add(rule)
        self.say("rule", f"on the {side.role} daemon, faults.add returned:")
        self.out.write(f"      {got}\n")
        return got

    async def counters(self) -> dict[str, dict[str, int]]:
        return {s.role: await s.node.counters() for s in (self.initiator, self.target)}

    def hit(self, k: int, before: bytes, after: bytes | None, shape: Shape, sender: Side,
            receiver: Side, after_label: str = "") -> None:
        """Wire block ``k`` as the sender's tap saw it and as the receiver's tap did."""
        def line(img: bytes) -> str:
            return f"blk {k:<2} @{k * W:<6} " + block_text(img[k * W:(k + 1) * W], shape,
                                                           self.style)
        self.say("hit", f"wire block {k}, sent by the {sender.role} (tx tap, before the rule):")
        self.out.write(f"      {line(before)}\n")
        if after is None:
            return
        self.say("", after_label or f"as the {receiver.role} accepted it (rx tap, after the "
                 "rule):")
        self.out.write(f"      {line(after)}\n")
        marks = changes(before[k * W:(k + 1) * W], after[k * W:(k + 1) * W], shape)
        self.out.write("      " + self.style("bad", "^ " + (marks or "unchanged")) + "\n")

    async def complete(self, side: Side, cq: sh.CQ, want: list[tuple[int, WcStatus]],
                       timeout: float = OP_TIMEOUT) -> list[sh.WC]:
        """Poll ``len(want)`` completions; they must be these (wr_id, status), in order."""
        try:
            wcs = await cq.poll_n(len(want), timeout)
        except RDMAError as e:
            if e.errno_name != "ETIMEDOUT":
                raise
            wcs = await cq.poll(len(want))

        def op(wc: sh.WC) -> str:
            try:
                return WcOpcode(wc.opcode).name + " " if wc.status == WcStatus.SUCCESS else ""
            except ValueError:
                return ""
        got = [(wc.wr_id, WcStatus(wc.status)) for wc in wcs]
        text = ", ".join(f"wr {wc.wr_id} {op(wc)}{WcStatus(wc.status).name}" for wc in wcs)
        wanted = ", ".join(f"wr {w} {s.name}" for w, s in want)
        self.check(got == want, f"{side.role} {text or 'no completion'}",
                   f"expected {wanted}", label="completion")
        return wcs

    async def check_mkey(self, side: Side, mkey: sh.MKey, want: Check) -> None:
        err = await mkey.mkey_check()
        s = err.sig_err
        got = (int(err.err_type), int(s.actual_value), int(s.expected_value), int(s.offset))
        ok = got == tuple(int(v) for v in want) if want[0] != MkeyErrType.NO_ERR \
            else got[0] == MkeyErrType.NO_ERR
        self.check(ok, f"{side.role} MKEY 0x{mkey.lkey:x}: {check_text(got)}",
                   f"expected {check_text(want)}", label="mkey_check")

    async def fired(self, side: Side, rule: dict, want: int | None = None,
                    at_least: int = 1) -> int:
        rules = {r["id"]: r for r in await side.node.faults.list()}
        n = rules[rule["id"]]["fired"]
        ok = n == want if want is not None else n >= at_least
        self.check(ok, f"rule {rule['id']} on the {side.role} fired {n} time{'s' * (n != 1)}",
                   f"expected {want if want is not None else f'at least {at_least}'}",
                   label="fired")
        return n

    def deltas(self, before: dict, after: dict, *, exact: dict | None = None,
               at_least: dict | None = None) -> None:
        """The recovery counters that changed on each daemon, then the expected ones:
        ``exact`` and ``at_least`` map (role, counter) to a change."""
        for role in ("initiator", "target"):
            moved = [f"{k} {before[role][k]} -> {after[role][k]} "
                     f"(+{after[role][k] - before[role][k]})"
                     for k in RECOVERY if after[role][k] != before[role][k]]
            self.say("counters" if role == "initiator" else "",
                     f"{role}: " + (", ".join(moved) or "no recovery counter changed"))
        for (role, k), n in (exact or {}).items():
            d = after[role][k] - before[role][k]
            self.check(d == n, f"{role} {k} +{d}", f"expected +{n}", label="counter")
        for (role, k), n in (at_least or {}).items():
            d = after[role][k] - before[role][k]
            self.check(d >= n, f"{role} {k} +{d}", f"expected at least +{n}", label="counter")


def changes(before: bytes, after: bytes, shape: Shape) -> str:
    """What differs between two copies of one block, by field."""
    out = []
    n = 512 if shape.enc != "all" else len(before)
    what = "ciphertext byte" if shape.enc == "all" else "data byte"
    for i in range(n):
        if before[i] != after[i]:
            out.append(f"{what} {i}: 0x{before[i]:02x} -> 0x{after[i]:02x}")
    if shape.enc != "all" and shape.sig is not None:
        for (name, a, w), (_, b, _) in zip(pi_fields(shape.sig, before[512:]),
                                           pi_fields(shape.sig, after[512:]), strict=True):
            if a != b:
                out.append(f"{name} 0x{a:0{w}x} -> 0x{b:0{w}x}")
    return "; ".join(out)


# -- the cases ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    title: str
    why: str
    fn: Callable[[FaultExample], Awaitable[None]]
    # ibv_qp_attr for both QPs (timeout exponent, retry_cnt, rnr_retry, min_rnr_timer).
    connect: tuple[tuple[str, int], ...] = ()


CASES: list[Case] = []


def case(name: str, title: str, why: str, **connect: int):
    def register(fn):
        CASES.append(Case(name, title, why, fn, tuple(connect.items())))
        return fn
    return register


async def _dif_target(ex: FaultExample, flags=SIG_FLAGS, sig: SigBlockAttr = WIRE_DIF, **kw):
    t = ex.target
    mr = await t.reg_mr(BLOCKS * 512)
    mkey = await t.mkey(flags, access=REMOTE, sges=whole(mr), sig=sig, **kw)
    return mr, mkey


async def _write(ex: FaultExample, src: sh.MR, mkey: sh.MKey, taps: Capture) -> None:
    """The initiator RDMA_WRITEs ``src`` to the target MKEY (rkey, address 0)."""
    i = ex.initiator
    wr = sh.SendWR(wr_id=4, opcode=sh.IBV_WR_RDMA_WRITE, sg=whole(src))
    wr.set_wr_rdma(mkey.rkey, 0)
    with taps:
        await i.qp.post_send(wr)
        await ex.complete(i, i.scq, [(4, WcStatus.SUCCESS)])
    ex.say("wire", taps.wire(i, ex.target).summary())


async def _corrupted_write(ex: FaultExample, k: int, field: str, xor: int, offset: int = 0,
                           icrc: str = "recompute") -> None:
    """Cases 1 to 5: 8 protected blocks RDMA_WRITten into a target MKEY whose wire
    domain is T10-DIF on 512-byte blocks (memory none), one field of block k changed
    on the initiator's way out."""
    t, i = ex.target, ex.initiator
    data = ex.rng.randbytes(BLOCKS * 512)
    image = protect(data, SIG)
    bad = corrupt(image, k, field, xor=xor, offset=offset)
    mr, mkey = await _dif_target(ex)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   WIRE_DIF)
    src = await i.reg_mr(image)
    link_error = icrc == "stale"
    want = NO_ERR if link_error else dif_check(bad, SIG)
    lands = data if link_error else strip(bad)
    ex.say("expect", f"oracle: {check_text(want)}; initiator SUCCESS; "
           + ("the link drops the packet, RC resends it, the data lands intact" if link_error
              else "the data moves anyway, every other block intact"))
    rule = {"action": "corrupt", "opcode": "RDMA_WRITE", "block": k, "block_size": W,
            "field": field, "xor": xor, "icrc": icrc, "count": 1}
    if field == "data":
        rule["offset"] = offset
    rule = await ex.add_rule(i, **rule)
    before = await ex.counters()
    taps = Capture((t, i))
    await _write(ex, src, mkey, taps)
    sent = taps.wire(i, t).data
    got = taps.image_in(t)
    if link_error:
        ex.hit(k, sent, bad, DIF, i, t, after_label="with the rule's change (computed by "
               "the oracle: the target drops the packet for its stale ICRC, so no rx tap "
               "sees it):")
        ex.say("", "as the target accepted it (rx tap: the retransmission):")
        ex.out.write(f"      blk {k:<2} @{k * W:<6} "
                     + block_text(got[k * W:(k + 1) * W], DIF, ex.style) + "\n")
    else:
        ex.hit(k, sent, got, DIF, i, t)
    ex.same("the initiator sent the oracle's image", sent, image, DIF)
    ex.same("the target accepted " + ("the intact image" if link_error
                                      else "the oracle's corrupted image"),
            got, image if link_error else bad, DIF)
    await ex.check_mkey(t, mkey, want)
    memory = await mr.read()
    ex.same(f"blocks other than {k} land intact", memory[:k * 512] + memory[(k + 1) * 512:],
            data[:k * 512] + data[(k + 1) * 512:])
    ex.same(f"block {k} holds " + ("its data, from the retransmission" if link_error else
                                    "its data as it arrived (the data always moves)"),
            memory[k * 512:(k + 1) * 512], lands[k * 512:(k + 1) * 512])
    await ex.fired(i, rule, want=1)
    after = await ex.counters()
    if link_error:
        ex.deltas(before, after, exact={("target", "packets_bad_icrc"): 1,
                                        ("initiator", "retransmissions"): 1})
    else:
        ex.deltas(before, after, exact={("target", "packets_bad_icrc"): 0,
                                        ("initiator", "retransmissions"): 0})


PROMISE = ("The initiator's data carries T10-DIF on the wire; the target MKEY checks it on "
           "arrival. ")


@case("guard", "guard of wire block 3 corrupted on an RDMA_WRITE",
      PROMISE + "A guard changed before the link (the packet's ICRC recomputed over the bad "
      "bytes, as a buggy DMA engine or bridge would) passes every link check: only the "
      "signature check sees it, at block 3, offset 3*520 = 1560.")
async def _guard(ex: FaultExample) -> None:
    await _corrupted_write(ex, 3, "guard", 0x10)


@case("app tag", "app tag of wire block 5 corrupted on an RDMA_WRITE",
      PROMISE + "The app tag says whose data this is; a changed one is BAD_APPTAG at block 5 "
      "(offset 2600), with the configured tag as actual and the stored one as expected.")
async def _app(ex: FaultExample) -> None:
    await _corrupted_write(ex, 5, "app_tag", 0x10)


@case("ref tag", "ref tag of wire block 0 corrupted on an RDMA_WRITE",
      PROMISE + "The ref tag says where the block belongs (ref_tag + block with REF_REMAP): a "
      "misdirected or changed one is BAD_REFTAG at block 0, offset 0.")
async def _ref(ex: FaultExample) -> None:
    await _corrupted_write(ex, 0, "ref_tag", 0x10)


@case("data byte", "one data byte of wire block 7 flipped on an RDMA_WRITE",
      PROMISE + "The worst case: the PI is intact but a data byte changed. The guard "
      "recomputed over the data no longer matches: BAD_GUARD at block 7 (offset 3640), "
      "actual = the guard of the corrupted data.")
async def _data(ex: FaultExample) -> None:
    await _corrupted_write(ex, 7, "data", 0x80, offset=100)


@case("link error", "the same data byte flipped, ICRC left stale: a link error",
      "A corruption on the link itself breaks the packet's ICRC: the target drops the "
      "packet (packets_bad_icrc), the initiator retransmits (retransmissions) and the data "
      "lands intact; the signature check has nothing to report (NO_ERR).")
async def _link_error(ex: FaultExample) -> None:
    await _corrupted_write(ex, 7, "data", 0x80, offset=100, icrc="stale")


@case("read response", "an RDMA_READ response corrupted, caught by the initiator's MKEY",
      "The promise holds in the other direction: the initiator reads protected blocks "
      "through its own MKEY (wire T10-DIF, memory none); the target's response has the "
      "guard of block 4 overwritten with 0xdead, and the initiator's mkey_check catches it.")
async def _read_response(ex: FaultExample) -> None:
    t, i = ex.target, ex.initiator
    k = 4
    data = ex.rng.randbytes(BLOCKS * 512)
    image = protect(data, SIG)
    bad = corrupt(image, k, "guard", set=0xDEAD)
    src = await t.reg_mr(image)
    dst = await i.reg_mr(BLOCKS * 512)
    mkey = await i.mkey(SIG_FLAGS, access=REMOTE, sges=whole(dst), sig=WIRE_DIF)
    ex.say("config", f"initiator MKEY 0x{mkey.lkey:x}: INDIRECT|BLOCK_SIGNATURE over "
           f"{dst.length}B of MR 0x{dst.lkey:x}; target: plain MR 0x{src.lkey:x} holding "
           "data + T10-DIF")
    want = dif_check(bad, SIG)
    ex.say("expect", f"oracle: {check_text(want)} on the initiator's MKEY; initiator SUCCESS")
    rule = await ex.add_rule(t, action="corrupt", opcode="RDMA_READ_RESPONSE", block=k,
                             block_size=W, field="guard", set=0xDEAD)
    before = await ex.counters()
    wr = sh.SendWR(wr_id=3, opcode=sh.IBV_WR_RDMA_READ, sg=on_mkey(mkey, BLOCKS * W))
    wr.set_wr_rdma(src.rkey, src.addr)
    taps = Capture((t, i))
    with taps:
        await i.qp.post_send(wr)
        await ex.complete(i, i.scq, [(3, WcStatus.SUCCESS)])
    ex.say("wire", taps.wire(t, i).summary())
    sent, got = taps.wire(t, i).data, taps.image_in(i)
    ex.hit(k, sent, got, DIF, t, i)
    ex.same("the target sent its memory image", sent, image, DIF)
    ex.same("the initiator accepted the oracle's corrupted image", got, bad, DIF)
    await ex.check_mkey(i, mkey, want)
    ex.same("the initiator's memory holds the data (only the guard was hit)", await dst.read(),
            data, Shape(512))
    await ex.fired(t, rule, want=1)
    ex.deltas(before, await ex.counters(), exact={("initiator", "packets_bad_icrc"): 0,
                                                  ("target", "retransmissions"): 0})


@case("crypto row C", "a ciphertext byte of block 6 flipped on a row C RDMA_WRITE",
      "mlx5dv_wr_set_mkey_crypto(3) table row C: data + T10-DIF encrypted together with "
      "AES-XTS-256 in 520-byte units (signature before crypto on TX, encrypt_on_tx). One "
      "flipped ciphertext bit decrypts to 16 garbage bytes; the T10-DIF checked after "
      "decryption catches it at block 6 (offset 3120): encryption does not hide corruption.")
async def _crypto_c(ex: FaultExample) -> None:
    t, i = ex.target, ex.initiator
    k, off = 6, 33
    key, data = new_key(ex.rng, 64), ex.rng.randbytes(BLOCKS * 512)
    image = enc(key, protect(data, SIG), W)
    bad = corrupt(image, k, "data", xor=0x01, offset=off)
    clear = dec(key, bad, W)
    attr = crypto_attr(await t.create_dek(key), True, BEFORE, W)
    mr, mkey = await _dif_target(ex, SIG_CRYPTO_FLAGS, crypto=attr)
    ex.mkey_config(mkey, SIG_CRYPTO_FLAGS, REMOTE,
                   f"list layout: {mr.length}B of MR 0x{mr.lkey:x}", WIRE_DIF, attr, key)
    src = await i.reg_mr(image)
    want = dif_check(clear, SIG)
    ex.say("expect", f"oracle (cryptography XTS, then crcmod): {check_text(want)}; initiator "
           "SUCCESS; the other blocks decrypt intact")
    rule = await ex.add_rule(i, action="corrupt", opcode="RDMA_WRITE", block=k, block_size=W,
                             field="data", offset=off, xor=0x01)
    before = await ex.counters()
    taps = Capture((t, i))
    await _write(ex, src, mkey, taps)
    sent, got = taps.wire(i, t).data, taps.image_in(t)
    ex.hit(k, sent, got, CIPHER, i, t)
    ex.say("", f"block {k} decrypted by cryptography XTS (tweak + {k}):")
    ex.out.write(f"      blk {k:<2} @{k * W:<6} "
                 + block_text(clear[k * W:(k + 1) * W], DIF, ex.style) + "\n")
    ex.same("the initiator sent enc(data + T10-DIF)", sent, image, CIPHER)
    ex.same("the target accepted the oracle's corrupted ciphertext", got, bad, CIPHER)
    await ex.check_mkey(t, mkey, want)
    memory = await mr.read()
    ex.same(f"blocks other than {k} land intact", memory[:k * 512] + memory[(k + 1) * 512:],
            data[:k * 512] + data[(k + 1) * 512:])
    ex.same(f"block {k} holds the garbled plaintext", memory[k * 512:(k + 1) * 512],
            strip(clear)[k * 512:(k + 1) * 512])
    await ex.fired(i, rule, want=1)
    ex.deltas(before, await ex.counters(), exact={("target", "packets_bad_icrc"): 0})


@case("app escape", "APP_ESCAPE: a corrupted guard in a block whose app tag is 0xffff",
      "T10-DIF's escape: with APP_ESCAPE a block whose stored app tag is 0xffff is not "
      "checked at all (docs/semantics.md 6.1), so a corrupted guard there is not reported, as "
      "the hardware would not report it. The same corruption one block further is caught.")
async def _app_escape(ex: FaultExample) -> None:
    t, i = ex.target, ex.initiator
    k = 2
    sig = SigBlockAttr(mem=None, wire=ESC, check_mask=0xFF)
    data = ex.rng.randbytes(BLOCKS * 512)
    image = corrupt(protect(data, ESC), k, "app_tag", set=0xFFFF)
    mr, mkey = await _dif_target(ex, sig=sig)
    ex.mkey_config(mkey, SIG_FLAGS, REMOTE, f"list layout: {mr.length}B of MR 0x{mr.lkey:x}",
                   sig)
    ex.say("", f"block {k} of the initiator's image has app tag 0xffff (escaped)")
    src = await i.reg_mr(image)
    bad = corrupt(image, k, "guard", xor=0xFF)
    want = dif_check(bad, ESC)
    ex.say("expect", f"oracle: {check_text(want)} (block {k} escaped); initiator SUCCESS")
    rule = await ex.add_rule(i, action="corrupt", opcode="RDMA_WRITE", block=k, block_size=W,
                             field="guard", xor=0xFF)
    before = await ex.counters()
    taps = Capture((t, i))
    await _write(ex, src, mkey, taps)
    sent, got = taps.wire(i, t).data, taps.image_in(t)
    ex.hit(k, sent, got, DIF, i, t)
    ex.same("the target accepted the oracle's corrupted image", got, bad, DIF)
    await ex.check_mkey(t, mkey, want)
    ex.same("the data lands intact", await mr.read(), data, Shape(512))
    await ex.fired(i, rule, want=1)
    ex.deltas(before, await ex.counters(), exact={("target", "packets_bad_icrc"): 0})
    # The contrast: block k + 1 has the configured app tag, so it is checked.
    await i.node.faults.clear()
    ex.say("contrast", f"rules cleared; the same guard corruption on block {k + 1} "
           "(app tag 0xbeef, not escaped)")
    bad2 = corrupt(image, k + 1, "guard", xor=0xFF)
    want2 = dif_check(bad2, ESC)
    ex.say("expect", f"oracle: {check_text(want2)}")
    rule2 = await ex.add_rule(i, action="corrupt", opcode="RDMA_WRITE", block=k + 1,
                              block_size=W, field="guard", xor=0xFF)
    taps = Capture((t, i))
    await _write(ex, src, mkey, taps)
    ex.same("the target accepted the oracle's corrupted image", taps.image_in(t), bad2, DIF)
    await ex.check_mkey(t, mkey, want2)
    await ex.fired(i, rule2, want=1)


LOSSY_N, LOSSY_MAX, LOSSY_BATCH = 200, 3000, 50


@case("lossy link", f"{LOSSY_N} SEND/RDMA_WRITE messages over a lossy, duplicating, "
      "reordering link",
      "RC's promise under a bad link: with 5% of packets dropped, 5% duplicated and 5% "
      "reordered by both daemons (seeded rules), every byte still lands where it belongs "
      "and every work request completes exactly once, in order. The counters show the "
      "recovery: retransmissions, duplicates discarded, sequence NAKs.",
      timeout=10)
async def _lossy(ex: FaultExample) -> None:
    t, i = ex.target, ex.initiator
    ex.say("qp", "ACK timeout exponent 10 (4.096 us * 2^10 = ~4 ms) on both QPs")
    rules = []
    for side, seed in ((i, 1), (t, 2)):
        rules.append((side, await ex.add_rule(side, action="drop", probability=0.05,
                                              seed=seed)))
        rules.append((side, await ex.add_rule(side, action="duplicate", probability=0.05,
                                              seed=seed + 10)))
        rules.append((side, await ex.add_rule(side, action="reorder", probability=0.05,
                                              seed=seed + 20, window=3)))
    sizes = [ex.rng.randrange(0, LOSSY_MAX) for _ in range(LOSSY_N)]
    src = await i.reg_mr(ex.rng.randbytes(LOSSY_MAX))
    dst = await t.reg_mr(LOSSY_N * LOSSY_MAX)
    pattern = await src.read()
    want = bytearray(dst.length)
    recvs, sends = [], []
    for m, size in enumerate(sizes):
        local = [SGE(src.addr, size, src.lkey)]
        at = dst.addr + m * LOSSY_MAX
        if m % 2:
            wr = sh.SendWR(wr_id=m, opcode=sh.IBV_WR_RDMA_WRITE, sg=local)
            wr.set_wr_rdma(dst.rkey, at)
        else:
            recvs.append(sh.RecvWR(wr_id=m, sg=[SGE(at, size, dst.lkey)]))
            wr = sh.SendWR(wr_id=m, opcode=sh.IBV_WR_SEND, sg=local)
        sends.append(wr)
        want[m * LOSSY_MAX:m * LOSSY_MAX + size] = pattern[:size]
    ex.say("traffic", f"{LOSSY_N} messages ({len(recvs)} SEND, {LOSSY_N - len(recvs)} "
           f"RDMA_WRITE), {sum(sizes)}B, 0..{LOSSY_MAX - 1}B each, each to its own "
           f"{LOSSY_MAX}B slot of a target MR, posted in batches of {LOSSY_BATCH}")
    ex.say("expect", f"oracle: {LOSSY_N} send completions wr 0..{LOSSY_N - 1} in order, "
           f"{len(recvs)} receives with their sizes, every slot holding its bytes")
    before = await ex.counters()
    swcs, rwcs = [], []
    taps = Capture((t, i))
    with taps:
        for start in range(0, LOSSY_N, LOSSY_BATCH):
            await t.qp.post_recv([r for r in recvs if start <= r.wr_id < start + LOSSY_BATCH])
            await i.qp.post_send(sends[start:start + LOSSY_BATCH])
            swcs += await i.scq.poll_n(LOSSY_BATCH, 20)
        rwcs += await t.rcq.poll_n(len(recvs), 20)
        extra = await i.scq.poll(timeout=0.05) + await t.rcq.poll()
    ex.say("wire", taps.wire(i, t).summary())
    ex.check([w.wr_id for w in swcs] == list(range(LOSSY_N))
             and all(w.status == WcStatus.SUCCESS for w in swcs),
             f"{len(swcs)} send completions, wr 0..{LOSSY_N - 1} once each in order, all "
             "SUCCESS", f"got {[(w.wr_id, WcStatus(w.status).name) for w in swcs][:8]}...",
             label="completion")
    ex.check(sorted(w.wr_id for w in rwcs) == [r.wr_id for r in recvs]
             and all(w.status == WcStatus.SUCCESS and w.byte_len == sizes[w.wr_id]
                     for w in rwcs),
             f"{len(rwcs)} receive completions, each once, SUCCESS, byte_len = its size",
             "some missing, repeated or wrong", label="completion")
    ex.check(not extra, "no completion beyond those", f"{len(extra)} more", label="completion")
    ex.same("every byte where it belongs (the whole target MR against the oracle)",
            await dst.read(), bytes(want))
    for side, rule in rules:
        await ex.fired(side, rule)
    ex.deltas(before, await ex.counters(),
              at_least={("initiator", "retransmissions"): 1,
                        ("target", "duplicates_discarded"): 1})


@case("retry exceeded", "every packet dropped, retry_cnt 3: RETRY_EXC_ERR, then flushed",
      "When the link never delivers, RC gives up after retry_cnt retransmissions: the "
      "first work request completes with RETRY_EXC_ERR after retry_cnt + 1 ACK timeouts "
      "(exponent 8: 4.096 us * 2^8 = ~1 ms each), the QP goes to the error state and every "
      "later one is flushed (WR_FLUSH_ERR).",
      timeout=8, retry_cnt=3)
async def _retry(ex: FaultExample) -> None:
    t, i = ex.target, ex.initiator
    retry_cnt = 3
    ex.say("qp", f"ACK timeout exponent 8 (~1 ms), retry_cnt {retry_cnt}")
    src, dst = await i.reg_mr(1024), await t.reg_mr(1024)
    want = [(1, WcStatus.RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR),
            (3, WcStatus.WR_FLUSH_ERR)]
    ex.say("expect", "oracle: " + ", ".join(f"wr {w} {s.name}" for w, s in want)
           + f"; initiator ack_timeouts +{retry_cnt + 1}, retransmissions +{retry_cnt}")
    rule = await ex.add_rule(i, action="drop")
    before = await ex.counters()
    wrs = []
    for w in (1, 2, 3):
        wr = sh.SendWR(wr_id=w, opcode=sh.IBV_WR_RDMA_WRITE, sg=whole(src))
        wr.set_wr_rdma(dst.rkey, dst.addr)
        wrs.append(wr)
    ex.say("post", "3 RDMA_WRITEs of 1024B from the initiator")
    taps = Capture((t, i))
    with taps:
        await i.qp.post_send(wrs)
        await ex.complete(i, i.scq, want)
    sent = [p for role, p in taps.sent if role == "initiator"]
    ex.say("wire", f"the initiator transmitted {len(sent)} packets (first tries and "
           f"retransmissions, all dropped by the rule); the target accepted "
           f"{sum(1 for role, _ in taps.accepted if role == 'target')}")
    await ex.fired(i, rule, want=len(sent))
    ex.deltas(before, await ex.counters(),
              exact={("initiator", "ack_timeouts"): retry_cnt + 1,
                     ("initiator", "retransmissions"): retry_cnt,
                     ("target", "packets_received"): 0})


@case("rnr exceeded", "RNR on every receive, rnr_retry 2: RNR_RETRY_EXC_ERR",
      "A receiver with no receive posted answers a SEND with an RNR NAK and the sender "
      "tries again, rnr_retry times. A rule on the target refuses every SEND as if no "
      "receive were posted: after the first try and 2 retries the SEND completes with "
      "RNR_RETRY_EXC_ERR, and the receive that was posted is never consumed.",
      rnr_retry=2, min_rnr_timer=1)
async def _rnr(ex: FaultExample) -> None:
    t, i = ex.target, ex.initiator
    rnr_retry = 2
    ex.say("qp", f"rnr_retry {rnr_retry}, min_rnr_timer 1 (0.01 ms)")
    ex.say("expect", f"oracle: wr 2 RNR_RETRY_EXC_ERR after {rnr_retry + 1} RNR NAKs "
           f"(initiator rnr_retries +{rnr_retry + 1}, rule fired {rnr_retry + 1}); the "
           "receive flushed, not completed, when the target QP goes to ERR")
    rule = await ex.add_rule(t, action="rnr", direction="in")
    src, rbuf = await i.reg_mr(100), await t.reg_mr(100)
    await t.qp.post_recv(sh.RecvWR(wr_id=1, sg=whole(rbuf)))
    before = await ex.counters()
    ex.say("post", "a RECV of 100B on the target, then a SEND of 100B from the initiator")
    taps = Capture((t, i))
    with taps:
        await i.qp.post_send(sh.SendWR(wr_id=2, opcode=sh.IBV_WR_SEND, sg=whole(src)))
        await ex.complete(i, i.scq, [(2, WcStatus.RNR_RETRY_EXC_ERR)])
    naks = sum(1 for role, p in taps.sent if role == "target" and p.aeth
               and str(p.aeth[0]).startswith("RNR"))
    ex.say("wire", taps.wire(i, t).summary() + f"; {naks} RNR NAK(s) from the target")
    await ex.fired(t, rule, want=rnr_retry + 1)
    ex.deltas(before, await ex.counters(), exact={("initiator", "rnr_retries"): rnr_retry + 1})
    await t.qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR))
    ex.say("flush", "target QP moved to ERR")
    await ex.complete(t, t.rcq, [(1, WcStatus.WR_FLUSH_ERR)])


# -- selection and the run --------------------------------------------------------------

def select(only: list[str] | None) -> list[Case]:
    """The cases named by ``only`` (exact name, else prefix; case, spaces, dashes and
    underscores ignored), as the examples are chosen."""
    return select_entries(CASES, only, "fault case", "cases")


async def _play(c: Case, ex: FaultExample) -> None:
    async with two_daemons(ex, **dict(c.connect)):
        await c.fn(ex)


def _wrap(text: str, width: int = 88) -> list[str]:
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return [*lines, cur] if cur else lines


async def run_one(c: Case, index: int, total: int, out: TextIO, style: Style) -> Outcome:
    out.write(style("head", f"[{index}/{total}] {c.name}: {c.title}") + "\n")
    for k, line in enumerate(_wrap(c.why)):
        out.write(f"  {'Why:' if k == 0 else '':<10} {line}\n")
    ex = FaultExample(c.name, out, style)
    return await judge(ex, _play(c, ex), CASE_TIMEOUT, "case", out, style)


def run(only: list[str] | None = None, out: TextIO | None = None,
        color: bool | None = None) -> list[Outcome]:
    """Run the selected cases, printing each; raises UnknownExample for a bad name."""
    return run_all(select(only), run_one, "case", out, color)
