"""`distdoctor stacks` on this node: find the jobs, read every rank at once, judge each job, one Report."""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Mapping, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.report import Report, WorldSummary, build_report
from distdoctor.stacks import pyspy
from distdoctor.stacks.job import JobView, judge, renumber
from distdoctor.stacks.procs import Discovery, RankProcess, discover
from distdoctor.diagnosis.snapshot import UNKNOWN
from distdoctor.stacks.proc_state import ProcState
from distdoctor.stacks.snapshots import RankView, build, read_rank

LAUNCHER = "stacks"
_MAX_PARALLEL = 16


def _read_all(ranks: Sequence[RankProcess], *, native: bool, pyspy_path: str, timeout_s: float,
              host: str) -> list[RankView]:
    """Every rank's stacks, read in parallel: one py-spy per rank, each bounded by timeout_s."""
    if not ranks:
        return []
    def one(rank: RankProcess) -> RankView:
        try:
            return read_rank(rank, native=native, pyspy_path=pyspy_path, timeout_s=timeout_s, host=host)
        except Exception as exc:  # one rank's surprise must not cost the others' report
            dump = pyspy.Dump(problem=pyspy.FAILED, message=f"{type(exc).__name__}: {exc}"[:300])
            return build(rank, dump, ProcState(UNKNOWN), native=native, host=host)

    with ThreadPoolExecutor(max_workers=min(_MAX_PARALLEL, len(ranks)), thread_name_prefix="distdoctor-pyspy") as pool:
        return list(pool.map(one, ranks))


def _whole(members: Sequence[RankProcess]) -> tuple[int | None, bool]:
    """The job's world size and whether all its ranks run here (one node holds the whole job)."""
    sizes = {m.world_size for m in members if m.world_size is not None}
    local = {m.local_world_size for m in members if m.local_world_size is not None}
    world = sizes.pop() if len(sizes) == 1 else None
    return world, world is not None and local == {world}


def job_view(key: str, members: Sequence[RankProcess], views: Sequence[RankView], host: str, *,
             picked: bool, native: bool = False) -> JobView:
    world, whole = _whole(members)
    snaps = renumber([v.snapshot for v in views])
    pid_rank = {s.pid: s.rank for s in snaps}
    threads = {pid_rank[v.snapshot.pid]: [t.to_dict() for t in v.threads] for v in views if v.threads}
    launchers = sorted({m.launcher for m in members})
    return JobView(key, snaps, threads, [v.finding for v in views if v.finding is not None], world,
                   whole and not picked, ", ".join(launchers), [host],
                   {pid_rank[v.snapshot.pid]: v.seconds for v in views}, native)


def gather(pids: Sequence[int] = (), *, native: bool = False, timeout_s: float = pyspy.DUMP_TIMEOUT_S,
           job_filter: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None) -> tuple[list[JobView], list[Finding]]:
    """This node's jobs, each rank read; the findings about what could not be looked at."""
    host = socket.gethostname()
    found: Discovery = discover(pids, job_filter)
    program = pyspy.find_pyspy(env)
    if program is None and found.jobs:
        path = (env if env is not None else os.environ).get("PATH", "")
        missing = pyspy.PYSPY_MISSING(detail=f"no `py-spy` in any directory of PATH ({path[:300]})", hosts=[host],
                                      data={"jobs": {k: [m.pid for m in v] for k, v in found.jobs.items()}})
        return [], [*found.findings, missing]
    jobs = []
    for key, members in found.jobs.items():
        views = _read_all(members, native=native, pyspy_path=program or "py-spy", timeout_s=timeout_s, host=host)
        jobs.append(job_view(key, members, views, host, picked=key in found.picked, native=native))
    return jobs, found.findings


def assemble(jobs: Sequence[JobView], findings: Iterable[Finding], *, started: float, silence: Iterable[str] = (),
             extra: Mapping[str, Any] | None = None) -> Report:
    """Judge every job and build the one report (data.stacks holds every rank's snapshot and threads)."""
    out = list(findings)
    for view in jobs:
        out += judge(view, several=len(jobs) > 1)
    checks = [{"name": f"read rank {s.rank} (PID {s.pid})" + (f" on {s.host}" if s.host else ""), "stage": "stacks",
               "status": "pass" if s.stack else "fail", "duration_s": round(view.read_s.get(s.rank, 0.0), 4),
               **({"reason": "; ".join(s.notes)[:300]} if s.notes else {})}
              for view in jobs for s in view.snapshots if s.pid is not None]
    sizes = {v.world_size for v in jobs}
    report = build_report(out, checks, world=WorldSummary(
        size=sizes.pop() if len(sizes) == 1 else None, launcher=LAUNCHER,
        ranks_reported=tuple(sorted({s.rank for v in jobs for s in v.snapshots if s.stack}))),
        duration_s=time.monotonic() - started, silence=silence)
    report.data = {"stacks": {"jobs": [v.to_dict() for v in jobs], **(extra or {})}}
    return report


def look(pids: Sequence[int] = (), *, native: bool = False, timeout_s: float = pyspy.DUMP_TIMEOUT_S,
         silence: Iterable[str] = (), job_filter: Mapping[str, str] | None = None,
         env: Mapping[str, str] | None = None) -> Report:
    """Every job's ranks on this node (or the PIDs' jobs): stacks read, grouped and diagnosed."""
    started = time.monotonic()
    jobs, findings = gather(pids, native=native, timeout_s=timeout_s, job_filter=job_filter, env=env)
    return assemble(jobs, findings, started=started, silence=silence, extra={"nodes": [socket.gethostname()]})
