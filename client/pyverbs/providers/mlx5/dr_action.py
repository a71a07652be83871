"""pyverbs.providers.mlx5.dr_action: direct rules (steering) are not modelled."""

from ..._objects import module_of_unmodelled

module_of_unmodelled(globals(), "mlx5 direct rules (steering)",
                     "DrAction DrActionQp DrActionFlowCounter DrActionDrop DrActionModify "
                     "DrActionTag DrActionDestTable DrActionPopVLan DrActionPushVLan "
                     "DrActionDestArray DrActionDefMiss DrActionVPort DrActionIBPort "
                     "DrActionDestTir DrActionPacketReformat DrActionFlowSample "
                     "DrActionFlowMeter",
                     "DrActionDestAttr DrFlowSamplerAttr DrFlowMeterAttr")
