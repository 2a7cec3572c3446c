"""`distdoctor check` under a real srun: one world from SLURM's variables, one report, no recipe."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import child_env
from tests.conftest import json_objects

# The run's own deadline; the subprocess gets this plus srun's start-up and slack.
TIMEOUT_S = 40


def srun(cluster, *args: str, timeout: float = TIMEOUT_S + 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["srun", "--kill-on-bad-exit=0", *args], env=cluster.env(**child_env(**env)),
        capture_output=True, text=True, timeout=timeout,
    )


def check(*extra: str, timeout: float = TIMEOUT_S) -> list[str]:
    return [sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(timeout), *extra]


# A world that cannot form runs into its deadline: these runs get a shorter one (still ample for
# the port probe that names the holder, which runs in the local stage).
HELD_PORT_TIMEOUT_S = 20


def one_report(result: subprocess.CompletedProcess) -> dict:
    """stdout holds exactly one JSON report (rank 0's)."""
    decoder = json.JSONDecoder()
    text = result.stdout.strip()
    report, end = decoder.raw_decode(text)
    assert text[end:].strip() == "", f"more than one report on stdout:\n{text[end:][:2000]}"
    return report


# extended: [4] covers the zero-config srun world; [2] is the same at a smaller size
@pytest.mark.parametrize("ntasks", [pytest.param(2, marks=pytest.mark.extended), 4])
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


def only_task(skip: int, command: list[str]) -> list[str]:
    """A step in which task `skip` never starts distdoctor (it exits at once; the others exec it)."""
    quoted = " ".join(f"'{c}'" for c in command)
    return ["bash", "-c", f'if [ "$SLURM_PROCID" = {skip} ]; then exit 0; fi; exec {quoted}']


def test_srun_task_that_never_starts_is_named_in_one_report(slurm_cluster):
    deadline = 15
    result = srun(slurm_cluster, "-n", "2", *only_task(1, check("--timeout", str(deadline))), timeout=deadline + 60)
    report = one_report(result)
    assert result.returncode != 0
    assert report["world"]["size"] == 2 and report["world"]["ranks_missing"] == [1], report["world"]
    assert any(f["severity"] in ("error", "critical") and 1 in f["ranks"] for f in report["findings"])


def test_srun_rank_0_that_never_starts_leaves_rank_1_reporting_for_itself(slurm_cluster):
    # Rank 1 cannot hand its results to anyone: it prints its own complete report.
    deadline = 12
    result = srun(slurm_cluster, "-n", "2", *only_task(0, check("--timeout", str(deadline))), timeout=deadline + 60)
    assert result.returncode != 0
    report = one_report(result)
    assert report["world"]["ranks_reported"] == [1], report["world"]
    assert "rdzv.C001" in [f["id"] for f in report["findings"]], report["findings"]
    assert [c for c in report["checks"] if c["stage"] == "local"], report["checks"]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]


def test_torchrun_inside_a_multi_task_srun_gives_one_report_naming_the_misuse(slurm_cluster):
    # torch 2.13: each task's single-node torchrun picks its own free port, so two worlds of two
    # form side by side; only the world of SLURM task 0 reports.
    result = srun(slurm_cluster, "-n", "2", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                  *check()[1:])
    report = one_report(result)
    assert result.returncode == 1
    assert report["world"]["size"] == 2 and report["world"]["launcher"] == "torchrun"
    assert "launch.E004" in [f["id"] for f in report["findings"]]
    pointers = [ln for ln in result.stderr.splitlines() if ln.startswith("distdoctor: rank 0 of 2") and "launch.E004" in ln]
    assert len(pointers) == 1, result.stderr[-3000:]


def test_a_port_held_by_a_process_that_never_accepts_is_named_alike_by_every_rank(slurm_cluster):
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen(0)  # never accepts: connects queue up, then time out
    port = holder.getsockname()[1]
    try:
        result = srun(slurm_cluster, "-n", "2", *check("--all-ranks", timeout=HELD_PORT_TIMEOUT_S), MASTER_PORT=str(port))
        reports = json_objects(result.stdout)
        assert len(reports) == 2, result.stderr[-3000:]
        for report in reports:
            held = [f for f in report["findings"] if f["id"] == "net.E013"]
            assert held and f"PID {os.getpid()}" in held[0]["title"], report["findings"]
            assert not any(f["cause"] in ("firewall", "master_unreachable") for f in report["findings"])
        # Without --all-ranks too: neither rank reaches the other, so each reports for itself.
        result = srun(slurm_cluster, "-n", "2", *check(timeout=HELD_PORT_TIMEOUT_S), MASTER_PORT=str(port))
        reports = json_objects(result.stdout)
        assert sorted(r["world"]["ranks_reported"][0] for r in reports) == [0, 1], result.stderr[-3000:]
        for report in reports:
            assert "net.E013" in [f["id"] for f in report["findings"]], report["findings"]
    finally:
        holder.close()


def test_in_a_batch_script_without_srun_the_self_test_runs(slurm_cluster, tmp_path):
    # SLURM_PROCID=0 and SLURM_NTASKS=2 describe the allocation, not processes: no world of 2 to wait for.
    out = tmp_path / "batch.json"
    tmp_path.chmod(0o777)
    command = " ".join([sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", str(TIMEOUT_S)])
    result = subprocess.run(["sbatch", "--wait", "-n", "2", "-o", str(out), "--wrap", command],
                            env=slurm_cluster.env(**child_env()), capture_output=True, text=True, timeout=TIMEOUT_S + 90)
    report = json.loads(out.read_text())
    assert result.returncode == 0, out.read_text()[-3000:] + result.stderr
    assert report["world"]["launcher"] == "mp_spawn" and report["status"] == "ok", report["findings"]
