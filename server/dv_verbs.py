"""The mlx5dv verbs of a control session: MKEYs and their configure WRs, DEKs, crypto
logins, the device's mlx5 caps and canceling posted send WRs (mlx5dv.h).

Each handler is a function of the session's ``Verbs`` (server/verbs.py), whose object
table it uses (``get``, ``add``, ``destroy_handle``, ``objects``), the request and its id,
named in this module's ``HANDLERS`` as every handler module names its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from ..engine import qp_state
from ..engine.crypto_login import DEK_INIT_ATTR_CRYPTO_LOGIN, CryptoLogin, login
from ..engine.hca import DEK, HCA, PD
from ..engine.mkey import MKey
from ..engine.mkey_configure import MkeyConfigureBuilder
from ..protocol import control
from ..protocol.attrs import DEKInitAttr, MkeyConfAttr
from ..protocol.enums import (
    BLOCK_SIZE_BYTES,
    CRC_PI_BYTES,
    CryptoLoginState,
    SigT10difBgType,
    SigType,
    WcOpcode,
)
from ..protocol.errors import RDMAError, einval
from .hosts import QPHost

# mlx5dv.h enum mlx5dv_context_comp_mask: sig_caps and crypto_caps are filled.
MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD = 1 << 10
MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD = 1 << 13


def _bits(values) -> int:
    """A caps mask (mlx5dv.h's *_caps enums: bit 1 << value) of the values modelled."""
    return sum(1 << int(v) for v in values)


# struct mlx5dv_sig_caps of every softhca device: what engine/signature.py computes
# (each mlx5dv_block_size, T10-DIF with CRC or IP checksum guards, the three CRCs).
SIG_CAPS = {"block_size": _bits(BLOCK_SIZE_BYTES), "block_prot": _bits(SigType),
            "t10dif_bg": _bits(SigT10difBgType), "crc_type": _bits(CRC_PI_BYTES)}


def _set_layout_interleaved(b: MkeyConfigureBuilder, value: tuple) -> None:
    b.wr_set_mkey_layout_interleaved(*value)


# mlx5dv_wr_set_mkey_* by setter (control.SETTERS), each given the builder and the value.
_SET_MKEY: dict[str, Callable[[MkeyConfigureBuilder, Any], None]] = {
    "access_flags": MkeyConfigureBuilder.wr_set_mkey_access_flags,
    "layout_list": MkeyConfigureBuilder.wr_set_mkey_layout_list,
    "layout_interleaved": _set_layout_interleaved,
    "sig_block": MkeyConfigureBuilder.wr_set_mkey_sig_block,
    "crypto": MkeyConfigureBuilder.wr_set_mkey_crypto,
}


@dataclasses.dataclass(eq=False)
class LoginEntry:
    """A crypto login of one context: its session (mlx5dv_crypto_login, ``api``
    "session") or its object (mlx5dv_crypto_login_create, "object")."""

    ctx: int
    api: str
    login: CryptoLogin


# -- mlx5dv: MKEYs and DEKs ---------------------------------------------------------
def op_create_mkey(v, r: control.CreateMkey, rid: int) -> dict | None:
    pd: PD = v.get(r.pd, "pd")
    mkey = pd.hca.create_mkey(pd, r.create_flags, r.max_entries)
    return {"mkey": v.add("mkey", mkey), "lkey": mkey.lkey, "rkey": mkey.rkey}


def op_destroy_mkey(v, r: control.DestroyMkey, rid: int) -> dict | None:
    return v.destroy_handle(r.mkey, "mkey")


def op_mkey_check(v, r: control.MkeyCheck, rid: int) -> dict | None:
    mkey: MKey = v.get(r.mkey, "mkey")
    err = mkey.mkey_check()
    return {"err_type": int(err.err_type), "actual_value": int(err.actual_value),
            "expected_value": int(err.expected_value), "offset": int(err.offset)}


def op_mkey_configure(v, r: control.MkeyConfigure, rid: int) -> dict | None:
    """mlx5dv_wr_mkey_configure(3) and its setters, replayed between ibv_wr_start and
    ibv_wr_complete: the batch is validated whole and applied whole, or not at all."""
    qph: QPHost = v.get(r.qp, "qp")
    calls = [_resolve(v, c) for c in r.calls]
    q = qph.rcqp
    # In ERR the WRs are built and then flushed by the send queue (RCQP.post_local).
    qp_state.require("ibv_wr_mkey_configure", q.state)
    b = qph.builder
    b.wr_start()
    for call, mkey in calls:
        if isinstance(call, control.ConfigureCall):
            b.wr_id, b.wr_flags = call.wr_id, call.wr_flags
            b.wr_mkey_configure(mkey, call.num_setters,
                                MkeyConfAttr(conf_flags=call.conf_flags,
                                             comp_mask=call.comp_mask))
        else:
            _SET_MKEY[call.kind](b, call.value)
    posted = b.wr_complete()
    now = asyncio.get_running_loop().time()
    for p in posted:
        q.post_local(p.wr_id, p.signaled, WcOpcode.DRIVER1, now=now)
    v.daemon.service(qph)
    return {"posted": len(posted)}


def _resolve(v, call: control.ConfigureCall | control.SetterCall) -> tuple[Any, Any]:
    """A configure call with the session's handles it names made objects: the MKEY
    of mlx5dv_wr_mkey_configure, the DEK of a crypto setter."""
    if isinstance(call, control.ConfigureCall):
        return call, v.get(call.mkey, "mkey")
    if call.kind == "crypto" and call.value.dek is not None:
        value = dataclasses.replace(call.value, dek=v.get(call.value.dek, "dek"))
        return control.SetterCall(call.kind, value), None
    return call, None


def op_create_dek(v, r: control.CreateDek, rid: int) -> dict | None:
    hca: HCA = v.get(r.ctx, "ctx")
    pd: PD = v.get(r.pd, "pd")
    if pd.hca is not hca:
        raise einval("mlx5dv_dek_create: the PD belongs to another device")
    lg = None
    comp_mask = r.comp_mask
    if r.crypto_login:
        entry: LoginEntry = v.get(r.crypto_login, "crypto_login")
        if entry.api != "object" or entry.ctx != r.ctx:
            raise einval("mlx5dv_dek_create: crypto_login is not a crypto login object of "
                         "this context (mlx5dv_crypto_login_create)")
        lg = entry.login
    elif not comp_mask & DEK_INIT_ATTR_CRYPTO_LOGIN:
        session = _login_entry(v, r.ctx, "session")
        lg = session.login if session else None
    dek = hca.create_dek(DEKInitAttr(key_size=r.key_size, key=r.key,
                                     has_keytag=r.has_keytag, keytag=r.keytag,
                                     key_purpose=r.key_purpose, pd=pd,
                                     opaque=r.opaque, comp_mask=comp_mask,
                                     crypto_login=lg if r.crypto_login else None),
                         session_login=lg)
    # The session's handle names it to the client; the engine keeps its own.
    return {"dek": v.add("dek", dek)}


def op_query_dek(v, r: control.QueryDek, rid: int) -> dict | None:
    """mlx5dv_dek_query(3): a wrapped DEK is queried only inside a valid crypto login
    (a session or an object of this session on the DEK's device)."""
    dek: DEK = v.get(r.dek, "dek")
    if dek.wrapped and not any(
            kind == "crypto_login" and o.login.state == CryptoLoginState.VALID
            and v.objects.get(o.ctx, (None, None))[1] is dek.pd.hca
            for kind, o in v.objects.values()):
        raise einval("mlx5dv_dek_query: a wrapped DEK is queried only in a valid crypto "
                     "login session or with a valid crypto login object")
    return {"state": int(dek.state), "opaque": dek.opaque}


# -- mlx5dv: device caps and crypto login (mlx5dv_query_device(3),
# mlx5dv_crypto_login(3), mlx5dv_crypto_login_create(3)) ---------------------------
def op_query_mlx5_device(v, r: control.QueryMlx5Device, rid: int) -> dict | None:
    hca: HCA = v.get(r.ctx, "ctx")
    return {"attr": {"version": 1, "flags": 0,
                     "comp_mask": MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD
                     | MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD,
                     "sig_caps": dict(SIG_CAPS), "crypto_caps": hca.crypto.caps()}}


def _login_entry(v, ctx: int, api: str) -> LoginEntry | None:
    for kind, o in v.objects.values():
        if kind == "crypto_login" and o.ctx == ctx and o.api == api:
            return o
    return None


def _new_login(v, r: control.CryptoLoginReq | control.CreateCryptoLogin, api: str,
               verb: str) -> int:
    hca: HCA = v.get(r.ctx, "ctx")
    if _login_entry(v, r.ctx, api) is not None:
        raise RDMAError("EEXIST", f"{verb}: this context already has a crypto login "
                                  f"{'session' if api == 'session' else 'object'}")
    lg = login(hca.crypto, r.credential, r.import_kek_id, r.credential_id,
               r.comp_mask, verb)
    return v.add("crypto_login", LoginEntry(r.ctx, api, lg))


def op_crypto_login(v, r: control.CryptoLoginReq, rid: int) -> dict | None:
    _new_login(v, r, "session", "mlx5dv_crypto_login")
    return {}


def op_crypto_login_query_state(v, r: control.CryptoLoginQueryState, rid: int) -> dict | None:
    v.get(r.ctx, "ctx")
    entry = _login_entry(v, r.ctx, "session")
    return {"state": int(entry.login.state if entry else CryptoLoginState.NO_LOGIN)}


def op_crypto_logout(v, r: control.CryptoLogout, rid: int) -> dict | None:
    v.get(r.ctx, "ctx")
    for handle, (kind, o) in list(v.objects.items()):
        if kind == "crypto_login" and o.ctx == r.ctx and o.api == "session":
            return v.destroy_handle(handle, "crypto_login")
    raise RDMAError("ENOENT", "mlx5dv_crypto_logout: no crypto login session exists on "
                              "this context")


def op_create_crypto_login(v, r: control.CreateCryptoLogin, rid: int) -> dict | None:
    return {"login": _new_login(v, r, "object", "mlx5dv_crypto_login_create")}


def op_crypto_login_query(v, r: control.CryptoLoginQuery, rid: int) -> dict | None:
    entry: LoginEntry = v.get(r.login, "crypto_login")
    return {"state": int(entry.login.state)}


def op_destroy_crypto_login(v, r: control.DestroyCryptoLogin, rid: int) -> dict | None:
    entry: LoginEntry = v.get(r.login, "crypto_login")
    if entry.api != "object":
        raise einval("mlx5dv_crypto_login_destroy: that is a login session; end it with "
                     "mlx5dv_crypto_logout")
    return v.destroy_handle(r.login, "crypto_login")


def op_cancel_posted_send_wrs(v, r: control.CancelPostedSendWrs, rid: int) -> dict | None:
    """mlx5dv_qp_cancel_posted_send_wrs(3): the number of WRs canceled."""
    qph: QPHost = v.get(r.qp, "qp")
    n = qph.rcqp.cancel_posted_send_wrs(r.wr_id)
    v.daemon.service(qph)
    return {"canceled": n}


def op_destroy_dek(v, r: control.DestroyDek, rid: int) -> dict | None:
    return v.destroy_handle(r.dek, "dek")


HANDLERS = {
    control.CreateMkey: op_create_mkey,
    control.DestroyMkey: op_destroy_mkey,
    control.MkeyCheck: op_mkey_check,
    control.MkeyConfigure: op_mkey_configure,
    control.CreateDek: op_create_dek,
    control.QueryDek: op_query_dek,
    control.QueryMlx5Device: op_query_mlx5_device,
    control.CryptoLoginReq: op_crypto_login,
    control.CryptoLoginQueryState: op_crypto_login_query_state,
    control.CryptoLogout: op_crypto_logout,
    control.CreateCryptoLogin: op_create_crypto_login,
    control.CryptoLoginQuery: op_crypto_login_query,
    control.DestroyCryptoLogin: op_destroy_crypto_login,
    control.CancelPostedSendWrs: op_cancel_posted_send_wrs,
    control.DestroyDek: op_destroy_dek,
}
