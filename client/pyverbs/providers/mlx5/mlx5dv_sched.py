"""pyverbs.providers.mlx5.mlx5dv_sched: scheduling elements are not modelled."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "mlx5 scheduling elements", "Mlx5dvSchedNode Mlx5dvSchedLeaf",
                     "Mlx5dvSchedAttr")
