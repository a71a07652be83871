"""``softhca run -- PROGRAM [ARGS...]``: an unmodified verbs program on a softhca device
(tools/native.py does the work)."""

from __future__ import annotations

import argparse
import sys

from . import EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run", help="run an unmodified libibverbs program on softhca devices",
        description="Run PROGRAM (ibv_devinfo, ibv_rc_pingpong, perftest, your own) against "
        "softhca: a sysfs tree naming the devices (SYSFS_PATH), the device nodes in a "
        "private mount namespace, the provider (RDMAV_DRIVERS) and a daemon on a UNIX "
        "socket, started here unless --target names one. Needs root (a mount namespace). "
        "The exit status is PROGRAM's.")
    p.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                   help="the embedded daemon's wire address, the one the devices' GIDs carry; "
                   "peers reach it there. The default, 127.0.0.1:0, takes an address of its "
                   "own: the first 127.0.0.N whose port 4791 is free (so the softhca runs of "
                   "one machine share a port, and an rdma_cm program reaches another's "
                   "daemon at its address), else 127.0.0.1 and a free port")
    p.add_argument("--target", metavar="SOCKET",
                   help="use the daemon already serving this UNIX socket (serve --unix) "
                   "instead of starting one")
    p.add_argument("--peer-token-file", metavar="FILE",
                   help="the token the embedded daemon and its peers prove to each other on "
                   "their wire links, as 'serve --peer-token-file' (default: one of its own, "
                   "so that only daemons of this process can link to it); give the daemons "
                   "of both ends the same file")
    p.add_argument("--token-file", metavar="FILE",
                   help="let control sessions proving the token in FILE (softhca trace, "
                   "softhca faults --target from another host) reach the embedded daemon "
                   "on its TCP port, as 'serve --token-file' (the file must not be readable "
                   "by other users); without it that port serves peer daemons' wire links "
                   "only and the program talks to its daemon on a UNIX socket")
    p.add_argument("--hca", action="append", metavar="NAME",
                   help="the embedded daemon's HCAs (default mlx5_0); may be repeated")
    p.add_argument("--provider", metavar="DIR",
                   help="the directory holding libsofthca-rdmav34.so (default: the source "
                   "tree's provider/build, built by make, or $SOFTHCA_PROVIDER)")
    p.add_argument("--faults", metavar="FILE",
                   help="fault rules for the embedded daemon, as 'serve --faults'")
    p.add_argument("--capture", metavar="FILE",
                   help="the embedded daemon's packets to a pcap, as 'serve --capture' "
                   "(written by a process of its own; a packet that finds 64 MiB waiting is "
                   "left out and counted, capture_dropped, never delayed)")
    p.add_argument("--trace", metavar="FILE",
                   help="the embedded daemon's pipeline stages of every transfer (the "
                   "program's MKEY blocks: data, guard, app tag, ref tag, ciphertext) to FILE, "
                   "as 'softhca trace' prints them (rendered by a process of its own; events "
                   "it cannot keep up with are dropped, and FILE ends saying how many)")
    p.add_argument("--crypto-config", metavar="FILE",
                   help="the embedded daemon's devices' crypto configuration, as 'serve "
                   "--crypto-config' (default: plaintext DEK import)")
    p.add_argument("--stats", metavar="FILE",
                   help="when PROGRAM has ended, write the embedded daemon's counters and RC "
                   "statistics (packets, retransmissions, ...) to FILE as JSON")
    p.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error"],
                   help="the embedded daemon's log level (default warning)")
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS...]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .. import native

    argv = list(args.program)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("softhca run: name a program: softhca run -- PROGRAM [ARGS...]",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        return native.run(args, argv)
    except native.RunError as e:
        print(f"softhca run: {e}", file=sys.stderr)
        return EXIT_USAGE
