"""Launcher and rendezvous environment: who started us, and are the env:// variables usable."""

from __future__ import annotations

from distdoctor.context import CheckContext
from distdoctor.launchers import (
    DEPRECATED_LAUNCH,
    KUBEFLOW,
    MANUAL,
    MPICH,
    NONE,
    OPENMPI,
    SLURM,
    TORCHRUN,
    LaunchInfo,
)
from distdoctor.registry import check, finding_kind

ENV_MISSING = finding_kind(
    "launch.C001",
    cause="env_missing",
    title="A rendezvous variable is not set",
    hint="Start the script with its launcher (torchrun), or export the variable",
)
ENV_INVALID = finding_kind(
    "launch.C002",
    cause="env_invalid",
    title="A rendezvous variable is set but unusable",
    hint="Fix the variable's value; see the detail for what is wrong",
)

# How each launcher provides each variable: the remediation names the launcher's own way.
_HOW = {
    TORCHRUN: {
        "*": "torchrun sets {var} itself; do not override it in the environment "
        "(torchrun --nnodes N --nproc-per-node G --rdzv-endpoint HOST:PORT script.py)",
    },
    SLURM: {
        "RANK": "export RANK=$SLURM_PROCID in the srun step (or run torchrun once per node)",
        "WORLD_SIZE": "export WORLD_SIZE=$SLURM_NTASKS in the srun step",
        "LOCAL_RANK": "export LOCAL_RANK=$SLURM_LOCALID in the srun step",
        "LOCAL_WORLD_SIZE": "export LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE in the srun step",
        "MASTER_ADDR": "in the sbatch script: export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        "MASTER_PORT": "in the sbatch script: export MASTER_PORT=29500 (any free port, the same on every node)",
    },
    OPENMPI: {
        "RANK": "export RANK=$OMPI_COMM_WORLD_RANK (e.g. mpirun -x in a wrapper script)",
        "WORLD_SIZE": "export WORLD_SIZE=$OMPI_COMM_WORLD_SIZE",
        "LOCAL_RANK": "export LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK",
        "LOCAL_WORLD_SIZE": "export LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE",
        "MASTER_ADDR": "mpirun -x MASTER_ADDR=<first host> ...",
        "MASTER_PORT": "mpirun -x MASTER_PORT=29500 ...",
    },
    MPICH: {
        "RANK": "export RANK=$PMI_RANK",
        "WORLD_SIZE": "export WORLD_SIZE=$PMI_SIZE",
        "LOCAL_RANK": "export LOCAL_RANK=$MPI_LOCALRANKID",
        "MASTER_ADDR": "mpiexec -genv MASTER_ADDR <first host> ...",
        "MASTER_PORT": "mpiexec -genv MASTER_PORT 29500 ...",
    },
    KUBEFLOW: {
        "*": "the PyTorchJob operator sets {var} in every pod; check the job's spec (pytorchReplicaSpecs) "
        "and that the container does not override it",
    },
}


def how_launcher_sets(var: str, launch: LaunchInfo) -> str:
    by_launcher = _HOW.get(launch.launcher, {})
    how = by_launcher.get(var) or by_launcher.get("*")
    if how:
        return how.format(var=var)
    return (
        f"start the script with torchrun, which sets {var} "
        f"(torchrun --nproc-per-node N script.py), or export {var} yourself"
    )


@check(stage="local", tags=("launch", "env"), emits=(ENV_MISSING, ENV_INVALID))
def rendezvous_env(ctx: CheckContext):
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: present and usable."""
    launch = ctx.launch
    if launch.launcher == NONE:
        return  # a plain process: nothing claims a world (the self-test world supplies one)

    required = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    if launch.launcher not in (MANUAL, DEPRECATED_LAUNCH):
        required.append("LOCAL_RANK")
    int_vars = {
        "RANK": launch.rank,
        "WORLD_SIZE": launch.world_size,
        "LOCAL_RANK": launch.local_rank,
        "LOCAL_WORLD_SIZE": launch.local_world_size,
        "MASTER_PORT": launch.master_port,
    }
    for var in required:
        present = launch.master_addr is not None if var == "MASTER_ADDR" else int_vars[var].present
        if not present:
            yield ENV_MISSING(
                f"{var} is not set (started by {launch.title})",
                detail=f"torch's env:// rendezvous reads {var}; init_process_group will fail with "
                f"\"environment variable {var} expected, but not set\".",
                remediation=how_launcher_sets(var, launch),
                data={"variable": var, "launcher": launch.launcher},
            )
    for var, parsed in int_vars.items():
        if parsed.problem:
            yield ENV_INVALID(
                f"{var} is unusable: {parsed.problem}",
                remediation=how_launcher_sets(var, launch),
                data={"variable": var, "value": parsed.raw},
            )
    if launch.master_addr is not None and not launch.master_addr.strip():
        yield ENV_INVALID(
            "MASTER_ADDR is set but empty",
            remediation=how_launcher_sets("MASTER_ADDR", launch),
            data={"variable": "MASTER_ADDR", "value": launch.master_addr},
        )
    rank, size = launch.rank.value, launch.world_size.value
    if rank is not None and size is not None and rank >= size:
        yield ENV_INVALID(
            f"RANK={rank} is not below WORLD_SIZE={size}",
            detail="Ranks are numbered 0 .. WORLD_SIZE-1; this process can never join the world.",
            remediation=how_launcher_sets("RANK", launch),
            data={"variable": "RANK", "value": rank, "world_size": size},
        )
    local, local_size = launch.local_rank.value, launch.local_world_size.value
    if local is not None and local_size is not None and local >= local_size:
        yield ENV_INVALID(
            f"LOCAL_RANK={local} is not below LOCAL_WORLD_SIZE={local_size}",
            remediation=how_launcher_sets("LOCAL_RANK", launch),
            data={"variable": "LOCAL_RANK", "value": local, "local_world_size": local_size},
        )
