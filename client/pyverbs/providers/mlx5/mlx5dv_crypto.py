"""pyverbs.providers.mlx5.mlx5dv_crypto: crypto login, DEKs and the crypto setter's
attribute (mlx5dv_crypto_login(3), mlx5dv_dek_create(3), mlx5dv_wr_set_mkey_crypto(3))."""

from __future__ import annotations

from .....protocol import attrs as _a
from ... import _sync
from ..._objects import Record, Resource, unsupported
from ...pyverbs_error import PyverbsUserError


class Mlx5CryptoLoginAttr(Record):
    _fields = (("credential", b""), ("credential_id", 0), ("import_kek_id", 0))

    @property
    def comp_mask(self):
        return 0


class Mlx5CryptoExtLoginAttr(Record):
    _fields = (("credential", b""), ("credential_len", 0), ("credential_id", 0),
               ("import_kek_id", 0))

    @property
    def comp_mask(self):
        return 0


class Mlx5DEKInitAttr(Record):
    _fields = (("pd", None), ("key_size", 0), ("has_keytag", False), ("key_purpose", 0),
               ("opaque", b""), ("key", b""), ("comp_mask", 0), ("crypto_login", None))


class Mlx5DEKAttr(Record):
    _fields = (("state", 0), ("opaque", b""), ("comp_mask", 0))


class Mlx5CryptoAttr(Record):
    _fields = (("crypto_standard", 0), ("encrypt_on_tx", False), ("signature_crypto_order", 0),
               ("data_unit_size", 0), ("initial_tweak", b""), ("dek", None), ("keytag", b""),
               ("comp_mask", 0))

    def _attr(self):
        # The C struct's arrays are zero-filled past what the caller supplied.
        tweak = bytes(self.initial_tweak)[:16].ljust(16, b"\0")
        keytag = bytes(self.keytag)[:8].ljust(8, b"\0")
        dek = self.dek._obj if self.dek is not None else None
        return _a.CryptoAttr(crypto_standard=int(self.crypto_standard),
                             encrypt_on_tx=bool(self.encrypt_on_tx),
                             signature_crypto_order=int(self.signature_crypto_order),
                             data_unit_size=int(self.data_unit_size), initial_tweak=tweak,
                             dek=dek, keytag=keytag, comp_mask=int(self.comp_mask))


def _client_call(ctx, name, what):
    fn = getattr(ctx._actx, name, None)
    if fn is None:
        raise unsupported(what)
    return fn


class Mlx5DEK(Resource):
    """mlx5dv_dek_create(3)"""

    def __init__(self, ctx, dek_init_attr):
        super().__init__()
        a = dek_init_attr
        if a.pd is None or a.pd._obj is None:
            raise PyverbsUserError("Mlx5DEKInitAttr needs an open PD")
        ctx._check()
        kwargs = {}
        if a.crypto_login is not None:
            kwargs["crypto_login"] = a.crypto_login._obj
        attr = _a.DEKInitAttr(key_size=int(a.key_size), key=bytes(a.key),
                              has_keytag=bool(a.has_keytag), key_purpose=int(a.key_purpose),
                              pd=a.pd._obj, opaque=bytes(a.opaque)[:8].ljust(8, b"\0"),
                              comp_mask=int(a.comp_mask))
        self._pd = a.pd
        obj = _sync.run(ctx._actx.create_dek(attr, **kwargs), "Failed to create DEK")
        self._adopt(ctx, obj)

    def query(self):
        q = getattr(self._obj, "query", None)
        if q is None:
            raise unsupported("mlx5dv_dek_query")
        state, opaque = _sync.run(q(), "Failed to query DEK")
        return Mlx5DEKAttr(state=state, opaque=bytes(opaque).rstrip(b"\0"))


class Mlx5CryptoLogin(Resource):
    """mlx5dv_crypto_login_create(3): a login object, for DEKs created with it."""

    def __init__(self, context, crypto_attr):
        super().__init__()
        context._check()
        create = _client_call(context, "create_crypto_login", "mlx5dv_crypto_login_create")
        cred = bytes(crypto_attr.credential)[:crypto_attr.credential_len]
        obj = _sync.run(create(cred, int(crypto_attr.import_kek_id)),
                        "Failed to create crypto login")
        self._adopt(context, obj)

    def query(self):
        return _sync.run(self._obj.query_state(), "Failed to query crypto login")
