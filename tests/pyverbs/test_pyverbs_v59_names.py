"""rdma-core v59's pyverbs names on softhca: a new user's program written from v59's
Documentation/pyverbs.md (tests/pyverbs/programs/v59_doc_user.py) runs unchanged, and
pyverbs' SRQ objects work.

Expected values come from verbs.h (IBV_ACCESS_REMOTE_WRITE = 2, RDMA_PS_TCP = 0x106,
RAI_PASSIVE = 1, MLX5DV_CONTEXT_FLAGS_DEVX = 1), the program's own arguments, and
ibv_modify_srq(3) / ibv_post_recv(3).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from softhca.tools.pyverbs import path as pyverbs_path

PROGRAM = Path(__file__).parent / "programs" / "v59_doc_user.py"


def test_a_program_written_from_v59s_pyverbs_md_runs_unchanged():
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pyverbs_path())}
    r = subprocess.run([sys.executable, str(PROGRAM)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    facts = dict(ln.split("=", 1) for ln in r.stdout.split() if "=" in ln)
    assert facts["vendor_id"] == "0x2c9"
    assert int(facts["max_srq_wr"]) >= 10
    assert facts["port_state"] == "4"              # IBV_PORT_ACTIVE
    assert facts["mr_length"] == "1000"
    assert facts["qp_type"] == "2" and facts["qp_state"] == "1"   # IBV_QPT_RC, IBV_QPS_INIT
    assert facts["qpex"] == "QPEx" and facts["cqex"] == "CQEX"
    assert facts["srq_limit"] == "4"
    assert facts["enums"] == f"2,{0x106},1,1"


@pytest.fixture
def pv(monkeypatch):
    monkeypatch.syspath_prepend(str(pyverbs_path()))
    import pyverbs.device as d
    from pyverbs.cq import CQ
    from pyverbs.pd import PD
    with d.Context(name="mlx5_0") as ctx:
        pd = PD(ctx)
        yield ctx, pd, CQ(ctx, 16)


def test_pyverbs_srq_modify_query_and_a_qp_that_takes_from_it(pv):
    from pyverbs.libibverbs_enums import ibv_qp_type, ibv_srq_attr_mask
    from pyverbs.mr import MR
    from pyverbs.pyverbs_error import PyverbsRDMAError
    from pyverbs.qp import QP, QPCap, QPInitAttr
    from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
    from pyverbs.wr import SGE, RecvWR

    ctx, pd, cq = pv
    srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
    mr = MR(pd, 64, 1)
    srq.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    srq.modify(SrqAttr(srq_limit=3), ibv_srq_attr_mask.IBV_SRQ_LIMIT)
    q = srq.query()
    assert (q.max_wr, q.max_sge, q.srq_limit) == (8, 1, 3)
    srq.modify(SrqAttr(max_wr=12), ibv_srq_attr_mask.IBV_SRQ_MAX_WR)
    assert srq.query().max_wr == 12
    with pytest.raises(PyverbsRDMAError) as e:
        srq.modify(SrqAttr(srq_limit=12), ibv_srq_attr_mask.IBV_SRQ_LIMIT)
    assert e.value.error_code == 22
    qp = QP(pd, QPInitAttr(qp_type=ibv_qp_type.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq,
                           cap=QPCap(max_send_wr=1, max_recv_wr=1)))
    with pytest.raises(PyverbsRDMAError) as e:
        qp.post_recv(RecvWR(wr_id=2, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    assert e.value.error_code == 22
    srq.close()          # closes the QP first, as pyverbs does
    assert qp._obj is None
