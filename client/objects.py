"""The daemon's objects as the application holds them: PD, MR, CQ, MKey, DEK, CryptoLogin,
AsyncEvent and the RC QP (docs/api.md). Each call is one control request through the
node's connection (client/connection.py), except ``cq.poll``, which answers from the
completions the daemon pushed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..protocol import records
from ..protocol.attrs import SGE, CryptoAttr, MkeyConfAttr, MrInterleaved, SigBlockAttr
from ..protocol.control import MAX_WRS_PER_POST, attr_to_wire, sge_to_wire
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
)
from ..protocol.errors import RDMAError
from . import mw as _mw
from .ah import AH, connect_uc, create_ah, create_ah_from_wc, ready_ud
from .connection import Connection, PushedCQ
from .records import WC, MkeyErr, QPAttr, QPInfo, QPInitAttr, RecvWR, SendWR, SigErr
from .srq import SRQ

__all__ = ["CQ", "DEK", "MR", "PD", "QP", "AsyncEvent", "CryptoLogin", "MKey"]

# A poll of a pushed CQ waits locally; past this long without a completion its wait is
# also held on the daemon (a poll_cq), so the daemon's max_waits bounds it as before.
HOLD_AFTER_S = 0.005


class _Closable:
    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class PD(_Closable):
    """ibv_pd: a protection domain (``await ctx.alloc_pd()``); MRs, QPs, MKEYs and DEKs
    are created in one. Attributes: ``ctx``, ``node``."""

    def __init__(self, ctx, handle: int) -> None:
        self.ctx, self.handle = ctx, handle

    @property
    def node(self):
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

        Errors: EINVAL when ``scq`` or ``rcq`` is not a CQ, or a cap exceeds the
        device's (``max_send_wr`` / ``max_recv_wr`` 0 or over max_qp_wr, an SGE count
        over max_sge 32, ``max_inline_data`` over 65536); EOPNOTSUPP for a ``qp_type``
        other than IBV_QPT_RC, or ``create_flags`` other than
        MLX5DV_QP_CREATE_SIG_PIPELINING and _DISABLE_SCATTER_TO_CQE; EPROTO for a cap
        outside its C type (uint32_t); ENOENT for a closed CQ; ENOMEM when the session
        holds its ``--max-objects``."""
        a = init_attr
        if not isinstance(a.scq, CQ) or not isinstance(a.rcq, CQ):
            raise RDMAError("EINVAL", "QPInitAttr needs scq and rcq (CQs of this context)")
        h, _ = await self.node.request(
            "create_qp", pd=self.handle, scq=a.scq.handle, rcq=a.rcq.handle,
            qp_type=int(a.qp_type), max_send_wr=a.cap.max_send_wr,
            max_recv_wr=a.cap.max_recv_wr, max_send_sge=a.cap.max_send_sge,
            max_recv_sge=a.cap.max_recv_sge, max_inline_data=a.cap.max_inline_data,
            sq_sig_all=bool(a.sq_sig_all), send_ops_flags=int(a.send_ops_flags),
            create_flags=int(a.create_flags),
            **({"srq": a.srq.handle} if a.srq is not None else {}))
        return QP(self, h["qp"], h["qp_num"], init_attr)

    async def create_ah(self, peer: QPInfo, **grh) -> AH:
        """ibv_create_ah(3): an AH towards the daemon and device of ``peer`` (a QPInfo)
        for a UD QP's send WRs (``wr.set_wr_ud(ah, remote_qpn, remote_qkey)``); ``grh``:
        sgid, dgid (16 bytes; default the devices' GIDs), traffic_class, hop_limit
        (default 64), flow_label (client/ah.py).

        Errors: ENOENT for a closed PD; EPROTO for a field outside its width."""
        return await create_ah(self, peer, **grh)

    async def create_ah_from_wc(self, wc: WC, grh: bytes, dest_dev: str | None = None) -> AH:
        """ibv_create_ah_from_wc(3): an AH answering the sender of UD receive ``wc``,
        from the 40-byte GRH its buffer began with (client/ah.py)."""
        return await create_ah_from_wc(self, wc, grh, dest_dev)

    async def create_srq(self, max_wr: int, max_sge: int = 1, srq_limit: int = 0) -> SRQ:
        """ibv_create_srq(3): a shared receive queue of ``max_wr`` WRs of ``max_sge``
        SGEs, its limit event armed at ``srq_limit`` if not 0. QPs created with
        ``QPInitAttr(srq=srq)`` take their receives from it.

        Errors: EINVAL for ``max_wr`` 0 or over the device's max_srq_wr, or a
        ``srq_limit`` not below it; EPROTO for ``max_sge`` 0 or over 32; ENOMEM when the
        session holds its ``--max-objects``."""
        h, _ = await self.node.request("create_srq", pd=self.handle, max_wr=max_wr,
                                       max_sge=max_sge, srq_limit=srq_limit)
        return SRQ(self, h["srq"], h["max_wr"], h["max_sge"])

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

    async def reg_process_mr(self, addr: int, length: int, access: int = AccessFlags.LOCAL_WRITE,
                             secret: bytes | None = None) -> MR:
        """ibv_reg_mr(3) of this process's memory: client/mw.py ``reg_process_mr``."""
        h = await _mw.reg_process_mr(self, addr, length, access, secret)
        return MR(self, h["mr"], h["lkey"], h["rkey"], h["addr"], h["length"])

    async def alloc_mw(self, mw_type: int = _mw.MW_TYPE_1) -> _mw.MW:
        """ibv_alloc_mw(3): a memory window of ``mw_type`` (1 or 2; EINVAL otherwise)."""
        return await _mw.alloc_mw(self, mw_type)

    async def advise_mr(self, advice: int, flags: int, sges: list[SGE]) -> None:
        """ibv_advise_mr(3): client/mw.py ``advise_mr``."""
        await _mw.advise_mr(self, advice, flags, sges)

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

    async def rereg(self, flags: int, pd: PD | None = None, length: int = 0,
                    access: int = 0, addr: int = 0, secret: bytes | None = None) -> None:
        """ibv_rereg_mr(3): client/mw.py ``rereg_mr``."""
        await _mw.rereg_mr(self, flags, pd, length, access, addr, secret)

    async def close(self) -> None:
        """ibv_dereg_mr(3): the memory goes; traffic through an MKEY whose layout names
        the MR then fails.

        Errors: ENOENT when already deregistered."""
        await self.pd.node.request("dereg_mr", mr=self.handle)


class CQ(_Closable):
    """ibv_cq: a completion queue (``await ctx.create_cq(cqe)``). Attributes: ``ctx``,
    ``cqe``."""

    def __init__(self, ctx, handle: int, cqe: int, *, pushed: bool = False) -> None:
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
        if conn.inherited:      # the parent's completions are the parent's to poll
            raise conn.inherited_error()
        if not conn.available(self.handle):
            if conn.error is not None:
                raise conn.error
            # Even without waiting, the loop gets one turn, so that a loop of polls
            # lets the read loop take in what has arrived (a busy-poll never starves it).
            await self._wait(st, conn, timeout)
        out = [WC.from_wire(w) for w in conn.take(self.handle, num_entries)]
        if not out:
            if conn.error is not None:
                raise conn.error
            if self._destroyed:
                raise RDMAError("ENOENT", f"handle {self.handle} is not a cq of this session")
        return out

    async def _wait(self, st: PushedCQ, conn: Connection, timeout: float) -> None:
        loop = conn.loop
        if timeout <= 0:
            await asyncio.sleep(0)
            return
        now = loop.time()
        deadline, hold_at = now + timeout, now + HOLD_AFTER_S
        held: asyncio.Future | None = None
        while not conn.available(self.handle) and conn.error is None and not self._destroyed:
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

    async def resize(self, cqe: int) -> int:
        """ibv_resize_cq(3): client/mw.py ``resize_cq``."""
        return await _mw.resize_cq(self, cqe)

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

    ctx: Any      # the Context (client/node.py)
    id: int
    event_type: EventType
    qp: QP | None = None
    qp_num: int | None = None
    cq: CQ | None = None
    srq: SRQ | None = None

    async def ack(self) -> None:
        """ibv_ack_async_event(3): acknowledge this event. Returns None.

        Errors: EINVAL when it was already acknowledged."""
        await self.ctx.node.request("ack_async_event", event=self.id)


class CryptoLogin(_Closable):
    """mlx5dv_crypto_login_obj (``await ctx.create_crypto_login(...)``): a crypto login
    object for wrapped DEK import (docs/crypto-import.md)."""

    def __init__(self, ctx, handle: int) -> None:
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

    def __init__(self, ctx, handle: int) -> None:
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
        # The first PSN this QP sends with (``info``, ``connect``): random, as rdma_cm
        # picks it, so that a packet forged with a guessed PSN of 0 finds nothing to
        # take it.
        self.psn = secrets.randbelow(1 << 24)
        pd.ctx._qps[handle] = self
        self.sq_sig_all = bool(init_attr.sq_sig_all)
        self.wr_id = 0
        self.wr_flags = 0
        self._calls: list[list] | None = None
        self._outside = False

    @property
    def node(self):
        """The Node (control session) the QP belongs to."""
        return self.pd.node

    def info(self, psn: int | None = None) -> QPInfo:
        """What a peer needs to connect to this QP: QPInfo(host, port, dev, qp_num,
        psn), ``psn`` the first PSN this QP sends with, which the peer expects (default
        ``self.psn``, random per QP, as ``connect``'s ``sq_psn``). Not awaited; sends
        nothing and raises nothing."""
        return QPInfo(self.node.host, self.node.port, self.pd.ctx.name, self.qp_num,
                      self.psn if psn is None else psn)

    # -- ibv_modify_qp -----------------------------------------------------------------
    async def modify(self, attr: QPAttr, mask: int = 0) -> int:
        """ibv_modify_qp(3) to ``attr.qp_state`` with the fields ``attr`` has (the ones
        not None); ``mask`` (IBV_QP_* bits, default 0) adds bits for fields it does
        not carry. Without ``qp_state`` the QP stays in its state and the fields change
        as that state's own transition (RTS -> RTS, ...) allows, as mlx5 and rxe take
        it. Returns the new state. Transitions: RESET -> INIT -> RTR -> RTS,
        INIT -> INIT, RTS -> RTS, RTS <-> SQD, SQD -> SQD, and RESET or ERR from any
        state (ERR flushes every outstanding WR; RESET empties the queues). All is
        checked before anything changes.

        Errors: EINVAL for a transition that does not exist
        (ERR -> RTS, RESET -> RTR, to SQE, ...), a required attribute missing
        (``to_rtr`` without ``dest_qp_num``, ``rq_psn`` or the peer's address), an
        attribute the transition does not take, ``dest_host`` without ``dest_port``,
        a ``mask`` bit whose field has no value, ``cur_qp_state`` not the QP's state;
        EOPNOTSUPP for alternate path or path migration bits; EPROTO for a field
        outside its width (``path_mtu`` outside 1..5, a PSN over 24 bits,
        ``retry_cnt`` over 7, ...); ENOENT after ``qp.close()``."""
        h, _ = await self.node.request("modify_qp", qp=self.handle, attr=attr.to_wire(),
                                       mask=mask)
        if h["state"] == QpState.RESET:
            # RESET cleans the QP's unpolled completions from its CQs (server/mw_verbs.py).
            for cq in {self.init_attr.scq, self.init_attr.rcq}:
                self.node._conn.protocol.drop_qp_completions(cq.handle, self.qp_num)
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

    async def connect(self, peer: QPInfo, path_mtu: int = Mtu.MTU_1024, *,
                      sq_psn: int | None = None,
                      timeout: int = 17, retry_cnt: int = 7, rnr_retry: int = 7,
                      min_rnr_timer: int = 12) -> None:
        """RESET -> INIT -> RTR -> RTS towards ``peer`` (``peer_qp.info()``). ``timeout`` is
        ibv_qp_attr's exponent (4.096 us * 2^timeout; 17 is about half a second, 0
        infinite); ``retry_cnt`` and ``rnr_retry`` are 3-bit counts (``rnr_retry`` 7
        retries forever); ``min_rnr_timer`` the IBTA RNR timer code (12 = 0.64 ms);
        ``path_mtu`` an IBV_MTU_* (default 1024); ``sq_psn`` this QP's first PSN
        (default ``self.psn``, the one ``info`` gives the peer).

        Errors: as ``modify`` at the step that failed (EINVAL when the QP is past
        INIT; EPROTO for a value outside its width); the earlier steps stay done.
        A UC QP takes ``path_mtu`` and ``sq_psn`` only (it has no timers)."""
        if self.init_attr.qp_type == QpType.UC:
            await connect_uc(self, peer, path_mtu, self.psn if sq_psn is None else sq_psn)
            return
        await self.to_init()
        await self.to_rtr(QPAttr(path_mtu=path_mtu, dest_qp_num=peer.qp_num, rq_psn=peer.psn,
                                 dest_host=peer.host, dest_port=peer.port, dest_dev=peer.dev,
                                 min_rnr_timer=min_rnr_timer))
        await self.to_rts(QPAttr(sq_psn=self.psn if sq_psn is None else sq_psn,
                                 timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                                 min_rnr_timer=min_rnr_timer))

    async def ready(self, qkey: int, sq_psn: int | None = None) -> None:
        """A UD QP through RESET -> INIT -> RTR -> RTS with Q_Key ``qkey`` (sq_psn
        default ``self.psn``); it then sends to any AH and takes from anyone who knows
        its QP number and Q_Key. Errors: as ``modify``."""
        await ready_ud(self, qkey, self.psn if sq_psn is None else sq_psn)

    async def bind_mw(self, mw: _mw.MW, mr: MR | None, addr: int, length: int, access: int,
                      **kw: Any) -> int:
        """ibv_bind_mw(3) of a type 1 window: client/mw.py ``bind_mw``."""
        return await _mw.bind_mw(self, mw, mr, addr, length, access, **kw)

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
    async def post_send(self, wr: SendWR | Iterable[SendWR], *,
                        wr_complete: bool = False) -> None:
        """ibv_post_send(3): one SendWR or a list, in order. With a list, the WRs before
        a refused one are posted and the rest are not (the message names the WR's index
        and ``wr_id``, and the error's ``bad_wr`` is that index in the list; None when
        the daemon refused a request of it whole, as a malformed one). A WR that fails later does not raise: it
        completes with an error status. In ERR a WR completes IBV_WC_WR_FLUSH_ERR.

        Errors: EINVAL when the QP is not in RTS or SQD (nor ERR), a WR has more SGEs
        than ``max_send_sge`` or moves more than the port's max_msg_sz, an opcode is
        not an ibv_wr_opcode, a ``*_WITH_IMM`` opcode lacks ``imm_data``, an atomic has
        not exactly one 8-byte SGE, IBV_SEND_INLINE is set on anything but SEND or
        RDMA_WRITE, exceeds ``max_inline_data`` or names memory outside an MR of the
        QP's PD; EOPNOTSUPP for IBV_WR_BIND_MW, TSO, DRIVER1; ENOMEM when the send queue
        holds ``max_send_wr`` WRs; EPROTO for a field over its C width (``imm_data``,
        ``rkey``) or more than 4096 WRs in one call; ENOENT after ``qp.close()``.

        ``wr_complete=True`` posts as ibv_wr_complete(3) does, all or nothing: the
        daemon checks every WR (each as if those before it were posted, so the send
        queue must have room for all of them) before it posts any, and on an error
        nothing is posted and ``bad_wr`` is None. The errors are the same, ENOMEM when
        the queue has no room for the whole list; more than 256 WRs (one request) is
        ENOMEM without asking the daemon, and an empty list posts nothing."""
        wrs = [wr] if isinstance(wr, SendWR) else list(wr)
        if wr_complete:
            if not wrs:
                return      # an empty posting completes, posting nothing
            if len(wrs) > MAX_WRS_PER_POST:
                raise RDMAError("ENOMEM", f"ibv_wr_complete: {len(wrs)} WRs in one posting; "
                                          f"one request holds {MAX_WRS_PER_POST}")
            await self.node._conn.request("post_send", qp=self.handle,
                                          wrs=[w.to_wire() for w in wrs], wr_complete=True)
            return
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
        # (The connection's own request, not Node.request: a post is the data path's
        # call, and the extra coroutine is one more frame for every WR list.)
        conn = self.node._conn
        if len(wrs) <= MAX_WRS_PER_POST:
            await conn.request(verb, qp=self.handle, wrs=wrs)
            return
        for i in range(0, len(wrs), MAX_WRS_PER_POST):
            try:
                await conn.request(verb, qp=self.handle, wrs=wrs[i:i + MAX_WRS_PER_POST])
            except RDMAError as e:
                # bad_wr: the refused WR's index in the whole list, not in its request
                if e.bad_wr is not None:
                    e.bad_wr += i
                raise

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

