"""A program exec'ed by a child of a verbs program (provider/tests/regcheck.c, mode
handoff) that kept its parent's control session open: it asks the daemon, over that
session, to register the parent's memfds by their numbers, and reads back what it got.

    memfd_thief.py PARENT_PID SOCKET_FD MEMFD...

The parent stopped itself so that this program alone reads the session's replies; it
is continued (SIGCONT) at the end whatever happened. Prints one line per attempt:
"thief: refused: ..." or "thief: read ...", and whether the bytes were the parent's
(regcheck's pattern 6, computed here)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from softhca.protocol.frames import FrameDecoder, frame_bytes

PAGE = 4096


def pattern6(n: int) -> bytes:
    # provider/tests/side.h's pat(6, i)
    return bytes((i * 17 + 102 + (i >> 8)) & 0xFF for i in range(n))


class Session:
    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.settimeout(10)
        self.dec = FrameDecoder(64 << 20)
        self.frames: list = []
        self.id = 0x40000000        # far from the parent's ids

    def call(self, verb: str, **fields):
        self.id += 1
        self.sock.sendall(frame_bytes({"t": verb, "id": self.id, **fields}))
        while True:
            while self.frames:
                f = self.frames.pop(0)
                if f.header.get("id") == self.id:
                    return f
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the daemon closed the session")
            self.frames.extend(self.dec.feed(data))


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def main() -> int:
    parent, sockfd, memfds = int(sys.argv[1]), int(sys.argv[2]), [int(a) for a in sys.argv[3:]]
    deadline = time.monotonic() + 10
    while not stopped(parent):
        if time.monotonic() > deadline:
            print("thief: the parent never stopped", flush=True)
            return 2
        time.sleep(0.01)
    try:
        s = Session(sockfd)
        devices = s.call("devices").header["devices"]
        ctx = s.call("open_device", name=devices[0]).header["ctx"]
        pd = s.call("alloc_pd", ctx=ctx).header["pd"]
        attempts = [{"pieces": [[fd, 0, PAGE]]} for fd in memfds]
        # the numbers a handoff of the parent's could have been filed under
        attempts += [{"pieces": [[0, 0, PAGE]], "fds": seq} for seq in range(4)]
        for extra in attempts:
            r = s.call("reg_mr_shared", pd=pd, addr=0x10000, length=PAGE, access=1,
                       offset=0, **extra).header
            if r["t"] != "ok":
                print(f"thief: refused: {extra}: {r['errno']}: {r['msg']}", flush=True)
                continue
            got = s.call("mr_read", mr=r["mr"], offset=0, length=PAGE)
            data = bytes(got.payload)
            whose = "the parent's page" if data == pattern6(PAGE) else "other bytes"
            print(f"thief: read {len(data)} bytes through {extra}: {whose}", flush=True)
        return 0
    finally:
        os.kill(parent, signal.SIGCONT)


if __name__ == "__main__":
    sys.exit(main())
