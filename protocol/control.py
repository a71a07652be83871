"""Control-plane messages: one typed request per verb, the reply shapes, attribute codecs.

A request is one frame ``{"t": <verb>, "id": <u32>, <fields>...}`` (payload: the
bytes of ``mr_write``). Every request gets exactly one reply with the same id:

- ``{"t": "ok", "id": n, <result fields>...}`` (payload: the bytes of ``mr_read``),
- ``{"t": "err", "id": n, "errno": "EINVAL", "msg": "<sentence>"}``.

Each verb is a frozen dataclass below (``OpenDevice`` for ``open_device``, ...) whose
fields carry their wire types and bounds; ``decode_request`` turns a header into one
of them before the daemon looks at anything, so a handler only ever sees well-typed,
in-range values, the nested ones (WRs, configure calls, QP attributes, CQ credits)
already decoded, and an unknown verb or field is refused with EPROTO naming it.
``REQUESTS`` is the same specs as a table by verb name. The attribute structs
(``protocol.attrs``) travel as maps with their C field names, nested the way the C
structs nest; ``attr_to_wire`` / ``attr_from_wire`` convert, refusing unknown fields
and wrong leaf types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

from .attrs import (
    CryptoAttr,
    MkeyConfAttr,
    MrInterleaved,
    SigBlockAttr,
)
from .attrs_wire import attr_from_wire, attr_to_wire
from .errors import einval
from .frames import FrameError, field
from .pieces import MAX_PIECES, SYSV_PIECE, decode_pieces
from .records import RecvWR, SendWR
from .schema import I32, MAX_SGE, U32, U64, check_fields, sge_to_wire, sges_from_wire

# WRs in one post_send / post_recv request: decoding and posting them is one stretch of
# the daemon's event loop, kept to a few milliseconds (the client splits longer lists).
MAX_WRS_PER_POST = 256
# [cq, n] pairs in one cq_credit frame (a client sends one per CQ it polled since the last).
MAX_CREDITS = 1024
# ibv_query_device(3) max_cqe: the most entries a CQ may be created with (and so the
# most one cq_credit pair may give back).
MAX_CQE = 1 << 22
# Layout entries (SGEs and interleaved entries) one mkey_configure request may carry:
# decoding and checking them is one stretch of the event loop (some 5 ms at this size).
MAX_CONFIGURE_ENTRIES = 4096

# Field spec: (type(s), min, max, required).
_H = (int, 1, U32, True)          # a session handle
_U32 = (int, 0, U32, True)
_U64 = (int, 0, U64, True)
_BOOL = (bool, None, None, True)

# mkey_configure's "calls" replay the ibv_wr_* calls made between ibv_wr_start and
# ibv_wr_complete, in order, so the daemon reports the error the same sequence gives
# on a device: ["configure", wr_id, wr_flags, mkey handle, num_setters, conf_flags,
# comp_mask] for mlx5dv_wr_mkey_configure, [setter, value] for each setter.
CONFIGURE_CALL = ("configure", _U64, _U32, _H, (int, 0, 64, True), _U64, _U64)
SETTERS = ("access_flags", "layout_list", "layout_interleaved", "sig_block", "crypto")

# modify_qp's attr fields (struct ibv_qp_attr, plus the peer's address for RTR).
QP_ATTR = {"qp_state": (int, 0, 6, False), "path_mtu": (int, 1, 5, False),
           "dest_qp_num": (int, 0, (1 << 24) - 1, False), "rq_psn": (int, 0, (1 << 24) - 1, False),
           "sq_psn": (int, 0, (1 << 24) - 1, False), "timeout": (int, 0, 31, False),
           "retry_cnt": (int, 0, 7, False), "rnr_retry": (int, 0, 7, False),
           "min_rnr_timer": (int, 0, 31, False), "max_rd_atomic": (int, 0, 255, False),
           "max_dest_rd_atomic": (int, 0, 255, False), "qp_access_flags": (int, 0, U32, False),
           "dest_host": (str, 1, 255, False), "dest_port": (int, 1, 65535, False),
           "dest_dev": (str, 1, 64, False), "cur_qp_state": (int, 0, 6, False),
           "en_sqd_async_notify": (int, 0, 1, False), "qkey": (int, 0, U32, False)}

# The event kinds a session may subscribe to.
EVENT_KINDS = frozenset({"packets", "trace"})


# -- the nested fields' decoders ---------------------------------------------------------

def credits_from_wire(credits: list, max_count: int = MAX_CQE) -> dict[int, int]:
    """A ``cq_credit`` request's ``[[cq handle, count], ...]`` as counts per handle, or
    FrameError(EPROTO) naming the first malformed pair. The one check of credits: the
    client's session builds them, the daemon's decodes them with it."""
    total: dict[int, int] = {}
    for i, c in enumerate(credits):
        if (type(c) is list and len(c) == 2 and type(c[0]) is int and type(c[1]) is int
                and 1 <= c[0] <= U32 and 1 <= c[1] <= max_count):
            # (Exact types, what msgpack gives: one per poll, so no generator here.)
            total[c[0]] = total.get(c[0], 0) + c[1]
            continue
        if not (isinstance(c, list) and len(c) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in c)
                and 1 <= c[0] <= U32 and 1 <= c[1] <= max_count):
            raise FrameError("EPROTO", f"cq_credit: credits[{i}] must be [cq handle, "
                                       f"count 1..{max_count}]")
        total[c[0]] = total.get(c[0], 0) + c[1]
    return total


def _credits(credits: list) -> tuple[tuple[int, int], ...]:
    """cq_credit's [[cq handle, count], ...], checked whole, one (handle, sum) per CQ."""
    return tuple(credits_from_wire(credits).items())


def _qp_attr(attr: dict) -> dict[str, Any]:
    """modify_qp's attr: the fields given (struct ibv_qp_attr's, checked)."""
    v = check_fields({"t": "modify_qp.attr", **attr}, QP_ATTR, "modify_qp attr")
    return {k: x for k, x in v.items() if x is not None}


def _send_wrs(wrs: list) -> tuple[SendWR, ...]:
    # Decoded whole: a malformed WR refuses the request and posts nothing.
    return tuple(SendWR.from_wire(w, f"send_wr[{i}]") for i, w in enumerate(wrs))


def _recv_wrs(wrs: list) -> tuple[RecvWR, ...]:
    return tuple(RecvWR.from_wire(w, f"recv_wr[{i}]") for i, w in enumerate(wrs))


def _event_kinds(events: list) -> frozenset[str]:
    kinds = set(events)
    unknown = kinds - EVENT_KINDS
    if unknown or not all(isinstance(k, str) for k in kinds):
        raise einval(f"subscribe: unknown event kind(s) {sorted(map(str, unknown))}; "
                     "the kinds are 'packets' and 'trace'")
    return frozenset(kinds)


@dataclasses.dataclass(frozen=True)
class ConfigureCall:
    """mlx5dv_wr_mkey_configure(3) in an mkey_configure request, with the WR's id and
    flags set before it (``mkey``: the session's handle)."""

    wr_id: int
    wr_flags: int
    mkey: int
    num_setters: int
    conf_flags: int
    comp_mask: int


@dataclasses.dataclass(frozen=True)
class SetterCall:
    """One mlx5dv_wr_set_mkey_* setter: ``kind`` (one of SETTERS) and its decoded
    argument (``setter_from_wire``; a crypto setter's DEK is the session's handle)."""

    kind: str
    value: Any


_CONFIGURE_NAMES = ("wr_id", "wr_flags", "mkey", "num_setters", "conf_flags", "comp_mask")


def _layout_entries(kind: str, value: Any) -> int:
    """The entries a layout setter's wire value carries (0 if malformed: the decoder says
    why): a list of SGEs, or [repeat_count, entries]."""
    if kind == "layout_interleaved":
        value = value[1] if isinstance(value, list) and len(value) == 2 else None
    return len(value) if isinstance(value, list) else 0


def _configure_call(c: list, what: str) -> ConfigureCall:
    if len(c) != len(CONFIGURE_CALL):
        raise FrameError("EPROTO", f"{what}: configure takes wr_id, wr_flags, "
                                   "mkey, num_setters, conf_flags, comp_mask")
    v = check_fields({"t": what, **dict(zip(_CONFIGURE_NAMES, c[1:], strict=True))},
                     dict(zip(_CONFIGURE_NAMES, CONFIGURE_CALL[1:], strict=True)), what)
    return ConfigureCall(**v)


def _configure_calls(calls: list) -> tuple[ConfigureCall | SetterCall, ...]:
    """mkey_configure's calls, decoded in order; the layouts' entries are bounded."""
    out: list[ConfigureCall | SetterCall] = []
    entries = 0
    for i, c in enumerate(calls):
        what = f"mkey_configure call {i}"
        if not isinstance(c, list) or not c:
            raise FrameError("EPROTO", f"{what} must be a non-empty list")
        if c[0] == "configure":
            out.append(_configure_call(c, what))
        elif len(c) == 2:
            if c[0] in ("layout_list", "layout_interleaved"):
                entries += _layout_entries(c[0], c[1])
                if entries > MAX_CONFIGURE_ENTRIES:
                    raise einval(f"{what}: more than {MAX_CONFIGURE_ENTRIES} layout "
                                 "entries in one mkey_configure request (post the WRs "
                                 "in several)")
            out.append(SetterCall(*setter_from_wire(c[0], c[1], what)))
        else:
            raise FrameError("EPROTO", f"{what}: a setter is [kind, value]")
    return tuple(out)


# -- the requests ---------------------------------------------------------------------------

def _wire(typ: type | tuple[type, ...], lo: int | float | None = None,
          hi: int | float | None = None, *, required: bool = True, default: Any = None,
          decode: Callable[[Any], Any] | None = None) -> Any:
    """A request field: its wire type and bounds; ``default`` stands for an optional
    field that is absent, ``decode`` turns a nested value into what the handler takes."""
    return dataclasses.field(metadata={"spec": (typ, lo, hi, required), "default": default,
                                       "decode": decode})


def _handle() -> Any:
    return _wire(int, 1, U32)


def _u32() -> Any:
    return _wire(int, 0, U32)


def _u64() -> Any:
    return _wire(int, 0, U64)


def _payload() -> Any:
    """The frame's payload (not a header field)."""
    return dataclasses.field(metadata={"payload": True})


class Request:
    """A decoded control request; ``VERB`` is its wire name (the frame's "t")."""

    VERB: ClassVar[str] = ""
    # Filled by _request from the fields: the header schema, the decoders of nested
    # fields, the defaults of absent optional ones, the field that takes the payload.
    SCHEMA: ClassVar[dict[str, tuple]] = {}
    _decoders: ClassVar[tuple[tuple[str, Callable[[Any], Any]], ...]] = ()
    _defaults: ClassVar[tuple[tuple[str, Any], ...]] = ()
    _payload_field: ClassVar[str | None] = None

    @classmethod
    def decode(cls, header: dict, payload: memoryview) -> Request:
        """The request ``header`` (and ``payload``) carry; FrameError("EPROTO") naming
        the fault, or the verbs' own error (EINVAL) for a value C would refuse."""
        v = check_fields(header, cls.SCHEMA, f"request '{cls.VERB}'")
        for name, default in cls._defaults:
            if v[name] is None:
                v[name] = default
        for name, decode in cls._decoders:
            v[name] = decode(v[name])
        if cls._payload_field is not None:
            v[cls._payload_field] = payload
        return cls(**v)


BY_VERB: dict[str, type[Request]] = {}


def _request(verb: str) -> Callable[[type], type]:
    def register(cls: type) -> type:
        cls = dataclasses.dataclass(frozen=True)(cls)
        cls.VERB = verb
        fields = dataclasses.fields(cls)
        cls.SCHEMA = {f.name: f.metadata["spec"] for f in fields if "spec" in f.metadata}
        cls._decoders = tuple((f.name, f.metadata["decode"]) for f in fields
                              if f.metadata.get("decode") is not None)
        cls._defaults = tuple((f.name, f.metadata["default"]) for f in fields
                              if f.metadata.get("default") is not None)
        cls._payload_field = next((f.name for f in fields if f.metadata.get("payload")), None)
        BY_VERB[verb] = cls
        return cls
    return register


# -- device and memory
@_request("devices")
class Devices(Request):
    pass


@_request("open_device")
class OpenDevice(Request):
    name: str = _wire(str, 1, 64)


@_request("query_device")
class QueryDevice(Request):
    ctx: int = _handle()


@_request("close_device")
class CloseDevice(Request):
    ctx: int = _handle()


@_request("alloc_pd")
class AllocPd(Request):
    ctx: int = _handle()


@_request("dealloc_pd")
class DeallocPd(Request):
    pd: int = _handle()


# The bounds here are what the call's C types hold (a size_t length, an int cqe): beyond
# them a request is malformed (EPROTO). What the verbs themselves refuse inside those
# types (ibv_reg_mr of 0 bytes, a cqe over max_cqe) is the handler's and the engine's,
# EINVAL in the verbs' words.
@_request("reg_mr")
class RegMr(Request):
    pd: int = _handle()
    length: int = _u64()
    access: int = _u32()


# ibv_reg_mr of a local program's own memory (the UNIX socket only): the registered
# pages are ``pieces`` of memfds or SysV segments (protocol/pieces.py), side by side in
# address order, at the program's virtual address ``addr`` (the MR's iova).
@_request("reg_mr_shared")
class RegMrShared(Request):
    pd: int = _handle()
    addr: int = _u64()
    length: int = _u64()
    access: int = _u32()
    offset: int = _u64()
    pieces: tuple[tuple, ...] = _wire(list, 1, MAX_PIECES, decode=decode_pieces)
    fds: int = _u32()       # the number the memfds were handed over under (UNIX socket)


# ibv_reg_mr of the embedded daemon's own process's memory at ``addr``; ``secret`` is
# the daemon object's process_secret (server/process_mr.py).
@_request("reg_mr_process")
class RegMrProcess(Request):
    pd: int = _handle()
    addr: int = _u64()
    length: int = _u64()
    access: int = _u32()
    secret: bytes = _wire(bytes, 32, 32)


@_request("dereg_mr")
class DeregMr(Request):
    mr: int = _handle()


@_request("mr_write")
class MrWrite(Request):
    mr: int = _handle()
    offset: int = _u64()
    data: memoryview = _payload()


@_request("mr_read")
class MrRead(Request):
    mr: int = _handle()
    offset: int = _u64()
    length: int = _u64()


# ibv_alloc_mw(3) / ibv_dealloc_mw(3): type is enum ibv_mw_type (1, 2).
@_request("alloc_mw")
class AllocMw(Request):
    pd: int = _handle()
    type: int = _u32()


@_request("dealloc_mw")
class DeallocMw(Request):
    mw: int = _handle()


# ibv_rereg_mr(3): flags IBV_REREG_MR_CHANGE_*; pd (a handle, 0: none) with CHANGE_PD;
# addr and length with CHANGE_TRANSLATION (addr 0: fresh memory of the daemon; else the
# embedded daemon's process memory, with its secret as for reg_mr_process).
@_request("rereg_mr")
class ReregMr(Request):
    mr: int = _handle()
    flags: int = _u32()
    pd: int = _wire(int, 0, U32, required=False, default=0)
    addr: int = _wire(int, 0, U64, required=False, default=0)
    length: int = _wire(int, 0, U64, required=False, default=0)
    access: int = _wire(int, 0, U32, required=False, default=0)
    secret: bytes = _wire(bytes, 0, 32, required=False, default=b"")


# ibv_advise_mr(3): sg_list as [[addr, length, lkey], ...].
@_request("advise_mr")
class AdviseMr(Request):
    pd: int = _handle()
    advice: int = _u32()
    flags: int = _u32()
    sg: tuple = _wire(list, 0, 1024, decode=lambda v: tuple(sges_from_wire(v, "advise_mr")))


# -- CQ and QP
@_request("resize_cq")
class ResizeCq(Request):
    cq: int = _handle()
    cqe: int = _wire(int, 0, I32)
    # A ring CQ's new ring: the number of the memfd handoff that carries it.
    ring: int | None = _wire(int, 0, U32, required=False)


# push: the daemon sends this CQ's completions to the session as it makes them ("wc"
# frames); the client polls them locally and returns room with cq_credit. ring (a
# local program's, with push): the number of the memfd handoff (server/shared_mr.py)
# carrying the CQ's completion ring (protocol/cq_ring.py): completions go into it, not
# into frames, and its consumer index returns the room.
@_request("create_cq")
class CreateCq(Request):
    ctx: int = _handle()
    cqe: int = _wire(int, 0, I32)
    push: bool = _wire(bool, required=False, default=False)
    ring: int | None = _wire(int, 0, U32, required=False)
    # A ring CQ bound to a completion channel: the handoff carrying the write end of the
    # channel's event socket, and the 8 bytes the daemon writes there per event (the
    # kernel's user_handle: what ibv_get_cq_event reads back as the CQ). Both or neither.
    channel: int | None = _wire(int, 0, U32, required=False)
    event: int | None = _wire(int, 0, U64, required=False)


@_request("destroy_cq")
class DestroyCq(Request):
    cq: int = _handle()


# The entries of pushed CQs the application has polled, [[cq, n], ...]: room the daemon
# gives back. No reply when accepted (the client sends id 0 and does not wait); an error
# reply (EPROTO, ENOENT) with the frame's id otherwise.
@_request("cq_credit")
class CqCredit(Request):
    credits: tuple[tuple[int, int], ...] = _wire(list, 1, MAX_CREDITS, decode=_credits)


# ibv_req_notify_cq(3) of a ring CQ: the daemon pushes a "cq_event" frame when it
# next writes an entry into the ring (at once when unpolled entries are there already).
# No reply when accepted, as cq_credit.
@_request("req_notify_cq")
class ReqNotifyCq(Request):
    cq: int = _handle()
    solicited_only: bool = _wire(bool, required=False, default=False)


@_request("poll_cq")
class PollCq(Request):
    cq: int = _handle()
    num: int = _wire(int, 1, 1 << 16)
    timeout: float = _wire((int, float), 0, 3600)


@_request("create_qp")
class CreateQp(Request):
    pd: int = _handle()
    scq: int = _handle()
    rcq: int = _handle()
    qp_type: int = _u32()
    # struct ibv_qp_cap's uint32_t fields; what the device cannot hold is the verb's
    # EINVAL (server/qp_caps.py).
    max_send_wr: int = _u32()
    max_recv_wr: int = _u32()
    max_send_sge: int = _u32()
    max_recv_sge: int = _u32()
    max_inline_data: int = _u32()
    sq_sig_all: bool = _wire(bool)
    send_ops_flags: int = _u64()
    create_flags: int = _wire(int, 0, U32, required=False, default=0)
    # ibv_qp_init_attr.srq: the handle of an SRQ of this session, 0 for none.
    srq: int = _wire(int, 0, U32, required=False, default=0)
    # A local program's send and receive rings (protocol/wq_ring.py): the number of
    # the memfd handoff (server/shared_mr.py) carrying them, and which queues it holds
    # (QUEUE_SEND, QUEUE_RECV); their WRs come as WQEs and doorbells, not post requests.
    ring: int | None = _wire(int, 0, U32, required=False)
    ring_queues: int = _wire(int, 0, 3, required=False, default=0)


# ibv_create_ah(3): the daemon and device the AH's dgid leads to (as an RC QP's AV
# names them), and the GRH fields of struct ibv_global_route with both GIDs.
@_request("create_ah")
class CreateAh(Request):
    pd: int = _handle()
    dest_host: str = _wire(str, 1, 255)
    dest_port: int = _wire(int, 1, 65535)
    dest_dev: str = _wire(str, 1, 64)
    sgid: bytes = _wire(bytes, 16, 16)
    dgid: bytes = _wire(bytes, 16, 16)
    traffic_class: int = _wire(int, 0, 255, required=False, default=0)
    hop_limit: int = _wire(int, 0, 255, required=False, default=64)
    flow_label: int = _wire(int, 0, (1 << 20) - 1, required=False, default=0)


@_request("destroy_ah")
class DestroyAh(Request):
    ah: int = _handle()


@_request("destroy_qp")
class DestroyQp(Request):
    qp: int = _handle()


@_request("modify_qp")
class ModifyQp(Request):
    qp: int = _handle()
    attr: dict[str, Any] = _wire(dict, 0, 32, decode=_qp_attr)
    mask: int = _u32()


@_request("query_qp")
class QueryQp(Request):
    qp: int = _handle()


# Each of "wrs" is a protocol.records.SEND_WR / RECV_WR.
@_request("post_send")
class PostSend(Request):
    qp: int = _handle()
    wrs: tuple[SendWR, ...] = _wire(list, 1, MAX_WRS_PER_POST, decode=_send_wrs)
    # The WRs of one ibv_wr_complete (ibv_wr_post(3): nothing is posted unless it
    # succeeds): every WR is checked, the queue's room for all of them included, before
    # any is posted; false, ibv_post_send's rule: in order up to the first refused.
    wr_complete: bool = _wire(bool, required=False, default=False)


# A ring QP's doorbell (protocol/wq_ring.py): the program published new WQEs in its send
# queue (rq false) or receive queue; the daemon reads them. No reply when accepted, as
# cq_credit.
@_request("doorbell")
class Doorbell(Request):
    qp: int = _handle()
    rq: bool = _wire(bool, required=False, default=False)


@_request("post_recv")
class PostRecv(Request):
    qp: int = _handle()
    wrs: tuple[RecvWR, ...] = _wire(list, 1, MAX_WRS_PER_POST, decode=_recv_wrs)


# -- shared receive queues (ibv_create_srq(3), ibv_modify_srq(3), ibv_post_srq_recv(3))
@_request("create_srq")
class CreateSrq(Request):
    pd: int = _handle()
    max_wr: int = _wire(int, 1, 1 << 16)
    max_sge: int = _wire(int, 1, MAX_SGE)
    srq_limit: int = _wire(int, 0, 1 << 16, required=False, default=0)


@_request("modify_srq")
class ModifySrq(Request):
    srq: int = _handle()
    # IBV_SRQ_MAX_WR / IBV_SRQ_LIMIT (enum ibv_srq_attr_mask) say which fields count.
    mask: int = _wire(int, 0, 3)
    max_wr: int = _wire(int, 0, 1 << 16, required=False, default=0)
    srq_limit: int = _wire(int, 0, 1 << 16, required=False, default=0)


@_request("query_srq")
class QuerySrq(Request):
    srq: int = _handle()


@_request("destroy_srq")
class DestroySrq(Request):
    srq: int = _handle()


@_request("post_srq_recv")
class PostSrqRecv(Request):
    srq: int = _handle()
    wrs: tuple[RecvWR, ...] = _wire(list, 1, MAX_WRS_PER_POST, decode=_recv_wrs)


# -- mlx5dv: MKEYs and DEKs
@_request("create_mkey")
class CreateMkey(Request):
    pd: int = _handle()
    create_flags: int = _u32()
    max_entries: int = _wire(int, 0, 1 << 16)


@_request("destroy_mkey")
class DestroyMkey(Request):
    mkey: int = _handle()


@_request("mkey_configure")
class MkeyConfigure(Request):
    qp: int = _handle()
    calls: tuple[ConfigureCall | SetterCall, ...] = _wire(list, 0, 2048,
                                                          decode=_configure_calls)


@_request("mkey_check")
class MkeyCheck(Request):
    mkey: int = _handle()


# key is char key[128] (wrapped 256-bit with keytag: 80); crypto_login is a
# create_crypto_login handle, 0 for NULL.
@_request("create_dek")
class CreateDek(Request):
    ctx: int = _handle()
    pd: int = _handle()
    key_size: int = _u32()
    key: bytes = _wire(bytes, 0, 128)
    has_keytag: bool = _wire(bool)
    keytag: bytes = _wire(bytes, 0, 8)
    key_purpose: int = _u32()
    opaque: bytes = _wire(bytes, 0, 8, required=False, default=b"")
    comp_mask: int = _wire(int, 0, U64, required=False, default=0)
    crypto_login: int = _wire(int, 0, U32, required=False, default=0)


@_request("destroy_dek")
class DestroyDek(Request):
    dek: int = _handle()


@_request("query_dek")
class QueryDek(Request):
    dek: int = _handle()


@_request("query_mlx5_device")
class QueryMlx5Device(Request):
    ctx: int = _handle()


# mlx5dv_crypto_login(3) (a session of the context) and mlx5dv_crypto_login_create(3)
# (an object): the credential as given, wrapped (48 bytes for this device).
@_request("crypto_login")
class CryptoLoginReq(Request):
    ctx: int = _handle()
    credential: bytes = _wire(bytes, 0, 4096)
    import_kek_id: int = _u32()
    credential_id: int = _wire(int, 0, U32, required=False, default=0)
    comp_mask: int = _wire(int, 0, U64, required=False, default=0)


@_request("crypto_login_query_state")
class CryptoLoginQueryState(Request):
    ctx: int = _handle()


@_request("crypto_logout")
class CryptoLogout(Request):
    ctx: int = _handle()


@_request("create_crypto_login")
class CreateCryptoLogin(Request):
    ctx: int = _handle()
    credential: bytes = _wire(bytes, 0, 4096)
    import_kek_id: int = _u32()
    credential_id: int = _wire(int, 0, U32, required=False, default=0)
    comp_mask: int = _wire(int, 0, U64, required=False, default=0)


@_request("crypto_login_query")
class CryptoLoginQuery(Request):
    login: int = _handle()


# ibv_get_async_event(3): the oldest event of the context, waiting up to timeout s (reply
# event: null when none came); ibv_ack_async_event(3) by the event's id.
@_request("get_async_event")
class GetAsyncEvent(Request):
    ctx: int = _handle()
    timeout: float = _wire((int, float), 0, 3600)


@_request("ack_async_event")
class AckAsyncEvent(Request):
    event: int = _handle()


@_request("cancel_posted_send_wrs")
class CancelPostedSendWrs(Request):
    qp: int = _handle()
    wr_id: int = _u64()


@_request("destroy_crypto_login")
class DestroyCryptoLogin(Request):
    login: int = _handle()


# -- the daemon's: fault injection (server/faults.py validates the rule's own fields),
# counters, pushed events. daemon_wide: the rule matches every session's QPs and
# outlives this session; the subscription sees every session's traffic.
@_request("faults_add")
class FaultsAdd(Request):
    rule: dict = _wire(dict, 1, 32)
    daemon_wide: bool = _wire(bool, required=False, default=False)


@_request("faults_list")
class FaultsList(Request):
    pass


@_request("faults_clear")
class FaultsClear(Request):
    rule_id: int | None = _wire(int, 1, U32, required=False)
    daemon_wide: bool = _wire(bool, required=False, default=False)


@_request("counters")
class Counters(Request):
    pass


# Pushed events: {"t": "event", "kind": "packets" | "trace", ...} frames without an id.
@_request("subscribe")
class Subscribe(Request):
    events: frozenset[str] = _wire(list, 0, 2, decode=_event_kinds)
    daemon_wide: bool = _wire(bool, required=False, default=False)


# Every verb's header fields: (type(s), min, max, required) by name.
REQUESTS: dict[str, dict[str, tuple]] = {verb: cls.SCHEMA for verb, cls in BY_VERB.items()}


def decode_request(header: dict, payload: memoryview) -> tuple[int, Request]:
    """(id, typed request) of a control request, or FrameError("EPROTO") naming the
    fault (the verbs' EINVAL for a value C itself would refuse)."""
    rid = header.get("id")
    if type(rid) is not int or not 0 <= rid <= U32:
        rid = field(header, "id", int, min=0, max=U32)      # refuses it, naming why
    verb = header["t"]
    cls = BY_VERB.get(verb)
    if cls is None:
        raise FrameError("EPROTO", f"unknown control request {verb!r}"[:120])
    return rid, cls.decode(header, payload)


def _access_flags(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64:
        raise FrameError("EPROTO", f"{what}: access_flags must be an unsigned int")
    return value


def _layout_list(value: Any, what: str) -> list:
    if not isinstance(value, list):
        raise FrameError("EPROTO", f"{what}: layout_list must be a list of SGEs")
    return sges_from_wire(value, what)


def _is_u(v: Any, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= hi


def _layout_interleaved(value: Any, what: str) -> tuple[int, list[MrInterleaved]]:
    if (not isinstance(value, list) or len(value) != 2 or not _is_u(value[0], U32)
            or not isinstance(value[1], list)):
        raise FrameError("EPROTO", f"{what}: layout_interleaved must be "
                                   f"[repeat_count, entries]")
    entries = []
    for i, e in enumerate(value[1]):
        if not isinstance(e, list) or len(e) != 4 or not all(_is_u(v, U64) for v in e):
            raise FrameError("EPROTO", f"{what}: interleaved entry {i} must be "
                                       f"[addr, bytes_count, bytes_skip, lkey]")
        entries.append(MrInterleaved(*e))
    return value[0], entries


def _sig_block(value: Any, what: str) -> SigBlockAttr:
    return attr_from_wire(SigBlockAttr, value, f"{what} sig_block")


def _crypto(value: Any, what: str) -> CryptoAttr:
    return attr_from_wire(CryptoAttr, value, f"{what} crypto")


# Each setter's decoder, by its wire name (SETTERS).
_SETTER_DECODERS: dict[str, Callable[[Any, str], Any]] = {
    "access_flags": _access_flags, "layout_list": _layout_list,
    "layout_interleaved": _layout_interleaved, "sig_block": _sig_block, "crypto": _crypto}


def setter_from_wire(kind: Any, value: Any, what: str) -> tuple[str, Any]:
    """One [kind, value] setter of a configure WR, decoded to the engine's argument."""
    decode = _SETTER_DECODERS.get(kind) if isinstance(kind, str) else None
    if decode is None:
        raise FrameError("EPROTO", f"{what}: unknown setter {kind!r}"[:120])
    return kind, decode(value, what)


__all__ = [
    "BY_VERB", "CONFIGURE_CALL", "EVENT_KINDS", "MAX_CONFIGURE_ENTRIES", "MAX_CQE",
    "MAX_CREDITS", "MAX_SGE", "MAX_WRS_PER_POST", "QP_ATTR", "REQUESTS", "SETTERS",
    "SYSV_PIECE",
    "U32", "U64", "ConfigureCall", "MkeyConfAttr", "Request", "SetterCall",
    "attr_from_wire", "attr_to_wire", "check_fields", "decode_request",
    "setter_from_wire", "sge_to_wire", "sges_from_wire",
]
