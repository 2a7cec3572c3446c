"""The benchmark command runs and prints a line for every figure (not a timing test: the
benchmarks are never pass/fail on speed; see benchmarks/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

from run import BENCHMARKS  # noqa: E402


@pytest.mark.timeout(240)
def test_quick_benchmark_prints_every_figure(tmp_path):
    out = tmp_path / "figures.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=230, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("machine: "), proc.stdout[:500]
    lines = proc.stdout.splitlines()
    for bench in BENCHMARKS:
        assert any(line.startswith(bench + " ") for line in lines), f"no line for {bench}:\n{proc.stdout}"
    data = json.loads(out.read_text())
    assert data["machine"]["cores"] and data["machine"]["torch"]
    by_bench: dict[str, list] = {}
    for figure in data["figures"]:
        by_bench.setdefault(figure["bench"], []).append(figure)
    assert set(by_bench) == set(BENCHMARKS)
    # The local stage exists from the start: its figure is a measurement, with its baseline.
    local = by_bench["local"][0]
    assert local["median_s"] > 0 and local["baseline_median_s"] > 0 and local["ratio"] > 0, local
