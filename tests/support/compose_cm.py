"""rdmacm-utils and perftest's ``-R`` between the compose containers (test_compose.py):
each program's server side ``docker exec``'d in the target container, its client side in
the initiator's, both loading softhca's librdmacm.so.1 from /opt/softhca-provider (the
image's LD_LIBRARY_PATH), whose connection manager is the container's daemon. Both
daemons listen on wire port 4791, as the CM needs (an IP address names the daemon at that
address on this daemon's own port).

The checks are those of tests/native/test_rdmacm.py, where the same programs run between
two network namespaces."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass

import compose as dc

TARGET_IP = dc.TARGET_IP
# perftest's result row: "#bytes #iterations ..." then the figures.
PERF_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)", re.M)
# A client that came before the server program's rdma_listen: its REQ met no listener
# (REJ reason 8, invalid service id), which each program reports in its own words; for
# udaddy (RDMA_PS_UDP) its SIDR_REQ met none, SIDR_REP status 1 ("service ID not
# supported"), which rdma_cm reports as UNREACHABLE with that status.
TOO_EARLY = re.compile(r"REJECTED, error 8|REJECTED; error: 8|CM event bl blka 8|"
                       r"got RDMA_CM_EVENT_REJECTED status 8|"
                       r"RDMA_CM_EVENT_UNREACHABLE, error: 1\b")


@dataclass
class Side:
    rc: int
    out: str


def rping_pattern(ping: int, size: int) -> str:
    """rping -v's "ping data: " text for ping ``ping`` of ``size`` bytes, from rping(1)'s
    buffer layout: "rdma-ping-<n>: " then the letters 'A'..'z' from 'A' + n % 58, rising
    and wrapping, size - 1 characters in all (the last byte is the NUL)."""
    letters = [chr(c) for c in range(ord("A"), ord("z") + 1)]
    head = f"rdma-ping-{ping}: "
    body = "".join(letters[(ping + k) % len(letters)] for k in range(size - 1 - len(head)))
    return head + body


def _server(target: str, argv: list[str]) -> tuple[subprocess.Popen, str]:
    """``argv`` in the target container, started by a shell that prints its PID first,
    so that a server left waiting is ended in its container, not only its docker exec."""
    p = subprocess.Popen(["docker", "exec", target, "sh", "-c", 'echo "$$"; exec "$@"',
                          "sh", *argv], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)
    pid = p.stdout.readline().strip()
    return p, pid


def _end(target: str, p: subprocess.Popen, pid: str) -> str:
    if p.poll() is None and pid.isdigit():
        dc.run(["docker", "exec", target, "kill", "-9", pid])
    try:
        out, _ = p.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
    return out


def pair_once(target: str, node: str, server: list[str], client: list[str],
              timeout: float) -> tuple[Side, Side]:
    srv, pid = _server(target, server)
    try:
        # The server's rdma_listen comes a moment after its exec: nothing outside shows
        # when (no TCP port: rdma_cm listens in the daemon).
        time.sleep(1.0)
        cli = dc.run(["docker", "exec", node, *client], timeout=timeout)
        cout = cli.stdout + cli.stderr
        if cli.returncode != 0 and TOO_EARLY.search(cout):
            return Side(-1, "(the client came too early)\n" + _end(target, srv, pid)), \
                Side(cli.returncode, cout)
        try:
            out, _ = srv.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out = f"(killed after {timeout} s)\n" + _end(target, srv, pid)
        return Side(srv.returncode if srv.returncode is not None else -9, out), \
            Side(cli.returncode, cout)
    finally:
        if srv.poll() is None:
            _end(target, srv, pid)


def pair(target: str, node: str, server: list[str], client: list[str],
         timeout: float = 60.0) -> tuple[Side, Side]:
    """The server, then the client; run again (both sides, up to 6 times) when the client
    was rejected for want of a listener: Debian's perftest cannot retry by itself."""
    for _ in range(6):
        srv, cli = pair_once(target, node, server, client, timeout)
        if cli.rc == 0 or not TOO_EARLY.search(cli.out):
            break
    return srv, cli


def both(srv: Side, cli: Side) -> str:
    return f"--- server (rc {srv.rc}):\n{srv.out}\n--- client (rc {cli.rc}):\n{cli.out}"


def check_rping(target: str, node: str, count: int = 100) -> list[str]:
    """rping -s / rping -c -V -v -C count: both exit 0, the client prints ``count``
    verified pings, each the pattern rping(1) sends, and the server as many."""
    port = "7174"
    srv, cli = pair(target, node, ["rping", "-s", "-a", TARGET_IP, "-p", port, "-v",
                                   "-C", str(count)],
                    ["rping", "-c", "-a", TARGET_IP, "-p", port, "-v", "-V", "-C", str(count)])
    assert cli.rc == 0 and srv.rc == 0, both(srv, cli)
    lines = re.findall(r"^ping data: (.*)$", cli.out, re.M)
    assert lines == [rping_pattern(n, 64) for n in range(count)], both(srv, cli)
    assert len(re.findall(r"^server ping data: ", srv.out, re.M)) == count, both(srv, cli)
    return cli.out.strip().splitlines()[-2:]


def check_ucmatose(target: str, node: str) -> list[str]:
    srv, cli = pair(target, node, ["ucmatose", "-p", "7175"],
                    ["ucmatose", "-s", TARGET_IP, "-p", "7175"])
    assert cli.rc == 0 and srv.rc == 0, both(srv, cli)
    for out in (cli.out, srv.out):
        assert "data transfers complete" in out and "return status 0" in out, both(srv, cli)
    return cli.out.strip().splitlines()[-2:]


def check_udaddy(target: str, node: str) -> list[str]:
    """udaddy's defaults over RDMA_PS_UDP (its port is always 7174): one UD "connection"
    resolved by SIDR, 10 datagrams from the client and 10 replies; both exit 0. stdbuf:
    a server left waiting and killed still shows the phases it reached."""
    srv, cli = pair(target, node, ["stdbuf", "-oL", "udaddy", "-b", TARGET_IP],
                    ["stdbuf", "-oL", "udaddy", "-s", TARGET_IP], timeout=30)
    assert cli.rc == 0 and srv.rc == 0, both(srv, cli)
    for out in (cli.out, srv.out):
        assert "data transfers complete" in out and "return status 0" in out, both(srv, cli)
    assert "sending replies" in srv.out and "initiating data transfers" in cli.out, \
        both(srv, cli)
    return cli.out.strip().splitlines()[-2:]


def check_rdma_server_client(target: str, node: str) -> list[str]:
    srv, cli = pair(target, node, ["rdma_server", "-p", "7176"],
                    ["rdma_client", "-s", TARGET_IP, "-p", "7176"])
    assert cli.rc == 0 and srv.rc == 0, both(srv, cli)
    assert "rdma_server: end 0" in srv.out and "rdma_client: end 0" in cli.out, both(srv, cli)
    return [srv.out.strip().splitlines()[-1], cli.out.strip().splitlines()[-1]]


def check_perftest(target: str, node: str, program: str, size: int, port: str,
                   iters: int = 200) -> str:
    """perftest with -R (its connection made with rdma_cm): both exit 0 and the client
    prints its result row for ``size`` bytes and ``iters`` iterations."""
    args = [program, "-R", "-p", port, "-n", str(iters), "-s", str(size)]
    srv, cli = pair(target, node, args, [*args, TARGET_IP])
    assert cli.rc == 0 and srv.rc == 0, both(srv, cli)
    rows = [m for m in PERF_ROW.finditer(cli.out) if int(m.group(1)) == size]
    assert rows and int(rows[0].group(2)) == iters, both(srv, cli)
    assert float(rows[0].group(4)) > 0, both(srv, cli)
    # The whole row, for the report (the pattern matches its first four figures).
    start = rows[0].start()
    return cli.out[start:cli.out.find("\n", start)].strip()
