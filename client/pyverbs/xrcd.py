"""pyverbs.xrcd: XRC domains are not modelled (EOPNOTSUPP)."""

from ._objects import module_of_unmodelled

module_of_unmodelled(globals(), "XRC domains (ibv_open_xrcd)", "XRCD", "XRCDInitAttr")
