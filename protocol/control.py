"""Control-plane messages: one schema per request, the reply shapes, attribute codecs.

A request is one frame ``{"t": <verb>, "id": <u32>, <fields>...}`` (payload: the
bytes of ``mr_write``). Every request gets exactly one reply with the same id:

- ``{"t": "ok", "id": n, <result fields>...}`` (payload: the bytes of ``mr_read``),
- ``{"t": "err", "id": n, "errno": "EINVAL", "msg": "<sentence>"}``.

``REQUESTS`` names each verb's fields with their types and bounds; ``check_request``
validates a header against it before the daemon looks at anything, so a handler
only ever sees well-typed, in-range values, and an unknown verb or field is refused
with EPROTO naming it. The attribute structs (``protocol.attrs``) travel as maps with
their C field names, nested the way the C structs nest; ``attr_to_wire`` /
``attr_from_wire`` convert, refusing unknown fields and wrong leaf types.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .attrs import (
    SGE,
    CryptoAttr,
    MkeyConfAttr,
    MrInterleaved,
    SigBlockAttr,
    SigBlockDomain,
    SigCrc,
    SigT10dif,
)
from .frames import FrameError, field

U8, U16, U32, U64 = (1 << 8) - 1, (1 << 16) - 1, (1 << 32) - 1, (1 << 64) - 1
I32 = (1 << 31) - 1
MAX_SGE = 32
# WRs in one post_send / post_recv request: decoding and posting them is one stretch of
# the daemon's event loop, kept to a few milliseconds (the client splits longer lists).
MAX_WRS_PER_POST = 256
# [cq, n] pairs in one cq_credit frame (a client sends one per CQ it polled since the last).
MAX_CREDITS = 1024

# Field spec: (type(s), min, max, required).
_H = (int, 1, U32, True)          # a session handle
_U32 = (int, 0, U32, True)
_U64 = (int, 0, U64, True)
_BOOL = (bool, None, None, True)

REQUESTS: dict[str, dict[str, tuple]] = {
    "devices": {},
    "open_device": {"name": (str, 1, 64, True)},
    "query_device": {"ctx": _H},
    "close_device": {"ctx": _H},
    "alloc_pd": {"ctx": _H},
    "dealloc_pd": {"pd": _H},
    # The bounds here are what the call's C types hold (a size_t length, an int cqe):
    # beyond them a request is malformed (EPROTO). What the verbs themselves refuse
    # inside those types (ibv_reg_mr of 0 bytes, a cqe over max_cqe) is the handler's
    # and the engine's, EINVAL in the verbs' words.
    "reg_mr": {"pd": _H, "length": _U64, "access": _U32},
    "dereg_mr": {"mr": _H},
    "mr_write": {"mr": _H, "offset": _U64},
    "mr_read": {"mr": _H, "offset": _U64, "length": _U64},
    # push: the daemon sends this CQ's completions to the session as it makes them
    # ("wc" frames); the client polls them locally and returns room with cq_credit.
    "create_cq": {"ctx": _H, "cqe": (int, 0, I32, True), "push": (bool, None, None, False)},
    "destroy_cq": {"cq": _H},
    # The entries of pushed CQs the application has polled, [[cq, n], ...]: room the
    # daemon gives back. No reply when accepted (the client sends id 0 and does not
    # wait); an error reply (EPROTO, ENOENT) with the frame's id otherwise.
    "cq_credit": {"credits": (list, 1, MAX_CREDITS, True)},
    "poll_cq": {"cq": _H, "num": (int, 1, 1 << 16, True),
                "timeout": ((int, float), 0, 3600, True)},
    "create_qp": {"pd": _H, "scq": _H, "rcq": _H, "qp_type": _U32,
                  "max_send_wr": (int, 1, 1 << 16, True), "max_recv_wr": (int, 1, 1 << 16, True),
                  "max_send_sge": (int, 0, MAX_SGE, True), "max_recv_sge": (int, 0, MAX_SGE, True),
                  "max_inline_data": (int, 0, 1 << 16, True), "sq_sig_all": _BOOL,
                  "send_ops_flags": _U64, "create_flags": (int, 0, U32, False)},
    "destroy_qp": {"qp": _H},
    "modify_qp": {"qp": _H, "attr": (dict, 0, 32, True), "mask": _U32},
    "query_qp": {"qp": _H},
    # Each of "wrs" is a protocol.records.SEND_WR / RECV_WR.
    "post_send": {"qp": _H, "wrs": (list, 1, MAX_WRS_PER_POST, True)},
    "post_recv": {"qp": _H, "wrs": (list, 1, MAX_WRS_PER_POST, True)},
    "create_mkey": {"pd": _H, "create_flags": _U32, "max_entries": (int, 0, 1 << 16, True)},
    "destroy_mkey": {"mkey": _H},
    "mkey_configure": {"qp": _H, "calls": (list, 0, 2048, True)},
    "mkey_check": {"mkey": _H},
    # key is char key[128] (wrapped 256-bit with keytag: 80); crypto_login is a
    # create_crypto_login handle, 0 for NULL.
    "create_dek": {"ctx": _H, "pd": _H, "key_size": _U32, "key": (bytes, 0, 128, True),
                   "has_keytag": _BOOL, "keytag": (bytes, 0, 8, True),
                   "key_purpose": _U32, "opaque": (bytes, 0, 8, False),
                   "comp_mask": (int, 0, U64, False), "crypto_login": (int, 0, U32, False)},
    "destroy_dek": {"dek": _H},
    "query_dek": {"dek": _H},
    "query_mlx5_device": {"ctx": _H},
    # mlx5dv_crypto_login(3) (a session of the context) and mlx5dv_crypto_login_create(3)
    # (an object): the credential as given, wrapped (48 bytes for this device).
    "crypto_login": {"ctx": _H, "credential": (bytes, 0, 4096, True), "import_kek_id": _U32,
                     "credential_id": (int, 0, U32, False), "comp_mask": (int, 0, U64, False)},
    "crypto_login_query_state": {"ctx": _H},
    "crypto_logout": {"ctx": _H},
    "create_crypto_login": {"ctx": _H, "credential": (bytes, 0, 4096, True),
                            "import_kek_id": _U32, "credential_id": (int, 0, U32, False),
                            "comp_mask": (int, 0, U64, False)},
    "crypto_login_query": {"login": _H},
    # ibv_get_async_event(3): the oldest event of the context, waiting up to timeout s
    # (reply event: null when none came); ibv_ack_async_event(3) by the event's id.
    "get_async_event": {"ctx": _H, "timeout": ((int, float), 0, 3600, True)},
    "ack_async_event": {"event": _H},
    "cancel_posted_send_wrs": {"qp": _H, "wr_id": _U64},
    "destroy_crypto_login": {"login": _H},
    # Fault injection (server/faults.py validates the rule's own fields).
    # daemon_wide: the rule matches every session's QPs and outlives this session.
    "faults_add": {"rule": (dict, 1, 32, True), "daemon_wide": (bool, None, None, False)},
    "faults_list": {},
    "faults_clear": {"rule_id": (int, 1, U32, False), "daemon_wide": (bool, None, None, False)},
    "counters": {},
    # Pushed events: {"t": "event", "kind": "packets" | "trace", ...} frames without an id.
    # daemon_wide: every session's traffic, not only this session's QPs'.
    "subscribe": {"events": (list, 0, 2, True), "daemon_wide": (bool, None, None, False)},
}

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
           "en_sqd_async_notify": (int, 0, 1, False)}


def check_fields(header: dict, schema: dict[str, tuple], what: str) -> dict:
    """Validate ``header`` against ``schema``; unknown fields are refused."""
    extra = set(header) - set(schema) - {"t", "id"}
    if extra:
        raise FrameError("EPROTO", f"{what} has unknown field(s): "
                                   f"{', '.join(sorted(map(str, extra)))[:120]}")
    out = {}
    for name, (typ, lo, hi, required) in schema.items():
        out[name] = field(header, name, typ, min=lo, max=hi, required=required)
    return out


def check_request(header: dict) -> tuple[str, int, dict]:
    """(verb, id, fields) of a control request, or FrameError("EPROTO") naming the fault."""
    rid = field(header, "id", int, min=0, max=U32)
    verb = header["t"]
    schema = REQUESTS.get(verb)
    if schema is None:
        raise FrameError("EPROTO", f"unknown control request {verb!r}"[:120])
    return verb, rid, check_fields(header, schema, f"request '{verb}'")


def sges_from_wire(items: list, what: str) -> list[SGE]:
    out = []
    for i, s in enumerate(items):
        if (not isinstance(s, list) or len(s) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in s)
                or not (0 <= s[0] <= U64 and 0 <= s[1] <= U32 and 0 <= s[2] <= U32)):
            raise FrameError("EPROTO", f"{what} SGE {i} must be [addr u64, length u32, "
                                       f"lkey u32]")
        out.append(SGE(*s))
    return out


def sge_to_wire(s: SGE) -> list:
    return [int(s.addr), int(s.length), int(s.lkey)]


# -- attribute structs -------------------------------------------------------------

# Which fields hold a nested struct, per struct.
_NESTED: dict[type, dict[str, type]] = {
    SigBlockAttr: {"mem": SigBlockDomain, "wire": SigBlockDomain},
    SigBlockDomain: {"dif": SigT10dif, "crc": SigCrc},
}
# Leaf types by default value type; ``dek`` travels as the DEK's handle.
_HANDLE_FIELDS = {(CryptoAttr, "dek")}


def attr_to_wire(obj: Any) -> Any:
    """A protocol.attrs record as a msgpack-ready map (DEK objects as their handle)."""
    if obj is None:
        return None
    if isinstance(obj, SGE):
        return sge_to_wire(obj)
    if isinstance(obj, MrInterleaved):
        return [int(obj.addr), int(obj.bytes_count), int(obj.bytes_skip), int(obj.lkey)]
    out = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if (type(obj), f.name) in _HANDLE_FIELDS:
            v = getattr(v, "handle", v)
        elif dataclasses.is_dataclass(v):
            v = attr_to_wire(v)
        elif isinstance(v, bool):
            v = bool(v)
        elif isinstance(v, int):
            v = int(v)      # IntEnum members go as plain ints
        out[f.name] = v
    return out


def attr_from_wire(cls: type, data: Any, what: str) -> Any:
    """The inverse of attr_to_wire for ``cls``: unknown fields and wrong types are EPROTO."""
    if not isinstance(data, dict):
        raise FrameError("EPROTO", f"{what} must be a map of {cls.__name__} fields")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    extra = set(data) - set(fields)
    if extra:
        raise FrameError("EPROTO", f"{what} has unknown field(s) "
                                   f"{', '.join(sorted(map(str, extra)))[:100]}")
    kwargs = {}
    nested = _NESTED.get(cls, {})
    for name, value in data.items():
        where = f"{what}.{name}"
        if name in nested:
            kwargs[name] = None if value is None else attr_from_wire(nested[name], value, where)
            continue
        if (cls, name) in _HANDLE_FIELDS:
            ok = value is None or (isinstance(value, int) and not isinstance(value, bool))
        else:
            default = fields[name].default
            if default is dataclasses.MISSING and fields[name].default_factory \
                    is not dataclasses.MISSING:
                default = fields[name].default_factory()
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool) \
                    and 0 <= value <= U64
            elif isinstance(default, bytes):
                ok = isinstance(value, bytes) and len(value) <= 64
            else:
                ok = value is None
        if not ok:
            why = (f"must be a handle (int) or nil, got {type(value).__name__}"
                   if (cls, name) in _HANDLE_FIELDS else _wanted(default, value))
            raise FrameError("EPROTO", f"{where} {why}")
        kwargs[name] = value
    return cls(**kwargs)


def _wanted(default: Any, value: Any) -> str:
    """Why a leaf field was refused: its range when the type was right (a -1 in a
    __u32 is out of range, not of the wrong type), else the type it takes."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, int) and not isinstance(default, bool) and is_int:
        return f"must be an unsigned integer in [0, {U64}], got {value}"
    if isinstance(default, bytes) and isinstance(value, bytes):
        return f"must be at most 64 bytes, got {len(value)}"
    want = ("bool" if isinstance(default, bool) else "int" if isinstance(default, int)
            else "bytes" if isinstance(default, bytes) else "nil")
    return f"must be {want}, got {type(value).__name__}"


def setter_from_wire(kind: Any, value: Any, what: str) -> tuple[str, Any]:
    """One [kind, value] setter of a configure WR, decoded to the engine's argument."""
    if kind == "access_flags":
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= U64:
            raise FrameError("EPROTO", f"{what}: access_flags must be an unsigned int")
        return kind, value
    if kind == "layout_list":
        if not isinstance(value, list):
            raise FrameError("EPROTO", f"{what}: layout_list must be a list of SGEs")
        return kind, sges_from_wire(value, what)
    if kind == "layout_interleaved":
        if (not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int)
                or isinstance(value[0], bool) or not 0 <= value[0] <= U32
                or not isinstance(value[1], list)):
            raise FrameError("EPROTO", f"{what}: layout_interleaved must be "
                                       f"[repeat_count, entries]")
        entries = []
        for i, e in enumerate(value[1]):
            if (not isinstance(e, list) or len(e) != 4
                    or not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U64
                               for v in e)):
                raise FrameError("EPROTO", f"{what}: interleaved entry {i} must be "
                                           f"[addr, bytes_count, bytes_skip, lkey]")
            entries.append(MrInterleaved(*e))
        return kind, (value[0], entries)
    if kind == "sig_block":
        return kind, attr_from_wire(SigBlockAttr, value, f"{what} sig_block")
    if kind == "crypto":
        return kind, attr_from_wire(CryptoAttr, value, f"{what} crypto")
    raise FrameError("EPROTO", f"{what}: unknown setter {kind!r}"[:120])


__all__ = [
    "CONFIGURE_CALL", "MAX_CREDITS", "MAX_SGE", "MAX_WRS_PER_POST", "MkeyConfAttr", "QP_ATTR", "REQUESTS", "SETTERS",
    "attr_from_wire", "attr_to_wire", "check_fields", "check_request",
    "setter_from_wire", "sge_to_wire", "sges_from_wire",
]
