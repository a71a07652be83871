"""``softhca serve``: a daemon hosting simulated HCAs (server/serve.py runs it)."""

from __future__ import annotations

import argparse
import sys

from ..cliargs import positive_float, positive_int
from . import EXIT_USAGE


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a daemon hosting simulated HCAs",
                       description="Serve the control plane (verbs calls from applications) "
                       "and the wire plane (RC packets from other daemons) on one TCP port.")
    p.add_argument("--listen", default="127.0.0.1:4791", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:4791; port 0 picks one)")
    p.add_argument("--unix", metavar="PATH",
                   help="also serve local programs' control sessions on a UNIX socket at PATH "
                   "(created mode 0600; only this user's and root's processes are served, by "
                   "SO_PEERCRED); the libibverbs provider connects there")
    p.add_argument("--hca", action="append", metavar="NAME",
                   help="an HCA to host (default mlx5_0); may be repeated")
    p.add_argument("--token-file", metavar="FILE",
                   help="file holding the token control sessions (clients) must prove "
                   "(HMAC over a nonce), or several, one per line: one per tenant, each a "
                   "credential with its own shares; trailing whitespace is ignored")
    p.add_argument("--peer-token-file", metavar="FILE",
                   help="file holding the token peer daemons' wire links must prove; give "
                   "the daemons of a fabric the same one (default: a random one made at "
                   "start, so no other daemon links here; a client's token never does)")
    p.add_argument("--allow-readable-token", action="store_true",
                   help="accept a token file that every user may read (refused otherwise, as "
                   "ssh refuses such a private key)")
    p.add_argument("--allow-no-auth", action="store_true",
                   help="listen on a non-loopback address without a token (anyone who can "
                   "reach the port can read and write the hosted memory)")
    p.add_argument("--max-frame", type=positive_int, default=16 << 20, metavar="BYTES",
                   help="largest frame accepted (default 16 MiB)")
    limits = p.add_argument_group("limits (each hit is a clear error; the daemon keeps serving)")
    limits.add_argument("--max-connections", type=positive_int, default=1024, metavar="N",
                        help="control sessions and wire links at once (default 1024)")
    limits.add_argument("--max-pre-hello", type=positive_int, default=64, metavar="N",
                        help="connections still in the HELLO, apart from those, on the TCP "
                        "port and, as many again, on the UNIX socket (default 64; when full "
                        "the oldest is closed for the newcomer)")
    limits.add_argument("--hello-timeout", type=positive_float, default=3.0, metavar="S",
                        help="seconds a connection has to complete the HELLO (default 3)")
    limits.add_argument("--max-objects", type=positive_int, default=1 << 16, metavar="N",
                        help="verbs objects per control session (default 65536)")
    limits.add_argument("--max-session-bytes", type=positive_int, default=4 << 30,
                        metavar="BYTES", help="registered MR bytes per session (default 4 GiB)")
    limits.add_argument("--max-daemon-bytes", type=positive_int, default=16 << 30,
                        metavar="BYTES", help="registered MR bytes in all (default 16 GiB)")
    limits.add_argument("--max-msg-size", type=positive_int, default=1 << 31, metavar="BYTES",
                        help="bytes in one message, the port's max_msg_sz (default 2 GiB)")
    limits.add_argument("--max-qp-wr", type=positive_int, default=1 << 14, metavar="N",
                        help="max_send_wr / max_recv_wr of a QP (default 16384)")
    limits.add_argument("--max-credential-connections", type=positive_int, default=256,
                        metavar="N", help="connections one credential (a client token, the "
                        "peer token, a uid on the UNIX socket, each of whose processes may hold "
                        "half) may hold at once (default 256; EBUSY past it)")
    limits.add_argument("--frame-deadline", type=positive_float, default=10.0, metavar="S",
                        help="seconds a frame may take once its first bytes arrived (default "
                        "10; then ETIMEDOUT and the connection closes)")
    limits.add_argument("--idle-timeout", type=positive_float, default=600.0, metavar="S",
                        help="seconds a control session that holds nothing (no object, no "
                        "waiting request, no subscription) may send nothing (default 600; "
                        "then ETIMEDOUT and it closes)")
    limits.add_argument("--cm-timewait", type=_timewait, default=None, metavar="S",
                        help="seconds a disconnected rdma_cm connection stays in timewait "
                        "before RDMA_CM_EVENT_TIMEWAIT_EXIT (default 1.024, the IB CM's "
                        "time for a RoCE path; at most 60)")
    limits.add_argument("--quota", action="append", default=[], metavar="KIND=S,C",
                        help="objects of KIND (ctx, pd, mr, cq, qp, mkey, dek, crypto_login) "
                        "one session (S) and one credential (C) may hold; may be repeated "
                        "(defaults: README, Limits; ENOMEM past either)")
    limits.add_argument("--memory-budget", type=positive_int, default=None, metavar="BYTES",
                        help="bytes of objects and registered memory in the daemon in all "
                        "(default half of the machine's memory; ENOMEM past it)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error"], help="default info")
    p.add_argument("--ready-file", metavar="FILE",
                   help="write HOST:PORT here once listening (for scripts using port 0)")
    p.add_argument("--faults", metavar="FILE",
                   help="fault rules to install at start: a JSON list of rules (the fields of "
                   "'softhca faults add'), refused whole if any rule is malformed")
    p.add_argument("--strict-blocks", action="store_true",
                   help="refuse what is not whole protection blocks: a signature MKEY's "
                   "layout at configure (EINVAL), and a transfer through it that is not whole "
                   "blocks, which fails as one with a misaligned start does "
                   "(docs/blocks.md); without it a trailing partial block passes as plain "
                   "data and is counted (partial_block_* counters)")
    p.add_argument("--no-trains", action="store_true",
                   help="send every RC packet as its own frame, never a packet train "
                   "(a run of one message's packets in one frame, docs/protocol.md); "
                   "for comparison: the traffic is the same")
    p.add_argument("--rc-window", type=_rc_window, default=None, metavar="N",
                   help="packets an RC QP's requester may have unacknowledged on the wire "
                   "(default 1024; 128 is rxe's RXE_MAX_UNACKED_PSNS; 16 to 16384); runs of "
                   "at most a quarter of it go as one train")
    p.add_argument("--capture", metavar="FILE",
                   help="write every packet this daemon sends and accepts to FILE, a pcap of "
                   "RoCEv2 frames that Wireshark and tshark decode (see 'softhca capture')")
    p.add_argument("--crypto-config", metavar="FILE",
                   help="the devices' crypto configuration, fixed for the daemon's life: a "
                   'JSON object {"mode": "plaintext" | "wrapped", "import_kek": hex, '
                   '"credential": hex, "import_kek_id": N, "credential_id": N}, every field '
                   "optional (default: plaintext DEK import; see docs/crypto-import.md)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ...server import serve

    try:
        options = serve.options_from_args(args)
    except ValueError as e:
        print(f"softhca serve: {e}", file=sys.stderr)
        return EXIT_USAGE
    return serve.run(options)



def _rc_window(text: str) -> int:
    """``--rc-window``: a whole count of packets within the device's bounds."""
    from ...engine.hca import RC_WINDOW_MAX, RC_WINDOW_MIN

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of packets") from None
    if not RC_WINDOW_MIN <= value <= RC_WINDOW_MAX:
        raise argparse.ArgumentTypeError(f"{text} packets: {RC_WINDOW_MIN} to {RC_WINDOW_MAX}")
    return value


def _timewait(text: str) -> float:
    """``--cm-timewait``: seconds above zero, at most the daemon's bound."""
    from ...server.hosts import CM_TIMEWAIT_MAX

    value = positive_float(text)
    if value > CM_TIMEWAIT_MAX:
        raise argparse.ArgumentTypeError(f"{text} s: at most {CM_TIMEWAIT_MAX:g}")
    return value
