"""pyverbs.providers.efa.efa_enums: the C enums of efadv.h under their C names and values.

Each enum is an IntEnum named as in C; every member is also a module attribute, so
``efa_enums.NAME`` works as with rdma-core's pyverbs."""

from ..._enum_table import define

ENUMS = {
}
CONSTANTS = {
    "EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID": 4,
    "EFADV_DEVICE_ATTR_CAPS_RDMA_READ": 1,
    "EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE": 8,
    "EFADV_DEVICE_ATTR_CAPS_RNR_RETRY": 2,
    "EFADV_DEVICE_ATTR_CAPS_UNSOLICITED_WRITE_RECV": 16,
    "EFADV_MR_ATTR_VALIDITY_RDMA_READ_IC_ID": 2,
    "EFADV_MR_ATTR_VALIDITY_RDMA_RECV_IC_ID": 4,
    "EFADV_MR_ATTR_VALIDITY_RECV_IC_ID": 1,
    "EFADV_QP_FLAGS_UNSOLICITED_WRITE_RECV": 1,
    "EFADV_QP_DRIVER_TYPE_SRD": 0,
    "EFADV_WC_EX_WITH_IS_UNSOLICITED": 2,
    "EFADV_WC_EX_WITH_SGID": 1,
}
globals().update(define(ENUMS, CONSTANTS, __name__))
