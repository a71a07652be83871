"""``softhca bench engine``'s table with the native engine: each row beside the same
transform on the Python engine, and which engine ran (tools/bench/output.py)."""

from __future__ import annotations

from softhca.tools.bench.engine import Report, Result
from softhca.tools.bench.output import to_table

MACHINE = {"python": "3.11.7", "implementation": "CPython", "cpu_count": 2, "platform": "x",
           "guard_backends": {"t10dif_crc": "fastcrc"}}


def test_native_rows_show_the_python_engine_beside_them():
    rows = [Result("T10-DIF generate, 512B blocks", 6000.0, "fastcrc", 10000.0, 0.6, 500.0, 12.0)]
    text = to_table(Report(4, 5, 4 << 20, {**MACHINE, "engine_backend": "native",
                                           "native_xts": "vaes"}, rows))
    assert "engine: native (softhca.accel._native, XTS vaes)" in text
    head = next(line for line in text.splitlines() if line.startswith("name"))
    assert head.split()[-3:] == ["python", "MB/s", "native/python"]
    row = next(line for line in text.splitlines() if line.startswith("T10-DIF"))
    assert row.split()[-2:] == ["500.0", "12"]


def test_python_rows_say_why():
    rows = [Result("T10-DIF generate, 512B blocks", 500.0, "fastcrc", 10000.0, 0.05)]
    text = to_table(Report(4, 5, 4 << 20, {**MACHINE, "engine_backend": "python",
                                           "python_because": "SOFTHCA_ENGINE=python"}, rows))
    assert "engine: python (SOFTHCA_ENGINE=python)" in text
    assert "native/python" not in text
