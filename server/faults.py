"""Fault injection on a daemon's wire path (docs/architecture.md, "Fault injection").

A rule watches the packets one daemon sends (``direction: "out"``) or accepts
(``"in"``) and, when it matches, changes what the link does with one of them:

- ``corrupt``: change bytes of wire block ``block`` of a message (a data byte, or the
  T10-DIF guard, app tag or ref tag field; xor a mask or set a value); a data byte
  needs no block: given ``offset`` without ``block`` and ``block_size``, it counts from
  the message's first byte. With
  ``icrc: "recompute"`` the packet's integrity check is computed over the corrupted
  bytes: the corruption happened before the link (a bad DMA, a buggy target), so only
  a signature check can notice it. With ``icrc: "stale"`` the check is the original
  one: a link error, which the receiver drops and the requester's retransmission
  recovers.
- ``drop``, ``duplicate``, ``delay`` (``seconds``), ``reorder`` (held back behind the
  next ``window`` packets of the same QP and direction).
- ``rnr``: the receiving QP answers a SEND with an RNR NAK, as if no receive were posted.
- a rule with ``cm`` (``req``, ``rep``, ``rej``, ``rtu``, ``dreq``, ``drep``, ``mra``)
  drops the connection manager's messages of that kind instead (``action: "drop"``,
  with ``direction``, ``count``, ``probability``, ``seed``; server/cm.py), as a lost
  MAD would be.

Matching: ``qp`` (this daemon's QP number: the sender for "out", the receiver for
"in"), ``opcode`` (a whole opcode name, or a family of them: "RDMA_WRITE" matches
RDMA_WRITE_FIRST ... _LAST_WITH_IMM; also SEND, RDMA_READ, RDMA_READ_RESPONSE),
``message`` (the n-th message, from 1, of one of two streams of that QP in the rule's
direction, counted apart as they run in two PSN spaces: its requests, SEND, WRITE,
READ request or atomic, the ones it sends as requester ("out") or takes as responder
("in"); and its READ responses, one message per READ, sent as responder or taken as
requester; an ACK begins no message), ``packet`` (the n-th packet of the message, from 1), ``block``
(only packets that carry bytes of the field in that block), ``probability`` with
``seed`` (a rule's own random generator, so the same rules, seed and traffic give
the same faults), ``count`` (fire at most this many times; absent: no limit).

Ownership: a rule installed by a control session belongs to it: it matches only that
session's QPs and goes away with the session. A daemon-wide rule (``serve --faults``,
``softhca faults add --daemon-wide``) matches every QP and stays until cleared. A
daemon holds at most ``MAX_RULES`` (ENOMEM past it), and a packet is matched only
against the rules indexed under its QP and opcode (or none), so rules that cannot
match it cost nothing (20,000 rules that cannot match must not slow every client).

A message is counted once however often it is retransmitted: the n-th message is
the one whose first packet is the n-th new first PSN seen. Blocks are ``block_size``
wire bytes (data and PI: 520 for T10-DIF on 512-byte blocks) counted from the
message's first byte; packet i of a message carries bytes [i*mtu, i*mtu+len).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ..engine.rc_common import psn_diff
from ..protocol.attrs import T10DIF_PI_FIELDS
from ..protocol.enums import T10DIF_PI_BYTES
from ..protocol.errors import RDMAError
from ..protocol.opcodes import NAMES, Op, with_any, with_flags
from ..protocol.packets import Packet

ACTIONS = ("corrupt", "drop", "duplicate", "delay", "reorder", "rnr")
# A rule with ``cm`` drops CM messages of that kind (server/cm.py) instead of packets.
CM_KINDS = ("req", "rep", "rej", "rtu", "dreq", "drep", "mra")
FIELDS = ("data", "guard", "app_tag", "ref_tag")
# Packets that begin a message on a requester's stream or a responder's stream: the
# first packet of a request or of a READ's responses; an ACK begins nothing.
_STARTS = with_flags(Op.FIRST, none_of=Op.ACK)
# Requests and responses of one QP run in two PSN spaces.
_RESPONSES = with_any(Op.RESPONSE)
# Rules installed in one daemon, daemon-wide and sessions' together.
MAX_RULES = 1024
# A packet held for reordering goes anyway after this long without traffic behind it.
REORDER_FLUSH_S = 0.02
# A rule's ``opcode`` names one opcode (exactly: RDMA_WRITE_ONLY is not
# RDMA_WRITE_ONLY_WITH_IMM) or one of the families a person means by an operation's
# name (RDMA_READ: the request and its responses), each with the opcodes it matches,
# decided here once. Only whole names: an error lists what may be given.
OPCODE_FAMILIES = ("SEND", "RDMA_WRITE", "RDMA_READ", "RDMA_READ_RESPONSE")
_MATCHING = {name: frozenset({name}) for name in NAMES} | {
    family: frozenset(op for op in NAMES if op.startswith(family + "_"))
    for family in OPCODE_FAMILIES}
_OPCODE_STEMS = sorted(_MATCHING)

# Every field a rule may have: (type, check, default).
_U = (int, lambda v: v >= 0)
_SCHEMA: dict[str, tuple] = {
    "action": (str, lambda v: v in ACTIONS), "direction": (str, lambda v: v in ("out", "in")),
    "qp": _U, "opcode": (str, lambda v: v in _OPCODE_STEMS),
    "message": (int, lambda v: v >= 1), "packet": (int, lambda v: v >= 1),
    "block": _U, "block_size": (int, lambda v: 1 <= v <= 1 << 16),
    "pi_size": (int, lambda v: v in (4, 8)),
    "field": (str, lambda v: v in FIELDS), "offset": _U,
    "xor": (int, lambda v: 0 <= v < 1 << 64), "set": (int, lambda v: 0 <= v < 1 << 64),
    "icrc": (str, lambda v: v in ("recompute", "stale")),
    "probability": ((int, float), lambda v: 0 <= v <= 1), "seed": (int, lambda v: True),
    "count": (int, lambda v: v >= 1), "seconds": ((int, float), lambda v: 0 <= v <= 60),
    "window": (int, lambda v: 1 <= v <= 1024), "name": (str, lambda v: len(v) <= 80),
    "cm": (str, lambda v: v in CM_KINDS),
}
# What a field takes, said when a value is refused (a typo such as action=corupt is
# answered with the list to pick from).
_NAMED = {"action": ACTIONS, "direction": ("out", "in"), "field": FIELDS, "cm": CM_KINDS,
          "icrc": ("recompute", "stale"), "pi_size": (4, 8)}
_VALID = {name: "one of " + ", ".join(map(str, _NAMED[name])) for name in _NAMED} | {
    "opcode": "one of the opcode families " + ", ".join(OPCODE_FAMILIES) + " or an opcode: "
              + ", ".join(sorted(NAMES)),
    "qp": "an integer >= 0", "block": "an integer >= 0", "offset": "an integer >= 0",
    "message": "an integer >= 1", "packet": "an integer >= 1", "count": "an integer >= 1",
    "block_size": "an integer in [1, 65536]", "window": "an integer in [1, 1024]",
    "xor": "an integer in [0, 2^64)", "set": "an integer in [0, 2^64)",
    "probability": "a number in [0, 1]", "seed": "an integer",
    "seconds": "a number of seconds in [0, 60]", "name": "a string of at most 80 characters"}


def _bad(msg: str) -> RDMAError:
    return RDMAError("EINVAL", f"fault rule: {msg}")


@dataclass(eq=False)
class FaultRule:
    id: int
    spec: dict
    fired: int = 0
    rng: random.Random = field(default_factory=random.Random)
    # The session that installed it; None: daemon-wide.
    owner: Any = None

    def __getattr__(self, name: str) -> Any:
        try:
            return self.spec[name]
        except KeyError:
            raise AttributeError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        return self.spec.get(name, default)

    def as_dict(self) -> dict:
        return {"id": self.id, **self.spec, "fired": self.fired,
                "daemon_wide": self.owner is None}

    def index_keys(self) -> list[tuple]:
        """Where the rule is filed: (direction, owner, qp or None, opcode or None)."""
        s = self.spec
        # A CM rule is filed under a key no packet's opcode is: packets never see it.
        ops = (["cm:" + s["cm"]] if "cm" in s
               else sorted(_MATCHING[s["opcode"]]) if "opcode" in s else [None])
        return [(s["direction"], id(self.owner) if self.owner is not None else None,
                 s.get("qp"), op) for op in ops]

    def field_range(self) -> tuple[int, int]:
        """[start, end) of the corrupted field within its block (within the message,
        for a data byte given without a block)."""
        f = self.spec.get("field", "data")
        if f == "data":
            off = self.spec.get("offset", 0)
            return off, off + 1
        w, pi = self.spec["block_size"], self.spec.get("pi_size", 8)
        if f == "guard" and pi != T10DIF_PI_BYTES:
            return w - pi, w       # a CRC's PI is its guard, whole
        lo, hi = T10DIF_PI_FIELDS[f]
        return w - T10DIF_PI_BYTES + lo, w - T10DIF_PI_BYTES + hi


def validate_rule(spec: Any) -> dict:
    """The rule as given, checked: unknown fields, wrong types, values out of range and
    combinations that cannot match anything are EINVAL with the reason."""
    _check_fields(spec)
    out = {"direction": "out", **spec}
    act = out["action"]
    if "cm" in out and (act != "drop" or set(out) - _CM_FIELDS):
        raise _bad("a 'cm' rule drops CM messages: action 'drop', with only "
                   + ", ".join(sorted(_CM_FIELDS - {"action", "cm"})))
    if act == "corrupt":
        _check_corrupt(out)
    elif any(k in out for k in ("field", "xor", "set", "icrc", "offset", "pi_size")):
        raise _bad("field/xor/set/icrc/offset/pi_size only go with action 'corrupt'")
    if act == "delay" and "seconds" not in out:
        raise _bad("delay needs 'seconds'")
    if act == "reorder":
        out.setdefault("window", 3)
    if act == "rnr":
        _check_rnr(out)
    if "block" in out and "block_size" not in out:
        raise _bad("'block' needs 'block_size'")
    if "probability" in out:
        out.setdefault("seed", 0)
    return out


_CM_FIELDS = {"action", "cm", "direction", "count", "probability", "seed", "name"}


def _check_fields(spec: Any) -> None:
    """Each field of the rule known, of its type and in its range; an action given."""
    if not isinstance(spec, dict):
        raise _bad("a rule is a map of fields")
    unknown = sorted(set(spec) - set(_SCHEMA))
    if unknown:
        raise _bad(f"unknown field(s) {', '.join(map(str, unknown))}; the fields are "
                   f"{', '.join(_SCHEMA)}")
    for name, value in spec.items():
        typ, ok = _SCHEMA[name]
        if not isinstance(value, typ) or isinstance(value, bool) or not ok(value):
            raise _bad(f"{name}={value!r}"[:80] + f" is not valid: {_VALID[name]}")
    if "action" not in spec:
        raise _bad(f"'action' is required: one of {', '.join(ACTIONS)}")


def _check_corrupt(out: dict) -> None:
    """A corrupt rule's block, field and pattern (its defaults filled in ``out``): the
    field must lie inside the block and the pattern fit the field."""
    if "xor" in out and "set" in out:
        raise _bad("give 'xor' or 'set', not both")
    f = out.setdefault("field", "data")
    out.setdefault("icrc", "recompute")
    if "xor" not in out and "set" not in out:
        out["xor"] = 1
    if f == "data" and "block" not in out and "block_size" not in out and "offset" in out:
        _check_data_byte(out)
        return
    if "block" not in out or "block_size" not in out:
        raise _bad(f"corrupting the {f} field needs 'block' and 'block_size' (wire bytes "
                   "per block, PI included: 520 for T10-DIF on 512-byte blocks); a data "
                   "byte of the message needs only 'offset' (from its first byte)")
    _check_block_field(out, f)


def _check_data_byte(out: dict) -> None:
    """A byte of the message: ``offset`` from its first byte, no block geometry."""
    if "pi_size" in out:
        raise _bad("pi_size goes with 'block' and 'block_size'")
    if "set" in out and out["set"] > 0xFF or out.get("xor", 0) > 0xFF:
        raise _bad("a data byte takes an xor or set value below 0x100")


def _check_block_field(out: dict, f: str) -> None:
    """Field ``f`` of a block: inside the block, and the pattern fits it."""
    pi = out.get("pi_size", 8)
    data = out["block_size"] - pi
    if data <= 0:
        raise _bad(f"block_size {out['block_size']} leaves no data beside a {pi}-byte PI")
    if f == "data" and out.get("offset", 0) >= data:
        raise _bad(f"offset {out.get('offset', 0)} is past the {data} data bytes of a block")
    if f in ("app_tag", "ref_tag") and pi != 8:
        raise _bad(f"{f} exists only in an 8-byte T10-DIF PI")
    lo, hi = FaultRule(0, out).field_range()
    width = 8 * (hi - lo)
    for k in ("xor", "set"):
        if k in out and out[k] >= 1 << width:
            raise _bad(f"{k}={out[k]:#x} does not fit the {hi - lo}-byte {f} field")


def _check_rnr(out: dict) -> None:
    if out["direction"] != "in":
        raise _bad("rnr is the receiver's answer: it needs direction 'in'")
    out.setdefault("opcode", "SEND")
    if not _MATCHING[out["opcode"]] <= with_flags(Op.SEND):
        raise _bad("rnr refuses SENDs (the messages that consume a receive)")


@dataclass
class _Msg:
    first_psn: int
    index: int


class _Stream:
    """The messages of one QP's packet stream in one direction and PSN space."""

    KEEP = 512

    def __init__(self) -> None:
        self.count = 0
        self.by_psn: OrderedDict[int, _Msg] = OrderedDict()

    def locate(self, p: Packet) -> _Msg | None:
        if p.opcode in _STARTS:
            m = self.by_psn.get(p.psn)
            if m is None:
                self.count += 1
                m = self.by_psn[p.psn] = _Msg(p.psn, self.count)
                if len(self.by_psn) > self.KEEP:
                    self.by_psn.popitem(last=False)
            return m
        # A MIDDLE or LAST packet (perhaps retransmitted alone): the newest message
        # that started at or before its PSN.
        best = None
        for m in reversed(self.by_psn.values()):
            d = psn_diff(p.psn, m.first_psn)
            if 0 <= d and (best is None or d < psn_diff(p.psn, best.first_psn)):
                best = m
                if d < 1 << 16:
                    break
        return best


@dataclass
class Emit:
    """What the link does with a packet: send it (after ``delay`` s) with this icrc."""

    packet: Packet
    stale_icrc_of: Packet | None = None
    delay: float = 0.0
    # Where it goes: the daemon's business (a link for "out", a QP for "in").
    route: Any = None


def _selects(r: FaultRule, direction: str, qpn: int, p: Packet, msg: _Msg | None) -> bool:
    """Whether rule ``r`` may still fire and names this direction, QP, opcode and
    message."""
    s = r.spec
    if s["direction"] != direction:
        return False
    if "count" in s and r.fired >= s["count"]:
        return False
    if "qp" in s and s["qp"] != qpn:
        return False
    op = s.get("opcode")
    if op is not None and p.opcode not in _MATCHING[op]:
        return False
    return "message" not in s or (msg is not None and msg.index == s["message"])


def _block_bytes(r: FaultRule, p: Packet, idx: int, mtu: int) -> tuple[int, int]:
    """[a, b): the bytes of packet ``idx`` of its message inside the rule's block (its
    corrupted field for a corrupt rule); empty when the packet carries none of them."""
    s = r.spec
    lo, hi = r.field_range() if s["action"] == "corrupt" else (0, s["block_size"])
    start = s.get("block", 0) * s.get("block_size", 0)    # 0: a data byte of the message
    po = idx * mtu
    a, b = max(start + lo, po), min(start + hi, po + len(p.payload))
    return a - po, b - po


class Faults:
    """The rules of one daemon and the per-QP message streams they match against."""

    def __init__(self, max_rules: int = MAX_RULES) -> None:
        self.rules: list[FaultRule] = []
        self.max_rules = max_rules
        self._next = 1
        # (direction, owner id or None, qp or None, opcode or None) -> rules, by id.
        self._index: dict[tuple, list[FaultRule]] = {}
        self._streams: dict[tuple, _Stream] = {}
        self._held: dict[tuple, list] = {}

    # -- rules ----------------------------------------------------------------------------
    def add(self, spec: Any, owner: Any = None) -> FaultRule:
        """Install a rule for ``owner`` (a session; None: daemon-wide)."""
        spec = validate_rule(spec)
        if len(self.rules) >= self.max_rules:
            raise RDMAError("ENOMEM", f"fault rule: this daemon holds {len(self.rules)} "
                                      "rules, its limit; clear some first")
        rule = FaultRule(self._next, spec, rng=random.Random(spec.get("seed", 0)), owner=owner)
        self._next += 1
        self.rules.append(rule)
        for key in rule.index_keys():
            self._index.setdefault(key, []).append(rule)
        return rule

    def _remove(self, gone: list[FaultRule]) -> int:
        if gone:
            ids = {r.id for r in gone}
            self.rules = [r for r in self.rules if r.id not in ids]
            for r in gone:
                for key in r.index_keys():
                    left = [x for x in self._index.get(key, ()) if x.id not in ids]
                    if left:
                        self._index[key] = left
                    else:
                        self._index.pop(key, None)
        return len(gone)

    def visible(self, owner: Any) -> list[FaultRule]:
        """The rules ``owner`` sees: its own and the daemon-wide ones."""
        return [r for r in self.rules if r.owner is None or r.owner is owner]

    def clear(self, rule_id: int | None = None, owner: Any = None,
              daemon_wide: bool = False) -> int:
        """Remove rule ``rule_id`` (one of ``owner``'s, or a daemon-wide one), or every
        rule of ``owner``, or with ``daemon_wide`` every daemon-wide rule too."""
        if rule_id is None:
            return self._remove([r for r in self.rules if r.owner is owner
                                 or (daemon_wide and r.owner is None)])
        gone = [r for r in self.visible(owner) if r.id == rule_id]
        if not gone:
            raise RDMAError("ENOENT", f"no fault rule {rule_id} of this session or the daemon")
        return self._remove(gone)

    def drop_owner(self, owner: Any) -> int:
        """The session ended: its rules go with it."""
        return self._remove([r for r in self.rules if r.owner is owner])

    def list(self, owner: Any = None) -> list[dict]:
        return [r.as_dict() for r in self.visible(owner)]

    def candidates(self, direction: str, owner: Any, qpn: int, op: str) -> list[FaultRule]:
        """The rules that may match a packet: those filed under its QP or any QP, its
        opcode or any, its session or the daemon; in the order they were installed."""
        idx = self._index
        oid = id(owner) if owner is not None else None
        found: list[FaultRule] = []
        n = 0
        for o in (None, oid) if oid is not None else (None,):
            for q in (qpn, None):
                for code in (op, None):
                    rules = idx.get((direction, o, q, code))
                    if rules:
                        found += rules
                        n += 1
        if n > 1:
            found.sort(key=lambda r: r.id)
        return found

    def drops_cm(self, direction: str, kind: str, owner: Any = None) -> bool:
        """Whether a ``cm`` rule (daemon-wide, or ``owner``'s) drops this CM message."""
        for r in self.candidates(direction, owner, -1, "cm:" + kind):
            s = r.spec
            if "count" in s and r.fired >= s["count"]:
                continue
            if "probability" in s and r.rng.random() >= s["probability"]:
                continue
            r.fired += 1
            return True
        return False

    # -- matching -----------------------------------------------------------------------
    def _stream(self, direction: str, qpn: int, p: Packet) -> _Stream:
        kind = "resp" if p.opcode in _RESPONSES else "req"
        key = (direction, qpn, kind)
        s = self._streams.get(key)
        if s is None:
            s = self._streams[key] = _Stream()
        return s

    def _matches(self, r: FaultRule, direction: str, qpn: int, p: Packet, msg: _Msg | None,
                 mtu: int) -> tuple[bool, int, int]:
        """(matches, start, end): the corrupted bytes' range within the packet."""
        s = r.spec
        if not _selects(r, direction, qpn, p, msg):
            return False, 0, 0
        idx = psn_diff(p.psn, msg.first_psn) if msg is not None else 0
        if "packet" in s and (msg is None or idx + 1 != s["packet"]):
            return False, 0, 0
        a = b = 0
        if "block" in s or s["action"] == "corrupt":
            if msg is None:
                return False, 0, 0
            a, b = _block_bytes(r, p, idx, mtu)
            if a >= b:
                return False, 0, 0
        if "probability" in s and r.rng.random() >= s["probability"]:
            return False, 0, 0
        return True, a, b

    def _corrupt(self, r: FaultRule, p: Packet, a: int, b: int, idx: int, mtu: int) -> Packet:
        s = r.spec
        lo, hi = r.field_range()
        field_start = s.get("block", 0) * s.get("block_size", 0) + lo - idx * mtu  # in the packet
        width = hi - lo
        buf = bytearray(p.payload)
        if "set" in s:
            pattern = s["set"].to_bytes(width, "big")
            for i in range(a, b):
                buf[i] = pattern[i - field_start]
        else:
            mask = s["xor"].to_bytes(width, "big")
            for i in range(a, b):
                buf[i] ^= mask[i - field_start]
        return Packet(p.dest_qp, p.psn, p.opcode, bytes(buf), p.reth, p.aeth, p.imm, p.ieth,
                      p.atomic, p.atomic_ack)

    def apply(self, direction: str, qpn: int, mtu: int, pkts: list[Packet],
              on_rnr=None, route: Any = None, owner: Any = None) -> list[Emit]:
        """The emissions for ``pkts`` of QP ``qpn`` (of session ``owner``) in
        ``direction``."""
        out: list[Emit] = []
        for p in pkts:
            msg = self._stream(direction, qpn, p).locate(p)
            idx = psn_diff(p.psn, msg.first_psn) if msg is not None else 0
            emits = [Emit(p, route=route)]
            for r in self.candidates(direction, owner, qpn, p.opcode):
                ok, a, b = self._matches(r, direction, qpn, p, msg, mtu)
                if not ok:
                    continue
                act = r.spec["action"]
                if act == "rnr":
                    if on_rnr is None or not on_rnr(p):
                        continue
                elif act == "corrupt":
                    for e in emits:
                        original = e.stale_icrc_of or e.packet
                        e.packet = self._corrupt(r, e.packet, a, b, idx, mtu)
                        if r.spec["icrc"] == "stale":
                            e.stale_icrc_of = original
                elif act == "drop":
                    emits = []
                elif act == "duplicate":
                    emits = emits + [Emit(e.packet, e.stale_icrc_of, e.delay, e.route)
                                     for e in emits]
                elif act == "delay":
                    for e in emits:
                        e.delay += float(r.spec["seconds"])
                elif act == "reorder":
                    self._held.setdefault((direction, qpn), []).append(
                        [r.spec["window"], emits])
                    emits = []
                r.fired += 1
                if not emits:
                    break
            out.extend(emits)
            out.extend(self._release(direction, qpn))
        return out

    def _release(self, direction: str, qpn: int) -> list[Emit]:
        held = self._held.get((direction, qpn))
        if not held:
            return []
        ready = []
        for h in held:
            h[0] -= 1
            if h[0] < 0:
                ready.extend(h[1])
        held[:] = [h for h in held if h[0] >= 0]
        return ready

    def flush_held(self) -> list[tuple[str, Emit]]:
        """Everything held for reordering, to be sent now (nothing came behind it)."""
        out = [(d, e) for (d, _q), held in self._held.items() for h in held for e in h[1]]
        self._held.clear()
        return out

    @property
    def holding(self) -> bool:
        return any(self._held.values())

