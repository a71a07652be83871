"""libfabric's verbs provider, unmodified (Debian's libfabric-bin), on softhca:
fi_pingpong over each endpoint type the provider has on a RoCE device, between two
network namespaces, each side under ``softhca run``:

- ``-e msg`` (``-p verbs``): RC QPs connected through rdma_cm (our librdmacm), which
  libfabric drives with its own event channels (rdma_migrate_id);
- ``-e rdm`` (``-p "verbs;ofi_rxm"``): libfabric's RxM layer over those MSG endpoints;
- ``-e dgram`` (``-p verbs``): UD QPs, addressed by GID.

Each runs ITERS round trips at every size fi_pingpong tries, with ``-c`` (each message's
bytes checked on arrival). The verdict is fi_pingpong's own: exit 0 on both sides and
its table, one row per size with every message sent and acknowledged
(``#sent`` = ``#ack`` = ITERS), printed in the test's output."""

from __future__ import annotations

import re

import native
import pytest

pytestmark = pytest.mark.readme_row("libfabric 1.17, verbs provider")

ITERS = 200
CTRL_PORT = 47592      # fi_pingpong's out-of-band control port
WIRE = 23792           # both daemons' wire port (rdma_cm: one port per fabric)
ROW = re.compile(r"^(\S+)\s+(\d+)\s+=(\d+)\s+\S+\s+([\d.]+)s\s+([\d.]+)\s+([\d.]+)\s+"
                 r"([\d.]+)$", re.M)
HEADER = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec"

CASES = {"msg": ["-p", "verbs", "-e", "msg"],
         "rdm": ["-p", "verbs;ofi_rxm", "-e", "rdm"],
         "dgram": ["-p", "verbs", "-e", "dgram"]}


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    with native.cm_place(tmp_path_factory.mktemp("libfabric"), "fi_pingpong") as p:
        yield p


@pytest.mark.parametrize("ep", list(CASES))
def test_fi_pingpong(where, ep):
    args = ["fi_pingpong", *CASES[ep], "-I", str(ITERS), "-c"]
    srv, cli = where.pair(args, [*args, where.server.addr], CTRL_PORT, timeout=90,
                          wire_port=WIRE)
    both = f"--- server (exit {srv.returncode}):\n{srv.output}\n" \
           f"--- client (exit {cli.returncode}):\n{cli.output}"
    print(f"fi_pingpong {' '.join(CASES[ep])} -I {ITERS} -c\n{both}")
    for name, r in (("server", srv), ("client", cli)):
        assert r.returncode == 0, f"{name} exited {r.returncode}:\n{both}"
        assert HEADER in r.output, f"{name} printed no table:\n{both}"
        rows = ROW.findall(r.output)
        # 64 bytes and up; a datagram endpoint stops at the path MTU's payload.
        assert len(rows) >= 4 and rows[0][0] == "64", f"{name}: {rows}\n{both}"
        for size, sent, acked, _t, _mbs, usec, _rate in rows:
            assert int(sent) == ITERS and int(acked) == ITERS, f"{name} {size}:\n{both}"
            assert float(usec) > 0, f"{name} {size}:\n{both}"
