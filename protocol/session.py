"""A control session's protocol, sans-I/O: bytes in, events out; calls in, bytes out.

``ControlSession`` is the state of one control connection after the HELLO, for either
end: the application's (``Role.CLIENT``, driven by client/connection.py) and the
daemon's (``Role.SERVER``, driven by server/session.py). It owns no socket, no event
loop and no clock: the driver feeds it what it read (``receive_data``; ``b""`` for the
end of the stream), acts on the events it returns, calls it to send, and writes what
``data_to_send`` hands back. Both ends therefore agree by construction on what a frame
of the control plane is:

- requests ``{"t": <verb>, "id": n, ...}``, answered once each by ``ok`` or ``err``
  with the same id (protocol/control.py checks a request's fields);
- ``wc`` frames: completions of a pushed CQ, sent by the daemon as it makes them and
  kept here until the application polls them; the room of every polled entry goes
  back to the daemon in ``cq_credit`` requests (id 0, no reply when accepted), either
  in front of the next request or on their own when the driver flushes them;
- ``event`` frames: subscribed events (packets, trace stages), no id;
- an ``err`` with id 0 (or an id no request has): the daemon's reason for closing.

A peer that breaks the protocol (framing lost, a frame of the wrong kind for this end,
a reply to a request never made, a malformed ``wc``) ends the session with EPROTO.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Any

from . import control
from .errors import ERRNO_NAMES, RDMAError
from .frames import Frame, FrameDecoder, FrameError, encode_frame
from .kinds import FrameKind
from .replies import err_frame

__all__ = [
    "Broken",
    "Call",
    "Closed",
    "Completions",
    "ControlSession",
    "Failed",
    "Pushed",
    "Refused",
    "Reply",
    "Role",
    "SessionEvent",
]


class Role(Enum):
    CLIENT = "client"
    SERVER = "server"


# -- events -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    """Client: the ``ok`` reply to request ``rid``."""

    rid: int
    header: dict
    payload: memoryview


@dataclass(frozen=True)
class Failed:
    """Client: the ``err`` reply to request ``rid``."""

    rid: int
    error: RDMAError


@dataclass(frozen=True)
class Completions:
    """Client: ``count`` completions of pushed CQ ``cq`` arrived (``take_completions``)."""

    cq: int
    count: int


@dataclass(frozen=True)
class Pushed:
    """Client: a subscribed event (``kind`` "packet" or "trace"), its header and bytes."""

    kind: str
    header: dict
    payload: memoryview


@dataclass(frozen=True)
class Call:
    """Server: a request decoded into its typed form (protocol/control.py), to run."""

    rid: int
    request: control.Request


@dataclass(frozen=True)
class Refused:
    """Server: a request refused before it ran (unknown verb or field, a field out of its
    bounds); the driver answers it with ``send_error`` in its turn, so that replies stay
    in request order."""

    rid: int
    error: RDMAError


@dataclass(frozen=True)
class Broken:
    """The peer broke the protocol (``error``, EPROTO or EMSGSIZE); a Closed event follows.
    A server role has queued its ``err`` (id 0) saying why."""

    error: RDMAError


@dataclass(frozen=True)
class Closed:
    """The session ended: ``error`` is why (for a client, what every outstanding and
    later request raises; None for a server's peer that closed), ``failed`` the ids of
    the requests that will never be answered."""

    error: RDMAError | None
    failed: tuple[int, ...] = ()


SessionEvent = Reply | Failed | Completions | Pushed | Call | Refused | Broken | Closed


class ControlSession:
    """One end of a control connection, after the HELLO (module docstring).

    ``decoder`` is the handshake's, which may already hold the start of the next frame;
    ``peer`` names the other end in error messages.
    """

    def __init__(self, role: Role, *, max_frame: int | None = None,
                 decoder: FrameDecoder | None = None, peer: str = "the peer") -> None:
        if decoder is None:
            decoder = FrameDecoder() if max_frame is None else FrameDecoder(max_frame)
        self.role = role
        self.peer = peer
        self._decoder = decoder
        self._out: list = []
        self._closed: Closed | None = None
        # Client: the next request id, those not answered yet, an err id 0's reason.
        self._next_id = 1
        self._pending: set[int] = set()
        self._reason: RDMAError | None = None
        # Client: pushed CQs' received completions (wire form, oldest first), and the
        # entries polled since the last cq_credit, to return: cq handle -> count.
        self._cqs: dict[int, deque] = {}
        self._owed: dict[int, int] = {}

    # -- both roles -----------------------------------------------------------------------
    @property
    def closed(self) -> Closed | None:
        """The Closed event once the session ended, else None."""
        return self._closed

    @property
    def error(self) -> RDMAError | None:
        """Why the session ended (what a client's requests raise), or None while open."""
        return None if self._closed is None else self._closed.error

    def data_to_send(self) -> list:
        """The buffers to write, in order (for ``writelines``); taken, not copied."""
        out, self._out = self._out, []
        return out

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[SessionEvent]:
        """Bytes read from the connection; ``b""`` means the peer closed it. Returns the
        events they complete, in order. After the session closed, nothing happens."""
        if self._closed is not None:
            return []
        if not data:
            return [self._close(self._eof_error())]
        try:
            frames = self._decoder.feed(data)
        except FrameError as e:
            return self._break(e)
        return self.receive_frames(frames)

    def receive_frames(self, frames: list[Frame]) -> list[SessionEvent]:
        """Frames already decoded (those that came with the HELLO's last read)."""
        events: list[SessionEvent] = []
        handle = self._client_frame if self.role is Role.CLIENT else self._server_frame
        for fr in frames:
            if self._closed is not None:
                break
            try:
                handle(fr, events)
            except FrameError as e:
                events += self._break(e)
        return events

    def connection_lost(self, error: RDMAError | None = None) -> Closed:
        """The transport failed or was closed by this end: end the session with
        ``error`` (default: the peer's reason if it gave one, else ECONNRESET)."""
        if self._closed is not None:
            return self._closed
        return self._close(error or self._eof_error())

    def _eof_error(self) -> RDMAError | None:
        if self.role is Role.SERVER:
            return None
        return self._reason or RDMAError("ECONNRESET",
                                         f"the daemon at {self.peer} closed the connection")

    def _close(self, error: RDMAError | None) -> Closed:
        failed = tuple(sorted(self._pending))
        self._pending.clear()
        self._owed.clear()
        self._closed = Closed(error, failed)
        return self._closed

    def _break(self, e: FrameError) -> list[SessionEvent]:
        if self.role is Role.SERVER:
            # Framing or the protocol is lost: say why before the connection closes.
            self._out += encode_frame(err_frame(0, e))
        error = RDMAError(e.errno_name, e.message)
        return [Broken(error), self._close(error if self.role is Role.CLIENT else None)]

    # -- client role ----------------------------------------------------------------------
    def send_request(self, verb: str, payload: bytes | memoryview = b"",
                     **fields: Any) -> int:
        """Queue request ``verb`` with ``fields`` (and ``payload``); returns its id. The
        credits owed go in front of it. Raises the session's error once it ended."""
        self._require(Role.CLIENT)
        if self._closed is not None:
            raise self._closed.error
        rid = self._next_id
        self._next_id = rid + 1 if rid < control.U32 else 1
        frame = encode_frame({"t": verb, "id": rid, **fields}, payload)
        self._pending.add(rid)
        self.flush_credits()
        self._out += frame
        return rid

    @property
    def outstanding(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._pending)

    def completions(self, cq: int) -> int:
        """How many received completions of pushed CQ ``cq`` wait to be taken."""
        q = self._cqs.get(cq)
        return len(q) if q else 0

    def take_completions(self, cq: int, n: int) -> list:
        """Up to ``n`` received completions of pushed CQ ``cq``, oldest first, in wire
        form; their room is owed back to the daemon from now on (``flush_credits``)."""
        q = self._cqs.get(cq)
        if not q:
            return []
        out = [q.popleft() for _ in range(min(n, len(q)))]
        if self._closed is None:
            self._owed[cq] = self._owed.get(cq, 0) + len(out)
        return out

    @property
    def credits_owed(self) -> bool:
        """Polled entries whose room has not been returned yet."""
        return bool(self._owed)

    def flush_credits(self) -> bool:
        """Queue the cq_credit requests for every entry polled since the last; True when
        there were any. Nothing is owed after the session ended."""
        if not self._owed or self._closed is not None:
            return False
        credits = [[h, n] for h, n in self._owed.items()]
        self._owed.clear()
        for i in range(0, len(credits), control.MAX_CREDITS):
            # Unchecked: the session builds it of its own ints (one with every poll).
            self._out += encode_frame({"t": FrameKind.CQ_CREDIT, "id": 0,
                                       "credits": credits[i:i + control.MAX_CREDITS]},
                                      check=False)
        return True

    def drop_qp_completions(self, cq: int, qp_num: int) -> None:
        """A QP moved to RESET: its received, unpolled completions of pushed CQ ``cq``
        go (as libmlx5 cleans a CQ of a reset QP's entries), their room owed back."""
        q = self._cqs.get(cq)
        if not q:
            return
        keep = deque(w for w in q if not (isinstance(w, list) and len(w) > 5
                                          and w[5] == qp_num))
        gone = len(q) - len(keep)
        self._cqs[cq] = keep
        if gone and self._closed is None:
            self._owed[cq] = self._owed.get(cq, 0) + gone

    def forget_cq(self, cq: int) -> None:
        """A destroyed CQ: its unpolled entries and unreturned room go with it, as
        ibv_destroy_cq(3)'s do."""
        self._cqs.pop(cq, None)
        self._owed.pop(cq, None)

    def _client_frame(self, fr: Frame, events: list[SessionEvent]) -> None:
        h = fr.header
        kind = fr.kind
        rid = h.get("id")
        if type(rid) is not int:    # (msgpack gives exact ints; a bool is not an id)
            rid = None
        if kind == FrameKind.WC:
            cq, wcs = h.get("cq"), h.get("wcs")
            if not isinstance(cq, int) or isinstance(cq, bool) or not isinstance(wcs, list):
                raise FrameError("EPROTO", "a 'wc' frame needs cq (int) and wcs (list)")
            self._cqs.setdefault(cq, deque()).extend(wcs)
            events.append(Completions(cq, len(wcs)))
        elif kind == FrameKind.EVENT:
            events.append(Pushed(h.get("kind", "?"), h, fr.payload))
        elif kind == FrameKind.OK:
            if rid not in self._pending:
                raise FrameError("EPROTO", f"{self.peer} replied to request {rid!r}, "
                                           f"which is not outstanding"[:160])
            self._pending.discard(rid)
            events.append(Reply(rid, h, fr.payload))
        elif kind == FrameKind.ERR:
            name = h.get("errno", "EPROTO")
            if name not in ERRNO_NAMES:
                raise FrameError("EPROTO", f"an 'err' frame names no errno: {name!r}"[:160])
            bad = h.get("bad_wr")
            err = RDMAError(name, str(h.get("msg", "?")),
                            bad if type(bad) is int and bad >= 0 else None)
            if rid in self._pending:
                self._pending.discard(rid)
                events.append(Failed(rid, err))
            else:
                # Not about a request: the daemon's reason for closing the connection.
                self._reason = err
        else:
            raise FrameError("EPROTO", f"unexpected {kind!r} frame from {self.peer}"[:160])

    # -- server role ----------------------------------------------------------------------
    def reply(self, rid: int, payload: bytes | memoryview = b"", **result: Any) -> None:
        """Queue the ``ok`` reply to request ``rid`` with ``result`` (and ``payload``)."""
        self._require(Role.SERVER)
        self._out += encode_frame({"t": FrameKind.OK, "id": rid, **result}, payload)

    def send_error(self, rid: int, error: RDMAError) -> None:
        """Queue the ``err`` reply to request ``rid`` (0: about the connection)."""
        self._require(Role.SERVER)
        self._out += encode_frame(err_frame(rid, error))

    def push_completions(self, cq: int, wcs: list) -> None:
        """Queue completions of pushed CQ ``cq``: one ``wc`` frame. ``wcs`` are in wire
        form as ``WC.to_wire`` makes them, and are not checked again here."""
        self._require(Role.SERVER)
        # Unchecked: WC.to_wire builds each of ints and nil from the typed record (the
        # walk would cost as much as the rest of the frame's encoding).
        self._out += encode_frame({"t": FrameKind.WC, "cq": cq, "wcs": wcs}, check=False)

    def push_cq_event(self, cq: int) -> None:
        """Queue the notification of armed ring CQ ``cq`` (protocol/cq_ring.py): its
        completions are in the ring, this frame only wakes the completion channel."""
        self._require(Role.SERVER)
        self._out += encode_frame({"t": FrameKind.CQ_EVENT, "cq": cq}, check=False)

    def push_event(self, header: dict, payload: bytes | memoryview = b"") -> None:
        """Queue a subscribed event; ``header`` has the event's fields (its ``"t"`` is
        set here)."""
        self._require(Role.SERVER)
        self._out += encode_frame({**header, "t": FrameKind.EVENT}, payload)

    def _server_frame(self, fr: Frame, events: list[SessionEvent]) -> None:
        rid = fr.header.get("id")
        if type(rid) is not int:    # (msgpack gives exact ints; a bool is not an id)
            rid = 0
        try:
            rid, request = control.decode_request(fr.header, fr.payload)
        except RDMAError as e:
            events.append(Refused(rid, e))
            return
        events.append(Call(rid, request))

    def _require(self, role: Role) -> None:
        if self.role is not role:
            raise TypeError(f"a {self.role.value} session cannot do what a "
                            f"{role.value} session does")
