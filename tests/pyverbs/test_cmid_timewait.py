"""pyverbs' rdma_cm ids and the timewait after a disconnect (server/cm_timewait.py), on
the daemon embedded in this process: both ids get RDMA_CM_EVENT_TIMEWAIT_EXIT once the
IB CM's timewait for a RoCE path has passed; ids closed right after DISCONNECTED (as
rping and rdma-core's tests do) get nothing."""

from __future__ import annotations

import itertools
import os
import time

from pyverbs_cm import next_event, requested

import softhca.client.pyverbs.cm_enums as ce
import softhca.client.pyverbs.enums as e
from softhca.client.pyverbs.qp import QPCap, QPInitAttr

_ports = itertools.count(7950 + os.getpid() % 40)


def _timewait_s() -> float:
    """IBTA's ACK timeout for rdma_cm's RoCE packet lifetime (16) and an mlx5 HCA's ACK
    delay (16): the smallest t with 2^t >= 2^16 + 2 * 2^16; waited as 2^(t - 8) ms."""
    need = (1 << 16) + 2 * (1 << 16)
    t = next(t for t in range(32) if 1 << t >= need)
    return (1 << (t - 8)) / 1000


def _attr():
    return QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(4, 4))


def _connected():
    srv_ch, cli_ch, lid, cid, child = requested(next(_ports), _attr)
    child.accept()
    next_event(cli_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    next_event(srv_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    return srv_ch, cli_ch, lid, child, cid


def test_both_ids_get_timewait_exit():
    srv_ch, cli_ch, lid, child, cid = _connected()
    t0 = time.monotonic()
    cid.disconnect()
    next_event(srv_ch, ce.RDMA_CM_EVENT_DISCONNECTED)
    next_event(cli_ch, ce.RDMA_CM_EVENT_DISCONNECTED)
    child.disconnect()          # after the peer's: no error, no second event
    for ch in (cli_ch, srv_ch):
        ev = next_event(ch, ce.RDMA_CM_EVENT_TIMEWAIT_EXIT)
        assert ev.status == 0
    took = time.monotonic() - t0
    assert _timewait_s() == 1.024
    assert _timewait_s() - 0.05 <= took < _timewait_s() + 3.0, took
    for o in (child, cid, lid, cli_ch, srv_ch):
        o.close()


def test_ids_closed_right_after_disconnected_get_no_timewait_exit():
    srv_ch, cli_ch, lid, child, cid = _connected()
    cid.disconnect()
    next_event(srv_ch, ce.RDMA_CM_EVENT_DISCONNECTED)
    next_event(cli_ch, ce.RDMA_CM_EVENT_DISCONNECTED)
    child.close()
    cid.close()
    time.sleep(_timewait_s() + 0.5)
    assert srv_ch._q.empty() and cli_ch._q.empty()
    from softhca.client.pyverbs import _sync

    if _sync._embedded is not None:     # the daemon in this process: nothing left there
        tw = _sync._embedded.cm
        assert not tw.timewait and not tw._tw_timers
    for o in (lid, cli_ch, srv_ch):
        o.close()
