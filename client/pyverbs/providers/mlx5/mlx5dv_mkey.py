"""pyverbs.providers.mlx5.mlx5dv_mkey: MKEYs and the attributes of their configure WRs.

The attribute classes are pyverbs' (constructor keywords and defaults: every field 0, as
the C structs are zeroed); ``_attr()`` turns each into softhca's own record
(protocol.attrs), which the engine validates and applies (docs/semantics.md).
"""

from __future__ import annotations

from .....protocol import attrs as _a
from .... import api
from ... import _sync
from ..._objects import Record, Resource, delegate
from ...pyverbs_error import PyverbsUserError
from . import mlx5_enums as dve


class Mlx5SigCrc(Record):
    _fields = (("crc_type", 0), ("seed", 0))

    def _attr(self):
        return _a.SigCrc(crc_type=int(self.crc_type), seed=int(self.seed))


class Mlx5SigT10Dif(Record):
    _fields = (("bg_type", 0), ("bg", 0), ("app_tag", 0), ("ref_tag", 0), ("flags", 0))

    def _attr(self):
        return _a.SigT10dif(bg_type=int(self.bg_type), bg=int(self.bg),
                            app_tag=int(self.app_tag), ref_tag=int(self.ref_tag),
                            flags=int(self.flags))


class Mlx5SigBlockDomain(Record):
    _fields = (("sig_type", 0), ("dif", None), ("crc", None), ("block_size", 0),
               ("comp_mask", 0))

    def _attr(self):
        return _a.SigBlockDomain(sig_type=int(self.sig_type),
                                 dif=self.dif._attr() if self.dif is not None else None,
                                 crc=self.crc._attr() if self.crc is not None else None,
                                 block_size=int(self.block_size), comp_mask=int(self.comp_mask))


class Mlx5SigBlockAttr(Record):
    _fields = (("mem", None), ("wire", None), ("flags", 0), ("check_mask", 0),
               ("copy_mask", 0), ("comp_mask", 0))

    def _attr(self):
        return _a.SigBlockAttr(mem=self.mem._attr() if self.mem is not None else None,
                               wire=self.wire._attr() if self.wire is not None else None,
                               flags=int(self.flags), check_mask=int(self.check_mask),
                               copy_mask=int(self.copy_mask), comp_mask=int(self.comp_mask))


class Mlx5SigErr(Record):
    _fields = (("actual_value", 0), ("expected_value", 0), ("offset", 0))


class Mlx5MkeyErr(Record):
    _fields = (("sig_err", None), ("err_type", dve.MLX5DV_MKEY_NO_ERR))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.sig_err is None:
            self.sig_err = Mlx5SigErr()


class Mlx5MkeyConfAttr(Record):
    _fields = (("conf_flags", 0), ("comp_mask", 0))

    def _attr(self):
        return _a.MkeyConfAttr(conf_flags=int(self.conf_flags), comp_mask=int(self.comp_mask))


class Mlx5MrInterleaved(Record):
    _fields = (("addr", 0), ("bytes_count", 0), ("bytes_skip", 0), ("lkey", 0))

    def _attr(self):
        return _a.MrInterleaved(int(self.addr), int(self.bytes_count), int(self.bytes_skip),
                                int(self.lkey))


class Mlx5Mkey(Resource):
    """mlx5dv_create_mkey(3)"""

    def __init__(self, pd, create_flags, max_entries):
        super().__init__()
        from ...pd import PD

        if not isinstance(pd, PD):
            raise PyverbsUserError("Mlx5Mkey needs a PD")
        pd._ctx._check()
        self._pd = self.pd = pd
        obj = _sync.run(pd._obj.create_mkey(int(create_flags), int(max_entries)),
                        "Failed to create mkey")
        self._adopt(pd._ctx, obj)
        self.max_entries = max_entries

    def mkey_check(self):
        err: api.MkeyErr = _sync.run(self._obj.mkey_check(), "Failed to check the mkey")
        s = err.sig_err
        return Mlx5MkeyErr(Mlx5SigErr(s.actual_value, s.expected_value, s.offset),
                           int(err.err_type))

    lkey = delegate("_obj", "lkey", writable=False)
    rkey = delegate("_obj", "rkey", writable=False)
