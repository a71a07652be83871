"""pyverbs.providers.mlx5.mlx5_vfio: VFIO devices are not modelled."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "mlx5 VFIO devices", "Mlx5VfioContext", "Mlx5VfioAttr")
