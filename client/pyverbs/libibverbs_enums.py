"""pyverbs.libibverbs_enums: the verbs.h enums under the module name rdma-core's pyverbs
uses from v59 on (``from pyverbs.libibverbs_enums import ibv_access_flags``).

The same IntEnum classes and module-level members as ``pyverbs.enums`` (the v44 name), so
a program mixing both spellings compares equal values of one type."""

from . import enums as _enums

globals().update({k: v for k, v in vars(_enums).items()
                  if not k.startswith("__") and k not in ("ENUMS", "CONSTANTS", "define")})
