"""``softhca capture``: a client that writes a running daemon's wire traffic to a pcap.

It subscribes to the daemon's "packets" events and writes each packet as the RoCEv2
frame :mod:`softhca.protocol.roce` encodes. The events name the daemon but not its
peers, so the peer side of each frame is 127.0.0.x unless ``--peer`` says.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

from ..client.token_file import read_token
from ..protocol.address import split_address
from ..protocol.frames import FrameError
from ..protocol.packets import Packet, decode_packet
from ..protocol.roce import endpoint, ipv4_of, packet_record
from ..server.capture import PcapWriter
from .cliargs import daemon_address, positive_float, positive_int


def summary(direction: str, dev: str, p: Packet) -> str:
    """One line per packet: direction, opcode, QP, PSN and what the headers say."""
    parts = [f"{direction} {p.opcode:<26} qp {p.dest_qp:#08x} psn {p.psn:#08x}"]
    if p.reth is not None:
        parts.append(f"rkey {p.reth[0]:#x} va {p.reth[1]:#x} len {p.reth[2]}")
    if p.aeth is not None:
        parts.append(f"{p.aeth[0]} msn {p.aeth[1]}")
    if p.imm is not None:
        parts.append(f"imm {p.imm:#x}")
    if p.atomic is not None:
        parts.append(f"rkey {p.atomic[0]:#x} va {p.atomic[1]:#x}")
    if p.payload:
        parts.append(f"{len(p.payload)} bytes")
    return "  ".join(parts) + (f"  ({dev})" if dev != "mlx5_0" else "")


class Capture:
    """``softhca capture``: subscribe to ``target``'s packets, write them to ``out``.

    ``run()`` returns when ``count`` packets are written, ``seconds`` have passed, the
    daemon closes the connection, or the task is cancelled (Ctrl-C); the file is whole in
    every case. ``ready`` is set once the subscription is in place.
    """

    def __init__(self, target: str, out, *, token: bytes | None = None,
                 count: int | None = None, seconds: float | None = None,
                 peer: str | None = None, quiet: bool = False, stream=None) -> None:
        self.target, self.out, self.token = target, out, token
        self.max_count, self.seconds = count, seconds
        self.peer, self.quiet = peer, quiet
        self.stream = stream if stream is not None else sys.stdout
        self.ready = asyncio.Event()
        self.count = 0
        self.dropped = 0

    async def run(self) -> int:
        from .. import client as sh

        loop = asyncio.get_running_loop()
        deadline = None if self.seconds is None else loop.time() + self.seconds
        target_host, _ = split_address(self.target)
        offset = None       # event time (the daemon's loop clock) to wall clock
        # Connected and subscribed before the file is created: a daemon that is not
        # there leaves no empty pcap behind.
        async with await sh.connect(self.target, token=self.token) as node:
            # A capture watches other sessions' QPs: it asks daemon-wide, by name (a
            # subscriber otherwise sees its own session's traffic only).
            sub = await node.subscribe("packets", daemon_wide=True)
            with PcapWriter(self.out, autoflush=True) as writer:
                self.ready.set()
                while self.max_count is None or self.count < self.max_count:
                    wait = 1.0 if deadline is None else deadline - loop.time()
                    if wait <= 0:
                        break
                    ev = await sub.next(min(wait, 1.0))
                    if ev is None:
                        if node._conn._closed is not None:
                            break       # the daemon went away
                        continue
                    if ev.kind != "packet":
                        continue
                    h = ev.header
                    try:
                        dev, p = decode_packet(h["pkt"], ev.data)
                    except FrameError:
                        self.dropped += 1
                        continue
                    now = time.time()
                    t = h.get("time")
                    if isinstance(t, (int, float)):
                        if offset is None:
                            offset = now - t
                        now = t + offset
                    daemon = h.get("daemon") or self.target
                    here = endpoint(daemon, fallback=target_host, unknown="127.0.0.1")
                    there = endpoint(self.peer, avoid=here.ip) if self.peer else None
                    writer.write(now, packet_record(h.get("dir", "tx"), (dev, p), local=here,
                                                    peer=there, ident=self.count))
                    self.count += 1
                    if not self.quiet:
                        print(summary(h.get("dir", "?"), dev, p), file=self.stream,
                              flush=True)
        return self.count


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture", help="write a running daemon's wire traffic to a pcap (Wireshark, tshark)",
        description="Subscribe to a running daemon's packets, daemon-wide (every "
        "session's QPs; the daemon logs such a tap), and write each one, sent or "
        "accepted, as a RoCEv2 frame (Ethernet, IPv4, UDP 4791, BTH and its extension "
        "headers, payload, ICRC) to a pcap file that Wireshark and tshark decode as "
        "InfiniBand. Stops after --count packets, --seconds, or Ctrl-C. The daemon's own "
        "`softhca serve --capture FILE` does the same from inside, with both daemons' real "
        "addresses.")
    p.add_argument("--target", required=True, type=daemon_address, metavar="HOST:PORT",
                   help="the daemon")
    p.add_argument("--token-file", metavar="FILE", help="the daemon's token")
    p.add_argument("--out", required=True, metavar="FILE", help="the pcap file to write")
    p.add_argument("--count", type=positive_int, metavar="N", help="stop after N packets")
    p.add_argument("--seconds", type=positive_float, metavar="S", help="stop after S seconds")
    p.add_argument("--peer", metavar="IP", help="the IPv4 address to show for the peer "
                   "daemons (default: a 127.0.0.x stand-in; the events do not name them)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no line per packet, only the final count")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import client as sh

    token = read_token(args.token_file)
    if args.peer is not None and ipv4_of(args.peer) is None:
        print(f"softhca capture: --peer {args.peer!r} is not an IPv4 address", file=sys.stderr)
        return 2
    cap = Capture(args.target, args.out, token=token, count=args.count, seconds=args.seconds,
                  peer=args.peer, quiet=args.quiet)

    async def main() -> None:
        task = asyncio.ensure_future(cap.run())
        # SIGTERM ends the capture as Ctrl-C does (a script's background job ignores
        # SIGINT): the file is closed whole and the count printed.
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        ready = asyncio.ensure_future(cap.ready.wait())
        await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
        if cap.ready.is_set():
            print(f"softhca capture: capturing {args.target} to {args.out}", file=sys.stderr,
                  flush=True)
        ready.cancel()
        await task

    status = 0
    try:
        asyncio.run(main())
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    except OSError as e:
        print(f"softhca capture: cannot write {args.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    except sh.RDMAError as e:
        print(f"softhca capture: {e.errno_name}: {e.message}", file=sys.stderr, flush=True)
        if not cap.ready.is_set():
            # Never connected: no file was made, so there is no count to give.
            return 1
        status = 1
    print(f"{cap.count} packet(s) written to {args.out}"
          + (f" ({cap.dropped} undecodable event(s) skipped)" if cap.dropped else ""),
          flush=True)
    return status
