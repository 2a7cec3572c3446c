"""`distdoctor check` under a real srun: one world from SLURM's variables, one report, no recipe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import child_env

# The run's own deadline; the subprocess gets this plus srun's start-up and slack.
TIMEOUT_S = 40


def srun(cluster, *args: str, timeout: float = TIMEOUT_S + 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["srun", "--kill-on-bad-exit=0", *args], env=cluster.env(**child_env(**env)),
        capture_output=True, text=True, timeout=timeout,
    )


def check(*extra: str) -> list[str]:
    return [sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(TIMEOUT_S), *extra]


def one_report(result: subprocess.CompletedProcess) -> dict:
    """stdout holds exactly one JSON report (rank 0's)."""
    decoder = json.JSONDecoder()
    text = result.stdout.strip()
    report, end = decoder.raw_decode(text)
    assert text[end:].strip() == "", f"more than one report on stdout:\n{text[end:][:2000]}"
    return report


@pytest.mark.parametrize("ntasks", [2, 4])
def test_zero_config_srun_forms_one_world_with_one_report(slurm_cluster, ntasks):
    result = srun(slurm_cluster, "-n", str(ntasks), *check())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = one_report(result)
    assert report["world"]["size"] == ntasks and report["world"]["launcher"] == "slurm"
    assert report["world"]["ranks_missing"] == []
    ids = [f["id"] for f in report["findings"]]
    assert "launch.C001" not in ids
    (derived,) = [f for f in report["findings"] if f["id"] == "launch.I011"]
    assert derived["data"]["derived"]["RANK"].startswith("SLURM_PROCID=")
    assert derived["data"]["derived"]["MASTER_ADDR"].startswith("first host of SLURM_STEP_NODELIST=")
    assert derived["data"]["master_port"] == 15000 + int(derived["data"]["derived"]["MASTER_PORT"].rsplit("=", 1)[1][-4:])
    collective = [c for c in report["checks"] if c["stage"] == "collective" and c["status"] == "pass"]
    assert collective and all(sorted(c["ranks"]) == list(range(ntasks)) for c in collective)
