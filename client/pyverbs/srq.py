"""pyverbs.srq: shared receive queues are not modelled (EOPNOTSUPP)."""

from ._objects import module_of_unmodelled

module_of_unmodelled(globals(), "Shared receive queues (ibv_create_srq)", "SRQ",
                     "SrqAttr SrqInitAttr SrqInitAttrEx OpsWr")
