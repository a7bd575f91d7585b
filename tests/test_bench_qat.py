"""The int8 benchmark (bench/qat_resnet.py, ``make bench``) as a smoke run on a tiny ResNet:
it runs through the qat step's own code (a rename there once broke it unnoticed), prints the
size and latency tables and the layer table, and its last line is the machine-readable one.
Ratios are never asserted (benchmarks measure them, tests do not)."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

LAST = re.compile(
    r"int8_vs_fp32_t1_b1=(?P<t1_b1>\S+) int8_vs_fp32_worst=(?P<worst>\S+) "
    r"latency_hint_b1_fp32_ms=\S+ latency_hint_b1_int8_ms=\S+ "
    r"int8_f32_compute_layers=(?P<f32_layers>\d+)"
)


def test_a_tiny_run_prints_its_tables_and_last_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/qat_resnet.py", "--arch", "resnet18", "--image-size", "32",
         "--batch-sizes", "1", "--threads", "1", "--repeats", "1",
         "--calibration-batches", "1", "--json", str(tmp_path / "bench.json")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    found = LAST.fullmatch(lines[-1])
    assert found, lines[-1]
    assert float(found["worst"]) == float(found["t1_b1"]) > 0  # one cell: it is the worst
    assert any(line.startswith("int8 model: compute layers still in f32:") for line in lines)
    assert "layers by the precision they execute in" in proc.stdout
    assert (tmp_path / "bench.json").is_file()
