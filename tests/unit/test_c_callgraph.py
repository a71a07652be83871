"""The C libraries of provider/ have no circle in their call graph between files.

``provider/callgraph.py`` compiles each library's sources (the Makefile's SRCS, CM_SRCS,
MLX5_SRCS) with gcc's -fcallgraph-info and joins the calls between files; a circle is a
set of files that call one another round. The tool is first judged on small C libraries
written here, whose graph is known by construction, then run on the tree.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "provider" / "callgraph.py"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None,
                                reason="gcc is not installed (provider/callgraph.py compiles)")


def _tool():
    spec = importlib.util.spec_from_file_location("c_callgraph", TOOL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["c_callgraph"] = mod
    spec.loader.exec_module(mod)
    return mod


def _library(tmp_path: Path, files: dict[str, str]) -> list[str]:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return [n for n in files if n.endswith(".c")]


HEADER = "int a1(void); int b1(void); int b2(void); int c1(void);\n#define CALL_C() c1()\n"


def test_a_circle_of_two_files_is_reported(tmp_path):
    cg = _tool()
    srcs = _library(tmp_path, {
        "h.h": HEADER,
        "a.c": '#include "h.h"\nint a1(void) { return b1(); }\n',
        "b.c": '#include "h.h"\nint b1(void) { return 1; }\nint b2(void) { return a1(); }\n',
        "c.c": '#include "h.h"\nint c1(void) { return b1(); }\n',
    })
    g = cg.build(tmp_path, srcs, ["-O0", "-w"])
    assert dict(g.edges["a.c"]) == {"b.c": {("a1", "b1")}}
    assert dict(g.edges["b.c"]) == {"a.c": {("b2", "a1")}}
    assert cg.circles(g) == [["a.c", "b.c"]]


def test_a_chain_is_no_circle_and_a_macro_call_counts(tmp_path):
    cg = _tool()
    srcs = _library(tmp_path, {
        "h.h": HEADER,
        "a.c": '#include "h.h"\nint a1(void) { return b1() + CALL_C(); }\n',
        "b.c": '#include "h.h"\nint b1(void) { return c1(); }\n',
        "c.c": '#include "h.h"\nint c1(void) { return 0; }\n',
    })
    g = cg.build(tmp_path, srcs, ["-O0", "-w"])
    assert set(g.edges["a.c"]) == {"b.c", "c.c"}
    assert set(g.edges["b.c"]) == {"c.c"}
    assert cg.circles(g) == []


def test_statics_of_one_name_in_two_files_are_two_functions(tmp_path):
    """a.c's static helper() and c.c's are not one function: no edge c.c -> a.c."""
    cg = _tool()
    srcs = _library(tmp_path, {
        "h.h": HEADER,
        "a.c": '#include "h.h"\nstatic int helper(void) { return 2; }\n'
               'int a1(void) { return helper() + c1(); }\n',
        "c.c": '#include "h.h"\nstatic int helper(void) { return 3; }\n'
               'int c1(void) { return helper(); }\n',
    })
    g = cg.build(tmp_path, srcs, ["-O0", "-w"])
    assert set(g.edges["a.c"]) == {"c.c"}
    assert "c.c" not in g.edges
    assert cg.circles(g) == []


def test_function_length_skips_braces_in_strings_and_comments(tmp_path):
    cg = _tool()
    text = ('int f(void)\n{\n\tconst char *s = "}}";\n\t/* } */\n\tchar c = \'}\';\n'
            '\treturn s[0] + c;\n}\n')
    (tmp_path / "f.c").write_text(text)
    assert cg.body_length(tmp_path / "f.c", 1) == 7


def test_the_provider_libraries_have_no_circle():
    if not Path("/usr/include/infiniband/verbs.h").exists():
        pytest.skip("libibverbs-dev's headers are not installed (make provider installs them)")
    r = subprocess.run([sys.executable, str(TOOL), "--check", "--longest", "1"],
                       capture_output=True, text=True, timeout=300)
    assert "CIRCLE" not in r.stdout, r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    for lib in ("libsofthca-rdmav34.so:", "librdmacm.so.1:", "libmlx5.so.1:"):
        assert lib in r.stdout
