"""The client: pyverbs' objects and names, awaited (docs/api.md).

Every verbs call is one control request to the daemon and one reply; an error reply
raises RDMAError carrying the daemon's errno name and sentence, as pyverbs raises
PyverbsRDMAError. Requests on one connection are answered in order except a
``poll_cq`` that waits, so ``await qp.post_send(...)`` after ``await qp.wr_complete()``
sees the configured MKEY (docs/semantics.md: later WRs see a configure at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import weakref
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
from ..protocol.control import attr_to_wire, sge_to_wire
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
    """struct ibv_qp_cap"""

    max_send_wr: int = 1
    max_recv_wr: int = 10
    max_send_sge: int = 1
    max_recv_sge: int = 1
    max_inline_data: int = 0


@dataclass
class QPInitAttr:
    """struct ibv_qp_init_attr(_ex) with mlx5dv's send_ops_flags."""

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
        self._task = asyncio.get_running_loop().create_task(self._read_loop(link.rest))

    async def request(self, verb: str, payload: bytes | memoryview = b"",
                      **fields: Any) -> tuple[dict, memoryview]:
        if self._closed is not None:
            raise self._closed
        rid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        self.writer.writelines(encode_frame({"t": verb, "id": rid, **fields}, payload))
        if self.writer.transport.get_write_buffer_size() > (1 << 20):
            await self.writer.drain()
        return await fut

    async def _read_loop(self, frames: list) -> None:
        reason = RDMAError("ECONNRESET", f"the daemon at {self.address} closed the connection")
        try:
            while True:
                for fr in frames:
                    h = fr.header
                    if h.get("t") == "event":
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


async def connect(address: str, token: bytes | str | None = None, *,
                  timeout: float = 10.0) -> Node:
    """A control session with the daemon at ``host:port``; ``token`` when it requires one.

    Every step is bounded by ``timeout``: an unreachable address raises RDMAError
    (ETIMEDOUT or ECONNRESET) rather than hanging.
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
        """Install a rule (a dict, or keyword fields); returns it with its ``id``."""
        h, _ = await self._node.request("faults_add", rule={**(rule or {}), **fields},
                                        daemon_wide=daemon_wide)
        return h["rule"]

    async def list(self) -> list[dict]:
        """This session's rules and the daemon-wide ones, each with ``fired``: how often
        it changed a packet."""
        h, _ = await self._node.request("faults_list")
        return h["rules"]

    async def clear(self, rule_id: int | None = None, *, daemon_wide: bool = False) -> int:
        """Remove one rule, or all of this session's (with ``daemon_wide``, the
        daemon-wide ones too); returns how many went."""
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
        ``daemon_wide`` of every session's. Iterate the result."""
        await self.request("subscribe", events=list(kinds), daemon_wide=daemon_wide)
        return Subscription(self)

    async def unsubscribe(self) -> None:
        await self.request("subscribe", events=[])

    async def counters(self) -> dict[str, int]:
        """The daemon's wire counters: packets sent and received, dropped for a bad
        integrity check, retransmitted, duplicates discarded, RNR retries, ..."""
        h, _ = await self.request("counters")
        return h["counters"]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def request(self, verb: str, payload: bytes | memoryview = b"", **fields: Any):
        return await self._conn.request(verb, payload, **fields)

    async def open_device(self, name: str = "mlx5_0") -> Context:
        h, _ = await self.request("open_device", name=name)
        return Context(self, h["ctx"], h["name"])

    async def close(self) -> None:
        await self._conn.close()


class Context(_Closable):
    """ibv_context of one HCA."""

    def __init__(self, node: Node, handle: int, name: str) -> None:
        self.node, self.handle, self.name = node, handle, name
        # QPs of this context by handle, so that an async event names the QP object.
        self._qps: weakref.WeakValueDictionary[int, QP] = weakref.WeakValueDictionary()

    async def get_async_event(self, timeout: float | None = None) -> AsyncEvent | None:
        """ibv_get_async_event(3): the context's oldest async event (e.g.
        IBV_EVENT_SQ_DRAINED with ``qp``), waiting up to ``timeout`` s (None: until one
        comes); None when the time ran out. Acknowledge it with ``await event.ack()``."""
        while True:
            wait = 3600.0 if timeout is None else min(float(timeout), 3600.0)
            h, _ = await self.node.request("get_async_event", ctx=self.handle, timeout=wait)
            ev = h["event"]
            if ev is not None:
                return AsyncEvent(self, ev["event"], EventType(ev["event_type"]),
                                  self._qps.get(ev.get("qp")), ev.get("qp_num"))
            if timeout is not None:
                return None

    async def query_device(self) -> dict:
        h, _ = await self.node.request("query_device", ctx=self.handle)
        return h["attr"]

    async def alloc_pd(self) -> PD:
        h, _ = await self.node.request("alloc_pd", ctx=self.handle)
        return PD(self, h["pd"])

    async def create_cq(self, cqe: int = 100) -> CQ:
        h, _ = await self.node.request("create_cq", ctx=self.handle, cqe=cqe)
        return CQ(self, h["cq"], cqe)

    async def create_dek(self, attr: DEKInitAttr, **fields: Any) -> DEK:
        """mlx5dv_dek_create(3). ``fields`` (e.g. ``crypto_login=login_obj,
        comp_mask=MLX5DV_DEK_INIT_ATTR_CRYPTO_LOGIN``) override attr's fields. The key
        is plaintext or wrapped as the device's import method and the login say
        (docs/crypto-import.md)."""
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
        """mlx5dv_query_device(3): ``crypto_caps`` (failed_selftests, crypto_engines,
        wrapped_import_method, log_max_num_deks, flags) as struct mlx5dv_crypto_caps."""
        h, _ = await self.node.request("query_mlx5_device", ctx=self.handle)
        return h["attr"]

    async def crypto_login(self, credential: bytes, import_kek_id: int, *,
                           credential_id: int = 0, comp_mask: int = 0) -> None:
        """mlx5dv_crypto_login(3): a crypto login session on this context. EEXIST when one
        exists; EINVAL for a credential, credential_id or import_kek_id the device does not
        accept; EOPNOTSUPP on a device in plaintext import method."""
        await self.node.request("crypto_login", ctx=self.handle, credential=bytes(credential),
                                import_kek_id=int(import_kek_id),
                                credential_id=int(credential_id), comp_mask=int(comp_mask))

    async def query_login_state(self) -> CryptoLoginState:
        """mlx5dv_crypto_login_query_state(3): MLX5DV_CRYPTO_LOGIN_STATE_*."""
        h, _ = await self.node.request("crypto_login_query_state", ctx=self.handle)
        return CryptoLoginState(h["state"])

    async def crypto_logout(self) -> None:
        """mlx5dv_crypto_logout(3); ENOENT without a session."""
        await self.node.request("crypto_logout", ctx=self.handle)

    async def create_crypto_login(self, credential: bytes, import_kek_id: int, *,
                                  credential_id: int = 0, comp_mask: int = 0) -> CryptoLogin:
        """mlx5dv_crypto_login_create(3): one crypto login object per context (EEXIST)."""
        h, _ = await self.node.request("create_crypto_login", ctx=self.handle,
                                       credential=bytes(credential),
                                       import_kek_id=int(import_kek_id),
                                       credential_id=int(credential_id),
                                       comp_mask=int(comp_mask))
        return CryptoLogin(self, h["login"])

    async def close(self) -> None:
        await self.node.request("close_device", ctx=self.handle)


class PD(_Closable):
    def __init__(self, ctx: Context, handle: int) -> None:
        self.ctx, self.handle = ctx, handle

    @property
    def node(self) -> Node:
        return self.ctx.node

    async def reg_mr(self, length: int, access: int = AccessFlags.LOCAL_WRITE) -> MR:
        h, _ = await self.node.request("reg_mr", pd=self.handle, length=length,
                                       access=int(access))
        return MR(self, h["mr"], h["lkey"], h["rkey"], h["addr"], h["length"])

    async def create_qp(self, init_attr: QPInitAttr) -> QP:
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
        h, _ = await self.node.request("create_mkey", pd=self.handle,
                                       create_flags=int(create_flags), max_entries=max_entries)
        return MKey(self, h["mkey"], h["lkey"], h["rkey"])

    async def close(self) -> None:
        await self.node.request("dealloc_pd", pd=self.handle)


class MR(_Closable):
    """A registered region of the daemon's host memory; write/read are the CPU's stores."""

    def __init__(self, pd: PD, handle: int, lkey: int, rkey: int, addr: int, length: int) -> None:
        self.pd, self.handle = pd, handle
        self.lkey, self.rkey, self.addr, self.length = lkey, rkey, addr, length

    async def write(self, data: bytes | bytearray | memoryview, offset: int = 0) -> None:
        view = memoryview(data).cast("B")
        chunk = self.pd.node.io_chunk
        for start in range(0, max(len(view), 1), chunk):
            await self.pd.node.request("mr_write", view[start:start + chunk], mr=self.handle,
                                       offset=offset + start)

    async def read(self, length: int | None = None, offset: int = 0) -> bytes:
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
        await self.pd.node.request("dereg_mr", mr=self.handle)


class CQ(_Closable):
    def __init__(self, ctx: Context, handle: int, cqe: int) -> None:
        self.ctx, self.handle, self.cqe = ctx, handle, cqe

    async def poll(self, num_entries: int = 1, timeout: float = 0.0) -> list[WC]:
        """Up to ``num_entries`` completions. With ``timeout`` > 0 and the CQ empty, the
        daemon holds the reply until a completion arrives or the time is up (no
        busy-polling); an empty list means none came."""
        h, _ = await self.ctx.node.request("poll_cq", cq=self.handle, num=num_entries,
                                           timeout=timeout)
        return [WC.from_wire(w) for w in h["wcs"]]

    async def poll_n(self, n: int, timeout: float = 10.0) -> list[WC]:
        """Exactly ``n`` completions, waiting up to ``timeout`` in all; ETIMEDOUT otherwise,
        with the ones that did come in the message."""
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
        await self.ctx.node.request("destroy_cq", cq=self.handle)


class MKey(_Closable):
    """mlx5dv_mkey"""

    def __init__(self, pd: PD, handle: int, lkey: int, rkey: int) -> None:
        self.pd, self.handle, self.lkey, self.rkey = pd, handle, lkey, rkey

    async def mkey_check(self) -> MkeyErr:
        h, _ = await self.pd.node.request("mkey_check", mkey=self.handle)
        return MkeyErr(MkeyErrType(h["err_type"]),
                       SigErr(h["actual_value"], h["expected_value"], h["offset"]))

    async def close(self) -> None:
        await self.pd.node.request("destroy_mkey", mkey=self.handle)


@dataclass
class AsyncEvent:
    """struct ibv_async_event: ``event_type`` and the QP it is about (``qp``, the QP
    object of this context, and ``qp_num``)."""

    ctx: Context
    id: int
    event_type: EventType
    qp: QP | None = None
    qp_num: int | None = None

    async def ack(self) -> None:
        """ibv_ack_async_event(3); EINVAL when already acknowledged."""
        await self.ctx.node.request("ack_async_event", event=self.id)


class CryptoLogin(_Closable):
    """mlx5dv_crypto_login_obj"""

    def __init__(self, ctx: Context, handle: int) -> None:
        self.ctx, self.handle = ctx, handle

    async def query_state(self) -> CryptoLoginState:
        """mlx5dv_crypto_login_query(3)'s state."""
        h, _ = await self.ctx.node.request("crypto_login_query", login=self.handle)
        return CryptoLoginState(h["state"])

    async def close(self) -> None:
        await self.ctx.node.request("destroy_crypto_login", login=self.handle)


class DEK(_Closable):
    """mlx5dv_dek"""

    def __init__(self, ctx: Context, handle: int) -> None:
        self.ctx, self.handle = ctx, handle

    async def query(self) -> tuple[DekState, bytes]:
        """mlx5dv_dek_query(3): (state, opaque). A wrapped DEK needs a valid crypto login."""
        h, _ = await self.ctx.node.request("query_dek", dek=self.handle)
        return DekState(h["state"]), bytes(h["opaque"])

    async def close(self) -> None:
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
        return self.pd.node

    def info(self, psn: int = 0) -> QPInfo:
        return QPInfo(self.node.host, self.node.port, self.pd.ctx.name, self.qp_num, psn)

    # -- ibv_modify_qp -----------------------------------------------------------------
    async def modify(self, attr: QPAttr, mask: int = 0) -> int:
        h, _ = await self.node.request("modify_qp", qp=self.handle, attr=attr.to_wire(),
                                       mask=mask)
        return h["state"]

    async def to_init(self, attr: QPAttr | None = None) -> None:
        attr = dataclasses.replace(attr or QPAttr(), qp_state=QpState.INIT)
        await self.modify(attr)

    async def to_rtr(self, attr: QPAttr) -> None:
        await self.modify(dataclasses.replace(attr, qp_state=QpState.RTR))

    async def to_rts(self, attr: QPAttr | None = None) -> None:
        await self.modify(dataclasses.replace(attr or QPAttr(), qp_state=QpState.RTS))

    async def query(self) -> dict:
        h, _ = await self.node.request("query_qp", qp=self.handle)
        return h["attr"]

    async def connect(self, peer: QPInfo, path_mtu: int = Mtu.MTU_1024, *, sq_psn: int = 0,
                      timeout: int = 17, retry_cnt: int = 7, rnr_retry: int = 7,
                      min_rnr_timer: int = 12) -> None:
        """RESET -> INIT -> RTR -> RTS towards ``peer`` (``peer_qp.info()``). ``timeout`` is
        ibv_qp_attr's exponent (4.096 us * 2^timeout; 17 is about half a second)."""
        await self.to_init()
        await self.to_rtr(QPAttr(path_mtu=path_mtu, dest_qp_num=peer.qp_num, rq_psn=peer.psn,
                                 dest_host=peer.host, dest_port=peer.port, dest_dev=peer.dev,
                                 min_rnr_timer=min_rnr_timer))
        await self.to_rts(QPAttr(sq_psn=sq_psn, timeout=timeout, retry_cnt=retry_cnt,
                                 rnr_retry=rnr_retry, min_rnr_timer=min_rnr_timer))

    async def cancel_posted_send_wrs(self, wr_id: int) -> int:
        """mlx5dv_qp_cancel_posted_send_wrs(3): in SQD, the not yet started WRs with
        ``wr_id`` become NOPs; returns how many. EINVAL outside SQD."""
        h, _ = await self.node.request("cancel_posted_send_wrs", qp=self.handle,
                                       wr_id=int(wr_id))
        return h["canceled"]

    # -- posting ------------------------------------------------------------------------
    async def post_send(self, wr: SendWR | Iterable[SendWR]) -> None:
        wrs = [wr] if isinstance(wr, SendWR) else list(wr)
        await self.node.request("post_send", qp=self.handle, wrs=[w.to_wire() for w in wrs])

    async def post_recv(self, wr: RecvWR | Iterable[RecvWR]) -> None:
        wrs = [wr] if isinstance(wr, RecvWR) else list(wr)
        await self.node.request("post_recv", qp=self.handle, wrs=[w.to_wire() for w in wrs])

    # -- the WR builder (ibv_wr_start ... ibv_wr_complete) ------------------------------
    def wr_start(self) -> None:
        self._calls = []
        self._outside = False

    def wr_abort(self) -> None:
        self._calls = None

    def _call(self, *call: Any) -> None:
        if self._calls is None:
            # A builder call before ibv_wr_start: ibv_wr_complete reports it.
            self._calls, self._outside = [], True
        self._calls.append(list(call))

    def wr_mkey_configure(self, mkey: MKey, num_setters: int,
                          attr: MkeyConfAttr | None = None) -> None:
        attr = attr or MkeyConfAttr()
        self._call("configure", int(self.wr_id), int(self.wr_flags), mkey.handle,
                   int(num_setters), int(attr.conf_flags), int(attr.comp_mask))

    def wr_set_mkey_access_flags(self, access_flags: int) -> None:
        self._call("access_flags", int(access_flags))

    def wr_set_mkey_layout_list(self, sges: list[SGE]) -> None:
        self._call("layout_list", [sge_to_wire(s) for s in sges])

    def wr_set_mkey_layout_interleaved(self, repeat_count: int,
                                       data: list[MrInterleaved]) -> None:
        self._call("layout_interleaved", [int(repeat_count), [attr_to_wire(d) for d in data]])

    def wr_set_mkey_sig_block(self, attr: SigBlockAttr) -> None:
        self._call("sig_block", attr_to_wire(attr))

    def wr_set_mkey_crypto(self, attr: CryptoAttr) -> None:
        self._call("crypto", attr_to_wire(attr))

    async def wr_complete(self) -> None:
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
        ibv_wr_complete. The engine's MkeyConfigureBuilder.post_configure, over the wire."""
        records.build_configure_wr(self, mkey, access=access, sges=sges,
                                   interleaved=interleaved, sig=sig, crypto=crypto,
                                   conf_flags=conf_flags, wr_id=wr_id, wr_flags=wr_flags)
        await self.wr_complete()

    async def close(self) -> None:
        await self.node.request("destroy_qp", qp=self.handle)


# -- embedded daemons ------------------------------------------------------------------------

class embedded:  # noqa: N801 - a function-like async context manager, as docs/api.md spells it
    """``async with embedded() as node``: a daemon in this process on a loopback port, and
    a control session with it. Leaving the block closes both.

    ``crypto_config`` fixes the devices' crypto import method, KEK and credential
    (docs/crypto-import.md): a dict such as ``{"mode": "wrapped"}``, a JSON file's path
    or JSON text; without it, the environment variable SOFTHCA_CRYPTO_CONFIG (the
    same forms), else plaintext import."""

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
