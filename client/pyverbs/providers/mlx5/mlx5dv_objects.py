"""pyverbs.providers.mlx5.mlx5dv_objects: mlx5dv_init_obj(3) exposes hardware queues
softhca does not have (EOPNOTSUPP)."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "mlx5dv_init_obj (hardware queue layouts)",
                     "Mlx5DvObj Mlx5DvPD Mlx5DvCQ Mlx5DvQP Mlx5DvSRQ")
