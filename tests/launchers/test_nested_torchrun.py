"""torchrun inside a multi-task srun or mpirun, named by the local stage from the environment alone.

Each task's torchrun starts --nproc-per-node workers of its own; `distdoctor check --stage local`
names it (launch.E004, cause launcher_misuse) with the fix, before any rendezvous: from the
variables alone (unit cases below), under a real srun, and under a real mpirun.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.launchers.conftest import child_env
from distdoctor.checks import launch
from distdoctor.fakes import fake_context
from tests.conftest import json_objects

TORCHRUN = {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "GROUP_RANK": "0", "ROLE_RANK": "0", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
SRUN_TWO_TASKS_ONE_NODE = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                           "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NNODES": "1",
                           "SLURM_STEP_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "2", "SLURM_STEP_TASKS_PER_NODE": "2"}
MPIRUN_TWO_RANKS_ONE_NODE = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
                             "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}

MISUSED = {
    "srun -n 2 on one node": SRUN_TWO_TASKS_ONE_NODE,
    "srun, only the task count known": {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"},
    "srun task 1 without a step id, only the task count known": {"SLURM_JOB_ID": "7", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
    "mpirun -np 2 on one node": MPIRUN_TWO_RANKS_ONE_NODE,
    "mpirun, only the world size known": {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"},
}
FINE = {
    "srun --nodes 2 --ntasks-per-node 1": {**SRUN_TWO_TASKS_ONE_NODE, "SLURM_PROCID": "1", "SLURM_LOCALID": "0",
                                            "SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURM_STEP_NUM_NODES": "2",
                                            "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_STEP_TASKS_PER_NODE": "1(x2)"},
    "torchrun in a batch script": {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NNODES": "1"},
    "mpirun one rank per node": {**MPIRUN_TWO_RANKS_ONE_NODE, "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                                 "OMPI_COMM_WORLD_LOCAL_SIZE": "1"},
}


def nested(env: dict[str, str]) -> list:
    return [f for f in launch.scheduler_consistency(fake_context(env=env)) or () if f.id == "launch.E004"]


@pytest.mark.parametrize("name", list(MISUSED))
def test_torchrun_inside_a_multi_task_step_is_named_from_the_environment(name):
    (finding,) = nested({**MISUSED[name], **TORCHRUN})
    assert finding.cause == "launcher_misuse"
    if "SLURM_JOB_ID" in MISUSED[name]:
        assert "--ntasks-per-node=1 torchrun" in finding.remediation and "drop torchrun" in finding.remediation
    else:
        assert "--map-by ppr:1:node torchrun" in finding.remediation and "drop torchrun" in finding.remediation
    known = "only" not in name
    assert finding.data["layout_known"] is known
    assert ("spread over nodes" in finding.detail) is not known


@pytest.mark.parametrize("name", list(FINE))
def test_one_torchrun_per_node_or_per_job_is_not_named(name):
    assert nested({**FINE[name], **TORCHRUN}) == []


def test_the_scheduler_starting_the_ranks_itself_is_not_named():
    env = {**SRUN_TWO_TASKS_ONE_NODE, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29500"}
    assert nested(env) == []


def local_stage(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distdoctor", "check", "--stage", "local", "--format", "json"],
                          env=child_env(**env), capture_output=True, text=True, timeout=120)


def test_the_local_stage_names_it_from_the_variables_alone():
    result = local_stage({**MISUSED["srun, only the task count known"], **TORCHRUN})
    (report,) = json_objects(result.stdout)
    assert result.returncode == 1, result.stderr[-2000:]
    (finding,) = [f for f in report["findings"] if f["id"] == "launch.E004"]
    assert finding["cause"] == "launcher_misuse" and "srun --nodes=N --ntasks-per-node=1 torchrun" in finding["remediation"]
    assert {c["stage"] for c in report["checks"]} == {"local"}


# extended: test_srun.py::test_torchrun_inside_a_multi_task_srun_gives_one_report_naming_the_misuse covers a real
# srun running torchrun per task named launch.E004 by the same local check; here only --stage local differs
@pytest.mark.extended
def test_a_real_srun_running_torchrun_per_task_is_named_by_the_local_stage(slurm_cluster):
    result = subprocess.run(
        ["srun", "--kill-on-bad-exit=0", "-n", "2", sys.executable, "-m", "torch.distributed.run",
         "--nproc-per-node", "1", "-m", "distdoctor", "check", "--stage", "local", "--format", "json"],
        env=slurm_cluster.env(**child_env()), capture_output=True, text=True, timeout=180)
    reports = json_objects(result.stdout)
    assert len(reports) == 2, result.stdout[-2000:] + result.stderr[-3000:]
    for report in reports:
        (finding,) = [f for f in report["findings"] if f["id"] == "launch.E004"]
        assert finding["cause"] == "launcher_misuse" and finding["data"]["tasks_per_node"] == 2, finding
        assert "--ntasks-per-node=1 torchrun" in finding["remediation"]


def test_a_real_mpirun_running_torchrun_per_rank_is_named_by_the_local_stage(mpirun):
    # Each rank's report is an error (exit 1): Open MPI would abort the job at the first one and
    # SIGTERM the other before it printed its own (seen under load); srun's --kill-on-bad-exit=0.
    result = subprocess.run(
        [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "orte_abort_on_non_zero_status", "0",
         "-np", "2", sys.executable, "-m", "torch.distributed.run",
         "--standalone", "--nproc-per-node", "1", "-m", "distdoctor", "check", "--stage", "local", "--format", "json"],
        env=child_env(), capture_output=True, text=True, timeout=180)
    reports = json_objects(result.stdout)
    assert len(reports) == 2, result.stdout[-2000:] + result.stderr[-3000:]
    for report in reports:
        (finding,) = [f for f in report["findings"] if f["id"] == "launch.E004"]
        assert finding["data"]["scheduler"] == "openmpi" and finding["data"]["tasks_per_node"] == 2, finding
        assert "--map-by ppr:1:node torchrun" in finding["remediation"]
