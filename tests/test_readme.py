"""The README's client example runs as printed (it is what a new user copies first)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


async def test_readme_client_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "sh.embedded()" in b)
    code = "async def _example():\n" + textwrap.indent(example, "    ")
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README
    await namespace["_example"]()
    out = capsys.readouterr().out
    assert "status=IBV_WC_SUCCESS" in out and "opcode=IBV_WC_RDMA_WRITE" in out
