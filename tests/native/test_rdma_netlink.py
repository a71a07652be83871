"""What middleware reads beside the verbs, inside ``softhca run`` with nothing placed by
hand: the kernel's RDMA netlink, which iproute2's unmodified ``rdma`` asks (answered
by the preload library from the run's sysfs tree, provider/preload/netlink.c), and the
device's sysfs under /sys/class/infiniband, whose values must be those
``ibv_devinfo -v`` reports through the provider.

Expected values come from the programs' own output formats (iproute2's rdma/link.c and
rdma/dev.c, libibverbs' devinfo.c), the kernel's sysfs formats (ib_core's sysfs.c) and
the uapi numbers; tests/support/rdma_netlink_probe.py speaks netlink byte by byte."""

from __future__ import annotations

import errno as E
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import native
import pytest

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "tests" / "support" / "rdma_netlink_probe.py"
DEV = "/sys/class/infiniband/mlx5_0"
# libibverbs' enum ibv_device_cap_flags, by the names iproute2 prints (rdma/dev.c)
CAP_BITS = {"RESIZE_MAX_WR": 1, "BAD_PKEY_CNTR": 2, "BAD_QKEY_CNTR": 4, "RAW_MULTI": 8,
            "AUTO_PATH_MIG": 16, "CHANGE_PHY_PORT": 32, "UD_AV_PORT_ENFORCE": 64,
            "CURR_QP_STATE_MOD": 128, "SHUTDOWN_PORT": 256, "INIT_TYPE": 512,
            "PORT_ACTIVE_EVENT": 1024, "SYS_IMAGE_GUID": 2048, "RC_RNR_NAK_GEN": 4096,
            "SRQ_RESIZE": 8192, "N_NOTIFY_CQ": 16384, "MEM_WINDOW": 1 << 17,
            "UD_IP_CSUM": 1 << 18, "XRC": 1 << 20, "MEM_MGT_EXTENSIONS": 1 << 21,
            "MEM_WINDOW_TYPE_2A": 1 << 23, "MEM_WINDOW_TYPE_2B": 1 << 24}


def softhca_run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "softhca.tools.cli", "run", "--", *argv],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ready():
    why = native.unavailable("rdma", "ibv_devinfo")
    if why:
        pytest.skip(why)


def test_rdma_link_show(ready):
    """One line per port (rdma/link.c: "link DEV/PORT state S physical_state P netdev
    IF"): the port ACTIVE and LINK_UP as ibv_query_port says, the netdev the interface
    of the daemon's address (127.0.0.1: lo)."""
    r = softhca_run("sh", "-c", "rdma link show; echo ==; rdma link show mlx5_0/1; echo ==; "
                    "rdma dev show; echo ==; rdma dev show mlx5_0")
    assert r.returncode == 0, r.stderr
    link, link1, dev, dev1 = r.stdout.split("==\n")
    line = "link mlx5_0/1 state ACTIVE physical_state LINK_UP netdev lo"
    assert link.strip() == line and link1.strip() == line, r.stdout
    assert re.fullmatch(r"0: mlx5_0: node_type ca fw softhca-1 node_guid "
                        r"([0-9a-f]{4}:){3}[0-9a-f]{4} sys_image_guid ([0-9a-f]{4}:){3}"
                        r"[0-9a-f]{4}", dev.strip()), dev
    assert dev.strip() == dev1.strip()


def test_rdma_json_agrees_with_ibv_devinfo(ready):
    r = softhca_run("sh", "-c", "rdma -j link show; echo ==; rdma -j -d dev show; echo ==; "
                    "ibv_devinfo -v")
    assert r.returncode == 0, r.stderr
    links, devs, devinfo = r.stdout.split("==\n")
    links, devs = json.loads(links), json.loads(devs)
    assert links == [{"ifindex": 0, "ifname": "mlx5_0", "port": 1, "state": "ACTIVE",
                      "physical_state": "LINK_UP", "netdev": "lo", "netdev_index": 1}]
    (dev,) = devs
    info = dict(re.findall(r"^\s+(\w+):\s+(.*)$", devinfo, re.M))
    assert dev["ifname"] == "mlx5_0" and dev["node_type"] == "ca"
    assert dev["fw"] == info["fw_ver"]
    assert dev["node_guid"] == info["node_guid"]
    assert dev["sys_image_guid"] == info["sys_image_guid"]
    # The kernel's caps are 64 bits, device_cap_flags_ex's; rdma names the bits of
    # ibv_device_cap_flags and says UNKNOWN for the others (Debian 12's iproute2 knows no
    # IB_UVERBS_DEVICE_ATOMIC_WRITE, bit 40).
    named = [c for c in dev["caps"] if c != "UNKNOWN"]
    assert sum(CAP_BITS[c] for c in named) == int(info["device_cap_flags"], 16)
    assert ("UNKNOWN" in dev["caps"]) == (int(info["device_cap_flags_ex"], 16) >> 32 != 0)


def test_rdma_errors_as_the_kernels(ready):
    """A device or port that is not there: iproute2's own refusal. Counters, resources
    and renaming are not modelled: the netlink answer is EOPNOTSUPP, which rdma prints
    as "error: Operation not supported". Each exits 1."""
    r = softhca_run("sh", "-c", "rdma link show mlx5_0/2; echo rc=$?; rdma dev show nosuch; "
                    "echo rc=$?; rdma statistic show; echo rc=$?; rdma res show; echo rc=$?; "
                    "rdma dev set mlx5_0 name foo; echo rc=$?")
    assert r.stdout.split() == ["rc=1"] * 5, r.stdout
    assert r.stderr.splitlines() == ["Wrong device name", "Wrong device name - nosuch"] \
        + ["error: Operation not supported"] * 3, r.stderr


def test_sysfs_agrees_with_ibv_devinfo(ready):
    files = ("node_guid", "sys_image_guid", "fw_ver", "board_id", "hw_rev", "hca_type",
             "node_type", "node_desc", "ports/1/state", "ports/1/phys_state",
             "ports/1/link_layer", "ports/1/lid", "ports/1/sm_lid", "ports/1/lid_mask_count",
             "ports/1/cap_mask", "ports/1/rate", "ports/1/gids/0", "ports/1/pkeys/0",
             "ports/1/gid_attrs/types/0", "ports/1/gid_attrs/ndevs/0", "device/numa_node",
             "device/local_cpus", "device/local_cpulist")
    script = "ibv_devinfo -v; " + "; ".join(f"echo \"@{f}=$(cat {DEV}/{f})\"" for f in files) \
        + f"; echo \"@verbs=$(cat {DEV}/device/infiniband_verbs/uverbs0/ibdev)\""
    r = softhca_run("sh", "-c", script)
    assert r.returncode == 0, r.stderr
    sysfs = dict(re.findall(r"^@([\w/]+)=(.*)$", r.stdout, re.M))
    info = dict(re.findall(r"^\s+(\w+):\s+(.*)$", r.stdout, re.M))
    assert sysfs["node_guid"] == info["node_guid"]
    assert sysfs["sys_image_guid"] == info["sys_image_guid"]
    assert sysfs["fw_ver"] == info["fw_ver"]
    assert sysfs["board_id"] == info["board_id"]
    assert int(sysfs["hw_rev"], 16) == int(info["hw_ver"], 16)
    assert sysfs["hca_type"] == f"MT{info['vendor_part_id']}"      # mlx5's format
    assert sysfs["node_type"] == "1: CA" and info["transport"] == "InfiniBand (0)"
    assert sysfs["node_desc"].endswith(" mlx5_0")
    # "N: NAME" (ib_core's sysfs) against devinfo's "NAME (N)"
    assert sysfs["ports/1/state"] == "4: ACTIVE" and info["state"] == "PORT_ACTIVE (4)"
    assert sysfs["ports/1/phys_state"] == "5: LinkUp" and info["phys_state"] == "LINK_UP (5)"
    assert sysfs["ports/1/link_layer"] == info["link_layer"] == "Ethernet"
    assert int(sysfs["ports/1/lid"], 16) == int(info["port_lid"])
    assert int(sysfs["ports/1/sm_lid"], 16) == int(info["sm_lid"])
    assert int(sysfs["ports/1/lid_mask_count"]) == int(info["port_lmc"], 16)
    assert int(sysfs["ports/1/cap_mask"], 16) == int(info["port_cap_flags"], 16)
    # rate: width times per-lane speed (4X of 25 Gbps: EDR)
    width = int(re.match(r"(\d+)X", info["active_width"]).group(1))
    lane = float(info["active_speed"].split()[0])
    assert sysfs["ports/1/rate"] == f"{width * lane:g} Gb/sec ({width}X EDR)"
    gid0 = re.search(r"GID\[\s*0\]:\s+(\S+?),?\s", r.stdout).group(1)
    assert _v6(sysfs["ports/1/gids/0"]) == _v6(gid0)
    assert sysfs["ports/1/gid_attrs/types/0"] == "RoCE v2"
    assert sysfs["ports/1/gid_attrs/ndevs/0"] == "lo"
    assert sysfs["ports/1/pkeys/0"] == "0xffff"
    # a device no NUMA node is nearer to: every possible CPU
    assert sysfs["device/numa_node"] == "-1"
    possible = Path("/sys/devices/system/cpu/possible").read_text().strip()
    assert sysfs["device/local_cpulist"] == possible
    cpus = _cpulist(possible)
    assert int(sysfs["device/local_cpus"].replace(",", ""), 16) == sum(1 << c for c in cpus)
    assert sysfs["verbs"] == "mlx5_0"


def _v6(text: str) -> bytes:
    import ipaddress

    return ipaddress.IPv6Address(text).packed


def _cpulist(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


@pytest.fixture(scope="module")
def probe(ready):
    r = softhca_run(sys.executable, str(PROBE), timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_netlink_socket_as_the_kernels(probe):
    assert probe["domain"] == 16 and probe["protocol"] == 20    # AF_NETLINK, NETLINK_RDMA
    # bound to port 0: the kernel picks the process id first
    assert probe["portid"] == probe["pid"]
    get, done = probe["dev_dump"]
    assert get["type"] == 5 << 10 | 1 and get["flags"] == 2     # NLDEV GET, NLM_F_MULTI
    assert get["pid"] == probe["portid"] and get["from"] == [0, 0]
    assert get["attrs"]["2"] == "mlx5_0" and get["attrs"]["3"] == 1   # name, one port
    assert done["type"] == 3 and done["error"] == 0             # NLMSG_DONE
    port, ack = probe["port_doit"]
    assert port["flags"] == 0 and port["attrs"]["12"] == 4 and port["attrs"]["13"] == 5
    assert port["attrs"]["51"] == "lo" and port["attrs"]["50"] == 1   # lo's ifindex
    assert ack["type"] == 2 and ack["error"] == 0 and ack["flags"] == 0x100  # capped ack
    # libibverbs' question: uverbs0, ABI 1, the node's numbers 1:3 in huge_encode_dev
    (chardev,) = probe["chardev"]
    assert chardev["attrs"]["70"] == "uverbs0" and chardev["attrs"]["71"] == 1
    assert chardev["attrs"]["72"] == (3 & 0xff) | 1 << 8
    assert probe["batch"] == [5 << 10 | 1, 5 << 10 | 6]
    assert probe["pieces"] == [5 << 10 | 6, 2]         # the answer, then the ack
    assert os.stat("/dev/null").st_rdev == os.makedev(1, 3)


def test_malformed_netlink_gets_the_kernels_errors(probe):
    bad = probe["bad"]
    # what the kernel drops unanswered (netlink_rcv_skb): no answer, no hang
    assert bad["short"] is False and bad["overlong"] is False and bad["underlong"] is False
    for case in ("unknown_op_8", "unknown_op_1000", "other_client", "get_no_index",
                 "get_no_such_dev", "index_too_short", "attr_past_end", "port_2",
                 "port_dump_no_dev", "sys_dump"):
        assert bad[case] == [-E.EINVAL], (case, bad[case])
    # operations the kernel has that softhca does not model
    assert bad["res_dump"] == [-E.EOPNOTSUPP] and bad["chardev_umad"] == [-E.EOPNOTSUPP]
    assert bad["not_a_request_acked"] == [0]
    assert bad["too_big"] == "EMSGSIZE" and bad["to_another_port"] == "ECONNREFUSED"
    assert bad["iovecs_2000"] == "EMSGSIZE"             # over UIO_MAXIOV, as the kernel
    # the error echoes the request whole, unless NETLINK_CAP_ACK
    (echo,) = probe["echo"]
    assert echo["error"] == -E.EINVAL and echo["flags"] == 0 and echo["echo_len"] == 24
    assert echo["echo_type"] == 5 << 10 | 8
    (capped,) = probe["capped"]
    assert capped["flags"] == 0x100 and capped["echo_len"] == 16


def test_netlink_emulation_is_bounded(probe):
    # no other socket may answer in the kernel's place
    assert probe["unix_name"] and probe["spoof"] == "EPERM"
    # 20,000 dumps never read: all taken, the overflow said once (ENOBUFS), no memory
    # kept for them, the socket still answers
    assert probe["flood_sent"] == 20000 and probe["flood_first_recv"] == "ENOBUFS"
    assert probe["rss_growth_kb"] < 4096
    assert probe["after_flood"] == [5 << 10 | 1]
    # no thread of ours in a plain Python process
    assert probe["threads"] == 1
    # 32 sockets at once; a closed one's room is taken again
    assert probe["sockets"] == [32, "ENOBUFS"] and probe["reused"] == [5 << 10 | 6]
    # the number of a closed one, reused by a UDP socket, is plain UDP again
    assert probe["reused_number"] == [True, "ping", True, 2]


_INDEX = """
import ctypes, json
v = ctypes.CDLL("libibverbs.so.1")
v.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
v.ibv_get_device_name.restype = ctypes.c_char_p
v.ibv_get_device_name.argtypes = [ctypes.c_void_p]
v.ibv_get_device_index.argtypes = [ctypes.c_void_p]
n = ctypes.c_int()
lst = v.ibv_get_device_list(ctypes.byref(n))
print(json.dumps([[v.ibv_get_device_name(lst[i]).decode(), v.ibv_get_device_index(lst[i])]
                  for i in range(n.value)]))
"""


def test_libibverbs_finds_the_devices_by_netlink(ready):
    """libibverbs asks netlink first: answered, it takes each device's index from there
    (ibv_get_device_index gives it; its sysfs fallback knows none and gives -1), and
    the index is the one `rdma dev` shows. Two devices: the dumps carry both."""
    r = subprocess.run([sys.executable, "-m", "softhca.tools.cli", "run", "--hca", "mlx5_0",
                        "--hca", "mlx5_1", "--", "sh", "-c",
                        f"{sys.executable} -c '{_INDEX}'; echo ==; rdma dev; echo ==; "
                        f"rdma link; echo ==; LD_PRELOAD= {sys.executable} -c '{_INDEX}'"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    by_netlink, devs, links, by_sysfs = r.stdout.split("==\n")
    assert json.loads(by_netlink) == [["mlx5_0", 0], ["mlx5_1", 1]]
    assert re.findall(r"^(\d+): (\w+):", devs, re.M) == [("0", "mlx5_0"), ("1", "mlx5_1")]
    assert links.split("\n")[:2] == [
        f"link {d}/1 state ACTIVE physical_state LINK_UP netdev lo " for d in ("mlx5_0", "mlx5_1")]
    assert json.loads(by_sysfs) == [["mlx5_0", -1], ["mlx5_1", -1]]


_KERNEL = """
import socket
try:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 20)
    print("socket", s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN))
except OSError as e:
    print("refused", e.errno)
"""


def test_without_a_softhca_tree_the_kernel_answers():
    """The preload library answers RDMA netlink only where SYSFS_PATH names a softhca
    tree; elsewhere (here without SYSFS_PATH) the program gets the kernel's own socket
    or refusal, whichever the kernel gives without the library."""
    preload = REPO / "provider" / "build" / "libsofthca-preload.so"
    if not preload.is_file():
        pytest.skip(f"the preload library is not built ({preload}): `make provider`")
    env = {k: v for k, v in os.environ.items() if k not in ("SYSFS_PATH", "LD_PRELOAD")}
    plain = subprocess.run([sys.executable, "-c", _KERNEL], env=env, capture_output=True,
                           text=True, timeout=60)
    with_it = subprocess.run([sys.executable, "-c", _KERNEL], capture_output=True, text=True,
                             env={**env, "LD_PRELOAD": str(preload)}, timeout=60)
    assert plain.returncode == with_it.returncode == 0, (plain.stderr, with_it.stderr)
    assert with_it.stdout == plain.stdout
