"""RC QPs through softhca's pyverbs, the step tests of tests/pyverbs/ share: taking a QP
to RTS towards another QP of the same device (examples/pyverbs_t10dif.py does the same in
its own words, to stay a program of its own)."""

from __future__ import annotations

from softhca.client.pyverbs.addr import AHAttr, GlobalRoute
from softhca.client.pyverbs.enums import IBV_QPS_RTS
from softhca.client.pyverbs.qp import QPAttr


def to_rts(ctx, qp, remote, access: int | None = None) -> None:
    """RESET -> INIT -> RTR -> RTS towards ``remote`` (its QP number; the GID of port 1,
    the local one: both QPs are on this device), with ``access`` as the QP's access
    flags when given, IBTA's usual timeouts and retries, one outstanding RDMA READ."""
    attr = QPAttr(port_num=1)
    if access is not None:
        attr.qp_access_flags = access
    attr.ah_attr = AHAttr(is_global=1, port_num=1,
                          gr=GlobalRoute(dgid=ctx.query_gid(1, 0), sgid_index=0))
    attr.dest_qp_num, attr.rq_psn, attr.sq_psn = remote.qp_num, 0, 0
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 12
    attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
    qp.to_rts(attr)
    assert qp.qp_state == IBV_QPS_RTS
