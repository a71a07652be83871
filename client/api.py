"""The client: pyverbs' objects and names, awaited (docs/api.md).

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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..protocol import records
from ..protocol.address import split_address
from ..protocol.attrs import (
    SGE,
    CryptoAttr,
    DEKInitAttr,
    MkeyConfAttr,
    MrInterleaved,
    SigBlockAttr,
)
from ..protocol.control import MAX_CREDITS, MAX_WRS_PER_POST, attr_to_wire, sge_to_wire
from ..protocol.enums import (
    AccessFlags,
    CryptoLoginState,
    DekState,
    EventType,
    MkeyErrType,
    Mtu,
    QpState,
    QpType,
    SendFlags,
    WrOpcode,
)
from ..protocol.errors import RDMAError
from ..protocol.frames import encode_frame
from ..protocol.link import Link, open_link, read_frames
from ..protocol.records import WC

DEFAULT_PORT = 4791
# Replies carry mr.read data; a client accepts bigger frames than it sends.
CLIENT_MAX_FRAME = 64 << 20
# mr.write / mr.read move at most this much per request (below the daemon's frame limit).
IO_CHUNK = 8 << 20


EVENT_QUEUE = 1 << 16
# A poll of a pushed CQ waits locally; past this long without a completion its wait is
# also held on the daemon (a poll_cq), so the daemon's max_waits bounds it as before.
HOLD_AFTER_S = 0.005


# -- records -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Event:
    """A pushed event: ``kind`` "packet" (``header["pkt"]`` is the packet's header as on
    the wire, ``header["dir"]`` "tx" or "rx") or "trace" (one pipeline stage: ``stage``,
    ``direction``, ``stream``, ``offset``, ``detail``, the QP and WR it belongs to);
    ``data`` is the packet's payload or the stage's bytes."""

    kind: str
    header: dict
    data: bytes


class SendWR(records.SendWR):
    """struct ibv_send_wr with pyverbs' SendWR constructor: its argument order, and
    signaled by default, as pyverbs is. The fields and their wire form are
    protocol.records.SendWR's."""

    def __init__(self, wr_id: int = 0, opcode: int = WrOpcode.SEND, num_sge: int | None = None,
                 imm_data: int | None = None, sg: list[SGE] | None = None,
                 send_flags: int = SendFlags.SIGNALED) -> None:
        super().__init__(wr_id, opcode, list(sg or []), send_flags, imm_data, num_sge=num_sge)


class RecvWR(records.RecvWR):
    """struct ibv_recv_wr with pyverbs' RecvWR constructor (its argument order)."""

    def __init__(self, wr_id: int = 0, num_sge: int | None = None,
                 sg: list[SGE] | None = None) -> None:
        super().__init__(wr_id, list(sg or []), num_sge)


@dataclass
class QPCap:
    """struct ibv_qp_cap, with pyverbs' defaults: queue depths and SGEs per WR."""

    max_send_wr: int = 1
    max_recv_wr: int = 10
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@dataclass
class QPInitAttr:
    """struct ibv_qp_init_attr(_ex) with mlx5dv's send_ops_flags, for ``pd.create_qp``.

    ``scq`` and ``rcq`` (CQs) are required. ``send_ops_flags`` must include
    MLX5DV_QP_EX_WITH_MKEY_CONFIGURE for a QP that will configure MKEYs
    (``qp.wr_mkey_configure`` / ``qp.post_mkey_configure``); without it their
    ``wr_complete`` raises EOPNOTSUPP. ``create_flags``: MLX5DV_QP_CREATE_* (signature
    pipelining)."""

    qp_type: int = QpType.RC
    scq: Any = None
    rcq: Any = None
    cap: QPCap = field(default_factory=QPCap)
    sq_sig_all: int = 0
    send_ops_flags: int = 0
    # mlx5dv_qp_init_attr.create_flags (MLX5DV_QP_CREATE_SIG_PIPELINING, ...).
    create_flags: int = 0


@dataclass
class QPAttr:
    """struct ibv_qp_attr (the fields an RC QP uses), plus the peer daemon's address."""

    qp_state: int | None = None
    path_mtu: int | None = None
    dest_qp_num: int | None = None
    rq_psn: int | None = None
    sq_psn: int | None = None
    timeout: int | None = None
    retry_cnt: int | None = None
    rnr_retry: int | None = None
    min_rnr_timer: int | None = None
    max_rd_atomic: int | None = None
    max_dest_rd_atomic: int | None = None
    qp_access_flags: int | None = None
    dest_host: str | None = None
    dest_port: int | None = None
    dest_dev: str | None = None
    cur_qp_state: int | None = None
    en_sqd_async_notify: int | None = None

    def to_wire(self) -> dict:
        """The fields that are not None, as modify_qp's ``attr`` map (docs/protocol.md);
        applications do not need it. Sends nothing."""
        return {k: int(v) if isinstance(v, int) else v
                for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True)
class QPInfo:
    """What a peer needs to connect to a QP: its daemon, device, QP number, first PSN."""

    host: str
    port: int
    dev: str
    qp_num: int
    psn: int = 0


@dataclass(frozen=True)
class SigErr:
    """struct mlx5dv_sig_err"""

    actual_value: int
    expected_value: int
    offset: int


@dataclass(frozen=True)
class MkeyErr:
    """struct mlx5dv_mkey_err"""

    err_type: MkeyErrType
    sig_err: SigErr

    def __repr__(self) -> str:
        if self.err_type == MkeyErrType.NO_ERR:
            return "MkeyErr(MLX5DV_MKEY_NO_ERR)"
        s = self.sig_err
        return (f"MkeyErr(MLX5DV_MKEY_SIG_BLOCK_{self.err_type.name}, actual={s.actual_value:#x}, "
                f"expected={s.expected_value:#x}, offset={s.offset})")


# -- the connection -----------------------------------------------------------------------

class _Connection:
    """One control connection: requests out with ids, replies matched back to them."""

    def __init__(self, link: Link, address: str) -> None:
        self.reader, self.writer, self.decoder = link.reader, link.writer, link.decoder
        self.address = address
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._closed: RDMAError | None = None
        # Pushed events (frames without an id): at most EVENT_QUEUE wait to be read;
        # beyond that the oldest go and are counted.
        self.events: asyncio.Queue = asyncio.Queue()
        self.events_dropped = 0
        # Pushed CQs by handle: the completions the daemon sent, not yet polled.
        self.cqs: dict[int, _PushedCQ] = {}
        # Entries polled from pushed CQs, to credit back: cq handle -> count. They go
        # in front of the next request, or in a frame of their own at the loop's next
        # turn when no request comes first.
        self._credits: dict[int, int] = {}
        self._credit_flush: asyncio.Handle | None = None
        self._task = asyncio.get_running_loop().create_task(self._read_loop(link.rest))

    async def request(self, verb: str, payload: bytes | memoryview = b"",
                      **fields: Any) -> tuple[dict, memoryview]:
        if self._closed is not None:
            raise self._closed
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        frame = encode_frame({"t": verb, "id": rid, **fields}, payload)
        if self._credits:
            frame = [*self._credit_frame(), *frame]
        self.writer.writelines(frame)
        if self.writer.transport.get_write_buffer_size() > (1 << 20):
            await self.writer.drain()
        return await fut

    def cq(self, handle: int) -> _PushedCQ:
        """The local queue of pushed CQ ``handle`` (made on first use: its first "wc"
        frame may be read before the create_cq caller runs again)."""
        st = self.cqs.get(handle)
        if st is None:
            st = self.cqs[handle] = _PushedCQ()
        return st

    def credit(self, handle: int, n: int) -> None:
        """``n`` entries of pushed CQ ``handle`` were polled: return their room to the
        daemon, with the next request or at the loop's next turn, whichever is first.
        Sends nothing the caller waits for."""
        self._credits[handle] = self._credits.get(handle, 0) + n
        if self._credit_flush is None:
            self._credit_flush = asyncio.get_running_loop().call_soon(self._send_credits)

    def _credit_frame(self) -> list:
        credits = [[h, n] for h, n in self._credits.items()]
        self._credits.clear()
        out: list = []
        for i in range(0, len(credits), MAX_CREDITS):
            out += encode_frame({"t": "cq_credit", "id": 0, "credits": credits[i:i + MAX_CREDITS]})
        return out

    def _send_credits(self) -> None:
        self._credit_flush = None
        if self._credits and self._closed is None:
            with contextlib.suppress(Exception):
                self.writer.writelines(self._credit_frame())

    def forget_cq(self, handle: int) -> None:
        """A destroyed CQ: its unpolled entries and uncredited count go with it."""
        self.cqs.pop(handle, None)
        self._credits.pop(handle, None)

    async def _read_loop(self, frames: list) -> None:
        reason = RDMAError("ECONNRESET", f"the daemon at {self.address} closed the connection")
        try:
            while True:
                for fr in frames:
                    h = fr.header
                    t = h.get("t")
                    if t == "wc":
                        st = self.cq(h.get("cq"))
                        st.entries.extend(h.get("wcs", ()))
                        st.wake()
                        continue
                    if t == "event":
                        if self.events.qsize() >= EVENT_QUEUE:
                            self.events.get_nowait()
                            self.events_dropped += 1
                        self.events.put_nowait(Event(h.get("kind", "?"), h, bytes(fr.payload)))
                        continue
                    fut = self._pending.pop(h.get("id"), None)
                    if h.get("t") == "err":
                        err = RDMAError(h.get("errno", "EPROTO"), h.get("msg", "?"))
                        if fut is None:
                            reason = err    # a connection-level error: the daemon closes
                        elif not fut.done():
                            fut.set_exception(err)
                    elif fut is not None and not fut.done():
                        fut.set_result((h, fr.payload))
                frames = await read_frames(self.reader, self.decoder)
                if not frames:
                    break
        except (ConnectionError, RDMAError) as e:
            reason = e if isinstance(e, RDMAError) else RDMAError("ECONNRESET", str(e))
        finally:
            self._closed = reason
            self.events.put_nowait(None)        # ends a subscription's iteration
            for st in self.cqs.values():
                st.wake()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(reason)
            self._pending.clear()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
            await self.writer.wait_closed()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


class _PushedCQ:
    """What the daemon pushed for one CQ (its WCs in wire form, oldest first), and the
    polls waiting for more."""

    __slots__ = ("entries", "waiters")

    def __init__(self) -> None:
        self.entries: deque = deque()
        self.waiters: list[asyncio.Future] = []

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)


async def connect(address: str, token: bytes | str | None = None, *,
                  timeout: float = 10.0) -> Node:
    """A control session with the daemon at ``host:port``; ``token`` when it requires one.

    ``address`` is ``"host:port"`` (``"[v6addr]:port"``; the port defaults to 4791);
    ``token`` (bytes or str) answers the daemon's challenge, never sent itself. Every
    step is bounded by ``timeout`` seconds (default 10). Returns a Node.

    Errors: an unreachable address raises RDMAError rather than hanging, with the
    errno that happened: ECONNREFUSED, EHOSTUNREACH, ENETUNREACH, ETIMEDOUT
    (EHOSTUNREACH "cannot resolve host" for a failed lookup; ETIMEDOUT also for no
    handshake within ``timeout``); ECONNRESET when the daemon closes the connection
    during the handshake; EACCES when the daemon requires a token and none or a wrong
    one was given; EBUSY when it is at ``--max-connections``; EPROTO for a daemon
    speaking another protocol version.
    """
    host, port = split_address(address, DEFAULT_PORT)
    if isinstance(token, str):
        token = token.encode()
    link = await open_link(host, port, "control", token, timeout=timeout,
                           max_frame=CLIENT_MAX_FRAME)
    conn = _Connection(link, f"{host}:{port}")
    h = link.welcome
    node = Node(conn, host, port, list(h.get("devices", [])))
    # mr.write / mr.read chunks must fit the daemon's frame limit with room for the header.
    max_frame = h.get("max_frame")
    if isinstance(max_frame, int) and max_frame > 8192:
        node.io_chunk = min(IO_CHUNK, max_frame - 4096)
    return node


class _Closable:
    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class Faults:
    """Fault injection on the daemon's wire path (``node.faults``); see server/faults.py
    for the rule fields. A rule belongs to this session: it matches this session's QPs
    and goes when the session closes. ``daemon_wide=True`` installs one that matches
    every session's QPs and stays until cleared."""

    def __init__(self, node: Node) -> None:
        self._node = node

    async def add(self, rule: dict | None = None, *, daemon_wide: bool = False,
                  **fields: Any) -> dict:
        """Install a rule on the daemon's wire path: ``rule`` (a dict) and/or keyword
        ``fields`` (which win), such as ``action="corrupt", qp=..., opcode=...``;
        returns the rule as installed, with its ``id``. The rule belongs to this session
        (it matches this session's QPs and goes when the session closes) unless
        ``daemon_wide``.

        Errors: EINVAL naming the field when a field or value is not valid (the
        message lists the valid values, e.g. for ``action``); EPROTO for an empty rule
        or more than 32 fields; ENOMEM past the daemon's rule limit."""
        h, _ = await self._node.request("faults_add", rule={**(rule or {}), **fields},
                                        daemon_wide=daemon_wide)
        return h["rule"]

    async def list(self) -> list[dict]:
        """This session's rules and the daemon-wide ones, each with ``fired``: how often
        it changed a packet. Errors: only those of any request (ECONNRESET)."""
        h, _ = await self._node.request("faults_list")
        return h["rules"]

    async def clear(self, rule_id: int | None = None, *, daemon_wide: bool = False) -> int:
        """Remove rule ``rule_id``, or all of this session's rules when it is None (with
        ``daemon_wide``, the daemon-wide ones too); returns how many went. Errors: ENOENT
        when no rule ``rule_id`` exists."""
        fields: dict = {} if rule_id is None else {"rule_id": rule_id}
        h, _ = await self._node.request("faults_clear", daemon_wide=daemon_wide, **fields)
        return h["cleared"]


class Subscription:
    """``async for event in await node.subscribe("trace")``: events until the connection
    ends; ``next(timeout)`` returns None when nothing came in time."""

    def __init__(self, node: Node) -> None:
        self._q = node._conn.events

    def __aiter__(self):
        return self

    async def __anext__(self) -> Event:
        ev = await self._q.get()
        if ev is None:
            self._q.put_nowait(None)
            raise StopAsyncIteration
        return ev

    async def next(self, timeout: float) -> Event | None:
        """The next pushed Event, waiting up to ``timeout`` seconds; None when none came
        in time or the connection has ended. Sends nothing and raises nothing: events
        already received are read from this client's queue."""
        try:
            ev = await asyncio.wait_for(self._q.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if ev is None:
            self._q.put_nowait(None)
        return ev


class Node(_Closable):
    """A control session with one daemon (``connect`` / ``embedded``)."""

    def __init__(self, conn: _Connection, host: str, port: int, devices: list[str]) -> None:
        self._conn = conn
        self.host, self.port = host, port
        self.devices = devices
        self.daemon = None      # the Daemon object, for an embedded node
        self.faults = Faults(self)
        self.io_chunk = IO_CHUNK

    async def subscribe(self, *kinds: str, daemon_wide: bool = False) -> Subscription:
        """Have the daemon push events: "packets" (every packet it sends or accepts) and/or
        "trace" (every pipeline stage of every transfer), of this session's QPs, or with
        ``daemon_wide`` of every session's; a later call replaces the kinds. Returns a
        Subscription to iterate (``async for``) or ``next(timeout)``.

        Errors: EINVAL for a kind other than "packets" and "trace"; EPROTO for more
        than two kinds."""
        await self.request("subscribe", events=list(kinds), daemon_wide=daemon_wide)
        return Subscription(self)

    async def unsubscribe(self) -> None:
        """Stop the daemon pushing events to this session (subscribe to no kinds).
        Errors: only those of any request (ECONNRESET)."""
        await self.request("subscribe", events=[])

    async def counters(self) -> dict[str, int]:
        """The daemon's wire counters: packets sent and received, dropped for a bad
        integrity check, retransmitted, duplicates discarded, RNR retries, ...; and the
        transfers and layouts of signature MKEYs that were not whole protection blocks
        (``partial_block_*``, in all and per MKEY: docs/blocks.md). The counters are the
        daemon's, not this session's. Errors: only those of any request (ECONNRESET)."""
        h, _ = await self.request("counters")
        return h["counters"]

    @property
    def address(self) -> str:
        """The daemon's ``"host:port"``, as connected to."""
        return f"{self.host}:{self.port}"

    async def request(self, verb: str, payload: bytes | memoryview = b"", **fields: Any):
        """One raw control request: ``verb`` with its ``fields`` (and ``payload``, the
        bytes of ``mr_write``), as docs/protocol.md and protocol/control.py's REQUESTS
        give them. Returns ``(header, payload)`` of the "ok" reply. The verbs objects
        make these calls; applications do not need it.

        Errors: the verb's own; EPROTO for an unknown verb or field, a missing field, a
        wrong type or a value outside the field's bounds; ECONNRESET once the
        connection is gone."""
        return await self._conn.request(verb, payload, **fields)

    async def open_device(self, name: str = "mlx5_0") -> Context:
        """ibv_open_device(3): a Context of the daemon's device ``name`` (default
        "mlx5_0"; ``node.devices`` lists them).

        Errors: ENOENT when the daemon has no device of that name (the message lists
        those it has); ENOMEM when the session holds its ``--max-objects``."""
        h, _ = await self.request("open_device", name=name)
        return Context(self, h["ctx"], h["name"])

    async def close(self) -> None:
        """End the control session. The daemon destroys every object the session
        created, as when a process exits: QPs go to ERR (their WRs are flushed) and are
        destroyed, MRs deregistered, MKEYs and DEKs destroyed. Later calls on this node
        or its objects raise ECONNRESET. Never raises itself."""
        await self._conn.close()


class Context(_Closable):
    """ibv_context of one HCA."""

    def __init__(self, node: Node, handle: int, name: str) -> None:
        self.node, self.handle, self.name = node, handle, name
        # QPs of this context by handle, so that an async event names the QP object.
        self._qps: weakref.WeakValueDictionary[int, QP] = weakref.WeakValueDictionary()
        # And CQs, for IBV_EVENT_CQ_ERR's ``cq``.
        self._cqs: weakref.WeakValueDictionary[int, CQ] = weakref.WeakValueDictionary()

    async def get_async_event(self, timeout: float | None = None) -> AsyncEvent | None:
        """ibv_get_async_event(3): the context's oldest async event (e.g.
        IBV_EVENT_SQ_DRAINED with ``qp``), waiting up to ``timeout`` s (None, the
        default: until one comes; 0: do not wait); None when the time ran out.
        Acknowledge it with ``await event.ack()``.

        Errors: ENOENT after ``ctx.close()``; EPROTO for a negative ``timeout``."""
        while True:
            wait = 3600.0 if timeout is None else min(float(timeout), 3600.0)
            h, _ = await self.node.request("get_async_event", ctx=self.handle, timeout=wait)
            ev = h["event"]
            if ev is not None:
                return AsyncEvent(self, ev["event"], EventType(ev["event_type"]),
                                  self._qps.get(ev.get("qp")), ev.get("qp_num"),
                                  self._cqs.get(ev.get("cq")))
            if timeout is not None:
                return None

    async def query_device(self) -> dict:
        """ibv_query_device(3): a dict of struct ibv_device_attr's fields (``fw_ver``,
        ``vendor_id``, ``vendor_part_id``, ``max_qp``, ``max_qp_wr``, ``max_msg_sz``,
        ``max_sge``, ``max_cqe``, ``max_mr_size``, ``max_pd``, ``max_qp_rd_atom``,
        ``phys_port_cnt``, ``node_guid``), with the daemon's limits.

        Errors: ENOENT after ``ctx.close()``."""
        h, _ = await self.node.request("query_device", ctx=self.handle)
        return h["attr"]

    async def alloc_pd(self) -> PD:
        """ibv_alloc_pd(3): a new protection domain of this context.

        Errors: ENOENT after ``ctx.close()``; ENOMEM when the session holds its
        ``--max-objects``."""
        h, _ = await self.node.request("alloc_pd", ctx=self.handle)
        return PD(self, h["pd"])

    async def create_cq(self, cqe: int = 100) -> CQ:
        """ibv_create_cq(3): a completion queue sized for ``cqe`` completions (default
        100). A CQ that holds more counts an overrun; nothing is dropped.

        Errors: EINVAL when ``cqe`` is outside 1 .. max_cqe (2^22); EPROTO when it does
        not fit a C int; ENOENT after ``ctx.close()``; ENOMEM when the session holds
        its ``--max-objects``."""
        h, _ = await self.node.request("create_cq", ctx=self.handle, cqe=cqe, push=True)
        cq = CQ(self, h["cq"], cqe, pushed=bool(h.get("push")))
        self._cqs[cq.handle] = cq
        return cq

    async def create_dek(self, attr: DEKInitAttr, **fields: Any) -> DEK:
        """mlx5dv_dek_create(3): a DEK (AES-XTS data encryption key) from ``attr``, an
        Mlx5DEKInitAttr: ``pd`` (a PD of this context, required), ``key_size``
        (MLX5DV_CRYPTO_KEY_SIZE_256 by default, or _128), ``key`` (key1 || key2: 64 or
        32 bytes plaintext), ``has_keytag``/``keytag``, ``opaque``. ``fields`` (e.g.
        ``crypto_login=login_obj, comp_mask=MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN``)
        override attr's fields. The key is plaintext or wrapped as the device's import
        method and the login say (docs/crypto-import.md).

        The DEK is used through an MKEY's crypto setter (``Mlx5CryptoAttr(dek=...)``),
        whose ``initial_tweak`` is 16 little-endian bytes: data unit k of the MKEY
        (counted from its offset 0) is processed with tweak initial_tweak + k, as
        ``cryptography``'s ``modes.XTS((t0 + k).to_bytes(16, "little"))`` does;
        docs/api.md, "First things to know", has the three-line check.

        Errors: EINVAL when ``attr.pd`` is not a PD of this context or of its device,
        ``crypto_login`` is not a CryptoLogin of this context, ``key_size`` is not _128
        or _256, the key is not 32 / 64 bytes (plus an 8-byte keytag when
        ``has_keytag``), its two halves are equal, the keytag is not 8 bytes,
        ``key_purpose`` is not AES_XTS, ``comp_mask`` has bits other than
        MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN, or a wrapped-import device gets a key
        outside a valid crypto login (or one that does not unwrap); EPROTO for a key
        over 128 bytes; ENOMEM at the device's log_max_num_deks or the session's
        ``--max-objects``; ENOENT for a closed PD or login. A name in ``fields`` that
        Mlx5DEKInitAttr lacks raises TypeError."""
        if fields:
            attr = dataclasses.replace(attr, **fields)
        pd = attr.pd
        if not isinstance(pd, PD):
            raise RDMAError("EINVAL", "mlx5dv_dek_create needs attr.pd, a PD of this context")
        login = attr.crypto_login
        if login is not None and not isinstance(login, CryptoLogin):
            raise RDMAError("EINVAL", "crypto_login must be a CryptoLogin from "
                                      "ctx.create_crypto_login() or None")
        h, _ = await self.node.request(
            "create_dek", ctx=self.handle, pd=pd.handle, key_size=int(attr.key_size),
            key=bytes(attr.key), has_keytag=bool(attr.has_keytag), keytag=bytes(attr.keytag),
            key_purpose=int(attr.key_purpose), opaque=bytes(attr.opaque),
            comp_mask=int(attr.comp_mask), crypto_login=login.handle if login else 0)
        return DEK(self, h["dek"])

    async def query_mlx5_device(self) -> dict:
        """mlx5dv_query_device(3): a dict with ``version``, ``flags``, ``comp_mask`` and
        ``crypto_caps`` (failed_selftests, crypto_engines, wrapped_import_method,
        log_max_num_deks, flags) as struct mlx5dv_crypto_caps.

        Errors: ENOENT after ``ctx.close()``."""
        h, _ = await self.node.request("query_mlx5_device", ctx=self.handle)
        return h["attr"]

    async def crypto_login(self, credential: bytes, import_kek_id: int, *,
                           credential_id: int = 0, comp_mask: int = 0) -> None:
        """mlx5dv_crypto_login(3): a crypto login session on this context, with the
        wrapped ``credential`` (48 bytes), ``import_kek_id`` and ``credential_id``
        (default 0) the device stores (docs/crypto-import.md); ``comp_mask`` must be 0.
        Returns None; the session lasts until ``crypto_logout`` or ``ctx.close()``.

        Errors: EEXIST when the context has a login session; EINVAL for a credential,
        credential_id, import_kek_id or comp_mask the device does not accept;
        EOPNOTSUPP on a device in plaintext import method."""
        await self.node.request("crypto_login", ctx=self.handle, credential=bytes(credential),
                                import_kek_id=int(import_kek_id),
                                credential_id=int(credential_id), comp_mask=int(comp_mask))

    async def query_login_state(self) -> CryptoLoginState:
        """mlx5dv_crypto_login_query_state(3): the context's login session state,
        MLX5DV_CRYPTO_LOGIN_STATE_VALID or _NO_LOGIN (no session).

        Errors: ENOENT after ``ctx.close()``."""
        h, _ = await self.node.request("crypto_login_query_state", ctx=self.handle)
        return CryptoLoginState(h["state"])

    async def crypto_logout(self) -> None:
        """mlx5dv_crypto_logout(3): end the context's crypto login session.

        Errors: ENOENT when the context has no login session."""
        await self.node.request("crypto_logout", ctx=self.handle)

    async def create_crypto_login(self, credential: bytes, import_kek_id: int, *,
                                  credential_id: int = 0, comp_mask: int = 0) -> CryptoLogin:
        """mlx5dv_crypto_login_create(3): a CryptoLogin object of this context, for
        ``create_dek(..., crypto_login=obj, comp_mask=MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN)``.
        Arguments as ``crypto_login``.

        Errors: EEXIST when the context already has a login object (one per context);
        EINVAL and EOPNOTSUPP as ``crypto_login``."""
        h, _ = await self.node.request("create_crypto_login", ctx=self.handle,
                                       credential=bytes(credential),
                                       import_kek_id=int(import_kek_id),
                                       credential_id=int(credential_id),
                                       comp_mask=int(comp_mask))
        return CryptoLogin(self, h["login"])

    async def close(self) -> None:
        """ibv_close_device(3): close this context handle; its crypto login sessions and
        objects end with it. PDs, CQs, QPs and the rest created through it are not
        affected (they go when the session closes).

        Errors: ENOENT when already closed."""
        await self.node.request("close_device", ctx=self.handle)


class PD(_Closable):
    """ibv_pd: a protection domain (``await ctx.alloc_pd()``); MRs, QPs, MKEYs and DEKs
    are created in one. Attributes: ``ctx``, ``node``."""

    def __init__(self, ctx: Context, handle: int) -> None:
        self.ctx, self.handle = ctx, handle

    @property
    def node(self) -> Node:
        """The Node (control session) the PD's context belongs to."""
        return self.ctx.node

    async def reg_mr(self, length: int, access: int = AccessFlags.LOCAL_WRITE) -> MR:
        """ibv_reg_mr(3): ``length`` zeroed bytes of the daemon's host memory,
        registered with ``access`` (IBV_ACCESS_* flags; default IBV_ACCESS_LOCAL_WRITE).
        Returns an MR with ``addr``, ``lkey``, ``rkey``.

        Errors: EINVAL when ``length`` is 0, ``access`` has bits outside LOCAL_WRITE |
        REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC, or REMOTE_WRITE / REMOTE_ATOMIC
        comes without LOCAL_WRITE; EPROTO for a negative ``length``; ENOMEM when the
        session's ``--max-session-bytes`` or the daemon's ``--max-daemon-bytes`` would
        be exceeded, or the session holds its ``--max-objects``."""
        h, _ = await self.node.request("reg_mr", pd=self.handle, length=length,
                                       access=int(access))
        return MR(self, h["mr"], h["lkey"], h["rkey"], h["addr"], h["length"])

    async def create_qp(self, init_attr: QPInitAttr) -> QP:
        """ibv_create_qp(3) / mlx5dv_create_qp(3): an RC QP in RESET from ``init_attr``
        (QPInitAttr: ``scq`` and ``rcq`` required, ``cap``, ``sq_sig_all``,
        ``send_ops_flags``, ``create_flags``). A QP that will configure MKEYs
        (``wr_mkey_configure``, ``post_mkey_configure``) must be created with
        ``send_ops_flags=MLX5DV_QP_EX_WITH_MKEY_CONFIGURE``; without it the configure's
        ``wr_complete`` raises EOPNOTSUPP. Connect it with ``qp.connect(peer.info())``.

        Errors: EINVAL when ``scq`` or ``rcq`` is not a CQ, or ``cap.max_send_wr`` /
        ``max_recv_wr`` exceeds the device's max_qp_wr; EOPNOTSUPP for a ``qp_type``
        other than IBV_QPT_RC, or ``create_flags`` other than
        MLX5DV_QP_CREATE_SIG_PIPELINING and _DISABLE_SCATTER_TO_CQE; EPROTO for a cap
        outside its range (``max_send_sge`` over 32, ``max_send_wr`` 0 or over 65536,
        ...); ENOENT for a closed CQ; ENOMEM when the session holds its
        ``--max-objects``."""
        a = init_attr
        if not isinstance(a.scq, CQ) or not isinstance(a.rcq, CQ):
            raise RDMAError("EINVAL", "QPInitAttr needs scq and rcq (CQs of this context)")
        h, _ = await self.node.request(
            "create_qp", pd=self.handle, scq=a.scq.handle, rcq=a.rcq.handle,
            qp_type=int(a.qp_type), max_send_wr=a.cap.max_send_wr,
            max_recv_wr=a.cap.max_recv_wr, max_send_sge=a.cap.max_send_sge,
            max_recv_sge=a.cap.max_recv_sge, max_inline_data=a.cap.max_inline_data,
            sq_sig_all=bool(a.sq_sig_all), send_ops_flags=int(a.send_ops_flags),
            create_flags=int(a.create_flags))
        return QP(self, h["qp"], h["qp_num"], init_attr)

    async def create_mkey(self, create_flags: int, max_entries: int = 1) -> MKey:
        """mlx5dv_create_mkey(3): an indirect MKEY with ``create_flags``
        (MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT, required, plus BLOCK_SIGNATURE for a
        signature setter, CRYPTO for a crypto setter, REMOTE_INVALIDATE for
        SEND_WITH_INV, UPDATE_TAG accepted without effect) and room for
        ``max_entries`` layout entries (default 1). It is free until a configure WR
        (``qp.post_mkey_configure``) gives it a layout.

        Errors: EINVAL without INDIRECT, for unknown flag bits, or ``max_entries`` 0;
        EPROTO for ``max_entries`` over 65536; ENOMEM when the session holds its
        ``--max-objects``."""
        h, _ = await self.node.request("create_mkey", pd=self.handle,
                                       create_flags=int(create_flags), max_entries=max_entries)
        return MKey(self, h["mkey"], h["lkey"], h["rkey"])

    async def close(self) -> None:
        """ibv_dealloc_pd(3).

        Errors: EBUSY while an MR, MKEY, QP or DEK of the PD exists; ENOENT when
        already deallocated."""
        await self.node.request("dealloc_pd", pd=self.handle)


class MR(_Closable):
    """A registered region of the daemon's host memory; write/read are the CPU's stores."""

    def __init__(self, pd: PD, handle: int, lkey: int, rkey: int, addr: int, length: int) -> None:
        self.pd, self.handle = pd, handle
        self.lkey, self.rkey, self.addr, self.length = lkey, rkey, addr, length

    async def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        """The CPU storing ``data`` (any bytes-like) at byte ``offset`` (default 0) of
        the MR; large writes go in chunks below the daemon's frame limit. Returns None.

        Errors: EINVAL when ``offset + len(data)`` leaves the MR; EPROTO for a negative
        ``offset``; ENOENT after ``mr.close()``."""
        view = memoryview(data).cast("B")
        chunk = self.pd.node.io_chunk
        for start in range(0, max(len(view), 1), chunk):
            await self.pd.node.request("mr_write", view[start:start + chunk], mr=self.handle,
                                       offset=offset + start)

    async def read(self, length: int | None = None, offset: int = 0) -> bytes:
        """The CPU loading ``length`` bytes from byte ``offset`` (default 0) of the MR;
        ``length`` None (the default) reads to the MR's end. Returns bytes.

        Errors: EINVAL when the range leaves the MR; EPROTO for a negative ``offset``
        or ``length`` (an ``offset`` past the end with ``length`` None); ENOENT after
        ``mr.close()``."""
        if length is None:
            length = self.length - offset
        parts = []
        chunk = self.pd.node.io_chunk
        for start in range(0, max(length, 1), chunk):
            n = min(chunk, length - start)
            _, payload = await self.pd.node.request("mr_read", mr=self.handle,
                                                    offset=offset + start, length=n)
            parts.append(payload)
        return b"".join(parts)

    async def close(self) -> None:
        """ibv_dereg_mr(3): the memory goes; traffic through an MKEY whose layout names
        the MR then fails.

        Errors: ENOENT when already deregistered."""
        await self.pd.node.request("dereg_mr", mr=self.handle)


class CQ(_Closable):
    """ibv_cq: a completion queue (``await ctx.create_cq(cqe)``). Attributes: ``ctx``,
    ``cqe``."""

    def __init__(self, ctx: Context, handle: int, cqe: int, *, pushed: bool = False) -> None:
        self.ctx, self.handle, self.cqe = ctx, handle, cqe
        # The daemon pushes this CQ's completions: poll answers from them locally.
        self._pushed = ctx.node._conn.cq(handle) if pushed else None
        self._destroyed = False

    async def poll(self, num_entries: int = 1, timeout: float = 0.0) -> list[WC]:
        """ibv_poll_cq(3): a list of up to ``num_entries`` (default 1) WC. With
        ``timeout`` > 0 (seconds; default 0, do not wait) and the CQ empty, it waits
        until a completion arrives or the time is up (no busy-polling); an empty list
        means none came.

        The daemon pushes a CQ's completions to this client as it makes them, so a
        poll answers from those already received and sends no request (it only
        returns their room to the daemon, without waiting). A completion the daemon
        made before the reply of a call already returned (a post in ERR flushed, say)
        is always there; one made since (the peer's ACK) is there once it arrived.
        Completions received before the connection ended are still returned.

        Errors: EPROTO when ``num_entries`` is outside 1 .. 65536 or ``timeout``
        outside 0 .. 3600; ENOENT after ``cq.close()``; ECONNRESET once the
        connection is gone and no received completion is left."""
        st = self._pushed
        if st is None:
            h, _ = await self.ctx.node.request("poll_cq", cq=self.handle, num=num_entries,
                                               timeout=timeout)
            return [WC.from_wire(w) for w in h["wcs"]]
        if (not isinstance(num_entries, int) or isinstance(num_entries, bool)
                or not 1 <= num_entries <= 1 << 16):
            raise RDMAError("EPROTO", f"poll_cq: num must be an integer in [1, 65536], got "
                                      f"{num_entries!r}"[:160])
        if (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                or not 0 <= timeout <= 3600):
            raise RDMAError("EPROTO", f"poll_cq: timeout must be a number in [0, 3600], got "
                                      f"{timeout!r}"[:160])
        if self._destroyed:
            raise RDMAError("ENOENT", f"handle {self.handle} is not a cq of this session")
        conn = self.ctx.node._conn
        if not st.entries:
            if conn._closed is not None:
                raise conn._closed
            # Even without waiting, the loop gets one turn, so that a loop of polls
            # lets the read loop take in what has arrived (a busy-poll never starves it).
            await self._wait(st, conn, timeout)
        q = st.entries
        n = min(num_entries, len(q))
        if not n:
            if conn._closed is not None:
                raise conn._closed
            if self._destroyed:
                raise RDMAError("ENOENT", f"handle {self.handle} is not a cq of this session")
            return []
        out = [WC.from_wire(q.popleft()) for _ in range(n)]
        conn.credit(self.handle, n)
        return out

    async def _wait(self, st: _PushedCQ, conn: _Connection, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        if timeout <= 0:
            await asyncio.sleep(0)
            return
        now = loop.time()
        deadline, hold_at = now + timeout, now + HOLD_AFTER_S
        held: asyncio.Future | None = None
        while not st.entries and conn._closed is None and not self._destroyed:
            now = loop.time()
            if now >= deadline:
                return
            if held is None and now >= hold_at:
                # Waited a moment and still nothing: the wait is held on the daemon too
                # (a poll_cq on a pushed CQ returns no entries and ends when the next
                # completion is pushed), so it counts against the daemon's max_waits as
                # a waiting poll always has. The completion itself comes as a "wc" frame.
                held = asyncio.ensure_future(conn.request(
                    "poll_cq", cq=self.handle, num=1, timeout=min(deadline - now, 3600)))
                held.add_done_callback(_retrieve)
            elif held is not None and held.done():
                held.result()       # the daemon refused the wait (ENOMEM): raise it
                return              # it ended: a completion came (and was taken) or time is up
            fut = loop.create_future()
            st.waiters.append(fut)
            timer = loop.call_at(deadline if held is not None else min(deadline, hold_at),
                                 _resolve, fut)
            if held is not None:
                held.add_done_callback(lambda _h, fut=fut: _resolve(fut))
            try:
                await fut
            finally:
                timer.cancel()


    async def poll_n(self, n: int, timeout: float = 10.0) -> list[WC]:
        """Exactly ``n`` completions, polling up to ``timeout`` seconds (default 10) in
        all. Errors: ETIMEDOUT when fewer came in time (the message shows the last
        ones that did; those are consumed); the errors of ``poll``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[WC] = []
        while len(out) < n:
            left = deadline - loop.time()
            if left <= 0:
                raise RDMAError("ETIMEDOUT", f"{len(out)} of {n} completions within "
                                             f"{timeout:g} s: {out[-4:]}")
            out += await self.poll(min(n - len(out), 4096), timeout=left)
        return out

    async def close(self) -> None:
        """ibv_destroy_cq(3).

        Errors: EBUSY while a QP uses the CQ; ENOENT when already destroyed."""
        await self.ctx.node.request("destroy_cq", cq=self.handle)
        if self._pushed is not None:
            # Its unpolled completions go with it, as ibv_destroy_cq(3)'s do.
            self._destroyed = True
            self.ctx.node._conn.forget_cq(self.handle)
            self._pushed.wake()


def _retrieve(fut: asyncio.Future) -> None:
    """A held poll's reply nobody waits for any more: read its outcome, so that asyncio
    does not report an exception never retrieved."""
    if not fut.cancelled():
        fut.exception()


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class MKey(_Closable):
    """mlx5dv_mkey: an indirect key (``await pd.create_mkey(...)``), configured by a QP's
    configure WR. Attributes: ``pd``, ``lkey``, ``rkey`` (equal). On an MKEY an SGE's
    ``addr`` is an offset from 0, not an address."""

    def __init__(self, pd: PD, handle: int, lkey: int, rkey: int) -> None:
        self.pd, self.handle, self.lkey, self.rkey = pd, handle, lkey, rkey

    async def mkey_check(self) -> MkeyErr:
        """mlx5dv_mkey_check(3): the signature error this MKEY latched, cleared by
        reading it (a second call gives NO_ERR). Returns MkeyErr(err_type, sig_err):
        ``err_type`` MLX5DV_MKEY_NO_ERR or _SIG_BLOCK_BAD_GUARD / _BAD_REFTAG /
        _BAD_APPTAG, ``sig_err`` SigErr(actual_value, expected_value, offset). Call it
        on the MKEY that did the checking, once its transfer is known to be finished
        (for a remote MKEY, after the peer says so: a failed check is not a completion
        error).

        An MKEY created with MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE answers even
        when no signature is configured (yet, or any more): NO_ERR.

        Errors: EINVAL when the MKEY was created without
        MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE: mlx5's provider allocates the
        signature context mkey_check reads only for such an MKEY, so there is nothing
        to check. ENOENT after ``mkey.close()``."""
        h, _ = await self.pd.node.request("mkey_check", mkey=self.handle)
        return MkeyErr(MkeyErrType(h["err_type"]),
                       SigErr(h["actual_value"], h["expected_value"], h["offset"]))

    async def close(self) -> None:
        """mlx5dv_destroy_mkey(3): later traffic through its key fails.

        Errors: ENOENT when already destroyed."""
        await self.pd.node.request("destroy_mkey", mkey=self.handle)


@dataclass
class AsyncEvent:
    """struct ibv_async_event: ``event_type`` and the QP it is about (``qp``, the QP
    object of this context, and ``qp_num``), or the CQ (``cq``, IBV_EVENT_CQ_ERR)."""

    ctx: Context
    id: int
    event_type: EventType
    qp: QP | None = None
    qp_num: int | None = None
    cq: CQ | None = None

    async def ack(self) -> None:
        """ibv_ack_async_event(3): acknowledge this event. Returns None.

        Errors: EINVAL when it was already acknowledged."""
        await self.ctx.node.request("ack_async_event", event=self.id)


class CryptoLogin(_Closable):
    """mlx5dv_crypto_login_obj (``await ctx.create_crypto_login(...)``): a crypto login
    object for wrapped DEK import (docs/crypto-import.md)."""

    def __init__(self, ctx: Context, handle: int) -> None:
        self.ctx, self.handle = ctx, handle

    async def query_state(self) -> CryptoLoginState:
        """mlx5dv_crypto_login_query(3): the object's state,
        MLX5DV_CRYPTO_LOGIN_STATE_VALID (or another MLX5DV_CRYPTO_LOGIN_STATE_*).

        Errors: ENOENT after ``login.close()`` or ``ctx.close()``."""
        h, _ = await self.ctx.node.request("crypto_login_query", login=self.handle)
        return CryptoLoginState(h["state"])

    async def close(self) -> None:
        """mlx5dv_crypto_login_destroy(3).

        Errors: ENOENT when already destroyed (or its context closed)."""
        await self.ctx.node.request("destroy_crypto_login", login=self.handle)


class DEK(_Closable):
    """mlx5dv_dek: a data encryption key (``await ctx.create_dek(attr)``), given to an
    MKEY's crypto setter as ``Mlx5CryptoAttr(dek=...)``."""

    def __init__(self, ctx: Context, handle: int) -> None:
        self.ctx, self.handle = ctx, handle

    async def query(self) -> tuple[DekState, bytes]:
        """mlx5dv_dek_query(3): ``(state, opaque)``, state an MLX5DV_DEK_STATE_*, opaque
        the 8 bytes given at creation.

        Errors: EINVAL for a wrapped DEK queried without a valid crypto login (a
        session, or a login object of this session on the DEK's device); ENOENT after
        ``dek.close()``."""
        h, _ = await self.ctx.node.request("query_dek", dek=self.handle)
        return DekState(h["state"]), bytes(h["opaque"])

    async def close(self) -> None:
        """mlx5dv_dek_destroy(3): an MKEY still configured with it then fails its
        traffic.

        Errors: ENOENT when already destroyed."""
        await self.ctx.node.request("destroy_dek", dek=self.handle)


class QP(_Closable):
    """An RC QP (ibv_qp_ex with mlx5dv's MKEY-configure WR builder)."""

    def __init__(self, pd: PD, handle: int, qp_num: int, init_attr: QPInitAttr) -> None:
        self.pd, self.handle, self.qp_num, self.init_attr = pd, handle, qp_num, init_attr
        pd.ctx._qps[handle] = self
        self.sq_sig_all = bool(init_attr.sq_sig_all)
        self.wr_id = 0
        self.wr_flags = 0
        self._calls: list[list] | None = None
        self._outside = False

    @property
    def node(self) -> Node:
        """The Node (control session) the QP belongs to."""
        return self.pd.node

    def info(self, psn: int = 0) -> QPInfo:
        """What a peer needs to connect to this QP: QPInfo(host, port, dev, qp_num,
        psn), ``psn`` the first PSN this QP will expect (default 0). Not awaited;
        sends nothing and raises nothing."""
        return QPInfo(self.node.host, self.node.port, self.pd.ctx.name, self.qp_num, psn)

    # -- ibv_modify_qp -----------------------------------------------------------------
    async def modify(self, attr: QPAttr, mask: int = 0) -> int:
        """ibv_modify_qp(3) to ``attr.qp_state`` with the fields ``attr`` has (the ones
        not None); ``mask`` (IBV_QP_* bits, default 0) adds bits for fields it does
        not carry. Returns the new state. Transitions: RESET -> INIT -> RTR -> RTS,
        INIT -> INIT, RTS -> RTS, RTS <-> SQD, SQD -> SQD, and RESET or ERR from any
        state (ERR flushes every outstanding WR; RESET empties the queues). All is
        checked before anything changes.

        Errors: EINVAL without ``qp_state``, for a transition that does not exist
        (ERR -> RTS, RESET -> RTR, to SQE, ...), a required attribute missing
        (``to_rtr`` without ``dest_qp_num``, ``rq_psn`` or the peer's address), an
        attribute the transition does not take, ``dest_host`` without ``dest_port``,
        a ``mask`` bit whose field has no value, ``cur_qp_state`` not the QP's state;
        EOPNOTSUPP for alternate path or path migration bits; EPROTO for a field
        outside its width (``path_mtu`` outside 1..5, a PSN over 24 bits,
        ``retry_cnt`` over 7, ...); ENOENT after ``qp.close()``."""
        h, _ = await self.node.request("modify_qp", qp=self.handle, attr=attr.to_wire(),
                                       mask=mask)
        return h["state"]

    async def to_init(self, attr: QPAttr | None = None) -> None:
        """``modify`` to INIT, with ``attr``'s other fields (default none).
        Errors: as ``modify`` (EINVAL from a state other than RESET or INIT)."""
        attr = dataclasses.replace(attr or QPAttr(), qp_state=QpState.INIT)
        await self.modify(attr)

    async def to_rtr(self, attr: QPAttr) -> None:
        """``modify`` to RTR; ``attr`` needs ``dest_qp_num``, ``rq_psn``, ``path_mtu``,
        ``dest_host`` and ``dest_port`` (``dest_dev`` defaults to this QP's device).
        Errors: as ``modify`` (EINVAL from a state other than INIT, or a required
        field missing)."""
        await self.modify(dataclasses.replace(attr, qp_state=QpState.RTR))

    async def to_rts(self, attr: QPAttr | None = None) -> None:
        """``modify`` to RTS, with ``attr``'s other fields (``sq_psn``, ``timeout``,
        ``retry_cnt``, ``rnr_retry``; default none, the QP keeps its values).
        Errors: as ``modify`` (EINVAL from a state other than RTR, RTS or SQD)."""
        await self.modify(dataclasses.replace(attr or QPAttr(), qp_state=QpState.RTS))

    async def query(self) -> dict:
        """ibv_query_qp(3): a dict with ``qp_state``, ``qp_num``, ``dest_qp_num``,
        ``path_mtu``, ``timeout``, ``retry_cnt``, ``rnr_retry``, ``sq_sig_all`` and
        ``dest`` ([host, port, dev] of the peer, or None).

        Errors: ENOENT after ``qp.close()``."""
        h, _ = await self.node.request("query_qp", qp=self.handle)
        return h["attr"]

    async def connect(self, peer: QPInfo, path_mtu: int = Mtu.MTU_1024, *, sq_psn: int = 0,
                      timeout: int = 17, retry_cnt: int = 7, rnr_retry: int = 7,
                      min_rnr_timer: int = 12) -> None:
        """RESET -> INIT -> RTR -> RTS towards ``peer`` (``peer_qp.info()``). ``timeout`` is
        ibv_qp_attr's exponent (4.096 us * 2^timeout; 17 is about half a second, 0
        infinite); ``retry_cnt`` and ``rnr_retry`` are 3-bit counts (``rnr_retry`` 7
        retries forever); ``min_rnr_timer`` the IBTA RNR timer code (12 = 0.64 ms);
        ``path_mtu`` an IBV_MTU_* (default 1024); ``sq_psn`` this QP's first PSN.

        Errors: as ``modify`` at the step that failed (EINVAL when the QP is past
        INIT; EPROTO for a value outside its width); the earlier steps stay done."""
        await self.to_init()
        await self.to_rtr(QPAttr(path_mtu=path_mtu, dest_qp_num=peer.qp_num, rq_psn=peer.psn,
                                 dest_host=peer.host, dest_port=peer.port, dest_dev=peer.dev,
                                 min_rnr_timer=min_rnr_timer))
        await self.to_rts(QPAttr(sq_psn=sq_psn, timeout=timeout, retry_cnt=retry_cnt,
                                 rnr_retry=rnr_retry, min_rnr_timer=min_rnr_timer))

    async def cancel_posted_send_wrs(self, wr_id: int) -> int:
        """mlx5dv_qp_cancel_posted_send_wrs(3): in SQD, the not yet started WRs with
        ``wr_id`` become NOPs (completing as they were signaled); returns how many.

        Errors: EINVAL when the QP is not in SQD; EOPNOTSUPP when ``wr_id`` names a
        pending MKEY configure or LOCAL_INV (its effect is already applied); ENOENT
        after ``qp.close()``."""
        h, _ = await self.node.request("cancel_posted_send_wrs", qp=self.handle,
                                       wr_id=int(wr_id))
        return h["canceled"]

    # -- posting ------------------------------------------------------------------------
    async def post_send(self, wr: SendWR | Iterable[SendWR]) -> None:
        """ibv_post_send(3): one SendWR or a list, in order. With a list, the WRs before
        a refused one are posted and the rest are not (the message names the WR's index
        and ``wr_id``, as ``bad_wr`` would). A WR that fails later does not raise: it
        completes with an error status. In ERR a WR completes IBV_WC_WR_FLUSH_ERR.

        Errors: EINVAL when the QP is not in RTS or SQD (nor ERR), a WR has more SGEs
        than ``max_send_sge`` or moves more than the port's max_msg_sz, an opcode is
        not an ibv_wr_opcode, a ``*_WITH_IMM`` opcode lacks ``imm_data``, an atomic has
        not exactly one 8-byte SGE, IBV_SEND_INLINE is set on anything but SEND or
        RDMA_WRITE, exceeds ``max_inline_data`` or names memory outside an MR of the
        QP's PD; EOPNOTSUPP for IBV_WR_BIND_MW, TSO, DRIVER1; ENOMEM when the send queue
        holds ``max_send_wr`` WRs; EPROTO for a field over its C width (``imm_data``,
        ``rkey``) or more than 4096 WRs in one call; ENOENT after ``qp.close()``."""
        wrs = [wr] if isinstance(wr, SendWR) else list(wr)
        await self._post("post_send", [w.to_wire() for w in wrs])

    async def post_recv(self, wr: RecvWR | Iterable[RecvWR]) -> None:
        """ibv_post_recv(3): one RecvWR or a list, in order (those before a refused one
        are posted). In ERR a receive completes IBV_WC_WR_FLUSH_ERR.

        Errors: EINVAL when the QP is in RESET, or a WR has more SGEs than
        ``max_recv_sge``; ENOMEM when the receive queue holds ``max_recv_wr`` WRs;
        EPROTO for a malformed WR or more than 4096 in one call; ENOENT after
        ``qp.close()``."""
        wrs = [wr] if isinstance(wr, RecvWR) else list(wr)
        await self._post("post_recv", [w.to_wire() for w in wrs])

    async def _post(self, verb: str, wrs: list) -> None:
        # A long list goes as requests of MAX_WRS_PER_POST, in order, each after the one
        # before succeeded: as with ibv_post_send's bad_wr, the WRs before a refused
        # one are posted and none after it.
        for i in range(0, max(len(wrs), 1), MAX_WRS_PER_POST):
            await self.node.request(verb, qp=self.handle, wrs=wrs[i:i + MAX_WRS_PER_POST])

    # -- the WR builder (ibv_wr_start ... ibv_wr_complete) ------------------------------
    def wr_start(self) -> None:
        """ibv_wr_start(3): begin recording builder calls (``wr_mkey_configure`` and its
        setters) for one ``await qp.wr_complete()``. Not awaited; sends nothing."""
        self._calls = []
        self._outside = False

    def wr_abort(self) -> None:
        """ibv_wr_abort(3): drop the calls recorded since ``wr_start``; nothing is
        posted. Not awaited; sends nothing."""
        self._calls = None

    def _call(self, *call: Any) -> None:
        if self._calls is None:
            # A builder call before ibv_wr_start: ibv_wr_complete reports it.
            self._calls, self._outside = [], True
        self._calls.append(list(call))

    def wr_mkey_configure(self, mkey: MKey, num_setters: int,
                          attr: MkeyConfAttr | None = None) -> None:
        """mlx5dv_wr_mkey_configure(3): start a configure WR of ``mkey`` followed by
        exactly ``num_setters`` setter calls; ``attr`` an Mlx5MkeyConfAttr (default
        none: ``conf_flags`` 0, e.g. MLX5DV_MKEY_CONF_FLAG_RESET_SIG_ATTR). Uses
        ``qp.wr_id`` and ``qp.wr_flags`` as they are now; ``wr_flags`` must include
        IBV_SEND_INLINE. The QP must have been created with
        ``send_ops_flags=MLX5DV_QP_EX_WITH_MKEY_CONFIGURE``.

        Recorded, not sent: its errors are raised by ``wr_complete`` (EOPNOTSUPP for a
        QP without MLX5DV_QP_EX_WITH_MKEY_CONFIGURE, for ``wr_flags`` without
        IBV_SEND_INLINE, for unknown conf_flags or a nonzero comp_mask; EINVAL for an
        MKEY of another PD, or a setter count other than ``num_setters``)."""
        attr = attr or MkeyConfAttr()
        self._call("configure", int(self.wr_id), int(self.wr_flags), mkey.handle,
                   int(num_setters), int(attr.conf_flags), int(attr.comp_mask))

    def wr_set_mkey_access_flags(self, access_flags: int) -> None:
        """mlx5dv_wr_set_mkey_access_flags(3): the MKEY's IBV_ACCESS_* flags. Recorded;
        ``wr_complete`` raises EINVAL for flags outside LOCAL_WRITE | REMOTE_WRITE |
        REMOTE_READ | REMOTE_ATOMIC."""
        self._call("access_flags", int(access_flags))

    def wr_set_mkey_layout_list(self, sges: list[SGE]) -> None:
        """mlx5dv_wr_set_mkey_layout_list(3): the MKEY's memory is these SGEs (MR
        addresses and lkeys) in order. Recorded; ``wr_complete`` raises EINVAL for
        more SGEs than the MKEY's max_entries, an lkey that is not an MR of the QP's
        PD, or a range that leaves its MR."""
        self._call("layout_list", [sge_to_wire(s) for s in sges])

    def wr_set_mkey_layout_interleaved(self, repeat_count: int,
                                       data: list[MrInterleaved]) -> None:
        """mlx5dv_wr_set_mkey_layout_interleaved(3): ``data`` (Mlx5MrInterleaved
        entries: addr, bytes_count, bytes_skip, lkey) repeated ``repeat_count`` times.
        Recorded; ``wr_complete`` raises EINVAL when max_entries is below the entries
        plus one (the strided header), ``repeat_count`` is 0, or an entry leaves its
        MR."""
        self._call("layout_interleaved", [int(repeat_count), [attr_to_wire(d) for d in data]])

    def wr_set_mkey_sig_block(self, attr: SigBlockAttr) -> None:
        """mlx5dv_wr_set_mkey_sig_block(3): block signature (T10-DIF or CRC) in the
        memory and/or wire domain, from an Mlx5SigBlockAttr. Recorded;
        ``wr_complete`` raises EINVAL for an MKEY created without
        MLX5DV_MKEY_INIT_ATTR_FLAGS_BLOCK_SIGNATURE or an attribute the device
        refuses, EOPNOTSUPP for memory and wire block sizes it does not convert
        (semantics section 4.2 lists the rules)."""
        self._call("sig_block", attr_to_wire(attr))

    def wr_set_mkey_crypto(self, attr: CryptoAttr) -> None:
        """mlx5dv_wr_set_mkey_crypto(3): AES-XTS on the MKEY, from an Mlx5CryptoAttr
        (``dek``, ``encrypt_on_tx``, ``data_unit_size``, ``initial_tweak``, ...).
        ``initial_tweak`` is 16 little-endian bytes; data unit k, counted from the
        MKEY's offset 0, uses tweak initial_tweak + k (docs/api.md, "First things to
        know", checks it against ``cryptography``'s XTS in three lines). Recorded;
        ``wr_complete`` raises EINVAL for an MKEY created without
        MLX5DV_MKEY_INIT_ATTR_FLAGS_CRYPTO, a DEK that is unknown, not ready or of
        another PD, an ``initial_tweak`` not 16 bytes, or a field out of range; ENOENT
        for a closed DEK."""
        self._call("crypto", attr_to_wire(attr))

    async def wr_complete(self) -> None:
        """ibv_wr_complete(3): send the calls recorded since ``wr_start`` in one request;
        the daemon validates the whole batch and applies it whole, or raises and
        applies nothing. WRs posted after it returns see the new configuration; a
        signaled configure completes IBV_WC_DRIVER1.

        Errors: EINVAL when called without ``wr_start``, when a builder call was made
        before ``wr_start``, when the QP is not in RTS, and for every rule of
        semantics section 4.2 the setters break; EOPNOTSUPP when the QP was not
        created with MLX5DV_QP_EX_WITH_MKEY_CONFIGURE in ``send_ops_flags``, or
        ``wr_flags`` lacks IBV_SEND_INLINE; ENOENT for a closed QP, MKEY or DEK. The
        first rule broken, in call order, is reported."""
        calls, self._calls = self._calls, None
        if calls is None:
            raise RDMAError("EINVAL", "ibv_wr_complete called without ibv_wr_start")
        if self._outside:
            self._outside = False
            raise RDMAError("EINVAL", "a WR builder call was made outside ibv_wr_start")
        await self.node.request("mkey_configure", qp=self.handle, calls=calls)

    async def post_mkey_configure(self, mkey: MKey, *, access: int | None = None,
                                  sges: list[SGE] | None = None,
                                  interleaved: tuple[int, list[MrInterleaved]] | None = None,
                                  sig: SigBlockAttr | None = None,
                                  crypto: CryptoAttr | None = None, conf_flags: int = 0,
                                  wr_id: int = 0,
                                  wr_flags: int = SendFlags.INLINE) -> None:
        """One configure WR as mlx5dv_wr_mkey_configure(3)'s examples post it: ibv_wr_start,
        mlx5dv_wr_mkey_configure announcing one setter per attribute given, those setters,
        ibv_wr_complete. The engine's MkeyConfigureBuilder.post_configure, over the wire.
        ``access`` (IBV_ACCESS_*), ``sges`` (a layout list), ``interleaved``
        ((repeat_count, entries)), ``sig`` (Mlx5SigBlockAttr), ``crypto``
        (Mlx5CryptoAttr): None leaves that setter out; ``conf_flags`` goes in the
        MkeyConfAttr; ``wr_id`` and ``wr_flags`` (default IBV_SEND_INLINE) are the WR's.
        The QP must have been created with
        ``send_ops_flags=MLX5DV_QP_EX_WITH_MKEY_CONFIGURE``.

        Errors: those of ``wr_complete`` (EOPNOTSUPP without
        MLX5DV_QP_EX_WITH_MKEY_CONFIGURE or IBV_SEND_INLINE; EINVAL outside RTS or for a
        setter rule; ENOENT for a closed MKEY or DEK)."""
        records.build_configure_wr(self, mkey, access=access, sges=sges,
                                   interleaved=interleaved, sig=sig, crypto=crypto,
                                   conf_flags=conf_flags, wr_id=wr_id, wr_flags=wr_flags)
        await self.wr_complete()

    async def close(self) -> None:
        """ibv_destroy_qp(3): the QP goes to ERR (its WRs are flushed to the CQs) and is
        destroyed.

        Errors: ENOENT when already destroyed."""
        await self.node.request("destroy_qp", qp=self.handle)


# -- embedded daemons ------------------------------------------------------------------------

class embedded:  # noqa: N801 - a function-like async context manager, as docs/api.md spells it
    """``async with embedded() as node``: a daemon in this process on a loopback port, and
    a control session with it. Leaving the block closes both.

    ``crypto_config`` fixes the devices' crypto import method, KEK and credential
    (docs/crypto-import.md): a dict such as ``{"mode": "wrapped"}``, a JSON file's path
    or JSON text; without it, the environment variable SOFTHCA_CRYPTO_CONFIG (the
    same forms), else plaintext import. ``hcas`` names the devices (default
    ``("mlx5_0",)``), ``token`` the daemon's token, ``host`` its address;
    ``daemon_options`` go to server.daemon.Daemon (``max_frame=``, ``limits=``,
    ``strict_blocks=``).

    Errors: EINVAL for a crypto configuration that cannot be read or is not valid;
    those of ``connect`` if the session cannot be opened."""

    def __init__(self, hcas: tuple[str, ...] = ("mlx5_0",), *, token: bytes | None = None,
                 host: str = "127.0.0.1", crypto_config: Any = None,
                 **daemon_options: Any) -> None:
        self.hcas, self.token, self.host, self.options = hcas, token, host, daemon_options
        self.crypto_config = crypto_config
        self.daemon = None
        self.node: Node | None = None

    async def __aenter__(self) -> Node:
        from ..server.crypto_config import crypto_config_from_env, load_crypto_config
        from ..server.daemon import Daemon
        from ..server.logs import default_handler

        default_handler()
        try:
            crypto = (crypto_config_from_env() if self.crypto_config is None
                      else load_crypto_config(self.crypto_config))
        except ValueError as e:
            raise RDMAError("EINVAL", str(e)) from None
        self.daemon = Daemon(self.hcas, self.host, 0, self.token, crypto=crypto,
                             **self.options)
        await self.daemon.start()
        try:
            self.node = await connect(self.daemon.address, self.token)
        except BaseException:
            await self.daemon.close()
            raise
        self.node.daemon = self.daemon
        return self.node

    async def __aexit__(self, *exc) -> None:
        if self.node is not None:
            await self.node.close()
        if self.daemon is not None:
            await self.daemon.close()
