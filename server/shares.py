"""Fair shares of one daemon: what each credential and each session may hold.

A credential is what a connection proved in its HELLO: one of the client tokens (a
``--token-file`` may hold several, one per tenant), the peer token (wire links), or
nothing on a daemon without a token (every client then shares one). On the UNIX socket a
process is "uid:U/pid:P": a share nested in its uid's, which still bounds all the uid's
processes together, of at most 1/PROCESS_DIVISOR of it, so that one program never takes
what the uid's other programs need. ``Shares`` counts,
per credential, the connections it holds and the objects its sessions hold, and the
bytes of objects and registered memory in the whole daemon; each limit (server/hosts.py
``Limits``) is checked before anything is allocated and answered EBUSY (connections) or
ENOMEM (objects, memory), naming the limit.

``Watchdog`` closes a connection that has started a frame and not finished it within
``frame_deadline``, or a control session that holds nothing (no object, no waiting
request, no subscription) and has sent nothing for ``idle_timeout``: a slot is held by
a client that uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from ..protocol.errors import RDMAError
from ..protocol.frames import FrameDecoder
from .hosts import OBJECT_BYTES, Limits
from .logs import kv, log

__all__ = ["Shares", "Watchdog"]

# How often a watchdog looks (s): the deadlines hold to within this.
WATCH_PERIOD = 0.25
# A process of a local user (the UNIX socket) may hold this fraction (1/N) of its uid's
# connections and of each of its object quotas: one program that opens sessions or
# objects without end leaves the rest to the uid's other programs.
PROCESS_DIVISOR = 2


class Shares:
    """The connections and objects of every credential, and the daemon's memory in use."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.connections: dict[str, int] = {}
        self.objects: dict[str, dict[str, int]] = {}
        self.memory_used = 0

    # -- nesting --------------------------------------------------------------------------
    @staticmethod
    def _chain(credential: str) -> list[tuple[str, int]]:
        """What a connection of ``credential`` counts against, each with the divisor of
        its limits: itself, whole; for a process of a local user ("uid:U/pid:P", the
        UNIX socket), its uid's share whole and its own at 1/PROCESS_DIVISOR of it."""
        uid, sep, _ = credential.partition("/")
        if not sep:
            return [(credential, 1)]
        return [(uid, 1), (credential, PROCESS_DIVISOR)]

    @staticmethod
    def _who(credential: str) -> str:
        uid, sep, pid = credential.partition("/")
        if not sep:
            return f"credential {credential}"
        return f"process {pid.removeprefix('pid:')} of {uid}"

    # -- connections ------------------------------------------------------------------
    def admit(self, credential: str) -> None:
        """A connection of ``credential`` logs in: EBUSY past its share (or, for a
        process of a local user, past its uid's or its own part of it)."""
        cap = self.limits.max_credential_connections
        for cred, div in self._chain(credential):
            n = self.connections.get(cred, 0)
            mine = max(1, cap // div)
            if n >= mine:
                part = "" if div == 1 else f", 1/{div} of its uid's"
                raise RDMAError("EBUSY", f"{self._who(cred)} holds {n} connections, its "
                                         f"limit{part} (serve --max-credential-connections "
                                         f"{cap})")
        for cred, _ in self._chain(credential):
            self.connections[cred] = self.connections.get(cred, 0) + 1

    def leave(self, credential: str) -> None:
        for cred, _ in self._chain(credential):
            n = self.connections.get(cred, 0) - 1
            if n > 0:
                self.connections[cred] = n
            else:
                self.connections.pop(cred, None)

    # -- objects and memory -----------------------------------------------------------
    def check(self, credential: str, session_counts: dict[str, int], kind: str,
              extra_bytes: int = 0) -> None:
        """Before a session of ``credential`` creates a ``kind`` object (with
        ``extra_bytes`` of buffers): ENOMEM past the session's or the credential's
        quota for the kind (for a process of a local user: its uid's, or its own part
        of it), or past the daemon's memory budget."""
        lim = self.limits
        per_session, per_credential = lim.quotas.get(kind, (1 << 30, 1 << 30))
        n = session_counts.get(kind, 0)
        if n >= per_session:
            raise RDMAError("ENOMEM", f"this session holds {n} {kind} objects, its quota "
                                      f"(serve --quota {kind}={per_session},{per_credential})")
        for cred, div in self._chain(credential):
            held = self.objects.get(cred, {}).get(kind, 0)
            if held >= max(1, per_credential // div):
                part = "" if div == 1 else f", 1/{div} of its uid's"
                raise RDMAError("ENOMEM", f"{self._who(cred)} holds {held} {kind} objects "
                                          f"in all its sessions, its quota{part} (serve "
                                          f"--quota {kind}={per_session},{per_credential})")
        cost = OBJECT_BYTES.get(kind, 0) + extra_bytes
        if self.memory_used + cost > lim.memory_budget:
            raise RDMAError("ENOMEM", f"the daemon holds {self.memory_used} bytes of objects "
                                      f"and memory; {cost} more would pass its budget "
                                      f"(serve --memory-budget {lim.memory_budget})")

    def take(self, credential: str, kind: str, extra_bytes: int = 0) -> None:
        for cred, _ in self._chain(credential):
            per = self.objects.setdefault(cred, {})
            per[kind] = per.get(kind, 0) + 1
        self.memory_used += OBJECT_BYTES.get(kind, 0) + extra_bytes

    def give_back(self, credential: str, kind: str, extra_bytes: int = 0) -> None:
        for cred, div in self._chain(credential):
            per = self.objects.get(cred)
            if per is not None and per.get(kind, 0) > 0:
                per[kind] -= 1
                # A process's entry goes with its last object: pids are many and reused.
                if div != 1 and not any(per.values()):
                    del self.objects[cred]
        self.memory_used -= OBJECT_BYTES.get(kind, 0) + extra_bytes


class Watchdog:
    """Watches one authenticated connection's decoder; ``close`` (with the error to send)
    when a frame is stuck half-way past ``frame_deadline``, or when ``idle`` says the
    connection may be closed for idleness and nothing came for ``idle_timeout``."""

    def __init__(self, decoder: FrameDecoder, limits: Limits,
                 close: Callable[[RDMAError], None], idle: Callable[[], bool] | None,
                 peer: str) -> None:
        self.decoder, self.limits, self.close, self.idle, self.peer = (
            decoder, limits, close, idle, peer)
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._fed, self._fed_at = decoder.fed, now
        self._done, self._partial_since = decoder.frames_done, None
        self._handle = loop.call_later(WATCH_PERIOD, self._look)

    def stop(self) -> None:
        self._handle.cancel()

    def _look(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        d = self.decoder
        if d.fed != self._fed:
            self._fed, self._fed_at = d.fed, now
        if d.buffered and d.frames_done == self._done:
            if self._partial_since is None:
                self._partial_since = now
            elif now - self._partial_since > self.limits.frame_deadline:
                self._expire("a frame begun was not finished within "
                             f"{self.limits.frame_deadline:g} s (serve --frame-deadline)",
                             "frame_deadline")
                return
        else:
            self._partial_since = None
        self._done = d.frames_done
        if (self.idle is not None and now - self._fed_at > self.limits.idle_timeout
                and self.idle()):
            self._expire(f"nothing sent for {self.limits.idle_timeout:g} s "
                         "(serve --idle-timeout)", "idle_timeout")
            return
        self._handle = loop.call_later(WATCH_PERIOD, self._look)

    def _expire(self, reason: str, event: str) -> None:
        log.warning("connection closed %s", kv(event=event, peer=self.peer, reason=reason))
        with contextlib.suppress(Exception):
            self.close(RDMAError("ETIMEDOUT", reason))
