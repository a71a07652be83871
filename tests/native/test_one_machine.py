"""The README's two programs on one machine, verbatim: two ``softhca run``s, each with
its own daemon on ``--listen 127.0.0.1:0`` (the default), one peer token, a
GID-exchange program (``ibv_rc_pingpong -g 0``) and an rdma_cm one (``rping``) whose
client names the server by 127.0.0.1. The default takes the first 127.0.0.N whose port
4791 is free, so the first daemon has 127.0.0.1 and the second 127.0.0.2, each
reaching the other at its address (docs/native.md, "Two programs on one machine").

Each test runs in a network namespace with only ``lo`` (tests/support/netns.py
``one_host``): a machine of its own, whose loopback port 4791 no other test's daemon
holds. When a connection cannot work, the daemon says why in one line beside the
program's event (REJECTED 8, UNREACHABLE -110)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import native
import netns
import pytest
from test_rdmacm import CM_LIB, rping_pattern

RUN = [sys.executable, "-m", "softhca.tools.cli", "run"]
PINGS = 5


@pytest.fixture
def host(tmp_path):
    why = native.unavailable("rping", "ibv_rc_pingpong") or netns.unavailable()
    if why:
        pytest.skip(why)
    if not CM_LIB.is_file():
        pytest.skip(f"our librdmacm is not built ({CM_LIB}): `make provider` builds it")
    token = tmp_path / "peer-token"
    token.write_text("ab" * 32)
    token.chmod(0o600)
    with netns.one_host() as ns:
        yield ns, token


def _argv(ns: str, token, program: list[str], *listen: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *RUN, "--peer-token-file", str(token), *listen,
            "--", *program]


def _client(ns, token, program, *listen, timeout=60.0) -> native.Done:
    argv = _argv(ns, token, program, *listen)
    proc = native._start(argv, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        native._reap(proc)
    return native.Done(argv, proc.returncode, out)


def _two(ns, token, server, client, tcp_port: int | None, *listen: str,
         tries: int = 6) -> tuple[native.Done, native.Done]:
    """The server's softhca run, then the client's. rping's rdma_listen comes some time
    after its daemon listens and nothing outside shows when: a client rejected for want
    of a listener (REJECTED 8) runs both again."""
    for _ in range(tries):
        srv = native._start(_argv(ns, token, server, *listen), stderr=subprocess.STDOUT)
        gated = None
        try:
            # The first daemon of the machine takes 127.0.0.1:4791; the client's starts
            # only then (its program held, native.GATE), during the moment given to
            # rping's listen.
            native.wait_listening(srv, 4791 if tcp_port is None else tcp_port, timeout=30)
            gated = native._start(_argv(ns, token, [*native.GATE, *client], *listen),
                                  stderr=subprocess.STDOUT, stdin=subprocess.PIPE)
            if tcp_port is None:
                time.sleep(1.0)
            cli = native.Place.release(gated, 60.0)
            if cli.returncode != 0 and "REJECTED, error 8" in cli.output:
                continue
            out, _ = srv.communicate(timeout=60)
        finally:
            if gated is not None:
                native._reap(gated)
            native._reap(srv)
        return native.Done(server, srv.returncode, out), cli
    raise AssertionError(f"the client was rejected {tries} times:\n{cli.output}")


def _gid(n: int) -> str:
    """The GID ibv_rc_pingpong prints for the daemon at 127.0.0.n:4791, device 0,
    worked out here from the softhca GID's layout (fe80::<IPv4>:<port>:<device>),
    written as inet_ntop writes it."""
    import ipaddress

    raw = bytes.fromhex("fe80000000000000") + bytes([127, 0, 0, n]) \
        + (4791).to_bytes(2, "big") + (0).to_bytes(2, "big")
    return str(ipaddress.IPv6Address(raw))


@pytest.mark.parametrize("listen", [("--listen", "127.0.0.1:0"), ()],
                         ids=["listen-127.0.0.1:0", "default"])
def test_rping_between_two_runs_on_one_machine(host, listen):
    ns, token = host
    srv, cli = _two(ns, token, ["rping", "-s", "-v", "-C", str(PINGS)],
                    ["rping", "-c", "-v", "-C", str(PINGS), "-a", "127.0.0.1"], None, *listen)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0 and srv.returncode == 0, both
    lines = re.findall(r"^ping data: (.*)$", cli.output, re.M)
    assert lines == [rping_pattern(n, 64) for n in range(PINGS)], both
    assert len(re.findall(r"^server ping data: ", srv.output, re.M)) == PINGS, both
    for said in ("event=cm_rejected", "event=cm_unreachable", "wire link failed"):
        assert said not in both, both


def test_ibv_rc_pingpong_between_two_runs_on_one_machine(host):
    ns, token = host
    listen = ("--listen", "127.0.0.1:0")
    srv, cli = _two(ns, token, ["ibv_rc_pingpong", "-g", "0"],
                    ["ibv_rc_pingpong", "-g", "0", "127.0.0.1"], 18515, *listen)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0 and srv.returncode == 0, both
    # Each daemon on an address of its own: the first 127.0.0.1, the second 127.0.0.2.
    assert re.search(rf"local address: .* GID {_gid(1)}$", srv.output, re.M), both
    assert re.search(rf"remote address: .* GID {_gid(2)}$", srv.output, re.M), both
    assert re.search(rf"local address: .* GID {_gid(2)}$", cli.output, re.M), both
    assert "1000 iters in" in cli.output, both


def test_an_rdma_cm_connect_that_cannot_work_says_why(host):
    ns, token = host
    # Alone on the machine, the client's daemon is 127.0.0.1 itself: nothing listens
    # there on rping's port.
    alone = _client(ns, token, ["rping", "-c", "-C", "1", "-a", "127.0.0.1"])
    assert alone.returncode != 0, alone.output
    assert "RDMA_CM_EVENT_REJECTED, error 8" in alone.output, alone.output
    said = [ln for ln in alone.output.splitlines() if "event=cm_rejected" in ln]
    assert len(said) == 1, alone.output
    assert "no rdma_cm listener on port 7174 at the daemon at 127.0.0.1:4791" in said[0]
    assert "127.0.0.1 names this daemon itself" in said[0]
    # No daemon at 127.0.0.9: the REQ's resends run out (UNREACHABLE, -ETIMEDOUT), and
    # the line names the address that refused and the port the daemons share.
    nobody = _client(ns, token, ["rping", "-c", "-C", "1", "-a", "127.0.0.9"])
    assert nobody.returncode != 0, nobody.output
    assert "RDMA_CM_EVENT_UNREACHABLE, error -110" in nobody.output, nobody.output
    said = [ln for ln in nobody.output.splitlines() if "event=cm_unreachable" in ln]
    assert len(said) == 1, nobody.output
    assert "no daemon listens at 127.0.0.9:4791" in said[0], said
    assert "ECONNREFUSED" in nobody.output


def test_a_listener_bound_to_127_0_0_1_is_its_own_daemons(host):
    """Under a daemon whose address is 127.0.0.2 (the machine's first run holds
    127.0.0.1), a program that binds its listener to 127.0.0.1 (lo's first address, as
    rdma-core's tests take their netdev's) and connects to it reaches itself: a local
    listener's address is local."""
    ns, token = host
    first = native._start(_argv(ns, token, ["sleep", "60"]), stderr=subprocess.STDOUT)
    try:
        native.wait_listening(first, 4791, timeout=30)
        both = _client(ns, token, ["sh", "-c", "rping -s -a 127.0.0.1 -C 2 -v & sleep 2; "
                                   "rping -c -a 127.0.0.1 -C 2 -v; rc=$?; wait; exit $rc"])
    finally:
        native._reap(first)
    assert both.returncode == 0, both.output
    assert len(re.findall(r"^ping data: ", both.output, re.M)) == 2, both.output
    for said in ("event=cm_rejected", "event=cm_unreachable", "wire link failed"):
        assert said not in both.output, both.output
