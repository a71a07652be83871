"""Two checkouts on one Docker engine: the images' repository, the compose network's /24
and the compose project are each an environment variable's (SOFTHCA_IMAGE,
SOFTHCA_SUBNET, SOFTHCA_PROJECT; the Makefile's variables of the same names), today's
values the defaults. A second stack with names of its own runs beside the default one:
its own images, network, addresses and containers, and its teardown leaves the other
running."""

from __future__ import annotations

import json

import compose_fixtures
import pytest

import compose as dc

# The compose stack's fixtures (tests/support/compose_fixtures.py), by name.
stack = compose_fixtures.stack

pytestmark = pytest.mark.docker

# Names no default shares: another repository, a /24 of its own, another project.
OTHER = dc.Names(image="softhca-names-test", subnet="10.207.0", project="softhca-names-test")


def test_the_defaults_are_todays():
    d = dc.Names.from_env({})
    assert (d.image, d.subnet, d.project) == ("softhca", "10.200.0", "softhca-twonode")
    assert (d.target_ip, d.initiator_ip) == ("10.200.0.1", "10.200.0.2")
    e = dc.Names.from_env({"SOFTHCA_IMAGE": "a/b", "SOFTHCA_SUBNET": "10.1.2",
                           "SOFTHCA_PROJECT": "p"})
    assert (e.image, e.target_ip, e.project) == ("a/b", "10.1.2.1", "p")


def test_compose_file_takes_the_names(stack):
    """`config` renders docker/compose.yaml with the names in place of today's values."""
    out = dc.compose("config", names=OTHER).stdout
    for want in ("image: softhca-names-test:daemon", "image: softhca-names-test:tests",
                 "ipv4_address: 10.207.0.1", "ipv4_address: 10.207.0.2",
                 "subnet: 10.207.0.0/24", "ip_range: 10.207.0.128/25",
                 "gateway: 10.207.0.254", "SOFTHCA_TARGET: 10.207.0.1:4791"):
        assert want in out, out
    assert "10.200.0" not in out and "softhca:daemon" not in out, out


def _inspect(cid: str) -> dict:
    return json.loads(dc.run(["docker", "inspect", cid], check=True).stdout)[0]


def test_a_second_stack_with_names_of_its_own_runs_beside_the_default(stack):
    default_target = dc.target_running()
    with dc.machine_lock(OTHER):
        for stage in ("daemon", "tests"):
            dc.run(["docker", "tag", f"{dc.NAMES.image}:{stage}", f"{OTHER.image}:{stage}"],
                   check=True)
        dc.compose("down", "-v", "--remove-orphans", check=False, names=OTHER)
        try:
            dc.compose("up", "-d", "target", names=OTHER)
            (other_target,) = dc.container_ids("target", names=OTHER)
            took = dc.wait_healthy([default_target, other_target])
            both = [_inspect(c) for c in (default_target, other_target)]
            nets = [b["NetworkSettings"]["Networks"] for b in both]
            lines = []
            for b, n in zip(both, nets, strict=True):
                (name, net), = n.items()
                lines.append(f"{b['Name'].lstrip('/')} {b['Config']['Image']} {name} "
                             f"{net['IPAddress']}")
            dc.report(f"two stacks on one engine, both healthy ({took:.1f} s): "
                      + "; ".join(lines))
            assert both[0]["Config"]["Image"] == f"{dc.NAMES.image}:daemon"
            assert both[1]["Config"]["Image"] == f"{OTHER.image}:daemon"
            assert list(nets[0]) == [dc.network_name()]
            assert list(nets[1]) == [dc.network_name(OTHER)]
            assert nets[0][dc.network_name()]["IPAddress"] == dc.TARGET_IP
            assert nets[1][dc.network_name(OTHER)]["IPAddress"] == OTHER.target_ip
            # the second's daemon serves on its own address (softhca-node's listen file)
            listen = dc.exec_output(other_target, ["cat", "/run/softhca/listen"]).stdout
            assert listen.strip() == f"{OTHER.target_ip}:4791", listen
        finally:
            dc.compose("down", "-v", "--remove-orphans", check=False, names=OTHER)
            for stage in ("daemon", "tests"):
                dc.run(["docker", "rmi", f"{OTHER.image}:{stage}"])
    # its teardown took nothing of the default stack's
    assert dc.container_ids("target", names=OTHER) == []
    assert dc.run(["docker", "inspect", "-f", "{{.State.Health.Status}}",
                   default_target]).stdout.strip() == "healthy"
