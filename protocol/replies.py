"""The daemon's side of the control protocol: each reply's fields, each pushed frame's.

protocol/control.py describes what a client sends; this module describes what comes
back, in the same spec form ``(type(s), min, max, required)`` (protocol/schema.py):

- ``REPLIES``: the fields of the ``ok`` reply to each request, by verb (an empty map:
  the reply carries none; mr_read's bytes are the payload);
- ``FRAMES``: the frames that are no reply to a request: the HELLO exchange's
  (``challenge``, ``hello``, ``welcome``), ``err``, a pushed CQ's ``wc`` frame and an
  rdma_cm event (``cm_event``, an ``event`` frame with a ``cm`` field);
- ``MAPS``: the maps nested in them, by path: ``"<reply or frame>.<field>"`` (and
  deeper, ``"query_device.attr.odp_caps"``), the struct they stand for named beside;
- ``ATTR_MAPS``: mkey_configure's nested attribute maps (mlx5dv_wr_set_mkey_sig_block,
  mlx5dv_wr_set_mkey_crypto), written from protocol/attrs.py's records as
  protocol/attrs_wire.py sends them.

The daemon checks each reply against ``REPLIES`` before it goes (server/session.py),
and builds its welcome, ``err`` and rdma_cm event frames through ``frame``; the C
libraries take the keys from provider/wire.h, which tools/gen_wire_h.py writes from
these tables, and tests/unit/test_wire_codec.py reads what the real handlers answer
with the C side's tables.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .attrs import CryptoAttr, SigBlockAttr
from .attrs_wire import NESTED
from .cm import EVENTS as CM_EVENTS
from .errors import RDMAError
from .frames import FrameError
from .handshake import ROLES
from .kinds import FrameKind
from .schema import I32, U32, U64, check_fields

__all__ = ["ATTR_MAPS", "CM_EVENTS", "FRAMES", "HELLO_ROLES", "MAPS", "REPLIES", "attr_spec",
           "attr_struct", "err_frame",
           "check_frame", "check_map", "check_reply", "frame"]

_NIL = type(None)
# A HELLO's roles: a session's and a wire link's (protocol/handshake.py), and the UNIX
# socket's memfd handoff (server/unix.py).
HELLO_ROLES = (*ROLES, "memfd")
_H = (int, 1, U32, True)            # a session handle
_U32 = (int, 0, U32, True)
_U64 = (int, 0, U64, True)
_I32 = (int, -I32 - 1, I32, True)
_BOOL = (bool, None, None, True)
_MAP = (dict, None, None, True)
_LIST = (list, None, None, True)
_STR = (str, None, None, True)
_BYTES = (bytes, None, None, True)
_QPN = (int, 0, (1 << 24) - 1, True)
_BYTE = (int, 0, 255, True)


def _opt(spec: tuple) -> tuple:
    """The spec as an optional field (absent when the daemon has nothing to say)."""
    return (*spec[:3], False)


def _nullable(spec: tuple) -> tuple:
    """The spec with nil allowed (no bounds: nil has no length)."""
    return ((spec[0], _NIL), None, None, spec[3])


# The reply to a registration: ibv_reg_mr(3)'s struct ibv_mr (reg_mr, reg_mr_shared,
# reg_mr_process, rereg_mr).
_MR = {"mr": _H, "lkey": _U32, "rkey": _U32, "addr": _U64, "length": _U64}

REPLIES: dict[str, dict[str, tuple]] = {
    "devices": {"devices": _LIST},
    "open_device": {"ctx": _H, "name": _STR},
    "query_device": {"attr": _MAP},
    "close_device": {},
    "alloc_pd": {"pd": _H},
    "dealloc_pd": {},
    "reg_mr": _MR,
    "reg_mr_shared": _MR,
    "reg_mr_process": _MR,
    "dereg_mr": {},
    "mr_write": {},
    "mr_read": {},                  # the bytes are the payload
    "alloc_mw": {"mw": _H, "rkey": _U32},
    "dealloc_mw": {},
    "rereg_mr": _MR,
    "advise_mr": {},
    "resize_cq": {"cqe": (int, 0, I32, True)},
    # ring: the CQ's completions go into the program's ring (protocol/cq_ring.py).
    "create_cq": {"cq": _H, "cqe": (int, 0, I32, True), "push": _BOOL, "ring": _opt(_BOOL)},
    "destroy_cq": {},
    "cq_credit": {},                # no reply when accepted; an err one otherwise
    "req_notify_cq": {},            # the same; a cq_event frame follows
    "doorbell": {},                 # no reply when accepted; an err one otherwise
    "poll_cq": {"wcs": _LIST},      # each a WC as protocol/records.py WC_FIELDS
    # ring_queues: the queues (protocol/wq_ring.py QUEUE_SEND, QUEUE_RECV) whose WRs
    # the daemon takes from the program's ring, those the request offered.
    "create_qp": {"qp": _H, "qp_num": _QPN, "ring_queues": _opt((int, 0, 3, True))},
    "create_ah": {"ah": _H},
    "destroy_ah": {},
    "destroy_qp": {},
    "modify_qp": {"state": (int, 0, 6, True)},
    "query_qp": {"attr": _MAP},
    "post_send": {},                # a refused WR's index is the err frame's bad_wr
    "post_recv": {},
    "create_srq": {"srq": _H, "max_wr": _U32, "max_sge": _U32},
    "modify_srq": {},
    "query_srq": {"attr": _MAP},
    "destroy_srq": {},
    "post_srq_recv": {},
    "create_mkey": {"mkey": _H, "lkey": _U32, "rkey": _U32},
    "destroy_mkey": {},
    "mkey_configure": {"posted": _U32},
    # struct mlx5dv_mkey_err (mlx5dv_mkey_check(3))
    "mkey_check": {"err_type": _U32, "actual_value": _U64, "expected_value": _U64,
                   "offset": _U64},
    "create_dek": {"dek": _H},
    "destroy_dek": {},
    "query_dek": {"state": _U32, "opaque": (bytes, 0, 8, True)},
    "query_mlx5_device": {"attr": _MAP},
    "crypto_login": {},
    "crypto_login_query_state": {"state": _U32},
    "crypto_logout": {},
    "create_crypto_login": {"login": _H},
    "crypto_login_query": {"state": _U32},
    "get_async_event": {"event": _nullable(_MAP)},     # nil: none came in the timeout
    "ack_async_event": {},
    "cancel_posted_send_wrs": {"canceled": _U32},
    "destroy_crypto_login": {},
    "faults_add": {"rule": _MAP},   # server/faults.py's rule, as faults_list shows it
    "faults_list": {"rules": _LIST},
    "faults_clear": {"cleared": _U32},
    "counters": {"counters": _MAP},
    "subscribe": {"events": _LIST, "daemon_wide": _BOOL},
    "cm_create_id": {"cmid": _H},
    "cm_destroy_id": {},
    "cm_bind": {"port": (int, 0, 65535, True)},
    "cm_resolve_addr": {},
    "cm_resolve_route": {},
    "cm_listen": {},
    "cm_connect": {},
    "cm_accept": {},
    "cm_reject": {},
    "cm_establish": {},
    "cm_disconnect": {},
    "cm_counts": {"session": _MAP, "daemon": _MAP},
}

# The rdma_cm event's address fields: the device's index among the daemon's, and
# struct rdma_addr (the route's ends, as sockaddrs in text, and the devices' GIDs).
_CM_ADDRS = {"dev": _opt(_U32), "sgid": _opt((bytes, 16, 16, True)),
             "dgid": _opt((bytes, 16, 16, True)), "sip": _opt(_STR),
             "sport": _opt((int, 0, 65535, True)), "dip": _opt(_STR),
             "dport": _opt((int, 0, 65535, True))}

FRAMES: dict[str, dict[str, tuple]] = {
    # protocol/handshake.py: the daemon's challenge, the client's HELLO (a memfd
    # HELLO on the UNIX socket: key and seq, server/unix.py), the daemon's welcome.
    "challenge": {"version": _U32, "nonce": (bytes, 32, 32, True), "auth": _BOOL},
    "hello": {"version": _U32, "role": _STR, "proof": _opt(_BYTES), "src": _opt(_STR),
              "key": _opt(_STR), "seq": _opt(_U64)},
    # devices and max_frame for a session; address, memfd_key and sysv_attach on the
    # UNIX socket; fds and keep answering a memfd HELLO; runs on a wire link (the
    # daemon takes runs frames, protocol/runs.py).
    "welcome": {"role": _STR, "devices": _opt(_LIST), "max_frame": _opt(_U64),
                "address": _opt(_STR), "memfd_key": _opt(_STR),
                "sysv_attach": _opt((int, 0, 1, True)), "fds": _opt(_U32),
                "keep": _opt((int, 0, 1, True)), "cq_ring": _opt((int, 0, 1, True)),
                "runs": _opt((int, 0, 1, True)),
                "wq_ring": _opt((int, 0, 1, True))},
    # A refused request (its id; 0: about the connection): errno's name, a sentence,
    # and a refused post's WR index.
    "err": {"errno": _STR, "msg": _STR, "bad_wr": _opt(_U32)},
    # A pushed CQ's completions (create_cq's push), each a WC list.
    "wc": {"cq": _H, "wcs": _LIST},
    # An armed ring CQ's notification (req_notify_cq): its completions are in the ring.
    "cq_event": {"cq": _H},
    # An rdma_cm event ("t": "event"; the kind in "cm", protocol/cm.py EVENTS); the
    # private data is the payload. listen: the listener of a connect_request; qpn,
    # psn, rr, depth, retry, rnr: the peer's REQ or REP; qkey: a SIDR REP's.
    "cm_event": {"cm": _STR, "cmid": _H, "status": _I32, "listen": _opt(_H),
                 "qpn": _opt(_QPN), "psn": _opt(_QPN), "rr": _opt(_BYTE),
                 "depth": _opt(_BYTE), "retry": _opt(_BYTE), "rnr": _opt(_BYTE),
                 "qkey": _opt(_U32), **_CM_ADDRS},
}

# struct ibv_device_attr(_ex) as query_device's attr carries it.
_DEVICE_ATTR_U32 = ("vendor_id", "vendor_part_id", "max_qp_wr", "max_sge", "max_cqe",
                    "max_qp_rd_atom", "phys_port_cnt", "max_qp", "max_cq", "max_mr",
                    "max_mw", "max_ah", "max_pd", "max_srq", "max_sge_rd",
                    "max_qp_init_rd_atom", "max_res_rd_atom", "page_size_cap",
                    "atomic_cap", "max_pkeys", "local_ca_ack_delay", "max_srq_wr",
                    "max_srq_sge", "max_msg_sz", "gid_tbl_len")

MAPS: dict[str, dict[str, tuple]] = {
    "query_device.attr": {
        "fw_ver": (str, 0, 63, True), **dict.fromkeys(_DEVICE_ATTR_U32, _U32),
        "max_mr_size": _U64, "node_guid": _U64, "device_cap_flags": _U64,
        "device_cap_flags_ex": _U64, "odp_caps": _MAP, "addresses": _LIST},
    # struct ibv_odp_caps: uc and ud transports are not on demand here (absent, 0).
    "query_device.attr.odp_caps": {"general_caps": _U64, "rc_odp_caps": _U32,
                                   "uc_odp_caps": _opt(_U32), "ud_odp_caps": _opt(_U32)},
    # ibv_query_qp(3)'s struct ibv_qp_attr; dest: the peer's [host, port, dev] or nil.
    "query_qp.attr": {"qp_state": (int, 0, 6, True), "qp_num": _QPN, "dest_qp_num": _QPN,
                      "path_mtu": (int, 0, 5, True), "timeout": (int, 0, 31, True),
                      "retry_cnt": (int, 0, 7, True), "rnr_retry": (int, 0, 7, True),
                      "sq_sig_all": _BOOL, "qkey": _U32, "dest": _nullable(_LIST)},
    # struct ibv_srq_attr
    "query_srq.attr": {"max_wr": _U32, "max_sge": _U32, "srq_limit": _U32},
    # struct mlx5dv_context (mlx5dv_query_device(3)), its sig_caps and crypto_caps.
    "query_mlx5_device.attr": {"version": _U32, "flags": _U64, "comp_mask": _U64,
                               "sig_caps": _MAP, "crypto_caps": _MAP},
    "query_mlx5_device.attr.sig_caps": {"block_size": _U64, "block_prot": _U32,
                                        "t10dif_bg": _U32, "crc_type": _U32},
    "query_mlx5_device.attr.crypto_caps": {"failed_selftests": _U32,
                                           "crypto_engines": _U32,
                                           "wrapped_import_method": _U32,
                                           "log_max_num_deks": _U32, "flags": _U32},
    # ibv_get_async_event(3)'s struct ibv_async_event: its id (for ack_async_event),
    # event_type, and the element: a QP's handle and number, a CQ's, an SRQ's.
    "get_async_event.event": {"event": _H, "event_type": _U32, "qp": _opt(_H),
                              "qp_num": _opt(_QPN), "cq": _opt(_H), "srq": _opt(_H)},
}



def _attr_paths(path: str, cls: type) -> dict[str, type]:
    out = {path: cls}
    for name, sub in NESTED.get(cls, {}).items():
        out.update(_attr_paths(f"{path}.{name}", sub))
    return out


# mkey_configure's attribute maps by path: the setter's name, then the nested fields
# ("sig_block.mem.dif"), each with the protocol/attrs.py record it stands for.
ATTR_MAPS: dict[str, type] = {**_attr_paths("sig_block", SigBlockAttr),
                              **_attr_paths("crypto", CryptoAttr)}


def attr_struct(cls: type) -> str:
    """The mlx5dv struct a record stands for, less its prefix: SigT10dif, sig_t10dif."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def attr_spec(cls: type) -> dict[str, tuple]:
    """An attribute record's wire map as specs (protocol/attrs_wire.py's rules: a
    nested record a map or nil, the DEK a handle or nil, an int a u64, bytes at most
    64 long)."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if f.name == "dek":
            out[f.name] = _nullable(_U32)
        elif default is None:
            out[f.name] = _nullable(_MAP)
        elif isinstance(default, bool):
            out[f.name] = _BOOL
        elif isinstance(default, int):
            out[f.name] = _U64
        else:
            out[f.name] = (bytes, 0, 64, True)
    return out


# -- checks ------------------------------------------------------------------------------

# The fields of each reply, frame and map that hold a map of MAPS: (key, its path).
_NESTED_AT: dict[str, tuple[tuple[str, str], ...]] = {
    path: tuple((k, f"{path}.{k}") for k in spec if f"{path}.{k}" in MAPS)
    for table in (REPLIES, FRAMES, MAPS) for path, spec in table.items()}


def _nested(path: str, values: dict) -> None:
    for key, sub in _NESTED_AT[path]:
        if isinstance(values.get(key), dict):
            check_map(sub, values[key])


def check_map(path: str, values: dict) -> None:
    """``values`` against ``MAPS[path]``, the maps nested in it too; FrameError(EPROTO)
    naming the first field out of the table."""
    check_fields({"t": path, **values}, MAPS[path], path)
    _nested(path, values)


def check_reply(verb: str, fields: dict) -> None:
    """The ``ok`` reply to ``verb`` (its fields besides t and id) against ``REPLIES``."""
    spec = REPLIES[verb]
    if not fields and not spec:
        return      # most replies: nothing to look at
    check_fields(fields, spec, f"the reply to '{verb}'")
    if _NESTED_AT[verb]:
        _nested(verb, fields)


def check_frame(kind: str, header: dict) -> None:
    """A frame of ``FRAMES[kind]`` (its header, "t" and "id" aside) against the table."""
    check_fields(header, FRAMES[kind], f"a '{kind}' frame")
    _nested(kind, header)


def err_frame(rid: int, error: RDMAError) -> dict:
    """The ``err`` frame of ``error`` refusing request ``rid`` (0: about the
    connection), with its refused WR's index when it has one."""
    if error.bad_wr is None:
        return frame("err", id=rid, errno=error.errno_name, msg=error.message)
    return frame("err", id=rid, errno=error.errno_name, msg=error.message,
                 bad_wr=error.bad_wr)


def frame(kind: str, **fields: Any) -> dict:
    """The header of a ``kind`` frame with ``fields``, checked against ``FRAMES``: the
    daemon builds its welcome, err and rdma_cm event frames here, so it sends no field the
    C libraries' tables (provider/wire.h) do not name."""
    t = FrameKind.EVENT if kind == "cm_event" else FrameKind(kind)
    header = {"t": t, **fields}
    try:
        check_frame(kind, header)
    except FrameError as e:
        raise AssertionError(f"the daemon built a '{kind}' frame its table does not "
                             f"describe: {e.message}") from None
    return header
