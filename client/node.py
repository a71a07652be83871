"""The control session and the device context: ``connect``, ``embedded``, Node (with its
Faults and Subscription) and Context (docs/api.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import weakref
from typing import Any

from ..protocol.address import split_address
from ..protocol.attrs import DEKInitAttr
from ..protocol.enums import CryptoLoginState, EventType
from ..protocol.errors import RDMAError
from .connection import DEFAULT_PORT, IO_CHUNK, Connection
from .objects import CQ, DEK, PD, QP, AsyncEvent, CryptoLogin, _Closable
from .records import Event

__all__ = ["Context", "Faults", "Node", "Subscription", "connect", "embedded", "route_address"]


def route_address(peer: str) -> str:
    """This host's address on the route to the daemon at ``peer`` (``"host:port"``):
    where a daemon here must listen for that daemon to reach it back. The kernel picks
    it as for any connection (a UDP ``connect()``, which sends nothing); 127.0.0.1 for a
    daemon on this host.

    Errors: EHOSTUNREACH when ``peer`` cannot be resolved, ENETUNREACH when no route
    leads there."""
    import socket

    host, port = split_address(peer, DEFAULT_PORT)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as e:
        raise RDMAError("EHOSTUNREACH", f"cannot resolve host {host!r}: {e}") from None
    family, _, _, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError as e:
        raise RDMAError("ENETUNREACH", f"no route from this host to {peer}: "
                                       f"{e.strerror or e}") from None


async def connect(address: str, token: bytes | str | None = None, *,
                  timeout: float = 10.0) -> Node:
    """A control session with the daemon at ``host:port``; ``token`` when it requires one.

    ``address`` is ``"host:port"`` (``"[v6addr]:port"``; the port defaults to 4791), or
    ``"unix:PATH"`` for the daemon's UNIX socket (``serve --unix``; no token there);
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
    if address.startswith("unix:"):
        # The welcome on a UNIX socket names the daemon's wire address (server/unix.py).
        conn = await Connection.open_unix(address[5:], timeout=timeout)
        host, port = split_address(str(conn.welcome.get("address", "")), DEFAULT_PORT)
    else:
        host, port = split_address(address, DEFAULT_PORT)
        if isinstance(token, str):
            token = token.encode()
        conn = await Connection.open(host, port, token, timeout=timeout)
    h = conn.welcome
    node = Node(conn, host, port, list(h.get("devices", [])))
    # mr.write / mr.read chunks must fit the daemon's frame limit with room for the header.
    max_frame = h.get("max_frame")
    if isinstance(max_frame, int) and max_frame > 8192:
        node.io_chunk = min(IO_CHUNK, max_frame - 4096)
    return node


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

    def __init__(self, conn: Connection, host: str, port: int, devices: list[str]) -> None:
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
        # And SRQs, for IBV_EVENT_SRQ_LIMIT_REACHED's ``srq``.
        self._srqs: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

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
                                  self._cqs.get(ev.get("cq")), self._srqs.get(ev.get("srq")))
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
        """mlx5dv_query_device(3): a dict with ``version``, ``flags``, ``comp_mask``,
        ``sig_caps`` (block_size, block_prot, t10dif_bg, crc_type) as struct
        mlx5dv_sig_caps and ``crypto_caps`` (failed_selftests, crypto_engines,
        wrapped_import_method, log_max_num_deks, flags) as struct mlx5dv_crypto_caps.

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


# -- embedded daemons ------------------------------------------------------------------------


class embedded:  # noqa: N801 - a function-like async context manager, as docs/api.md spells it
    """``async with embedded() as node``: a daemon in this process on a loopback port, and
    a control session with it. Leaving the block closes both.

    ``crypto_config`` fixes the devices' crypto import method, KEK and credential
    (docs/crypto-import.md): a dict such as ``{"mode": "wrapped"}``, a JSON file's path
    or JSON text; without it, the environment variable SOFTHCA_CRYPTO_CONFIG (the
    same forms), else plaintext import. ``hcas`` names the devices (default
    ``("mlx5_0",)``), ``token`` the daemon's token, ``host`` its address; ``peer``
    (``"host:port"``) a daemon on another host that this one's QPs will talk to: without
    ``host`` the daemon then listens on the address that routes there
    (``route_address``), so that the peer can connect back, not on loopback;
    ``daemon_options`` go to server.daemon.Daemon (``max_frame=``, ``limits=``,
    ``strict_blocks=``, ``peer_token=``).

    Errors: EINVAL for a crypto configuration that cannot be read or is not valid;
    EHOSTUNREACH or ENETUNREACH when ``peer`` has no route; those of ``connect`` if the
    session cannot be opened."""

    def __init__(self, hcas: tuple[str, ...] = ("mlx5_0",), *, token: bytes | None = None,
                 host: str | None = None, peer: str | None = None, crypto_config: Any = None,
                 **daemon_options: Any) -> None:
        self.hcas, self.token, self.options = hcas, token, daemon_options
        self.host, self.peer = host, peer
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
        host = self.host or (route_address(self.peer) if self.peer else "127.0.0.1")
        self.daemon = Daemon(self.hcas, host, 0, self.token, crypto=crypto, **self.options)
        # The in-process proof for registering this process's memory (server/process_mr.py).
        self.daemon.process_secret = secrets.token_bytes(32)
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
