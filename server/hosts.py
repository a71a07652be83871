"""What the daemon's parts share, below all of them: the daemon's limits, its records of
a session's CQs and QPs, and the interfaces through which the daemon, a control session
and its verbs see each other (``Session``, ``Node``), so that none of them imports
another's module to name its type.

A ``QPHost`` carries its completion and event sinks, set by the session's verbs when
the QP is created: the daemon moves a QP's completions and asynchronous events to
them without knowing what a session is.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from ..engine.cm import timewait_seconds
from ..engine.hca import HCA, PD
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..engine.rc import RCQP
from ..protocol.enums import EventType
from ..protocol.errors import RDMAError
from ..protocol.frames import DEFAULT_MAX_FRAME
from ..protocol.records import WC
from .async_events import wait_woken, wake
from .faults import Faults

# Objects per session and per credential (a client token; all clients share one when
# the daemon has none), by kind: (per session, per credential). A device-wide pool
# (ibv_query_device's max_qp, max_cq, max_mr, max_pd; mlx5's DEKs and MKEYs) is shared
# by every tenant, so no credential may take more than a share of it.
DEFAULT_QUOTAS: dict[str, tuple[int, int]] = {
    "ctx": (256, 1024), "pd": (16384, 65536), "mr": (65536, 262144), "cq": (16384, 65536),
    "qp": (16384, 65536), "mkey": (65536, 262144), "dek": (16384, 32768),
    "crypto_login": (256, 1024), "ah": (65536, 262144), "mw": (65536, 262144),
    "srq": (16384, 65536)}

# What an object costs the daemon beside its buffers, as charged against the memory
# budget (measured: a QP with its queues and RC state some 4 KiB, rounded up).
OBJECT_BYTES: dict[str, int] = {"ctx": 1024, "pd": 256, "mr": 512, "cq": 1024, "qp": 8192,
                                "mkey": 1024, "dek": 1024, "crypto_login": 512, "srq": 8192,
                                "ah": 256, "mw": 256}


def default_memory_budget() -> int:
    """Half of the machine's memory (MemTotal in /proc/meminfo); 8 GiB where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError):
        pass
    return 8 << 30


CM_TIMEWAIT_DEFAULT = timewait_seconds()
CM_TIMEWAIT_MAX = 60.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one daemon accepts; each limit hit is a clear error, never a crash."""

    max_connections: int = 1024             # control sessions and wire links together
    # Connections that have not completed the HELLO: a separate, smaller pool with a
    # shorter timeout, so that sockets that never say hello take no authenticated slot.
    # When it is full the oldest is closed for the newcomer: an idle socket holds its
    # slot only until others arrive, and a real peer's HELLO takes one round trip.
    max_pre_hello: int = 64
    hello_timeout: float = 3.0
    max_objects: int = 1 << 16              # verbs objects per control session
    max_session_bytes: int = 4 << 30        # registered MR bytes per session (ENOMEM)
    max_daemon_bytes: int = 16 << 30        # registered MR bytes in the daemon (ENOMEM)
    max_frame: int = DEFAULT_MAX_FRAME      # bytes in one frame (EMSGSIZE, then close)
    max_msg_size: int = 1 << 31             # bytes in one message (ibv_port_attr max_msg_sz)
    max_qp_wr: int = 1 << 14                # max_send_wr / max_recv_wr of a QP (EINVAL)
    # A session's unsent replies beyond this stop its requests being read until the
    # client reads: a client that floods and never reads cannot grow the daemon.
    reply_high_water: int = 8 << 20
    # poll_cq / get_async_event requests one session may have waiting (ENOMEM past it).
    max_waits: int = 1024
    # Connections one credential (a client token, the peer token) may hold at once:
    # past it EBUSY, so that one tenant cannot take every slot.
    max_credential_connections: int = 256
    # Seconds a frame may take to arrive once its first bytes have (ETIMEDOUT, close):
    # a half-sent frame holds no slot longer.
    frame_deadline: float = 10.0
    # Seconds a control session that holds nothing (no object, no waiting request, no
    # subscription) may send nothing (ETIMEDOUT, close).
    idle_timeout: float = 600.0
    # Per kind: (per session, per credential) object quotas (ENOMEM past either).
    quotas: dict = dataclasses.field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    # Bytes of objects (OBJECT_BYTES each) and registered memory in the daemon in all
    # (ENOMEM past it); default half of the machine's memory.
    memory_budget: int = dataclasses.field(default_factory=default_memory_budget)
    # Seconds a disconnected rdma_cm connection stays in timewait before
    # RDMA_CM_EVENT_TIMEWAIT_EXIT (server/cm_timewait.py): the IB CM's 1.024 s for a
    # RoCE path by default; at most CM_TIMEWAIT_MAX, so no id waits for hours.
    cm_timewait: float = CM_TIMEWAIT_DEFAULT

    def __post_init__(self) -> None:
        if not 0 < self.cm_timewait <= CM_TIMEWAIT_MAX:
            raise ValueError(f"cm_timewait {self.cm_timewait!r}: seconds in (0, "
                             f"{CM_TIMEWAIT_MAX:g}] are expected")


class Session(Protocol):
    """A control session as the daemon and the verbs see it: it owns QPs, fault rules
    and subscriptions, and takes replies, completions and events for its client."""

    peer: str
    # What its HELLO proved: its objects count against that credential's quotas.
    credential: str
    # Pushed events it lost because it did not read them fast enough.
    events_dropped: int

    @property
    def gone(self) -> bool: ...

    def push(self, header: dict, payload: bytes | memoryview = b"") -> None: ...

    def push_wcs(self, cq: int, wcs: list) -> None: ...

    def push_cq_event(self, cq: int) -> None: ...

    def release_held(self) -> None: ...

    def reply(self, rid: int, payload: bytes | memoryview = b"", **result: Any) -> None: ...

    def reply_to(self, verb: str, rid: int, **result: Any) -> None: ...


class CQHost:
    """A completion queue: completions in, polls out; a poll may wait for the first.

    A pushed CQ (create_cq ``push``) sends its completions to the session as they are
    made (server/session.py ``push_wcs``) and keeps none here; ``pushed`` counts those
    the application has not polled yet (the client returns them with cq_credit), so the
    CQ's cqe bounds them exactly as it bounds ``entries``: a client that never polls
    overruns the CQ as one that never calls ibv_poll_cq(3) does."""

    def __init__(self, handle: int, cqe: int, ctx: int = 0, push: bool = False) -> None:
        self.handle = handle
        self.cqe = cqe
        # The session's handle of the context the CQ was created on (its async events).
        self.ctx = ctx
        self.entries: deque[WC] = deque()
        self._waiters: set[asyncio.Future] = set()
        self.error = False
        self.push_mode = push
        # Entries pushed to the client and not yet credited back (polled there).
        self.pushed = 0
        # A local program's completion ring (server/cq_ring.py CqRing), or None: its
        # consumer index, not cq_credit, returns the room; ``armed`` is the program's
        # ibv_req_notify_cq, answered by a cq_event frame at the next entry written.
        self.ring: Any = None
        self.armed = False
        # A ring CQ's completion channel (server/cq_ring.py EventSocket), or None: its
        # events are written there, not sent as cq_event frames.
        self.events: Any = None

    def push(self, wcs: list[WC]) -> bool:
        """Queue ``wcs``; True when this overran the CQ. ibv_create_cq(3): the CQ holds
        cqe entries; completions past them are an overrun, and as on a device the CQ
        goes to error and takes no more (IBV_EVENT_CQ_ERR, ibv_get_async_event(3)), so
        a CQ nobody polls costs cqe entries, never more. A pushed CQ's entries are
        taken back out at once by the caller (``take_pushed``)."""
        if self.error:
            return False
        if self.ring is not None:
            unpolled = self.ring.unpolled()
            if unpolled is None:
                # a consumer index no poll of this ring gives: the program broke its
                # ring, and the CQ can hold nothing more
                self.error = True
                return True
            self.pushed = unpolled
        room = self.cqe - len(self.entries) - self.pushed
        overrun = len(wcs) > room
        self.entries.extend(wcs[:room] if overrun else wcs)
        if overrun:
            self.error = True
        wake(self._waiters)
        return overrun

    def take_pushed(self) -> list[WC]:
        """The entries to send to the client now; they count as pushed until credited."""
        out = list(self.entries)
        self.entries.clear()
        self.pushed += len(out)
        return out

    def credit(self, n: int) -> None:
        """The client polled ``n`` pushed entries: their room is free again. More than
        were pushed is a broken client (EPROTO), refused whole."""
        if self.ring is not None:
            raise RDMAError("EPROTO", f"cq_credit: CQ {self.handle} has a completion ring, "
                                      "whose consumer index returns its room")
        if n > self.pushed:
            raise RDMAError("EPROTO", f"cq_credit: {n} entries of CQ {self.handle} credited, "
                                      f"{self.pushed} were pushed and not credited")
        self.pushed -= n

    def take(self, num: int) -> list[WC]:
        return [self.entries.popleft() for _ in range(min(num, len(self.entries)))]

    async def wait(self, timeout: float) -> None:
        if self.entries or timeout <= 0:
            return
        await wait_woken(self._waiters, timeout)


@dataclasses.dataclass(eq=False)
class QPHost:
    session: Session
    handle: int
    hca: HCA
    pd: PD
    rcqp: RCQP
    scq: CQHost
    rcq: CQHost
    max_send_sge: int
    max_recv_sge: int
    send_ops_flags: int
    builder: MkeyConfigureBuilder
    # Where the daemon puts the QP's completions (with the CQ they go to) and its
    # asynchronous events (IBV_EVENT_*): the creating session's.
    completions: Callable[[CQHost, list[WC]], None]
    events: Callable[[QPHost, EventType], None]
    dest: tuple[str, int, str] | None = None
    # Where its peer's packets may come from (the wire plane's set_origins): none until
    # connected.
    origins: frozenset = frozenset()
    timer: asyncio.TimerHandle | None = None
    timer_at: float | None = None
    # Whether the daemon has seen this QP in ERR (its flushed WRs' memory freed).
    flushed: bool = False
    attrs: dict = dataclasses.field(default_factory=dict)
    # The session's handle of the context the QP was created on: its async events go there.
    ctx: int = 0
    # Whether its peer's daemon not connecting back was logged (server/return_path.py).
    no_return_said: bool = False
    # The daemons (host, port) a UD QP sent to through its AHs (server/wire.py).
    routes: set = dataclasses.field(default_factory=set)
    # A local program's send and receive rings (server/wq_ring.py QpRings), or None.
    wq: Any = None


class Subscriptions(Protocol):
    """The daemon's pushed events as a session's verbs change them (server/taps.py)."""

    def subscribe(self, session: Session, kinds: set[str] | frozenset[str],
                  daemon_wide: bool = False) -> None: ...

    def unsubscribe(self, session: Session) -> None: ...


class Node(Protocol):
    """The daemon as a control session and its verbs see it (server/daemon.py)."""

    limits: Limits
    hcas: dict[str, HCA]
    max_frame: int
    registered_bytes: int
    counters: dict[str, int]
    sessions: set
    faults: Faults
    events: Subscriptions
    # server/shares.py Shares: per-credential connections and objects, memory in use.
    shares: Any
    # The running loop, kept (Daemon.loop).
    loop: Any

    def service(self, qph: QPHost) -> None: ...

    def new_qpn(self) -> int: ...

    def add_qp(self, qph: QPHost) -> None: ...

    def forget_qp(self, qph: QPHost) -> None: ...

    def connect(self, qph: QPHost, host: str, port: int) -> None: ...

    def route(self, host: str, port: int,
              dialed: tuple[str, int] | None) -> tuple[str, int]: ...

    def release_links(self, qps: set) -> None: ...

    def stats(self) -> dict[str, int]: ...
