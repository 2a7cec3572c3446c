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


# The benchmarks whose quick run launches real jobs for 20-100 s each (the guard's long jobs, the
# simulated thousands of ranks, torchrun sweeps): their smoke runs are in the `extended` set (python -m
# pytest -m extended), apart from the suite, whose wall time is the CI's; the product code they drive
# is tested by the suite itself, and the light ones here keep the harness (run.py, --json) tested.
HEAVY = ("selftest", "detection", "preflight", "guard", "collectives", "scale", "pace", "soak")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("bench", [pytest.param(name, marks=pytest.mark.extended) if name in HEAVY else name
                                   for name in BENCHMARKS])
def test_quick_benchmark_prints_every_figure(tmp_path, startup_s, bench):
    """One benchmark's quick run (one test each, so that the suite's workers share them)."""
    out = tmp_path / "figures.json"
    # A few torch imports and deadlines: the bound scales with this machine's import time (the soak's
    # quick run, the longest, starts two 4-rank guarded jobs of 30 s and 15 s).
    bound = min(290 + 48 * startup_s, 1150)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--only", bench,
                           "--json", str(out)], capture_output=True, text=True, timeout=bound, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("machine: "), proc.stdout[:500]
    assert any(line.startswith(bench + " ") for line in proc.stdout.splitlines()), f"no line for {bench}:\n{proc.stdout}"
    data = json.loads(out.read_text())
    assert data["machine"]["cores"] and data["machine"]["torch"]
    figures = [figure for figure in data["figures"] if figure["bench"] == bench]
    assert figures and len(figures) == len(data["figures"]), data["figures"]
    # Every subject exists now: each figure is a measurement, not "not available yet: <why>".
    unmeasured = [f"{f['bench']}/{f['name']}: {f['note']}" for f in figures if f["median_s"] is None]
    assert not unmeasured, unmeasured
    if bench in ("local", "selftest"):
        assert figures[0]["baseline_median_s"] > 0 and figures[0]["ratio"] > 0, figures[0]
    if bench == "detection":
        # Plain torch is bounded: either it failed (a time) or it is reported as "> bound".
        for figure in figures:
            assert figure["baseline_median_s"] or figure["ratio_text"].startswith("< "), figure
