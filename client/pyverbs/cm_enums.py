"""pyverbs.cm_enums: the C enums of rdma_cma.h under their C names and values.

Each enum is an IntEnum named as in C; every member is also a module attribute, so
``cm_enums.NAME`` works as with rdma-core's pyverbs."""

from ._enum_table import define

ENUMS = {
    "rdma_cm_event_type": {"RDMA_CM_EVENT_ADDR_RESOLVED": 0, "RDMA_CM_EVENT_ADDR_ERROR": 1, "RDMA_CM_EVENT_ROUTE_RESOLVED": 2, "RDMA_CM_EVENT_ROUTE_ERROR": 3, "RDMA_CM_EVENT_CONNECT_REQUEST": 4, "RDMA_CM_EVENT_CONNECT_RESPONSE": 5, "RDMA_CM_EVENT_CONNECT_ERROR": 6, "RDMA_CM_EVENT_UNREACHABLE": 7, "RDMA_CM_EVENT_REJECTED": 8, "RDMA_CM_EVENT_ESTABLISHED": 9, "RDMA_CM_EVENT_DISCONNECTED": 10, "RDMA_CM_EVENT_DEVICE_REMOVAL": 11, "RDMA_CM_EVENT_MULTICAST_JOIN": 12, "RDMA_CM_EVENT_MULTICAST_ERROR": 13, "RDMA_CM_EVENT_ADDR_CHANGE": 14, "RDMA_CM_EVENT_TIMEWAIT_EXIT": 15},
    "rdma_cm_join_mc_attr_mask": {"RDMA_CM_JOIN_MC_ATTR_ADDRESS": 1, "RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS": 2},
    "rdma_cm_mc_join_flags": {"RDMA_MC_JOIN_FLAG_FULLMEMBER": 0, "RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER": 1},
    "rdma_port_space": {"RDMA_PS_IPOIB": 2, "RDMA_PS_TCP": 262, "RDMA_PS_UDP": 273, "RDMA_PS_IB": 319},
}
CONSTANTS = {
    "RAI_FAMILY": 8,
    "RAI_NOROUTE": 4,
    "RAI_NUMERICHOST": 2,
    "RAI_PASSIVE": 1,
    "RDMA_OPTION_ID": 0,
    "RDMA_OPTION_ID_ACK_TIMEOUT": 3,
}
globals().update(define(ENUMS, CONSTANTS, __name__))
