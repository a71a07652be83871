"""ibv_query_device_ex's extended fields and ibv_create_qp_ex's create_flags through the
provider (provider/tests/attrcheck.c): device_cap_flags and device_cap_flags_ex as
tests/support/device_expect.py writes them down (the same set softhca's pyverbs is held
to, tests/e2e/test_device_attr.py), and odp_caps; a caller's shorter struct is not written past; a UD
QP takes IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, as an mlx5 device does, and SCATTER_FCS is
EOPNOTSUPP."""

from __future__ import annotations

import re

import device_expect
import native
import pytest

ATTRCHECK = native.REPO / "provider" / "build" / "attrcheck"


@pytest.fixture(scope="module")
def where(tmp_path_factory):
    why = native.unavailable()
    if why:
        pytest.skip(why)
    with native.place(tmp_path_factory.mktemp("devattr")) as p:
        yield p


def test_extended_attributes_and_create_flags(where):
    r = where.run(where.server, [str(ATTRCHECK)], timeout=60)
    assert r.returncode == 0 and "FAIL" not in r.output, r.output

    def value(name: str) -> int:
        m = re.search(rf"^attrcheck: {name} (0x[0-9a-f]+|\d+)$", r.output, re.M)
        assert m, (name, r.output)
        return int(m.group(1), 0)

    assert value("device_cap_flags") == device_expect.FLAGS
    assert value("device_cap_flags_ex") == device_expect.FLAGS_EX
    assert value("phys_port_cnt_ex") == device_expect.ATTRS["phys_port_cnt"]
    # on-demand paging as the daemon models it, filled in by the provider (zero before)
    assert value("odp general_caps") == device_expect.ODP_GENERAL_CAPS
    assert value("odp rc_odp_caps") == device_expect.ODP_RC_CAPS
    assert value("odp uc_odp_caps") == 0 and value("odp ud_odp_caps") == 0
    for line in ("RC QP with create_flags 0: created",
                 "UD QP with BLOCK_SELF_MCAST_LB: created",
                 "UD QP with SCATTER_FCS refused: Operation not supported"):
        assert f"attrcheck: ok: {line}" in r.output, r.output
