"""Which launcher started this process, and the world its variables describe.

Pure functions of (env, argv): no probing, so they are cheap, deterministic and testable with a
dict. The checks in distdoctor.checks.launch turn the problems found here into findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

# The variables torch's env:// rendezvous reads.
RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

TORCHRUN = "torchrun"
DEPRECATED_LAUNCH = "torch.distributed.launch"
SLURM = "slurm"
OPENMPI = "openmpi"
MPICH = "mpich"
PMIX = "pmix"
KUBEFLOW = "kubeflow"
LSF = "lsf"
MP_SPAWN = "mp_spawn"
# Set in each rank of distdoctor's own self-test world (started with torch.multiprocessing).
SELF_TEST_VAR = "DISTDOCTOR_MP_SPAWN"
MANUAL = "manual"  # RANK/WORLD_SIZE set by hand (or by a script), no launcher known
NONE = "none"  # a plain process: no distributed variables at all

LAUNCHER_TITLES = {
    TORCHRUN: "torchrun (torch.distributed.elastic)",
    DEPRECATED_LAUNCH: "python -m torch.distributed.launch (deprecated)",
    SLURM: "SLURM (srun)",
    OPENMPI: "Open MPI (mpirun)",
    MPICH: "MPICH / Intel MPI (mpiexec)",
    PMIX: "a PMI/PMIx launcher",
    KUBEFLOW: "a Kubeflow PyTorchJob",
    LSF: "LSF (jsrun)",
    MP_SPAWN: "torch.multiprocessing.spawn",
    MANUAL: "variables set by hand",
    NONE: "a plain process (no launcher)",
}


@dataclass(frozen=True)
class IntVar:
    """An integer variable as read from the environment: its value, or why it is unusable."""

    name: str
    raw: str | None
    value: int | None = None
    problem: str | None = None

    @property
    def present(self) -> bool:
        return self.raw is not None


def read_int(env: Mapping[str, str], name: str, minimum: int | None = 0, maximum: int | None = None) -> IntVar:
    raw = env.get(name)
    if raw is None:
        return IntVar(name, None)
    text = raw.strip()
    try:
        value = int(text, 10)
    except ValueError:
        return IntVar(name, raw, problem=f"{name}={raw!r} is not an integer")
    if minimum is not None and value < minimum:
        return IntVar(name, raw, problem=f"{name}={raw!r} is below {minimum}")
    if maximum is not None and value > maximum:
        return IntVar(name, raw, problem=f"{name}={raw!r} is above {maximum}")
    return IntVar(name, raw, value=value)


@dataclass(frozen=True)
class LaunchInfo:
    """The launcher and the world as this process's environment describes it."""

    launcher: str
    rank: IntVar
    world_size: IntVar
    local_rank: IntVar
    local_world_size: IntVar
    master_port: IntVar
    master_addr: str | None
    # Where the world's numbers came from when they are not torch's own variables
    # (SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK...): the scheduler's view, for cross-checks.
    scheduler_rank: IntVar | None = None
    scheduler_size: IntVar | None = None
    scheduler_local_rank: IntVar | None = None
    node_rank: IntVar | None = None
    # The scheduler's tasks per node and node count (SLURM_NTASKS_PER_NODE / SLURM_NNODES,
    # OMPI_COMM_WORLD_LOCAL_SIZE...), for "torchrun inside a multi-task srun" and size checks.
    scheduler_local_size: IntVar | None = None
    scheduler_nodes: IntVar | None = None
    restart_count: int | None = None
    evidence: tuple[str, ...] = ()
    also_present: tuple[str, ...] = field(default_factory=tuple)

    @property
    def title(self) -> str:
        return LAUNCHER_TITLES.get(self.launcher, self.launcher)

    @property
    def is_distributed(self) -> bool:
        """True when the environment describes (or tries to describe) a multi-process world."""
        return self.launcher != NONE

    @property
    def world_configured(self) -> bool:
        """True when RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are all present and usable."""
        return (
            self.rank.value is not None
            and self.world_size.value is not None
            and self.master_port.value is not None
            and bool(self.master_addr and self.master_addr.strip())
            and self.rank.value < self.world_size.value
        )

    def summary(self) -> dict[str, object]:
        return {
            "launcher": self.launcher,
            "rank": self.rank.value,
            "world_size": self.world_size.value,
            "local_rank": self.local_rank.value,
            "local_world_size": self.local_world_size.value,
            "master_addr": self.master_addr,
            "master_port": self.master_port.value,
            "restart_count": self.restart_count,
            "evidence": list(self.evidence),
        }


def _tasks_per_node(env: Mapping[str, str]) -> IntVar | None:
    """SLURM_NTASKS_PER_NODE, or the first count of SLURM_TASKS_PER_NODE ("4(x2),3" -> 4)."""
    if "SLURM_NTASKS_PER_NODE" in env:
        return read_int(env, "SLURM_NTASKS_PER_NODE", minimum=1)
    raw = env.get("SLURM_TASKS_PER_NODE")
    if raw is None:
        return None
    head = raw.split(",", 1)[0].split("(", 1)[0].strip()
    parsed = read_int({"SLURM_TASKS_PER_NODE": head}, "SLURM_TASKS_PER_NODE", minimum=1)
    return IntVar("SLURM_TASKS_PER_NODE", raw, parsed.value, parsed.problem)


def local_rank_flag(argv: Sequence[str]) -> str | None:
    """The --local_rank / --local-rank argument torch.distributed.launch appends, if present."""
    for arg in argv:
        if arg.startswith(("--local_rank", "--local-rank")):
            return arg
    return None


def _has_prefix(env: Mapping[str, str], *prefixes: str) -> list[str]:
    return sorted(k for k in env if k.startswith(prefixes))


def detect(env: Mapping[str, str], argv: Sequence[str] = ()) -> LaunchInfo:
    """Name the launcher from the environment (and argv, for the deprecated launcher)."""
    evidence: list[str] = []
    found: list[str] = []
    scheduler_rank = scheduler_size = scheduler_local = node_rank = None
    scheduler_local_size = scheduler_nodes = None
    restart_count: int | None = None

    # torch.distributed.launch runs the elastic agent too (TORCHELASTIC_* and LOCAL_RANK are
    # set), but unlike torchrun it appends --local-rank=N to the script's argv. A --local-rank
    # in argv without LOCAL_RANK in env is the launcher of torch < 1.9 (or a hand-made imitation).
    flag = local_rank_flag(argv)
    elastic = "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env
    if flag is not None and ("LOCAL_RANK" not in env or elastic):
        found.append(DEPRECATED_LAUNCH)
        evidence.append(f"{flag} in argv" + ("" if "LOCAL_RANK" in env else " without LOCAL_RANK in env"))

    if "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env or "GROUP_RANK" in env and "ROLE_RANK" in env:
        found.append(TORCHRUN)
        evidence += [k for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK") if k in env]
        restart = read_int(env, "TORCHELASTIC_RESTART_COUNT")
        restart_count = restart.value
        node_rank = read_int(env, "GROUP_RANK")
    if "SLURM_PROCID" in env and "SLURM_JOB_ID" in env or "SLURM_STEP_ID" in env:
        found.append(SLURM)
        evidence += [k for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID") if k in env]
        scheduler_rank = read_int(env, "SLURM_PROCID")
        scheduler_size = read_int(env, "SLURM_NTASKS", minimum=1)
        scheduler_local = read_int(env, "SLURM_LOCALID")
        node_rank = node_rank or read_int(env, "SLURM_NODEID")
        scheduler_local_size = _tasks_per_node(env)
        if "SLURM_NNODES" in env or "SLURM_JOB_NUM_NODES" in env:
            scheduler_nodes = read_int(env, "SLURM_NNODES" if "SLURM_NNODES" in env else "SLURM_JOB_NUM_NODES", minimum=1)
    if "OMPI_COMM_WORLD_RANK" in env:
        found.append(OPENMPI)
        evidence.append("OMPI_COMM_WORLD_RANK")
        scheduler_rank = scheduler_rank or read_int(env, "OMPI_COMM_WORLD_RANK")
        scheduler_size = scheduler_size or read_int(env, "OMPI_COMM_WORLD_SIZE", minimum=1)
        scheduler_local = scheduler_local or read_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")
        if "OMPI_COMM_WORLD_LOCAL_SIZE" in env:
            scheduler_local_size = scheduler_local_size or read_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", minimum=1)
    elif "PMI_RANK" in env and ("HYDRA_CONTROL_FD" in env or "MPI_LOCALRANKID" in env or "PMI_SIZE" in env):
        found.append(MPICH)
        evidence.append("PMI_RANK")
        scheduler_rank = scheduler_rank or read_int(env, "PMI_RANK")
        scheduler_size = scheduler_size or read_int(env, "PMI_SIZE", minimum=1)
        scheduler_local = scheduler_local or read_int(env, "MPI_LOCALRANKID")
        if "MPI_LOCALNRANKS" in env:
            scheduler_local_size = scheduler_local_size or read_int(env, "MPI_LOCALNRANKS", minimum=1)
    elif "PMIX_RANK" in env:
        found.append(PMIX)
        evidence.append("PMIX_RANK")
        scheduler_rank = scheduler_rank or read_int(env, "PMIX_RANK")
    if "JSM_NAMESPACE_RANK" in env or "LSB_JOBID" in env and "JSM_NAMESPACE_SIZE" in env:
        found.append(LSF)
        evidence.append("JSM_NAMESPACE_RANK")
        scheduler_rank = scheduler_rank or read_int(env, "JSM_NAMESPACE_RANK")
        scheduler_size = scheduler_size or read_int(env, "JSM_NAMESPACE_SIZE", minimum=1)
        scheduler_local = scheduler_local or read_int(env, "JSM_NAMESPACE_LOCAL_RANK")
    if "PET_NPROC_PER_NODE" in env or "PET_MASTER_ADDR" in env or (
        "KUBERNETES_SERVICE_HOST" in env and "MASTER_ADDR" in env and "RANK" in env
    ):
        found.append(KUBEFLOW)
        evidence += [k for k in ("PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "KUBERNETES_SERVICE_HOST") if k in env]
    # torch.multiprocessing.spawn leaves no variables of its own; its children are spawned
    # multiprocessing children with the parent's env, started as
    # `python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork`.
    if SELF_TEST_VAR in env:
        found.append(MP_SPAWN)
        evidence.append(SELF_TEST_VAR)
    elif "--multiprocessing-fork" in argv:
        found.append(MP_SPAWN)
        evidence.append("--multiprocessing-fork in argv (a multiprocessing spawn child)")

    if found:
        launcher = found[0]
    elif any(k in env for k in RENDEZVOUS_VARS):
        launcher = MANUAL
        evidence += [k for k in RENDEZVOUS_VARS if k in env]
    else:
        launcher = NONE

    return LaunchInfo(
        launcher=launcher,
        rank=read_int(env, "RANK"),
        world_size=read_int(env, "WORLD_SIZE", minimum=1),
        local_rank=read_int(env, "LOCAL_RANK"),
        local_world_size=read_int(env, "LOCAL_WORLD_SIZE", minimum=1),
        master_port=read_int(env, "MASTER_PORT", minimum=1, maximum=65535),
        master_addr=env.get("MASTER_ADDR"),
        scheduler_rank=scheduler_rank,
        scheduler_size=scheduler_size,
        scheduler_local_rank=scheduler_local,
        node_rank=node_rank,
        scheduler_local_size=scheduler_local_size,
        scheduler_nodes=scheduler_nodes,
        restart_count=restart_count,
        evidence=tuple(evidence),
        also_present=tuple(found[1:]),
    )
