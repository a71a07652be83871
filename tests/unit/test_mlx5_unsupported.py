"""provider/mlx5/unsupported.c is what provider/mlx5/gen_unsupported.py writes.

The generator takes the names of libmlx5.map that mlx5.c does not define, and each
one's prototype from Debian's mlx5dv.h (through gcc -E). Judged here: the file in the
tree is current; every exported name is defined once, by mlx5.c or by the file; the
body each return type gets (the man pages' failure values).
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MLX5 = ROOT / "provider" / "mlx5"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_unsupported", MLX5 / "gen_unsupported.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_unsupported"] = mod
    spec.loader.exec_module(mod)
    return mod


def _need_header():
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (the generator preprocesses mlx5dv.h)")
    if not Path("/usr/include/infiniband/mlx5dv.h").exists():
        pytest.skip("libibverbs-dev's mlx5dv.h is not installed (make provider installs it)")


def test_unsupported_c_is_current():
    _need_header()
    assert (MLX5 / "unsupported.c").read_text() == _gen().generate(), \
        "provider/mlx5/unsupported.c is stale: run python3 provider/mlx5/gen_unsupported.py"


def test_every_exported_name_is_defined_once():
    gen = _gen()
    names = gen.exported((MLX5 / "libmlx5.map").read_text())
    mlx5_c = (MLX5 / "mlx5.c").read_text()
    stubs = re.findall(r"^(\w+)\(", (MLX5 / "unsupported.c").read_text(), re.M)
    modelled = gen.defined_in(mlx5_c, names)
    assert len(stubs) == len(set(stubs))
    assert not modelled & set(stubs)
    assert set(names) == modelled | set(stubs)
    # a few the man pages name, on each side
    assert {"mlx5dv_create_qp", "mlx5dv_init_obj", "mlx5dv_dek_create"} <= modelled
    assert {"mlx5dv_devx_obj_create", "mlx5dv_dr_domain_create"} <= set(stubs)


def test_map_parsing_takes_each_global_name_once():
    text = ("/* a; */\nV1 {\n\tglobal:\n\t\ta;\n\t\tb;\n\tlocal: *;\n};\n"
            "V2 {\n\tglobal:\n\t\ta;\n\t\tc;\n} V1;\n")
    assert _gen().exported(text) == ["a", "b", "c"]


@pytest.mark.parametrize("ret,body", [
    ("struct mlx5dv_devx_obj *", 'return shca_dv_unsupported_ptr("f");'),
    ("int", 'return shca_dv_unsupported("f");'),
    ("void", 'shca_dv_unsupported("f");\n}'),
])
def test_a_stub_fails_as_its_return_type_says(ret, body):
    assert body in _gen().stub("f", ret, "void")


def test_the_calls_that_fail_with_minus_one():
    gen = _gen()
    for name in ("mlx5dv_devx_get_event", "mlx5dv_vfio_get_events_fd"):
        assert "\treturn -1;\n" in gen.stub(name, "int", "void")


def test_a_return_type_without_a_rule_is_an_error():
    with pytest.raises(SystemExit, match="no rule"):
        _gen().stub("f", "uint64_t", "void")


def test_prototypes_come_after_the_preprocessor():
    """mlx5_api.h renames mlx5dv_devx_async_event_hdr by a macro: the stub has the
    type the compiler sees, so that it matches the declaration."""
    _need_header()
    gen = _gen()
    ret, params = gen.prototype(gen.preprocessed_header(), "mlx5dv_devx_get_event")
    assert ret == "ssize_t"
    assert "struct mlx5_ib_uapi_devx_async_event_hdr *event_data" in params
