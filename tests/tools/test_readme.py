"""The README's client example runs as printed (it is what a new user copies first):
saved to a file and run with this Python, as a user would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_client_example_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next(b for b in blocks if "sh.embedded()" in b)
    script = tmp_path / "readme_example.py"
    script.write_text(example)
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "status=IBV_WC_SUCCESS" in out and "opcode=IBV_WC_RDMA_WRITE" in out
