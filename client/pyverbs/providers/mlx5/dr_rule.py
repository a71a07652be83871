"""pyverbs.providers.mlx5.dr_rule: direct rules (steering) are not modelled."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "mlx5 direct rules (steering)", "DrRule")
