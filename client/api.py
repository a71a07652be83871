"""The client: pyverbs' objects and names, awaited (docs/api.md), under one name.

Every verbs call is one control request to the daemon and one reply, except
``cq.poll``: the daemon pushes each CQ's completions to the client as it makes them
(before the reply of the call that made them), and a poll answers from those. An
error reply raises RDMAError carrying the daemon's errno name and sentence, as pyverbs
raises PyverbsRDMAError. Requests on one connection are answered in order except a
``poll_cq`` that waits, so ``await qp.post_send(...)`` after ``await qp.wr_complete()``
sees the configured MKEY (docs/semantics.md: later WRs see a configure at once).

Errors every request can give, besides its own (docs/api.md, "Errors"): ENOENT for an
object used after its ``close()`` (or another session's), EPROTO for a value outside
what the call's C type holds (the message names the field and its bounds), ENOMEM for
a creating call when the session holds the daemon's ``--max-objects``, ECONNRESET once
the connection is gone (the daemon stopped or closed it). A refused call changes
nothing on the daemon and the session stays usable.

The code is in client/records.py (the records), client/connection.py (the transport),
client/objects.py (PD, MR, CQ, MKey, DEK, CryptoLogin, QP) and client/node.py
(``connect``, ``embedded``, Node, Context); this module gathers them, as
``softhca.client`` does.
"""

from .ah import AH
from .connection import CLIENT_MAX_FRAME, DEFAULT_PORT, EVENT_QUEUE, IO_CHUNK
from .mw import MW, bind_wr, inc_rkey
from .node import Context, Faults, Node, Subscription, connect, embedded, route_address
from .objects import CQ, DEK, HOLD_AFTER_S, MR, PD, QP, AsyncEvent, CryptoLogin, MKey
from .records import WC, Event, MkeyErr, QPAttr, QPCap, QPInfo, QPInitAttr, RecvWR, SendWR, SigErr

__all__ = [
    "AH", "CLIENT_MAX_FRAME", "CQ", "DEFAULT_PORT", "DEK", "EVENT_QUEUE", "HOLD_AFTER_S", "IO_CHUNK",
    "MR", "PD", "QP", "WC", "AsyncEvent", "Context", "CryptoLogin", "Event", "Faults", "MKey",
    "MW", "MkeyErr", "Node", "QPAttr", "QPCap", "QPInfo", "QPInitAttr", "RecvWR", "SendWR", "SigErr",
    "Subscription", "bind_wr", "connect", "embedded", "inc_rkey", "route_address",
]
