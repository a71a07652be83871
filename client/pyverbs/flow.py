"""pyverbs.flow: flow steering is not modelled (EOPNOTSUPP)."""

from ._objects import module_of_unmodelled

module_of_unmodelled(globals(), "Flow steering (ibv_create_flow)", "Flow FlowAction",
                     "FlowAttr")
