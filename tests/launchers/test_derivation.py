"""The world each launcher's own variables describe (machine.launch_world), SLURM host lists, and
values from the environment that must become findings, never tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import child_env
from distdoctor.checks import launch as launch_checks
from distdoctor.checks import system
from distdoctor.fakes import FakeProbes, fake_context
from distdoctor.machine.cpus import CpuBudget, parse_cpu_list
from distdoctor.machine.hostlist import HostlistError, expand_hostlist, expand_task_counts
from distdoctor.machine.launch_world import port_from_job_id
from distdoctor.machine.launchers import detect
from tests.conftest import free_port

# -- host lists ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07],gpu-a1", ["node01", "node02", "node03", "node04", "node07", "gpu-a1"]),
    ("vm", ["vm"]),
    ("a[8-10]", ["a8", "a9", "a10"]),
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
    ("x[009-011] y", ["x009", "x010", "x011", "y"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["", "node[1-", "node]1[", "node[3-1]", "node[a-b]", "n[1-99999999]", "n[[1]]"])
def test_bad_hostlists_raise_hostlist_error(text):
    with pytest.raises(HostlistError):
        expand_hostlist(text)


def test_expand_hostlist_agrees_with_scontrol(slurm_cluster):
    text = "node[01-04,07],gpu-a1,rack[1-2]-n[08-10]"
    result = subprocess.run(["scontrol", "show", "hostnames", text], env=slurm_cluster.env(),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert expand_hostlist(text) == result.stdout.split()


def test_task_counts():
    assert expand_task_counts("4(x2),3") == [4, 4, 3]
    with pytest.raises(HostlistError):
        expand_task_counts("4(x2")


# -- derived worlds -----------------------------------------------------------------------------

SLURM_STEP = {"SLURM_JOB_ID": "1234567", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8",
              "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2),4",
              "SLURM_STEP_NODELIST": "gpu[07-09]", "SLURM_STEP_NUM_NODES": "3"}


def world(env):
    info = detect(env)
    return (info.launcher, info.rank.value, info.world_size.value, info.local_rank.value,
            info.local_world_size.value, info.master_addr, info.master_port.value)


def test_slurm_step():
    assert world(SLURM_STEP) == ("slurm", 5, 8, 1, 4, "gpu07", 15000 + 4567)
    assert dict(detect(SLURM_STEP).derived)["MASTER_ADDR"] == "first host of SLURM_STEP_NODELIST=gpu[07-09]"


def test_explicit_variables_win_over_derived_ones():
    env = {**SLURM_STEP, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29511"}
    assert world(env)[5:] == ("10.0.0.5", 29511)
    assert "MASTER_ADDR" not in dict(detect(env).derived)


def test_slurm_batch_script_is_no_world():
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]"}
    info = detect(env)
    assert info.launcher == "none" and info.world_size.value is None


def test_open_mpi_single_and_multi_node():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "349241345"}
    assert world(env) == ("openmpi", 1, 2, 1, 2, "127.0.0.1", 15000 + 1345)
    multi = detect({**env, "OMPI_COMM_WORLD_SIZE": "4"})
    assert multi.master_addr is None and "do not say which host runs rank 0" in multi.endpoint_problem
    (finding,) = launch_checks.derived_world(fake_context({**env, "OMPI_COMM_WORLD_SIZE": "4"}))
    assert finding.id == "launch.C012" and "MASTER_ADDR" in finding.remediation


def test_mpich_pmi_pmix_lsf_kubeflow():
    mpich = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
    assert world(mpich) == ("mpich", 0, 2, 0, 2, "127.0.0.1", 29500)
    pmix = {"PMIX_RANK": "3", "PMIX_NAMESPACE": "slurm.pmix.77.0"}
    assert detect(pmix).rank.value == 3 and detect(pmix).world_size.value is None
    lsf = {"LSB_JOBID": "4242", "JSM_NAMESPACE_RANK": "1", "JSM_NAMESPACE_SIZE": "2",
           "JSM_NAMESPACE_LOCAL_RANK": "1", "JSM_NAMESPACE_LOCAL_SIZE": "2"}
    assert world(lsf) == ("lsf", 1, 2, 1, 2, "127.0.0.1", 15000 + 4242)
    kubeflow = {"PET_NNODES": "4", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "job-master-0",
                "PET_MASTER_PORT": "23456", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert world(kubeflow) == ("kubeflow", 2, 4, 0, 1, "job-master-0", 23456)
    # Several ranks per pod: torchrun must start them (it reads PET_* itself); nothing derived.
    assert detect({**kubeflow, "PET_NPROC_PER_NODE": "8"}).rank.value is None


def test_port_from_job_id_is_documented_rule():
    assert port_from_job_id("1234567") == 19567 and port_from_job_id("7") == 15007
    assert 15000 <= port_from_job_id("slurm.pmix.77.0") < 25000


def test_torchrun_variables_are_never_overridden():
    env = {**SLURM_STEP, "TORCHELASTIC_RUN_ID": "x", "RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3",
           "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "gpu07", "MASTER_PORT": "29500"}
    info = detect(env)
    assert info.launcher == "torchrun" and info.derived == () and info.rank.value == 3


# -- bad input: findings, never tracebacks ----------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("WORLD_SIZE", "99999999999999999999999"), ("RANK", "²"), ("NODE_RANK", "²"), ("SLURM_PROCID", "9" * 5000),
    ("SLURM_STEP_TASKS_PER_NODE", "2(x99999999999)"), ("SLURM_STEP_NODELIST", "n[1-"), ("OMP_NUM_THREADS", "²"),
])
def test_bad_values_never_raise(name, value):
    env = {**SLURM_STEP, name: value}
    info = detect(env)
    ctx = fake_context(env)
    for check in (launch_checks.rendezvous_env, launch_checks.derived_world, system.cpu_and_memory):
        list(check(ctx) or ())
    assert info.launcher == "slurm"


@pytest.mark.parametrize("extra, variable", [
    # extended: [extra1-WORLD_SIZE] covers launch.C002 through the same real check run; NODE_RANK is one more
    # bad value of that kind (a unit case in test_bad_values_never_raise)
    pytest.param({"NODE_RANK": "²"}, "NODE_RANK", marks=pytest.mark.extended),
    ({"WORLD_SIZE": "99999999999999999999999"}, "WORLD_SIZE"),
])
def test_bad_world_by_hand_is_a_finding_not_a_traceback(extra, variable):
    world = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    env = child_env(**{**world, **extra})
    result = subprocess.run([sys.executable, "-m", "distdoctor", "check", "--format", "json", "--timeout", "30"],
                            env=env, capture_output=True, text=True, timeout=90)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    report = json.loads(result.stdout)
    invalid = [f for f in report["findings"] if f["id"] == "launch.C002" and f["data"]["variable"] == variable]
    assert result.returncode == 1 and invalid, report["findings"]


# -- CPU sets ------------------------------------------------------------------------------------

def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == 7


def w009(env, budget):
    ctx = fake_context(env, probes=FakeProbes(cpus=budget.affinity, cpu_set=budget))
    return [f for f in system.cpu_and_memory(ctx) if f.id == "system.W009"]


def test_bound_ranks_with_their_own_cpus_are_not_oversubscribed():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert w009(env, CpuBudget(affinity=1, shared=2)) == []
    (finding,) = w009({**env, "OMP_NUM_THREADS": "4"}, CpuBudget(affinity=1, shared=2))
    assert finding.data["bound"] is True and "this rank's own CPU set" in finding.title


def test_unbound_ranks_share_the_cpus_and_the_quota_counts():
    env = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    (finding,) = w009(env, CpuBudget(affinity=2, shared=2))
    assert finding.data["cores"] == 2 and finding.data["threads"] == 2
    assert w009({**env, "OMP_NUM_THREADS": "4"}, CpuBudget(affinity=16, shared=16)) == []
    (quota,) = w009({**env, "OMP_NUM_THREADS": "2"}, CpuBudget(affinity=16, shared=16, quota=2.0))
    assert quota.data["cores"] == 2 and "quota" in quota.title


def test_real_cpu_budget_reads_this_process():
    from distdoctor.machine.cpus import cpu_budget

    budget = cpu_budget()
    assert budget.affinity == len(os.sched_getaffinity(0)) and budget.shared >= budget.affinity


def test_embedded_init_checks_what_torch_env_will_read():
    # distdoctor.init_process_group() under srun without exports: torch's env:// derives nothing,
    # so its local checks still name the missing variables (the CLI forms its world instead).
    info = detect(SLURM_STEP, derive=False)
    assert info.rank.present is False and info.derived == ()
    ctx = fake_context(SLURM_STEP)
    from distdoctor.machine.host import build_context

    plain = build_context(ctx.config, env=SLURM_STEP, argv=("train.py",), probes=FakeProbes(), launch=info)
    missing = {f.data["variable"] for f in launch_checks.rendezvous_env(plain) if f.id == "launch.C001"}
    assert {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"} <= missing


def test_processes_started_by_hand_in_a_batch_script_are_not_slurm_tasks():
    env = {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "RANK": "1", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    info = detect(env)
    assert info.launcher == "manual" and info.scheduler_size is None
    assert not [f for f in launch_checks.scheduler_consistency(fake_context(env))]
