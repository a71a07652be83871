"""pyverbs' CMID (client/pyverbs/cmid.py) judged by a real rdma_cm peer: Debian's
``rping -s`` under ``softhca run`` in one network namespace, an rping client written
with pyverbs (rping_client.py) in the other, its daemon the ``softhca run`` of its side
(SOFTHCA_TARGET, its UNIX socket). The server prints what it RDMA READ from the client ("server ping
data: "); the client prints what the server RDMA WROTE back: both must be exactly what
the client put in its start buffer."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import native
import pytest

from softhca.tools.pyverbs import path as pyverbs_path

HERE = Path(__file__).resolve().parent
COUNT, SIZE = 5, 64


def ping_text(n: int, size: int) -> bytes:
    """What rping_client.py puts in ping ``n``'s start buffer, as its docstring states."""
    body = f"pyverbs-ping-{n}: " + "".join(chr(97 + (n + i) % 26) for i in range(size))
    return body.encode()[:size - 1] + b"\0"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    with native.cm_place(tmp_path_factory.mktemp("cmid"), "rping") as p:
        yield p


def test_pyverbs_rping_client_against_debian_rping_server(where):
    wire, port = 23990, 22990
    server = ["rping", "-s", "-a", where.server.addr, "-p", str(port), "-v", "-C", str(COUNT),
              "-S", str(SIZE)]
    # The pyverbs client reaches the run's daemon on its UNIX socket (SOFTHCA_SOCKET, set
    # by softhca run): the run's TCP port serves wire links only.
    client = ["sh", "-c", 'SOFTHCA_TARGET="unix:$SOFTHCA_SOCKET" exec "$@"', "sh",
              "env", f"PYTHONPATH={pyverbs_path()}",
              sys.executable, str(HERE / "rping_client.py"), where.server.addr, str(port),
              str(COUNT), str(SIZE)]
    srv_argv = where.argv(where.server, server, port=wire)
    proc = native._start(srv_argv, stderr=native.subprocess.STDOUT)
    try:
        native.wait_listening(proc, wire, timeout=30)
        cli = where.run(where.client, client, port=wire, timeout=60)
        out, _ = proc.communicate(timeout=30)
    finally:
        native._reap(proc)
    both = f"--- server:\n{out}\n--- client:\n{cli.output}"
    print(both)         # shown by pytest -rP: the two programs' own words
    assert cli.returncode == 0, both
    sent = [ping_text(n, SIZE)[:-1].decode() for n in range(COUNT)]
    assert re.findall(r"^server ping data: (.*)$", out, re.M) == sent, both
    got = re.findall(r"^ping (\d+) sent (.*) got (.*)$", cli.output, re.M)
    assert [(int(n), s, g) for n, s, g in got] == [(n, t, t) for n, t in enumerate(sent)], both
