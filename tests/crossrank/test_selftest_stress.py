"""The self-test with many more ranks than cores: every rank checks in, one report, no foreign-service hint.

The run is pinned to two cores (whatever the machine has), so 4x and 8x more ranks than cores
are 8 and 16 ranks everywhere. Each size runs a few times: the failure this guards against (ranks
alive but never checked in, a report per rank, the self-test's own busy store called a possibly
foreign service) showed up in about one run in ten.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import json_objects

pytestmark = pytest.mark.multiproc
CORES = 2
RUNS = 3
TIMEOUT_S = 60.0
# The deadline counts from the CLI's start; the interpreter's start and the supervisor's exit come around it.
SLACK_S = 2.0 + 5.0


def _pin() -> None:
    cpus = sorted(os.sched_getaffinity(0))[:CORES]
    os.sched_setaffinity(0, cpus)
    os.setsid()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
# extended: [8] (16 ranks on 2 cores) covers this path; [4] is the same run at a smaller size
@pytest.mark.parametrize("factor", [pytest.param(4, marks=pytest.mark.extended), 8])
def test_many_more_ranks_than_cores_all_check_in_and_one_report(factor):
    nproc = factor * CORES
    for run in range(RUNS):
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "check", "--nproc", str(nproc), "--format", "json",
                                 "--timeout", str(TIMEOUT_S)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=_pin, env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S + SLACK_S + 10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=10)
        took = time.monotonic() - started
        label = f"run {run + 1} of {RUNS} with {nproc} ranks on {CORES} cores"
        assert "Traceback" not in err, f"{label}:\n{err[-3000:]}"
        assert took <= TIMEOUT_S + SLACK_S, f"{label} took {took:.1f}s"
        reports = json_objects(out)
        assert len(reports) == 1, f"{label}: {len(reports)} reports"
        (report,) = reports
        assert report["world"]["ranks_missing"] == [], f"{label}: {report['world']}"
        assert report["world"]["ranks_reported"] == list(range(nproc)), f"{label}: {report['world']}"
        ids = {f["id"] for f in report["findings"]}
        assert "net.I015" not in ids and "rdzv.C004" not in ids, f"{label}: {report['findings']}"
