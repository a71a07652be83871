"""Debian's rdmacm-utils, unmodified, on softhca: each side under ``softhca run`` (its
own daemon) in its own network namespace, finding our librdmacm.so.1 (provider/rdmacm/)
on the library path, its connection manager in the daemon (server/cm.py).

The daemons of one fabric share a wire port (an IP address names the daemon at that
address on this daemon's own port), so each pair runs both daemons on one port."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import time

import native
import pytest

pytestmark = pytest.mark.readme_row("rdma_cm, through softhca's own `librdmacm.so.1`")

_ports = itertools.count(22000)
# perftest's result row: "#bytes #iterations ..." then the figures.
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", re.M)
_wire_ports = itertools.count(23000)
CM_LIB = native.REPO / "provider" / "build" / "librdmacm.so.1"
CMCHECK = native.REPO / "provider" / "build" / "cmcheck"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    if not CM_LIB.is_file():
        pytest.skip(f"our librdmacm is not built ({CM_LIB}): `make provider` builds it")
    with native.cm_place(tmp_path_factory.mktemp("rdmacm"), "rping") as p:
        yield p


def rping_pattern(ping: int, size: int) -> str:
    """What ``rping -v`` prints after "ping data: " for ping ``ping`` of ``size`` bytes,
    computed here from rping's documented buffer: "rdma-ping-<n>: " then letters from
    'A' + n (mod the 58 characters 'A'..'z') rising and wrapping, size - 1 characters
    in all (the last byte is the NUL)."""
    head = f"rdma-ping-{ping}: "
    start = 65 + ping % 58
    body = []
    c = start
    for _ in range(len(head), size - 1):
        body.append(chr(c))
        c = 65 if c >= 122 else c + 1
    return (head + "".join(body))[:size - 1]


def test_rping_pattern_is_rpings():
    # Two pings read off rping's format by hand: ping 0 starts at 'A', ping 1 at 'B'.
    assert rping_pattern(0, 64) == "rdma-ping-0: " + "".join(map(chr, range(65, 65 + 50)))
    assert rping_pattern(1, 20)[-6:] == "BCDEFG"[:6]


@pytest.mark.readme_row("rdmacm-utils: `rping -s`")
def test_rping_100_verified_pings(where):
    port = next(_ports)
    wire = next(_wire_ports)
    count = 100
    server = ["rping", "-s", "-a", where.server.addr, "-p", str(port), "-v", "-C", str(count)]
    client = ["rping", "-c", "-a", where.server.addr, "-p", str(port), "-v", "-V", "-C",
              str(count)]
    srv, cli = pair(where, server, client, wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0, both
    assert srv.returncode == 0, both
    lines = re.findall(r"^ping data: (.*)$", cli.output, re.M)
    assert len(lines) == count, both
    for n, line in enumerate(lines):
        assert line == rping_pattern(n, 64), (n, line)
    served = re.findall(r"^server ping data: (.*)$", srv.output, re.M)
    assert len(served) == count, both


def test_rping_to_nobody_is_rejected(where):
    """A connect to a port nobody listens on ends in REJECTED (the peer daemon's CM
    answers the REQ with reason 8, invalid service id), not a hang."""
    wire = next(_wire_ports)
    # The server side's daemon runs a program that does not listen on rdma_cm at all.
    srv_argv = where.argv(where.server, ["sleep", "20"], port=wire)
    proc = native._start(srv_argv, stderr=subprocess.STDOUT)
    try:
        native.wait_listening(proc, wire, timeout=30)
        cli = where.run(where.client, ["rping", "-c", "-a", where.server.addr, "-p", "9",
                                       "-C", "1"], port=wire, timeout=60)
    finally:
        native._reap(proc)
    assert cli.returncode != 0, cli.output
    assert "RDMA_CM_EVENT_REJECTED, error 8" in cli.output, cli.output


# A client that came before the server program's rdma_listen: its REQ met no listener
# (REJ reason 8, as the peer's CM answers it), which rping, ucmatose and perftest report
# in their own words.
TOO_EARLY = re.compile(r"REJECTED, error 8|REJECTED; error: 8|CM event bl blka 8|"
                       r"got RDMA_CM_EVENT_REJECTED status 8")


def pair(where, server_prog, client_prog, wire: int, timeout: float = 60.0,
         client_run_args=()):
    """Both sides' daemons on wire port ``wire``: the server first, then (once its
    daemon listens) the client. The server program's rdma_listen comes some time after
    its daemon listens, and nothing outside shows when (this machine is shared: no fixed
    pause covers it). A client rejected for want of a listener means the pair is run
    again, both sides, up to 6 times: perftest 4.5-0.17 (Debian's) cannot retry itself,
    its retry after a REJ reuses the ids it destroyed, and its server then waits for a
    connection that never comes."""
    for _ in range(6):
        srv, cli = _pair_once(where, server_prog, client_prog, wire, timeout,
                              client_run_args)
        if cli.returncode == 0 or not TOO_EARLY.search(cli.output):
            break
    return srv, cli


def _pair_once(where, server_prog, client_prog, wire: int, timeout: float,
               client_run_args=()):
    argv = where.argv(where.server, server_prog, port=wire)
    srv = native._start(argv, stderr=subprocess.STDOUT)
    gated = None
    try:
        # The client's softhca run starts now, its program held until released below.
        gated = where.gated(where.client, client_prog, port=wire, run_args=client_run_args)
        native.wait_listening(srv, wire, timeout=30)
        # The server program binds its rdma_cm id once it runs: give it a moment.
        time.sleep(1.0)
        cli = where.release(gated, timeout)
        if cli.returncode != 0 and TOO_EARLY.search(cli.output):
            return native.Done(argv, -1, "(the client came too early)"), cli
        try:
            out, _ = srv.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(srv.pid, signal.SIGKILL)
            out, _ = srv.communicate(timeout=10)
            out = f"(killed after {timeout} s)\n{out}\n--- client:\n{cli.output}"
    finally:
        if gated is not None:
            native._reap(gated)
        native._reap(srv)
    return native.Done(argv, srv.returncode, out), cli





def test_ucmatose_default(where):
    """ucmatose with its defaults (one connection, 10 messages of 100 bytes each way,
    SENDs over the QPs rdma_cm moved), each side exiting 0."""
    wire = next(_wire_ports)
    port = str(next(_ports))
    srv, cli = pair(where, ["ucmatose", "-p", port],
                    ["ucmatose", "-s", where.server.addr, "-p", port], wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0, both
    assert srv.returncode == 0, both
    for out in (cli.output, srv.output):
        assert "data transfers complete" in out and "return status 0" in out, both


def test_rdma_server_rdma_client(where):
    """rdmacm-utils' rdma_server / rdma_client: rdma_getaddrinfo, rdma_create_ep,
    rdma_listen, rdma_get_request, rdma_accept / rdma_connect on synchronous ids, and
    the rdma_verbs.h helpers (rdma_reg_msgs, rdma_post_recv, rdma_post_send,
    rdma_get_send_comp, rdma_get_recv_comp) over the QP and CQs rdma_create_ep made."""
    wire = next(_wire_ports)
    port = str(next(_ports))
    srv, cli = pair(where, ["rdma_server", "-p", port],
                    ["rdma_client", "-s", where.server.addr, "-p", port], wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0, both
    assert srv.returncode == 0, both
    assert "rdma_server: end 0" in srv.output and "rdma_client: end 0" in cli.output, both


def test_rping_with_qps_the_program_moves_itself(where):
    """``rping -q``: each side creates its QP with ibv_create_qp and moves it through
    INIT, RTR and RTS with rdma_init_qp_attr (conn_param.qp_num names it); the active
    side calls rdma_establish after CONNECT_RESPONSE."""
    port = next(_ports)
    wire = next(_wire_ports)
    count = 20
    server = ["rping", "-s", "-q", "-a", where.server.addr, "-p", str(port), "-C", str(count)]
    client = ["rping", "-c", "-q", "-a", where.server.addr, "-p", str(port), "-v", "-V",
              "-C", str(count)]
    srv, cli = pair(where, server, client, wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0 and srv.returncode == 0, both
    lines = re.findall(r"^ping data: (.*)$", cli.output, re.M)
    assert lines == [rping_pattern(n, 64) for n in range(count)], both


@pytest.mark.parametrize("program,size", [("ib_write_bw", 65536), ("ib_send_lat", 64)])
def test_perftest_over_rdma_cm(where, program, size):
    """perftest with ``-R``: the connection is made with rdma_cm (rdma_getaddrinfo,
    rdma_create_id, rdma_resolve_addr/route, rdma_create_qp_ex, rdma_connect /
    rdma_listen / rdma_accept with perftest's private data) instead of its TCP side
    channel; the client prints its result row for the size and iteration count."""
    if native.unavailable(program):
        pytest.skip(native.unavailable(program))
    port, wire, iters = str(next(_ports)), next(_wire_ports), 200
    args = [program, "-R", "-p", port, "-n", str(iters), "-s", str(size)]
    srv, cli = pair(where, args, [*args, where.server.addr], wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0 and srv.returncode == 0, both
    rows = [m for m in ROW.finditer(cli.output) if int(m.group(1)) == size]
    assert rows and int(rows[0].group(2)) == iters, both
    assert float(rows[0].group(4)) > 0, both


def test_a_dropped_req_is_sent_again_and_rping_connects(where, tmp_path):
    """A fault rule drops the client daemon's first CM REQ on the wire: its CM sends
    the REQ again after the response timeout (1 s) and rping's 10 pings complete."""
    rules = tmp_path / "faults.json"
    rules.write_text(json.dumps([{"action": "drop", "cm": "req", "count": 1}]))
    stats = tmp_path / "stats.json"
    port, wire = str(next(_ports)), next(_wire_ports)
    srv, cli = pair(where, ["rping", "-s", "-a", where.server.addr, "-p", port, "-C", "10"],
                    ["rping", "-c", "-a", where.server.addr, "-p", port, "-v", "-C", "10"],
                    wire, client_run_args=["--faults", str(rules), "--stats", str(stats)])
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0 and srv.returncode == 0, both
    assert len(re.findall(r"^ping data: ", cli.output, re.M)) == 10, both
    s = json.loads(stats.read_text())
    assert s["cm_messages_dropped"] == 1 and s["cm_retransmissions"] >= 1, s


def test_a_listener_whose_daemon_died_ends_unreachable(where):
    """rping -s listens, then its daemon (and rping) are killed: rping -c's REQ goes
    unanswered, is sent 3 more times 1 s apart, and rping reports UNREACHABLE with
    -ETIMEDOUT (-110) some 4 s after it connects, not a hang."""
    port, wire = str(next(_ports)), next(_wire_ports)
    argv = where.argv(where.server, ["rping", "-s", "-a", where.server.addr, "-p", port],
                      port=wire)
    srv = native._start(argv, stderr=subprocess.STDOUT)
    try:
        native.wait_listening(srv, wire, timeout=30)
        time.sleep(1.0)
    finally:
        native._reap(srv)
    t0 = time.monotonic()
    cli = where.run(where.client, ["rping", "-c", "-a", where.server.addr, "-p", port,
                                   "-C", "1"], port=wire, timeout=60)
    took = time.monotonic() - t0
    assert cli.returncode != 0, cli.output
    assert "RDMA_CM_EVENT_UNREACHABLE, error -110" in cli.output, cli.output
    # 4 s of CM retries, plus softhca run's own start and stop.
    assert 4.0 <= took < 15.0, (took, cli.output)


def _cmcheck():
    if not CMCHECK.is_file():
        pytest.skip(f"{CMCHECK} is not built: `make provider` builds it")
    return str(CMCHECK)


def test_resolve_addr_to_nobody_ends_addr_error_at_its_timeout(where):
    """rdma_resolve_addr(3) to an address of the namespaces' subnet that no host has
    (its ARP goes unanswered): ADDR_ERROR with -ETIMEDOUT once timeout_ms (500) has
    passed, not before and not much after."""
    nobody = where.server.addr.rsplit(".", 1)[0] + ".77"
    cli = where.run(where.client, [_cmcheck(), "resolve", nobody, "500"],
                    port=next(_wire_ports), timeout=60)
    m = re.search(r"^event (\S+) status (-?\d+) ms (\d+)$", cli.output, re.M)
    assert cli.returncode == 0 and m, cli.output
    assert (m.group(1), int(m.group(2))) == ("RDMA_CM_EVENT_ADDR_ERROR", -110), cli.output
    assert 450 <= int(m.group(3)) < 2000, cli.output


def test_rdma_disconnect_flushes_and_the_peer_is_disconnected(where):
    """The client's rdma_disconnect moves its QP to ERR, so its 4 posted receives
    complete with IBV_WC_WR_FLUSH_ERR, and the server gets DISCONNECTED (its QP
    untouched, as the kernel's CM leaves it: no completion yet); the server's own
    rdma_disconnect then flushes its 4 receives. Then both get
    RDMA_CM_EVENT_TIMEWAIT_EXIT (status 0) after the IB CM's timewait for a RoCE path:
    packet lifetime 16 and ACK delay 16 need 4.096 us * 2^t >= 4.096 us * (2^16 + 2 *
    2^16), so t = 18, waited as 2^(18 - 8) ms."""
    port, wire = str(next(_ports)), next(_wire_ports)
    srv, cli = pair(where, [_cmcheck(), "flush-server", port],
                    [_cmcheck(), "flush-client", where.server.addr, port], wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0 and srv.returncode == 0, both
    assert "client flushed 4 of 4" in cli.output and "client DISCONNECTED" in cli.output, both
    assert "server DISCONNECTED, completions before its own rdma_disconnect: 0" \
        in srv.output, both
    assert "server flushed 4 of 4" in srv.output, both
    need = (1 << 16) + 2 * (1 << 16)
    want = 1 << (next(t for t in range(32) if 1 << t >= need) - 8)
    assert want == 1024
    for out in (srv.output, cli.output):
        m = re.search(r"^(?:server|client) TIMEWAIT_EXIT status (-?\d+) after (\d+) ms$",
                      out, re.M)
        assert m and m.group(1) == "0", both
        # Counted from the DISCONNECTED event the program read, a little after the
        # timewait began; the machine may be loaded.
        assert want - 150 <= int(m.group(2)) < want + 2000, both


def test_rdma_set_option(where):
    """rdma_set_option(3): RDMA_OPTION_ID_TOS and _ACK_TIMEOUT take a uint8_t (another
    size is EINVAL; an ACK timeout is IBTA's 5-bit field), REUSEADDR and AFONLY an int;
    REUSEADDR lets two ids bind one port but neither listen on it, and is EINVAL once
    the id is bound; an option rdma_cm does not have is ENOSYS (the kernel's answer);
    path records (RDMA_OPTION_IB_PATH) are not modelled: EOPNOTSUPP."""
    cli = where.run(where.client, [_cmcheck(), "options"], port=next(_wire_ports),
                    timeout=60)
    got = dict(re.findall(r"^([a-z0-9-]+) (ok|[A-Z][a-z ]+)$", cli.output, re.M))
    assert cli.returncode == 0, cli.output
    assert got == {
        "tos": "ok", "tos-int": "Invalid argument", "ack-timeout": "ok",
        "ack-timeout-32": "Invalid argument", "afonly": "ok",
        "unknown": "Function not implemented", "ib-path": "Operation not supported",
        "reuseaddr": "ok", "reuseaddr-other": "ok", "bind": "ok", "bind-shared": "ok",
        "listen-shared": "Address already in use", "reuseaddr-bound": "Invalid argument",
    }, cli.output


def test_the_device_names_the_netdev_whose_address_the_daemon_answers_on(where):
    """In softhca run's mount namespace /sys/class/infiniband/<dev>/device/net/<if>
    names the interface that holds the daemon's address, which rdma-core's
    tests/base.py reads (ls there, then `ip -j addr show <if>` for the IP); the other
    classes of /sys/class are still there."""
    script = ("dev=$(ls /sys/class/infiniband | head -n1); "
              "ifc=$(ls /sys/class/infiniband/$dev/device/net/); echo netdev=$ifc; "
              "ip -j addr show $ifc; echo; ls /sys/class/net")
    out = where.run(where.server, ["sh", "-c", script], port=next(_wire_ports), timeout=60)
    assert out.returncode == 0, out.output
    ifc = re.search(r"^netdev=(\S+)$", out.output, re.M).group(1)
    info = json.loads(next(line for line in out.output.splitlines() if line.startswith("[")))
    assert where.server.addr in [a["local"] for a in info[0]["addr_info"]], out.output
    assert ifc in out.output.split("]", 1)[1].split(), out.output      # in /sys/class/net


def test_a_program_that_exits_connected_disconnects_its_peer(where):
    """The client program exits with its connection up and never calls rdma_disconnect:
    its daemon, embedded in softhca run, ends with it and must disconnect the program's
    ids first (a DREQ, as the kernel's CM does for the ids of a process that dies), so
    the server gets RDMA_CM_EVENT_DISCONNECTED at once, not when a keep-alive or an RC
    retry fails. "At once": within the client daemon's shutdown, well under 3 s."""
    port, wire = str(next(_ports)), next(_wire_ports)
    srv, cli = pair(where, [_cmcheck(), "exit-server", port],
                    [_cmcheck(), "exit-client", where.server.addr, port], wire, timeout=30)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert "client ESTABLISHED, exiting" in cli.output and cli.returncode == 0, both
    m = re.search(r"^server DISCONNECTED after (\d+) ms$", srv.output, re.M)
    assert m and srv.returncode == 0, both
    assert int(m.group(1)) < 3000, both


def test_rdma_migrate_id(where):
    """rdma_migrate_id(3): the id's event queued on its old channel and not read moves
    to the new one (the old no longer polls readable); the call waits while an event
    of the id is not acknowledged ("This call will block while there are any
    unacknowledged events"); later events come on the new channel only; NULL makes the
    id synchronous, and NULL again is EINVAL (librdmacm's answer for an id already
    synchronous); a synchronous id migrates back to a channel. libfabric's verbs
    provider migrates every id it makes onto its event queue's channel."""
    cli = where.run(where.client, [_cmcheck(), "migrate", where.client.addr],
                    port=next(_wire_ports), timeout=60)
    print(cli.output)
    assert cli.returncode == 0, cli.output
    for line in ("pending moved: A readable 0, B readable 1, id channel is B 1",
                 "B event RDMA_CM_EVENT_ADDR_RESOLVED status 0 id matches 1",
                 "migrate with an event unacknowledged: returned 0",
                 "after the ack: returned 1 rc 0, id channel is A 1",
                 "new event: A readable 1, B readable 0",
                 "A event RDMA_CM_EVENT_ROUTE_RESOLVED status 0",
                 "to synchronous: rc 0, channel is neither A nor B 1",
                 "synchronous again: rc -1 errno EINVAL",
                 "synchronous to B: rc 0, id channel is B 1"):
        assert line in cli.output.splitlines(), f"{line!r} missing:\n{cli.output}"


def test_addrinfo_from_hints_and_a_loopback_bind(where):
    """rdma_getaddrinfo(3) with no node takes the address from the hints
    (ai_dst_addr active, ai_src_addr passive, the service's port), as libfabric's verbs
    provider connects with the peer's address there. A bind of 127.0.0.1 while the
    daemon's device is on another interface leaves the id without a device (lo has
    none: the kernel gives an id a device only from an address of the device's
    interface), while the daemon's own address names it; libfabric's provider binds
    "localhost" and, finding no device, listens on the device's own address."""
    addr = where.client.addr
    cli = where.run(where.client, [_cmcheck(), "addrinfo", addr], port=next(_wire_ports),
                    timeout=60)
    print(cli.output)
    assert cli.returncode == 0, cli.output
    for line in (f"active from hints: dst {addr}:7471",
                 f"passive from hints: src {addr}:7472 dst none",
                 "bound 127.0.0.1: device none",
                 f"bound {addr}: device yes"):
        assert line in cli.output.splitlines(), f"{line!r} missing:\n{cli.output}"


@pytest.mark.parametrize("depth,rr,at_request,accepted", [
    (1, 0, "REMOTE_WRITE REMOTE_READ REMOTE_ATOMIC", "REMOTE_WRITE"),
    (0, 1, "REMOTE_WRITE", "REMOTE_WRITE"),
], ids=["peer-depth-1-accept-rr-0", "peer-depth-0"])
def test_the_connection_grants_read_and_atomics_with_responder_resources(
        where, depth, rr, at_request, accepted):
    """rdma_init_qp_attr(INIT)'s access flags, as the kernel's rdma_cm answers them: none
    before a connection (rdma_cm's own INIT); then the IB CM's (cm_init_qp_init_attr):
    remote WRITE always, remote READ and atomics when this side has responder
    resources. At the CONNECT_REQUEST those are the peer's initiator depth; after
    rdma_accept, what the accept gave (no more than that depth). A connection with
    them (depth 1, accept 1) is what qperf's atomics and ib_atomic_bw -R run on
    (tests/native/test_qperf.py)."""
    port, wire = str(next(_ports)), next(_wire_ports)
    srv, cli = pair(where, [_cmcheck(), "access-server", port, str(rr)],
                    [_cmcheck(), "access-client", where.server.addr, port, str(depth)],
                    wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    print(both)
    assert srv.returncode == 0 and cli.returncode == 0, both
    lines = srv.output.splitlines()
    # The CONNECT_REQUEST's conn param as the IB CM hands it up (cm_format_req_event):
    # this side's to give, so its responder resources are the client's initiator depth
    # and its initiator depth the client's responder resources (1, access-client's).
    for line in ("server unconnected: none",
                 f"server request event: responder_resources {depth} initiator_depth 1",
                 f"server request with initiator depth {depth}: {at_request}",
                 f"server accepted with responder resources {rr}: {accepted}"):
        assert line in lines, f"{line!r} missing:\n{both}"
    # Each side's RNR retry count is the one its peer asked for (IBTA's REQ and REP
    # fields; the kernel's cm_req_handler and cm_rep_handler): the client connects
    # with 7, the server accepts with 3. tgtd accepts with 0: taken for its own QP, its
    # login response failed "RNR retry counter exceeded" whenever libiscsi's receive
    # came late.
    assert "server qp rnr_retry 7" in lines, both
    assert "client qp rnr_retry 3" in cli.output.splitlines(), both


def test_a_receive_posted_late_is_waited_for_with_the_ib_cms_rnr_timer(where):
    """The RNR NAK timer rdma_cm's QPs get is the IB CM's (the kernel's
    cm_init_qp_rtr_attr gives min_rnr_timer 0: IBTA's code for 655.36 ms). The server
    accepts asking for an RNR retry count of 1 and posts its one receive 300 ms after
    ESTABLISHED; the client SENDs at once. On a kernel device the SEND meets one RNR
    NAK, waits 655 ms and is taken: IBV_WC_SUCCESS after some 0.7 s. With a 0.64 ms
    timer (code 12) both tries go within a few ms and the SEND fails 'RNR retry counter
    exceeded', as tgtd's NOP-In did when it came just after a login response, before
    libiscsi had posted its next receive (tests/native/test_iser.py)."""
    port, wire = str(next(_ports)), next(_wire_ports)
    srv, cli = pair(where, [_cmcheck(), "rnr-server", port, "300"],
                    [_cmcheck(), "rnr-client", where.server.addr, port], wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    print(both)
    assert srv.returncode == 0 and cli.returncode == 0, both
    assert "server rtr min_rnr_timer 0 (mask has it: yes)" in srv.output.splitlines(), both
    assert "client qp rnr_retry 1" in cli.output.splitlines(), both
    m = re.search(r"^client send: (.+) after (\d+) ms$", cli.output, re.M)
    assert m and m.group(1) == "success", both
    # one RNR NAK wait of 655.36 ms (a loaded machine may add to it, never take from it)
    assert int(m.group(2)) >= 655, both
    assert "server receive posted 300 ms late: success, 32 bytes" in srv.output, both


# -- IPv6 addresses (rdma_cm over AF_INET6, as the kernel's rdma_cm has them) --------------
# Daemons reach each other over IPv4; an IPv6 address names a daemon when it is the
# wildcard, loopback or IPv4-mapped (::ffff:a.b.c.d names a.b.c.d).

def test_ipv6_binds_and_resolves(where):
    """rdma_bind_addr(3) of `::`, `::1` and ::ffff:<this namespace's address> binds
    (rdma_get_local_addr answers in AF_INET6); an IPv6 address no interface has is
    EADDRNOTAVAIL, as the kernel's rdma_bind_addr. A v4 wildcard's port is shared with
    a v6 wildcard only when that one is RDMA_OPTION_ID_AFONLY (the kernel's default,
    net.ipv6.bindv6only = 0, takes IPv4 too); both then listen. rdma_resolve_addr(3) to
    an IPv6 address that names no daemon: ENETUNREACH (no route), and an id bound to
    one family resolving the other: EINVAL."""
    a = where.client.addr
    cli = where.run(where.client, [_cmcheck(), "ip-binds", a], port=next(_wire_ports),
                    timeout=60)
    got = dict(re.findall(r"^([a-z0-9-]+) (ok.*|[A-Z][a-z ]+)$", cli.output, re.M))
    assert cli.returncode == 0, cli.output
    assert got == {
        "bind-any6": "ok AF_INET6 [::]:7401", "bind-loopback6": "ok AF_INET6 [::1]:7402",
        "bind-mapped": f"ok AF_INET6 [::ffff:{a}]:7403",
        "bind-foreign6": "Cannot assign requested address",
        "bind-any4": "ok AF_INET 0.0.0.0:7405",
        "bind-any6-same-port": "Address already in use",
        "bind-any6-afonly-same-port": "ok AF_INET6 [::]:7405",
        "listen-0": "ok", "listen-1": "ok", "listen-2": "ok", "listen-4": "ok",
        "listen-6": "ok",
        "resolve-foreign6": "Network is unreachable",
        "resolve-other-family": "Invalid argument",
    }, cli.output


def _ip_pair(where, bind: str, afonly: int, accepted: int, *addrs: str):
    port, wire = str(next(_ports)), next(_wire_ports)
    srv, cli = pair(where, [_cmcheck(), "ip-server", bind, port, str(afonly), str(accepted)],
                    [_cmcheck(), "ip-client", port, *addrs], wire)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert srv.returncode == 0 and cli.returncode == 0, both
    return port, srv.output.splitlines(), cli.output.splitlines(), both


def _has(lines, pattern: str) -> bool:
    return any(re.fullmatch(pattern, line) for line in lines)


def test_a_v6_wildcard_listener_takes_ipv4_and_ipv4_mapped_clients(where):
    """A listener on `::` (AFONLY not set) takes an IPv4 client, whose connection is
    AF_INET on both sides (the kernel's rdma_cm gives the new id the REQ's family),
    and an IPv4-mapped one, AF_INET6 on both sides with the mapped addresses."""
    s, c = re.escape(where.server.addr), re.escape(where.client.addr)
    port, srv, cli, both = _ip_pair(where, "::", -1, 2, where.server.addr,
                                    f"::ffff:{where.server.addr}")
    assert f"server bind ok AF_INET6 [::]:{port}" in srv, both
    assert _has(srv, rf"server request local AF_INET {s}:{port} peer AF_INET {c}:\d+"), both
    assert _has(srv, rf"server request local AF_INET6 \[::ffff:{s}\]:{port} "
                     rf"peer AF_INET6 \[::ffff:{c}\]:\d+"), both
    assert "server accepted 2" in srv, both
    assert _has(cli, rf"client established local AF_INET {c}:\d+ peer AF_INET {s}:{port}"), \
        both
    assert _has(cli, rf"client established local AF_INET6 \[::ffff:{c}\]:\d+ "
                     rf"peer AF_INET6 \[::ffff:{s}\]:{port}"), both


@pytest.mark.parametrize("bind,afonly", [("::ffff:{s}", -1), ("::", 1)],
                         ids=["mapped-listener", "afonly-wildcard"])
def test_an_ipv6_only_listener_refuses_an_ipv4_client(where, bind, afonly):
    """A listener on ::ffff:<v4>, or on `::` with RDMA_OPTION_ID_AFONLY, takes the
    IPv4-mapped client and refuses the IPv4 one: the kernel's rdma_cm matches a REQ
    to a listener of its IP version only (a `::` listener without AFONLY excepted), so
    the IB CM rejects it, consumer-defined (reason 28), the port being listened on."""
    s = where.server.addr
    port, srv, cli, both = _ip_pair(where, bind.format(s=s), afonly, 1, f"::ffff:{s}", s)
    assert "server accepted 1" in srv, both
    assert _has(cli, rf"client established local AF_INET6 .* peer AF_INET6 "
                     rf"\[::ffff:{re.escape(s)}\]:{port}"), both
    assert _has(cli, rf"client resolved local AF_INET \S+ peer AF_INET {re.escape(s)}:{port}"), \
        both
    assert "client RDMA_CM_EVENT_REJECTED status 28" in cli, both
