"""A new user's first pyverbs program, written from the usage examples of rdma-core v59's
Documentation/pyverbs.md (its imports and calls, in that style): open the device, query
it, make a PD, an MR, CQs, an RC QP and an extended QP, open the mlx5 provider. Run with
``softhca pyverbs path`` on PYTHONPATH; prints one ``name=value`` line per fact so the
test can judge it.
"""

import random

import pyverbs.device as d
import pyverbs.providers.mlx5.mlx5dv as m
from pyverbs.cq import CQ, CQEX, CompChannel, CqInitAttrEx
from pyverbs.libibverbs_enums import (
    ibv_access_flags,
    ibv_create_cq_wc_flags,
    ibv_qp_init_attr_mask,
    ibv_qp_type,
    ibv_srq_attr_mask,
)
from pyverbs.librdmacm_enums import RAI_PASSIVE, rdma_port_space
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.providers.mlx5.mlx5_enums import mlx5dv_context_attr_flags
from pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr

with d.Context(name="mlx5_0") as ctx:
    attr = ctx.query_device()
    print(f"vendor_id={attr.vendor_id:#x}")
    print(f"max_srq_wr={attr.max_srq_wr}")
    port_attr = ctx.query_port(1)
    print(f"port_state={port_attr.state}")
    print(f"gid0={ctx.query_gid(port_num=1, index=0)}")
    print(f"max_dm_size={ctx.query_device_ex().max_dm_size}")
    with PD(ctx) as pd:
        mr = MR(pd, 1000, ibv_access_flags.IBV_ACCESS_LOCAL_WRITE)
        print(f"mr_length={mr.length}")
        with CompChannel(ctx) as cc:
            cq = CQ(ctx, random.randint(1, 200), None, cc, 0)
            print(f"cq_cqes_at_least_asked={cq.cqe >= 1}")
        cq_ex = CQEX(ctx, CqInitAttrEx(cqe=10, wc_flags=ibv_create_cq_wc_flags.IBV_WC_EX_WITH_BYTE_LEN,
                                       comp_mask=0, flags=0))
        print(f"cqex={type(cq_ex).__name__}")
        cq = CQ(ctx, 100, None, None, 0)
        cap = QPCap(100, 10, 1, 1, 0)
        qia = QPInitAttr(cap=cap, qp_type=ibv_qp_type.IBV_QPT_RC, scq=cq, rcq=cq)
        qp = QP(pd, qia, QPAttr())
        print(f"qp_type={qp.qp_type} qp_state={qp.qp_state}")
        qia = QPInitAttrEx(qp_type=ibv_qp_type.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, pd=pd,
                           comp_mask=ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS
                           | ibv_qp_init_attr_mask.IBV_QP_INIT_ATTR_PD)
        qpex = QPEx(ctx, qia)
        print(f"qpex={type(qpex).__name__}")
        srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=10, max_sge=1)))
        srq.modify(SrqAttr(srq_limit=4), ibv_srq_attr_mask.IBV_SRQ_LIMIT)
        print(f"srq_limit={srq.query().srq_limit}")

ctx = m.Mlx5Context(attr=m.Mlx5DVContextAttr(), name="mlx5_0")
print(f"mlx5_version={ctx.query_mlx5_device().version}")
print(f"pd_on_mlx5={type(PD(ctx)).__name__}")
print(f"enums={int(ibv_access_flags.IBV_ACCESS_REMOTE_WRITE)},{int(rdma_port_space.RDMA_PS_TCP)},"
      f"{int(RAI_PASSIVE)},{int(mlx5dv_context_attr_flags.MLX5DV_CONTEXT_FLAGS_DEVX)}")
