"""Run inside ``softhca run``: speaks RDMA netlink (NETLINK_RDMA) byte by byte, as a
program would to the kernel, and prints one JSON object of what it saw. The messages
are built here from the kernel's uapi numbers (rdma/rdma_netlink.h, linux/netlink.h),
independently of the code that answers them; tests/native/test_rdma_netlink.py judges.
"""

from __future__ import annotations

import errno
import json
import os
import select
import socket
import struct
import sys

NETLINK_RDMA = 20
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK, NLM_F_DUMP = 1, 2, 4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLDEV = 5
CMD_GET, CMD_PORT_GET, CMD_SYS_GET, CMD_RES_GET, CMD_GET_CHARDEV = 1, 5, 6, 9, 15
ATTR_DEV_INDEX, ATTR_DEV_NAME, ATTR_PORT_INDEX = 1, 2, 3
ATTR_PORT_STATE, ATTR_PORT_PHYS_STATE = 12, 13
ATTR_NDEV_INDEX, ATTR_NDEV_NAME = 50, 51
ATTR_CHARDEV_TYPE, ATTR_CHARDEV_NAME, ATTR_CHARDEV_ABI, ATTR_CHARDEV = 69, 70, 71, 72
SEQ = [100]


def typ(cmd: int, client: int = NLDEV) -> int:
    return client << 10 | cmd


def attr(t: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), t) + data
    return raw + b"\0" * (-len(raw) % 4)


def msg(t: int, flags: int, body: bytes = b"", length: int | None = None) -> bytes:
    SEQ[0] += 1
    n = 16 + len(body) if length is None else length
    return struct.pack("=IHHII", n, t, flags, SEQ[0], 0) + body


def readable(s: socket.socket, timeout: float = 0.3) -> bool:
    return bool(select.select([s], [], [], timeout)[0])


def answers(s: socket.socket, timeout: float = 2.0) -> list[dict]:
    """Every message queued now (waiting up to ``timeout`` for the first)."""
    out = []
    wait = timeout
    while readable(s, wait):
        data, addr = s.recvfrom(65536)
        wait = 0.05
        while len(data) >= 16:
            n, t, flags, seq, pid = struct.unpack_from("=IHHII", data)
            body = data[16:n]
            m = {"type": t, "flags": flags, "seq": seq, "pid": pid, "from": list(addr)}
            if t == NLMSG_ERROR:
                m["error"] = struct.unpack_from("=i", body)[0]
                m["echo_len"] = len(body) - 4
                m["echo_type"] = struct.unpack_from("=IH", body, 4)[1]
            elif t == NLMSG_DONE:
                m["error"] = struct.unpack_from("=i", body)[0]
            else:
                m["attrs"] = attrs(body)
            out.append(m)
            data = data[(n + 3) & ~3:]
    return out


def attrs(body: bytes) -> dict:
    out: dict = {}
    while len(body) >= 4:
        n, t = struct.unpack_from("=HH", body)
        if n < 4:
            break
        v = body[4:n]
        if t in (ATTR_DEV_NAME, ATTR_NDEV_NAME, ATTR_CHARDEV_NAME):
            out[t] = v.rstrip(b"\0").decode()
        elif len(v) in (1, 4, 8):
            out[t] = int.from_bytes(v, sys.byteorder)
        body = body[(n + 3) & ~3:]
    return {str(k): v for k, v in out.items()}


def errno_of(s: socket.socket, data: bytes) -> list:
    s.send(data)
    return [m.get("error") for m in answers(s)]


def main() -> None:
    r: dict = {}
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    s.bind((0, 0))
    r["portid"], r["pid"] = s.getsockname()[0], os.getpid()
    r["domain"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)
    r["protocol"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL)

    s.send(msg(typ(CMD_GET), NLM_F_REQUEST | NLM_F_DUMP))
    r["dev_dump"] = answers(s)
    s.send(msg(typ(CMD_PORT_GET), NLM_F_REQUEST | NLM_F_ACK,
               attr(ATTR_DEV_INDEX, struct.pack("=I", 0)) + attr(ATTR_PORT_INDEX, struct.pack("=I", 1))))
    r["port_doit"] = answers(s)
    s.send(msg(typ(CMD_GET_CHARDEV), NLM_F_REQUEST,
               attr(ATTR_DEV_INDEX, struct.pack("=I", 0)) + attr(ATTR_CHARDEV_TYPE, b"uverbs\0")))
    r["chardev"] = answers(s)
    # two requests in one send: both answered, in order
    s.send(msg(typ(CMD_GET), NLM_F_REQUEST, attr(ATTR_DEV_INDEX, struct.pack("=I", 0)))
           + msg(typ(CMD_SYS_GET), NLM_F_REQUEST))
    r["batch"] = [m["type"] for m in answers(s)]
    # one request in pieces (sendmsg's iovecs split inside the header)
    whole = msg(typ(CMD_SYS_GET), NLM_F_REQUEST | NLM_F_ACK)
    s.sendmsg([whole[:5], whole[5:11], whole[11:]])
    r["pieces"] = [m["type"] for m in answers(s)]

    # malformed: nothing answered for what the kernel drops, the kernel's errno for the rest
    bad: dict = {}
    s.send(b"\x10\0\0\0\x01\x14")                                   # shorter than a header
    bad["short"] = readable(s)
    s.send(msg(typ(CMD_GET), NLM_F_REQUEST | NLM_F_DUMP, length=1000))  # longer than sent
    bad["overlong"] = readable(s)
    s.send(msg(typ(CMD_GET), NLM_F_REQUEST | NLM_F_DUMP, length=8))     # under a header
    bad["underlong"] = readable(s)
    bad["unknown_op_8"] = errno_of(s, msg(typ(8), NLM_F_REQUEST))
    bad["unknown_op_1000"] = errno_of(s, msg(typ(1000), NLM_F_REQUEST))
    bad["other_client"] = errno_of(s, msg(typ(CMD_GET, client=3), NLM_F_REQUEST))
    bad["get_no_index"] = errno_of(s, msg(typ(CMD_GET), NLM_F_REQUEST))
    bad["get_no_such_dev"] = errno_of(s, msg(typ(CMD_GET), NLM_F_REQUEST,
                                             attr(ATTR_DEV_INDEX, struct.pack("=I", 99))))
    bad["index_too_short"] = errno_of(s, msg(typ(CMD_GET), NLM_F_REQUEST,
                                             attr(ATTR_DEV_INDEX, b"\0\0")))
    bad["attr_past_end"] = errno_of(s, msg(typ(CMD_GET), NLM_F_REQUEST,
                                           struct.pack("=HH", 200, ATTR_DEV_INDEX) + b"\0" * 4))
    bad["port_2"] = errno_of(s, msg(typ(CMD_PORT_GET), NLM_F_REQUEST,
                                    attr(ATTR_DEV_INDEX, struct.pack("=I", 0))
                                    + attr(ATTR_PORT_INDEX, struct.pack("=I", 2))))
    bad["port_dump_no_dev"] = errno_of(s, msg(typ(CMD_PORT_GET), NLM_F_REQUEST | NLM_F_DUMP))
    bad["res_dump"] = errno_of(s, msg(typ(CMD_RES_GET), NLM_F_REQUEST | NLM_F_DUMP))
    bad["sys_dump"] = errno_of(s, msg(typ(CMD_SYS_GET), NLM_F_REQUEST | NLM_F_DUMP))
    bad["chardev_umad"] = errno_of(s, msg(typ(CMD_GET_CHARDEV), NLM_F_REQUEST,
                                          attr(ATTR_DEV_INDEX, struct.pack("=I", 0))
                                          + attr(ATTR_CHARDEV_TYPE, b"umad\0")))
    bad["not_a_request_acked"] = errno_of(s, msg(typ(CMD_GET), NLM_F_ACK))
    try:
        s.send(b"\0" * (s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) + 1))
        bad["too_big"] = "sent"
    except OSError as e:
        bad["too_big"] = errno.errorcode[e.errno]
    try:
        s.sendto(msg(typ(CMD_GET), NLM_F_REQUEST | NLM_F_DUMP), (1234, 0))
        bad["to_another_port"] = "sent"
    except OSError as e:
        bad["to_another_port"] = errno.errorcode[e.errno]
    try:
        s.sendmsg([b"\0"] * 2000)
        bad["iovecs_2000"] = "sent"
    except OSError as e:
        bad["iovecs_2000"] = errno.errorcode[e.errno]
    r["bad"] = bad
    # the error message echoes the request (NETLINK_CAP_ACK unset), its type included
    s.send(msg(typ(8), NLM_F_REQUEST, attr(ATTR_DEV_INDEX, struct.pack("=I", 0))))
    r["echo"] = answers(s)
    s.setsockopt(270, 10, 1)      # SOL_NETLINK, NETLINK_CAP_ACK
    s.send(msg(typ(8), NLM_F_REQUEST, attr(ATTR_DEV_INDEX, struct.pack("=I", 0))))
    r["capped"] = answers(s)

    # no other socket may speak for the kernel: the emulated socket takes datagrams
    # from itself only
    ino = os.fstat(s.fileno()).st_ino
    name = None
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        f = line.split()
        if len(f) >= 8 and f[6] == str(ino):
            name = f[7]
    r["unix_name"] = name
    if name and name.startswith("@"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as spoof:
            try:
                spoof.sendto(msg(NLMSG_DONE, 0, b"\0" * 4), "\0" + name[1:])
                r["spoof"] = "delivered"
            except OSError as e:
                r["spoof"] = errno.errorcode[e.errno]

    # a flood never read: each send still takes its request; the answers that do not
    # fit are dropped, the next receive says ENOBUFS, and the socket goes on working
    def status(key: str) -> int:
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return -1

    rss0 = status("VmRSS")
    sent = 0
    for _ in range(20000):
        sent += s.send(msg(typ(CMD_GET), NLM_F_REQUEST | NLM_F_DUMP)) > 0
    r["flood_sent"] = sent
    try:
        s.recv(65536)
        r["flood_first_recv"] = "data"
    except OSError as e:
        r["flood_first_recv"] = errno.errorcode[e.errno]
    while readable(s, 0.05):
        s.recv(65536)
    r["rss_growth_kb"] = status("VmRSS") - rss0
    s.send(msg(typ(CMD_GET), NLM_F_REQUEST, attr(ATTR_DEV_INDEX, struct.pack("=I", 0))))
    r["after_flood"] = [m["type"] for m in answers(s)]
    r["threads"] = status("Threads")

    # at most 32 such sockets at once; a closed one's room is taken again
    more = []
    try:
        for _ in range(40):
            more.append(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA))
        r["sockets"] = "unbounded"
    except OSError as e:
        r["sockets"] = [len(more) + 1, errno.errorcode[e.errno]]
    more.pop().close()
    again = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_RDMA)
    again.send(msg(typ(CMD_SYS_GET), NLM_F_REQUEST))
    r["reused"] = [m["type"] for m in answers(again)]
    for m in more:
        m.close()
    # a closed socket's fd number taken by another socket is that socket's alone
    gone = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_RDMA)
    number = gone.fileno()
    gone.close()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.bind(("127.0.0.1", 0))
        u.sendto(b"ping", u.getsockname())
        data, addr = u.recvfrom(16)
        r["reused_number"] = [u.fileno() == number, data.decode(), list(addr) == list(
            u.getsockname()), u.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN)]
    print(json.dumps(r))


if __name__ == "__main__":
    main()
