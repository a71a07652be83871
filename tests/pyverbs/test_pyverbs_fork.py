"""softhca's pyverbs across fork(2) (client/pyverbs/_sync.py, client/connection.py): a
child opens its own Context and QP and moves data with its parent's QP both ways; the
parent's objects are the parent's (a call on one in the child is EIO, closing or
collecting it there leaves it alone) and keep working after the child exits; children
of multiprocessing's 'fork' connect rdma_cm ids to each other, as rdma-core's
test_rdmacm has them do. Each case runs in a fresh interpreter, so that its forks copy
that interpreter's threads and loop, not pytest's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from e2e import serve

_PLAYERS = r"""
import ctypes, errno, gc, json, os, sys
import softhca.client.pyverbs.enums as e
from softhca.client.pyverbs.addr import AHAttr, GlobalRoute
from softhca.client.pyverbs.cmid import CMEvent, CMEventChannel
from softhca.client.pyverbs.cq import CQ, CompChannel
from softhca.client.pyverbs.device import Context
from softhca.client.pyverbs.mr import MR
from softhca.client.pyverbs.pd import PD
from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
from softhca.client.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from softhca.client.pyverbs.wr import SGE, RecvWR, SendWR

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


class Side:
    def __init__(self, channel=False):
        self.ctx = Context(name="mlx5_0")
        self.pd = PD(self.ctx)
        self.channel = CompChannel(self.ctx) if channel else None
        self.cq = CQ(self.ctx, 16, None, self.channel, 0)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                         cap=QPCap(4, 4)))
        self.qp.to_init(QPAttr(port_num=1, qp_access_flags=ACCESS))
        self.mr = MR(self.pd, 64, ACCESS)

    def to_rts(self, qpn):
        attr = QPAttr(port_num=1)
        attr.ah_attr = AHAttr(is_global=1, port_num=1,
                              gr=GlobalRoute(dgid=self.ctx.query_gid(1, 0), sgid_index=0))
        attr.dest_qp_num, attr.rq_psn, attr.sq_psn = qpn, 0, 0
        attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.min_rnr_timer = 14, 7, 7, 12
        attr.max_rd_atomic = attr.max_dest_rd_atomic = 1
        self.qp.to_rts(attr)

    def recv(self):
        self.qp.post_recv(RecvWR(wr_id=2, num_sge=1, sg=[SGE(self.mr.buf, 64, self.mr.lkey)]))

    def send(self, data):
        self.mr.write(data, len(data))
        self.qp.post_send(SendWR(wr_id=1, num_sge=1,
                                 sg=[SGE(self.mr.buf, len(data), self.mr.lkey)]))

    def wait(self, wr_id):
        for _ in range(2000):
            n, wcs = self.cq.poll()
            if n:
                assert wcs[0].wr_id == wr_id and wcs[0].status == e.IBV_WC_SUCCESS, wcs[0]
                return
        raise AssertionError(f"no completion of wr {wr_id}")


def eio(call):
    try:
        call()
    except PyverbsRDMAError as ex:
        return ex.error_code == errno.EIO and "fork(2)" in str(ex)
    return False


def in_process_mr(pd, buf):
    try:
        MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE, address=ctypes.addressof(buf)).close()
        return "ok"
    except PyverbsRDMAError as ex:
        return "EOPNOTSUPP" if ex.error_code == errno.EOPNOTSUPP else str(ex)
"""

_PARENT_AND_CHILD = _PLAYERS + r"""
buf = ctypes.create_string_buffer(64)
p = Side()
channel = CMEventChannel()
# A call after it: the loop has run what the channel handed it (its event pump).
p.ctx.query_device()
# A completion the parent's completion channel took out of the daemon before the fork
# (kept for the parent's next poll): in the child it is the parent's, not to be polled.
q, r = Side(channel=True), Side()
q.to_rts(r.qp.qp_num); r.to_rts(q.qp.qp_num)
q.recv(); q.cq.req_notify()
r.send(b"taken")
r.wait(1)
q.channel.get_cq_event(q.cq)
q.cq.ack_events(1)
down_r, down_w = os.pipe()      # parent -> child
up_r, up_w = os.pipe()          # child -> parent
pid = os.fork()
if pid == 0:
    os.close(down_w); os.close(up_r)
    # The parent's loop's wake-up socket, in this child, becomes one end of a socket
    # pair this child reads: a byte the child sent to the parent's loop shows there.
    # The sessions' sockets stay as they are: the parent's use of them after the child
    # is gone shows that the child neither wrote to them, read from them, nor removed
    # them from the epoll instance both share (the parent would hang or break).
    import socket
    from softhca.client.pyverbs import _sync
    fds = [s._conn.writer.transport.get_extra_info("socket").fileno()
           for s in (p.ctx._node, channel._session.node)]
    inodes = [os.fstat(fd).st_ino for fd in fds]
    mine, theirs = socket.socketpair()
    os.dup2(theirs.fileno(), _sync._inherited[-1][0]._csock.fileno())
    theirs.close()
    mine.setblocking(False)
    out = {"eio": [eio(p.ctx.query_device), eio(lambda: p.mr.read(4, 0)),
                   eio(p.cq.poll), eio(lambda: p.send(b"x")),
                   eio(lambda: CMEvent(channel)), eio(lambda: PD(p.ctx)), eio(q.cq.poll),
                   eio(lambda: q.channel.get_cq_event(q.cq))]}
    c = Side()
    out["mr_address"] = in_process_mr(c.pd, buf)
    os.write(up_w, b"%d\n" % c.qp.qp_num)
    qpn = int(os.read(down_r, 64))
    c.to_rts(qpn)
    c.recv()
    os.write(up_w, b"ready\n")
    c.wait(2)
    out["got"] = c.mr.read(15, 0).decode()
    c.send(b"child to parent")
    c.wait(1)
    # The parent's copies: closed and collected here, they must stay the parent's.
    p.qp.close(); p.mr.close(); channel.close(); p.ctx.close()
    del p; gc.collect()
    try:
        out["woke_parent_loop"] = mine.recv(1) != b""
    except BlockingIOError:
        out["woke_parent_loop"] = False
    out["sockets_kept"] = [os.fstat(fd).st_ino for fd in fds] == inodes
    os.write(up_w, json.dumps(out).encode())
    os.close(up_w)
    sys.exit(0)         # a normal exit: atexit and finalizers run
os.close(down_r); os.close(up_w)
up = os.fdopen(up_r)
qpn = int(up.readline())
os.write(down_w, b"%d\n" % p.qp.qp_num)
p.to_rts(qpn)
p.recv()
assert up.readline() == "ready\n"
p.send(b"parent to child")
p.wait(1)
p.wait(2)
got_back = p.mr.read(15, 0).decode()
child = json.loads(up.read())
_, status = os.waitpid(pid, 0)
# After the child's exit: the parent's session, context, MR, CQ and channel go on.
p.mr.write(b"still mine", 10)
after = [p.ctx.query_device().max_qp > 0, p.mr.read(10, 0) == b"still mine",
         p.cq.poll()[0] == 0, PD(p.ctx) is not None, q.cq.poll()[1][0].wr_id == 2]
channel.close()
print(json.dumps({"status": os.waitstatus_to_exitcode(status), "child": child,
                  "parent_got": got_back, "after": after,
                  "parent_mr_address": in_process_mr(p.pd, buf)}))
"""


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE")}
    env.update(extra)
    return env


def _run(script: str, env: dict) -> dict:
    # A call that hangs (a parent whose socket a child damaged) fails within this.
    env = {**env, "SOFTHCA_CALL_TIMEOUT": "30"}
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(out: dict, embedded: bool) -> None:
    assert out["status"] == 0
    child = out["child"]
    # query_device, mr.read, cq.poll, post_send, CMEvent, PD, and the poll and event
    # wait of a CQ holding a completion taken before the fork, on the parent's: each EIO.
    assert child["eio"] == [True] * 8
    assert child["woke_parent_loop"] is False
    assert child["sockets_kept"] is True
    assert child["got"] == "parent to child"
    assert out["parent_got"] == "child to parent"
    assert out["after"] == [True] * 5
    # This process's memory registers only with the embedded daemon of this process:
    # the parent's; never the child's, whose memory is not the daemon's.
    assert out["parent_mr_address"] == ("ok" if embedded else "EOPNOTSUPP")
    assert child["mr_address"] == "EOPNOTSUPP"


def test_a_fork_child_and_its_parent_move_data_over_the_embedded_daemon():
    _check(_run(_PARENT_AND_CHILD, _env()), embedded=True)


def test_a_fork_child_and_its_parent_move_data_over_a_served_daemon(tmp_path):
    with serve(tmp_path) as (_, address):
        _check(_run(_PARENT_AND_CHILD, _env(SOFTHCA_TARGET=address)), embedded=False)


_MP_CMID = _PLAYERS + r"""
import multiprocessing as mp
import softhca.client.pyverbs.cm_enums as ce
from softhca.client.pyverbs.cmid import CMID, AddrInfo, ConnParam

PORT = sys.argv[1]


def attr():
    return QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(4, 4))


def passive(listening, q):
    lid = CMID(creator=AddrInfo(src="127.0.0.1", src_service=PORT, flags=ce.RAI_PASSIVE),
               qp_init_attr=attr())
    lid.listen()
    listening.set()
    c = lid.get_request()
    msg = c.reg_msgs(64)
    c.post_recv(msg)
    c.accept(ConnParam(resources=1, depth=1))
    assert c.get_recv_comp().status == e.IBV_WC_SUCCESS
    got = msg.read(5, 0)
    msg.write(got.upper(), 5)
    c.post_send(msg, length=5)
    assert c.get_send_comp().status == e.IBV_WC_SUCCESS
    q.put(("passive", got.decode()))
    c.disconnect()


def active(listening, q):
    listening.wait(30)
    cid = CMID(creator=AddrInfo(dst="127.0.0.1", dst_service=PORT), qp_init_attr=attr())
    msg = cid.reg_msgs(64)
    cid.post_recv(msg)
    cid.connect(ConnParam(resources=1, depth=1))
    msg.write(b"hello", 5)
    cid.post_send(msg, length=5)
    assert cid.get_send_comp().status == e.IBV_WC_SUCCESS
    assert cid.get_recv_comp().status == e.IBV_WC_SUCCESS
    q.put(("active", msg.read(5, 0).decode()))


p = Side()      # the parent has its loop, session and (embedded) daemon before forking
fork = mp.get_context("fork")
listening, q = fork.Event(), fork.Queue()
procs = [fork.Process(target=f, args=(listening, q)) for f in (passive, active)]
for pr in procs:
    pr.start()
for pr in procs:
    pr.join(60)
got = dict(q.get(timeout=5) for _ in range(2)) if all(pr.exitcode == 0 for pr in procs) else {}
print(json.dumps({"exitcodes": [pr.exitcode for pr in procs], "got": got,
                  "parent": p.ctx.query_device().max_qp > 0}))
"""


def test_multiprocessing_fork_children_connect_rdma_cm_ids_to_each_other():
    """Both children fork from a parent with an open Context (its loop thread running):
    each opens its own session, one listens and accepts, the other connects; a SEND
    each way."""
    port = str(7900 + os.getpid() % 90)
    out = _run(_MP_CMID.replace("sys.argv[1]", repr(port)), _env())
    assert out == {"exitcodes": [0, 0], "got": {"passive": "hello", "active": "HELLO"},
                   "parent": True}
