"""The two-node topology of docker/compose.yaml, built from network namespaces.

``softhca serve`` runs in one namespace at 10.200.0.1, the two-node tests
(tests/twonode) run in another at 10.200.0.2 against it, over a veth pair: what
``docker compose up --exit-code-from initiator`` runs, without a Docker engine.
The run's output is printed into pytest's capture, so that it shows with a failing
test's report and a passing run reads as passing (the deliberately broken run's
"failed" lines never appear beside green dots). Root and a working ``ip netns`` are needed; otherwise these skip, saying why.
"""

from __future__ import annotations

import re
import textwrap

import netns
import pytest

pytestmark = pytest.mark.twonode

BROKEN_TARGET = "10.200.0.99:4791"     # on the veth's subnet, but nobody is there
BROKEN_BOUND_S = 30.0
CONNECTION_ERROR = re.compile(r"cannot connect|ETIMEDOUT|ECONNRESET|ECONNREFUSED|no answer")


@pytest.fixture(scope="module")
def netns_available():
    reason = netns.unavailable()
    if reason:
        pytest.skip(reason)


def echo(title: str, text: str) -> None:
    """Into pytest's capture: pytest shows it under the test's failure, and only then."""
    print(f"\n===== {title} =====")
    print(textwrap.indent(text.rstrip(), "  "))
    print(f"===== end of {title} =====")


def daemon_log(topo: netns.Topology) -> str:
    return topo.daemon_log.read_text() if topo.daemon_log and topo.daemon_log.exists() else ""


def first_of(log: str, *events: str) -> list[str]:
    """The first line of each event, in the log's order."""
    seen: set[str] = set()
    out = []
    for line in log.splitlines():
        m = re.search(r"event=(\w+)", line)
        if m and m.group(1) in events and m.group(1) not in seen:
            seen.add(m.group(1))
            out.append(line)
    return out


def test_twonode_examples_across_namespaces(netns_available, tmp_path):
    """The man page examples pass between a daemon at 10.200.0.1 and an initiator at
    10.200.0.2; afterwards nothing of the topology remains."""
    with netns.two_node_topology(tmp_path) as topo:
        echo("two-node topology (network namespaces)", topo.describe())
        run = topo.run_twonode()
        echo(f"two-node tests in {topo.initiator_ns} ({topo.initiator_addr}) -> "
                     f"{topo.target}, exit {run.returncode}, {run.seconds:.1f} s", run.output)
    log = daemon_log(topo)
    echo(f"softhca serve log in {topo.target_ns} ({topo.target_addr})",
         "\n".join(first_of(log, "listen", "session_open", "wire_in", "wire_out", "stopped")))
    assert run.returncode == 0, run.output
    assert f"target {topo.target}, initiator {topo.initiator_addr}" in run.output, run.output
    passed = re.search(r"(\d+) passed", run.output)
    assert passed and int(passed.group(1)) >= 23, run.output
    assert not re.search(r"\d+ (failed|error)", run.output), run.output
    # The daemon saw the initiator's control sessions and wire links come from 10.200.0.2.
    assert f"event=listen address={topo.target}" in log, log
    assert f"event=session_open peer={topo.initiator_addr}:" in log, log
    assert f"event=wire_in peer={topo.initiator_addr}:" in log, log
    assert topo.leftovers() == []


def test_twonode_broken_target_fails_fast_with_a_connection_error(netns_available, tmp_path):
    """SOFTHCA_TARGET pointing where no daemon listens: the two-node run fails (not
    hangs) within the bound, every test saying it cannot connect."""
    with netns.two_node_topology(tmp_path) as topo:
        run = topo.run_twonode(BROKEN_TARGET, timeout=2 * BROKEN_BOUND_S)
    lines = run.output.rstrip().splitlines()
    errors = [line for line in lines if BROKEN_TARGET in line and CONNECTION_ERROR.search(line)]
    header = [line for line in lines if line.startswith("softhca two-node:")]
    echo(f"two-node tests in {topo.initiator_ns} ({topo.initiator_addr}) -> "
                 f"{BROKEN_TARGET} (deliberately wrong), exit {run.returncode}, "
                 f"{run.seconds:.1f} s", "\n".join(header + errors[:1] + ["..."] + lines[-1:]))
    assert run.returncode == 1, run.output
    assert run.seconds < BROKEN_BOUND_S, run.output
    assert "passed" not in lines[-1], run.output
    assert errors, run.output
    assert topo.leftovers() == []


def test_netns_topology_is_torn_down_when_the_body_fails(netns_available, tmp_path):
    """A failure inside the topology still removes both namespaces, the veth pair and
    the daemon; a test of its own checks that nothing is left."""
    with pytest.raises(RuntimeError, match="a failing test"):
        with netns.two_node_topology(tmp_path) as topo:
            assert {topo.target_ns, topo.initiator_ns} <= netns.namespaces()
            assert topo.daemon is not None and topo.daemon.poll() is None
            raise RuntimeError("a failing test")
    left = topo.leftovers()
    echo("after teardown", f"namespaces {topo.target_ns}, {topo.initiator_ns}; veth "
         f"{topo.target_veth}, {topo.initiator_veth}; processes {sorted(topo.pids)}: "
         f"{'left: ' + ', '.join(left) if left else 'none left'}")
    assert left == []
    assert topo.daemon.returncode is not None
    assert not {topo.target_ns, topo.initiator_ns} & netns.namespaces()


def test_netns_topology_is_the_compose_topology():
    """The namespaces use compose.yaml's subnet, addresses and port, and the images
    serve and expect that port: CI proves the topology the compose file describes."""
    # compose.yaml's addresses as Compose renders them with SOFTHCA_SUBNET unset (its
    # default; tests/containers/test_compose_names.py runs another)
    compose = re.sub(r"\$\{SOFTHCA_SUBNET:-([0-9.]+)\}", r"\1",
                     (netns.REPO / "docker" / "compose.yaml").read_text())
    dockerfile = (netns.REPO / "docker" / "Dockerfile").read_text()
    node = (netns.REPO / "docker" / "softhca-node").read_text()
    assert f"subnet: 10.200.0.0/{netns.PREFIX_LEN}" in compose
    assert re.search(rf"target:\n(?:    .*\n|\n)*?        ipv4_address: "
                     rf"{re.escape(netns.TARGET_ADDR)}\n", compose)
    assert re.search(rf"initiator:\n(?:    .*\n|\n)*?        ipv4_address: "
                     rf"{re.escape(netns.INITIATOR_ADDR)}\n", compose)
    assert f"SOFTHCA_TARGET: ${{SOFTHCA_TARGET:-{netns.TARGET_ADDR}:{netns.PORT}}}" in compose
    # The daemons listen where softhca-node puts them: the container's address, this port.
    assert "--listen" not in compose
    assert 'ENTRYPOINT ["softhca-node"]' in dockerfile
    assert f"):{netns.PORT}}}" in node
    assert f"EXPOSE {netns.PORT}" in dockerfile
    assert re.search(r"^USER \d+:\d+$", dockerfile, re.M), "a non-root numeric user"
