"""Hugging Face `accelerate launch` in each mode: recognised, no false criticals, one report.

Optional: accelerate is not a dependency (`pip install -e '.[accelerate]'`); the tests skip without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import child_env

pytest.importorskip("accelerate", reason="accelerate not installed (optional: pip install -e '.[accelerate]')")

TIMEOUT_S = 40


def accelerate(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_machines", "1", "--mixed_precision", "no",
               "--dynamo_backend", "no", *args, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(TIMEOUT_S)]
    result = subprocess.run(command, env=child_env(**(env or {})), capture_output=True, text=True, timeout=TIMEOUT_S + 60)
    text = result.stdout.strip()
    report, end = json.JSONDecoder().raw_decode(text)
    assert text[end:].strip() == "", "more than one report"
    return result, report


def ids(report: dict) -> list[str]:
    return [f["id"] for f in report["findings"]]


# extended: [no-multi-gpu] covers launch.E014 under a real accelerate simple mode; --cpu differs only in the
# title's wording (unit case in tests/checks/test_local_checks.py; ACCELERATE_USE_CPU is also read by the mpi mode test)
@pytest.mark.parametrize("mode", [pytest.param(["--cpu"], marks=pytest.mark.extended), []], ids=["cpu", "no-multi-gpu"])
def test_simple_mode_names_the_single_process(mode):
    result, report = accelerate(*mode, "--num_processes", "2")
    assert "launch.E014" in ids(report) and "launch.C001" not in ids(report)
    (finding,) = [f for f in report["findings"] if f["id"] == "launch.E014"]
    assert ("--cpu" in finding["title"]) == bool(mode)
    assert report["world"]["launcher"] == "accelerate_single"


def test_multi_gpu_mode_forms_a_world_through_torchrun():
    result, report = accelerate("--multi_gpu", "--num_processes", "2")
    assert report["world"]["size"] == 2 and report["world"]["launcher"] == "torchrun"
    assert not [f for f in report["findings"] if f["severity"] in ("error", "critical")], report["findings"]


def test_mpi_mode_has_no_false_criticals(tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI not installed (mpirun missing)")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    # accelerate's mpirun line has no --allow-run-as-root; Open MPI reads the same from these.
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"} if os.geteuid() == 0 else {}
    result, report = accelerate("--cpu", "--mpirun_hostfile", str(hostfile), "--num_processes", "2", env=env)
    assert result.returncode == 0, report["findings"]
    assert report["world"]["size"] == 2 and report["world"]["launcher"] == "openmpi"
    assert not [f for f in report["findings"] if f["severity"] in ("error", "critical")]
