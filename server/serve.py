"""``softhca serve``: one daemon in the foreground, on uvloop when it is installed.

Logs are one line per event on stderr, ``time level logger message key=value...``,
greppable and parseable. SIGTERM and SIGINT stop the daemon gracefully: every QP of
every session goes to ERR (outstanding WRs flushed), then every connection closes.
With ``--capture FILE`` the daemon writes every packet it sends and accepts to FILE as
a pcap of RoCEv2 frames (``server/capture.py``), closed whole at the stop; a file that
cannot be written at start is refused (``capture_failed``), and one that stops growing
later (a full disk) stops the capture alone, with one ``side_feature_stopped`` line.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import re
import signal
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.crypto_login import DeviceCrypto
from ..protocol.errors import RDMAError
from .crypto_config import load_crypto_config
from .daemon import Daemon, Limits, kv
from .logs import setup_logging
from .loop import run_loop

log = logging.getLogger("softhca.server")


@dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    hcas: tuple[str, ...]
    token: bytes | None
    limits: Limits
    log_level: str
    ready_file: str | None
    faults: list = field(default_factory=list)
    capture: str | None = None
    crypto: DeviceCrypto | None = None
    strict_blocks: bool = False
    # The wire links' credential: None (no authentication) or bytes; unset, the token.
    peer_token: bytes | None = None
    peer_token_given: bool = False
    # Packet trains (docs/protocol.md); ``serve --no-trains`` sends packet by packet.
    trains: bool = True
    # A UNIX socket for local programs (server/unix.py), beside the TCP port.
    unix: str | None = None
    # Unacknowledged packets per RC requester (``serve --rc-window``); None: the default.
    rc_window: int | None = None


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {text!r} is not HOST:PORT")
    if int(port) > 65535:
        raise ValueError(f"--listen {text!r}: port {int(port)} is out of range (0 to 65535; "
                         "0 picks a free one)")
    return host.strip("[]") or "0.0.0.0", int(port)


# The smallest --max-frame: one RC packet of the largest path MTU (4096 bytes) with its
# headers in a frame, and a control reply's header beside an MR read's chunk (the client
# reads in chunks of max_frame - 4096 bytes, and only above 8 KiB). Below it the daemon
# would start and then fail every transfer or read.
MIN_MAX_FRAME = 64 << 10
# What a device name may be: as a Linux RDMA device's (ibv_get_device_name(3), a
# directory of /sys/class/infiniband, at most 63 bytes), in letters, digits and "_.-",
# since the name is also a path component of `softhca run`'s sysfs tree and a word of
# the log lines.
HCA_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,62}")


def check_hcas(names: list[str] | None) -> tuple[str, ...]:
    """The --hca names, refused at start when one is malformed or given twice."""
    names = list(names or ["mlx5_0"])
    for name in names:
        if not HCA_NAME.fullmatch(name):
            raise ValueError(f"--hca {name!r} is not a device name: 1 to 63 letters, digits, "
                             "'_', '.' or '-', not beginning with '.' (e.g. mlx5_0)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--hca {repeated[0]} is given {names.count(repeated[0])} times: each "
                         "device needs a name of its own")
    return tuple(names)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_secret(option: str, path: str, allow_readable: bool) -> bytes:
    """The token in ``path``, refused if other users may read or change it (as ssh
    refuses a private key they can read) unless ``allow_readable``."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            token = f.read().rstrip()
    except PermissionError as e:
        raise ValueError(f"cannot read {option} {path}: {e.strerror}{_whose(path)}") from None
    except OSError as e:
        raise ValueError(f"cannot read {option} {path}: {e.strerror}") from None
    if mode & 0o006 and not allow_readable:
        raise ValueError(f"{option} {path} is {'readable' if mode & 0o004 else 'writable'} "
                         f"by every user (mode {stat.S_IMODE(mode):04o}): chmod o-rw it, or "
                         "give --allow-readable-token")
    if not token:
        raise ValueError(f"{option} {path} is empty")
    return token


def read_tokens(path: str, allow_readable: bool) -> bytes | tuple[bytes, ...]:
    """The client token(s) of ``--token-file`` ``path`` (``serve``'s and ``softhca
    run``'s): one per line, several being several tenants, each its own credential."""
    token = read_secret("--token-file", path, allow_readable)
    tokens = tuple(t.strip() for t in token.splitlines() if t.strip())
    return tokens if len(tokens) > 1 else token


def check_exposure(host: str, token, *, control: bool, allow_no_auth: bool) -> None:
    """Refuse a TCP port beyond loopback that would serve control sessions without a
    token (anyone who reaches it could drive, tap and fault every session), unless
    ``allow_no_auth`` says so. A port that serves no control session (``softhca run``
    without --token-file) has wire links only, which always prove the peer token."""
    if control and token is None and not is_loopback(host) and not allow_no_auth:
        raise ValueError(f"refusing to listen on {host} without a token: give --token-file, "
                         "or --allow-no-auth to serve anyone who can reach the port")


def _whose(path: str) -> str:
    """Why a token file cannot be read, in uids: the daemon's and the file's (a secret
    mounted into the daemon's container is often root's and mode 0600, while the daemon
    runs as uid 10001 there, docker/README.md)."""
    try:
        st = os.stat(path)
    except OSError:
        return f" (this daemon runs as uid {os.geteuid()})"
    return (f" (this daemon runs as uid {os.geteuid()}, gid {os.getegid()}; the file is owned "
            f"by uid {st.st_uid}, gid {st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}: "
            f"make it readable by uid {os.geteuid()}, e.g. chown {os.geteuid()} it)")


def options_from_args(args) -> ServeOptions:
    host, port = parse_listen(args.listen)
    hcas = check_hcas(args.hca)
    if args.max_frame < MIN_MAX_FRAME:
        raise ValueError(f"--max-frame {args.max_frame} is too small: at least {MIN_MAX_FRAME} "
                         "(64 KiB: a 4096-byte packet with its headers, a control reply with "
                         "a chunk of memory)")
    token = None
    allow_readable = getattr(args, "allow_readable_token", False)
    if args.token_file:
        token = read_tokens(args.token_file, allow_readable)
    peer_token_file = getattr(args, "peer_token_file", None)
    peer_token = None
    if peer_token_file:
        peer_token = read_secret("--peer-token-file", peer_token_file, allow_readable)
    check_exposure(host, token, control=True, allow_no_auth=args.allow_no_auth)
    faults = []
    if getattr(args, "faults", None):
        try:
            faults = json.loads(Path(args.faults).read_text())
        except OSError as e:
            raise ValueError(f"cannot read --faults {args.faults}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"--faults {args.faults} is not JSON: {e}") from None
        if not isinstance(faults, list):
            raise ValueError(f"--faults {args.faults} must hold a JSON list of rules")
        # Refuse a bad file before listening, naming the rule.
        from .faults import validate_rule

        for n, rule in enumerate(faults, 1):
            try:
                validate_rule(rule)
            except RDMAError as e:
                raise ValueError(f"--faults {args.faults}, rule {n}: {e.message}") from None
    capture = getattr(args, "capture", None)
    if capture:
        # Refuse an unwritable file before listening (serve truncates it when it starts).
        try:
            with open(capture, "ab"):
                pass
        except OSError as e:
            raise ValueError(f"cannot write --capture {capture}: {e.strerror}") from None
    crypto = None
    if getattr(args, "crypto_config", None):
        # Refused before listening: the devices' crypto mode is fixed at start.
        crypto = load_crypto_config(args.crypto_config)
    limits = Limits(max_connections=args.max_connections,
                    max_pre_hello=getattr(args, "max_pre_hello", Limits.max_pre_hello),
                    hello_timeout=getattr(args, "hello_timeout", Limits.hello_timeout),
                    max_objects=args.max_objects,
                    max_session_bytes=args.max_session_bytes,
                    max_daemon_bytes=args.max_daemon_bytes, max_frame=args.max_frame,
                    max_msg_size=args.max_msg_size, max_qp_wr=args.max_qp_wr,
                    **share_limits(args))
    return ServeOptions(host, port, hcas, token, limits,
                        args.log_level, args.ready_file, faults, capture or None, crypto,
                        bool(getattr(args, "strict_blocks", False)), peer_token,
                        bool(peer_token_file), not getattr(args, "no_trains", False),
                        getattr(args, "unix", None), getattr(args, "rc_window", None))


def share_limits(args) -> dict:
    """The fair-share limits of ``serve`` (server/shares.py) that were given."""
    from .hosts import DEFAULT_QUOTAS

    out: dict = {}
    for name in ("max_credential_connections", "frame_deadline", "idle_timeout",
                 "memory_budget", "cm_timewait"):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = value
    quotas = dict(DEFAULT_QUOTAS)
    for item in getattr(args, "quota", None) or []:
        kind, sep, values = item.partition("=")
        parts = values.split(",")
        if not sep or kind not in quotas or len(parts) != 2 or not all(
                p.strip().isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"--quota {item!r} is not KIND=SESSION,CREDENTIAL with KIND one "
                             f"of {', '.join(quotas)} and two positive counts")
        quotas[kind] = (int(parts[0]), int(parts[1]))
    out["quotas"] = quotas
    return out


async def serve(o: ServeOptions) -> None:
    daemon = Daemon(o.hcas, o.host, o.port, o.token, limits=o.limits, crypto=o.crypto,
                    strict_blocks=o.strict_blocks, trains=o.trains, rc_window=o.rc_window,
                    **({"peer_token": o.peer_token} if o.peer_token_given else {}))
    for rule in o.faults:
        daemon.faults.add(rule)
    tap = None
    if o.capture:
        from .capture import CaptureTap

        # Opened (and its pcap header written) before listening: a file that cannot
        # be written is refused at start, named as the cause.
        try:
            tap = CaptureTap(daemon, o.capture)
        except OSError as e:
            raise StartError("capture_failed", o.capture, e) from None
    try:
        await daemon.start()
    except OSError as e:
        raise StartError("listen_failed", f"{o.host}:{o.port}", e) from None
    unix = None
    if o.unix:
        from .unix import UnixListener

        unix = UnixListener(daemon, o.unix)
        try:
            await unix.start()
        except OSError as e:
            await daemon.close()
            if tap is not None:
                tap.close()
            raise StartError("listen_failed", o.unix, e) from None
    if tap is not None:
        log.info("capturing %s", kv(event="capture", file=o.capture))
    log.info("crypto %s", kv(event="crypto", mode="wrapped" if daemon.crypto.wrapped
                              else "plaintext", import_kek_id=daemon.crypto.import_kek_id,
                              credential_id=daemon.crypto.credential_id))
    if o.faults:
        log.info("fault rules installed %s", kv(event="faults_loaded", n=len(o.faults)))
    if o.token is None:
        who = ("any local process" if is_loopback(o.host)
               else f"any host that can reach {daemon.address}")
        log.warning("no token %s", kv(event="no_auth", address=daemon.address,
                                       note=f"{who} can use this daemon"))
    if daemon.peer_token_generated:
        log.info("peer token generated %s", kv(
            event="peer_token", source="generated",
            note="no other daemon can open a wire link here: give the daemons of a "
                 "fabric one --peer-token-file"))
    if o.ready_file:
        Path(o.ready_file).write_text(daemon.address + "\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
        if unix is not None:
            await unix.close()
        await daemon.close()
    finally:
        if tap is not None:
            tap.close()
            log.info("capture closed %s", kv(event="capture_closed", file=o.capture,
                                              packets=tap.count,
                                              stopped_early=tap.error is not None))
    log.info("stopped %s", kv(event="stopped", **daemon.counters))


class StartError(Exception):
    """The daemon could not start: ``event`` (listen_failed, capture_failed), what it
    was about (an address, a file) and the OSError that says why."""

    def __init__(self, event: str, what: str, error: OSError) -> None:
        super().__init__(event, what, error)
        self.event, self.what, self.error = event, what, error


def run(o: ServeOptions) -> int:
    setup_logging(o.log_level)
    try:
        run_loop(serve(o))
    except StartError as e:
        field = "address" if e.event == "listen_failed" else "file"
        log.error("cannot serve %s", kv(event=e.event, **{field: e.what},
                                         reason=e.error.strerror or str(e.error)))
        return 1
    return 0
