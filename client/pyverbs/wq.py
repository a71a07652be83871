"""pyverbs.wq: work queues and RSS indirection tables are not modelled (EOPNOTSUPP)."""

from ._objects import module_of_unmodelled

module_of_unmodelled(globals(), "Work queues and RSS (ibv_create_wq)", "WQ RwqIndTable",
                     "WQInitAttr WQAttr RwqIndTableInitAttr RxHashConf")
