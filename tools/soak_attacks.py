"""The soak's attacks on identities, amplification, side features and fair shares.

Each is a method of ``Round3Attacks``, which ``tools/soak.py``'s ``Soak`` mixes in; each
returns True when the daemon refused the attack: it answered with the error its limit
gives, dropped and counted what it was sent, and (for floods) stayed within
``CONTAINED_RSS`` while the valid traffic beside it went on.

- ``dup_read``: sixteen 64 MiB READ requests at an old PSN, with a RETH no READ had, on
  a wire link proving the peer token (dropped: ``duplicate_reads_dropped``);
- ``dup_trains``: 1,024-packet trains of old PSNs and far ahead of the window for a
  second (each dropped whole: ``duplicate_runs_discarded``, ``out_of_window_discarded``);
- ``nak_storm``: 2,000 sequence-error NAKs at the initiator's QP (one rewind at most);
- ``msgpack_bomb``: headers announcing millions of items, 16,384+ containers, deep
  nesting (EMSGSIZE / EPROTO);
- ``slow_subscriber``: a daemon-wide packet subscriber that never reads (events dropped,
  the traffic goes on);
- ``slot_hog``: the attacker's credential holds 257 connections stalled half-way through
  a frame (EBUSY at its share; the valid tenant still gets in);
- ``dek_flood``: the attacker creates DEKs until ENOMEM (its quota); the valid tenant
  still creates one.

And on the target daemon's UNIX socket (``serve --unix``), as a local program would:

- ``unix_idle``: 1,500 connections that never say HELLO, then a program's HELLO:
  welcomed within a second, the oldest idle ones evicted (``pre_hello_evicted``);
- ``unix_hog``: one process opens sessions until EBUSY, at its share (half of its uid's
  256); another process of the same uid still gets a session and allocates a PD.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import struct
import sys
from dataclasses import dataclass

from .. import client as sh
from ..protocol.frames import FrameDecoder, frame_bytes
from ..protocol.handshake import make_hello
from ..protocol.kinds import FrameKind
from ..protocol.packets import Packet, Run, packet_header, train_header
from ..server.link import read_frames

ROUND3 = ("dup_read", "dup_trains", "nak_storm", "msgpack_bomb", "slow_subscriber",
          "slot_hog", "dek_flood")
UNIX = ("unix_idle", "unix_hog")
PSN_MOD = 1 << 24
# The UNIX socket's defaults the attacks expect: connections one uid may hold
# (serve --max-credential-connections), of which one process may hold half.
UID_CONNECTIONS, PROCESS_SHARE = 256, 128


@dataclass
class Credentials:
    """The valid tenant's token, the attacker's (another tenant of the same daemons) and
    the daemons' peer token."""

    valid: bytes | None
    attacker: bytes | None
    peer: bytes | None

    @classmethod
    def make(cls, workdir: str) -> Credentials:
        valid, attacker = secrets.token_hex(16).encode(), secrets.token_hex(16).encode()
        fd = os.open(os.path.join(workdir, "tokens"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(valid + b"\n" + attacker + b"\n")
        return cls(valid, attacker, None)

    @staticmethod
    def serve_args(workdir: str) -> tuple[str, ...]:
        """What the soak's daemons are started with: the two tenants, quotas small
        enough to reach within an attack, and a frame deadline short enough that an
        attack's stalled connections are gone soon after it, long enough that slot_hog's
        257, each stalled half-way through a frame as it opens the next, are all still
        held on a loaded machine (at 2 s, opening them outlasted the first ones)."""
        return ("--token-file", os.path.join(workdir, "tokens"), "--quota", "dek=2000,4000",
                "--frame-deadline", "10")

    @staticmethod
    def read_peer(workdir: str) -> bytes:
        with open(os.path.join(workdir, "peer_token"), "rb") as f:
            return f.read().strip()


def _frame(header: bytes) -> bytes:
    return struct.pack(">II", 4 + len(header), len(header)) + header


def _bombs() -> list[bytes]:
    import msgpack

    return [
        _frame(b"\x82\xa1t\xa1x\xa1a\xdd" + (8_000_000).to_bytes(4, "big")
               + b"\xc0" * 8_000_000),
        _frame(b"\x82\xa1t\xa1x\xa1a" + b"\x91" * 100_000 + b"\xc0"),
        _frame(msgpack.packb({"t": "x", "a": [[[] for _ in range(4096)] for _ in range(63)]})),
        _frame(msgpack.packb({"t": "x", "a": "a" * 8192})),
    ]


async def _unix_connect(path: str, patience: float = 5.0) -> socket.socket:
    """A connected UNIX stream socket: a non-blocking connect says EAGAIN while the
    daemon's listen backlog is full, and is tried again for up to ``patience`` s."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    end = asyncio.get_running_loop().time() + patience
    while True:
        try:
            s.connect(path)
            return s
        except BlockingIOError:
            if asyncio.get_running_loop().time() > end:
                s.close()
                raise
            await asyncio.sleep(0.01)


class _Frames:
    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader, self.dec, self.queue = reader, FrameDecoder(1 << 20), []

    async def next(self, timeout: float = 10.0) -> dict:
        while not self.queue:
            got = await asyncio.wait_for(read_frames(self.reader, self.dec), timeout)
            if not got:
                raise ConnectionError("the daemon closed the connection")
            self.queue += got
        return self.queue.pop(0).header


async def unix_hello(path: str, timeout: float = 10.0):
    """A control HELLO on a UNIX socket: (the daemon's answer, writer, frames)."""
    reader, writer = await asyncio.open_unix_connection(sock=await _unix_connect(path))
    frames = _Frames(reader)
    challenge = await frames.next(timeout)
    writer.write(frame_bytes(make_hello(challenge, "control", None)))
    return await frames.next(timeout), writer, frames


async def neighbour(path: str) -> int:
    """Another program of the same uid (``unix_hog`` runs it as its own process): a
    session, a context and a PD; 0 when all three were given."""
    answer, writer, frames = await unix_hello(path)
    try:
        if answer.get("t") != FrameKind.WELCOME:
            print(f"hello: {answer}")
            return 1
        writer.write(frame_bytes({"t": "open_device", "id": 1, "name": "mlx5_0"}))
        ctx = await frames.next()
        writer.write(frame_bytes({"t": "alloc_pd", "id": 2, "ctx": ctx.get("ctx")}))
        pd = await frames.next()
        print(f"open_device: {ctx.get('t')}, alloc_pd: {pd.get('t')}")
        return 0 if ctx.get("t") == pd.get("t") == "ok" else 1
    finally:
        writer.close()


class Round3Attacks:
    """Mixed into tools/soak.py's Soak, whose pair, daemons and helpers it uses."""

    async def _wire_link(self, address: str, src: str):
        _, writer, _ = await self._raw("wire", src=src, token=self.creds.peer,
                                       address=address)
        return writer

    def _old_psn(self, back: int) -> int:
        """A PSN ``back`` behind what the target's QP expects (the pair's WRITEs so far,
        16 packets each, from the initiator's first PSN): a duplicate for it."""
        return (self.i.qp.psn + self.report.wrs * 16 - back) % PSN_MOD

    async def dup_read(self) -> bool:
        before = (await self.counters())["duplicate_reads_dropped"]

        async def flood() -> None:
            w = await self._wire_link(self.target_addr, self.initiator_addr)
            for k in range(16):
                h = packet_header("mlx5_0", Packet(
                    self.t.qp.qp_num, self._old_psn(1000 + k), "RDMA_READ_REQUEST", b"",
                    reth=(self.dst.rkey, self.dst.addr, 64 << 20)))
                h["sqp"] = self.i.qp.qp_num
                w.write(frame_bytes(h))
            await w.drain()
            await asyncio.sleep(0.5)
            w.close()

        contained = await self._contained(flood)
        dropped = (await self.counters())["duplicate_reads_dropped"] - before
        return contained and dropped >= 16

    async def dup_trains(self) -> bool:
        before = await self.counters()
        mtu, n = 4096, 1024
        payload = bytes(n * mtu)

        def train(psn: int) -> bytes:
            run = Run(self.t.qp.qp_num, psn, n, "RDMA_WRITE", True, True, mtu,
                      memoryview(payload), reth=(self.dst.rkey, self.dst.addr, n * mtu))
            h = train_header("mlx5_0", run)
            h["sqp"] = self.i.qp.qp_num
            return frame_bytes(h, payload)

        async def flood() -> None:
            w = await self._wire_link(self.target_addr, self.initiator_addr)
            old, ahead = train(self._old_psn(1 << 20)), train(self._old_psn(-(1 << 21)))
            loop = asyncio.get_running_loop()
            end = loop.time() + 1.0
            k = 0
            while loop.time() < end:
                w.write(old if k % 2 else ahead)
                k += 1
                await w.drain()
            w.close()

        contained = await self._contained(flood)
        after = await self.counters()
        return contained and (after["duplicate_runs_discarded"]
                              > before["duplicate_runs_discarded"]
                              and after["out_of_window_discarded"]
                              > before["out_of_window_discarded"])

    async def nak_storm(self) -> bool:
        before = await self.inode.counters()
        wrs = self.report.wrs
        w = await self._wire_link(self.initiator_addr, self.target_addr)
        h = packet_header("mlx5_0", Packet(self.i.qp.qp_num, self._old_psn(0), "ACKNOWLEDGE",
                                           b"", aeth=("NAK_PSN_SEQ", 0)))
        h["sqp"] = self.t.qp.qp_num
        w.write(frame_bytes(h) * 2000)
        await w.drain()
        await asyncio.sleep(0.5)
        w.close()
        after = await self.inode.counters()
        # At most one rewind per outstanding window (the storm may name the head, or
        # something already acknowledged), and the valid traffic went on.
        return (after["retransmissions"] - before["retransmissions"] <= 4
                and self.report.wrs > wrs)

    async def msgpack_bomb(self) -> bool:
        errnos = []
        bombs = getattr(self, "_bomb_frames", None)
        if bombs is None:
            # Built once, off this loop (the probe's answers are timed on it).
            bombs = self._bomb_frames = await asyncio.to_thread(_bombs)
        for bomb in bombs:
            reader, writer, dec = await self._raw("control")
            # A header over the size limit is refused from its first 8 bytes, and the
            # daemon closes: the rest of it is not sent into a reset connection (which
            # would lose the refusal on the way back).
            writer.write(bomb[:300_000])
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            frames = await asyncio.wait_for(read_frames(reader, dec), 10)
            errnos.append(frames[0].header.get("errno") if frames else None)
            writer.close()
        return all(e in ("EPROTO", "EMSGSIZE") for e in errnos)

    async def slow_subscriber(self) -> bool:
        wrs = self.report.wrs

        async def flood() -> None:
            reader, writer, dec = await self._raw("control")
            writer.write(frame_bytes({"t": "subscribe", "id": 1, "events": ["packets"],
                                      "daemon_wide": True}))
            writer.transport.pause_reading()        # and never reads
            await asyncio.sleep(2.0)
            writer.transport.abort()

        contained = await self._contained(flood)
        return contained and self.report.wrs > wrs

    async def slot_hog(self) -> bool:
        """Connections of the attacker's credential, each stalled half-way through a
        frame, until refused: EBUSY by the 257th (its share is 256; a connection of an
        attack just before may still hold one), and the valid tenant still gets in."""
        held, answers = [], []
        try:
            host, port = self.target_addr.rsplit(":", 1)
            while len(answers) < 300 and "EBUSY" not in answers:
                reader, writer = await asyncio.open_connection(host, int(port))
                held.append(writer)
                dec = FrameDecoder(1 << 20)
                challenge = (await asyncio.wait_for(read_frames(reader, dec), 10))[0]
                writer.write(frame_bytes(make_hello(challenge.header, "control",
                                                    self.creds.attacker)))
                answer = (await asyncio.wait_for(read_frames(reader, dec), 10))[0]
                answers.append(answer.header.get("errno", answer.header["t"]))
                writer.write(frame_bytes({"t": "devices", "id": 1})[:7])
            node = await sh.connect(self.target_addr, token=self.creds.valid, timeout=5)
            ok = (await node.request("devices"))[0]["devices"] == ["mlx5_0"]
            await node.close()
        finally:
            for w in held:
                w.close()
        return answers[-1:] == ["EBUSY"] and len(answers) <= 257 and ok

    async def dek_flood(self) -> bool:
        node, side = await self._attacker_side()
        refused = False
        try:
            for _ in range(5000):
                try:
                    await side.ctx.create_dek(sh.Mlx5DEKInitAttr(
                        pd=side.pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256,
                        key=os.urandom(64)))
                except sh.RDMAError as e:
                    refused = e.errno_name == "ENOMEM"
                    break
            dek = await self.t.ctx.create_dek(sh.Mlx5DEKInitAttr(
                pd=self.t.pd, key_size=sh.MLX5DV_CRYPTO_KEY_SIZE_256, key=os.urandom(64)))
            await dek.close()
        finally:
            await node.close()
        return refused

    # -- the UNIX socket ------------------------------------------------------------------
    async def unix_idle(self) -> bool:
        """1,500 connections to the target's UNIX socket that never say HELLO, then a
        program's HELLO: welcomed within a second, and the daemon evicted idle ones.
        No C program of the soak starts meanwhile (``quiet_start``): one that connects
        in the middle of the burst may be evicted before its HELLO, as on the TCP port."""
        before = (await self.counters())["pre_hello_evicted"]
        idle: list[socket.socket] = []
        async with self.quiet_start:
            try:
                for _ in range(1500):
                    idle.append(await _unix_connect(self.target_sock))
                t0 = asyncio.get_running_loop().time()
                answer, writer, _ = await unix_hello(self.target_sock, 5)
                took = asyncio.get_running_loop().time() - t0
                writer.close()
            finally:
                for s in idle:
                    s.close()
        evicted = (await self.counters())["pre_hello_evicted"] - before
        return answer.get("t") == FrameKind.WELCOME and took < 1.0 and evicted >= 1000

    async def unix_hog(self) -> bool:
        """This process opens sessions on the target's UNIX socket until refused: EBUSY
        at its share (half of its uid's connections), and meanwhile another process of
        the same uid gets a session, a context and a PD."""
        held, answers = [], []
        try:
            while len(answers) < UID_CONNECTIONS + 1 and "EBUSY" not in answers:
                answer, writer, _ = await unix_hello(self.target_sock)
                held.append(writer)
                answers.append(answer.get("errno", answer.get("t")))
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "import asyncio, sys\n"
                "from softhca.tools.soak_attacks import neighbour\n"
                "sys.exit(asyncio.run(neighbour(sys.argv[1])))", self.target_sock,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            for w in held:
                w.close()
        # One more than its share at most: a session of an attack just before may
        # still be closing.
        return (answers[-1:] == ["EBUSY"] and len(answers) <= PROCESS_SHARE + 2
                and proc.returncode == 0)


__all__ = ["ROUND3", "UNIX", "Credentials", "Round3Attacks", "neighbour", "unix_hello"]
