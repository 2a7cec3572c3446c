"""Launcher and rendezvous environment: who started us, and are the env:// variables usable."""

from __future__ import annotations

from distdoctor.core.context import CheckContext
from distdoctor.machine.launchers import (
    ACCELERATE_SINGLE,
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
from distdoctor.core.registry import check, finding_kind
import re
import json
import sys
import posixpath
from distdoctor.machine.launchers import local_rank_flag
from distdoctor.checks._support.init_method import from_config, setting_label
from distdoctor.checks._support.world_layout import multi_host

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


WORLD_DERIVED = finding_kind(
    "launch.I011",
    cause="env_missing",
    title="The world was derived from the launcher's own variables",
    hint="A plain torch script needs RANK / WORLD_SIZE / MASTER_* exported; Lightning and accelerate derive them",
)
ENDPOINT_NOT_DERIVED = finding_kind(
    "launch.C012",
    cause="env_missing",
    title="The rendezvous endpoint of a multi-node world cannot be derived",
    hint="Export MASTER_ADDR (rank 0's host) and MASTER_PORT on every node",
)

# Variables whose value differs from rank to rank (the report shows the source's name only).
_PER_RANK = ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
_EXPORT_FROM = {
    SLURM: ("RANK=$SLURM_PROCID", "WORLD_SIZE=$SLURM_NTASKS", "LOCAL_RANK=$SLURM_LOCALID"),
    OPENMPI: ("RANK=$OMPI_COMM_WORLD_RANK", "WORLD_SIZE=$OMPI_COMM_WORLD_SIZE", "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK"),
    MPICH: ("RANK=$PMI_RANK", "WORLD_SIZE=$PMI_SIZE", "LOCAL_RANK=$MPI_LOCALRANKID"),
}


@check(stage="local", tags=("launch", "env"), emits=(WORLD_DERIVED, ENDPOINT_NOT_DERIVED))
def derived_world(ctx: CheckContext):
    """Rank, world size, local rank and endpoint derived from srun / mpirun / PMI / jsrun / PyTorchJob variables."""
    launch = ctx.launch
    if not launch.derived and not launch.endpoint_problem:
        return
    derived = dict(launch.derived)
    # Title, detail and fix are the same on every rank, so rank 0's report shows one finding
    # for the whole world; each rank's own values are in its data.
    lines = [f"{var} <- {source.split('=', 1)[0] if var in _PER_RANK else source}" for var, source in launch.derived]
    if launch.endpoint_problem:
        yield ENDPOINT_NOT_DERIVED(
            f"{launch.title} started a multi-node world, but which host runs rank 0 is unknown",
            detail=f"{launch.endpoint_problem}. Every rank must connect to the store on rank 0's host; "
            "without MASTER_ADDR the world cannot form." + (f" Derived so far: {'; '.join(lines)}." if lines else ""),
            remediation=how_launcher_sets("MASTER_ADDR", launch).replace("<first host>", "<rank 0's host>")
            + " (MASTER_PORT is derived from the job ID unless you set it too)",
            data={"launcher": launch.launcher, "derived": derived, "problem": launch.endpoint_problem},
        )
        return
    exports = _EXPORT_FROM.get(launch.launcher, ())
    where = f"{launch.master_addr}:{launch.master_port.value}"
    yield WORLD_DERIVED(
        f"World of {launch.world_size.value} ranks from {launch.title}'s variables, endpoint {where}",
        detail="Derived because the processes have no torch variables of their own: " + "; ".join(lines) + ". "
        "distdoctor formed its world from these values. A training script that calls "
        "init_process_group() with the default env:// does not derive them: it needs them exported.",
        remediation=("accelerate derives them the same way (its scripts need no exports); a plain torch script "
                     if launch.accelerate else "In a plain torch script, ")
        + "export them before python starts"
        + (f" ({', '.join(exports)}, MASTER_ADDR={launch.master_addr}, MASTER_PORT={launch.master_port.value})" if exports else "")
        + ("" if launch.accelerate else ", or use a framework that derives them the same way (Lightning, accelerate)"),
        data={"launcher": launch.launcher, "derived": derived, "rank": launch.rank.value,
              "world_size": launch.world_size.value, "local_rank": launch.local_rank.value,
              "local_world_size": launch.local_world_size.value, "master_addr": launch.master_addr,
              "master_port": launch.master_port.value},
    )


ACCELERATE_ONE_PROCESS = finding_kind(
    "launch.E014",
    cause="launcher_misuse",
    title="accelerate launch started one process, not a multi-process world",
    hint="Use --multi_gpu (torchrun underneath, also on CPU-only nodes) or --cpu --mpirun_hostfile",
)


@check(stage="local", tags=("launch", "accelerate"), emits=(ACCELERATE_ONE_PROCESS,))
def accelerate_single_process(ctx: CheckContext):
    """accelerate launch --num_processes N (N > 1) in its simple mode: --cpu without --mpirun_hostfile, or no --multi_gpu."""
    if ctx.launch.launcher != ACCELERATE_SINGLE:
        return
    cpu = ctx.launch.accelerate == "cpu"
    mode = "--cpu mode runs the script once, in one process, unless --mpirun_hostfile is given" if cpu else (
        "simple mode (no --multi_gpu, --cpu --mpirun_hostfile, --use_deepspeed or --use_fsdp) runs the script once, in one process")
    where = f"{ctx.env.get('MASTER_ADDR')}:{ctx.env.get('MASTER_PORT')}"
    yield ACCELERATE_ONE_PROCESS(
        "accelerate launch " + ("--cpu " if cpu else "") + "started a single process, although --num_processes asked for more",
        detail=f"accelerate's {mode}; it still sets MASTER_ADDR:MASTER_PORT ({where}) because --num_processes > 1, "
        "but no RANK or WORLD_SIZE. The script trains alone (accelerate's state: one process, no distributed "
        "backend): N times slower than intended, and nothing is synchronised.",
        remediation="For N processes on this node: accelerate launch --multi_gpu --num_processes N script.py "
        "(accelerate starts them with torchrun, with gloo on CPU-only nodes)"
        + ("; or accelerate launch --cpu --mpirun_hostfile HOSTFILE --num_processes N script.py (HOSTFILE: "
           "'localhost slots=N'; needs Open MPI or Intel MPI)" if cpu else ""),
        data={"mode": ctx.launch.accelerate, "master_addr": ctx.env.get("MASTER_ADDR"), "master_port": ctx.env.get("MASTER_PORT")},
    )


LAUNCH_LINE = finding_kind(
    "launch.I013",
    cause="env_missing",
    title="The launch line was checked before it runs",
    hint="The findings beside it are what the launcher would hang or fail on",
)


def _plan_text(launch: LaunchInfo) -> str:
    plan = launch.planned
    size, local = launch.world_size.value, launch.local_world_size.value
    parts = [f"a world of {size if size is not None else '?'} ranks, {local if local is not None else '?'} on this node"]
    if launch.master_addr and launch.master_port.value:
        torchrun = plan if plan.launcher == TORCHRUN else plan.inner
        backend = f" ({torchrun.rdzv_backend} rendezvous)" if torchrun else ""
        parts.append(f"rendezvous at {launch.master_addr}:{launch.master_port.value}{backend}")
    elif launch.master_addr:
        parts.append(f"rendezvous on {launch.master_addr}, port chosen at launch")
    return ", ".join(parts)


@check(stage="local", tags=("launch",), emits=(LAUNCH_LINE,))
def launch_line(ctx: CheckContext):
    """`distdoctor check -- <launch line>`: the world the line will form, checked before it runs."""
    launch = ctx.launch
    if launch.planned is None:
        return
    yield LAUNCH_LINE(
        f"{launch.planned.command} will start {_plan_text(launch)}",
        detail=f"Read from the launch line `{launch.planned.line}`. RANK, WORLD_SIZE and LOCAL_RANK are "
        "set by the launcher for each worker, so they are not checked here; the endpoint, the port, "
        "the interfaces, GPUs and CPUs for this many local ranks are.",
        remediation="Fix the findings beside this one before starting the launcher; once the job "
        "runs, `distdoctor check` under the same launcher checks the world itself",
        data={"line": launch.planned.line, "world_size": launch.world_size.value,
              "local_world_size": launch.local_world_size.value, "master_addr": launch.master_addr,
              "master_port": launch.master_port.value},
    )


@check(stage="local", tags=("launch", "env"), emits=(ENV_MISSING, ENV_INVALID))
def rendezvous_env(ctx: CheckContext):
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: present and usable."""
    launch = ctx.launch
    if launch.launcher in (NONE, ACCELERATE_SINGLE) or launch.planned is not None:
        # A plain process: nothing claims a world (the self-test world supplies one). A launch
        # line checked before it runs: the launcher has not set these yet.
        return

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
        if var == "MASTER_ADDR" and launch.endpoint_problem:
            continue  # launch.C012 names what to export for a multi-node world
        if not present:
            yield ENV_MISSING(
                f"{var} is not set (started by {launch.title})",
                detail=f"torch's env:// rendezvous reads {var}; init_process_group will fail with "
                f"\"environment variable {var} expected, but not set\".",
                remediation=how_launcher_sets(var, launch),
                data={"variable": var, "launcher": launch.launcher},
            )
    if launch.node_rank is not None and launch.node_rank.name == "NODE_RANK":
        int_vars["NODE_RANK"] = launch.node_rank
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


# -- launcher misuse ---------------------------------------------------------------------------

DEPRECATED_LAUNCHER = finding_kind(
    "launch.W003",
    cause="launcher_misuse",
    title="Started by the deprecated torch.distributed.launch",
    hint="Use torchrun and read LOCAL_RANK from the environment",
)
NESTED_LAUNCHER = finding_kind(
    "launch.E004",
    cause="launcher_misuse",
    title="torchrun runs inside a multi-task scheduler step and spawns every rank twice over",
    hint="Run one torchrun per node (srun --ntasks-per-node=1), or drop torchrun and let the scheduler start the ranks",
)
SCHEDULER_DISAGREES = finding_kind(
    "launch.E005",
    cause="rank_config_error",
    title="The scheduler's view of the world disagrees with RANK / WORLD_SIZE",
    hint="Derive RANK, WORLD_SIZE and LOCAL_RANK from the scheduler's variables",
)
RESTARTED = finding_kind(
    "launch.W006",
    cause="unknown",
    title="torchelastic restarted the workers after a failure",
    hint="Read the previous attempt's error file and logs; a restart hides the first failure",
)
INIT_METHOD_INVALID = finding_kind(
    "launch.C007",
    cause="env_invalid",
    title="The init_method cannot be used",
    hint="Use env://, tcp://HOST:PORT or file:///absolute/path/on/a/shared/filesystem",
)
INIT_FILE_LEFT_OVER = finding_kind(
    "launch.E008",
    cause="env_invalid",
    title="The file:// rendezvous file is left over from an earlier run",
    hint="Delete the file, or use a new file name for every run",
)
INIT_FILE_NOT_SHARED = finding_kind(
    "launch.E009",
    cause="env_invalid",
    title="The file:// rendezvous file is on a filesystem the other nodes cannot see",
    hint="Put the file on a shared filesystem (NFS, Lustre, GPFS...) or use tcp:// / env://",
)
INIT_FILE_UNKNOWN_FS = finding_kind(
    "launch.I010",
    cause="env_invalid",
    title="Could not tell whether the file:// rendezvous file is shared between nodes",
    hint="Make sure every node sees the same file (a shared filesystem)",
)


def _launch_flavour(ctx: CheckContext) -> str:
    """How torchrun would be started here, for remediations."""
    return "python -m torch.distributed.launch" if ctx.launch.launcher == DEPRECATED_LAUNCH else "torchrun"


@check(stage="local", tags=("launch",), emits=(DEPRECATED_LAUNCHER,))
def deprecated_launcher(ctx: CheckContext):
    """python -m torch.distributed.launch: --local-rank in argv instead of LOCAL_RANK in env."""

    if ctx.launch.launcher != DEPRECATED_LAUNCH:
        return
    flag = local_rank_flag(ctx.argv) or "--local-rank"
    no_env = "LOCAL_RANK" not in ctx.env
    underscore = flag.startswith("--local_rank")
    detail = (
        f"The script received {flag!r} on its command line. torch.distributed.launch is deprecated "
        "(torch prints a FutureWarning) and will be removed; torch >= 2.0 passes '--local-rank' "
        "with a hyphen, so scripts whose argparse declares only '--local_rank' fail with "
        "'unrecognized arguments'."
    )
    if no_env:
        detail += " LOCAL_RANK is not in the environment, so code that reads os.environ['LOCAL_RANK'] fails."
    yield DEPRECATED_LAUNCHER(
        "Started by the deprecated torch.distributed.launch (" + flag + " in argv"
        + (", no LOCAL_RANK in env)" if no_env else ")"),
        detail=detail,
        remediation=(
            "Replace `python -m torch.distributed.launch --nproc_per_node=N script.py` with "
            "`torchrun --nproc-per-node=N script.py` and read the local rank with "
            "int(os.environ['LOCAL_RANK']); until then accept both spellings: "
            "parser.add_argument('--local-rank', '--local_rank', type=int, default=int(os.environ.get('LOCAL_RANK', 0)))"
        ),
        data={"argument": flag, "local_rank_in_env": not no_env, "underscore_form": underscore},
    )


# The variables that tell how a scheduler spread its tasks over nodes.
_LAYOUT_VARS = {SLURM: "SLURM_NNODES, SLURM_TASKS_PER_NODE", OPENMPI: "OMPI_COMM_WORLD_LOCAL_SIZE",
                MPICH: "MPI_LOCALNRANKS"}


def _elastic(ctx: CheckContext) -> bool:
    return ctx.launch.launcher in (TORCHRUN, DEPRECATED_LAUNCH) or TORCHRUN in ctx.launch.also_present


@check(stage="local", tags=("launch", "slurm", "mpi"), emits=(NESTED_LAUNCHER, SCHEDULER_DISAGREES))
def scheduler_consistency(ctx: CheckContext):
    """torchrun inside a multi-task srun/mpirun; the scheduler's task count vs WORLD_SIZE."""
    launch = ctx.launch
    schedulers = {launch.launcher, *launch.also_present} & {SLURM, OPENMPI, MPICH}
    if not schedulers:
        return
    scheduler = sorted(schedulers)[0]
    per_node = launch.scheduler_local_size.value if launch.scheduler_local_size else None
    nodes = launch.scheduler_nodes.value if launch.scheduler_nodes else None
    tasks = launch.scheduler_size.value if launch.scheduler_size else None
    if _elastic(ctx):
        yield from _nested_launcher(scheduler, per_node, nodes, tasks)
        return
    # The scheduler starts the ranks itself: its numbers must be torch's numbers.
    size = launch.world_size.value
    if tasks is not None and size is not None and tasks != size:
        var = launch.scheduler_size.name if launch.scheduler_size else "the task count"
        yield SCHEDULER_DISAGREES(
            f"WORLD_SIZE={size} but {var}={tasks}",
            detail=(
                f"{scheduler} started {tasks} task(s) but WORLD_SIZE says {size}: the rendezvous "
                + ("waits for ranks that do not exist until it times out." if size > tasks else "gets more ranks than it expects and fails.")
            ),
            remediation=how_launcher_sets("WORLD_SIZE", launch),
            data={"scheduler": scheduler, "world_size": size, "tasks": tasks},
        )
    rank = launch.rank.value
    srank = launch.scheduler_rank.value if launch.scheduler_rank else None
    if rank is not None and srank is not None and rank != srank:
        var = launch.scheduler_rank.name
        yield SCHEDULER_DISAGREES(
            f"RANK={rank} but {var}={srank}",
            detail="When the scheduler starts the ranks, RANK must be its task id; otherwise two tasks can claim the same rank.",
            remediation=how_launcher_sets("RANK", launch),
            data={"scheduler": scheduler, "rank": rank, "scheduler_rank": srank},
        )
    local = launch.local_rank.value
    slocal = launch.scheduler_local_rank.value if launch.scheduler_local_rank else None
    if local is not None and slocal is not None and local != slocal:
        var = launch.scheduler_local_rank.name
        yield SCHEDULER_DISAGREES(
            f"LOCAL_RANK={local} but {var}={slocal}",
            detail="Two tasks on one node may pick the same GPU (LOCAL_RANK) while another GPU stays idle.",
            remediation=how_launcher_sets("LOCAL_RANK", launch),
            data={"scheduler": scheduler, "local_rank": local, "scheduler_local_rank": slocal},
        )

def _nested_launcher(scheduler: str, per_node: int | None, nodes: int | None, tasks: int | None):
    """torchrun started by every task of a multi-task srun / mpirun (from the environment alone)."""
    doubled = (per_node is not None and per_node > 1) or (
        per_node is None and tasks is not None and nodes is not None and tasks > nodes
    )
    # Only the task count is known (no node count, no tasks per node): several tasks each
    # running torchrun is the misuse unless every task has a node of its own, said below.
    unspread = per_node is None and nodes is None and tasks is not None and tasks > 1
    if doubled or unspread:
        where = (f"{per_node} tasks per node" if per_node else
                 f"{tasks} tasks on {nodes} node(s)" if nodes else f"{tasks} tasks")
        fix = (
            "srun --nodes=N --ntasks-per-node=1 torchrun --nnodes=N --nproc-per-node=G "
            "--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:29500 script.py; or drop torchrun: "
            "srun --ntasks-per-node=G python script.py with RANK=$SLURM_PROCID, "
            "LOCAL_RANK=$SLURM_LOCALID, WORLD_SIZE=$SLURM_NTASKS"
            if scheduler == SLURM
            else "mpirun -np N --map-by ppr:1:node torchrun --nproc-per-node=G ...; or drop torchrun and "
            "map OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK to RANK / WORLD_SIZE / LOCAL_RANK"
        )
        yield NESTED_LAUNCHER(
            f"torchrun runs inside {scheduler} with {where}: every task starts its own torchrun",
            detail=(
                f"The scheduler started {where}, and each of them ran torchrun, which starts "
                "--nproc-per-node workers of its own: the node gets (tasks x nproc) workers. "
                "Single-node torchruns (torch 2.x, no --rdzv-endpoint) each pick a free port and "
                "form separate worlds that never meet: every world has its own rank 0, trains "
                "its own copy of the job on the same GPUs, and their checkpoints and logs "
                "overwrite each other. With a shared --rdzv-endpoint they join one rendezvous "
                "instead, which waits for (or rejects) the extra agents."
                + (f" The environment does not say how the {tasks} tasks are spread over nodes "
                   f"({_LAYOUT_VARS.get(scheduler, 'the tasks-per-node variable')} unset): only if each task "
                   "runs on a node of its own is this the right layout." if unspread else "")
            ),
            remediation=fix,
            data={"scheduler": scheduler, "tasks_per_node": per_node, "nodes": nodes, "tasks": tasks,
                  "layout_known": not unspread},
        )


# -- torchelastic restarts --------------------------------------------------------------------

_ERROR_FILE_LIMIT = 64 * 1024


def previous_error_files(error_file: str, restart_count: int) -> list[str]:
    """Where the last failed attempt wrote its error: torchelastic keeps one directory per
    attempt (<log_dir>/<run_id>/attempt_<n>/<local_rank>/error.json) and points
    TORCHELASTIC_ERROR_FILE at the current attempt's."""

    candidates = []
    match = re.search(r"([/\\])attempt_(\d+)([/\\])", error_file)
    if match and restart_count > 0:
        previous = int(match.group(2)) - 1
        if previous >= 0:
            candidates.append(error_file[: match.start()] + f"{match.group(1)}attempt_{previous}{match.group(3)}" + error_file[match.end():])
    candidates.append(error_file)
    return candidates


def summarize_error_file(text: str) -> tuple[str, str | None]:
    """(one-line message, timestamp) from a torchelastic error.json; tolerant of garbage."""

    try:
        data = json.loads(text)
    except ValueError:
        line = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
        return (f"(not JSON) {line[:300]}" if line else "(empty or unreadable)"), None
    message: object = data.get("message") if isinstance(data, dict) else data
    timestamp = None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        if isinstance(extra, dict) and extra.get("timestamp") is not None:
            timestamp = str(extra.get("timestamp"))
        message = message.get("message", message)
    text_message = str(message)
    lines = [ln.strip() for ln in text_message.splitlines() if ln.strip()]
    summary = lines[-1] if lines else "(no message)"
    if len(lines) > 1 and not summary.startswith(lines[0].split(":", 1)[0]):
        summary = f"{lines[0][:150]} ... {summary}"
    return summary[:400], timestamp


@check(stage="local", tags=("launch", "torchrun"), emits=(RESTARTED,))
def elastic_restarts(ctx: CheckContext):
    """A torchelastic restart count above 0, with what the last failure's error file says."""
    count = ctx.launch.restart_count
    if not count or count <= 0:
        return
    error_file = ctx.env.get("TORCHELASTIC_ERROR_FILE")
    said = "no TORCHELASTIC_ERROR_FILE is set, so the failure's error file is unknown"
    data: dict = {"restart_count": count, "error_file": None}
    if error_file:
        reasons = []
        for path in previous_error_files(error_file, count):
            text = ctx.probes.read_text(path, _ERROR_FILE_LIMIT)
            if isinstance(text, str):
                summary, timestamp = summarize_error_file(text)
                said = f"{path} says: {summary}" + (f" (timestamp {timestamp})" if timestamp else "")
                data.update(error_file=path, message=summary, timestamp=timestamp)
                break
            reasons.append(f"{path}: {text}")
        else:
            said = "the failed attempt left no readable error file (" + "; ".join(reasons) + "); the worker may have been killed (OOM, signal) before writing one"
    yield RESTARTED(
        f"This is restart {count} of the workers: an earlier attempt failed",
        detail=f"torchelastic restarts all workers when one fails (--max-restarts). The last failure: {said}.",
        remediation=(
            "Fix the first failure rather than relying on restarts: read the error above and the "
            "previous attempt's logs (torchrun --log-dir DIR keeps attempt_<n>/<rank>/ stdout, stderr "
            "and error.json; decorate main() with torch.distributed.elastic.multiprocessing.errors.record "
            "so the error file has the traceback), or run `distdoctor explain <log>`"
        ),
        data=data,
    )


# -- init_method ------------------------------------------------------------------------------

# Filesystems that only this host sees. A file:// rendezvous on them never meets the other nodes.
_LOCAL_FILESYSTEMS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs", "devtmpfs", "squashfs", "vfat", "aufs"}
_SHARED_FILESYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.", "9p", "wekafs", "panfs", "virtiofs")


def _torch_pg_initialized() -> bool:
    """Whether this process already joined a process group (preflight after init)."""

    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist and dist.is_available() and dist.is_initialized())
    except Exception:
        return False


@check(stage="local", tags=("launch", "env"), emits=(INIT_METHOD_INVALID, INIT_FILE_LEFT_OVER, INIT_FILE_NOT_SHARED, INIT_FILE_UNKNOWN_FS))
def init_method(ctx: CheckContext):
    """The job's init_method (--init-method): env://, tcp://, file://, mpi:// validated."""

    method = from_config(ctx.config)
    if method is None:
        return
    setting = setting_label(ctx.config)
    fix_hint = "init_process_group(backend, init_method=...)"
    if method.problem:
        yield INIT_METHOD_INVALID(
            f"init_method {method.raw!r} cannot be used: {method.problem}",
            detail=f"init_process_group raises before any rank connects ({setting}).",
            remediation=f"Pass a valid URL to {fix_hint}: env:// (with MASTER_ADDR/MASTER_PORT), "
            "tcp://<rank 0 host>:<free port>, or file:///<path on a filesystem every node shares>",
            data={"init_method": method.raw, "problem": method.problem},
        )
        return
    if method.scheme == "mpi":
        if ctx.backend != "mpi":
            yield INIT_METHOD_INVALID(
                f"init_method 'mpi://' with backend {ctx.backend!r}",
                detail="torch has no mpi:// rendezvous handler; only backend='mpi' ignores init_method (MPI itself is the rendezvous).",
                remediation="Use backend='mpi' under mpirun (needs a torch built with MPI), or init_method='env://' for other backends",
                data={"init_method": method.raw, "backend": ctx.backend},
            )
        return
    if method.scheme != "file" or not method.path:
        return

    path = method.path
    parent = posixpath.dirname(path) or "/"
    if ctx.probes.exists(parent) is not True:
        yield INIT_METHOD_INVALID(
            f"The directory of the file:// rendezvous file does not exist: {parent}",
            detail=f"FileStore cannot create {path}; init_process_group fails on every rank.",
            remediation=f"mkdir -p {parent} on a shared filesystem, or point file:// at an existing shared directory",
            data={"init_method": method.raw, "path": path},
        )
        return
    if ctx.probes.exists(path) is True and not _torch_pg_initialized():
        content = ctx.probes.read_text(path, 1)
        if not isinstance(content, str) or content:
            yield INIT_FILE_LEFT_OVER(
                f"The file:// rendezvous file {path} already exists and is not empty",
                detail="torch's FileStore needs a new (or empty) file for every run: a file left by an "
                "earlier run carries its keys and rank counters, and the new rendezvous hangs or fails.",
                remediation=f"rm -f {path} before starting the job, or include the job id in the name "
                "(e.g. file:///shared/rdzv_$SLURM_JOB_ID)",
                data={"init_method": method.raw, "path": path},
            )
    multi = multi_host(ctx)
    if not multi:
        return
    fs = ctx.probes.filesystem_type(parent)
    if not isinstance(fs, str):
        yield INIT_FILE_UNKNOWN_FS(
            f"Could not tell whether {parent} is shared between nodes: {fs}",
            remediation="Make sure every node sees the same file at that path (a shared filesystem), or use env:// / tcp://",
            data={"init_method": method.raw, "path": path},
        )
    elif fs in _LOCAL_FILESYSTEMS:
        yield INIT_FILE_NOT_SHARED(
            f"The file:// rendezvous file is on a local {fs} filesystem in a multi-node job",
            detail=f"{parent} is {fs}: each node sees its own copy of {path}, so ranks on different "
            "nodes never meet and the rendezvous waits until it times out.",
            remediation="Use a path on a shared filesystem (NFS, Lustre, GPFS...), or env:// with MASTER_ADDR/MASTER_PORT",
            data={"init_method": method.raw, "path": path, "filesystem": fs},
        )
    elif not fs.startswith(_SHARED_FILESYSTEMS):
        yield INIT_FILE_UNKNOWN_FS(
            f"Could not tell whether {parent} ({fs}) is shared between nodes",
            remediation="Make sure every node sees the same file at that path, or use env:// / tcp://",
            data={"init_method": method.raw, "path": path, "filesystem": fs},
        )
