"""Collection for the two-node tests: the ``twonode`` marker, the skip without a
target, one run per target address, the addresses in pytest's header."""

from __future__ import annotations

from pathlib import Path

import pytest

from twonode import remote

HERE = Path(__file__).resolve().parent


def pytest_report_header(config):
    if not remote.configured():
        return [f"softhca two-node: skipped, {remote.SKIP_REASON}"]
    lines = []
    for target in remote.targets():
        try:
            local = remote.initiator_address(target)
        except Exception as e:  # noqa: BLE001 - a header line, the tests report it properly
            local = f"? ({e})"
        lines.append(f"softhca two-node: target {target}, initiator {local} (this host)")
    return lines


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason=remote.SKIP_REASON)
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.twonode)
            if not remote.configured():
                item.add_marker(skip)


def pytest_generate_tests(metafunc):
    if "twonode_target" in metafunc.fixturenames:
        found = remote.targets() or [None]
        metafunc.parametrize("twonode_target", found, ids=[t or "no-target" for t in found])


@pytest.fixture
async def remote_pair(twonode_target):
    """A target side on the remote daemon, an initiator side here, their QPs connected."""
    async with remote.remote_two_nodes(twonode_target) as pair:
        yield pair
