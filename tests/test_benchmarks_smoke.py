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


@pytest.mark.timeout(1200)
def test_quick_benchmark_prints_every_figure(tmp_path, startup_s):
    out = tmp_path / "figures.json"
    # About 25 torch imports and a few deadlines: the bound scales with this machine's import time.
    # The soak's quick run adds two 4-rank guarded jobs (30 s and 15 s, each with its start-up).
    bound = min(290 + 48 * startup_s, 1150)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=bound, cwd=tmp_path)
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
    # Every subject exists now: each figure is a measurement, not "not available yet: <why>".
    unmeasured = [f"{f['bench']}/{f['name']}: {f['note']}" for f in data["figures"] if f["median_s"] is None]
    assert not unmeasured, unmeasured
    for bench in ("local", "selftest"):
        figure = by_bench[bench][0]
        assert figure["baseline_median_s"] > 0 and figure["ratio"] > 0, figure
    # Plain torch is bounded: either it failed (a time) or it is reported as "> bound".
    for figure in by_bench["detection"]:
        assert figure["baseline_median_s"] or figure["ratio_text"].startswith("< "), figure
