"""One job as `stacks` saw it (its ranks' snapshots and threads, from one node or merged from all) and its findings."""

# The verdict across ranks is the shared diagnosis', over each rank's reads in time
# (diagnosis.progress.judge: a stall or a hang only from what stayed still across reads, "running"
# when every rank moved); what is added here is only what `stacks` itself knows: ranks with no
# process, the stack groups, ranks on nodes that were not looked at, ranks that ended without a
# verdict naming them.

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind
from distdoctor.core.rank_groups import ranks_label, said_alike
from distdoctor.core.report import format_ranks
from distdoctor.diagnosis import kinds as job_kinds
from distdoctor.diagnosis import progress
from distdoctor.diagnosis.snapshot import EXITED, KILLED, UNKNOWN, RankSnapshot
from distdoctor.stacks.grouping import stack_groups

PARTIAL = finding_kind(
    "stacks.W003", cause="unknown", title="The verdict covers only some ranks: others run on nodes not looked at, or could not be read",
    hint="Under SLURM: distdoctor stacks --slurm-job JOBID (every node, one report); elsewhere run distdoctor stacks on each node of the job")
ENDED = finding_kind(
    "stacks.W002", cause="unknown", title="A process given or found ended before its stack could be read",
    hint="Its launcher's log holds its exit status and last words; if the job goes on without it, its peers will hang in their next collective")


@dataclass
class JobView:
    key: str
    snapshots: list[RankSnapshot] = field(default_factory=list)
    threads: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    problems: list[Finding] = field(default_factory=list)
    world_size: int | None = None
    whole: bool = False            # every rank of the job was looked for (one node holds all, or every node)
    launcher: str = ""
    nodes: list[str] = field(default_factory=list)
    read_s: dict[int, float] = field(default_factory=dict)   # rank -> seconds py-spy took
    native: bool = False           # read with --native (C/C++ frames)
    # rank -> its reads judged, oldest first (the latest is in snapshots); empty: one read each
    history: dict[int, list[RankSnapshot]] = field(default_factory=dict)
    reads: dict[int, int] = field(default_factory=dict)      # rank -> how many times it was read

    def looks(self, rank: int) -> list[RankSnapshot]:
        """The rank's reads, oldest first (its latest snapshot alone when no history came)."""
        snap = next((s for s in self.snapshots if s.rank == rank), None)
        return list(self.history.get(rank) or ([snap] if snap else []))

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.key, "world_size": self.world_size, "whole": self.whole, "launcher": self.launcher,
                "nodes": list(self.nodes), "snapshots": [s.to_dict() for s in self.snapshots],
                "threads": {str(r): t for r, t in self.threads.items()},
                "problems": [f.to_dict() for f in self.problems],
                "read_s": {str(r): round(t, 4) for r, t in self.read_s.items()}, "native": self.native,
                "reads": {str(r): n for r, n in self.reads.items()},
                "history": {str(r): [_compact(s) for s in looks] for r, looks in self.history.items()}}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "JobView":
        """From another node's JSON report; malformed parts are dropped, never raised."""
        snaps = [s for s in (RankSnapshot.from_dict(x) for x in raw.get("snapshots") or []) if s]
        threads = {}
        for rank, value in (raw.get("threads") or {}).items():
            if str(rank).lstrip("-").isdigit() and isinstance(value, list):
                threads[int(rank)] = value
        problems = []
        for item in raw.get("problems") or []:
            try:
                problems.append(Finding.from_dict(item))
            except (KeyError, ValueError, TypeError):
                continue
        world = raw.get("world_size")
        read_s = {int(r): float(t) for r, t in _mapping(raw.get("read_s")).items()
                  if str(r).lstrip("-").isdigit() and isinstance(t, (int, float))}
        reads = {int(r): n for r, n in _mapping(raw.get("reads")).items()
                 if str(r).lstrip("-").isdigit() and isinstance(n, int) and not isinstance(n, bool)}
        history = {}
        for rank, looks in _mapping(raw.get("history")).items():
            if str(rank).lstrip("-").isdigit() and isinstance(looks, list):
                history[int(rank)] = [s for s in (RankSnapshot.from_dict(x) for x in looks[:progress_window()]) if s]
        return cls(str(raw.get("job") or "?"), snaps, threads, problems,
                   world if isinstance(world, int) and not isinstance(world, bool) else None, False,
                   str(raw.get("launcher") or ""), [str(n) for n in raw.get("nodes") or []], read_s,
                   raw.get("native") is True, history, reads)


def _mapping(value: Any) -> Mapping[Any, Any]:
    return value if isinstance(value, Mapping) else {}


def progress_window() -> int:
    """The most reads per rank a report carries (the window a verdict rests on is shorter)."""
    return 16


def _compact(snap: RankSnapshot) -> dict[str, Any]:
    """A read in the history: everything but the notes the latest snapshot already carries."""
    out = snap.to_dict()
    out["notes"] = []
    return out


def merge(views: list[JobView], *, whole: bool) -> JobView:
    """One job seen from several nodes: their ranks together."""
    first = views[0]
    merged = JobView(first.key, world_size=first.world_size, whole=whole, launcher=first.launcher,
                     native=all(v.native for v in views))
    seen: set[int] = set()
    for view in views:
        for snap in view.snapshots:
            if snap.rank not in seen:
                seen.add(snap.rank)
                merged.snapshots.append(snap)
        merged.threads.update(view.threads)
        merged.read_s.update(view.read_s)
        merged.history.update(view.history)
        merged.reads.update(view.reads)
        merged.problems += view.problems
        merged.nodes += [n for n in view.nodes if n not in merged.nodes]
        merged.world_size = merged.world_size or view.world_size
    merged.snapshots.sort(key=lambda s: s.rank)
    return merged


def _absent(view: JobView) -> list[RankSnapshot]:
    """Ranks of a job looked for everywhere with no process anywhere: they ended (or never started)."""
    if not view.whole or not view.world_size:
        return []
    present = {s.rank for s in view.snapshots}
    where = "this node" if len(view.nodes) <= 1 else "any node of the job"
    return [RankSnapshot(rank=r, status=EXITED, source="stacks",
                         notes=(f"no process of this rank on {where}: it ended (its launcher reaped it, so its exit "
                                "status was not seen) or never started",))
            for r in range(view.world_size) if r not in present]


def _labelled(finding: Finding, view: JobView, several: bool) -> Finding:
    data = {**finding.data, "job": view.key}
    detail = f"job {view.key}\n{finding.detail}" if several else finding.detail
    return finding.with_(detail=detail, data=data)


def verdict(view: JobView) -> progress.Judgement:
    """The shared diagnosis over every rank's reads (ranks whose stack could not be read left out)."""
    everyone = sorted([*view.snapshots, *_absent(view)], key=lambda s: s.rank)
    unread = [s for s in everyone if s.status == UNKNOWN]
    history = {s.rank: view.looks(s.rank) or [s] for s in everyone if s.status != UNKNOWN}
    return progress.judge(history, world_size=view.world_size if view.whole and not unread else None)


def judge(view: JobView, *, several: bool = False) -> list[Finding]:
    """The job's findings: the shared diagnosis' verdict over the reads, the stack groups, and
    what `stacks` could not see."""
    everyone = sorted([*view.snapshots, *_absent(view)], key=lambda s: s.rank)
    # A rank whose stack could not be read is not evidence either way: the verdict is over the others.
    unread = [s for s in everyone if s.status == UNKNOWN]
    snaps = [s for s in everyone if s.status != UNKNOWN]
    judged = verdict(view)
    found = list(judged.findings)
    named = {r for f in found if f.id not in (job_kinds.RUNNING.id, job_kinds.OPEN.id) for r in f.ranks}
    ended = [s for s in snaps if s.status in (EXITED, KILLED) and s.rank not in named and s.pid is not None]
    if ended:
        seen = any(look.stack for s in ended for look in view.looks(s.rank))
        when = "between reads" if seen else f"before {'its' if len(ended) == 1 else 'their'} stack could be read"
        found.append(ENDED(f"{ranks_label((s.rank for s in ended), capital=True)} ended {when}",
                           detail="\n".join(said_alike(((s.rank, f"(PID {s.pid}): {'; '.join(s.notes)}") for s in ended),
                                                       lambda label, text, ranks: f"{label} {text}")),
                           ranks=[s.rank for s in ended], hosts=[s.host for s in ended if s.host]))
    if snaps and (unread or (not view.whole and view.world_size and len(snaps) < view.world_size)):
        # "Every rank waits" holds only for the ranks seen: a rank not seen may be the late one.
        hang = [f for f in found if f.id == job_kinds.HANG.id]
        found = [f for f in found if f.id != job_kinds.HANG.id]
        found.append(_partial(view, snaps, unread, hang[0].title if hang else ""))
    # The stacks of a job whose every rank moved are moments of its work, not places to group.
    groups = stack_groups(snaps, native=view.native) if judged.outcome != progress.RUNNING else None
    if groups is not None:
        found.append(groups)
    found += view.problems
    return [_labelled(f, view, several) for f in found]


def _partial(view: JobView, snaps: list[RankSnapshot], unread: list[RankSnapshot], hang: str) -> Finding:
    here = format_ranks(s.rank for s in snaps)
    of = f" of {view.world_size}" if view.world_size else ""
    lines = [f"among the ranks seen: {hang[0].lower() + hang[1:]}; a rank not seen may be the one they wait for"] if hang else []
    if unread:
        lines.append(f"ranks whose stack could not be read: {format_ranks(s.rank for s in unread)} (see their findings)")
    unseen_elsewhere = not view.whole and view.world_size and len(snaps) + len(unread) < view.world_size
    if unseen_elsewhere:
        lines.append(f"the job's other ranks were not looked at: they run on other nodes, or were not among the PIDs "
                     f"given (nodes looked at: {', '.join(view.nodes) or '?'})")
    return PARTIAL(f"The verdict covers ranks {here}{of} only", detail="\n".join(lines), ranks=[s.rank for s in snaps],
                   remediation=None if not unread or unseen_elsewhere else "Fix what kept the other ranks' stacks from being read (their findings say what), then run again")


def renumber(snaps: list[RankSnapshot]) -> list[RankSnapshot]:
    """Processes with no rank variable (-1) get the first free numbers, in PID order, and say so."""
    used = {s.rank for s in snaps if s.rank >= 0}
    free = (r for r in range(len(snaps) + len(used)) if r not in used)
    out = []
    for snap in sorted(snaps, key=lambda s: (s.rank < 0, s.rank, s.pid or 0)):
        if snap.rank < 0:
            snap = replace(snap, rank=next(free), notes=(*snap.notes, "no rank in its environment: numbered by PID order"))
        out.append(snap)
    return out
