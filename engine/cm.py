"""The connection manager's state machine: one ``CMId`` per rdma_cm_id, the states an
id passes through (rdma_cm's, as librdmacm's man pages order the calls and events) and
which call or message each state allows. Pure: the daemon (server/cm.py) sends the
messages and pushes the events; here a call in the wrong state is refused (EINVAL, as
rdma_cm refuses it) and a message in the wrong state is ignored (a duplicate or stale
one, as IBTA's CM drops it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..protocol.errors import RDMAError


class CMState(enum.Enum):
    IDLE = "idle"
    BOUND = "bound"                  # rdma_bind_addr
    ADDR_QUERY = "addr_query"        # rdma_resolve_addr: the peer's daemon is sought
    ADDR_RESOLVED = "addr_resolved"
    ROUTE_QUERY = "route_query"
    ROUTE_RESOLVED = "route_resolved"
    LISTEN = "listen"
    REQ_SENT = "req_sent"            # rdma_connect: waiting for REP / REJ
    REQ_RCVD = "req_rcvd"            # a listener's child, before rdma_accept / reject
    REP_SENT = "rep_sent"            # rdma_accept: waiting for RTU
    REP_RCVD = "rep_rcvd"            # REP taken: the library readies its QP, then RTU
    ESTABLISHED = "established"
    DREQ_SENT = "dreq_sent"          # rdma_disconnect: waiting for DREP
    # The disconnect completed (DREP sent or taken, or the DREQ's resends ran out): the
    # connection's QP numbers are held until RDMA_CM_EVENT_TIMEWAIT_EXIT, so that a
    # stale REQ naming them is refused (server/cm.py, ``enter_timewait``).
    TIMEWAIT = "timewait"
    DISCONNECTED = "disconnected"


# The states each call is allowed in.
_ALLOWED = {
    "bind": {CMState.IDLE},
    "resolve_addr": {CMState.IDLE, CMState.BOUND, CMState.ADDR_RESOLVED},
    "resolve_route": {CMState.ADDR_RESOLVED},
    "listen": {CMState.BOUND, CMState.LISTEN},
    "connect": {CMState.ROUTE_RESOLVED},
    "accept": {CMState.REQ_RCVD},
    "reject": {CMState.REQ_RCVD},
    "establish": {CMState.REP_RCVD},
    "disconnect": {CMState.ESTABLISHED, CMState.REP_SENT, CMState.REP_RCVD,
                   CMState.DREQ_SENT, CMState.TIMEWAIT, CMState.DISCONNECTED},
}


@dataclass
class CMId:
    """One rdma_cm_id of a session. ``handle`` is also its local communication id (the
    one its messages carry), unique in the daemon."""

    handle: int
    owner: object
    ps: int
    state: CMState = CMState.IDLE
    ip: str = "0.0.0.0"
    port: int = 0
    reuse: bool = False              # RDMA_OPTION_ID_REUSEADDR
    afonly: bool = True              # RDMA_OPTION_ID_AFONLY (an IPv4 id always is)
    dev: int = 0
    # The peer: its daemon (host, wire port), device index, IP address and port, its
    # communication id once known.
    peer: tuple[str, int] | None = None
    peer_dev: int = 0
    peer_ip: str = ""
    peer_port: int = 0
    remote_cid: int = 0
    # The peer's QP number (from its REQ or REP): what a connection in timewait holds.
    remote_qpn: int = 0
    # A listener's children that wait for rdma_accept / rdma_reject (its backlog), and
    # a child's listener.
    backlog: int = 0
    pending: set[int] = field(default_factory=set)
    listener: int = 0
    # What the next retransmission sends (REQ, REP or DREQ) and the tries left.
    resend: dict | None = None
    tries: int = 0

    def check(self, call: str) -> None:
        """EINVAL unless ``call`` is allowed in this id's state."""
        if self.state not in _ALLOWED[call]:
            raise RDMAError("EINVAL", f"rdma_{call}: the id is in state "
                                      f"{self.state.value}, which does not allow it")

    def to(self, state: CMState) -> None:
        self.state = state


def backlog_of(requested: int, limit: int) -> int:
    """rdma_listen(3)'s backlog: 0 means the default (here the limit), and more than the
    limit is the limit (as listen(2) caps it at somaxconn)."""
    return limit if requested == 0 else min(requested, limit)


# -- the timewait's length -------------------------------------------------------------
# IBTA times are 4.096 us * 2^t. On RoCE rdma_cm gives the path a packet lifetime of
# t = 16 (the kernel's CMA_IBOE_PACKET_LIFETIME, some 268 ms), and an mlx5 HCA's
# local_ca_ack_delay is 16 (what softhca's devices report). The IB CM derives the
# connection's ACK timeout from both (``ack_timeout`` below: 18 for these inputs, on
# the active side from the REP's target ACK delay, on the passive side from the REQ's
# local ACK timeout, so 18 on both), and holds a disconnected connection in timewait
# for that time, taken as 2^(t - 8) ms: 2^10 = 1024 ms.
ROCE_PACKET_LIFETIME = 16
CA_ACK_DELAY = 16


def ack_timeout(ca_ack_delay: int, packet_life_time: int) -> int:
    """The ACK timeout exponent of a path: 4.096 us * 2^t should cover the HCA's ACK
    delay plus the round trip (twice the packet lifetime); the larger of the delay and
    lifetime + 1, one more when the other is within a factor of two of it (at most 31)."""
    t = packet_life_time + 1
    if t >= ca_ack_delay:
        t += ca_ack_delay >= t - 1
    else:
        t = ca_ack_delay + (t >= ca_ack_delay - 1)
    return min(31, t)


def timewait_seconds(packet_life_time: int = ROCE_PACKET_LIFETIME,
                     ca_ack_delay: int = CA_ACK_DELAY) -> float:
    """How long a connection stays in timewait: its ACK timeout exponent t read as
    2^(t - 8) ms (4.096 us * 2^t rounded down to a power of two of milliseconds)."""
    t = ack_timeout(ca_ack_delay, packet_life_time)
    return (1 << max(t - 8, 0)) / 1000
