"""pyverbs.providers.mlx5.dr_domain: direct rules (steering) are not modelled."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "mlx5 direct rules (steering)", "DrDomain")
