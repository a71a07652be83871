"""The workloads of the differential test (tests/e2e/test_differential.py): seeded,
plain data, so that the same workload runs on every configuration of a pair.

``generate(seed, features)`` draws, with ``random.Random(seed)``, one to three RC QP
pairs between the two daemons of a run, each with one requester and one responder
(either daemon may be either), a path MTU of 1024 or 4096, and a stream of WRs:

- every RC opcode the engine models: SEND, SEND_WITH_IMM, SEND_WITH_INV, RDMA_WRITE,
  RDMA_WRITE_WITH_IMM, RDMA_READ, ATOMIC_CMP_AND_SWP, ATOMIC_FETCH_AND_ADD,
  ATOMIC_WRITE; some inline, one to four SGEs;
- message sizes around the MTU (0, 1, MTU-1, MTU, MTU+1, several MTUs) and, now and
  then, large ones (up to 1 MiB);
- with ``features`` "sig": RDMA WRITEs and READs through responder MKEYs with a block
  signature (T10-DIF, CRC32, CRC32C, CRC64_XP10 in the memory or the wire domain)
  or AES-XTS, whole blocks or with a plain tail;
- an RNR case (the responder posts its receives only after the SENDs went out; the
  requester retries with rnr_retry 7);
- with ``features`` "faults": drop / duplicate / reorder rules on a seeded packet of a
  seeded message, on either daemon;
- a WR that must fail (an R_Key the responder has no such key for, a WRITE to an MR
  without remote write access, a READ past the end of an MR, a SEND longer than its
  receive), after which the rest of the QP's WRs flush.

Memory each QP pair touches is its own, no local buffer a READ or atomic writes is a
source of another WR, and no WR writes responder memory that an earlier READ of its QP
reads, so that the final memory and every payload are functions of the workload alone.
RC orders one QP's messages, but nothing orders two QPs', nor (without IBV_SEND_FENCE,
which softhca accepts and does not model) a READ's responses against a later WR: the
responder reads a READ's bytes as its link sends them, and an RDMA WRITE or atomic
behind the READ may already have changed them, as the IBTA allows an unfenced one to.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import softhca.client as sh

MTUS = {1024: sh.IBV_MTU_1024, 4096: sh.IBV_MTU_4096}
BIG = (64 << 10, 256 << 10, 1 << 20)
ALL = (sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_REMOTE_READ
       | sh.IBV_ACCESS_REMOTE_ATOMIC)
REMOTE_RW = sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_REMOTE_READ
LOCAL = sh.IBV_ACCESS_LOCAL_WRITE
FEATURES = frozenset({"sig", "faults"})


@dataclass
class MrSpec:
    name: str
    side: int
    size: int
    access: int
    seed: int           # its initial bytes: random.Random(seed).randbytes(size)


@dataclass
class MkeySpec:
    """An MKEY of the responder over MR ``mr``: ``kind`` names a row of ``MKEY_KINDS``,
    or "inv" (no signature, remote invalidation allowed)."""

    name: str
    side: int
    mr: str
    kind: str
    blocks: int
    key: bytes = b""        # the DEK's, for the AES-XTS kinds
    tweak: int = 0


@dataclass
class WrSpec:
    """One send WR: ``sg`` (MR name, offset, length) triples, ``remote`` (key name,
    offset) for RDMA and atomics (the key name "bogus:<n>" is a key of the requester's
    own daemon, which the responder does not have)."""

    opcode: int
    sg: list[tuple[str, int, int]] = field(default_factory=list)
    remote: tuple[str, int] | None = None
    imm: int | None = None
    inline: bool = False
    compare_add: int = 0
    swap: int = 0
    invalidate: str | None = None


@dataclass
class PairSpec:
    name: str
    requester: int          # 0 or 1: which daemon's QP sends the WRs
    mtu: int
    wrs: list[WrSpec]
    recvs: list[list[tuple[str, int, int]]]
    rnr: bool = False
    faults: list[dict] = field(default_factory=list)    # each with "on": "requester" | "responder"
    chunks: list[int] = field(default_factory=list)     # how the WRs are split into posts


@dataclass
class Workload:
    seed: int
    mrs: list[MrSpec]
    mkeys: list[MkeySpec]
    pairs: list[PairSpec]

    @property
    def wr_count(self) -> int:
        return sum(len(p.wrs) for p in self.pairs)

    @property
    def has_faults(self) -> bool:
        return any(p.faults for p in self.pairs)


# -- the MKEYs: (memory PI bytes, wire PI bytes, block bytes, crypto) per kind --------------

def _dif(ref: int) -> sh.Mlx5SigBlockDomain:
    return sh.Mlx5SigBlockDomain(
        sig_type=sh.MLX5DV_SIG_TYPE_T10DIF,
        dif=sh.Mlx5SigT10Dif(bg_type=sh.MLX5DV_SIG_T10DIF_CRC, bg=0xFFFF, app_tag=0x5EED,
                             ref_tag=ref, flags=sh.MLX5DV_SIG_T10DIF_FLAG_REF_REMAP),
        block_size=sh.MLX5DV_BLOCK_SIZE_512)


def _crc(kind: int, block: int = sh.MLX5DV_BLOCK_SIZE_512) -> sh.Mlx5SigBlockDomain:
    return sh.Mlx5SigBlockDomain(sig_type=sh.MLX5DV_SIG_TYPE_CRC,
                                 crc=sh.Mlx5SigCrc(crc_type=kind, seed=0xFFFFFFFF
                                                   if kind != sh.MLX5DV_SIG_CRC_TYPE_CRC64_XP10
                                                   else 0),
                                 block_size=block)


# kind: (block bytes, memory PI bytes, wire PI bytes, sig attr or None, crypto: None,
# "tx" (encrypt_on_tx) or "rx")
MKEY_KINDS = {
    "dif-mem": (512, 8, 0, lambda: sh.Mlx5SigBlockAttr(mem=_dif(1000), check_mask=0xFF), None),
    "dif-wire": (512, 0, 8, lambda: sh.Mlx5SigBlockAttr(wire=_dif(77), check_mask=0xFF), None),
    "crc32c-mem/dif-wire": (512, 4, 8, lambda: sh.Mlx5SigBlockAttr(
        mem=_crc(sh.MLX5DV_SIG_CRC_TYPE_CRC32C), wire=_dif(5), check_mask=0xFF,
        copy_mask=0), None),
    "crc32-wire": (512, 0, 4, lambda: sh.Mlx5SigBlockAttr(
        wire=_crc(sh.MLX5DV_SIG_CRC_TYPE_CRC32), check_mask=0xFF), None),
    "crc64-mem-4k": (4096, 8, 0, lambda: sh.Mlx5SigBlockAttr(
        mem=_crc(sh.MLX5DV_SIG_CRC_TYPE_CRC64_XP10, sh.MLX5DV_BLOCK_SIZE_4096),
        check_mask=0xFF), None),
    "xts-rx": (512, 0, 0, None, "rx"),
    "xts-tx": (512, 0, 0, None, "tx"),
}


def mkey_widths(kind: str) -> tuple[int, int]:
    """(memory bytes, wire bytes) of one block of an MKEY of ``kind``."""
    block, mem_pi, wire_pi, _, _ = MKEY_KINDS[kind]
    return block + mem_pi, block + wire_pi


def _new_key(rng: random.Random) -> bytes:
    while True:
        key = rng.randbytes(64)
        if key[:32] != key[32:]:
            return key


# -- generation -----------------------------------------------------------------------------

def sizes(mtu: int) -> list[int]:
    return [0, 1, 7, mtu - 1, mtu, mtu + 1, 2 * mtu, 3 * mtu + 5, 5 * mtu, 17 * mtu - 3]


def _split(rng: random.Random, total: int, n: int) -> list[int]:
    if n <= 1 or total < n:
        return [total]
    cuts = sorted(rng.sample(range(1, total), n - 1)) if total > n else list(range(1, n))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


class _PairGen:
    """Draws one QP pair's WRs and the MRs / MKEYs it uses."""

    def __init__(self, rng: random.Random, name: str, features: frozenset, big_left: list,
                 rnr_taken: list, kinds, actions):
        self.rng, self.name, self.features = rng, name, features
        self.big_left, self.rnr_taken, self.kinds = big_left, rnr_taken, kinds
        self.actions = actions
        self.failing: str | None = None     # the kind of the WR that must fail, if any
        self.inv_pending = False            # a SEND_WITH_INV comes later in the stream
        self.requester = rng.randrange(2)
        self.responder = 1 - self.requester
        self.mtu = rng.choice((1024, 4096))
        self.mrs: list[MrSpec] = []
        self.mkeys: list[MkeySpec] = []
        self.wrs: list[WrSpec] = []
        # The messages that take a receive, in order: (length, is a SEND); an RDMA WRITE
        # with immediate takes one too, and none of its bytes.
        self.sends: list[tuple[int, bool]] = []
        self.small_recv: int | None = None  # the index of a receive made too small
        self.touched: set[int] = set()      # 8-byte words of tgt that WRs change
        self.reads: dict[str, list[tuple[int, int]]] = {}   # key -> ranges READs read
        self.need = {"src": 64, "sink": 64, "tgt": 4096}

    def mr(self, what: str, side: int, size: int, access: int) -> str:
        name = f"{self.name}.{what}"
        self.mrs.append(MrSpec(name, side, size, access, self.rng.getrandbits(32)))
        return name

    def length(self) -> int:
        if self.big_left[0] > 0 and self.rng.random() < 0.1:
            self.big_left[0] -= 1
            return self.rng.choice(BIG)
        return self.rng.choice(sizes(self.mtu))

    def local_sg(self, total: int, pool: str) -> list[tuple[str, int, int]]:
        n = self.rng.choice((1, 1, 1, 2, 3, 4)) if total >= 4 else 1
        out = []
        for part in _split(self.rng, total, n):
            at = self.rng.randrange(0, 2048) & ~7
            out.append((pool, at, part))
            self.need[pool] = max(self.need[pool], at + part)
        return out

    def remote_at(self, length: int, align: int = 1, writes: bool = False) -> int:
        """An offset in the responder's tgt MR for ``length`` bytes; one that a WR
        ``writes`` is past every range an earlier READ of the pair reads (module
        docstring: a READ's responses may show a later unfenced write)."""
        at = self.rng.randrange(0, 4096) // align * align
        if writes and self.overlaps_read(f"{self.name}.tgt", at, length):
            top = max(end for _, end in self.reads[f"{self.name}.tgt"])
            at = -(-top // align) * align + self.rng.randrange(0, 64) // align * align
        self.need["tgt"] = max(self.need["tgt"], at + length + 8)
        return at

    def overlaps_read(self, key: str, at: int, length: int) -> bool:
        return any(at < end and start < at + max(length, 1)
                   for start, end in self.reads.get(key, ()))

    def read(self, key: str, at: int, length: int) -> None:
        self.reads.setdefault(key, []).append((at, at + length))

    def draw(self, n: int) -> None:
        rng = self.rng
        opcodes = [sh.IBV_WR_SEND, sh.IBV_WR_SEND_WITH_IMM, sh.IBV_WR_RDMA_WRITE,
                   sh.IBV_WR_RDMA_WRITE_WITH_IMM, sh.IBV_WR_RDMA_READ,
                   sh.IBV_WR_ATOMIC_CMP_AND_SWP, sh.IBV_WR_ATOMIC_FETCH_AND_ADD,
                   sh.IBV_WR_ATOMIC_WRITE]
        if "sig" in self.features:
            for _ in range(rng.choice((1, 1, 2))):
                # The kinds in turn (from the workload's seed on): a dozen workloads
                # have them all.
                self.add_mkey(next(self.kinds))
        inv_at = rng.randrange(n) if rng.random() < 0.2 else None
        if inv_at is not None:
            self.add_mkey("inv")
        self.inv_pending = inv_at is not None
        for i in range(n):
            if i == inv_at:
                self.send_with_inv()
                self.inv_pending = False
                continue
            mk = self.mkeys
            if mk and rng.random() < 0.35:
                self.mkey_wr(rng.choice(mk))
                continue
            self.plain_wr(rng.choice(opcodes))
        if rng.random() < 0.3:
            self.failing_wr(rng.randrange(len(self.wrs) + 1))

    def add_mkey(self, kind: str) -> None:
        if kind == "inv":
            mr = self.mr(f"inv{len(self.mkeys)}", self.responder, 4096, REMOTE_RW)
            self.mkeys.append(MkeySpec(f"{self.name}.mkey{len(self.mkeys)}", self.responder,
                                       mr, "inv", 1))
            return
        mem, _ = mkey_widths(kind)
        blocks = 8 if mem < 4096 else 3
        mr = self.mr(f"disk{len(self.mkeys)}", self.responder, blocks * mem, LOCAL)
        spec = MkeySpec(f"{self.name}.mkey{len(self.mkeys)}", self.responder, mr, kind, blocks)
        if MKEY_KINDS[kind][4] is not None:
            spec.key, spec.tweak = _new_key(self.rng), self.rng.getrandbits(64)
        self.mkeys.append(spec)

    def mkey_wr(self, m: MkeySpec) -> None:
        rng = self.rng
        op = rng.choice((sh.IBV_WR_RDMA_WRITE, sh.IBV_WR_RDMA_READ))
        pool = "src" if op == sh.IBV_WR_RDMA_WRITE else "sink"
        if m.kind == "inv":
            # No signature: MKEY offsets are memory offsets.
            length = rng.choice((1, 8, 512, 3000))
            at = rng.randrange(0, 4096 - length + 1)
            if op == sh.IBV_WR_RDMA_WRITE and self.overlaps_read(m.name, at, length):
                op, pool = sh.IBV_WR_RDMA_READ, "sink"
            if op == sh.IBV_WR_RDMA_READ and self.inv_pending:
                # A READ is answered again when its request is (a retransmission
                # timer that fired on a loaded machine); once the SEND_WITH_INV behind
                # it invalidated the key, the repeat is refused (as rxe's
                # rxe_recheck_mr refuses it): timing. No READ through the key before
                # the SEND_WITH_INV.
                op, pool = sh.IBV_WR_RDMA_WRITE, "src"
            if op == sh.IBV_WR_RDMA_READ:
                self.read(m.name, at, length)
            self.wrs.append(WrSpec(op, self.local_sg(length, pool), (m.name, at)))
            return
        mem, wire = mkey_widths(m.kind)
        block = MKEY_KINDS[m.kind][0]
        first = rng.randrange(m.blocks)
        count = rng.randint(1, m.blocks - first)
        length = count * wire
        if MKEY_KINDS[m.kind][3] is not None and count < m.blocks - first \
                and rng.random() < 0.25:
            # A plain tail (docs/blocks.md); AES-XTS has no partial data unit.
            length += rng.choice((1, 100, block - 1))
        if op == sh.IBV_WR_RDMA_WRITE and self.overlaps_read(m.name, first * wire, length):
            op, pool = sh.IBV_WR_RDMA_READ, "sink"
        if op == sh.IBV_WR_RDMA_READ:
            self.read(m.name, first * wire, length)
        self.wrs.append(WrSpec(op, self.local_sg(length, pool), (m.name, first * wire)))

    def plain_wr(self, op: int) -> None:
        rng = self.rng
        if op in (sh.IBV_WR_ATOMIC_CMP_AND_SWP, sh.IBV_WR_ATOMIC_FETCH_AND_ADD,
                  sh.IBV_WR_ATOMIC_WRITE):
            at = self.remote_at(8, 8, writes=True)
            pool = "src" if op == sh.IBV_WR_ATOMIC_WRITE else "sink"
            wr = WrSpec(op, [(pool, rng.randrange(0, 256) * 8, 8)], (f"{self.name}.tgt", at),
                        compare_add=rng.getrandbits(64), swap=rng.getrandbits(64))
            self.need[pool] = max(self.need[pool], wr.sg[0][1] + 8)
            if op == sh.IBV_WR_ATOMIC_CMP_AND_SWP and at // 8 not in self.touched \
                    and rng.random() < 0.6:
                wr.compare_add = -1     # the initial value there: the swap happens
            self.touched.add(at // 8)
            self.wrs.append(wr)
            return
        length = self.length()
        imm = rng.getrandbits(32) if op in (sh.IBV_WR_SEND_WITH_IMM,
                                            sh.IBV_WR_RDMA_WRITE_WITH_IMM) else None
        if op in (sh.IBV_WR_SEND, sh.IBV_WR_SEND_WITH_IMM):
            self.sends.append((length, True))
            self.wrs.append(WrSpec(op, self.local_sg(length, "src"), imm=imm,
                                   inline=length <= 256 and rng.random() < 0.3))
            return
        at = self.remote_at(length, writes=op != sh.IBV_WR_RDMA_READ)
        if op == sh.IBV_WR_RDMA_READ:
            self.read(f"{self.name}.tgt", at, length)
        if op == sh.IBV_WR_RDMA_WRITE_WITH_IMM:
            self.sends.append((0, False))
        for w in range(at // 8, (at + length + 7) // 8):
            self.touched.add(w)
        pool = "sink" if op == sh.IBV_WR_RDMA_READ else "src"
        inline = op != sh.IBV_WR_RDMA_READ and length <= 256 and rng.random() < 0.3
        self.wrs.append(WrSpec(op, self.local_sg(length, pool), (f"{self.name}.tgt", at),
                               imm=imm, inline=inline))

    def send_with_inv(self) -> None:
        length = self.rng.choice((0, 1, 64, self.mtu + 1))
        self.sends.append((length, True))
        inv = next(m for m in self.mkeys if m.kind == "inv")
        self.wrs.append(WrSpec(sh.IBV_WR_SEND_WITH_INV, self.local_sg(length, "src"),
                               invalidate=inv.name))

    def failing_wr(self, at: int) -> None:
        """A WR that must fail with a remote error, at index ``at`` of the stream."""
        rng = self.rng
        kind = rng.choice(("bogus", "noaccess", "past", "small"))
        if kind == "small":
            # The receive of the first SEND at or after ``at`` gets fewer bytes than it.
            later = sum(1 for w in self.wrs[:at] if w.opcode in _TAKE_RECEIVES)
            if later < len(self.sends) and self.sends[later][1] and self.sends[later][0]:
                self.small_recv, self.failing = later, kind
                return
            kind = "past"
        self.failing = kind
        length = rng.choice((1, 64, self.mtu + 1))
        if kind == "bogus":
            wr = WrSpec(rng.choice((sh.IBV_WR_RDMA_WRITE, sh.IBV_WR_RDMA_READ)),
                        self.local_sg(length, "src"), ("bogus", 0))
            wr.sg = [("src", s[1], s[2]) for s in wr.sg]
        elif kind == "noaccess":
            mr = self.mr("ro", self.responder, 4096, sh.IBV_ACCESS_REMOTE_READ)
            wr = WrSpec(sh.IBV_WR_RDMA_WRITE, self.local_sg(length, "src"), (mr, 0))
        else:
            wr = WrSpec(sh.IBV_WR_RDMA_READ, self.local_sg(length + 16, "sink"),
                        (f"{self.name}.tgt", -length))      # offset from the MR's end
        self.wrs.insert(at, wr)

    def finish(self) -> PairSpec:
        rng, rnr_taken = self.rng, self.rnr_taken
        self.mr("src", self.requester, self.need["src"] + 64, LOCAL)
        self.mr("sink", self.requester, self.need["sink"] + 64, LOCAL)
        self.mr("tgt", self.responder, self.need["tgt"] + 64, ALL)
        recvs, at = [], 0
        extra = rng.randrange(3)        # receives left posted: flushed at the end
        for i, (length, _) in enumerate([*self.sends, *([(64, True)] * extra)]):
            room = length + rng.choice((0, 0, 3, 64))
            if i == self.small_recv:
                room = length - 1
            parts = _split(rng, room, rng.choice((1, 1, 2, 3))) if room else [0]
            sg = []
            for part in parts:
                sg.append(("recv", at, part))
                at += part + rng.choice((0, 8))
            recvs.append(sg)
        self.mr("recv", self.responder, max(at, 64) + 64, LOCAL)
        recvs = [[(f"{self.name}.{pool}", a, n) for pool, a, n in sg] for sg in recvs]
        for wr in self.wrs:
            wr.sg = [(f"{self.name}.{pool}", a, n) for pool, a, n in wr.sg]
        pair = PairSpec(self.name, self.requester, self.mtu, self.wrs, recvs)
        # RNR: the receives go up once the requester has had an RNR NAK. Not where a
        # failing WR may come before the first SEND (the SEND would never be sent), and
        # one pair a workload (the daemon counts RNR retries for all its QPs).
        pair.rnr = (bool(self.sends) and self.failing in (None, "small") and not rnr_taken[0]
                    and rng.random() < 0.3)
        rnr_taken[0] |= pair.rnr
        if "faults" in self.features and rng.random() < 0.5:
            for _ in range(rng.choice((1, 1, 2))):
                pair.faults.append(self.fault())
        posts, left = [], len(self.wrs)
        while left:
            k = min(left, rng.choice((1, 2, 4, 8, 64)))
            posts.append(k)
            left -= k
        pair.chunks = posts
        return pair

    def fault(self) -> dict:
        rng = self.rng
        # The actions in turn, as the MKEY kinds: a dozen workloads have them all.
        action = next(self.actions)
        rule = {"action": action, "direction": "out", "count": 1}
        if action == "reorder":
            rule["window"] = rng.choice((1, 2))
        if rng.random() < 0.7:
            rule.update(on="requester", message=rng.randint(1, max(1, len(self.wrs))),
                        packet=rng.choice((1, 1, 2, 3)))
        elif rng.random() < 0.5:
            rule.update(on="responder", opcode="RDMA_READ_RESPONSE",
                        message=rng.randint(1, 3), packet=rng.choice((1, 2)))
        else:
            rule.update(on="responder", opcode="ACKNOWLEDGE")
        return rule


_TAKE_RECEIVES = (sh.IBV_WR_SEND, sh.IBV_WR_SEND_WITH_IMM, sh.IBV_WR_SEND_WITH_INV,
                  sh.IBV_WR_RDMA_WRITE_WITH_IMM)


def generate(seed: int, features: frozenset = FEATURES, *, max_wrs: int = 14) -> Workload:
    """Workload number ``seed``: the same seed and features give the same workload."""
    rng = random.Random(seed)
    big_left = [2]      # at most two large messages a workload: the run time stays modest
    rnr_taken = [False]
    names = sorted(MKEY_KINDS)
    kinds = itertools.cycle(names[seed % len(names):] + names[:seed % len(names)])
    acts = ["drop", "duplicate", "reorder"]
    actions = itertools.cycle(acts[seed % 3:] + acts[:seed % 3])
    mrs, mkeys, pairs = [], [], []
    for i in range(rng.choice((1, 2, 2, 3))):
        g = _PairGen(rng, f"p{i}", frozenset(features), big_left, rnr_taken, kinds,
                     actions)
        g.draw(rng.randint(3, max_wrs))
        pair = g.finish()
        mrs += g.mrs
        mkeys += g.mkeys
        pairs.append(pair)
    return Workload(seed, mrs, mkeys, pairs)


def initial_bytes(spec: MrSpec) -> bytes:
    return random.Random(spec.seed).randbytes(spec.size)
