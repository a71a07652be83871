"""The kinds of frame (a header's ``"t"``) that are not control requests.

A control request's kind is its verb (protocol/control.py ``REQUESTS``); every other
frame of the control and wire planes is one of these. Members are ``str``: a member
compares, hashes and packs exactly as its wire value, so a header built with
``FrameKind.OK`` is the same bytes as one built with ``"ok"``.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["FrameKind"]


class FrameKind(str, Enum):
    """What a frame is, by its header's ``"t"``."""

    # The HELLO exchange (protocol/handshake.py).
    CHALLENGE = "challenge"
    HELLO = "hello"
    WELCOME = "welcome"
    # Control replies: one per request, carrying its id.
    OK = "ok"
    ERR = "err"
    # Pushed by the daemon without an id: a pushed CQ's completions, a subscribed event.
    WC = "wc"
    EVENT = "event"
    # The client's return of polled pushed entries (a request with id 0 and no reply).
    CQ_CREDIT = "cq_credit"
    # Pushed: an armed ring CQ got an entry (ibv_req_notify_cq, the completion channel).
    CQ_EVENT = "cq_event"
    # The wire plane: one RC packet, a train of them, the runs of several messages
    # (protocol/packets.py).
    PKT = "pkt"
    TRAIN = "train"
    RUNS = "runs"

    # As a str everywhere, so that formatting, hashing and msgpack see the wire value.
    __str__ = str.__str__
    __format__ = str.__format__
    __hash__ = str.__hash__
