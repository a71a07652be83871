"""pyverbs' rdma_cm ids of the RDMA_PS_UDP port space (client/pyverbs/_cm_ud.py) through
the daemon's SIDR (server/cm_sidr.py), both sides in this process: what rdma_connect(3),
rdma_accept(3), rdma_reject(3) and rdma_get_cm_event(3) say of UD ids. Expected values
are the man pages' and rdma_cma.h's: ESTABLISHED only on the active side, its param.ud
the passive QP's number and RDMA_UDP_QKEY (0x01234567); a rejected SIDR_REQ is
UNREACHABLE with the SIDR_REP status (IBTA 12.11.3: 2, rejected); private data of at
most 180 bytes on a SIDR_REQ (216 less rdma_cm's 36-byte header) and 136 on a SIDR_REP,
longer is EINVAL."""

from __future__ import annotations

import errno
import itertools
import os
import threading

import pytest

import softhca.client.pyverbs.cm_enums as ce
import softhca.client.pyverbs.enums as e
from softhca.client.pyverbs.addr import AH, AHAttr, GlobalRoute
from softhca.client.pyverbs.cmid import (
    CMID,
    AddrInfo,
    CMEvent,
    CMEventChannel,
    ConnParam,
    UDParam,
)
from softhca.client.pyverbs.pyverbs_error import PyverbsRDMAError
from softhca.client.pyverbs.qp import QPCap, QPInitAttr

_ports = itertools.count(7900 + os.getpid() % 500)
UDP_QKEY = 0x01234567   # rdma_cma.h's RDMA_UDP_QKEY
GRH = 40


def _ud():
    return QPInitAttr(qp_type=e.IBV_QPT_UD, cap=QPCap(4, 4))


def _next(ch, want):
    ev = CMEvent(ch)
    assert ev.event_type == want, (ev.event_str(), ev.status)
    ev.ack_cm_event()
    return ev


def _within(call, seconds=10):
    """``call()``'s result; a completion that never comes (a datagram dropped) fails the
    test instead of blocking it, as rdma_get_recv_comp would block."""
    out = {}

    def run():
        try:
            out["r"] = call()
        except BaseException as err:       # handed to the test's thread
            out["err"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"no completion within {seconds} s"
    if "err" in out:
        raise out["err"]
    return out["r"]


def _pair(port):
    """A listener of RDMA_PS_UDP on ``port`` and an active id whose route is resolved."""
    srv_ch, cli_ch = CMEventChannel(), CMEventChannel()
    lid = CMID(creator=srv_ch, port_space=ce.RDMA_PS_UDP)
    lid.bind_addr(AddrInfo(src="127.0.0.1", src_service=str(port), flags=ce.RAI_PASSIVE,
                           port_space=ce.RDMA_PS_UDP))
    lid.listen()
    cid = CMID(creator=cli_ch, port_space=ce.RDMA_PS_UDP)
    cid.resolve_addr(AddrInfo(dst="127.0.0.1", dst_service=str(port),
                              port_space=ce.RDMA_PS_UDP))
    _next(cli_ch, ce.RDMA_CM_EVENT_ADDR_RESOLVED)
    cid.resolve_route()
    _next(cli_ch, ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
    return srv_ch, cli_ch, lid, cid


def _close(*objs):
    for o in objs:
        o.close()


def test_sidr_established_carries_peer_and_ud_traffic_both_ways():
    srv_ch, cli_ch, lid, cid = _pair(next(_ports))
    cid.create_qp(_ud())
    attr, _ = cid.query_qp(e.IBV_QP_STATE | e.IBV_QP_QKEY)
    # rdma_create_qp of a UD id: RTS at once, with the port space's Q_Key
    assert (attr.qp_state, attr.qkey) == (e.IBV_QPS_RTS, UDP_QKEY)
    cid.connect(ConnParam(data=b"sidr-req"))
    req = _next(srv_ch, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    assert req.private_data[:8] == b"sidr-req"
    child = CMID(creator=req, listen_id=lid)
    child.create_qp(_ud())
    rbuf = child.reg_msgs(GRH + 64)
    child.post_recv(rbuf)
    child.accept(ConnParam(data=b"sidr-rep"))
    est = _next(cli_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    assert est.private_data[:8] == b"sidr-rep"
    ud = UDParam(est)
    assert (ud.qp_num, ud.qkey) == (child.qpn, UDP_QKEY)
    # param.ud.ah_attr: a global route to the passive side's GID
    assert ud.ah_attr.is_global == 1
    assert ud.ah_attr.gr.dgid.raw == child.context.query_gid(1, 0).raw

    data = os.urandom(64)
    sbuf = cid.reg_msgs(GRH + 64)
    sbuf.write(data, 64)
    cid.post_ud_send(sbuf, AH(cid.pd, attr=ud.ah_attr), rqpn=ud.qp_num, length=64)
    assert _within(cid.get_send_comp).status == e.IBV_WC_SUCCESS
    wc = _within(child.get_recv_comp)
    assert (wc.status, wc.byte_len, wc.src_qp) == (e.IBV_WC_SUCCESS, GRH + 64, cid.qpn)
    assert rbuf.read(64, GRH) == data

    # the answer goes to the AH of the receive's WC and GRH (ibv_create_ah_from_wc)
    back = os.urandom(32)
    cid.post_recv(sbuf)
    ah = AH(child.pd, wc=wc, port_num=1, grh=rbuf.buf)
    rbuf.write(back, 32)
    child.post_ud_send(rbuf, ah, rqpn=wc.src_qp, length=32)
    assert _within(child.get_send_comp).status == e.IBV_WC_SUCCESS
    wc = _within(cid.get_recv_comp)
    assert (wc.status, wc.byte_len, wc.src_qp) == (e.IBV_WC_SUCCESS, GRH + 32, child.qpn)
    assert sbuf.read(32, GRH) == back
    _close(child, cid, lid, cli_ch, srv_ch)


def test_sidr_reject_is_unreachable_with_private_data():
    srv_ch, cli_ch, lid, cid = _pair(next(_ports))
    cid.create_qp(_ud())
    cid.connect()
    req = _next(srv_ch, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lid)
    child.reject(b"no service")
    ev = _next(cli_ch, ce.RDMA_CM_EVENT_UNREACHABLE)
    assert ev.status == 2           # IBTA 12.11.3 SIDR_REP status: rejected
    assert ev.private_data[:10] == b"no service"
    assert UDParam(ev).qp_num == 0  # no peer QP in an UNREACHABLE
    _close(child, cid, lid, cli_ch, srv_ch)


def test_sidr_req_to_a_port_nobody_listens_on_is_unreachable():
    port = next(_ports)
    ch = CMEventChannel()
    cid = CMID(creator=ch, port_space=ce.RDMA_PS_UDP)
    cid.resolve_addr(AddrInfo(dst="127.0.0.1", dst_service=str(port),
                              port_space=ce.RDMA_PS_UDP))
    _next(ch, ce.RDMA_CM_EVENT_ADDR_RESOLVED)
    cid.resolve_route()
    _next(ch, ce.RDMA_CM_EVENT_ROUTE_RESOLVED)
    cid.create_qp(_ud())
    cid.connect()
    ev = _next(ch, ce.RDMA_CM_EVENT_UNREACHABLE)
    assert ev.status == 1           # IBTA 12.11.3 SIDR_REP status: service ID not supported
    _close(cid, ch)


def test_sidr_private_data_limits():
    srv_ch, cli_ch, lid, cid = _pair(next(_ports))
    cid.create_qp(_ud())
    with pytest.raises(PyverbsRDMAError) as ex:
        cid.connect(ConnParam(data=bytes(181)))
    assert ex.value.error_code == errno.EINVAL
    cid.connect(ConnParam(data=bytes(180)))       # the limit itself goes
    req = _next(srv_ch, ce.RDMA_CM_EVENT_CONNECT_REQUEST)
    child = CMID(creator=req, listen_id=lid)
    child.create_qp(_ud())
    with pytest.raises(PyverbsRDMAError) as ex:
        child.accept(ConnParam(data=bytes(137)))
    assert ex.value.error_code == errno.EINVAL
    with pytest.raises(PyverbsRDMAError) as ex:
        child.reject(bytes(137))
    assert ex.value.error_code == errno.EINVAL
    child.accept(ConnParam(data=bytes(136)))
    _next(cli_ch, ce.RDMA_CM_EVENT_ESTABLISHED)
    _close(child, cid, lid, cli_ch, srv_ch)


def test_ud_id_takes_only_ud_qps_and_ud_qp_attrs():
    ch = CMEventChannel()
    cid = CMID(creator=ch, port_space=ce.RDMA_PS_UDP)
    with pytest.raises(PyverbsRDMAError) as ex:
        cid.create_qp(QPInitAttr(qp_type=e.IBV_QPT_RC, cap=QPCap(1, 1)))
    assert ex.value.error_code == errno.EOPNOTSUPP
    attr, mask = cid.init_qp_attr(e.IBV_QPS_INIT)
    assert attr.qkey == UDP_QKEY and mask & e.IBV_QP_QKEY
    with pytest.raises(PyverbsRDMAError) as ex:
        cid.init_qp_attr(e.IBV_QPS_SQD)
    assert ex.value.error_code == errno.EINVAL
    with pytest.raises(PyverbsRDMAError) as ex:
        CMID(creator=ch, port_space=ce.RDMA_PS_IB)
    assert ex.value.error_code == errno.EOPNOTSUPP
    _close(cid, ch)


def test_sync_ud_ids_connect_and_accept_without_an_rtu():
    """rdma_create_ep(3) of RDMA_PS_UDP: connect returns once the SIDR_REP came; the
    passive side's accept returns at once (a SIDR_REP is not answered)."""
    port, got = next(_ports), {}
    ready = threading.Event()

    def server():
        try:
            ai = AddrInfo(src="127.0.0.1", src_service=str(port), flags=ce.RAI_PASSIVE,
                          port_space=ce.RDMA_PS_UDP)
            lid = CMID(creator=ai, qp_init_attr=_ud())
            lid.listen()
            ready.set()
            c = lid.get_request()
            buf = c.reg_msgs(GRH + 16)
            c.post_recv(buf)
            got["qpn"] = c.qpn      # before accept: the client reads it once connected
            c.accept()
            assert c.get_recv_comp().status == e.IBV_WC_SUCCESS
            got["data"] = buf.read(16, GRH)
            _close(c, lid)
        except BaseException as err:       # handed to the main thread
            got["err"] = err
            ready.set()

    t = threading.Thread(target=server, daemon=True)
    t.start()
    assert ready.wait(10)
    ai = AddrInfo(dst="127.0.0.1", dst_service=str(port), port_space=ce.RDMA_PS_UDP)
    assert ai.qp_type == e.IBV_QPT_UD
    cid = CMID(creator=ai, qp_init_attr=_ud())
    cid.connect()
    # the synchronous id keeps what the ESTABLISHED carried: its peer's QP
    assert cid._peer_qpn == got["qpn"]
    gr = GlobalRoute(dgid=cid.context.query_gid(1, 0), sgid_index=0, hop_limit=64)
    buf = cid.reg_msgs(16)
    buf.write(b"sync-ud-datagram", 16)
    cid.post_ud_send(buf, AH(cid.pd, attr=AHAttr(is_global=1, port_num=1, gr=gr)),
                     rqpn=cid._peer_qpn)
    assert _within(cid.get_send_comp).status == e.IBV_WC_SUCCESS
    t.join(20)
    assert not t.is_alive()
    if "err" in got:
        raise got["err"]
    assert got["data"] == b"sync-ud-datagram"
    cid.close()


@pytest.mark.parametrize("release", ("v44", "v55", "v59"))
def test_upstream_udp_flow_in_threads(release):
    """rdma-core's test_rdmacm_async_udp_traffic flow (its CMAsyncConnection, unmodified:
    SIDR, UDParam, AH from the ESTABLISHED's ah_attr and from a WC and GRH,
    post_ud_send, ten messages each way checked by upstream's validate) with its two
    players in two threads (tests/support/upstream_cm_threads.py), on an embedded daemon."""
    import subprocess
    import sys
    from pathlib import Path

    from upstream_fetch import tests_dir

    from softhca.tools.pyverbs import path as pyverbs_path

    tests = tests_dir(release)
    if isinstance(tests, str):
        pytest.skip(tests)
    env = {k: v for k, v in os.environ.items()
           if k not in ("SOFTHCA_TARGET", "SOFTHCA_TOKEN_FILE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(pyverbs_path())
    driver = Path(__file__).resolve().parents[1] / "support" / "upstream_cm_threads.py"
    r = subprocess.run([sys.executable, str(driver), str(tests), "127.0.0.1", "udp"],
                       env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr[-3000:]
