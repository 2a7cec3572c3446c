"""Progress between looks at a job: what moved in each rank, and what the looks together prove."""

# One look at a job cannot tell a busy rank from a stuck one: whichever rank happens to be inside
# DDP's backward at that instant "waits", and the other "has not arrived". So every source that can
# look more than once (`stacks` reads each rank several times, the guard polls its counters, a log
# has timestamps) hands the diagnosis a sequence of snapshots per rank, oldest first, and this
# module applies one rule to it:
#
#   a rank MOVED between two looks when its completed or enqueued sequence numbers (or its count of
#   collectives) grew, when its stack moved (another line, another call, into or out of a wait), or
#   when its CPU time advanced outside a wait (a wait that sleeps uses no CPU: CPU used between two
#   looks that both found the thread asleep in the same wait was used outside it; a wait that may
#   spin, or a thread found running, proves nothing). It is STILL only across two looks or more;
#   one look alone cannot tell.
#
# judge() then asks diagnose() about the latest look and keeps its verdict only where the looks
# prove it: a stall (a late rank, a rank that left or went silent while others wait) only when
# every waiting rank stayed still in the same place (same call, same line) at every look and the
# late rank was outside that place at every look; a hang (every rank waiting, a receive cycle) only
# when no rank moved. A rank that failed (an exception, a signal, a non-zero exit) needs no second
# look. A job whose every rank moved gets job.I001; what the looks leave open gets job.I002, which
# says what the last look alone would have claimed and why it was not.

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.rank_groups import MAX_LINES, said_alike
from distdoctor.core.report import format_ranks
from distdoctor.diagnosis import kinds
from distdoctor.diagnosis.diagnose import DEFAULT_GROUP, diagnose, group_label
from distdoctor.diagnosis.snapshot import FINISHED, UNKNOWN, GroupProgress, RankSnapshot

# A rank over its looks.
MOVED, STILL, ONE_LOOK, ENDED, UNREAD = "moved", "still", "one look", "ended", "unread"
# The job over its looks.
RUNNING, STALLED, FAILED, IDLE, ENDED_ALL, UNDECIDED = "running", "stalled", "failed", "idle", "ended", "undecided"

# Less CPU than this between two looks is a wake-up (a timer, a signal, a poll), not work ...
CPU_FLOOR_S = 0.002
# ... and so is less than this share of the time between them.
CPU_SHARE = 0.01
# Kernel states of a thread that is not on a CPU: sleeping, in uninterruptible (disk) sleep, idle.
ASLEEP = frozenset("SDI")


# -- one rank, two looks ------------------------------------------------------------------------

def wait_place(snap: RankSnapshot) -> str | None:
    """Where the rank waits, as one text (same text: same wait): the pending collective and its
    sequence number per its counters, and the call and the user's line per its stack; None when it
    waits in nothing this source can see."""
    parts = []
    for group in sorted((g for g in snap.groups if g.waiting), key=lambda g: (g.group != DEFAULT_GROUP, g.group)):
        seq = group.pending.seq if group.pending and group.pending.seq is not None else (
            group.last_completed + 1 if group.last_completed is not None else None)
        op = group.pending.op if group.pending else "a collective"
        parts.append(f"{op}{f' #{seq}' if seq is not None else ''} of {group_label(group.group)}")
    if snap.in_collective:
        parts.append(snap.in_collective)
    if not parts:
        return None
    return "; ".join(parts) + (f" at {snap.where.label}" if snap.where else "")


def _stack_key(snap: RankSnapshot) -> tuple:
    return tuple((f.file, f.line, f.function) for f in snap.stack)


def group_advanced(before: GroupProgress, after: GroupProgress) -> str | None:
    """A process group's completed count grew between two looks, in words; None when it did not.

    This is what "the group moved" means for the guard's stall clock too: only the completed count,
    since on NCCL the host keeps enqueueing behind a collective that does not complete."""
    if after.last_completed is None or before.last_completed is None or after.last_completed <= before.last_completed:
        return None
    return f"it completed collectives #{before.last_completed + 1}-#{after.last_completed} of {group_label(after.group)}"


def _counters_moved(before: RankSnapshot, after: RankSnapshot) -> str | None:
    """The sequence numbers or the count of collectives that grew, in words."""
    for group in after.groups:
        old = before.group(group.group)
        if old is None:
            continue
        label = group_label(group.group)
        advanced = group_advanced(old, group)
        if advanced:
            return advanced
        if group.last_enqueued is not None and old.last_enqueued is not None and group.last_enqueued > old.last_enqueued:
            return f"it issued collectives #{old.last_enqueued + 1}-#{group.last_enqueued} of {label}"
    if before.collectives is not None and after.collectives is not None and after.collectives > before.collectives:
        return f"it issued {after.collectives - before.collectives} more collectives"
    return None


def cpu_between(before: RankSnapshot, after: RankSnapshot) -> float | None:
    """CPU seconds the rank used between the two looks, when both carry its CPU time."""
    if before.cpu_s is None or after.cpu_s is None:
        return None
    return max(0.0, after.cpu_s - before.cpu_s)


def _elapsed(before: RankSnapshot, after: RankSnapshot) -> float | None:
    if before.time is None or after.time is None:
        return None
    return max(0.0, after.time - before.time)


def _is_work(cpu: float | None, elapsed: float | None) -> bool:
    return cpu is not None and cpu >= CPU_FLOOR_S and (elapsed is None or cpu >= CPU_SHARE * elapsed)


def _asleep(snap: RankSnapshot) -> bool:
    return bool(snap.proc_state) and snap.proc_state in ASLEEP and not snap.may_spin


def _spot(snap: RankSnapshot, *, bare: bool = False) -> str:
    """Where the rank was, briefly: `in` the wait, else `at` the user's line, else the innermost
    frame (bare: without the preposition)."""
    place = wait_place(snap)
    if place:
        return place if bare else f"in {place}"
    if snap.where is not None or snap.stack:
        label = snap.where.label if snap.where is not None else snap.stack[-1].label
        return label if bare else f"at {label}"
    return "somewhere its source did not show"


def moved(before: RankSnapshot, after: RankSnapshot) -> str | None:
    """What moved in one rank between two looks (before is the older), in words; None when
    nothing did (or when it cannot be told: a rank that ended did not move, it ended)."""
    if before.pid is not None and after.pid is not None and before.pid != after.pid:
        return f"its process changed (PID {before.pid} -> {after.pid}): it was restarted"
    if not (before.alive and after.alive):
        return None
    counters = _counters_moved(before, after)
    if counters:
        return counters
    here, there = wait_place(before), wait_place(after)
    cpu, elapsed = cpu_between(before, after), _elapsed(before, after)
    if here is not None and here == there:
        # In the same wait at both looks: lines inside torch may change while it polls, so the
        # stack says nothing; CPU does, when both looks found the thread asleep there.
        if _asleep(before) and _asleep(after) and _is_work(cpu, elapsed):
            return (f"it left {here} and came back: {cpu * 1000:.0f} ms of CPU between two reads that both "
                    "found it asleep there")
        return None
    if here != there or (before.stack and after.stack and _stack_key(before) != _stack_key(after)):
        return f"its stack went from {_spot(before, bare=True)} to {_spot(after, bare=True)}"
    if not (before.may_spin or after.may_spin) and _is_work(cpu, elapsed):
        return f"it computed: {cpu:.2f} s of CPU {_spot(after)}"
    return None


def stayed(before: RankSnapshot, after: RankSnapshot) -> bool:
    """The rank stayed where it was between two looks: in the same wait (or, outside any, at the
    same stack) and nothing moved. This is what "since when" means wherever a source watches one
    rank look after look: `settled_since` over a sequence of looks, and the guard's watch of its
    own main thread when no flight recorder counts the collectives (a stall in a wait its stack
    shows is the time this has held)."""
    return moved(before, after) is None and wait_place(before) == wait_place(after)


# -- one rank, all its looks -----------------------------------------------------------------------

@dataclass(frozen=True)
class Motion:
    """One rank over its looks (oldest first): did it move, and where it stayed."""

    rank: int
    state: str                        # MOVED, STILL, ONE_LOOK, ENDED or UNREAD
    looks: int                        # the looks that could be read
    span_s: float | None = None       # from its first look to its last
    moves: tuple[str, ...] = ()       # what moved, once per pair of looks that moved
    place: str | None = None          # the wait it was in at every look, if one
    latest: RankSnapshot | None = None

    def describe(self) -> str:
        """`rank 1 stayed still at train.py:39 across 3 looks over 1.2 s`"""
        where = self.place and f"in {self.place}" or (self.latest and _spot(self.latest)) or "?"
        over = f" over {self.span_s:.1f} s" if self.span_s is not None else ""
        if self.state == MOVED:
            return f"rank {self.rank} moved between reads: {self.moves[-1]}"
        if self.state == STILL:
            return f"rank {self.rank} stayed still {where} across {self.looks} reads{over}"
        if self.state == ONE_LOOK:
            return f"rank {self.rank} was read once ({where}): one read cannot tell whether it moves"
        if self.state == ENDED:
            return f"rank {self.rank} ended"
        return f"rank {self.rank} could not be read"


def motion_lines(motions: Sequence[Motion]) -> list[str]:
    """Each rank's motion in words: one line per rank in a small job (MAX_LINES ranks or fewer),
    else ranks that did the same (but for numbers: CPU seconds, spans) said once as ranges."""
    if len(motions) <= MAX_LINES:
        return [m.describe() for m in motions]

    def said(label: str, text: str, ranks: list[int]) -> str:
        if len(ranks) > 1:
            text = text.replace("was read once", "were read once").replace("whether it moves", "whether they move")
        return f"{label} {text}"

    return said_alike(((m.rank, m.describe()[len(f"rank {m.rank} "):]) for m in motions), said,
                      rest="in other states")


def _readable(looks: Iterable[RankSnapshot]) -> list[RankSnapshot]:
    return [s for s in looks if s.status != UNKNOWN]


def motion(rank: int, looks: Sequence[RankSnapshot]) -> Motion:
    """One rank's looks, oldest first (a look that could not be read is no evidence either way)."""
    read = _readable(looks)
    if not read:
        return Motion(rank, UNREAD, 0, latest=looks[-1] if looks else None)
    latest = read[-1]
    span = _elapsed(read[0], latest)
    places = {wait_place(s) for s in read}
    place = places.pop() if len(places) == 1 else None
    if not latest.alive:
        return Motion(rank, ENDED, len(read), span, place=place, latest=latest)
    if len(read) == 1:
        return Motion(rank, ONE_LOOK, 1, None, place=place, latest=latest)
    moves = tuple(m for m in (moved(a, b) for a, b in zip(read, read[1:])) if m)
    return Motion(rank, MOVED if moves else STILL, len(read), span, moves, place, latest)


def settled_since(looks: Sequence[RankSnapshot]) -> float | None:
    """Since when (a look's time) the rank has stayed where its latest look found it, without
    moving; None when not known (one look, no times, or it moved at its latest look)."""
    read = [s for s in _readable(looks) if s.time is not None]
    if len(read) < 2:
        return None
    since = None
    for before, after in zip(reversed(read[:-1]), reversed(read[1:])):
        if not stayed(before, after):
            break
        since = before.time
    return since


def recent(looks: Sequence[RankSnapshot], *, min_looks: int = 3, min_span_s: float = 1.0) -> list[RankSnapshot]:
    """The shortest run of the latest looks with at least min_looks looks spanning at least
    min_span_s (what a verdict about now should rest on); every look when none does."""
    looks = list(looks)
    for start in range(len(looks) - min_looks, -1, -1):
        first, last = looks[start].time, looks[-1].time
        if first is not None and last is not None and last - first >= min_span_s:
            return looks[start:]
    return looks


def enough(looks: Sequence[RankSnapshot], *, min_looks: int = 3, min_span_s: float = 1.0) -> bool:
    """Whether the looks are enough to judge: min_looks readable looks over min_span_s, or an end."""
    read = _readable(looks)
    if read and not read[-1].alive:
        return True
    return len(read) >= min_looks and (_elapsed(read[0], read[-1]) or 0.0) >= min_span_s


# -- the job ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Judgement:
    """What the looks prove about the job: the outcome, its findings, and each rank's motion."""

    outcome: str                      # RUNNING, STALLED, FAILED, IDLE, ENDED_ALL or UNDECIDED
    findings: tuple[Finding, ...]
    motions: Mapping[int, Motion]

    @property
    def decided(self) -> bool:
        """More looks would not change the answer (UNDECIDED: read again, if time is left)."""
        return self.outcome != UNDECIDED


def _blocked(snap: RankSnapshot) -> bool:
    return snap.status != FINISHED and (snap.waiting or (snap.error is not None and snap.error.consequence))


def _failure(finding: Finding) -> bool:
    """diagnose names the first failure (an exception, a signal, a non-zero exit) with first_rank."""
    return finding.data.get("first_rank") is not None


def _why_not(finding: Finding, motions: Mapping[int, Motion], history: Mapping[int, Sequence[RankSnapshot]]) -> str | None:
    """None when the looks prove the finding; else why they do not, in words."""
    if finding.id in (kinds.SHAPE.id, kinds.DTYPE.id):
        return None  # what the recorder's history shows, not a claim about progress
    latest = [m.latest for m in motions.values() if m.latest is not None]
    places = set()
    for snap in latest:
        if not _blocked(snap):
            continue
        m = motions[snap.rank]
        if m.state == ENDED:
            continue
        if m.state != STILL or m.place is None:
            return {MOVED: f"rank {snap.rank}, which waits at the last read, moved between reads ({m.moves[-1] if m.moves else ''})",
                    ONE_LOOK: f"rank {snap.rank} was read once: one read cannot tell a wait from a pass"}.get(
                m.state, f"rank {snap.rank} was not in the same wait at every read")
        places.add(m.place)
    if finding.id == kinds.STRAGGLER.id:
        for rank in finding.ranks:
            looks = _readable(history.get(rank, ()))
            if len(looks) < 2:
                return f"rank {rank}, the late one, was read once: one read cannot tell late from passing"
            inside = next((s for s in looks if wait_place(s) in places), None)
            if inside is not None:
                return f"rank {rank}, the late one, was in {wait_place(inside)} itself at one read"
    return None


def _still_lines(finding: Finding, motions: Mapping[int, Motion]) -> str:
    """The evidence over time, for a finding the looks prove."""
    shown = [motions[r] for r in sorted(motions) if motions[r].state in (STILL, MOVED)]
    lines = motion_lines(shown)
    return "\n".join(["over time:", *(f"  {line}" for line in lines)]) if lines else ""


def judge(history: Mapping[int, Sequence[RankSnapshot]], *, world_size: int | None = None) -> Judgement:
    """The job's findings from each rank's looks (oldest first; see the module's comment)."""
    motions = {rank: motion(rank, looks) for rank, looks in sorted(history.items())}
    latest = [m.latest for m in motions.values() if m.latest is not None and m.state != UNREAD]
    found = diagnose(latest, world_size=world_size)
    if any(_failure(f) for f in found):
        return Judgement(FAILED, tuple(found), motions)
    kept, dropped = [], []
    for finding in found:
        why = _why_not(finding, motions, history)
        if why is None:
            evidence = _still_lines(finding, motions)
            kept.append(finding.with_(detail=f"{finding.detail}\n{evidence}" if evidence else finding.detail))
        else:
            dropped.append((finding, why))
    if kept:
        return Judgement(STALLED, tuple(kept), motions)
    alive = [m for m in motions.values() if m.state not in (ENDED, UNREAD)]
    if not alive:  # nothing left to read: what ended is diagnose's (a clean end: nothing to say)
        return Judgement(ENDED_ALL, (), motions)
    if all(m.state == MOVED for m in alive) and len(alive) == len(motions):
        return Judgement(RUNNING, (_running(alive),), motions)
    if all(m.state == STILL for m in alive) and not dropped:
        return Judgement(IDLE, (_open(motions, dropped, idle=True),), motions)
    return Judgement(UNDECIDED, (_open(motions, dropped, idle=False),), motions)


def _running(alive: Sequence[Motion]) -> Finding:
    looks = min(m.looks for m in alive)
    spans = [m.span_s for m in alive if m.span_s is not None]
    over = f" over {max(spans):.1f} s" if spans else ""
    lines = motion_lines(alive)
    ranks = [m.rank for m in alive]
    return kinds.RUNNING(f"Running: every rank moved between reads ({'rank' if len(ranks) == 1 else 'ranks'} "
                         f"{format_ranks(ranks)}, {looks} reads or more{over})",
                         detail="\n".join(lines), ranks=ranks, hosts=[m.latest.host for m in alive if m.latest and m.latest.host],
                         data={"outcome": RUNNING, "moved": {str(m.rank): list(m.moves) for m in alive}},
                         ).with_(check=kinds.CHECK)


def _open(motions: Mapping[int, Motion], dropped: Sequence[tuple[Finding, str]], *, idle: bool) -> Finding:
    """job.I002: what the looks leave open, and what the last look alone would have claimed."""
    ordered = list(motions.values())
    one_look = [m for m in ordered if m.state == ONE_LOOK]
    if idle:
        title = "No rank moved between reads, and none waits in a collective its stack names"
    elif one_look and len(one_look) == len([m for m in ordered if m.state not in (ENDED, UNREAD)]):
        title = "One read alone cannot tell a busy job from a hung one"
    else:
        title = "The reads do not tell yet whether the job progresses or is stuck"
    lines = motion_lines(ordered)
    for finding, why in dropped:
        lines.append(f"the last read alone would say: {finding.title} — not named, because {why}")
    notes = sorted({n for m in ordered if m.latest for n in m.latest.notes if "cannot tell" in n})
    lines += notes[:4]
    ranks = [m.rank for m in ordered]
    return kinds.OPEN(title, detail="\n".join(lines), ranks=ranks,
                      hosts=[m.latest.host for m in ordered if m.latest and m.latest.host],
                      data={"outcome": IDLE if idle else UNDECIDED,
                            "motions": {str(m.rank): m.state for m in ordered},
                            "withheld": [f.id for f, _ in dropped]}).with_(check=kinds.CHECK)
