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

# Round trips per size: 100 over at least four sizes on one endpoint is past the verbs
# provider's 384-deep queues (FI_VERBS_TX_SIZE, FI_VERBS_RX_SIZE), so each run wraps them.
ITERS = 100
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



def _refused_probes(limit: int) -> list[int]:
    """The values libfabric's probe (vrb_find_max_inline) tries that a device taking
    up to ``limit`` bytes refuses: doubling from 2 up to the first refused, then
    halving the interval between the largest taken and the smallest refused until they
    are 2 apart."""
    v = 2
    while v <= limit:
        v *= 2
    refused, pos, neg = [v], v // 2, v
    while neg - pos > 2:
        mid = (pos + neg) // 2
        if mid <= limit:
            pos = mid
        else:
            refused.append(mid)
            neg = mid
    return refused


def test_the_inline_probe_is_quiet_and_finds_the_limit(where):
    """libfabric's verbs provider finds a QP's largest max_inline_data by trial
    (vrb_find_max_inline: ibv_create_qp with ever larger values until one fails, then
    a bisection): each value past the device's is EINVAL, as on mlx5 and rxe, and, as
    there, not a line on stderr unless asked (SOFTHCA_DEBUG). Asked, the values refused
    are exactly those the probe refuses on a device that takes up to 1024 bytes, the
    most docs/native.md says a QP takes."""
    args = ["fi_info", "-p", "verbs", "-t", "FI_EP_MSG", "-v"]
    quiet = where.run(where.client, args, timeout=60)
    loud = where.run(where.client, ["env", "SOFTHCA_DEBUG=1", *args], timeout=60)
    print(f"--- fi_info:\n{quiet.output}\n--- with SOFTHCA_DEBUG=1:\n{loud.output}")
    for r in (quiet, loud):
        assert r.returncode == 0 and "prov_name: verbs" in r.output, r.output
    assert "max_inline_data" not in quiet.output, quiet.output
    probes = [int(v) for v in re.findall(
        r"^softhca: ibv_create_qp: EINVAL: max_inline_data (\d+) exceeds", loud.output, re.M)]
    want = _refused_probes(1024)
    # one probe per endpoint kind fi_info lists, each refused the same values
    assert probes and len(probes) % len(want) == 0, loud.output
    assert sorted(probes) == sorted(want * (len(probes) // len(want))), loud.output
