"""`distdoctor stacks` on this node: find the jobs, read every rank several times, judge each job, one Report."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.report import Report, WorldSummary, build_report
from distdoctor.diagnosis import progress
from distdoctor.diagnosis.snapshot import UNKNOWN
from distdoctor.stacks import pyspy
from distdoctor.stacks.job import JobView, judge, renumber, verdict
from distdoctor.stacks.procs import Discovery, RankProcess, discover
from distdoctor.stacks.sampling import Sampler, Track
from distdoctor.stacks.snapshots import RankView

LAUNCHER = "stacks"
TIMEOUT_S = 10.0        # the reads of one `stacks` run, in all (--timeout)
INTERVAL_S = 0.5        # between two reads of one rank
MIN_LOOKS = 3           # reads of each rank before a verdict ...
SPAN_S = 1.0            # ... spanning at least this long (--span)
SETTLE_S = 1.0          # past the deadline, how long the reads still running may take to end
SLACK_S = 0.05          # reads started interval apart are timed by their threads: a little earlier or later


def settled(track: Track, span_s: float) -> bool:
    """Enough reads of this rank for a verdict: MIN_LOOKS over span_s, or its end."""
    reads = list(track.reads)
    if track.ended:
        return True
    if track.native_running:
        return False  # --native asked for C/C++ frames: its native read is still coming
    times = [r.time for r in reads if r.time is not None]
    return len(reads) >= MIN_LOOKS and bool(times) and times[-1] - times[0] >= span_s - SLACK_S


def _whole(members: Sequence[RankProcess]) -> tuple[int | None, bool]:
    """The job's world size and whether all its ranks run here (one node holds the whole job)."""
    sizes = {m.world_size for m in members if m.world_size is not None}
    local = {m.local_world_size for m in members if m.local_world_size is not None}
    world = sizes.pop() if len(sizes) == 1 else None
    return world, world is not None and local == {world}


def _rank_views(track: Track, host: str, span_s: float) -> tuple[RankView, list[RankView]]:
    """The rank's latest readable view (else its latest) and the reads a verdict rests on."""
    views = track.views(host)
    readable = [v for v in views if v.snapshot.status != UNKNOWN]
    latest = readable[-1] if readable else views[-1]
    window = progress.recent([v.snapshot for v in readable], min_looks=MIN_LOOKS, min_span_s=span_s - SLACK_S)
    return latest, readable[len(readable) - len(window):]


def job_view(key: str, members: Sequence[RankProcess], tracks: Sequence[Track], host: str, *,
             picked: bool, native: bool = False, span_s: float = SPAN_S) -> JobView:
    world, whole = _whole(members)
    pairs = [_rank_views(t, host, span_s) for t in tracks if t.reads]
    snaps = renumber([latest.snapshot for latest, _ in pairs])
    pid_rank = {s.pid: s.rank for s in snaps}
    threads = {pid_rank[v.snapshot.pid]: [t.to_dict() for t in v.threads] for v, _ in pairs if v.threads}
    history = {pid_rank[v.snapshot.pid]: [replace(w.snapshot, rank=pid_rank[v.snapshot.pid]) for w in window]
               for v, window in pairs if len(window) > 1}
    launchers = sorted({m.launcher for m in members})
    return JobView(key, snaps, threads, [v.finding for v, _ in pairs if v.finding is not None], world,
                   whole and not picked, ", ".join(launchers), [host],
                   {pid_rank[v.snapshot.pid]: v.seconds for v, _ in pairs}, native, history,
                   {pid_rank[t.proc.pid]: len(t.reads) for t in tracks if t.reads and t.proc.pid in pid_rank})


def _views(found: Discovery, sampler: Sampler, host: str, native: bool, span_s: float) -> list[JobView]:
    by_pid = {t.proc.pid: t for t in sampler.tracks}
    return [job_view(key, members, [by_pid[m.pid] for m in members], host, picked=key in found.picked,
                     native=native, span_s=span_s) for key, members in found.jobs.items()]


def _decided(found: Discovery, sampler: Sampler, host: str, native: bool, span_s: float) -> bool:
    if not all(settled(t, span_s) for t in sampler.tracks):
        return False
    return all(verdict(view).decided for view in _views(found, sampler, host, native, span_s))


def gather(pids: Sequence[int] = (), *, native: bool = False, timeout_s: float = TIMEOUT_S, span_s: float = SPAN_S,
           job_filter: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None) -> tuple[list[JobView], list[Finding]]:
    """This node's jobs, each rank read several times until the reads decide (or timeout_s in
    all); the findings about what could not be looked at."""
    started = time.monotonic()
    host = socket.gethostname()
    found: Discovery = discover(pids, job_filter)
    program = pyspy.find_pyspy(env)
    if program is None and found.jobs:
        path = (env if env is not None else os.environ).get("PATH", "")
        missing = pyspy.PYSPY_MISSING(detail=f"no `py-spy` in any directory of PATH ({path[:300]})", hosts=[host],
                                      data={"jobs": {k: [m.pid for m in v] for k, v in found.jobs.items()}})
        return [], [*found.findings, missing]
    members = [m for ranks in found.jobs.values() for m in ranks]
    deadline = started + timeout_s
    sampler = Sampler(members, native=native, pyspy_path=program or "py-spy", host=host, dump_timeout_s=timeout_s,
                      interval_s=INTERVAL_S)
    # A rank read enough waits for the others (fewer py-spy processes on a loaded node) until the
    # verdict over all of them is open: then every rank is read again.
    undecided = [False]

    def wanted(track: Track) -> bool:
        return undecided[0] or not settled(track, span_s)

    try:
        decided = False
        while members and time.monotonic() < deadline and not sampler.idle and not decided:
            if sampler.step(min(deadline, time.monotonic() + INTERVAL_S), deadline, wanted):
                decided = _decided(found, sampler, host, native, span_s)
                undecided[0] = not decided and all(settled(t, span_s) for t in sampler.tracks)
        if not decided:
            sampler.settle(SETTLE_S)  # reads still running were bounded by the deadline: collect them
        sampler.never_read(f"py-spy did not answer within --timeout ({timeout_s:g} s)")
    finally:
        sampler.close()
    return _views(found, sampler, host, native, span_s), found.findings


def assemble(jobs: Sequence[JobView], findings: Iterable[Finding], *, started: float, silence: Iterable[str] = (),
             extra: Mapping[str, Any] | None = None) -> Report:
    """Judge every job and build the one report (data.stacks holds every rank's snapshot and threads)."""
    out = list(findings)
    for view in jobs:
        out += judge(view, several=len(jobs) > 1)
    checks = [{"name": f"read rank {s.rank} (PID {s.pid})" + (f" on {s.host}" if s.host else "")
               + (f", {view.reads[s.rank]} times" if view.reads.get(s.rank, 1) > 1 else ""), "stage": "stacks",
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


def look(pids: Sequence[int] = (), *, native: bool = False, timeout_s: float = TIMEOUT_S, span_s: float = SPAN_S,
         silence: Iterable[str] = (), job_filter: Mapping[str, str] | None = None,
         env: Mapping[str, str] | None = None) -> Report:
    """Every job's ranks on this node (or the PIDs' jobs): read several times, grouped and diagnosed."""
    started = time.monotonic()
    jobs, findings = gather(pids, native=native, timeout_s=timeout_s, span_s=span_s, job_filter=job_filter, env=env)
    return assemble(jobs, findings, started=started, silence=silence, extra={"nodes": [socket.gethostname()]})
