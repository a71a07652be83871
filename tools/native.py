"""What ``softhca run`` prepares so that an unmodified libibverbs program finds softhca
devices, with no RDMA kernel module:

- a sysfs tree, read through ``SYSFS_PATH`` (libibverbs reads node type, GIDs, GID
  types and P_Keys there, UCX a device's NUMA node and CPUs):
  ``class/infiniband_verbs/uverbsN/{ibdev,dev,abi_version}`` and
  ``class/infiniband/<dev>/...`` as a kernel's mlx5 device has them, the values those
  of the device's ibv_query_device and ibv_query_port, GID 0 the softhca GID of the
  daemon and device (fe80::<IPv4>:<port>:<device index>, as the pyverbs layer's),
  typed "RoCE v2". The preload library answers the kernel's RDMA netlink (iproute2's
  ``rdma``, libibverbs' device list) from the same tree;
- ``/dev/infiniband/uverbsN``, which libibverbs opens and checks is a character device
  of the numbers sysfs gives (1:3, the null device: the provider sends it nothing).
  They exist only in the program's private mount namespace (``unshare -m``), on a
  tmpfs over /dev that carries bind mounts of the real /dev's entries; the host's /dev
  is never written;
- ``RDMAV_DRIVERS``, naming the provider (provider/build/libsofthca), and
  ``SOFTHCA_SOCKET``, the daemon's UNIX socket;
- ``LD_PRELOAD`` with provider/build/libsofthca-preload.so first (the user's kept
  after it): completion channels whose fd is real from ``ibv_create_comp_channel`` on,
  and RDMA netlink (provider/preload/; docs/native.md says why);
- ``LD_LIBRARY_PATH`` with provider/build first (the user's entries kept after it), so
  that a program linked with Debian's libmlx5.so.1 gets softhca's (provider/mlx5/),
  which serves the mlx5dv calls on softhca devices;
- the daemon: embedded in this process (on ``--listen``) unless ``--target`` names the
  UNIX socket of one that runs already. The program reaches it on the UNIX socket
  (owner-only); its TCP port takes wire links from peer daemons (the peer token) and,
  only with ``--token-file``, control sessions that prove that token.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from ..protocol.errors import RDMAError
from ..protocol.frames import FrameDecoder, encode_frame

PROVIDER_DIR = Path(__file__).resolve().parents[1] / "provider" / "build"
PROVIDER_LIB = "libsofthca-rdmav34.so"
# The null device's numbers: libibverbs only checks that the node has sysfs' numbers.
NODE_DEV = "1:3"

# Runs inside the new mount namespace, as root: a tmpfs over /dev holding bind mounts
# of the real /dev's entries, then the device nodes. $1: the number of nodes; the rest:
# the program.
# prctl(2) option: the signal the calling process gets when its parent dies.
# The preload library in the provider directory (provider/preload/, built by make provider).
PRELOAD_NAME = "libsofthca-preload.so"
_PR_SET_PDEATHSIG = 1

_NS_SCRIPT = r"""
set -e
# PID 1 of the program's PID namespace: a signal without a handler never reaches it.
trap 'exit 130' INT
trap 'exit 143' TERM
n=$1; run=$2; py=$3; binds=$4; shift 4
old=$(mktemp -d "$run/dev.XXXXXX")
mount --bind /dev "$old"
mount -t tmpfs -o mode=0755,nosuid softhca-dev /dev
"$py" -I -S -c "$binds" "$old" /dev
umount -l "$old"; rmdir "$old"
mkdir /dev/infiniband
i=0
while [ "$i" -lt "$n" ]; do mknod "/dev/infiniband/uverbs$i" c 1 3; i=$((i + 1)); done
# /sys/class/infiniband as our sysfs tree has it (each device's device/net/<if>, which
# tests look for: rdma-core's tests/base.py), on a tmpfs over /sys/class that carries
# bind mounts of the real classes (their relative links still resolve under /sys).
if [ -d "$SYSFS_PATH/class/infiniband" ] && mountpoint -q /sys 2>/dev/null; then
  old=$(mktemp -d "$run/class.XXXXXX")
  mount --bind /sys/class "$old"
  mount -t tmpfs -o mode=0755,nosuid,nodev,noexec softhca-class /sys/class
  "$py" -I -S -c "$binds" "$old" /sys/class
  umount -l "$old"; rmdir "$old"
  mkdir /sys/class/infiniband
  mount --bind "$SYSFS_PATH/class/infiniband" /sys/class/infiniband
fi
# Set up: say so, then give the program the real stderr (fd 9; until here fd 2 was
# softhca run's pipe, so that unshare's or a mount's refusal reaches it, not lost).
echo softhca-run-ready >&2
exec 2>&9 9>&-
# The program runs as a child (its stdin this script's: an asynchronous command's is
# /dev/null otherwise) so that this shell, PID 1, can pass it softhca run's SIGINT and
# SIGTERM; when the program ends this shell exits with its status, and the kernel
# kills whatever else of the tree remains in the namespace.
set +e
child=
trap '[ -n "$child" ] && kill -s INT "$child" 2>/dev/null' INT
trap '[ -n "$child" ] && kill -s TERM "$child" 2>/dev/null' TERM
exec 3<&0
"$@" <&3 3<&- &
child=$!
exec 3<&-
while :; do
  wait "$child"
  rc=$?
  kill -0 "$child" 2>/dev/null || exit "$rc"
done
"""
# The script's per-entry bind mounts, one process for them all (run with softhca run's
# own Python, -I -S: no site, no environment): a mount(8) per entry of /dev and of
# /sys/class was some 170 processes, over a second of every softhca run's start on a
# loaded machine. argv: the old tree, the new one; each entry but infiniband is made
# again in the new tree (a link as a link, a directory recursively bound, anything else
# bound over an empty file), as the shell's loop did, and a refused mount is said as
# mount(8) says it, exit status 32.
_BINDS = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC = 4096, 16384
old, new = sys.argv[1], sys.argv[2]
def bind(src, dst, flags):
    if libc.mount(src.encode(), dst.encode(), None, flags, None) != 0:
        sys.stderr.write("mount: %s: %s.\n" % (dst, os.strerror(ctypes.get_errno())))
        sys.exit(32)
for name in sorted(os.listdir(old)):
    if name.startswith(".") or name == "infiniband":
        continue
    src, dst = os.path.join(old, name), os.path.join(new, name)
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif os.path.isdir(src):
        os.mkdir(dst)
        bind(src, dst, MS_BIND | MS_REC)
    else:
        open(dst, "w").close()
        bind(src, dst, MS_BIND)
"""
# What the script prints on its pipe once the namespace is set up.
_READY = b"softhca-run-ready\n"
# Where the script finds the real stderr (a digit: sh names fds 0-9 only).
_STDERR_FD = 9


# ``--listen`` 127.0.0.1:0, the default, asks for an address of the daemon's own: the
# first of 127.0.0.1, 127.0.0.2, ... whose port SHARED_PORT is free. Each ``softhca run``
# on one machine then has its own loopback address on one wire port, as hosts of one
# RoCE fabric share UDP 4791, so that an rdma_cm program reaches another's daemon by
# its address (docs/native.md, "Two programs on one machine").
OWN_LOOPBACK = ("127.0.0.1", 0)
SHARED_PORT = 4791
LOOPBACK_ADDRESSES = 254


async def start_on_own_loopback(daemon, port: int = SHARED_PORT) -> None:
    """Start ``daemon`` on the first 127.0.0.N:``port`` that is free; when none is (a daemon on 0.0.0.0:4791 holds them all), on 127.0.0.1 and a
    free port, which GID-exchange programs reach and rdma_cm programs of other daemons
    cannot (said in one log line)."""
    import errno

    from ..server.logs import kv, log

    for n in range(1, LOOPBACK_ADDRESSES + 1):
        daemon.host, daemon.port = f"127.0.0.{n}", port
        try:
            await daemon.start()
            return
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
    daemon.host, daemon.port = OWN_LOOPBACK
    await daemon.start()
    log.warning("no loopback address of its own %s", kv(
        event="listen_fallback", address=daemon.address,
        reason=f"port {port} is taken on every 127.0.0.N: GID-exchange programs "
        "reach this daemon, rdma_cm programs of other daemons cannot (an address names "
        f"the daemon on this daemon's wire port); give --listen ADDR:PORT to choose"))


class RunError(Exception):
    """``softhca run`` cannot set the program up (said before it starts)."""


def gid(host: str, port: int, index: int) -> str:
    """The sysfs form of a softhca GID: fe80::<IPv4>:<port>:<device index>."""
    try:
        v4 = socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        raise RunError(f"the daemon's address {host!r} has no IPv4 address, which a "
                       "softhca GID carries") from None
    raw = bytes.fromhex("fe80000000000000") + v4 + port.to_bytes(2, "big") \
        + index.to_bytes(2, "big")
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def netdev_of(host: str) -> str | None:
    """The network interface that holds ``host``'s IPv4 address (the one the daemon
    answers on): "lo" for a loopback address; None when no interface has it (0.0.0.0)."""
    import struct

    try:
        ip = socket.inet_aton(socket.gethostbyname(host))
    except OSError:
        return None
    if ip[0] == 127:
        return "lo"
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                req = fcntl.ioctl(s.fileno(), siocgifaddr,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue        # no IPv4 address
            if req[20:24] == ip:
                return name
    return None


# ibv_query_port's port_cap_flags of the provider's port (shca_query_port): none.
PORT_CAP_FLAGS = 0


def _cpus() -> tuple[str, str]:
    """The kernel's local_cpus (a hex mask in 32-bit groups, nr_cpu_ids bits) and
    local_cpulist of a device no NUMA node is nearer to: every possible CPU."""
    try:
        possible = Path("/sys/devices/system/cpu/possible").read_text().strip()
    except OSError:
        possible = f"0-{(os.cpu_count() or 1) - 1}"
    cpus: set[int] = set()
    for part in possible.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    nbits = max(cpus) + 1
    mask = sum(1 << c for c in cpus)
    groups = []
    while nbits > 0:
        width = nbits % 32 or 32
        nbits -= width
        groups.append(f"{(mask >> nbits) & ((1 << width) - 1):0{(width + 3) // 4}x}")
    return ",".join(groups), possible


def _guid_text(value: int) -> str:
    """A GUID as sysfs prints node_guid: four groups of four hex digits."""
    h = f"{value & (1 << 64) - 1:016x}"
    return ":".join(h[i:i + 4] for i in range(0, 16, 4))


def write_sysfs(root: Path, devices: list[str], host: str, port: int,
                attrs: dict[str, dict] | None = None) -> None:
    """The tree libibverbs, UCX, libfabric and rdma-core's tests read, as a kernel's
    mlx5 device has it, its values those ibv_query_device and ibv_query_port report:
    ``attrs`` holds each device's query_device answer (node_guid, fw_ver,
    vendor_part_id); a device without one gets a GUID made of the daemon's address.
    Beside the class tree, ``softhca/<dev>/cap_flags``: what only netlink tells, which
    the preload library's RDMA netlink reads (provider/preload/netlink.c)."""
    verbs = root / "class" / "infiniband_verbs"
    verbs.mkdir(parents=True)
    # The interface whose address the daemon answers on, as an RoCE device's netdev.
    netdev = netdev_of(host)
    local_cpus, local_cpulist = _cpus()
    (verbs / "abi_version").write_text("6\n")
    for i, dev in enumerate(devices):
        a = (attrs or {}).get(dev, {})
        uverbs = {"ibdev": dev, "dev": NODE_DEV, "abi_version": "1"}
        for name, text in uverbs.items():
            (verbs / f"uverbs{i}").mkdir(exist_ok=True)
            (verbs / f"uverbs{i}" / name).write_text(text + "\n")
        ib = root / "class" / "infiniband" / dev
        guid = _guid_text(a["node_guid"]) if "node_guid" in a else _guid(host, port, i)
        files = {
            "node_type": "1: CA", "node_guid": guid, "sys_image_guid": guid,
            "fw_ver": str(a.get("fw_ver", "softhca-1")),
            "board_id": "SOFTHCA0001",
            # mlx5's hca_type: "MT" and the PCI device id, vendor_part_id here
            "hca_type": f"MT{a.get('vendor_part_id', 4123)}", "hw_rev": "0",
            "node_desc": f"{socket.gethostname()} {dev}",
            "device/modalias": "softhca:", "device/numa_node": "-1",
            "device/local_cpus": local_cpus, "device/local_cpulist": local_cpulist,
            "ports/1/gids/0": gid(host, port, i), "ports/1/gid_attrs/types/0": "RoCE v2",
            "ports/1/gid_attrs/ndevs/0": netdev or "lo", "ports/1/pkeys/0": "0xffff",
            "ports/1/link_layer": "Ethernet", "ports/1/state": "4: ACTIVE",
            "ports/1/phys_state": "5: LinkUp", "ports/1/lid": "0x0", "ports/1/sm_lid": "0x0",
            "ports/1/sm_sl": "0", "ports/1/lid_mask_count": "0",
            "ports/1/rate": "100 Gb/sec (4X EDR)",
            "ports/1/cap_mask": f"0x{PORT_CAP_FLAGS:08x}",
        }
        # The uverbs device under its parent, as the kernel's class device is there
        # (libibverbs reads it when netlink names no char device).
        for name, text in uverbs.items():
            files[f"device/infiniband_verbs/uverbs{i}/{name}"] = text
        if netdev is not None:
            files[f"device/net/{netdev}/ifindex"] = str(socket.if_nametoindex(netdev))
        for rel, text in files.items():
            path = ib / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
        extra = root / "softhca" / dev
        extra.mkdir(parents=True)
        # The kernel tells the device's capability flags on netlink only
        # (RDMA_NLDEV_ATTR_CAP_FLAGS, 64 bits: ibv_query_device_ex's device_cap_flags_ex).
        caps = a.get("device_cap_flags_ex", a.get("device_cap_flags"))
        if caps is None:
            from ..server.device_attr import DEVICE_CAP_FLAGS as caps
        (extra / "cap_flags").write_text(f"0x{caps:x}\n")


async def device_attrs(sock: str, devices: list[str]) -> dict[str, dict]:
    """Each device's ibv_query_device answer from the daemon on UNIX socket ``sock``
    (a control session of its own, closed after)."""
    from ..client.node import connect

    node = await connect(f"unix:{sock}")
    try:
        out = {}
        for dev in devices:
            ctx = await node.open_device(dev)
            out[dev] = await ctx.query_device()
        return out
    finally:
        await node.close()


def _guid(host: str, port: int, index: int) -> str:
    """The sysfs form of the device's node GUID: the one its ibv_query_device answers."""
    # Imported here: the parser of `softhca run` loads this module, and the device's
    # attributes bring the engine.
    from ..server.device_attr import node_guid

    return _guid_text(node_guid(host, port, index))


def welcome_of(path: str) -> dict:
    """The welcome of the daemon serving UNIX socket ``path`` (its devices and address)."""
    dec = FrameDecoder(1 << 20)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(path)
        except OSError as e:
            raise RunError(f"no daemon at {path}: {e.strerror}") from None

        def frame() -> dict:
            while True:
                frames = dec.feed(s.recv(65536) or b"")
                if frames:
                    return frames[0].header

        challenge = frame()
        if challenge.get("auth"):
            raise RunError(f"the daemon at {path} asks for a token on its UNIX socket")
        for buf in encode_frame({"t": "hello", "version": 1, "role": "control"}):
            s.sendall(buf)
        w = frame()
    if w.get("t") != "welcome" or "address" not in w:
        raise RunError(f"the daemon at {path} refused: {w.get('msg', w)}")
    return w


def program_env(sysfs: Path, sock: str, provider: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SYSFS_PATH"] = str(sysfs)
    env["RDMAV_DRIVERS"] = str(provider / "libsofthca")
    env["SOFTHCA_SOCKET"] = sock
    # provider/build before the system's libraries: softhca's libmlx5.so.1 ahead of
    # Debian's (which cannot serve a softhca device) and softhca's librdmacm.so.1 ahead of
    # the system's (which needs a kernel rdma_cm, /dev/infiniband/rdma_cm, not there).
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(provider),
                                                  env.get("LD_LIBRARY_PATH")) if p)
    # softhca's preload library first, the user's preloads kept after it: it defines
    # ibv_create_comp_channel / ibv_destroy_comp_channel in libibverbs' place, so that a
    # completion channel's fd is real from its creation (libibverbs' own asks a kernel).
    # (once: an image's environment may name it already). A provider directory of a build
    # that has no such library (an older one) is run as before it: the loader would
    # otherwise complain in every process.
    preload = str(provider / PRELOAD_NAME)
    user = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p != preload]
    if (provider / PRELOAD_NAME).is_file():
        user.insert(0, preload)
    if user:
        env["LD_PRELOAD"] = " ".join(user)
    return env


def die_with_parent() -> None:
    """In the child before exec: SIGKILL it when ``softhca run`` dies, however it dies.
    The program's daemon lives in ``softhca run``; a program left without it would spin
    on its CQs for good (and keep its parent's pipes open). The setting survives the
    ``exec`` of unshare, sh and the program (none is set-user-ID)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() == 1:       # the parent died before prctl took effect
        os._exit(1)


def _child_setup(real_stderr: int) -> None:
    """In the child before exec (fd 2 is already the pipe): the real stderr at fd 9 for
    the script, then every other fd from 3 up closed, as close_fds would (which runs
    after this and would close fd 9 too, hence close_fds=False)."""
    die_with_parent()
    if real_stderr != _STDERR_FD:
        os.dup2(real_stderr, _STDERR_FD)
    os.set_inheritable(_STDERR_FD, True)
    os.closerange(3, _STDERR_FD)
    os.closerange(_STDERR_FD + 1, os.sysconf("SC_OPEN_MAX"))


def namespace_refused(said: str) -> str:
    """The one line ``softhca run`` prints when its mount namespace cannot be made:
    ``said``, what unshare or the script's mount printed, names the cause; then what to
    do, which depends on whether this environment already points at a daemon (a softhca
    image's: softhca-node set it up, and a container's unshare is refused)."""
    cause = said.strip().splitlines()[-1] if said.strip() else "no reason given"
    sock = os.environ.get("SOFTHCA_SOCKET")
    if sock and os.environ.get("SYSFS_PATH") and Path(sock).exists():
        hint = ("run the program directly: this environment (SYSFS_PATH, SOFTHCA_SOCKET, "
                "RDMAV_DRIVERS, LD_LIBRARY_PATH) already gives it softhca's provider and "
                f"the daemon at {sock}")
    else:
        hint = "softhca run needs root with CAP_SYS_ADMIN (mount namespaces) and mount(8)"
    return f"cannot make the program's mount namespace ({cause}): {hint}"


async def _setup_said(proc: subprocess.Popen) -> bytes:
    """What the script's pipe carried until it handed the program the real stderr (EOF)
    or died; anything before the ready line is passed on to stderr."""
    said = await asyncio.to_thread(proc.stderr.read)
    proc.stderr.close()
    if said.endswith(_READY) and said[:-len(_READY)]:
        os.write(2, said[:-len(_READY)])
    return said


def _signal_program(unshare_pid: int, sig: int) -> None:
    """Pass ``sig`` to the PID namespace's init (the script, which passes it to the
    program): unshare, its parent, ignores SIGINT and SIGTERM while it waits."""
    try:
        children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
        os.kill(int(children[0]), sig)
    except (OSError, IndexError, ValueError):
        pass        # not forked yet, or gone: nothing to pass it to


async def _run_program(argv: list[str], env: dict[str, str], ndev: int, run_dir: Path) -> int:
    real_stderr = os.dup(2)
    try:
        # A PID namespace of its own (a new /proc in the mount namespace, which the
        # provider reads): when softhca run dies, however it dies, unshare gets SIGKILL
        # (PR_SET_PDEATHSIG), its child, the namespace's init, with it (--kill-child),
        # and the kernel kills every process left in the namespace: the program's
        # background children too, which PR_SET_PDEATHSIG alone would leave running.
        # Forked here, on the loop's thread (PR_SET_PDEATHSIG follows the thread that
        # forked), by subprocess rather than the loop: the child closes every fd it does
        # not keep, which uvloop's own spawn would not survive; the waits run in threads.
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
             "--kill-child", "--mount-proc", "sh", "-c", _NS_SCRIPT,
             "softhca-run", str(ndev), str(run_dir), sys.executable, _BINDS, *argv], env=env,
            stderr=subprocess.PIPE,
            close_fds=False, preexec_fn=lambda: _child_setup(real_stderr))
    finally:
        os.close(real_stderr)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _signal_program, proc.pid, sig)
    try:
        said = await _setup_said(proc)
        rc = await asyncio.to_thread(proc.wait)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    # Not set up and not killed (a signal, Ctrl-C, during the set-up is the user's):
    # unshare or a mount refused, and said why on the pipe.
    if not said.endswith(_READY) and rc >= 0:
        raise RunError(namespace_refused(said.decode(errors="replace")))
    return rc


async def _embedded(args, argv: list[str], tmp: Path, provider: Path) -> int:
    from ..server.daemon import Daemon
    from ..server.serve import check_exposure, check_hcas, parse_listen, read_secret, read_tokens
    from ..server.unix import UnixListener

    try:
        host, port = parse_listen(args.listen)
        hcas = check_hcas(args.hca)
    except ValueError as e:
        raise RunError(str(e)) from None
    opts: dict = {}     # the Daemon's keyword options
    # The TCP port takes wire links (the peer token) and, only with --token-file, control
    # sessions proving that token (softhca trace / faults from another host); the
    # program itself is served on the UNIX socket.
    token = None
    if getattr(args, "token_file", None):
        try:
            token = read_tokens(args.token_file, allow_readable=False)
        except ValueError as e:
            raise RunError(str(e)) from None
    try:
        check_exposure(host, token, control=token is not None, allow_no_auth=False)
    except ValueError as e:
        raise RunError(str(e)) from None
    opts["token"] = token
    opts["tcp_control"] = token is not None
    if args.peer_token_file:
        try:
            opts["peer_token"] = read_secret("--peer-token-file", args.peer_token_file,
                                             allow_readable=False)
        except ValueError as e:
            raise RunError(str(e)) from None
    if getattr(args, "crypto_config", None):
        from ..server.crypto_config import CryptoConfigError, load_crypto_config
        try:
            opts["crypto"] = load_crypto_config(args.crypto_config)
        except CryptoConfigError as e:
            raise RunError(str(e)) from None
    daemon = Daemon(hcas, host, port, **opts)
    for rule in _fault_rules(args.faults):
        daemon.faults.add(rule)
    if (host, port) == OWN_LOOPBACK:
        await start_on_own_loopback(daemon)
    else:
        await daemon.start()
    tap = None
    if args.capture:
        from ..server.capture import CaptureTap

        tap = CaptureTap(daemon, args.capture)
    sock = str(tmp / "softhca.sock")
    unix = UnixListener(daemon, sock)
    await unix.start()
    follower = None
    try:
        if args.trace:
            from .trace import ProcessFollower

            try:
                # On the UNIX socket: the TCP port serves no control session. In a
                # process of its own: rendering the trace never holds the daemon's loop.
                follower = await ProcessFollower.start(f"unix:{sock}", args.trace)
            except OSError as e:
                raise RunError(f"--trace {args.trace}: {e.strerror or e}") from None
            except RDMAError as e:
                raise RunError(f"--trace {args.trace}: {e.errno_name}: {e.message}") from None
        devices = list(daemon.hcas)
        write_sysfs(tmp / "sys", devices, daemon.host, daemon.port,
                    await device_attrs(sock, devices))
        return await _run_program(argv, program_env(tmp / "sys", sock, provider),
                                  len(devices), tmp)
    finally:
        if follower is not None:
            await follower.stop()
        await unix.close()
        await daemon.close()
        if tap is not None:
            tap.close()
        if args.stats:
            Path(args.stats).write_text(json.dumps(daemon.stats(), indent=1) + "\n")


def _fault_rules(path: str | None) -> list:
    """The rules of ``--faults`` FILE, each checked, refused before anything starts."""
    if not path:
        return []
    from ..server.faults import validate_rule

    try:
        rules = json.loads(Path(path).read_text())
        if not isinstance(rules, list):
            raise ValueError("the file must hold a JSON list of rules")
        for rule in rules:
            validate_rule(rule)
    except (OSError, ValueError, RDMAError) as e:
        raise RunError(f"--faults {path}: {getattr(e, 'message', e)}") from None
    return rules


async def _targeted(args, argv: list[str], tmp: Path, provider: Path) -> int:
    w = welcome_of(args.target)
    host, _, port = str(w["address"]).rpartition(":")
    devices = [str(d) for d in w.get("devices", [])]
    try:
        attrs = await device_attrs(args.target, devices)
    except (OSError, RDMAError) as e:
        raise RunError(f"the daemon at {args.target} did not answer ibv_query_device: "
                       f"{getattr(e, 'message', e)}") from None
    write_sysfs(tmp / "sys", devices, host, int(port), attrs)
    return await _run_program(argv, program_env(tmp / "sys", args.target, provider),
                              len(devices), tmp)


RUN_PREFIX = "softhca-run."
# The lock file in it. A directory without one is never removed: it may be an older
# softhca run's, alive (a run killed in the instant between making its directory and
# its lock leaves an empty directory).
RUN_LOCK = "lock"


def hold_run_lock(run_dir: Path) -> int:
    """The lock of ``run_dir``, held while this process lives (the kernel drops it when
    it dies, even by SIGKILL): the next softhca run removes a directory whose lock is
    free. Locked under another name, then renamed RUN_LOCK: a lock file created and then
    locked was free in between, and a softhca run starting beside this one removed the
    directory in that instant (the program's failing with no such file)."""
    fd = os.open(run_dir / (RUN_LOCK + ".new"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC,
                 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(run_dir / (RUN_LOCK + ".new"), run_dir / RUN_LOCK)
    return fd


def remove_stale_run_dirs(parent: str | None = None) -> list[Path]:
    """Remove the directories of ``softhca run``s that died without removing theirs
    (SIGKILL): one of this user's whose lock nobody holds. What was removed."""
    gone = []
    for d in Path(parent or tempfile.gettempdir()).glob(RUN_PREFIX + "*"):
        try:
            st = d.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                continue
            try:
                fd = os.open(d / RUN_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            else:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue        # its softhca run is alive
                finally:
                    os.close(fd)
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d)
    return gone


def run(args, argv: list[str]) -> int:
    # SOFTHCA_PROVIDER: where an installed softhca has no source tree (the images set it
    # to /opt/softhca-provider).
    default = os.environ.get("SOFTHCA_PROVIDER") or PROVIDER_DIR
    provider = Path(args.provider or default).resolve()
    if not (provider / PROVIDER_LIB).is_file():
        raise RunError(f"no provider at {provider / PROVIDER_LIB}: build it with `make "
                       "provider` (or name its directory with --provider)")
    if shutil.which("unshare") is None or shutil.which(argv[0]) is None and \
            not Path(argv[0]).exists():
        raise RunError(f"cannot find {'unshare' if shutil.which('unshare') is None else argv[0]}")
    from ..server.logs import setup_logging
    from ..server.loop import run_loop

    if args.target and getattr(args, "trace", None):
        raise RunError("--trace is the embedded daemon's; with --target, run `softhca trace "
                       "--target HOST:PORT` against that daemon's TCP address")
    setup_logging(args.log_level)
    remove_stale_run_dirs()
    tmp = Path(tempfile.mkdtemp(prefix=RUN_PREFIX))
    try:
        hold_run_lock(tmp)
        work = _targeted if args.target else _embedded
        rc = run_loop(work(args, argv, tmp, provider))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # A program killed by a signal: the shell's convention, 128 + the signal.
    return rc if rc >= 0 else 128 - rc

