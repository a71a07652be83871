"""Two pyverbs contexts of one device, their RC QPs connected to each other by GID, one
RDMA_WRITE from the first QP's MR into the second's: as a user's first pyverbs program
against one daemon.

    SOFTHCA_TARGET=HOST:PORT PYTHONPATH=$(softhca pyverbs path) python pyverbs_same_daemon.py

Both GIDs carry the address SOFTHCA_TARGET names, which may be a forwarded port the
daemon cannot reach itself (a published Docker port). Prints the completion and exits 0
when the WRITE succeeded and the bytes arrived.
"""

from __future__ import annotations

import os
import sys

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


def side():
    ctx = Context(name="mlx5_0")
    pd = PD(ctx)
    cq = CQ(ctx, 16, None, None, 0)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                           cap=QPCap(max_send_wr=4, max_recv_wr=4)))
    qp.to_init(QPAttr(port_num=1, qp_access_flags=ACCESS))
    return ctx, pd, cq, qp, MR(pd, 4096, ACCESS)


def connect(qp, ctx_peer, qp_peer) -> None:
    attr = QPAttr(port_num=1)
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = qp_peer.qp_num, 0, 0
    attr.max_dest_rd_atomic, attr.min_rnr_timer = 1, 12
    # A short timeout and few retries: a failure shows in seconds.
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 12, 3, 7, 1
    attr.ah_attr = AHAttr(is_global=1, port_num=1,
                          gr=GlobalRoute(dgid=ctx_peer.query_gid(1, 0), sgid_index=0))
    qp.to_rtr(attr)
    qp.to_rts(attr)


def main() -> int:
    ctx1, _, cq1, qp1, mr1 = side()
    ctx2, _, _, qp2, mr2 = side()
    print(f"pyverbs_same_daemon: SOFTHCA_TARGET={os.environ.get('SOFTHCA_TARGET')}, GIDs "
          f"{ctx1.query_gid(1, 0).gid} and {ctx2.query_gid(1, 0).gid}", flush=True)
    connect(qp1, ctx2, qp2)
    connect(qp2, ctx1, qp1)
    mr1.write(b"same daemon", 11)
    wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(mr1.buf, 11, mr1.lkey)],
                send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(mr2.rkey, mr2.buf)
    qp1.post_send(wr)
    while True:
        n, wcs = cq1.poll()
        if n:
            break
    wc = wcs[0]
    got = mr2.read(11, 0)
    print(f"pyverbs_same_daemon: completion status {wc.status} "
          f"({'SUCCESS' if wc.status == e.IBV_WC_SUCCESS else 'error'}), vendor_err "
          f"{wc.vendor_err:#x}; target MR holds {got!r}", flush=True)
    return 0 if wc.status == e.IBV_WC_SUCCESS and got == b"same daemon" else 1


if __name__ == "__main__":
    sys.exit(main())
