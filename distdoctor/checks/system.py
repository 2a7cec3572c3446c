"""System: /dev/shm, open-files / memlock / process limits, cores and memory per local rank."""

from __future__ import annotations

from distdoctor.checks._support import remedies
from distdoctor.core.context import CheckContext
from distdoctor.machine.cpus import CpuBudget
from distdoctor.machine.env_values import read_int
from distdoctor.machine.launchers import KUBEFLOW, SLURM, TORCHRUN
from distdoctor.machine.probes import Unknown
from distdoctor.core.registry import check, finding_kind

SHM_PATH = "/dev/shm"
MiB = 2**20
GiB = 2**30
# NCCL's intra-node SHM transport and DataLoader workers both live in /dev/shm. NCCL needs a few
# hundred MiB per pair of local GPUs at start; a DataLoader batch of images easily tens of MiB per
# worker. Docker's default is 64 MiB, the classic failure ("unable to write to file </torch_...>",
# "NCCL WARN Error while creating shared memory segment").
SHM_MIN = 512 * MiB
SHM_PER_LOCAL_RANK = 256 * MiB
NOFILE_MIN = 512  # torch itself, DataLoader workers and a few sockets exceed this quickly
NPROC_PER_LOCAL_RANK = 512  # threads count against RLIMIT_NPROC: OMP, NCCL, gloo, DataLoader
MEMORY_PER_LOCAL_RANK = 2 * GiB
UNLIMITED = -1

SHM_TOO_SMALL = finding_kind(
    "system.E001", cause="shm_too_small",
    title="/dev/shm is too small for this many local ranks",
    hint="Give the job a bigger /dev/shm (docker run --shm-size=16g)",
)
SHM_NEARLY_FULL = finding_kind(
    "system.W002", cause="shm_too_small",
    title="/dev/shm is nearly full",
    hint="Remove leftover segments in /dev/shm (ls -la /dev/shm) or enlarge it",
)
SHM_NOT_WRITABLE = finding_kind(
    "system.E003", cause="shm_permission",
    title="/dev/shm is missing or not writable",
    hint="Mount a writable tmpfs on /dev/shm",
)
SHM_UNKNOWN = finding_kind(
    "system.I004", cause="shm_too_small",
    title="Could not tell the size of /dev/shm",
    hint="Check `df -h /dev/shm` in the job's environment",
)
NOFILE_LOW = finding_kind(
    "system.E005", cause="resource_limit",
    title="The open-files limit is too low",
    hint="Raise it: ulimit -n 65536 (docker run --ulimit nofile=65536:65536)",
)
NOFILE_TIGHT = finding_kind(
    "system.W006", cause="resource_limit",
    title="The open-files limit is tight for this world size",
    hint="Raise it: ulimit -n 65536",
)
MEMLOCK_LOW = finding_kind(
    "system.W007", cause="resource_limit",
    title="The locked-memory limit is too low for RDMA (InfiniBand/RoCE)",
    hint="Set memlock to unlimited (docker run --ulimit memlock=-1, srun --propagate=MEMLOCK)",
)
NPROC_LOW = finding_kind(
    "system.W008", cause="resource_limit",
    title="The process/thread limit is low for this many local ranks",
    hint="Raise it: ulimit -u unlimited (docker run --pids-limit=-1)",
)
THREADS_OVERSUBSCRIBED = finding_kind(
    "system.W009", cause="cpu_oversubscription",
    title="Threads x local ranks exceed the CPU cores",
    hint="Set OMP_NUM_THREADS to cores / local ranks",
)
MEMORY_PER_RANK_LOW = finding_kind(
    "system.W010", cause="cpu_oversubscription",
    title="Little memory per local rank",
    hint="Run fewer ranks per node or on nodes with more memory",
)
LIMIT_UNKNOWN = finding_kind(
    "system.I011", cause="resource_limit",
    title="Could not tell an OS limit",
    hint="Check `ulimit -a` in the job's environment",
)


def local_ranks(ctx: CheckContext) -> int:
    launch = ctx.launch
    for var in (launch.local_world_size, launch.scheduler_local_size):
        if var is not None and var.value is not None:
            return var.value
    return ctx.config.nproc or 1


def _fmt(size: int) -> str:
    return f"{size / GiB:.1f} GiB" if size >= GiB else f"{size / MiB:.0f} MiB"


def _shm_fix(ctx: CheckContext, size: int) -> str:
    gib = max(1, -(-size // GiB))
    kind = remedies.container(ctx)
    if kind == "kubernetes" or ctx.launch.launcher == KUBEFLOW:
        return (f"mount an emptyDir with medium: Memory (sizeLimit: {gib}Gi) at /dev/shm in the pod spec")
    if kind in ("docker", "podman"):
        return f"{kind} run --shm-size={gib}g ... (or --ipc=host)"
    return (f"mount -o remount,size={gib}G /dev/shm (as root), or in a container: docker run --shm-size={gib}g; "
            "for DataLoader workers only, torch.multiprocessing.set_sharing_strategy('file_system') avoids /dev/shm fds")


@check(stage="local", tags=("system", "shm"), emits=(SHM_TOO_SMALL, SHM_NEARLY_FULL, SHM_NOT_WRITABLE, SHM_UNKNOWN))
def shared_memory(ctx: CheckContext):
    """/dev/shm size and free space against what NCCL and DataLoader workers need; writable."""
    ranks = local_ranks(ctx)
    need = max(SHM_MIN, SHM_PER_LOCAL_RANK * ranks)
    usage = ctx.probes.disk_usage(SHM_PATH)
    if isinstance(usage, Unknown):
        if "No such file" in usage.reason or "FileNotFound" in usage.reason:
            yield SHM_NOT_WRITABLE(
                f"{SHM_PATH} does not exist",
                detail="torch's shared-memory tensors (DataLoader workers, torch.multiprocessing) and NCCL's SHM transport need it.",
                remediation=_shm_fix(ctx, need),
                data={"path": SHM_PATH, "reason": usage.reason},
            )
        else:
            yield SHM_UNKNOWN(
                f"Could not tell the size of {SHM_PATH}: {usage.reason}",
                remediation=f"Check df -h {SHM_PATH}; it needs about {_fmt(need)} for {ranks} local rank(s)",
                data={"path": SHM_PATH, "reason": usage.reason},
            )
        return
    total, free, _block = usage
    writable = ctx.probes.writable(SHM_PATH)
    if writable is False:
        yield SHM_NOT_WRITABLE(
            f"{SHM_PATH} is not writable by this process",
            detail="Shared-memory segments cannot be created: DataLoader workers fail (\"unable to open shared memory "
            "object\"), NCCL falls back or fails (\"Error while creating shared memory segment\").",
            remediation=f"Make {SHM_PATH} a writable tmpfs (mode 1777): mount -t tmpfs -o size={max(1, need // GiB)}G,mode=1777 tmpfs {SHM_PATH}; "
            f"in a container: {remedies.docker_option(ctx, f'--shm-size={max(1, need // GiB)}g')}",
            data={"path": SHM_PATH},
        )
        return
    data = {"path": SHM_PATH, "total_bytes": total, "free_bytes": free, "needed_bytes": need, "local_ranks": ranks}
    if total < need:
        yield SHM_TOO_SMALL(
            f"{SHM_PATH} is {_fmt(total)}; {ranks} local rank(s) need about {_fmt(need)}",
            detail=f"NCCL's intra-node transport and DataLoader workers allocate in {SHM_PATH}; at {_fmt(total)} they fail "
            "with \"No space left on device\" / \"unable to write to file </torch_...>\" or NCCL's \"Error while creating "
            "shared memory segment\" (docker's default is 64 MiB).",
            remediation=_shm_fix(ctx, need),
            data=data,
        )
    elif free < need:
        yield SHM_NEARLY_FULL(
            f"{SHM_PATH} has {_fmt(free)} free of {_fmt(total)}; {ranks} local rank(s) need about {_fmt(need)}",
            detail="Segments left by killed jobs (torch_*, nccl-*, psm_*) are not cleaned up automatically.",
            remediation=f"Remove stale segments: ls -la {SHM_PATH}; rm {SHM_PATH}/torch_* {SHM_PATH}/nccl-* of jobs no longer running; or " + _shm_fix(ctx, total + need),
            data=data,
        )


def _ulimit_fix(ctx: CheckContext, flag: str, value: str, docker: str, slurm: str) -> str:
    launcher = ctx.launch.launcher
    parts = [f"ulimit {flag} {value} in the job script before the launcher"]
    if launcher == SLURM:
        parts.append(f"srun --propagate={slurm} (the limit of the submitting shell is propagated) or ask the admins to raise it in limits.conf / slurm.conf")
    elif launcher == TORCHRUN or TORCHRUN in ctx.launch.also_present:
        parts.append("torchrun's workers inherit the limit of the shell that starts torchrun")
    if remedies.container(ctx) in ("docker", "podman") or launcher == KUBEFLOW:
        parts.append(remedies.docker_option(ctx, docker, "set the limit in the container runtime's defaults (containerd/docker daemon default-ulimits)"))
    return "; ".join(parts)


def _limit(ctx: CheckContext, name: str):
    value = ctx.probes.rlimit(name)
    if isinstance(value, Unknown):
        return value
    soft, hard = value
    return soft, hard


@check(stage="local", tags=("system", "limits"), emits=(NOFILE_LOW, NOFILE_TIGHT, MEMLOCK_LOW, NPROC_LOW, LIMIT_UNKNOWN))
def resource_limits(ctx: CheckContext):
    """Open files, memlock (when RDMA devices exist) and processes/threads."""
    world = ctx.world_size or local_ranks(ctx)
    nofile = _limit(ctx, "RLIMIT_NOFILE")
    if isinstance(nofile, Unknown):
        yield LIMIT_UNKNOWN(f"Could not tell the open-files limit: {nofile.reason}", remediation="Check ulimit -n", data={"limit": "nofile"})
    else:
        soft, hard = nofile
        want = 4 * world + NOFILE_MIN
        raise_to = "65536" if hard == UNLIMITED or hard >= 65536 else str(hard)
        fix = _ulimit_fix(ctx, "-n", raise_to, "--ulimit nofile=65536:65536", "NOFILE")
        if soft != UNLIMITED and soft < NOFILE_MIN:
            yield NOFILE_LOW(
                f"Open-files limit is {soft} (hard {hard if hard != UNLIMITED else 'unlimited'})",
                detail="torch opens ~100 files at import; each DataLoader worker, each Gloo peer and each NCCL proxy "
                "adds more. Below a few hundred the job dies with \"Too many open files\" (OSError 24) or a "
                "DataLoader \"received 0 items of ancdata\".",
                remediation=fix,
                data={"soft": soft, "hard": hard, "needed": want},
            )
        elif soft != UNLIMITED and soft < want:
            yield NOFILE_TIGHT(
                f"Open-files limit {soft} is tight for a world of {world} ranks (about {want} wanted)",
                detail="Gloo keeps a socket per peer pair and per device; large worlds and DataLoader workers add up.",
                remediation=fix,
                data={"soft": soft, "hard": hard, "needed": want},
            )
    rdma = ctx.probes.rdma_devices()
    if isinstance(rdma, list) and rdma:
        memlock = _limit(ctx, "RLIMIT_MEMLOCK")
        if isinstance(memlock, Unknown):
            yield LIMIT_UNKNOWN(f"Could not tell the locked-memory limit: {memlock.reason}", remediation="Check ulimit -l", data={"limit": "memlock"})
        elif memlock[0] != UNLIMITED and memlock[0] < 64 * GiB:
            yield MEMLOCK_LOW(
                f"Locked-memory limit is {_fmt(memlock[0])} with RDMA devices {', '.join(rdma)}",
                detail="NCCL's InfiniBand/RoCE transport pins its buffers; with a small memlock limit ibv_reg_mr fails "
                "(\"NCCL WARN Call to ibv_reg_mr failed\") or NCCL silently falls back to slow sockets.",
                remediation=_ulimit_fix(ctx, "-l", "unlimited", "--ulimit memlock=-1", "MEMLOCK"),
                data={"soft": memlock[0], "hard": memlock[1], "rdma_devices": rdma},
            )
    nproc = _limit(ctx, "RLIMIT_NPROC")
    ranks = local_ranks(ctx)
    if isinstance(nproc, tuple) and nproc[0] != UNLIMITED and nproc[0] < NPROC_PER_LOCAL_RANK * ranks:
        yield NPROC_LOW(
            f"Process/thread limit is {nproc[0]} for {ranks} local rank(s)",
            detail="Threads count against RLIMIT_NPROC: OpenMP pools, NCCL/Gloo threads and DataLoader workers; at "
            "the limit thread creation fails (\"Resource temporarily unavailable\", pthread_create failed).",
            remediation=_ulimit_fix(ctx, "-u", "unlimited", "--pids-limit=-1", "NPROC"),
            data={"soft": nproc[0], "hard": nproc[1], "local_ranks": ranks},
        )


def _threads_per_rank(ctx: CheckContext, budget) -> tuple[int | None, str]:
    """Threads each rank's intra-op pool runs, and why: OMP_NUM_THREADS, else one per CPU of its
    affinity (OpenMP's default follows the affinity mask, not the cgroup quota)."""
    raw = ctx.env.get("OMP_NUM_THREADS")
    if raw is None:
        return budget.affinity, "OMP_NUM_THREADS unset: torch uses one thread per CPU of each rank's affinity"
    parsed = read_int(ctx.env, "OMP_NUM_THREADS", minimum=1, maximum=1 << 16)
    if parsed.value is None:
        return None, ""
    return parsed.value, f"OMP_NUM_THREADS={parsed.value}"


def _oversubscription(ranks: int, threads: int, budget) -> tuple[int, int, str] | None:
    """(threads competing, CPUs they compete for, what is shared) when they exceed the CPUs."""
    quota = f" (cgroup CPU quota {budget.quota:g})" if budget.quota is not None and budget.quota < budget.affinity else ""
    if budget.bound:
        # The launcher pinned each rank to its own CPUs (mpirun's default --bind-to core, srun
        # --cpu-bind): a rank competes only with its own threads.
        if threads > budget.usable:
            return threads, budget.usable, f"this rank's own CPU set ({budget.affinity} of {budget.shared} CPUs){quota}"
        return None
    if threads * ranks > budget.usable:
        return threads * ranks, budget.usable, f"the {budget.usable} CPUs all {ranks} local ranks share{quota}"
    return None


def _oversubscription_fix(ctx: CheckContext, ranks: int, threads: int, usable: int, bound: bool) -> str:
    per_rank = usable if bound else max(1, usable // ranks)
    if threads > per_rank:
        return remedies.set_env(ctx, "OMP_NUM_THREADS", str(per_rank)) + (
            f"; with srun also --cpus-per-task={per_rank}" if ctx.launch.launcher == SLURM else "")
    # One thread each is already the floor: only fewer ranks (or more cores) help.
    return (f"Run at most {usable} ranks on this node ("
            + ("torchrun --nproc-per-node" if ctx.launch.launcher == TORCHRUN else "tasks per node")
            + f" <= {usable}), or give the job more cores"
            + (" (srun --cpus-per-task)" if ctx.launch.launcher == SLURM else ""))


@check(stage="local", tags=("system", "cpu"), emits=(THREADS_OVERSUBSCRIBED, MEMORY_PER_RANK_LOW))
def cpu_and_memory(ctx: CheckContext):
    """Threads x local ranks vs the CPUs each rank really has (affinity, cgroup quota, binding); memory per local rank."""
    ranks = local_ranks(ctx)
    budget = ctx.memo("cpu_budget", ctx.probes.cpu_budget)
    if isinstance(budget, CpuBudget) and ranks > 1:
        threads, source = _threads_per_rank(ctx, budget)
        over = _oversubscription(ranks, threads, budget) if threads is not None else None
        if over is not None:
            total, cpus, shared = over
            yield THREADS_OVERSUBSCRIBED(
                f"{ranks} local ranks x {threads} threads: {total} threads on {shared}",
                detail=f"{source}. Oversubscribed ranks time-slice each other: steps slow down many-fold and "
                "collectives see stragglers (and may time out).",
                remediation=_oversubscription_fix(ctx, ranks, threads, cpus, budget.bound),
                data={"local_ranks": ranks, "threads": threads, "cores": cpus, "affinity": budget.affinity,
                      "shared_cpus": budget.shared, "quota": budget.quota, "bound": budget.bound},
            )
    memory = ctx.probes.memory_total()
    if isinstance(memory, int) and memory > 0 and ranks > 1 and memory / ranks < MEMORY_PER_LOCAL_RANK:
        yield MEMORY_PER_RANK_LOW(
            f"{_fmt(memory)} of memory for {ranks} local ranks ({_fmt(memory // ranks)} each)",
            detail="Each rank holds torch (~0.5-1 GiB), its model replica and DataLoader workers; below ~2 GiB per "
            "rank the out-of-memory killer ends ranks (exit -9) and the others hang in the next collective.",
            remediation="Run fewer ranks per node (" + ("torchrun --nproc-per-node" if ctx.launch.launcher == TORCHRUN else "tasks per node")
            + "), fewer DataLoader workers, or larger nodes"
            + ("; with SLURM request memory: --mem-per-cpu / --mem" if ctx.launch.launcher == SLURM else ""),
            data={"memory_bytes": memory, "local_ranks": ranks},
        )
