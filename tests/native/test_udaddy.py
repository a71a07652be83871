"""Debian's ``udaddy`` (rdmacm-utils), unmodified, on softhca: RDMA_PS_UDP ids, UD QPs
that our librdmacm readies, SIDR_REQ / SIDR_REP between the two daemons' CMs
(server/cm_sidr.py), then SEND_WITH_IMM datagrams each way (the client's AH from the
ESTABLISHED event's param.ud, the server's from ibv_create_ah_from_wc). Each side runs
under its own daemon in its own network namespace (test_rdmacm.py's ``pair``)."""

from __future__ import annotations

import itertools
import subprocess

import native
import pytest
from test_rdmacm import pair, where  # noqa: F401  (the fixture)

pytestmark = pytest.mark.readme_row("rdmacm-utils: `rping -s`")

_wire_ports = itertools.count(24600)


def test_udaddy_exchanges_datagrams(where):  # noqa: F811
    """udaddy's defaults: one UD "connection", 10 messages of 100 bytes from the client,
    10 replies from the server; each side prints its phases and exits 0."""
    wire = next(_wire_ports)
    srv, cli = pair(where, ["stdbuf", "-oL", "udaddy", "-b", where.server.addr],
                    ["stdbuf", "-oL", "udaddy", "-s", where.server.addr], wire, timeout=20)
    both = f"--- server:\n{srv.output}\n--- client:\n{cli.output}"
    assert cli.returncode == 0, both
    assert srv.returncode == 0, both
    for out in (cli.output, srv.output):
        assert "data transfers complete" in out and "return status 0" in out, both
    assert "sending replies" in srv.output and "initiating data transfers" in cli.output


def test_udaddy_to_nobody_is_unreachable(where):  # noqa: F811
    """A SIDR_REQ for a port nobody listens on: the peer's CM answers with a SIDR_REP
    of status 1 (IBTA's "service ID not supported"), which rdma_cm reports as
    UNREACHABLE with that status; udaddy prints it and exits non-zero, no hang."""
    wire = next(_wire_ports)
    srv = native._start(where.argv(where.server, ["sleep", "20"], port=wire),
                        stderr=subprocess.STDOUT)
    try:
        native.wait_listening(srv, wire, timeout=30)
        cli = where.run(where.client, ["udaddy", "-s", where.server.addr], port=wire,
                        timeout=20)
    finally:
        native._reap(srv)
    assert cli.returncode != 0, cli.output
    assert "RDMA_CM_EVENT_UNREACHABLE, error: 1" in cli.output, cli.output
