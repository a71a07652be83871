"""pyverbs.providers.mlx5.mlx5dv_flow: mlx5 flow steering is not modelled."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "mlx5 flow steering",
                     "Mlx5FlowMatcher Mlx5PacketReformatFlowAction Mlx5Flow",
                     "Mlx5FlowMatchParameters Mlx5FlowMatcherAttr Mlx5FlowActionAttr")
