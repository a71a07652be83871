"""``softhca soak --seconds N``: valid traffic beside a rotating set of attacks, for N
seconds and past them until every attack has been tried once (a loaded machine still
judges each one).

Two ``softhca serve`` processes on loopback (tools/daemons.py's ``Daemons``). One RC QP
pair between them carries RDMA WRITEs of random bytes, each read back and compared
(bytes verified); a probe session asks the target for its devices every 50 ms (the
slowest answer is reported). Beside them, one attack after another, in turn, against
the target daemon:

- ``injection``: a co-tenant opens a wire link with its client token to forge an
  RDMA_WRITE_ONLY into the pair's MR (refused at the HELLO: EACCES);
- ``huge_layout``: mkey_configure with an interleaved layout of repeat_count 2^32-1;
- ``poll_flood``: thousands of pipelined ``poll_cq(timeout=3600)`` on an empty CQ, then
  a disconnect;
- ``mr_read_flood``: sixty 8 MiB ``mr_read`` requests in one write, never read;
- ``idle_sockets``: 1,024 sockets that never say hello, then a new client connects;
- ``rule_flood``: fault rules until the daemon says ENOMEM;
- ``malformed``: malformed frames on a control session;
- and those of tools/soak_attacks.py: duplicate READs, duplicate trains, a NAK storm,
  msgpack bombs, a subscriber that never reads, a tenant holding its connection share
  with stalled frames, a DEK flood; on the target's UNIX socket, idle connections that
  never say HELLO and one process holding its uid's sessions.

The daemons also serve a UNIX socket each (``serve --unix``), and, when this runs as
root with the provider built, a C pair runs beside the Python pair, program after
program (tools/soak_native.py): ``ibv_rc_pingpong -c`` between the daemons and
``memcheck transfer`` on the target, each through ``softhca run --target SOCKET``.

The daemons' token file names two tenants, the valid traffic's and the attacker's, and
they share a peer token, as a deployment runs them.

An attack counts as refused when the daemon refused it (an error reply, a drop it
counted, an evicted socket) and, for the floods, contained it: the daemon's RSS grew by
less than ``CONTAINED_RSS`` while it ran (for ``mr_read_flood``, which asks for nothing
refusable, containment alone). The report: valid WRs completed, bytes
verified, attacks tried and refused per kind, the slowest probe and peak RSS (VmHWM)
of each daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .. import client as sh
from ..protocol.frames import FrameDecoder, frame_bytes
from ..protocol.handshake import make_hello
from ..protocol.kinds import FrameKind
from ..protocol.packets import Packet, packet_header
from ..server.link import read_frames
from .cliargs import positive_float
from .daemons import Daemons
from .harness import Side
from .soak_attacks import ROUND3, UNIX, Credentials, Round3Attacks
from .soak_native import CPair, CPairReport, unavailable

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
ATTACKS = ("injection", "huge_layout", "poll_flood", "mr_read_flood", "idle_sockets",
           "rule_flood", "malformed", *ROUND3, *UNIX)
CHUNK = 64 << 10
# A flood is contained when the daemon grew by less than this while it ran.
CONTAINED_RSS = 64 << 20
ACCESS = (sh.IBV_ACCESS_LOCAL_WRITE | sh.IBV_ACCESS_REMOTE_WRITE | sh.IBV_ACCESS_REMOTE_READ)


def rss(pid: int, field_name: str = "VmRSS") -> int:
    """Bytes of ``field_name`` (VmRSS, or VmHWM: the peak) in /proc/PID/status; 0 if gone."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class Report:
    seconds: float
    wrs: int = 0
    bytes_verified: int = 0
    verify_failures: int = 0
    valid_errors: list[str] = field(default_factory=list)
    attacks: dict[str, list[int]] = field(default_factory=dict)    # kind -> [tried, refused]
    probe_max_ms: float = 0.0
    # The slowest probe while each kind of attack ran.
    probe_ms: dict[str, float] = field(default_factory=dict)
    peak_rss: dict[str, int] = field(default_factory=dict)
    # The C programs' runs through the provider (tools/soak_native.py).
    c_pair: CPairReport = field(default_factory=CPairReport)

    @property
    def attacks_refused(self) -> int:
        return sum(r for _, r in self.attacks.values())

    @property
    def ok(self) -> bool:
        c = self.c_pair
        return (not self.verify_failures and not self.valid_errors and self.wrs > 0
                and all(t == r for t, r in self.attacks.values())
                and (bool(c.skipped) or (c.total > 0 and not c.failures)))

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "valid_wrs": self.wrs,
                "bytes_verified": self.bytes_verified, "verify_failures": self.verify_failures,
                "valid_errors": self.valid_errors,
                "attacks": {k: {"tried": t, "refused": r,
                                "slowest_probe_ms": round(self.probe_ms.get(k, 0.0), 1)}
                            for k, (t, r) in self.attacks.items()},
                "attacks_refused": self.attacks_refused, "probe_max_ms": self.probe_max_ms,
                "peak_rss": self.peak_rss, "c_pair": self.c_pair.as_dict(), "ok": self.ok}

    def text(self) -> str:
        lines = [f"soak {self.seconds:g} s: {self.wrs} valid WRs completed, "
                 f"{self.bytes_verified} bytes verified, {self.verify_failures} mismatches",
                 f"attacks refused: {self.attacks_refused} of "
                 f"{sum(t for t, _ in self.attacks.values())}"]
        for kind, (tried, refused) in sorted(self.attacks.items()):
            lines.append(f"  {kind:<14} tried {tried:<4} refused {refused:<4} slowest answer "
                         f"meanwhile {self.probe_ms.get(kind, 0.0):.1f} ms")
        lines.append(self.c_pair.text())
        lines += [f"C pair failure: {e}" for e in self.c_pair.failures[:5]]
        lines.append(f"slowest answer to a second client: {self.probe_max_ms:.1f} ms")
        for who, peak in self.peak_rss.items():
            lines.append(f"peak RSS of the {who} daemon: {peak / (1 << 20):.1f} MiB")
        lines += [f"valid traffic error: {e}" for e in self.valid_errors[:5]]
        lines.append("PASS" if self.ok else "FAIL")
        return "\n".join(lines)


class Soak(Round3Attacks):
    def __init__(self, seconds: float, addresses: list[str], pids: list[int],
                 attacks: list[str], seed: int = 0, creds: Credentials | None = None,
                 sockets: list[str] | None = None, c_pair: bool = True) -> None:
        self.report = Report(seconds)
        # The daemons' UNIX sockets (the target's first), for the C pair and the UNIX
        # attacks; a C program does not start while ``quiet_start`` is held.
        self.sockets = sockets or []
        self.target_sock = self.sockets[0] if self.sockets else ""
        self.quiet_start = asyncio.Lock()
        why = unavailable() if c_pair else "--no-c-pair"
        if not self.sockets:
            why = "the daemons serve no UNIX socket"
        self.report.c_pair.skipped = why
        # The tenants' tokens (the valid traffic's and the attacker's) and the daemons'
        # peer token (what an attacker past the HELLO would need).
        self.creds = creds or Credentials(None, None, None)
        self.initiator_pid = pids[1] if len(pids) > 1 else pids[0]
        self.target_addr, self.initiator_addr = addresses
        self.target_pid = pids[0]
        self.attacks = attacks
        self.rng = random.Random(seed)
        self.deadline = 0.0
        self.current = "none"
        self.round_done = False

    def going(self) -> bool:
        """Until the deadline, and past it until every attack has been tried once: a slow
        machine still sees each attack beside the valid traffic and the probe."""
        return asyncio.get_running_loop().time() < self.deadline or not self.round_done

    # -- the valid traffic and the probe --------------------------------------------------
    async def setup(self) -> None:
        self.tnode = await sh.connect(self.target_addr, token=self.creds.valid)
        self.inode = await sh.connect(self.initiator_addr, token=self.creds.valid)
        self.t = await Side.open("target", self.tnode)
        self.i = await Side.open("initiator", self.inode)
        await self.i.qp.connect(self.t.qp.info(), path_mtu=sh.IBV_MTU_4096)
        await self.t.qp.connect(self.i.qp.info(), path_mtu=sh.IBV_MTU_4096)
        self.src = await self.i.reg_mr(CHUNK, ACCESS)
        self.dst = await self.t.reg_mr(4 * CHUNK, ACCESS)

    async def valid(self) -> None:
        r = self.report
        n = 0
        while self.going():
            data = self.rng.randbytes(CHUNK)
            slot = n % 4 * CHUNK
            try:
                await self.src.write(data)
                wr = sh.SendWR(wr_id=n, opcode=sh.IBV_WR_RDMA_WRITE,
                               sg=[sh.SGE(self.src.addr, CHUNK, self.src.lkey)])
                wr.set_wr_rdma(self.dst.rkey, self.dst.addr + slot)
                await self.i.qp.post_send(wr)
                (wc,) = await self.i.scq.poll_n(1, 30)
                if wc.status != sh.IBV_WC_SUCCESS:
                    r.valid_errors.append(f"WR {n}: {wc}")
                    return
                r.wrs += 1
                if await self.dst.read(CHUNK, slot) == data:
                    r.bytes_verified += CHUNK
                else:
                    r.verify_failures += 1
            except sh.RDMAError as e:
                r.valid_errors.append(f"WR {n}: {e.errno_name}: {e.message}")
                return
            n += 1

    async def probe(self) -> None:
        node = await sh.connect(self.target_addr, token=self.creds.valid)
        try:
            while self.going():
                t0 = time.perf_counter()
                await node.request("devices")
                ms = (time.perf_counter() - t0) * 1e3
                r = self.report
                r.probe_max_ms = max(r.probe_max_ms, ms)
                r.probe_ms[self.current] = max(r.probe_ms.get(self.current, 0.0), ms)
                await asyncio.sleep(0.05)
        finally:
            await node.close()

    async def settle(self, prompt_ms: float = 50.0, limit: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + limit
        while self.going() and loop.time() < end:
            t0 = time.perf_counter()
            await self.tnode.request("devices")
            if (time.perf_counter() - t0) * 1e3 < prompt_ms:
                return
            await asyncio.sleep(0.05)

    # -- the attacks --------------------------------------------------------------------
    async def counters(self) -> dict:
        return await self.tnode.counters()

    async def _raw(self, role: str | None, src: str | None = None, token: bytes | None = None,
                   address: str | None = None):
        host, port = (address or self.target_addr).rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        dec = FrameDecoder(64 << 20)
        frames = await asyncio.wait_for(read_frames(reader, dec), 10)
        if role is not None:
            if token is None and role == "control":
                token = self.creds.attacker
            writer.write(frame_bytes(make_hello(frames[0].header, role, token, src)))
            frames = frames[1:] or await asyncio.wait_for(read_frames(reader, dec), 10)
            if frames[0].header.get("t") != FrameKind.WELCOME:
                raise sh.RDMAError("EPROTO", f"hello refused: {frames[0].header}")
        return reader, writer, dec

    async def injection(self) -> bool:
        """The co-tenant injection: a client (its tenant's token, no peer token) opens a
        wire link to the target claiming the initiator's daemon and SENDs a forged
        RDMA_WRITE_ONLY into the pair's MR with the pair's real QP numbers and PSN.
        Refused at the HELLO (EACCES)."""
        host, port = self.target_addr.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        dec = FrameDecoder(1 << 20)
        try:
            frames = await asyncio.wait_for(read_frames(reader, dec), 10)
            writer.write(frame_bytes(make_hello(frames[0].header, "wire", self.creds.attacker,
                                                self.initiator_addr)))
            answer = await asyncio.wait_for(read_frames(reader, dec), 10)
            if answer and answer[0].header.get("t") == "welcome":
                evil = b"INJECTED BY ATTACKER!"
                h = packet_header("mlx5_0", Packet(self.t.qp.qp_num, self.i.qp.psn,
                                                   "RDMA_WRITE_ONLY", evil,
                                                   reth=(self.dst.rkey, self.dst.addr,
                                                         len(evil))))
                h["sqp"] = self.i.qp.qp_num
                writer.write(frame_bytes(h, evil))
                await writer.drain()
        finally:
            writer.close()
        return bool(answer) and answer[0].header.get("errno") == "EACCES"

    async def _attacker_side(self) -> tuple[sh.Node, Side]:
        node = await sh.connect(self.target_addr, token=self.creds.attacker)
        return node, await Side.open("attacker", node)

    async def huge_layout(self) -> bool:
        node, side = await self._attacker_side()
        try:
            mr = await side.reg_mr(4096, ACCESS)
            mkey = await side.pd.create_mkey(sh.MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, 4)
            try:
                await side.qp.post_mkey_configure(
                    mkey, access=ACCESS,
                    interleaved=(4294967295, [sh.Mlx5MrInterleaved(mr.addr, 1, 0, mr.lkey)]))
                wcs = await side.scq.poll(1, 5)
            except sh.RDMAError:
                return True
            return bool(wcs) and wcs[0].status != sh.IBV_WC_SUCCESS
        finally:
            await node.close()

    async def _contained(self, flood: Callable[[], Awaitable[None]]) -> bool:
        before = rss(self.target_pid)
        peak = before
        task = asyncio.ensure_future(flood())
        while not task.done():
            peak = max(peak, rss(self.target_pid))
            await asyncio.sleep(0.02)
        await task
        return peak - before < CONTAINED_RSS

    async def poll_flood(self) -> bool:
        refused = False

        async def flood() -> None:
            nonlocal refused
            reader, writer, dec = await self._raw("control")
            writer.write(frame_bytes({"t": "open_device", "id": 1, "name": "mlx5_0"}))
            writer.write(frame_bytes({"t": "create_cq", "id": 2, "ctx": 1, "cqe": 16}))
            got = []
            while len(got) < 2:
                got += await asyncio.wait_for(read_frames(reader, dec), 10)
            cq = got[1].header.get("cq")
            writer.write(b"".join(frame_bytes({"t": "poll_cq", "id": 10 + k, "cq": cq,
                                               "num": 1, "timeout": 3600})
                                  for k in range(20000)))
            await writer.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                frames = await asyncio.wait_for(read_frames(reader, dec), 0.5)
                refused = any(f.header.get("t") == FrameKind.ERR for f in frames)
            writer.close()

        # Polls past a session's bound are refused (ENOMEM or EAGAIN); memory that stays
        # flat is not enough: a cleanup quadratic in the polls would freeze every client.
        contained = await self._contained(flood)
        return refused and contained

    async def mr_read_flood(self) -> bool:
        async def flood() -> None:
            reader, writer, dec = await self._raw("control")
            writer.write(frame_bytes({"t": "open_device", "id": 1, "name": "mlx5_0"}))
            writer.write(frame_bytes({"t": "alloc_pd", "id": 2, "ctx": 1}))
            writer.write(frame_bytes({"t": "reg_mr", "id": 3, "pd": 2, "length": 8 << 20,
                                      "access": 1}))
            got = []
            while len(got) < 3:
                got += await asyncio.wait_for(read_frames(reader, dec), 10)
            mr = got[2].header.get("mr")
            writer.write(b"".join(frame_bytes({"t": "mr_read", "id": 10 + k, "mr": mr,
                                               "offset": 0, "length": 8 << 20})
                                  for k in range(60)))
            await asyncio.sleep(1.0)
            writer.close()

        return await self._contained(flood)

    async def idle_sockets(self) -> bool:
        host, port = self.target_addr.rsplit(":", 1)
        before = (await self.counters())["pre_hello_evicted"]
        idle = []
        try:
            for _ in range(1024):
                idle.append(await asyncio.open_connection(host, int(port)))
            t0 = time.perf_counter()
            node = await sh.connect(self.target_addr, token=self.creds.attacker, timeout=5)
            took = time.perf_counter() - t0
            await node.close()
        except sh.RDMAError:
            return False
        finally:
            for _, w in idle:
                w.close()
        return took < 1.0 and (await self.counters())["pre_hello_evicted"] > before

    async def rule_flood(self) -> bool:
        node = await sh.connect(self.target_addr, token=self.creds.attacker)
        refused = False
        try:
            for n in range(1 << 16):
                await node.faults.add(action="delay", seconds=0, qp=2 + n % 1000)
        except sh.RDMAError as e:
            refused = e.errno_name == "ENOMEM"
        finally:
            await node.close()
        # The session's rules went with it.
        for _ in range(100):
            if (await self.counters())["fault_rules"] == 0:
                return refused
            await asyncio.sleep(0.01)
        return False

    async def malformed(self) -> bool:
        reader, writer, dec = await self._raw("control")
        bad = [{"t": "reg_mr", "id": 1, "pd": 99, "length": 1, "access": 0},
               {"t": "poll_cq", "id": 2, "cq": 1, "num": 0, "timeout": 0},
               {"t": "no_such_verb", "id": 3},
               {"t": "mr_read", "id": 4, "mr": "x", "offset": 0, "length": 1},
               {"t": "post_send", "id": 5, "qp": 1, "wrs": []}]
        for h in bad:
            writer.write(frame_bytes(h))
        got = []
        while len(got) < len(bad):
            frames = await asyncio.wait_for(read_frames(reader, dec), 10)
            if not frames:
                break
            got += frames
        writer.close()
        return len(got) == len(bad) and all(f.header.get("t") == FrameKind.ERR for f in got)

    async def attack_loop(self) -> None:
        loop = asyncio.get_running_loop()
        k = 0
        while loop.time() < self.deadline or k < len(self.attacks):
            kind = self.attacks[k % len(self.attacks)]
            k += 1
            tried_refused = self.report.attacks.setdefault(kind, [0, 0])
            tried_refused[0] += 1
            self.current = kind
            try:
                ok = await asyncio.wait_for(getattr(self, kind)(), 60)
            except (sh.RDMAError, OSError, asyncio.TimeoutError):
                ok = False
            tried_refused[1] += bool(ok)
            # What an attack leaves behind (a cleanup, a backlog) is still its doing: the
            # next one starts once the daemon answers promptly again.
            await self.settle()
            self.current = "none"
            await asyncio.sleep(0.1)
        self.round_done = True

    async def run(self) -> Report:
        await self.setup()
        self.deadline = asyncio.get_running_loop().time() + self.report.seconds
        try:
            work = [self.valid(), self.probe(), self.attack_loop()]
            if not self.report.c_pair.skipped:
                pair = CPair(self.sockets, self.report.c_pair, self.quiet_start)
                work.append(pair.loop(self.deadline))
            await asyncio.gather(*work)
        finally:
            await self.inode.close()
            await self.tnode.close()
        return self.report


def soak(seconds: float, attacks: list[str] | None = None, seed: int = 0,
         c_pair: bool = True) -> Report:
    """Run the soak against two fresh ``softhca serve`` processes, whose token file names
    two tenants: the valid traffic's and the attacker's, each serving a UNIX socket."""
    # unix_idle holds 1,500 sockets at once.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory(prefix="softhca-soak-") as workdir:
        creds = Credentials.make(workdir)
        daemons = Daemons(2, workdir, creds.serve_args(workdir), unix=True)
        with daemons as addresses:
            pids = [p.pid for p in daemons.procs]
            creds.peer = Credentials.read_peer(workdir)
            s = Soak(seconds, addresses, pids, list(attacks or ATTACKS), seed, creds,
                     daemons.sockets, c_pair)
            report = asyncio.run(s.run())
            report.peak_rss = {"target": rss(pids[0], "VmHWM"),
                               "initiator": rss(pids[1], "VmHWM")}
            return report


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("soak", help="valid traffic beside rotating attacks on two daemons",
                       description="Start two 'softhca serve' processes, run verified RDMA "
                       "WRITEs between them beside a rotating set of attacks on one (a "
                       "co-tenant's forged wire packet, a huge MKEY layout, request floods, "
                       "idle sockets, malformed frames, duplicate READs and trains, a NAK "
                       "storm, msgpack bombs, a stalled subscriber, connection and DEK "
                       "floods, idle and hogged UNIX-socket connections), with a C pair "
                       "(ibv_rc_pingpong -c, memcheck transfer) through the provider on the "
                       "daemons' UNIX sockets when run as root, and report valid WRs, bytes "
                       "verified, attacks refused, the C pair's runs, the slowest answer to "
                       "a second client and the daemons' peak RSS. Exit 0 when every attack "
                       "was refused, every byte verified and every C program passed.")
    p.add_argument("--seconds", type=positive_float, default=30.0, metavar="N",
                   help="how long to run at least (default 30); past it the soak goes "
                   "on until every attack has been tried once and the C pair has run "
                   "each of its programs once")
    p.add_argument("--attacks", metavar="A,B,...", default=",".join(ATTACKS),
                   help=f"which attacks, in turn (default all: {','.join(ATTACKS)})")
    p.add_argument("--seed", type=int, default=0, help="the valid traffic's bytes (default 0)")
    p.add_argument("--no-c-pair", action="store_true",
                   help="run no C programs through the provider (they run by default when "
                   "root and the provider is built)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``softhca soak``."""
    attacks = [a for a in args.attacks.split(",") if a]
    unknown = sorted(set(attacks) - set(ATTACKS))
    if unknown or not attacks:
        print(f"softhca soak: unknown attack(s) {', '.join(unknown) or '(none given)'}; "
              f"the attacks are {', '.join(ATTACKS)}", file=sys.stderr)
        return EXIT_USAGE
    report = soak(args.seconds, attacks, args.seed, not args.no_c_pair)
    print(json.dumps(report.as_dict(), indent=2, sort_keys=True) if args.json
          else report.text())
    return EXIT_OK if report.ok else EXIT_FAIL
