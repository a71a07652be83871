"""An rping client (rping -c) written with pyverbs' CMID, run against Debian's
``rping -s``: ``python rping_client.py ADDR PORT COUNT SIZE``.

rping's exchange (rdma-core librdmacm/examples/rping.c): the client sends its
``struct rping_rdma_info`` (buf, rkey, size: big-endian 64, 32, 32 bits) naming its
start buffer; the server RDMA READs it and answers with a message; the client then
names its rdma buffer the same way; the server RDMA WRITEs what it read there and
answers again. The client prints each ping's start buffer and what came back."""

import struct
import sys

import pyverbs.enums as e
from pyverbs.cmid import CMID, AddrInfo, ConnParam
from pyverbs.mr import MR
from pyverbs.qp import QPCap, QPInitAttr

INFO = struct.Struct(">QII")
REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_WRITE


def ping_text(n: int, size: int) -> bytes:
    """Printable bytes, different per ping, NUL-terminated as rping's buffers are."""
    body = f"pyverbs-ping-{n}: " + "".join(chr(97 + (n + i) % 26) for i in range(size))
    return body.encode()[:size - 1] + b"\0"


def main(addr: str, port: str, count: int, size: int) -> int:
    cmid = CMID(creator=AddrInfo(dst=addr, dst_service=port),
                qp_init_attr=QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(4, 4)))
    pd = cmid.pd
    start, rdma = MR(pd, size, REMOTE), MR(pd, size, REMOTE)
    send, recv = cmid.reg_msgs(INFO.size), cmid.reg_msgs(INFO.size)
    cmid.post_recv(recv)
    cmid.connect(ConnParam(resources=1, depth=1, retry=7, rnr_retry=7))

    def advertise(mr):
        send.write(INFO.pack(mr.buf, mr.rkey, size), INFO.size)
        cmid.post_send(send)
        cmid.get_send_comp()
        wc = cmid.get_recv_comp()          # the server's go-ahead / done
        cmid.post_recv(recv)
        return wc.status

    for n in range(count):
        data = ping_text(n, size)
        start.write(data, size)
        rdma.write(bytes(size), size)
        if advertise(start) or advertise(rdma):
            print("ping failed", file=sys.stderr)
            return 1
        got = rdma.read(size, 0)
        print(f"ping {n} sent {data[:-1].decode()} got {got.rstrip(bytes(1)).decode()}")
    cmid.disconnect()
    cmid.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
