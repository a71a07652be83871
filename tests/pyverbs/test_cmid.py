"""pyverbs' rdma_cm ids (client/pyverbs/cmid.py) on the daemon embedded in this process:
a passive and an active side in two threads, synchronous (AddrInfo) and asynchronous
(CMEventChannel / CMEvent), their data checked against what the test wrote."""

from __future__ import annotations

import errno
import itertools
import os
import struct
import threading

import pytest
from pyverbs_cm import next_event, requested, resolved

import softhca.client.pyverbs.cm_enums as ce
import softhca.client.pyverbs.enums as e
from softhca.client.pyverbs.cmid import CMID, AddrInfo, CMEvent, CMEventChannel, ConnParam
from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
from softhca.client.pyverbs.qp import QPCap, QPInitAttr

_ports = itertools.count(7400 + os.getpid() % 500)


def _attr():
    return QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(4, 4))


def _passive(port, ready, body):
    """The server thread: ``body(listener)``; its failure is re-raised by join."""
    out = {}

    def run():
        try:
            lid = CMID(creator=AddrInfo(src="127.0.0.1", src_service=str(port),
                                        flags=ce.RAI_PASSIVE), qp_init_attr=_attr())
            lid.listen()
            ready.set()
            out["r"] = body(lid)
            lid.close()
        except BaseException as err:       # handed to the main thread
            out["err"] = err
            ready.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(10)

    def join():
        t.join(20)
        assert not t.is_alive(), "the passive side hangs"
        if "err" in out:
            raise out["err"]
        return out.get("r")
    return join


def test_sync_send_recv_and_rdma_write_read():
    """SEND both ways, then the client RDMA WRITEs into the buffer the server's SEND
    named and RDMA READs it back; a last SEND tells the server the WRITE has landed."""
    port, ready = next(_ports), threading.Event()
    ping, data = os.urandom(48), os.urandom(64)

    def server(lid):
        c = lid.get_request()
        msg, target = c.reg_msgs(64), c._reg(64, e.IBV_ACCESS_LOCAL_WRITE
                                             | e.IBV_ACCESS_REMOTE_WRITE
                                             | e.IBV_ACCESS_REMOTE_READ)
        target.write(bytes(64), 64)
        c.post_recv(msg)
        c.accept(ConnParam(resources=1, depth=1))
        assert c.get_recv_comp().status == e.IBV_WC_SUCCESS
        got = msg.read(48, 0)
        msg.write(struct.pack(">QI", target.buf, target.rkey), 12)
        c.post_recv(msg)
        c.post_send(msg, length=12)
        assert c.get_send_comp().status == e.IBV_WC_SUCCESS
        assert c.get_recv_comp().status == e.IBV_WC_SUCCESS
        written = target.read(64, 0)
        c.disconnect()
        c.close()
        return got, written

    join = _passive(port, ready, server)
    cid = CMID(creator=AddrInfo(dst="127.0.0.1", dst_service=str(port)), qp_init_attr=_attr())
    msg, local = cid.reg_msgs(64), cid.reg_msgs(64)
    cid.post_recv(msg)
    cid.connect(ConnParam(resources=1, depth=1))
    msg.write(ping, 48)
    cid.post_send(msg, length=48)
    assert cid.get_send_comp().status == e.IBV_WC_SUCCESS
    assert cid.get_recv_comp().status == e.IBV_WC_SUCCESS
    addr, rkey = struct.unpack(">QI", msg.read(12, 0))
    local.write(data, 64)
    cid.post_write(local, 64, addr, rkey)
    assert cid.get_send_comp().status == e.IBV_WC_SUCCESS
    local.write(bytes(64), 64)
    cid.post_read(local, 64, addr, rkey)
    assert cid.get_send_comp().status == e.IBV_WC_SUCCESS
    assert local.read(64, 0) == data
    cid.post_send(msg, length=1)
    assert cid.get_send_comp().status == e.IBV_WC_SUCCESS
    got, written = join()
    assert got == ping
    assert written == data
    cid.close()


def test_async_reject_carries_private_data():
    port = next(_ports)
    srv_ch, cli_ch = CMEventChannel(), CMEventChannel()
    lid = CMID(creator=srv_ch)
    lid.bind_addr(AddrInfo(src="127.0.0.1", src_service=str(port), flags=ce.RAI_PASSIVE))
    lid.listen(1)
    cid = CMID(creator=cli_ch)
    cid.resolve_addr(AddrInfo(dst="127.0.0.1", dst_service=str(port)))
    ev = CMEvent(cli_ch)
    assert ev.event_type == ce.RDMA_CM_EVENT_ADDR_RESOLVED, ev.event_str()
    ev.ack_cm_event()
    cid.resolve_route()
    ev = CMEvent(cli_ch)
    assert ev.event_str() == "RDMA_CM_EVENT_ROUTE_RESOLVED"
    cid.create_qp(_attr())
    cid.connect(ConnParam(data=b"hello"))
    req = CMEvent(srv_ch)
    assert req.event_type == ce.RDMA_CM_EVENT_CONNECT_REQUEST
    assert req.private_data[:5] == b"hello"
    child = CMID(creator=req, listen_id=lid)
    child.reject(b"go away")
    rej = CMEvent(cli_ch)
    assert rej.event_type == ce.RDMA_CM_EVENT_REJECTED
    assert rej.status == 28         # IBTA 12.6.7.2: consumer reject
    assert rej.private_data[:7] == b"go away"
    for o in (child, cid, lid, cli_ch, srv_ch):
        o.close()


def test_sync_connect_to_nobody_is_refused():
    cid = CMID(creator=AddrInfo(dst="127.0.0.1", dst_service=str(next(_ports))),
               qp_init_attr=_attr())
    with pytest.raises(PyverbsRDMAError, match="REJECTED"):
        cid.connect()
    cid.close()


def test_unmodelled_port_space_and_missing_destination():
    with pytest.raises(PyverbsRDMAError) as ex:
        AddrInfo(dst="127.0.0.1", dst_service="1", port_space=ce.RDMA_PS_IB)
    assert ex.value.error_code == errno.EOPNOTSUPP
    with pytest.raises(PyverbsRDMAError) as ex:
        AddrInfo(src="127.0.0.1")
    assert ex.value.error_code == errno.EINVAL


def test_async_accept_send_and_disconnect():
    """The asynchronous flow of rdma_cm(7): ADDR / ROUTE_RESOLVED, CONNECT_REQUEST,
    ESTABLISHED on both sides (the active side's CONNECT_RESPONSE taken by the library,
    its QP moved to RTS and the RTU sent), a SEND, DISCONNECTED on both sides."""
    srv_ch, cli_ch, lid, cid, child = requested(next(_ports), _attr)
    buf = child.reg_msgs(32)
    child.post_recv(buf)
    child.accept()
    # the active side first: its library sends the RTU when the program reads the event
    next_event(cli_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    next_event(srv_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    attr, _ = cid.query_qp(e.IBV_QP_STATE | e.IBV_QP_DEST_QPN)
    assert (attr.qp_state, attr.dest_qp_num) == (e.IBV_QPS_RTS, child.qpn)
    data = os.urandom(32)
    out = cid.reg_msgs(32)
    out.write(data, 32)
    cid.post_send(out)
    assert cid.get_send_comp().status == e.IBV_WC_SUCCESS
    assert child.get_recv_comp().status == e.IBV_WC_SUCCESS
    assert buf.read(32, 0) == data
    cid.disconnect()
    next_event(srv_ch, ce.RDMA_CM_EVENT_DISCONNECTED)
    child.disconnect()
    next_event(cli_ch, ce.RDMA_CM_EVENT_DISCONNECTED)
    for o in (child, cid, lid, cli_ch, srv_ch):
        o.close()


def test_external_qp_moved_with_init_qp_attr_and_established():
    """A program's own QP (rdma_init_qp_attr(3)): the active side's CONNECT_RESPONSE is
    handed up as is, the program moves its QP with the id's attributes (the ACK timeout
    set by rdma_set_option) and sends the RTU itself (establish)."""
    from softhca.client.pyverbs.cq import CQ
    from softhca.client.pyverbs.qp import QP, QPAttr

    port = next(_ports)
    srv_ch, cli_ch = CMEventChannel(), CMEventChannel()
    lid = CMID(creator=srv_ch)
    lid.bind_addr(AddrInfo(src="127.0.0.1", src_service=str(port), flags=ce.RAI_PASSIVE))
    lid.listen()
    cid = CMID(creator=cli_ch)
    cid.set_option(ce.RDMA_OPTION_ID, ce.RDMA_OPTION_ID_ACK_TIMEOUT, 17, 1)
    cid.resolve_addr(AddrInfo(dst="127.0.0.1", dst_service=str(port)))
    next_event(cli_ch, ce.RDMA_CM_EVENT_ADDR_RESOLVED)
    cid.resolve_route()
    next_event(cli_ch, ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
    cq = CQ(cid.context, 4, None, None, 0)
    qp = QP(cid.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)),
            QPAttr())
    qp.modify(*cid.init_qp_attr(e.IBV_QPS_INIT))
    assert cid.qpn == 0                 # the id has no QP of its own
    cid.connect(ConnParam(qp_num=qp.qp_num))
    req = next_event(srv_ch, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lid)
    child.create_qp(_attr())
    child.accept()
    next_event(cli_ch, ce.RDMA_CM_EVENT_CONNECT_RESPONSE)
    attr, _ = cid.init_qp_attr(e.IBV_QPS_RTS)
    assert attr.timeout == 17
    assert cid.init_qp_attr(e.IBV_QPS_RTR)[0].dest_qp_num == child.qpn
    qp.modify(*cid.init_qp_attr(e.IBV_QPS_RTR))
    qp.modify(*cid.init_qp_attr(e.IBV_QPS_RTS))
    cid.establish()
    next_event(srv_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    with pytest.raises(PyverbsRDMAError) as ex:
        cid.set_option(ce.RDMA_OPTION_ID, 99, 1)
    assert ex.value.error_code == errno.EOPNOTSUPP
    qp.close()
    for o in (child, cid, lid, cli_ch, srv_ch):
        o.close()


_WRITE = e.IBV_ACCESS_REMOTE_WRITE
_ALL = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC


@pytest.mark.parametrize("depth,rr,at_request,accepted", [
    (1, 0, _ALL, _WRITE), (0, 1, _WRITE, _WRITE), (1, 1, _ALL, _ALL),
], ids=["peer-depth-1-accept-rr-0", "peer-depth-0", "peer-depth-1-accept-rr-1"])
def test_the_connection_grants_read_and_atomics_with_responder_resources(
        depth, rr, at_request, accepted):
    """init_qp_attr(INIT)'s access flags as the kernel's rdma_cm answers them (and
    our librdmacm, tests/native/test_rdmacm.py): none before a connection (rdma_cm's
    own INIT); then the IB CM's (cm_init_qp_init_attr): remote WRITE always, remote
    READ and atomics only with responder resources, at the CONNECT_REQUEST the peer's
    initiator depth, after accept what the accept gave. The QP the id moves gets them.
    Each side's QP takes the RNR retry count its peer asked for (the client connects
    with 5, the server accepts with 3), and the RTR's min_rnr_timer is the IB CM's 0
    (IBTA's 655.36 ms)."""
    srv_ch, cli_ch, lid, cid = resolved(next(_ports))
    assert cid.init_qp_attr(e.IBV_QPS_INIT)[0].qp_access_flags == 0
    cid.create_qp(_attr())
    cid.connect(ConnParam(resources=1, depth=depth, rnr_retry=5))
    req = next_event(srv_ch, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lid)
    assert child.init_qp_attr(e.IBV_QPS_INIT)[0].qp_access_flags == at_request
    child.create_qp(_attr())
    child.accept(ConnParam(resources=rr, depth=1, rnr_retry=3))
    assert child.init_qp_attr(e.IBV_QPS_INIT)[0].qp_access_flags == accepted
    next_event(cli_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    next_event(srv_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    attr, _ = child.query_qp(e.IBV_QP_ACCESS_FLAGS | e.IBV_QP_RNR_RETRY)
    assert attr.qp_access_flags == accepted
    assert attr.rnr_retry == 5
    assert cid.query_qp(e.IBV_QP_RNR_RETRY)[0].rnr_retry == 3
    for side in (cid, child):
        assert side.init_qp_attr(e.IBV_QPS_RTR)[0].min_rnr_timer == 0
    for o in (child, cid, lid, cli_ch, srv_ch):
        o.close()
