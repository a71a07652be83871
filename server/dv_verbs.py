"""The mlx5dv verbs of a control session: MKEYs and their configure WRs, DEKs, crypto
logins, the device's mlx5 caps and canceling posted send WRs (mlx5dv.h).

``Mlx5dvVerbs`` is mixed into server/verbs.py's ``Verbs``, whose object table it uses
(``get``, ``add``, ``destroy_handle``, ``objects``), so that each stays a class of one
concern; its handlers are in server/verbs.py's ``HANDLERS`` with the others.
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


class Mlx5dvVerbs:
    """The mlx5dv handlers of a session's verbs."""

    # -- mlx5dv: MKEYs and DEKs ---------------------------------------------------------
    def op_create_mkey(self, r: control.CreateMkey, rid: int) -> dict | None:
        pd: PD = self.get(r.pd, "pd")
        mkey = pd.hca.create_mkey(pd, r.create_flags, r.max_entries)
        return {"mkey": self.add("mkey", mkey), "lkey": mkey.lkey, "rkey": mkey.rkey}

    def op_destroy_mkey(self, r: control.DestroyMkey, rid: int) -> dict | None:
        return self.destroy_handle(r.mkey, "mkey")

    def op_mkey_check(self, r: control.MkeyCheck, rid: int) -> dict | None:
        mkey: MKey = self.get(r.mkey, "mkey")
        err = mkey.mkey_check()
        return {"err_type": int(err.err_type), "actual_value": int(err.actual_value),
                "expected_value": int(err.expected_value), "offset": int(err.offset)}

    def op_mkey_configure(self, r: control.MkeyConfigure, rid: int) -> dict | None:
        """mlx5dv_wr_mkey_configure(3) and its setters, replayed between ibv_wr_start and
        ibv_wr_complete: the batch is validated whole and applied whole, or not at all."""
        qph: QPHost = self.get(r.qp, "qp")
        calls = [self._resolve(c) for c in r.calls]
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
        self.daemon.service(qph)
        return {"posted": len(posted)}

    def _resolve(self, call: control.ConfigureCall | control.SetterCall) -> tuple[Any, Any]:
        """A configure call with the session's handles it names made objects: the MKEY
        of mlx5dv_wr_mkey_configure, the DEK of a crypto setter."""
        if isinstance(call, control.ConfigureCall):
            return call, self.get(call.mkey, "mkey")
        if call.kind == "crypto" and call.value.dek is not None:
            value = dataclasses.replace(call.value, dek=self.get(call.value.dek, "dek"))
            return control.SetterCall(call.kind, value), None
        return call, None

    def op_create_dek(self, r: control.CreateDek, rid: int) -> dict | None:
        hca: HCA = self.get(r.ctx, "ctx")
        pd: PD = self.get(r.pd, "pd")
        if pd.hca is not hca:
            raise einval("mlx5dv_dek_create: the PD belongs to another device")
        lg = None
        comp_mask = r.comp_mask
        if r.crypto_login:
            entry: LoginEntry = self.get(r.crypto_login, "crypto_login")
            if entry.api != "object" or entry.ctx != r.ctx:
                raise einval("mlx5dv_dek_create: crypto_login is not a crypto login object of "
                             "this context (mlx5dv_crypto_login_create)")
            lg = entry.login
        elif not comp_mask & DEK_INIT_ATTR_CRYPTO_LOGIN:
            session = self._login_entry(r.ctx, "session")
            lg = session.login if session else None
        dek = hca.create_dek(DEKInitAttr(key_size=r.key_size, key=r.key,
                                         has_keytag=r.has_keytag, keytag=r.keytag,
                                         key_purpose=r.key_purpose, pd=pd,
                                         opaque=r.opaque, comp_mask=comp_mask,
                                         crypto_login=lg if r.crypto_login else None),
                             session_login=lg)
        # The session's handle names it to the client; the engine keeps its own.
        return {"dek": self.add("dek", dek)}

    def op_query_dek(self, r: control.QueryDek, rid: int) -> dict | None:
        """mlx5dv_dek_query(3): a wrapped DEK is queried only inside a valid crypto login
        (a session or an object of this session on the DEK's device)."""
        dek: DEK = self.get(r.dek, "dek")
        if dek.wrapped and not any(
                kind == "crypto_login" and o.login.state == CryptoLoginState.VALID
                and self.objects.get(o.ctx, (None, None))[1] is dek.pd.hca
                for kind, o in self.objects.values()):
            raise einval("mlx5dv_dek_query: a wrapped DEK is queried only in a valid crypto "
                         "login session or with a valid crypto login object")
        return {"state": int(dek.state), "opaque": dek.opaque}

    # -- mlx5dv: device caps and crypto login (mlx5dv_query_device(3),
    # mlx5dv_crypto_login(3), mlx5dv_crypto_login_create(3)) ---------------------------
    def op_query_mlx5_device(self, r: control.QueryMlx5Device, rid: int) -> dict | None:
        hca: HCA = self.get(r.ctx, "ctx")
        return {"attr": {"version": 1, "flags": 0,
                         "comp_mask": MLX5DV_CONTEXT_MASK_SIGNATURE_OFFLOAD
                         | MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD,
                         "sig_caps": dict(SIG_CAPS), "crypto_caps": hca.crypto.caps()}}

    def _login_entry(self, ctx: int, api: str) -> LoginEntry | None:
        for kind, o in self.objects.values():
            if kind == "crypto_login" and o.ctx == ctx and o.api == api:
                return o
        return None

    def _new_login(self, r: control.CryptoLoginReq | control.CreateCryptoLogin, api: str,
                   verb: str) -> int:
        hca: HCA = self.get(r.ctx, "ctx")
        if self._login_entry(r.ctx, api) is not None:
            raise RDMAError("EEXIST", f"{verb}: this context already has a crypto login "
                                      f"{'session' if api == 'session' else 'object'}")
        lg = login(hca.crypto, r.credential, r.import_kek_id, r.credential_id,
                   r.comp_mask, verb)
        return self.add("crypto_login", LoginEntry(r.ctx, api, lg))

    def op_crypto_login(self, r: control.CryptoLoginReq, rid: int) -> dict | None:
        self._new_login(r, "session", "mlx5dv_crypto_login")
        return {}

    def op_crypto_login_query_state(self, r: control.CryptoLoginQueryState, rid: int) -> dict | None:
        self.get(r.ctx, "ctx")
        entry = self._login_entry(r.ctx, "session")
        return {"state": int(entry.login.state if entry else CryptoLoginState.NO_LOGIN)}

    def op_crypto_logout(self, r: control.CryptoLogout, rid: int) -> dict | None:
        self.get(r.ctx, "ctx")
        for handle, (kind, o) in list(self.objects.items()):
            if kind == "crypto_login" and o.ctx == r.ctx and o.api == "session":
                return self.destroy_handle(handle, "crypto_login")
        raise RDMAError("ENOENT", "mlx5dv_crypto_logout: no crypto login session exists on "
                                  "this context")

    def op_create_crypto_login(self, r: control.CreateCryptoLogin, rid: int) -> dict | None:
        return {"login": self._new_login(r, "object", "mlx5dv_crypto_login_create")}

    def op_crypto_login_query(self, r: control.CryptoLoginQuery, rid: int) -> dict | None:
        entry: LoginEntry = self.get(r.login, "crypto_login")
        return {"state": int(entry.login.state)}

    def op_destroy_crypto_login(self, r: control.DestroyCryptoLogin, rid: int) -> dict | None:
        entry: LoginEntry = self.get(r.login, "crypto_login")
        if entry.api != "object":
            raise einval("mlx5dv_crypto_login_destroy: that is a login session; end it with "
                         "mlx5dv_crypto_logout")
        return self.destroy_handle(r.login, "crypto_login")

    def op_cancel_posted_send_wrs(self, r: control.CancelPostedSendWrs, rid: int) -> dict | None:
        """mlx5dv_qp_cancel_posted_send_wrs(3): the number of WRs canceled."""
        qph: QPHost = self.get(r.qp, "qp")
        n = qph.rcqp.cancel_posted_send_wrs(r.wr_id)
        self.daemon.service(qph)
        return {"canceled": n}

    def op_destroy_dek(self, r: control.DestroyDek, rid: int) -> dict | None:
        return self.destroy_handle(r.dek, "dek")
