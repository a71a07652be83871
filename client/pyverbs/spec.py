"""pyverbs.spec: flow specifications (flow steering is not modelled)."""

from ._objects import module_of_unmodelled

module_of_unmodelled(globals(), "Flow steering", "",
                     "Spec EthSpec Ipv4ExtSpec TcpUdpSpec Ipv6Spec")
