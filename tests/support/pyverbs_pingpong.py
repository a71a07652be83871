"""The server side of rdma-core's ibv_rc_pingpong, written in pyverbs, as a peer for the
unmodified C program on the provider: the same address exchange over TCP (rdma-core
libibverbs/examples/rc_pingpong.c: "LID:QPN:PSN:GID" as %04x:%06x:%06x:<32 hex>, NUL
included, and the client's "done"), the same RC QP, the same ping-pong of SENDs.

    PYTHONPATH=$(softhca pyverbs path) python pyverbs_pingpong.py PORT SIZE ITERS

with SOFTHCA_TARGET naming the daemon. It checks every message it receives holds the
bytes rc_pingpong fills its buffer with (0x7b), prints what it checked, and exits 0
when all held.
"""

from __future__ import annotations

import random
import socket
import sys

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

MSG = len("0000:000000:000000:00000000000000000000000000000000") + 1
RX_DEPTH = 500
RECV_WRID, SEND_WRID = 1, 2
FILL = 0x7B         # rc_pingpong: memset(ctx->buf, 0x7b, size)


def read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main() -> int:
    port, size, iters = (int(a) for a in sys.argv[1:4])
    ctx = Context(name="mlx5_0")
    pd = PD(ctx)
    mr = MR(pd, size, e.IBV_ACCESS_LOCAL_WRITE)
    cq = CQ(ctx, RX_DEPTH + 1, None, None, 0)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                           cap=QPCap(max_send_wr=1, max_recv_wr=RX_DEPTH)))
    qp.to_init(QPAttr(port_num=1, qp_access_flags=0))
    sge = SGE(mr.buf, size, mr.lkey)
    for _ in range(RX_DEPTH):
        qp.post_recv(RecvWR(wr_id=RECV_WRID, num_sge=1, sg=[sge]))
    psn = random.getrandbits(24)
    gid = ctx.query_gid(1, 0)

    srv = socket.create_server(("", port))
    print(f"pyverbs_pingpong: listening on {port}", flush=True)
    conn, _ = srv.accept()
    srv.close()
    msg = read_exact(conn, MSG).rstrip(b"\0").decode()
    lid, rqpn, rpsn, rgid = msg.split(":")
    dgid = GID()
    dgid.raw = bytes.fromhex(rgid)
    attr = QPAttr(port_num=1)
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = int(rqpn, 16), int(rpsn, 16), psn
    attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
    attr.ah_attr = AHAttr(is_global=1, port_num=1,
                          gr=GlobalRoute(dgid=dgid, sgid_index=0, hop_limit=1))
    qp.to_rtr(attr)
    qp.to_rts(attr)
    mine = f"{0:04x}:{qp.qp_num:06x}:{psn:06x}:{gid.raw.hex()}".encode() + b"\0"
    conn.sendall(mine)
    done = read_exact(conn, len(b"done\0"))
    conn.close()
    print(f"pyverbs_pingpong: peer QPN {rqpn}, GID {rgid}; exchange ended with {done!r}",
          flush=True)

    rcnt = scnt = bad = 0
    pending = RECV_WRID
    while rcnt < iters or scnt < iters:
        n, wcs = cq.poll()
        for wc in wcs[:n]:
            if wc.status != e.IBV_WC_SUCCESS:
                print(f"pyverbs_pingpong: completion status {wc.status} for wr_id "
                      f"{wc.wr_id}", flush=True)
                return 1
            if wc.wr_id == RECV_WRID:
                rcnt += 1
                data = mr.read(size, 0)
                bad += sum(1 for b in data if b != FILL)
                qp.post_recv(RecvWR(wr_id=RECV_WRID, num_sge=1, sg=[sge]))
            else:
                scnt += 1
            pending &= ~wc.wr_id
            if scnt < iters and not pending:
                qp.post_send(SendWR(wr_id=SEND_WRID, opcode=e.IBV_WR_SEND, num_sge=1,
                                    sg=[sge], send_flags=e.IBV_SEND_SIGNALED))
                pending = RECV_WRID | SEND_WRID
    print(f"pyverbs_pingpong: {rcnt} messages of {size} bytes received, {bad} bytes differ "
          f"from 0x{FILL:02x}; {scnt} sent", flush=True)
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
