"""pyverbs.librdmacm_enums: the rdma_cma.h enums under the module name rdma-core's pyverbs
uses from v59 on (``from pyverbs.librdmacm_enums import rdma_port_space, RAI_PASSIVE``).

The same IntEnum classes and module-level members as ``pyverbs.cm_enums`` (the v44 name)."""

from . import cm_enums as _cm_enums

globals().update({k: v for k, v in vars(_cm_enums).items()
                  if not k.startswith("__") and k not in ("ENUMS", "CONSTANTS", "define")})
