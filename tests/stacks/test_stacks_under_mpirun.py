"""`distdoctor stacks` on ranks started by a real Open MPI mpirun: ranks from OMPI_COMM_WORLD_RANK, the odd stack named."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.stacks.stacks_jobs import child_env, distdoctor, end_process, finding, ids, report_of

RANKS = """
import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
def wait_here():
    time.sleep(600)
def late():
    time.sleep(600)
with open(os.path.join(sys.argv[1], f"rank{rank}"), "w") as fh:
    fh.write(str(os.getpid()))
(late if rank == 1 else wait_here)()
"""


@pytest.fixture
def mpirun():
    path = shutil.which("mpirun")
    if path is None:
        pytest.skip("Open MPI not installed (mpirun missing): apt-get install openmpi-bin")
    return path


def test_mpirun_ranks_are_found_from_its_variables_and_grouped(mpirun, tmp_path):
    job = subprocess.Popen([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3", "python", "-c", RANKS,
                            str(tmp_path)], env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 120
        while len(pids) < 3:
            assert job.poll() is None and time.monotonic() < deadline, "mpirun's ranks did not start"
            time.sleep(0.2)
            pids = {int(p.name[4:]): int(p.read_text()) for p in tmp_path.glob("rank*") if p.read_text()}
        report = report_of(distdoctor("stacks", "--format", "json", str(job.pid)))
        (seen,) = report["data"]["stacks"]["jobs"]
        assert seen["job"] == f"launcher pid {job.pid}"
        assert {s["rank"]: s["pid"] for s in seen["snapshots"]} == pids
        groups = finding(report, "stacks.I002")
        assert groups["title"] == "ranks 0, 2 share one stack; rank 1 differs", ids(report)
        assert "late" in groups["detail"] and job.poll() is None
    finally:
        for pid in pids.values():
            end_process(pid, mark=str(tmp_path))
        if job.poll() is None:
            job.kill()
        job.wait(30)
