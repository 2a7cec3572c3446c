"""`distdoctor check` under a real Open MPI mpirun: one world from OMPI_COMM_WORLD_*, one report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import child_env

TIMEOUT_S = 40


def mpirun_check(mpirun: str, *options: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # Open MPI refuses to run as root and to place 2 ranks on fewer slots without these flags.
    command = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", *options,
               sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(TIMEOUT_S)]
    return subprocess.run(command, env=child_env(**(env or {})), capture_output=True, text=True, timeout=TIMEOUT_S + 60)


def one_report(result: subprocess.CompletedProcess) -> dict:
    text = result.stdout.strip()
    report, end = json.JSONDecoder().raw_decode(text)
    assert text[end:].strip() == "", f"more than one report on stdout:\n{text[end:][:2000]}"
    return report


def ids(report: dict) -> list[str]:
    return [f["id"] for f in report["findings"]]


def test_zero_config_mpirun_with_default_binding(mpirun):
    # Open MPI binds rank 0 to core 0 and rank 1 to core 1 (np <= 2): each rank has its own CPU.
    result = mpirun_check(mpirun)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = one_report(result)
    assert report["world"] == {**report["world"], "size": 2, "launcher": "openmpi", "ranks_missing": []}
    assert "system.W009" not in ids(report) and "launch.C001" not in ids(report)
    (derived,) = [f for f in report["findings"] if f["id"] == "launch.I011"]
    assert derived["data"]["master_addr"] == "127.0.0.1"
    assert derived["data"]["derived"]["MASTER_PORT"].startswith("15000 + last 4 digits of OMPI_MCA_ess_base_jobid=")


def test_zero_config_mpirun_bind_to_none_with_one_thread_each(mpirun):
    result = mpirun_check(mpirun, "--bind-to", "none", "-x", "OMP_NUM_THREADS=1")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = one_report(result)
    assert report["world"]["size"] == 2 and "system.W009" not in ids(report)


def test_mpirun_bind_to_none_with_default_threads_is_real_oversubscription(mpirun):
    # Unbound, each rank's torch runs one thread per CPU of the shared set: a true system.W009
    # (a warning, so the exit code stays 0), unlike the default binding above.
    result = mpirun_check(mpirun, "--bind-to", "none")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = one_report(result)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to oversubscribe against")
    (w009,) = [f for f in report["findings"] if f["id"] == "system.W009"]
    assert w009["data"]["bound"] is False and w009["ranks"] == [0, 1]

