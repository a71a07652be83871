"""``softhca bench``: two ``softhca serve`` processes on loopback, driven end to end.

What an application sees through softhca.client: goodput of RDMA_WRITE, RDMA_READ and
SEND between two `softhca serve` processes on loopback, small-message latency, and many
QPs at once. Every goodput figure stands beside two ceilings measured in the same run
(ceilings.py): a plain asyncio TCP stream between two processes moving the same wire
bytes in the same message sizes, and the engine's transform alone for the target side
of the same configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict

import numpy as np

from ... import client as sh
from ...engine import guards
from ..daemons import Daemons
from ..harness import Side
from .ceilings import engine_ceilings, tcp_ceilings, tcp_chain, tcp_round_trip
from .common import (
    CONFIG_TITLES,
    CONFIGS,
    DEFAULT_MTU,
    EXTRA_ROWS,
    KIB,
    LATENCY_BYTES,
    MANY_QPS_BYTES,
    MIB,
    OPS,
    SIZES,
    T10DIF_512,
    TARGET_DIRECTION,
    TWEAK,
    BenchError,
    E2EOptions,
    mb_s,
    percentile,
    run_loop,
    sig4,
    size_text,
    wakeups,
    wire_size,
    xts_key,
)
from .engine import engine_backend_info
from .ucx import attach_ucx_ratios, ucx_rows

MTU_ENUM = {256: sh.IBV_MTU_256, 512: sh.IBV_MTU_512, 1024: sh.IBV_MTU_1024,
            2048: sh.IBV_MTU_2048, 4096: sh.IBV_MTU_4096}
COMPLETION_TIMEOUT = 60.0


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def e2e_machine_info() -> dict:
    try:
        import uvloop
        uv = uvloop.__version__
    except ImportError:
        uv = None
    try:
        with open("/sys/class/net/lo/mtu") as f:
            lo_mtu = int(f.read())
    except (OSError, ValueError):
        lo_mtu = None
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "uvloop": uv,
        "loopback": {"address": "127.0.0.1", "interface": "lo", "mtu": lo_mtu},
        # The machines are shared: other processes' load shows in every figure.
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "guard_backends": {kind: guards.backend(kind) for kind in guards.GUARD_KINDS},
        # The daemons inherit SOFTHCA_ENGINE from this process, so they run this engine.
        **engine_backend_info(),
    }




# -- goodput and latency over one QP pair ------------------------------------------------

E2E_ACCESS = (sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE
              | sh.IBV_ACCESS_REMOTE_READ)
OPCODES = {"RDMA_WRITE": sh.IBV_WR_RDMA_WRITE, "RDMA_READ": sh.IBV_WR_RDMA_READ,
           "SEND": sh.IBV_WR_SEND}


def _wc_ok(wcs: list, what: str) -> None:
    for wc in wcs:
        if wc.status != sh.IBV_WC_SUCCESS:
            raise BenchError(f"{what}: a work request failed: {wc}")


class _Pair:
    """One RC QP pair for one configuration: the initiator (daemon B) posts, the target
    (daemon A) is written, read and sent to through a plain MR or its MKEY."""

    def __init__(self, config: str, target: Side, initiator: Side, opts: E2EOptions,
                 path_mtu: int = DEFAULT_MTU) -> None:
        self.config, self.t, self.i, self.opts = config, target, initiator, opts
        self.path_mtu = path_mtu
        self.top = max(SIZES)
        self.memory = np.random.default_rng(4791).integers(0, 256, self.top,
                                                           dtype=np.uint8).tobytes()
        self.rq = 4 * opts.depth

    @classmethod
    async def create(cls, config: str, tnode: sh.Node, inode: sh.Node,
                     opts: E2EOptions, path_mtu: int = DEFAULT_MTU) -> _Pair:
        t, i = [await Side.open(role, node, cqe=4096, max_send_wr=2 * opts.depth + 4,
                                max_recv_wr=4 * opts.depth, max_sge=1)
                for role, node in (("target", tnode), ("initiator", inode))]
        self = cls(config, t, i, opts, path_mtu)
        await t.qp.connect(i.qp.info(), path_mtu=MTU_ENUM[path_mtu])
        await i.qp.connect(t.qp.info(), path_mtu=MTU_ENUM[path_mtu])
        self.t_mr = await t.pd.reg_mr(self.top, E2E_ACCESS)
        await self.t_mr.write(self.memory)
        self.i_mr = await i.pd.reg_mr(wire_size(config, self.top), E2E_ACCESS)
        self.mkey = None
        if config == "plain":
            await self.i_mr.write(self.memory)
            self.rkey, self.raddr = self.t_mr.rkey, self.t_mr.addr
            self.recv_sge = sh.SGE(self.t_mr.addr, self.top, self.t_mr.lkey)
        else:
            self.mkey = await self._mkey(config)
            self.rkey, self.raddr = self.mkey.rkey, 0
            self.recv_sge = sh.SGE(0, wire_size(config, self.top), self.mkey.lkey)
            # The initiator's buffer gets the wire image by reading the target's MKEY,
            # so that what it writes and sends later carries valid T10-DIF (and XTS).
            await i.qp.post_send(self._wr(sh.IBV_WR_RDMA_READ, wire_size(config, self.top)))
            _wc_ok(await i.scq.poll_n(1, COMPLETION_TIMEOUT), "reading the wire image")
        await self._post_recvs(self.rq)
        return self

    async def _mkey(self, config: str) -> sh.MKey:
        t = self.t
        flags = (sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT
                 | sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE)
        crypto = None
        if config == "row_c":
            flags |= sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO
            dek = await t.ctx.create_dek(sh.Mlx5DEKInitAttr(
                pd=t.pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256,
                key=xts_key(np.random.default_rng(1619))))
            order = sh.MLX5DV_SIGNATURE_CRYPTO_ORDER_SIGNATURE_BEFORE_CRYPTO_ON_TX
            crypto = sh.Mlx5CryptoAttr(
                crypto_standard=sh.MLX5DV_CRYPTO_STANDARD_AES_XTS, encrypt_on_tx=True,
                signature_crypto_order=order,
                data_unit_size=sh.MLX5DV_BLOCK_SIZE_520, initial_tweak=TWEAK, dek=dek)
        mkey = await t.pd.create_mkey(flags, 1)
        qp = t.qp
        qp.wr_start()
        qp.wr_id, qp.wr_flags = 0, sh.IBV_SEND_INLINE
        qp.wr_mkey_configure(mkey, 4 if crypto else 3, sh.Mlx5MkeyConfAttr())
        qp.wr_set_mkey_access_flags(E2E_ACCESS)
        qp.wr_set_mkey_layout_list([sh.SGE(self.t_mr.addr, self.top, self.t_mr.lkey)])
        qp.wr_set_mkey_sig_block(sh.Mlx5SigBlockAttr(mem=None, wire=T10DIF_512,
                                                     check_mask=0xFF))
        if crypto:
            qp.wr_set_mkey_crypto(crypto)
        await qp.wr_complete()
        return mkey

    def _wr(self, opcode: int, length: int, signaled: bool = True) -> sh.SendWR:
        wr = sh.SendWR(wr_id=length, opcode=opcode,
                       sg=[sh.SGE(self.i_mr.addr, length, self.i_mr.lkey)],
                       send_flags=sh.IBV_SEND_SIGNALED if signaled else 0)
        if opcode != sh.IBV_WR_SEND:
            wr.set_wr_rdma(self.rkey, self.raddr)
        return wr

    async def _post_recvs(self, n: int) -> None:
        # Every receive takes the largest message, so a smaller one lands in any of them.
        if n:
            await self.t.qp.post_recv([sh.RecvWR(wr_id=1, sg=[self.recv_sge])] * n)

    async def _stream(self, op: str, size: int, depth: int, seconds: float,
                      budget: int) -> tuple[int, float]:
        """Keep ``depth`` WRs in flight, posted in lists of ``batch`` with the last one
        signaled, for ``seconds`` or ``budget`` messages; (messages completed, seconds)."""
        batch = max(1, depth // 4)
        lists = max(1, depth // batch)
        wl = wire_size(self.config, size)
        wrs = [self._wr(OPCODES[op], wl, signaled=(k == batch - 1)) for k in range(batch)]
        i = self.i
        state = {"sent": 0, "done": False, "received": 0, "credit": asyncio.Event()}
        receiver = None
        if op == "SEND":
            receiver = asyncio.get_running_loop().create_task(self._receiver(state))
        posted = outstanding = completed = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds

        def credit() -> bool:
            # A SEND goes only against a receive the target's application has posted
            # (the rq first posted, then one per receive it took and posted again), as
            # a SEND-based protocol keeps credits: the rows measure the transport, not
            # RNR NAKs and the go-back-N after each when the receiving task falls behind.
            return receiver is None or posted + batch <= self.rq + state["received"]

        try:
            while outstanding < lists and (posted == 0 or posted + batch <= budget) and credit():
                await i.qp.post_send(wrs)
                posted += batch
                outstanding += 1
            while outstanding:
                wcs = await i.scq.poll(num_entries=lists, timeout=COMPLETION_TIMEOUT)
                if not wcs:
                    raise BenchError(f"{op} {size_text(size)}: no completion within "
                                     f"{COMPLETION_TIMEOUT:g} s")
                _wc_ok(wcs, f"{op} {size_text(size)}")
                outstanding -= len(wcs)
                completed += len(wcs) * batch
                while (outstanding < lists and posted + batch <= budget
                       and time.perf_counter() < deadline):
                    if not credit():
                        if outstanding:
                            break       # completions come first; credit is asked again
                        await self._await_credit(state, op, size)
                        continue
                    await i.qp.post_send(wrs)
                    posted += batch
                    outstanding += 1
            elapsed = time.perf_counter() - t0
            if receiver is not None:
                state["sent"], state["done"] = completed, True
                await asyncio.wait_for(receiver, COMPLETION_TIMEOUT)
        finally:
            if receiver is not None and not receiver.done():
                receiver.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await receiver
        return completed, elapsed

    async def _receiver(self, state: dict) -> None:
        """The target's application: take receive completions, post receives again, and
        tell the sender of the credit each gives back."""
        while not (state["done"] and state["received"] >= state["sent"]):
            wcs = await self.t.rcq.poll(num_entries=self.rq, timeout=0.05)
            _wc_ok(wcs, "SEND's receive")
            await self._post_recvs(len(wcs))
            state["received"] += len(wcs)
            if wcs:
                state["credit"].set()

    @staticmethod
    async def _await_credit(state: dict, op: str, size: int) -> None:
        state["credit"].clear()
        try:
            await asyncio.wait_for(state["credit"].wait(), COMPLETION_TIMEOUT)
        except TimeoutError:
            raise BenchError(f"{op} {size_text(size)}: the target's application posted no "
                             f"receive within {COMPLETION_TIMEOUT:g} s") from None

    async def goodput(self, op: str, size: int) -> dict:
        o = self.opts
        depth = max(1, min(o.depth, int(o.inflight_mib * MIB) // size))
        # One untimed list first: QP and link warm, first-use costs paid.
        await self._stream(op, size, depth, 0.0, 1)
        budget = max(1, int(o.mib * MIB) // size)
        messages, seconds = await self._stream(op, size, depth, o.seconds, budget)
        return {"op": op, "config": self.config, "size": size, "path_mtu": self.path_mtu,
                "wire_size": wire_size(self.config, size), "depth": depth,
                "messages": messages, "bytes": messages * size, "seconds": round(seconds, 6),
                "mb_s": round(mb_s(messages * size, seconds), 1)}

    async def latency(self, samples: int, pids: tuple[int, ...] = ()) -> dict:
        """A 64-byte RDMA_WRITE, one outstanding, signaled: from the post_send call to the
        return of the poll that delivers its completion; with ``pids`` (the target's and
        the initiator's daemon), the wake-ups each process took per sample."""
        i = self.i
        wr = sh.SendWR(wr_id=7, opcode=sh.IBV_WR_RDMA_WRITE,
                       sg=[sh.SGE(self.i_mr.addr, LATENCY_BYTES, self.i_mr.lkey)])
        wr.set_wr_rdma(self.rkey, self.raddr)
        times, posts = [], []
        warm = min(20, samples)
        woke = wakeups(list(pids))
        for n in range(samples + warm):
            t0 = time.perf_counter()
            await i.qp.post_send(wr)
            tp = time.perf_counter()
            wcs = await i.scq.poll(num_entries=1, timeout=COMPLETION_TIMEOUT)
            t1 = time.perf_counter()
            if not wcs:
                raise BenchError(f"latency: no completion within {COMPLETION_TIMEOUT:g} s")
            _wc_ok(wcs, "latency")
            if n >= warm:
                times.append(t1 - t0)
                posts.append(tp - t0)
        woke = [(b - a) / (samples + warm) for a, b in
                zip(woke, wakeups(list(pids)), strict=True)]
        # The floor under it: one control request and its reply. The cheapest request
        # there is ("devices"): a poll no longer makes one, its completions are pushed.
        rtts = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await i.node.request("devices")
            rtts.append(time.perf_counter() - t0)
        us = sorted(t * 1e6 for t in times)
        rtt = sorted(t * 1e6 for t in rtts)
        post = sorted(t * 1e6 for t in posts)
        after = sorted((t - p) * 1e6 for t, p in zip(times, posts, strict=True))
        return {"op": "RDMA_WRITE", "config": "plain", "size": LATENCY_BYTES,
                "samples": len(us), "p50_us": round(percentile(us, 50), 1),
                "p99_us": round(percentile(us, 99), 1), "min_us": round(us[0], 1),
                "max_us": round(us[-1], 1), "mean_us": round(statistics.fmean(us), 1),
                "control_rtt_p50_us": round(percentile(rtt, 50), 1),
                "control_rtt_p99_us": round(percentile(rtt, 99), 1),
                # Where one sample's time goes: post_send's own round trip (the call to
                # its reply), then the wait for the pushed completion after it.
                "breakdown": {"post_send_p50_us": round(percentile(post, 50), 1),
                              "completion_after_post_p50_us": round(percentile(after, 50),
                                                                    1),
                              **_wakeup_fields(pids, woke)}}

    async def verify(self) -> dict:
        """The target's memory still holds what it started with (every WRITE and SEND
        put the same bytes back), and its MKEY latched no signature error."""
        span = min(self.top, 64 * KIB)
        same = await self.t_mr.read(span) == self.memory[:span]
        err = "none"
        if self.mkey is not None:
            e = await self.mkey.mkey_check()
            if e.err_type != sh.MLX5DV_MKEY_NO_ERR:
                err = repr(e)
        return {"config": self.config, "path_mtu": self.path_mtu, "memory_intact": same,
                "mkey_error": err}


# -- 1,000 QPs across 100 connections -----------------------------------------------------

async def many_qps(addresses: list[str], opts: E2EOptions) -> dict:
    """``sessions`` control sessions, half on each daemon, paired; ``qp_pairs`` connected
    QP pairs spread over the session pairs; each initiator QP RDMA_WRITEs
    ``writes_per_qp`` 4 KiB messages. Setup and the message phase are timed apart."""
    per_side = max(1, opts.sessions // 2)
    counts = [opts.qp_pairs // per_side + (k < opts.qp_pairs % per_side)
              for k in range(per_side)]
    sessions: list[sh.Node] = []
    t0 = time.perf_counter()
    try:
        a = await _connect_all(addresses[0], per_side, sessions)
        b = await _connect_all(addresses[1], per_side, sessions)
        groups = await asyncio.gather(*(_qp_group(a[k], b[k], counts[k], opts)
                                        for k in range(per_side)))
        setup = time.perf_counter() - t0
        t1 = time.perf_counter()
        done = await asyncio.gather(*(_write_group(g, opts) for g in groups))
        seconds = time.perf_counter() - t1
    finally:
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    expected = sum(counts) * opts.writes_per_qp
    completed = sum(done)
    return {"sessions": 2 * per_side, "qp_pairs": sum(counts), "qps": 2 * sum(counts),
            "writes_per_qp": opts.writes_per_qp, "size": MANY_QPS_BYTES,
            "setup_s": round(setup, 3), "messages": expected, "completed": completed,
            "all_completed": completed == expected, "seconds": round(seconds, 6),
            "msg_per_s": round(completed / max(seconds, 1e-12), 1),
            "mb_s": round(mb_s(completed * MANY_QPS_BYTES, seconds), 1)}


async def _connect_all(address: str, n: int, opened: list[sh.Node]) -> list[sh.Node]:
    """``n`` control sessions at once; every one that opened is in ``opened`` (to be
    closed) even when another failed."""
    results = await asyncio.gather(*(sh.connect(address) for _ in range(n)),
                                   return_exceptions=True)
    nodes = [r for r in results if isinstance(r, sh.Node)]
    opened += nodes
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return nodes


async def _qp_group(a: sh.Node, b: sh.Node, n: int, opts: E2EOptions) -> dict:
    sides = []
    for node in (a, b):
        ctx = await node.open_device("mlx5_0")
        pd = await ctx.alloc_pd()
        cq = await ctx.create_cq(max(64, 2 * n * opts.writes_per_qp))
        mr = await pd.reg_mr(MANY_QPS_BYTES, E2E_ACCESS)
        sides.append((pd, cq, mr))
    qps = []
    for _ in range(n):
        pair = []
        for pd, cq, _mr in sides:
            pair.append(await pd.create_qp(sh.QPInitAttr(
                qp_type=sh.IBV_QPT_RC, scq=cq, rcq=cq,
                cap=sh.QPCap(max_send_wr=max(4, opts.writes_per_qp), max_recv_wr=1))))
        qa, qb = pair
        await qa.connect(qb.info(), path_mtu=sh.IBV_MTU_4096)
        await qb.connect(qa.info(), path_mtu=sh.IBV_MTU_4096)
        qps.append(qa)
    return {"qps": qps, "a": sides[0], "b": sides[1]}


async def _write_group(g: dict, opts: E2EOptions) -> int:
    _, cq, mr = g["a"]
    _, _, remote = g["b"]
    wr = sh.SendWR(opcode=sh.IBV_WR_RDMA_WRITE, sg=[sh.SGE(mr.addr, MANY_QPS_BYTES, mr.lkey)])
    wr.set_wr_rdma(remote.rkey, remote.addr)
    for qp in g["qps"]:
        await qp.post_send([wr] * opts.writes_per_qp)
    n = len(g["qps"]) * opts.writes_per_qp
    wcs = await cq.poll_n(n, COMPLETION_TIMEOUT)
    return sum(wc.status == sh.IBV_WC_SUCCESS for wc in wcs)


def _wakeup_fields(pids: tuple[int, ...], woke: list[float]) -> dict:
    """Wake-ups per latency sample: each process's and the sum (the TCP chain's is 4:
    the forwarder twice, the echo once, the client once)."""
    if not pids:
        return {}
    per = dict(zip(("target", "initiator", "client"), (round(w, 2) for w in woke),
                   strict=True))
    return {"wakeups_per_sample": {**per, "total": round(sum(woke), 2)}}


# -- the whole run -------------------------------------------------------------------------

def _cpu_seconds(pids: list[int]) -> list[float]:
    """CPU time (user + system) of each process, then of this one."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / tick)
        except (OSError, IndexError, ValueError):
            out.append(0.0)
    return [*out, time.process_time()]


async def _timed(pair: _Pair, op: str, size: int, pids: list[int]) -> dict:
    """One goodput row, with the cores each process kept busy while it ran."""
    cpu0, t0 = _cpu_seconds(pids), time.perf_counter()
    g = await pair.goodput(op, size)
    cpu1, wall = _cpu_seconds(pids), time.perf_counter() - t0
    # Cores busy on average while it ran (1.0 = one core all the time).
    g["cpu"] = {who: round((b - a) / wall, 2) for who, a, b in
                zip(("target", "initiator", "client"), cpu0, cpu1, strict=True)}
    return g


async def _measure(addresses: list[str], pids: list[int], opts: E2EOptions, progress) -> dict:
    tnode = await sh.connect(addresses[0])
    inode = await sh.connect(addresses[1])
    goodput, checks, latency = [], [], None
    try:
        before = [await tnode.counters(), await inode.counters()]
        for config in CONFIGS:
            pair = await _Pair.create(config, tnode, inode, opts)
            for op in OPS:
                for size in SIZES:
                    progress(f"{op} {size_text(size)} {config}")
                    goodput.append(await _timed(pair, op, size, pids))
            if config == "plain":
                progress("latency")
                latency = await pair.latency(opts.latency_samples, tuple(pids))
            checks.append(await pair.verify())
            extra = [row for row in EXTRA_ROWS if row[1] == config]
            for mtu in sorted({row[3] for row in extra}):
                pair = await _Pair.create(config, tnode, inode, opts, path_mtu=mtu)
                for op, _, size, _ in (row for row in extra if row[3] == mtu):
                    progress(f"{op} {size_text(size)} {config} path MTU {mtu}")
                    goodput.append(await _timed(pair, op, size, pids))
                checks.append(await pair.verify())
        after = [await tnode.counters(), await inode.counters()]
    finally:
        await tnode.close()
        await inode.close()
    progress(f"{opts.qp_pairs} QP pairs over {opts.sessions} sessions")
    many = await many_qps(addresses, opts)
    watched = ("packets_sent", "packets_received", "retransmitted_packets", "ack_timeouts",
               "rnr_retries", "duplicates_discarded", "packets_bad_icrc")
    wire = {name: sum(after[k].get(name, 0) - before[k].get(name, 0) for k in range(2))
            for name in watched}
    return {"goodput": goodput, "latency": latency, "many_qps": many, "checks": checks,
            "wire_counters": wire}


def _attach_ceilings(goodput: list[dict], tcp: list[dict], engine: list[dict]) -> None:
    tcp_by = {(r["size"], r["wire_size"]): r["app_mb_s"] for r in tcp}
    eng_by = {(r["config"], r["size"], r["direction"]): r["mb_s"] for r in engine}
    for g in goodput:
        c_tcp = tcp_by[(g["size"], g["wire_size"])]
        c_eng = eng_by[(g["config"], g["size"], TARGET_DIRECTION[g["op"]])]
        g["ceilings"] = {"tcp_stream": c_tcp, "engine": c_eng}
        g["ratio"] = {"tcp_stream": sig4(g["mb_s"] / c_tcp), "engine": sig4(g["mb_s"] / c_eng),
                      "min": sig4(g["mb_s"] / min(c_tcp, c_eng))}



def run_e2e(opts: E2EOptions | None = None, progress=None) -> dict:
    """The whole end-to-end bench (with the default options unless ``opts``); a JSON-ready
    dict. Every process it starts is ended before it returns or raises."""
    opts = opts or E2EOptions()
    progress = progress or (lambda _msg: None)
    start = time.perf_counter()
    machine = e2e_machine_info()
    progress("engine ceilings")
    engine = engine_ceilings(budget=MIB if opts.quick else 4 * MIB, repeat=2 if opts.quick else 3)
    with tempfile.TemporaryDirectory(prefix="softhca-bench-") as workdir:
        progress("TCP ceilings")
        tcp = tcp_ceilings(opts, workdir)
        tcp_rtt = tcp_round_trip(opts.latency_samples, workdir)
        chain = tcp_chain(opts.latency_samples, workdir)
        ucx = ucx_rows(opts.quick, progress)
        daemons = Daemons(2, workdir, () if opts.trains else ("--no-trains",))
        with daemons as addresses:
            try:
                measured = run_loop(_measure(addresses, [p.pid for p in daemons.procs],
                                              opts, progress))
            except (sh.RDMAError, BenchError, asyncio.TimeoutError) as e:
                tail = daemons.log_tail()
                raise BenchError(f"{e}" + (f"\n{tail}" if tail else "")) from e
            for k, p in enumerate(daemons.procs):
                if p.poll() is not None:
                    raise BenchError(f"daemon {k} died during the bench (status {p.returncode})")
    _attach_ceilings(measured["goodput"], tcp, engine)
    lat = measured["latency"]
    lat["ceilings"] = {"tcp_round_trip_p50_us": tcp_rtt["p50_us"],
                       "tcp_round_trip_p99_us": tcp_rtt["p99_us"],
                       "tcp_chain_p50_us": chain["p50_us"], "tcp_chain_p99_us": chain["p99_us"]}
    lat["ratio"] = {"p50_to_tcp_round_trip": sig4(lat["p50_us"] / tcp_rtt["p50_us"]),
                    "p99_to_tcp_round_trip": sig4(lat["p99_us"] / tcp_rtt["p99_us"]),
                    "p50_to_tcp_chain": sig4(lat["p50_us"] / chain["p50_us"]),
                    "p99_to_tcp_chain": sig4(lat["p99_us"] / chain["p99_us"])}
    attach_ucx_ratios(measured["goodput"], lat, ucx)
    doc = {
        "benchmark": "softhca end to end",
        "unit": "MB/s = 1e6 bytes of application (memory-domain) data per second",
        "machine": machine,
        "setup": {"daemons": addresses, "processes": "2 x softhca serve, this client, "
                  "TCP sender and receiver: all separate processes",
                  "path_mtu": DEFAULT_MTU, "quick": opts.quick,
                  "extra_rows": [{"op": op, "config": c, "size": size, "path_mtu": mtu}
                                 for op, c, size, mtu in EXTRA_ROWS]},
        "options": asdict(opts),
        "configs": CONFIG_TITLES,
        **measured,
        "ceilings": {"tcp_stream": tcp, "engine": engine, "tcp_round_trip": tcp_rtt,
                     "tcp_chain": chain},
        "ucx": ucx,
    }
    if opts.provider:
        doc["provider"] = _provider_section(measured, progress)
    if opts.c_programs:
        from .cprograms import c_rows

        doc["c_programs"] = c_rows(opts.quick, progress)
    doc["total_seconds"] = round(time.perf_counter() - start, 1)
    return doc


def _provider_section(measured: dict, progress) -> dict:
    """perftest through the provider, with its ratios to the client's own rows."""
    from .provider import provider_rows

    p = provider_rows(progress)
    if "skipped" in p:
        return p
    plain = next((g for g in measured["goodput"] if g["op"] == "RDMA_WRITE"
                  and g["config"] == "plain" and g["size"] == MIB), None)
    if plain is not None:
        bw = p["ib_write_bw"]
        bw["client_mb_s"] = plain["mb_s"]
        bw["tcp_stream_mb_s"] = plain["ceilings"]["tcp_stream"]
        bw["to_client"] = sig4(bw["mb_s"] / plain["mb_s"])
        bw["to_tcp_stream"] = sig4(bw["mb_s"] / plain["ceilings"]["tcp_stream"])
    lat = p["ib_send_lat"]
    lat["client_p50_us"] = measured["latency"]["p50_us"]
    return p


