"""pyverbs.cmid: the RDMA connection manager is not modelled (EOPNOTSUPP): softhca
has no IP interfaces for rdma_cm to resolve."""

from ._objects import module_of_unmodelled

module_of_unmodelled(globals(), "The RDMA connection manager (librdmacm)",
                     "AddrInfo CMEvent CMEventChannel CMID",
                     "ConnParam JoinMCAttrEx UDParam")
