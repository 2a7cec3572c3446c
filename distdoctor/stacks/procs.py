"""The processes of torch.distributed jobs on this node, found from their environment and parents, grouped by job."""

# A rank is a process whose environment describes one (RANK / LOCAL_RANK / WORLD_SIZE /
# TORCHELASTIC_*, or a launcher's own variables: SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK, read
# by machine.launchers.detect), or a child of a launcher (torchrun, torch.distributed.run, srun,
# mpirun). Launchers themselves are not ranks, nor are a rank's own children (DataLoader workers,
# compile workers inherit its variables): a process whose ancestor carries the same job and rank
# is skipped. Only /proc is read (psutil); nothing is sent to any process.

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import psutil

from distdoctor.core.registry import finding_kind
from distdoctor.machine import launchers

_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_PROCID",
              "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
# Command lines of launchers (the process is not a rank; its children may be).
_LAUNCHER_WORDS = ("torch.distributed.run", "torch.distributed.launch", "torchrun", "srun", "mpirun",
                   "mpiexec", "orterun", "prterun", "slurmstepd", "orted", "prted", "hydra_pmi_proxy")
# The variables kept from a rank's environment (for the report and grouping; never secrets).
_KEPT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID",
         "OMPI_COMM_WORLD_RANK", "PMI_RANK", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_MAX_PROCESSES = 4096

NO_SUCH_PID = finding_kind(
    "stacks.E001", cause="unknown", title="A PID given to `distdoctor stacks` does not exist",
    hint="Give the PID of a rank or of its launcher (torchrun, srun, mpirun) on this node: `ps -ef | grep train.py`; run stacks on the node where the job runs")
NO_JOB = finding_kind(
    "stacks.W001", cause="unknown", title="No process of a torch.distributed job was found",
    hint="Run `distdoctor stacks` on a node where the job runs, as the job's user or root, or give its PIDs: `distdoctor stacks PID ...`")
SEVERAL_JOBS = finding_kind(
    "stacks.I001", cause="unknown", title="Several torch.distributed jobs run on this node; each is diagnosed on its own",
    hint="To look at one job only, give its launcher's PID or its ranks' PIDs: `distdoctor stacks PID ...`")


@dataclass(frozen=True)
class RankProcess:
    """One rank's process as /proc describes it (before its stack is read)."""

    pid: int
    rank: int | None
    local_rank: int | None = None
    world_size: int | None = None
    local_world_size: int | None = None
    launcher: str = launchers.NONE
    launcher_pid: int | None = None
    cmdline: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def job_key(self) -> str:
        """One job across its processes (and nodes): its endpoint and run id, else its launcher."""
        addr, port = self.env.get("MASTER_ADDR"), self.env.get("MASTER_PORT")
        run_id = self.env.get("TORCHELASTIC_RUN_ID")
        if addr and port:
            return f"{addr}:{port}" + (f" run {run_id}" if run_id and run_id != "none" else "")
        if self.env.get("SLURM_JOB_ID"):
            return f"slurm job {self.env['SLURM_JOB_ID']}.{self.env.get('SLURM_STEP_ID', '?')}"
        return f"launcher pid {self.launcher_pid}" if self.launcher_pid else f"pid {self.pid}"


@dataclass
class Discovery:
    """The jobs found (job key -> its ranks' processes) and what could not be looked at."""

    jobs: dict[str, list[RankProcess]] = field(default_factory=dict)
    findings: list = field(default_factory=list)
    # Jobs of which the user named single ranks: the ranks not named are not looked for.
    picked: set[str] = field(default_factory=set)


def _environ(proc: psutil.Process) -> dict[str, str] | None:
    try:
        return proc.environ()
    except (psutil.Error, OSError):
        return None  # another user's process, or gone: its variables are not readable


def _why_no_environ(proc: psutil.Process) -> str:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return "it has ended (a zombie): its environment is gone, so its rank is not known"
    except psutil.Error:
        pass
    return "its environment is not readable (another user's process?), so its rank is not known"


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.Error, OSError):
        return []


def is_launcher(cmdline: Sequence[str]) -> bool:
    """torchrun, `python -m torch.distributed.run`, srun, mpirun and their daemons."""
    words = [os.path.basename(w) for w in cmdline[:4]]
    return any(w in _LAUNCHER_WORDS for w in words)


def describes_rank(env: Mapping[str, str]) -> bool:
    return any(name in env for name in _RANK_VARS)


def _own_lineage() -> set[int]:
    """This process and its ancestors (`distdoctor stacks` under srun carries the job's variables)."""
    pids, proc = set(), psutil.Process()
    try:
        while proc is not None and len(pids) < 64:
            pids.add(proc.pid)
            proc = proc.parent()
    except psutil.Error:
        pass
    return pids


def _launcher_of(proc: psutil.Process) -> int | None:
    try:
        parent = proc.parent()
        return parent.pid if parent is not None and is_launcher(_cmdline(parent)) else None
    except psutil.Error:
        return None


def rank_process(proc: psutil.Process, env: Mapping[str, str] | None, notes: Iterable[str] = ()) -> RankProcess:
    """A process as a rank: its rank and world from its variables (any launcher's)."""
    cmd = _cmdline(proc)
    kept = {k: env[k] for k in _KEPT if env and k in env}
    info = launchers.detect(env or {}, cmd)
    return RankProcess(pid=proc.pid, rank=info.rank.value, local_rank=info.local_rank.value,
                       world_size=info.world_size.value, local_world_size=info.local_world_size.value,
                       launcher=info.launcher, launcher_pid=_launcher_of(proc), cmdline=" ".join(cmd)[:300],
                       env=kept, notes=tuple(notes))


def _ranks_below(root: psutil.Process, skip: set[int]) -> list[RankProcess]:
    """The ranks among a launcher's descendants (the outermost process of each rank)."""
    found: list[RankProcess] = []
    try:
        children = root.children()
    except psutil.Error:
        return found
    for child in children:
        if child.pid in skip:
            continue
        env = _environ(child)
        if env is None:
            continue  # a zombie (see ended_siblings) or another user's process
        if describes_rank(env) and not is_launcher(_cmdline(child)):
            found.append(rank_process(child, env))
        else:
            found += _ranks_below(child, skip)  # a wrapper (a shell, a nested launcher): look inside
    return found


def _zombies(parent_pid: int) -> list[int]:
    try:
        return sorted(c.pid for c in psutil.Process(parent_pid).children() if c.status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return []


def ended_siblings(ranks: Sequence[RankProcess]) -> list[RankProcess]:
    """A launcher's children that ended and were not reaped yet (zombies), as ranks.

    A zombie's environment is gone, so its rank is told by elimination: the local ranks its live
    siblings do not hold. torchrun starts local ranks in order, so several zombies are matched to
    the missing local ranks in PID order, and the note says so."""
    found: list[RankProcess] = []
    by_launcher: dict[int, list[RankProcess]] = {}
    for rank in ranks:
        if rank.launcher_pid is not None:
            by_launcher.setdefault(rank.launcher_pid, []).append(rank)
    for launcher_pid, live in by_launcher.items():
        zombies = [z for z in _zombies(launcher_pid) if z not in {r.pid for r in ranks}]
        model = live[0]
        if not zombies or model.local_world_size is None or model.local_rank is None or model.rank is None:
            continue
        base = model.rank - model.local_rank
        missing = sorted(set(range(model.local_world_size)) - {r.local_rank for r in live})
        how = ("the only local rank with no live process" if len(zombies) == len(missing) == 1 else
               "told from the local ranks with no live process, in PID order (the launcher starts them in order)")
        for pid, local in zip(zombies, missing):
            found.append(RankProcess(pid=pid, rank=base + local, local_rank=local, world_size=model.world_size,
                                     local_world_size=model.local_world_size, launcher=model.launcher,
                                     launcher_pid=launcher_pid, env=model.env,
                                     notes=(f"an ended child of launcher {launcher_pid}; its rank is {how}",)))
    return found


def _is_rank_child(proc: psutil.Process, key: tuple, candidates: Mapping[int, tuple]) -> bool:
    """True when an ancestor is a rank of the same job with the same rank (a DataLoader worker)."""
    try:
        return any(candidates.get(p.pid) == key for p in proc.parents()[:8])
    except psutil.Error:
        return False


def scan_node(job_filter: Mapping[str, str] | None = None) -> list[RankProcess]:
    """Every rank process on this node (optionally only those whose variables match job_filter)."""
    skip = _own_lineage()
    candidates: dict[int, tuple] = {}
    procs: dict[int, tuple[psutil.Process, RankProcess]] = {}
    for proc in list(psutil.process_iter())[:_MAX_PROCESSES * 4]:
        if proc.pid in skip:
            continue
        env = _environ(proc)
        if env is None or not describes_rank(env) or is_launcher(_cmdline(proc)):
            continue
        if job_filter and any(env.get(k) != v for k, v in job_filter.items()):
            continue
        rank = rank_process(proc, env)
        candidates[proc.pid] = (rank.job_key, rank.rank)
        procs[proc.pid] = (proc, rank)
        if len(procs) >= _MAX_PROCESSES:
            break
    ranks = [rank for pid, (proc, rank) in sorted(procs.items()) if not _is_rank_child(proc, candidates[pid], candidates)]
    return ranks + ended_siblings(ranks)


def from_pids(pids: Sequence[int]) -> tuple[list[RankProcess], list, set[int]]:
    """The ranks the given PIDs name (a launcher's ranks, or the processes themselves), the
    findings for PIDs that are not there, and which PIDs were named one by one."""
    ranks: list[RankProcess] = []
    findings = []
    by_hand: set[int] = set()
    skip = _own_lineage()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            proc.status()
        except (psutil.NoSuchProcess, ValueError):
            findings.append(NO_SUCH_PID(f"PID {pid} does not exist on this node",
                                        detail=f"no process {pid} in /proc: it ended, or it runs on another node or in another PID namespace (a container)",
                                        data={"pid": pid}))
            continue
        except psutil.Error:
            pass  # it exists; what it is will be told when its stack is read
        env = _environ(proc)
        if is_launcher(_cmdline(proc)):
            below = _ranks_below(proc, skip)
            below += ended_siblings(below)
            ranks += below
            if not below:
                findings.append(NO_JOB(f"PID {pid} is a launcher with no rank process below it",
                                       detail=f"{' '.join(_cmdline(proc))[:200]}: its workers have not started yet, or ended",
                                       data={"pid": pid}))
        else:
            notes = [] if env is not None else [_why_no_environ(proc)]
            if env is not None and not describes_rank(env):
                notes.append("no rank variables in its environment")
            ranks.append(rank_process(proc, env, notes))
            by_hand.add(pid)
    return ranks, findings, by_hand


def group_jobs(ranks: Iterable[RankProcess], *, by_pid: bool) -> dict[str, list[RankProcess]]:
    """Job key -> ranks, each job's ranks sorted. PIDs given by hand with no job variables are one
    job (the user said so)."""
    jobs: dict[str, list[RankProcess]] = {}
    unique = {r.pid: r for r in ranks}.values()
    for rank in unique:
        loose = by_pid and not (rank.env.get("MASTER_PORT") or rank.env.get("SLURM_JOB_ID") or rank.launcher_pid)
        jobs.setdefault("the PIDs given" if loose else rank.job_key, []).append(rank)
    for members in jobs.values():
        members.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.pid))
    return jobs


def discover(pids: Sequence[int] = (), job_filter: Mapping[str, str] | None = None) -> Discovery:
    """The jobs to look at: the PIDs' (their launchers' ranks), or every job on this node."""
    found = Discovery()
    if pids:
        ranks, found.findings, by_hand = from_pids(pids)
        found.jobs = group_jobs(ranks, by_pid=True) if ranks else {}
        found.picked = {key for key, members in found.jobs.items() if any(m.pid in by_hand for m in members)}
        return found
    found.jobs = group_jobs(scan_node(job_filter), by_pid=False)
    if not found.jobs:
        where = f" of SLURM job {job_filter.get('SLURM_JOB_ID')}" if job_filter else ""
        found.findings.append(NO_JOB(
            f"No process of a torch.distributed job{where} on this node",
            detail="looked for processes with RANK / LOCAL_RANK / WORLD_SIZE / TORCHELASTIC_* or a launcher's variables "
                   "(SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK) in their environment; another user's processes are "
                   "visible only to root"))
    elif len(found.jobs) > 1:
        lines = [f"{key}: ranks {', '.join(str(r.rank) for r in members)} (PIDs {', '.join(str(r.pid) for r in members)})"
                 for key, members in found.jobs.items()]
        found.findings.append(SEVERAL_JOBS(f"{len(found.jobs)} torch.distributed jobs run on this node",
                                           detail="\n".join(lines), data={"jobs": list(found.jobs)}))
    return found
