"""Which launcher started this process, and the world its variables describe.

Pure functions of (env, argv): no probing, so they are cheap, deterministic and testable with a
dict. The checks in distdoctor.checks.launch turn the problems found here into findings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from distdoctor.machine.env_values import MAX_INT_TEXT, MAX_WORLD, IntVar, read_int  # noqa: F401 (re-exported)
from distdoctor.machine.hostlist import HostlistError, expand_task_counts
from distdoctor.machine.launch_line import PlannedLaunch
from distdoctor.machine.launch_world import derive_world
from distdoctor.machine.launch_world import first_slurm_host

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
# `accelerate launch --num_processes N` (N > 1) in its simple mode (--cpu without
# --mpirun_hostfile, or no --multi_gpu): ONE process, started with MASTER_ADDR/MASTER_PORT (set
# because N > 1) but no RANK or WORLD_SIZE.
ACCELERATE_SINGLE = "accelerate_single"
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
    ACCELERATE_SINGLE: "accelerate launch (one process)",
    MANUAL: "variables set by hand",
    NONE: "a plain process (no launcher)",
}


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
    # torch's variables this process lacks, filled from the launcher's own (variable -> where the
    # value came from, e.g. "RANK" -> "SLURM_PROCID=1"): `distdoctor check` forms its world from them.
    derived: tuple[tuple[str, str], ...] = ()
    # Why MASTER_ADDR/MASTER_PORT could not be derived for a world that needs them (multi-node).
    endpoint_problem: str | None = None
    # accelerate launch's mode (accelerate_mode), when ACCELERATE_* variables are set.
    accelerate: str | None = None
    # A launch line checked before it runs (machine.launch_line.PlannedLaunch): the launcher has
    # not set RANK / WORLD_SIZE yet, and its endpoint is checked as the launcher will use it.
    planned: PlannedLaunch | None = None

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
            "derived": dict(self.derived),
        }


def _tasks_per_node(env: Mapping[str, str]) -> IntVar | None:
    """Tasks on this node: SLURM_NTASKS_PER_NODE, else this node's count of the step's (or the
    job's) SLURM_*TASKS_PER_NODE ("4(x2),3": node 0 and 1 run 4, node 2 runs 3)."""
    if "SLURM_NTASKS_PER_NODE" in env:
        return read_int(env, "SLURM_NTASKS_PER_NODE", minimum=1, maximum=MAX_WORLD)
    name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE") if n in env), None)
    if name is None:
        return None
    raw = env[name]
    try:
        counts = expand_task_counts(raw)
    except HostlistError as exc:
        return IntVar(name, raw, problem=f"{name}={raw[:80]!r} is unusable: {exc}")
    node = read_int(env, "SLURM_NODEID", maximum=MAX_WORLD).value or 0
    if node >= len(counts):
        return IntVar(name, raw, problem=f"{name}={raw[:80]!r} has no count for node {node} (SLURM_NODEID)")
    return IntVar(name, raw, value=counts[node])


def local_rank_flag(argv: Sequence[str]) -> str | None:
    """The --local_rank / --local-rank argument torch.distributed.launch appends, if present."""
    for arg in argv:
        if arg.startswith(("--local_rank", "--local-rank")):
            return arg
    return None


def _has_prefix(env: Mapping[str, str], *prefixes: str) -> list[str]:
    return sorted(k for k in env if k.startswith(prefixes))


@dataclass
class _Seen:
    """What the detectors found so far: launchers in order of precedence, and the scheduler's view."""

    found: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    rank: IntVar | None = None
    size: IntVar | None = None
    local_rank: IntVar | None = None
    local_size: IntVar | None = None
    nodes: IntVar | None = None
    node_rank: IntVar | None = None
    restart_count: int | None = None

    def scheduler(self, env: Mapping[str, str], rank: str, size: str | None = None, local: str | None = None,
                  local_size: str | None = None) -> None:
        """Take the scheduler's variables where no earlier detector set them (the first wins)."""
        self.rank = self.rank or read_int(env, rank, maximum=MAX_WORLD)
        if size and size in env:
            self.size = self.size or read_int(env, size, minimum=1, maximum=MAX_WORLD)
        if local and local in env:
            self.local_rank = self.local_rank or read_int(env, local, maximum=MAX_WORLD)
        if local_size and local_size in env:
            self.local_size = self.local_size or read_int(env, local_size, minimum=1, maximum=MAX_WORLD)


def _detect_torch_launchers(env: Mapping[str, str], argv: Sequence[str], seen: _Seen) -> None:
    # torch.distributed.launch runs the elastic agent too (TORCHELASTIC_* and LOCAL_RANK are
    # set), but unlike torchrun it appends --local-rank=N to the script's argv. A --local-rank
    # in argv without LOCAL_RANK in env is the launcher of torch < 1.9 (or a hand-made imitation).
    flag = local_rank_flag(argv)
    elastic = "TORCHELASTIC_RUN_ID" in env or "TORCHELASTIC_RESTART_COUNT" in env
    if flag is not None and ("LOCAL_RANK" not in env or elastic):
        seen.found.append(DEPRECATED_LAUNCH)
        seen.evidence.append(f"{flag} in argv" + ("" if "LOCAL_RANK" in env else " without LOCAL_RANK in env"))
    if elastic or ("GROUP_RANK" in env and "ROLE_RANK" in env):
        seen.found.append(TORCHRUN)
        seen.evidence += [k for k in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK") if k in env]
        seen.restart_count = read_int(env, "TORCHELASTIC_RESTART_COUNT", maximum=MAX_WORLD).value
        seen.node_rank = read_int(env, "GROUP_RANK", maximum=MAX_WORLD)


def slurm_step(env: Mapping[str, str]) -> bool:
    """True inside an srun step (its tasks are the ranks); False in a batch script or salloc shell,
    where SLURM_PROCID=0 and SLURM_NTASKS describe the allocation, not processes that exist.
    Only srun sets SLURM_STEP_NUM_TASKS, and only its tasks other than the first have a
    SLURM_PROCID above 0 (a batch script is task 0)."""
    if "SLURM_STEP_ID" in env or "SLURM_STEPID" in env or "SLURM_STEP_NUM_TASKS" in env:
        return True
    return bool(read_int(env, "SLURM_PROCID", maximum=MAX_WORLD).value)


def _detect_slurm(env: Mapping[str, str], seen: _Seen) -> None:
    if not (("SLURM_PROCID" in env and "SLURM_JOB_ID" in env) or slurm_step(env)):
        return
    if not slurm_step(env):
        # A batch script or salloc shell: one process on the first node, whose SLURM_PROCID and
        # SLURM_NTASKS describe the allocation, not processes that exist (srun starts the ranks).
        # `distdoctor check` runs its self-test here, and ranks started by hand are not SLURM's.
        seen.evidence.append("SLURM_JOB_ID without SLURM_STEP_ID (a batch script or salloc shell, not an srun step)")
        return
    seen.found.append(SLURM)
    seen.evidence += [k for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID") if k in env]
    size = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    seen.scheduler(env, "SLURM_PROCID", size, "SLURM_LOCALID")
    seen.node_rank = seen.node_rank or read_int(env, "SLURM_NODEID", maximum=MAX_WORLD)
    seen.local_size = seen.local_size or _tasks_per_node(env)
    nodes = next((n for n in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") if n in env), None)
    if nodes:
        seen.nodes = seen.nodes or read_int(env, nodes, minimum=1, maximum=MAX_WORLD)


def _detect_mpi(env: Mapping[str, str], seen: _Seen) -> None:
    if "OMPI_COMM_WORLD_RANK" in env:
        seen.found.append(OPENMPI)
        seen.evidence.append("OMPI_COMM_WORLD_RANK")
        seen.scheduler(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE")
    elif "PMI_RANK" in env and ("HYDRA_CONTROL_FD" in env or "MPI_LOCALRANKID" in env or "PMI_SIZE" in env):
        seen.found.append(MPICH)
        seen.evidence.append("PMI_RANK")
        seen.scheduler(env, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    elif "PMIX_RANK" in env:
        seen.found.append(PMIX)
        seen.evidence.append("PMIX_RANK")
        seen.scheduler(env, "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE")


def _detect_lsf_and_kubeflow(env: Mapping[str, str], seen: _Seen) -> None:
    if "JSM_NAMESPACE_RANK" in env or ("LSB_JOBID" in env and "JSM_NAMESPACE_SIZE" in env):
        seen.found.append(LSF)
        seen.evidence.append("JSM_NAMESPACE_RANK")
        seen.scheduler(env, "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_LOCAL_RANK",
                       "JSM_NAMESPACE_LOCAL_SIZE")
    if "PET_NPROC_PER_NODE" in env or "PET_MASTER_ADDR" in env or (
        "KUBERNETES_SERVICE_HOST" in env and "MASTER_ADDR" in env and "RANK" in env
    ):
        seen.found.append(KUBEFLOW)
        seen.evidence += [k for k in ("PET_NPROC_PER_NODE", "PET_MASTER_ADDR", "KUBERNETES_SERVICE_HOST") if k in env]
        if "PET_NNODES" in env:
            seen.nodes = seen.nodes or read_int(env, "PET_NNODES", minimum=1, maximum=MAX_WORLD)


def _detect_spawn(env: Mapping[str, str], argv: Sequence[str], seen: _Seen) -> None:
    # torch.multiprocessing.spawn leaves no variables of its own; its children are spawned
    # multiprocessing children with the parent's env, started as
    # `python -c "from multiprocessing.spawn import spawn_main; ..." --multiprocessing-fork`.
    if SELF_TEST_VAR in env:
        seen.found.append(MP_SPAWN)
        seen.evidence.append(SELF_TEST_VAR)
    elif "--multiprocessing-fork" in argv:
        seen.found.append(MP_SPAWN)
        seen.evidence.append("--multiprocessing-fork in argv (a multiprocessing spawn child)")


def _torch_view(env: Mapping[str, str]) -> dict[str, IntVar]:
    return {
        "RANK": read_int(env, "RANK", maximum=MAX_WORLD),
        "WORLD_SIZE": read_int(env, "WORLD_SIZE", minimum=1, maximum=MAX_WORLD),
        "LOCAL_RANK": read_int(env, "LOCAL_RANK", maximum=MAX_WORLD),
        "LOCAL_WORLD_SIZE": read_int(env, "LOCAL_WORLD_SIZE", minimum=1, maximum=MAX_WORLD),
        "MASTER_PORT": read_int(env, "MASTER_PORT", minimum=1, maximum=65535),
        "NODE_RANK": read_int(env, "NODE_RANK", maximum=MAX_WORLD),
    }


def detect(env: Mapping[str, str], argv: Sequence[str] = (), derive: bool = True) -> LaunchInfo:
    """Name the launcher from the environment (and argv, for the deprecated launcher), and the
    world it describes: torch's own variables, else (``derive``) the values derived from the
    launcher's. Without ``derive`` the world is exactly what torch's env:// would read: for a
    training script about to call init_process_group, which derives nothing."""
    seen = _Seen()
    _detect_torch_launchers(env, argv, seen)
    _detect_slurm(env, seen)
    _detect_mpi(env, seen)
    _detect_lsf_and_kubeflow(env, seen)
    _detect_spawn(env, argv, seen)
    if seen.found:
        launcher = seen.found[0]
    elif any(k in env for k in RENDEZVOUS_VARS):
        launcher = MANUAL
        seen.evidence += [k for k in RENDEZVOUS_VARS if k in env]
    else:
        launcher = NONE
    accelerate = accelerate_mode(env)
    if accelerate:
        seen.evidence.append(f"ACCELERATE_* variables (accelerate launch, {accelerate} mode)")
    if launcher == MANUAL and accelerate in ("cpu", "default") and "RANK" not in env and "WORLD_SIZE" not in env:
        launcher = ACCELERATE_SINGLE
    torch_vars = _torch_view(env)
    derived = derive_world(launcher, env, seen, torch_vars) if derive else derive_world(NONE, env, seen, torch_vars)
    node_rank = seen.node_rank if seen.node_rank is not None else (torch_vars["NODE_RANK"] if "NODE_RANK" in env else None)
    return LaunchInfo(
        launcher=launcher,
        rank=derived.ints.get("RANK", torch_vars["RANK"]),
        world_size=derived.ints.get("WORLD_SIZE", torch_vars["WORLD_SIZE"]),
        local_rank=derived.ints.get("LOCAL_RANK", torch_vars["LOCAL_RANK"]),
        local_world_size=derived.ints.get("LOCAL_WORLD_SIZE", torch_vars["LOCAL_WORLD_SIZE"]),
        master_port=derived.ints.get("MASTER_PORT", torch_vars["MASTER_PORT"]),
        master_addr=derived.master_addr if derived.master_addr is not None else env.get("MASTER_ADDR"),
        scheduler_rank=seen.rank,
        scheduler_size=seen.size,
        scheduler_local_rank=seen.local_rank,
        node_rank=node_rank,
        scheduler_local_size=seen.local_size,
        scheduler_nodes=seen.nodes,
        restart_count=seen.restart_count,
        evidence=tuple(seen.evidence),
        also_present=tuple(seen.found[1:]),
        derived=derived.sources,
        endpoint_problem=derived.endpoint_problem,
        accelerate=accelerate,
    )


def accelerate_mode(env: Mapping[str, str]) -> str | None:
    """Hugging Face `accelerate launch`'s mode from the ACCELERATE_* variables it sets, or None.

    'cpu' (--cpu: ACCELERATE_USE_CPU), 'mpi' (--cpu with --mpirun_hostfile: ACCELERATE_USE_CPU
    under mpirun), 'deepspeed', 'fsdp', or 'default'.
    """
    keys = [k for k in env if k.startswith("ACCELERATE_")]
    if not keys:
        return None
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return "deepspeed"
    if env.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "fsdp"
    if env.get("ACCELERATE_USE_CPU", "").lower() == "true":
        return "mpi" if "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env else "cpu"
    return "default"


def _planned_ints(plan: PlannedLaunch, gpu_count: int | None) -> tuple[int | None, int | None]:
    """(world size, ranks on this node) the line will start."""
    torchrun = plan if plan.launcher == TORCHRUN else plan.inner
    if torchrun is not None:
        nproc = torchrun.nproc_per_node
        if nproc in ("gpu", "auto") and gpu_count:
            nproc = gpu_count
        elif nproc in ("cpu", "auto"):
            nproc = os.cpu_count() or 1
        if not isinstance(nproc, int):
            return None, None
        nodes = plan.nnodes if plan is not torchrun else torchrun.nnodes
        return nodes * nproc, nproc
    return plan.tasks, plan.tasks_per_node


def planned_launch(plan: PlannedLaunch, env: Mapping[str, str], gpu_count: int | None = None) -> LaunchInfo:
    """The launcher and world a launch line will give this node's processes, before it runs."""
    size, local = _planned_ints(plan, gpu_count)
    torchrun = plan if plan.launcher == TORCHRUN else plan.inner
    launcher = TORCHRUN if torchrun is not None else plan.launcher
    master_addr, master_port = (torchrun.master_addr, torchrun.master_port) if torchrun else (None, None)
    if torchrun is None and plan.launcher == SLURM and "SLURM_JOB_NODELIST" in env:

        master_addr = first_slurm_host(env)[0]
    elif torchrun is None and plan.nnodes == 1:
        master_addr = "127.0.0.1"

    def planned_int(name: str, value: int | None) -> IntVar:
        return IntVar(name, None) if value is None else IntVar(name, str(value), value)

    scheduler = plan if plan.launcher != TORCHRUN else None
    return LaunchInfo(
        launcher=launcher,
        rank=IntVar("RANK", None),
        world_size=planned_int("WORLD_SIZE", size),
        local_rank=IntVar("LOCAL_RANK", None),
        local_world_size=planned_int("LOCAL_WORLD_SIZE", local),
        master_port=planned_int("MASTER_PORT", master_port or None),
        master_addr=master_addr,
        node_rank=planned_int("--node-rank", torchrun.node_rank) if torchrun else None,
        scheduler_size=planned_int("tasks", scheduler.tasks) if scheduler else None,
        scheduler_local_size=planned_int("tasks per node", scheduler.tasks_per_node) if scheduler else None,
        scheduler_nodes=planned_int("nodes", plan.nnodes),
        evidence=(f"the launch line: {plan.line}",),
        also_present=(plan.launcher,) if launcher != plan.launcher else (),
        planned=plan,
    )
