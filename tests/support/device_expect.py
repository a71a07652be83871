"""What ibv_query_device(3) of a softhca device answers, written down once for the tests
of both clients (softhca's pyverbs and the provider, as ibv_devinfo prints it). The
values come from rdma-core's verbs.h and from the daemon's documented defaults
(docs/semantics.md, ``serve --help``), not from the code that answers them."""

from __future__ import annotations

# rdma-core verbs.h, enum ibv_device_cap_flags: what softhca models.
CURR_QP_STATE_MOD = 128
SYS_IMAGE_GUID = 2048
RC_RNR_NAK_GEN = 4096
SRQ_RESIZE = 8192
MEM_WINDOW = 131072
MEM_WINDOW_TYPE_2B = 16777216
FLAG_NAMES = ("CURR_QP_STATE_MOD", "SYS_IMAGE_GUID", "RC_RNR_NAK_GEN", "SRQ_RESIZE",
              "MEM_WINDOW", "MEM_WINDOW_TYPE_2B")
FLAGS = (CURR_QP_STATE_MOD | SYS_IMAGE_GUID | RC_RNR_NAK_GEN | SRQ_RESIZE | MEM_WINDOW
         | MEM_WINDOW_TYPE_2B)
# include/uapi/rdma/ib_user_verbs.h: IB_UVERBS_DEVICE_ATOMIC_WRITE; device_cap_flags_ex
# holds the low 32 bits too, as the kernel's uverbs answers it.
ATOMIC_WRITE = 1 << 40
FLAGS_EX = FLAGS | ATOMIC_WRITE

# The numeric attributes, by ibv_device_attr's field names (ibv_devinfo -v prints them
# under these names). The pools: 2^16 of each, or a session's quota where smaller
# (16384 QPs, CQs, PDs and SRQs: server/hosts.py DEFAULT_QUOTAS). 16 responder resources a
# QP: max_res_rd_atom 16 x max_qp. max_qp_wr: the daemon's default --max-qp-wr.
ATTRS = {
    "page_size_cap": 0xFFFFF000, "max_qp": 16384, "max_qp_wr": 16384, "max_sge": 32,
    "max_sge_rd": 32, "max_cq": 16384, "max_mr": 65536, "max_mw": 65536, "max_ah": 65536,
    "max_pd": 16384, "max_qp_rd_atom": 16, "max_qp_init_rd_atom": 16,
    "max_res_rd_atom": 16 * 16384, "max_srq": 16384, "max_srq_wr": 16384, "max_srq_sge": 32,
    "max_pkeys": 1, "local_ca_ack_delay": 16, "phys_port_cnt": 1,
}
# enum ibv_atomic_cap IBV_ATOMIC_HCA.
ATOMIC_CAP = 1
# ibv_query_device_ex's odp_caps (verbs.h): general_caps IBV_ODP_SUPPORT (1 << 0); RC's
# IBV_ODP_SUPPORT_SEND, RECV, WRITE, READ, ATOMIC (1 << 0 .. 1 << 4) and the kernel's
# IB_ODP_SUPPORT_ATOMIC_WRITE (1 << 7); none for UC and UD (no ODP on them).
ODP_GENERAL_CAPS = 1
ODP_RC_CAPS = 0x1F | 1 << 7
