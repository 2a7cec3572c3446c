"""bench_preflight.py's in-job measurement runs (a smoke test: never pass/fail on speed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_preflight.py"


@pytest.mark.multiproc
def test_sweep_child_measures_preflight_and_the_object_gather():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(BENCH), "--child-sweep", "10", "1"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("SWEEP "))
    data = json.loads(line[len("SWEEP "):])
    (row,) = data["rows"]
    assert row["tensors"] == 10 and row["params"] == 5 * (64 * 64 + 64)
    assert row["preflight_s"] > 0 and row["all_gather_object_s"] > 0 and row["table_bytes"] > 0
    assert data["small_with_local_checks_s"] > 0
