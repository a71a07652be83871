"""The differential test's harness (tests/e2e/test_differential.py): a pair of
configurations of the data path that must be indistinguishable from outside, run on
the same seeded workloads, and what each run showed compared.

A **configuration** is what one side of a pair changes: environment variables of its
daemons and options of their ``softhca serve`` command line. ``PAIRS`` names the pairs;
a new data path (another engine, frame kind or send queue) joins with one line there.

Each configuration gets two fresh ``softhca serve`` processes (one peer token, each
with ``--capture``); the workloads (tests/support/diff_workload.py) run one after the
other, each on control sessions of its own (its QPs, MRs, fault rules go when they
close). For each workload a run records:

- **completions**, per QP in order: wr_id, status, opcode, byte_len, imm_data,
  wc_flags, vendor_err, the invalidated key and the QP (both by name). Every WR is
  signaled; once the requester's WRs have all completed, both QPs are moved to ERR, so
  the receives still posted complete with IBV_WC_WR_FLUSH_ERR and are compared too (an
  error status makes the rest of the QP's WRs flush: compared in order as well);
- **memory**: every MR's bytes on both daemons, and each signature MKEY's
  mlx5dv_mkey_check(3) (error type, actual and expected values, offset);
- **packets**: what each daemon sent, from its capture, normalised by
  tests/support/diff_wire.py (identities mapped through the run's own names, PSNs
  relative, retransmissions and ACK coalescing taken out as its docstring says).

``compare`` lists the differences of two runs of one workload; an empty list is
"indistinguishable".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

import diff_wire as dw
import diff_workload as dwl

import softhca.client as sh
from softhca.tools.daemons import OWN_SESSION, stop_all, wait_file

TIMEOUT = 30.0          # seconds a workload's completions may take on a loaded machine
RNR_WAIT = 10.0         # seconds the SENDs of an RNR case may take to find no receive


@dataclass(frozen=True)
class Config:
    """One side of a pair: ``env`` for its daemons' environment, ``args`` added to their
    ``softhca serve`` command line."""

    name: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pair:
    """Two configurations that must be indistinguishable, and the workload features
    that exercise what differs between them (diff_workload.FEATURES)."""

    name: str
    a: Config
    b: Config
    features: frozenset = dwl.FEATURES
    # Why the pair cannot run here (None: it can): a function of nothing, asked at run time.
    missing: object = None


def _native_missing() -> str | None:
    from engine_backends import native_missing

    return native_missing()


# The pairs. A data path that must behave as the reference does joins with one line:
# Pair("name", Config("reference", ...), Config("new", env=..., args=...)).
PAIRS = (
    Pair("engine native/python",
         Config("native", env=(("SOFTHCA_ENGINE", "native"),)),
         Config("python", env=(("SOFTHCA_ENGINE", "python"),)),
         missing=_native_missing),
    Pair("trains on/off", Config("trains"), Config("no-trains", args=("--no-trains",))),
)


# -- what a run saw -------------------------------------------------------------------------

@dataclass
class Raw:
    """One workload's run on one configuration, as seen (identities not yet mapped)."""

    seed: int
    ids: dw.Identities
    completions: dict[str, list[sh.WC]]
    memory: dict[str, bytes]
    mkey_checks: dict[str, tuple]
    faults: bool
    window: tuple[float, float]
    frames: list[dw.Frame] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


@dataclass
class Observed:
    """A Raw made comparable: what the comparison reads."""

    completions: dict[str, list[tuple]]
    memory: dict[str, bytes]
    mkey_checks: dict[str, tuple]
    wire: dict[str, dw.QpWire]
    problems: list[str]

    @property
    def packets(self) -> int:
        return sum(w.packets for w in self.wire.values())


def observe(raw: Raw) -> Observed:
    ids = raw.ids
    problems = list(raw.problems)
    comps = {}
    for name, wcs in raw.completions.items():
        port = ids.port_of[name]
        comps[name] = [(wc.wr_id, int(wc.status), int(wc.opcode), wc.byte_len, wc.imm_data,
                        int(wc.wc_flags), wc.vendor_err,
                        dw._key(ids, port, wc.invalidated_rkey) if wc.invalidated_rkey else None,
                        ids.qps.get((port, wc.qp_num), f"QPN {wc.qp_num:#x}?"))
                       for wc in wcs]
    try:
        wire = dw.normalise(ids, raw.frames, raw.faults)
    except dw.FrameError as e:
        problems.append(f"capture: {e}")
        wire = {}
    return Observed(comps, raw.memory, raw.mkey_checks, wire, problems)


WC_FIELDS = ("wr_id", "status", "opcode", "byte_len", "imm_data", "wc_flags", "vendor_err",
             "invalidated_rkey", "qp_num")


def compare(a: Observed, b: Observed, limit: int = 8) -> list[str]:
    """The differences between two runs of one workload (empty: none)."""
    out = [f"A: {p}" for p in a.problems] + [f"B: {p}" for p in b.problems]
    for name in sorted(set(a.completions) | set(b.completions)):
        xs, ys = a.completions.get(name, []), b.completions.get(name, [])
        for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
            if x != y:
                fields = [f"{WC_FIELDS[k]} {x[k]!r} / {y[k]!r}" for k in range(len(x))
                          if x[k] != y[k]]
                out.append(f"{name} completion {i} (wr_id {x[0]}): {', '.join(fields)}")
                break
        if len(xs) != len(ys):
            out.append(f"{name}: {len(xs)} completions in A, {len(ys)} in B")
    for name in sorted(set(a.memory) | set(b.memory)):
        x, y = a.memory.get(name), b.memory.get(name)
        if x != y:
            if x is None or y is None:
                out.append(f"MR {name}: read in one run only")
                continue
            at = next((j for j in range(min(len(x), len(y))) if x[j] != y[j]), min(len(x), len(y)))
            n = sum(1 for j in range(min(len(x), len(y))) if x[j] != y[j])
            out.append(f"MR {name}: {n} bytes differ, the first at offset {at}")
    for name in sorted(set(a.mkey_checks) | set(b.mkey_checks)):
        if a.mkey_checks.get(name) != b.mkey_checks.get(name):
            out.append(f"mkey_check {name}: A {a.mkey_checks.get(name)}, "
                       f"B {b.mkey_checks.get(name)}")
    for name in sorted(set(a.wire) | set(b.wire)):
        if name not in a.wire or name not in b.wire:
            out.append(f"packets to {name}: captured in one run only")
            continue
        out += dw.diff_qp(name, a.wire[name], b.wire[name])
    return out[:limit] + ([f"... and {len(out) - limit} more"] if len(out) > limit else [])


# -- daemons --------------------------------------------------------------------------------

class Daemons:
    """Two ``softhca serve`` processes of configuration ``config``, each capturing to a
    pcap in ``workdir``; ``stop()`` ends them, which closes the captures whole."""

    def __init__(self, config: Config, workdir: str) -> None:
        self.config, self.workdir = config, workdir
        self.procs: list[subprocess.Popen] = []
        self.addresses: list[str] = []
        self.captures: list[str] = []

    def start(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        peer = os.path.join(self.workdir, "peer_token")
        fd = os.open(peer, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        env = {**os.environ, **dict(self.config.env)}
        for i in range(2):
            ready = os.path.join(self.workdir, f"daemon{i}.ready")
            capture = os.path.join(self.workdir, f"daemon{i}.pcap")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ready)        # a ready file left by an earlier run names its port
            log = open(os.path.join(self.workdir, f"daemon{i}.log"), "wb")
            with log:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "softhca.tools.cli", "serve", "--listen",
                     "127.0.0.1:0", "--ready-file", ready, "--log-level", "warning",
                     "--peer-token-file", peer, "--capture", capture, *self.config.args],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, **OWN_SESSION))
            self.captures.append(capture)
        try:
            for i, proc in enumerate(self.procs):
                self.addresses.append(wait_file(os.path.join(self.workdir, f"daemon{i}.ready"),
                                                [proc], f"{self.config.name} daemon {i}"))
        except BaseException:
            self.stop()
            raise

    @property
    def ports(self) -> list[int]:
        return [int(a.rsplit(":", 1)[1]) for a in self.addresses]

    def stop(self) -> list[int]:
        stop_all(self.procs)
        return [p.returncode for p in self.procs]

    def frames(self) -> list[list[dw.Frame]]:
        """What each daemon sent ("tx"), in its capture's order."""
        out = []
        for path, port in zip(self.captures, self.ports, strict=True):
            frames = []
            for ts, frame in dw.read_frames(path):
                fr = dw.parse_frame(frame, ts)
                if fr.src_port == port & 0xFFFF:
                    frames.append(fr)
            out.append(frames)
        return out


async def run_config(config: Config, workloads: list[dwl.Workload], workdir: str) -> list[Raw]:
    """Every workload on fresh daemons of ``config``; the captures split between them."""
    d = Daemons(config, workdir)
    await asyncio.to_thread(d.start)
    raws = []
    try:
        for wl in workloads:
            raws.append(await run_workload(d.addresses, d.ports, wl))
        dropped = 0
        for address in d.addresses:
            async with await sh.connect(address) as node:
                dropped += (await node.counters()).get("capture_dropped", 0)
    finally:
        codes = await asyncio.to_thread(d.stop)
    if dropped:
        for raw in raws:
            raw.problems.append(f"the daemons' captures dropped {dropped} packets")
    if any(codes):
        for raw in raws:
            raw.problems.append(f"the daemons exited with {codes}")
    split_frames(raws, d.frames(), d.ports)
    return raws


def split_frames(raws: list[Raw], frames: list[list[dw.Frame]], ports: list[int]) -> None:
    """Each daemon's frames to the workload that ran when it sent them (its time window)
    and owns its destination QP."""
    for raw in raws:
        lo, hi = raw.window
        for i, frs in enumerate(frames):
            peer = ports[1 - i]
            # Each daemon's frames in its capture's order: the order it sent them in.
            raw.frames += [fr for fr in frs if lo <= fr.ts <= hi
                           and (peer, fr.dest_qp) in raw.ids.qps]


# -- one workload ---------------------------------------------------------------------------

@dataclass
class _Side:
    node: sh.Node
    ctx: sh.Context
    pd: sh.PD
    port: int


async def run_workload(addresses: list[str], ports: list[int], wl: dwl.Workload) -> Raw:
    t0 = time.time()
    nodes = [await sh.connect(a) for a in addresses]
    try:
        return await _run(nodes, ports, wl, t0)
    finally:
        for n in nodes:
            with contextlib.suppress(sh.RDMAError, OSError):
                await n.close()


async def _run(nodes: list[sh.Node], ports: list[int], wl: dwl.Workload, t0: float) -> Raw:
    sides = []
    for node, port in zip(nodes, ports, strict=True):
        ctx = await node.open_device()
        sides.append(_Side(node, ctx, await ctx.alloc_pd(), port))
    ids = dw.Identities({}, {}, {}, {}, {})
    mrs: dict[str, sh.MR] = {}
    specs = {m.name: m for m in wl.mrs}
    for m in wl.mrs:
        mr = await sides[m.side].pd.reg_mr(m.size, m.access)
        await mr.write(dwl.initial_bytes(m))
        mrs[m.name] = mr
        for key in {mr.lkey, mr.rkey}:
            ids.keys[(sides[m.side].port, key)] = (m.name, mr.addr)
    qps: dict[str, tuple[sh.QP, sh.CQ, sh.CQ]] = {}
    for p in wl.pairs:
        names = (f"{p.name}.req", f"{p.name}.resp")
        for name, side in zip(names, (p.requester, 1 - p.requester), strict=True):
            s = sides[side]
            scq, rcq = await s.ctx.create_cq(1024), await s.ctx.create_cq(1024)
            qp = await s.pd.create_qp(sh.QPInitAttr(
                qp_type=sh.IBV_QPT_RC, scq=scq, rcq=rcq, sq_sig_all=1,
                cap=sh.QPCap(max_send_wr=len(p.wrs) + 8, max_recv_wr=len(p.recvs) + 8,
                             max_send_sge=4, max_recv_sge=4, max_inline_data=256),
                send_ops_flags=sh.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE))
            qps[name] = (qp, scq, rcq)
            ids.qps[(s.port, qp.qp_num)] = name
            ids.sq_psn[name] = qp.psn
            ids.port_of[name] = s.port
            ids.mtu[name] = p.mtu
        ids.peer[names[0]], ids.peer[names[1]] = names[1], names[0]
        req, resp = qps[names[0]][0], qps[names[1]][0]
        # Timers short enough for a dropped last packet to cost ~130 ms, long enough
        # (7 retries) that a loaded machine does not exhaust them.
        kw = dict(timeout=15, retry_cnt=7, rnr_retry=7, min_rnr_timer=14)
        await req.connect(resp.info(), path_mtu=dwl.MTUS[p.mtu], **kw)
        await resp.connect(req.info(), path_mtu=dwl.MTUS[p.mtu], **kw)
    mkeys: dict[str, sh.MKey] = {}
    local_wrs: dict[str, int] = {name: 0 for name in qps}
    for m in wl.mkeys:
        s = sides[m.side]
        pair = next(p for p in wl.pairs if m.name.startswith(p.name + "."))
        qname = f"{pair.name}.resp"
        mkeys[m.name] = await _mkey(s, qps[qname][0], m, mrs[m.mr], 0xC0 + local_wrs[qname])
        local_wrs[qname] += 1
        ids.keys[(s.port, mkeys[m.name].rkey)] = (m.name, 0)
    for p in wl.pairs:
        for rule in p.faults:
            on = f"{p.name}.req" if rule["on"] == "requester" else f"{p.name}.resp"
            side = p.requester if rule["on"] == "requester" else 1 - p.requester
            fields = {k: v for k, v in rule.items() if k != "on"}
            await sides[side].node.faults.add(qp=qps[on][0].qp_num, **fields)

    async def pair_traffic(p: dwl.PairSpec) -> None:
        req, resp = qps[f"{p.name}.req"][0], qps[f"{p.name}.resp"][0]
        recvs = [sh.RecvWR(wr_id=0x10000 + i, sg=[_sge(mrs[n], o, ln) for n, o, ln in sg])
                 for i, sg in enumerate(p.recvs)]
        if recvs and not p.rnr:
            await resp.post_recv(recvs)
        wrs = [_send_wr(i + 1, w, mrs, mkeys, specs, p) for i, w in enumerate(p.wrs)]
        at = 0
        for k in p.chunks:
            await req.post_send(wrs[at:at + k])
            at += k
        if recvs and p.rnr:
            # The SENDs find no receive: RNR NAKs until these are posted, once the
            # requester has had one (its daemon counts them: rnr_retries).
            node = sides[p.requester].node
            deadline = time.monotonic() + RNR_WAIT
            while (await node.counters()).get("rnr_retries", 0) <= rnr_before[p.name]:
                if time.monotonic() > deadline:
                    problems.append(f"{p.name}: no RNR NAK within {RNR_WAIT:g} s")
                    break
                await asyncio.sleep(0.005)
            await resp.post_recv(recvs)

    problems: list[str] = []
    rnr_before = {p.name: (await sides[p.requester].node.counters()).get("rnr_retries", 0)
                  for p in wl.pairs if p.rnr}
    await asyncio.gather(*(pair_traffic(p) for p in wl.pairs))
    completions: dict[str, list[sh.WC]] = {name: [] for name in qps}
    for p in wl.pairs:
        rq, rscq, rrcq = qps[f"{p.name}.req"]
        sq, sscq, srcq = qps[f"{p.name}.resp"]
        completions[f"{p.name}.req"] += await _poll(rscq, len(p.wrs), problems, p.name)
        completions[f"{p.name}.resp"] += await _poll(sscq, local_wrs[f"{p.name}.resp"],
                                                     problems, p.name)
    for p in wl.pairs:
        for role in ("req", "resp"):
            qp, scq, rcq = qps[f"{p.name}.{role}"]
            await qp.modify(sh.QPAttr(qp_state=sh.IBV_QPS_ERR))
        sq, sscq, srcq = qps[f"{p.name}.resp"]
        completions[f"{p.name}.resp"] += await _poll(srcq, len(p.recvs), problems, p.name)
    for name, (_qp, scq, rcq) in qps.items():
        # Nothing more may come: a completion past the counts above is a difference too.
        for cq in (scq, rcq):
            completions[name] += await cq.poll(64, timeout=0.0)
    memory = {name: await mr.read() for name, mr in mrs.items()}
    checks = {}
    for m in wl.mkeys:
        if m.kind != "inv" and dwl.MKEY_KINDS[m.kind][3] is not None:
            e = await mkeys[m.name].mkey_check()
            checks[m.name] = (int(e.err_type), e.sig_err.actual_value, e.sig_err.expected_value,
                              e.sig_err.offset)
    return Raw(wl.seed, ids, completions, memory, checks, wl.has_faults, (t0, time.time()),
               problems=problems)


async def _poll(cq: sh.CQ, n: int, problems: list[str], what: str) -> list[sh.WC]:
    out: list[sh.WC] = []
    deadline = time.monotonic() + TIMEOUT
    while len(out) < n and time.monotonic() < deadline:
        out += await cq.poll(min(n - len(out), 4096), timeout=deadline - time.monotonic())
    if len(out) < n:
        problems.append(f"{what}: {len(out)} of {n} completions within {TIMEOUT:g} s")
    return out


def _sge(mr: sh.MR, offset: int, length: int) -> sh.SGE:
    return sh.SGE(mr.addr + offset, length, mr.lkey)


def _send_wr(wr_id: int, w: dwl.WrSpec, mrs, mkeys, specs, p: dwl.PairSpec) -> sh.SendWR:
    flags = sh.IBV_SEND_SIGNALED | (sh.IBV_SEND_INLINE if w.inline else 0)
    wr = sh.SendWR(wr_id=wr_id, opcode=w.opcode, imm_data=w.imm, send_flags=flags,
                   sg=[_sge(mrs[n], o, ln) for n, o, ln in w.sg])
    if w.remote is not None:
        name, offset = w.remote
        if name == "bogus":
            # A key of the requester's own daemon: the responder has no such key.
            own = mrs[f"{p.name}.src"]
            wr.set_wr_rdma(own.rkey, own.addr)
        elif name in mkeys:
            wr.set_wr_rdma(mkeys[name].rkey, offset)
        else:
            mr = mrs[name]
            wr.set_wr_rdma(mr.rkey, mr.addr + (offset if offset >= 0 else mr.length + offset))
    if w.opcode in (sh.IBV_WR_ATOMIC_CMP_AND_SWP, sh.IBV_WR_ATOMIC_FETCH_AND_ADD,
                    sh.IBV_WR_ATOMIC_WRITE):
        compare = w.compare_add
        if compare == -1:
            tgt = specs[w.remote[0]]
            compare = struct.unpack_from("<Q", dwl.initial_bytes(tgt), w.remote[1])[0]
        wr.compare_add, wr.swap = compare, w.swap
    if w.invalidate is not None:
        wr.invalidate_rkey = mkeys[w.invalidate].rkey
    return wr


async def _mkey(s: _Side, qp: sh.QP, m: dwl.MkeySpec, mr: sh.MR, wr_id: int) -> sh.MKey:
    """mlx5dv_create_mkey over MR ``mr`` and its configure WR on ``qp`` (signaled)."""
    access = dwl.REMOTE_RW
    sges = [sh.SGE(mr.addr, mr.length, mr.lkey)]
    if m.kind == "inv":
        flags = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT | \
            sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE
        mkey = await s.pd.create_mkey(flags, 1)
        await qp.post_mkey_configure(mkey, access=access, sges=sges, wr_id=wr_id,
                                     wr_flags=sh.IBV_SEND_INLINE | sh.IBV_SEND_SIGNALED)
        return mkey
    _, _, _, sig, crypto = dwl.MKEY_KINDS[m.kind]
    flags = sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
    flags |= sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE if sig else 0
    flags |= sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO if crypto else 0
    mkey = await s.pd.create_mkey(flags, 1)
    cattr = None
    if crypto:
        dek = await s.ctx.create_dek(sh.Mlx5DEKInitAttr(
            pd=s.pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256, key=m.key))
        cattr = sh.Mlx5CryptoAttr(crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS,
                                  encrypt_on_tx=crypto == "tx",
                                  data_unit_size=sh.MLX5DV_BLOCK_SIZE_512,
                                  initial_tweak=m.tweak.to_bytes(16, "little"), dek=dek)
    await qp.post_mkey_configure(mkey, access=access, sges=sges, sig=sig() if sig else None,
                                 crypto=cattr, wr_id=wr_id,
                                 wr_flags=sh.IBV_SEND_INLINE | sh.IBV_SEND_SIGNALED)
    return mkey


# -- minimising a difference ----------------------------------------------------------------

def _only(wl: dwl.Workload, pair: dwl.PairSpec, wrs: int | None = None) -> dwl.Workload:
    """``wl`` cut down to QP pair ``pair`` (and its first ``wrs`` WRs)."""
    own = pair.name + "."
    cut = dataclasses.replace(pair, wrs=pair.wrs[:wrs] if wrs is not None else pair.wrs,
                              chunks=[])
    cut.chunks = [len(cut.wrs)] if cut.wrs else []
    return dwl.Workload(wl.seed, [m for m in wl.mrs if m.name.startswith(own)],
                        [m for m in wl.mkeys if m.name.startswith(own)], [cut])


async def differs(pair: Pair, workloads: list[dwl.Workload], workdir: str) -> list[list[str]]:
    """Each workload's differences between ``pair``'s two configurations (both run at
    once, each on its own daemons)."""
    ra, rb = await asyncio.gather(run_config(pair.a, workloads, os.path.join(workdir, "a")),
                                  run_config(pair.b, workloads, os.path.join(workdir, "b")))
    return [compare(observe(x), observe(y)) for x, y in zip(ra, rb, strict=True)]


async def minimise(pair: Pair, wl: dwl.Workload, workdir: str) -> tuple[dwl.Workload, list[str]]:
    """The smallest cut of ``wl`` found (one QP pair, then the shortest prefix of its WRs)
    that still differs, with its differences; ``wl`` itself when no cut does."""
    best, why = wl, []
    singles = [_only(wl, p) for p in wl.pairs]
    found = await differs(pair, singles, os.path.join(workdir, "pairs"))
    hit = next((i for i, d in enumerate(found) if d), None)
    if hit is None:
        return best, why
    best, why = singles[hit], found[hit]
    p = best.pairs[0]
    prefixes = [_only(best, p, n) for n in range(1, len(p.wrs))]
    if prefixes:
        found = await differs(pair, prefixes, os.path.join(workdir, "prefixes"))
        hit = next((i for i, d in enumerate(found) if d), None)
        if hit is not None:
            best, why = prefixes[hit], found[hit]
    return best, why


def describe(wl: dwl.Workload) -> str:
    """A workload as text, for a failure's report."""
    lines = [f"workload seed {wl.seed}:"]
    for m in wl.mkeys:
        lines.append(f"  MKEY {m.name}: {m.kind}, {m.blocks} blocks over {m.mr}")
    for p in wl.pairs:
        lines.append(f"  {p.name}: requester on daemon {p.requester}, MTU {p.mtu}, "
                     f"rnr {p.rnr}, faults {p.faults}, {len(p.recvs)} receives")
        for i, w in enumerate(p.wrs):
            lines.append(f"    wr {i + 1}: opcode {w.opcode} sg {w.sg} remote {w.remote}"
                         + (f" imm {w.imm:#x}" if w.imm is not None else "")
                         + (" inline" if w.inline else "")
                         + (f" invalidate {w.invalidate}" if w.invalidate else ""))
    return "\n".join(lines)
