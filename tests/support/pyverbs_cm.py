"""rdma_cm through softhca's pyverbs, the steps the tests of tests/pyverbs/ share: an
event that must come next, and a listener with an active id whose address and route are
resolved (rdma_cm(7)'s asynchronous flow up to rdma_connect)."""

from __future__ import annotations

from collections.abc import Callable

import softhca.client.pyverbs.cm_enums as ce
from softhca.client.pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel
from softhca.client.pyverbs.qp import QPInitAttr


def next_event(ch: CMEventChannel, want: int) -> CMEvent:
    """The channel's next event, which must be ``want``; acknowledged."""
    ev = CMEvent(ch)
    assert ev.event_type == want, (ev.event_str(), ev.status)
    ev.ack_cm_event()
    return ev


def resolved(port: int) -> tuple[CMEventChannel, CMEventChannel, CMID, CMID]:
    """(the server's channel, the client's channel, the listening id on 127.0.0.1:port,
    the client's id with ADDR_RESOLVED and ROUTE_RESOLVED taken)."""
    srv_ch, cli_ch = CMEventChannel(), CMEventChannel()
    lid = CMID(creator=srv_ch)
    lid.bind_addr(AddrInfo(src="127.0.0.1", src_service=str(port), flags=ce.RAI_PASSIVE))
    lid.listen()
    cid = CMID(creator=cli_ch)
    cid.resolve_addr(AddrInfo(dst="127.0.0.1", dst_service=str(port)))
    next_event(cli_ch, ce.RDMA_CM_EVENT_ADDR_RESOLVED)
    cid.resolve_route()
    next_event(cli_ch, ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
    return srv_ch, cli_ch, lid, cid


def requested(port: int, attr: Callable[[], QPInitAttr]
              ) -> tuple[CMEventChannel, CMEventChannel, CMID, CMID, CMID]:
    """``resolved`` and then: the client's QP made with ``attr()``, rdma_connect, the
    server's CONNECT_REQUEST taken and its id (the last of the five) given a QP made with
    another ``attr()`` (rdma_create_qp fills in the attributes' CQs, as librdmacm's
    does), not yet accepted."""
    srv_ch, cli_ch, lid, cid = resolved(port)
    cid.create_qp(attr())
    cid.connect()
    req = next_event(srv_ch, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lid)
    child.create_qp(attr())
    return srv_ch, cli_ch, lid, cid, child
