"""`distdoctor stacks --slurm-job JOBID` on the real single-node SLURM test cluster: srun --overlap, one merged report."""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.launchers.slurm_cluster import running_cluster
from tests.stacks.stacks_jobs import child_env, distdoctor, finding, hung_job, ids, line_of, report_of, stacks_once

JOB_NAME = "distdoctor-stacks-test"


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster("distdoctor-slurm-stacks-")


def _job_id(cluster) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-n", JOB_NAME, "-o", "%i"], env=cluster.env(), capture_output=True,
                             text=True, timeout=15).stdout.split()
        if out:
            return out[0]
        time.sleep(0.5)
    raise AssertionError("the job never showed in squeue")


def test_every_node_of_the_job_is_read_and_one_report_names_the_late_rank(cluster, tmp_path):
    env = cluster.env(**child_env())
    srun = ("srun", "-J", JOB_NAME, "-n", "1", "--kill-on-bad-exit=0")
    job_id = None
    try:
        with hung_job(tmp_path, "sleep", 2, argv_prefix=srun, env=env) as job:
            job_id = _job_id(cluster)
            report, code = stacks_once(["--slurm-job", job_id], env=env)
            late = finding(report, "job.E002")
            assert late is not None, (ids(report), report["findings"])
            assert late["ranks"] == [1] and f"train.py:{line_of('time.sleep(3600)')}" in late["title"]
            assert report["data"]["stacks"]["slurm_job"] == job_id
            assert report["data"]["stacks"]["nodes"] == [cluster.host]
            assert "stacks.W003" not in ids(report) and code == 1
            assert job.alive()
    finally:
        if job_id is not None:
            subprocess.run(["scancel", job_id], env=cluster.env(), capture_output=True, timeout=30)


def test_a_job_that_does_not_exist_is_a_finding(cluster):
    env = cluster.env(**child_env())
    result = distdoctor("stacks", "--format", "json", "--slurm-job", "999999", env=env, timeout=180)
    report = report_of(result)
    failed = finding(report, "stacks.E006")
    assert failed is not None and result.returncode == 1, ids(report)
    assert "999999" in failed["title"]
