"""Per-rank snapshots -> findings: who raised, was killed or left, who is behind, who disagrees."""

# The guard, `distdoctor stacks` and `explain` all end here, so one fault gets one answer
# whichever way it was seen. The order of the questions is the order of causation:
#   1. the first failure (an exception, a signal, a non-zero exit) is the cause and what its
#      peers did afterwards (connection closed, a timeout, SIGTERM from the launcher) is folded
#      under it as a consequence;
#   2. a rank that left cleanly while others still wait in a collective: uneven inputs;
#   3. a rank that does not answer while others wait: missing;
#   4. a rank alive and outside any collective while others wait: the straggler;
#   5. ranks at one sequence number with different operations, sizes or dtypes: a mismatch
#      (also reported beside 1-4 when the recorder's history shows one);
#   6. every rank waiting: in waits no peer can match (a cycle), or in one collective, proven stuck
#      (no rank's connections received data) or slow but moving (diagnosis.stuck);
#   7. ranks waiting while others were not heard from in time (the guard asked and no answer came,
#      nothing proves why): said as such, never as a cause of theirs.
# Nothing failed and nobody waits: no finding (the caller says what it looked at). A rank not heard
# from is never named late, missing or dead for its silence alone: only what it published last (a
# final state) or what its source proved (its process read from /proc) names it. Every finding says
# how many ranks were heard from.

from __future__ import annotations

import re
import signal
from collections import Counter
from dataclasses import replace
from typing import Any, Iterable, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.rank_groups import (MAX_LINES, as_ranges, group_ranks, grouped_lines, ranks_label, said_alike, shape,
                                         within_budget)
from distdoctor.core.report import format_ranks
from distdoctor.diagnosis import kinds
from distdoctor.diagnosis.cut import EVERY_RANK_TAKES_PART, completed_by_all
from distdoctor.diagnosis.frames import is_user_file
from distdoctor.diagnosis.waits import in_backward
from distdoctor.diagnosis.snapshot import (EXITED, FINISHED, KILLED, NOT_HEARD, RAISED, RUNNING, UNKNOWN,
                                           UNREACHABLE, GroupProgress, PendingOp, RankSnapshot)
from distdoctor.diagnosis.stuck import DEADLOCK, MOVING, POINT_TO_POINT, STUCK, UNKNOWN_WAITS, motion, p2p_waits

DEFAULT_GROUP = "0"
# Collectives whose inputs may differ in size between ranks by design: all_to_all with split sizes
# (every mixture-of-experts layer), the object collectives (each rank's pickle has its own length;
# the flight recorder shows the padded all_gather / gather under them, which agree), gather and
# scatter (only the root holds the list). Their sizes are not compared; operation and dtype are.
SIZES_MAY_DIFFER = frozenset({"all_to_all", "all_to_all_single", "alltoall", "alltoall_base", "all_gather_object",
                              "gather_object", "scatter_object_list", "broadcast_object_list", "gather", "scatter"})
_LAUNCHER_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def diagnose(snapshots: Iterable[RankSnapshot], *, world_size: int | None = None,
             waited_s: float | None = None) -> list[Finding]:
    """Findings for the job the snapshots describe (one per rank; a missing rank is unreachable)."""
    snaps = _settled(_complete(list(snapshots), world_size))
    if not snaps:
        return []
    mismatch = _mismatch(snaps)
    primary = (_first_failure(snaps) or _left_early(snaps) or _missing(snaps) or _straggler(snaps, waited_s)
               or (None if mismatch else _all_waiting(snaps, waited_s) or _not_heard(snaps)))
    found = [_unnumbered(f, snaps) for f in (primary, mismatch) if f is not None]
    return [_heard(f, snaps).with_(check=kinds.CHECK) for f in found]


def _complete(snaps: list[RankSnapshot], world_size: int | None) -> list[RankSnapshot]:
    by_rank: dict[int, RankSnapshot] = {}
    for snap in snaps:
        by_rank.setdefault(snap.rank, snap)
    for rank in range(world_size or 0):
        by_rank.setdefault(rank, RankSnapshot(rank=rank, status=UNREACHABLE, notes=("no snapshot of this rank",)))
    return [by_rank[r] for r in sorted(by_rank)]


_TORCH_PATH = re.compile(r"(^|[/\\])torch[/\\]")


def _outside_torch(snap: RankSnapshot) -> bool:
    """Its main thread is in no torch call: the innermost frame is the user's, or no frame is torch's
    (a data loader's queue.get, a time.sleep in the stdlib)."""
    if not snap.stack or snap.in_collective:
        return False
    return is_user_file(snap.stack[-1].file) or not any(_TORCH_PATH.search(f.file) for f in snap.stack)


_DISTRIBUTED_PATH = re.compile(r"(^|[/\\])torch[/\\]distributed[/\\]")


def _in_no_distributed_call(snap: RankSnapshot) -> bool:
    """Its main thread's stack is known and shows no wait a collective can be in: no torch.distributed
    function (a module being imported there is no call), no backward (DDP's and FSDP's collectives run
    inside it), no collective read from the stack. torch's own code otherwise (a forward, an import)."""
    if not snap.stack or snap.in_collective:
        return False
    return not in_backward(snap.stack) and not any(
        _DISTRIBUTED_PATH.search(f.file) and f.function != "<module>" for f in snap.stack)


def _settled(snaps: list[RankSnapshot]) -> list[RankSnapshot]:
    """A collective that one rank of a group completed is complete on every rank that issued it.

    Gloo marks a collective completed in the flight recorder late (about 0.5 s on a quiet
    machine; more than 2 s was seen on a loaded one), so a rank that left the collective and
    sleeps in its data loader can still show it pending. When its main thread is in no torch call
    (the user's own code, or the stdlib under it: a queue, a sleep) its real position is what the
    other ranks' completed count says. So it is, inside torch, for a rank that already issued a
    later collective when the pending one is a collective every rank takes part in (all_reduce,
    all_gather, a barrier ...): its completion anywhere means this rank passed it (gloo was seen to
    leave it unmarked for seconds while the rank waited in the next one); a root's collective
    (broadcast, reduce, gather, scatter) can complete on the root before the others received, so it
    is settled only when a peer completed a later collective every rank takes part in: that one could
    not complete without this rank's part in it, which it issued after the root's (the suite's DDP job:
    rank 1, in backward, read as waiting in broadcast #6 while rank 0 had completed all_reduce #7), or
    when this rank issued a later one and every other rank completed it: whichever was the root, its
    data has reached every rank (Lightning's per-step broadcast on rank 0, the root, still unmarked
    3 s after rank 1 received it, while rank 0 waited in the all_reduce after it: rank 1, asleep in
    its step, was named late to the broadcast it had completed). Nor does a rank wait in a collective every
    rank takes part in that another rank completed when its main thread is in no call that could wait in
    one (importing torch._dynamo as DDP is built, say): its part is in, or that rank could not have
    completed (the suite's dead-prefetch job: rank 1 still showed all_to_all #2 pending 3 s after rank 0
    completed it, both importing, and rank 0 was named late for it).
    """
    done: dict[str, int] = {}
    by_all: dict[str, int] = {}
    for snap in snaps:
        for group in snap.groups:
            if group.last_completed is not None:
                done[group.group] = max(done.get(group.group, -1), group.last_completed)
            passed_by_all = completed_by_all(group)
            if passed_by_all is not None:
                by_all[group.group] = max(by_all.get(group.group, -1), passed_by_all)
    out = []
    for snap in snaps:
        groups = []
        for group in snap.groups:
            top = done.get(group.group)
            if (group.pending is not None and group.pending.seq is not None and top is not None
                    and group.pending.seq <= top
                    and (_outside_torch(snap) or _passed(group) or group.pending.seq < by_all.get(group.group, -1)
                         or _completed_by_the_others(snaps, snap.rank, group) or _taken_part(group, snap))):
                completed = min(top, group.last_enqueued) if group.last_enqueued is not None else top
                later = next((op for op in group.recent if op.seq is not None and op.seq > completed), None)
                group = replace(group, last_completed=max(group.last_completed or -1, completed), pending=later)
            groups.append(group)
        changed = any(new is not old for new, old in zip(groups, snap.groups))
        out.append(replace(snap, groups=tuple(groups)) if changed else snap)
    return out


def _completed_by_the_others(snaps: Sequence[RankSnapshot], rank: int, group: GroupProgress) -> bool:
    """This rank issued a collective after its pending one, and every other rank heard from completed the
    pending one in the same group (a rank that does not report the group, or was not heard, leaves it open)."""
    seq = group.pending.seq if group.pending is not None else None
    if seq is None or group.last_enqueued is None or group.last_enqueued <= seq:
        return False
    others = [s.group(group.group) for s in snaps if s.rank != rank]
    return bool(others) and all(g is not None and g.last_completed is not None and g.last_completed >= seq
                                for g in others)


def _taken_part(group: GroupProgress, snap: RankSnapshot) -> bool:
    """The pending collective is one every rank takes part in (another rank's completion of it needed this
    rank's part) and this rank's main thread is in no call that could wait in it."""
    pending = group.pending
    return pending is not None and pending.op in EVERY_RANK_TAKES_PART and _in_no_distributed_call(snap)


def _passed(group: GroupProgress) -> bool:
    """The pending collective is one every rank takes part in, and this rank issued a later one."""
    pending = group.pending
    return (pending is not None and pending.op in EVERY_RANK_TAKES_PART and group.last_enqueued is not None
            and pending.seq is not None and group.last_enqueued > pending.seq)


# A straggler or a hang told from the ranks' stacks alone (no flight recorder, no guarded call
# counted that collective) rests on where each rank is, not on how far it got: its claim is likely,
# not certain, and the finding says so with its confidence. Failures, departures and silent ranks
# need no count.
NO_COUNT_CONFIDENCE = {kinds.STRAGGLER.id: 0.8, kinds.HANG.id: 0.6}
_NO_COUNT_LINES = {
    kinds.STRAGGLER.id: "told from the ranks' stacks, without sequence numbers (no flight recorder counted this "
                        "collective): that the late rank has not passed it yet is read from where it is, not "
                        "counted (likely, not certain)",
    kinds.HANG.id: "told from the ranks' stacks, without sequence numbers (no flight recorder counted these "
                   "collectives): whether every rank waits in the same one cannot be checked, so ranks in different "
                   "collectives (a mismatch) look the same (likely, not certain)",
}


def _unnumbered(finding: Finding, snaps: Sequence[RankSnapshot]) -> Finding:
    """The finding with a lower confidence, said, when the collective its waiting ranks wait in has no
    sequence number on any of them (their stacks alone named it)."""
    if finding.id not in NO_COUNT_CONFIDENCE:
        return finding
    named = set(finding.data.get("waiting") or finding.ranks)
    waiting = [s for s in snaps if s.rank in named and s.waiting]
    ops = [_waiting_op(s)[1] for s in waiting]
    if not ops or any(op is not None and (op.seq is not None or op.op in POINT_TO_POINT) for op in ops):
        return finding
    return finding.with_(confidence=NO_COUNT_CONFIDENCE[finding.id],
                         detail=f"{finding.detail}\n{_NO_COUNT_LINES[finding.id]}")


# -- who is where -----------------------------------------------------------------------------

def _where(snap: RankSnapshot) -> str:
    return f" at {snap.where.describe()}" if snap.where else ""


def _blocked(snap: RankSnapshot) -> bool:
    """Waiting in a collective, or failed in one because of a peer (its error is a consequence).

    A rank that left the job waits in nothing, whatever its recorder still shows pending."""
    if snap.status == FINISHED:
        return False
    return snap.waiting or (snap.error is not None and snap.error.consequence)


def _waiting_op(snap: RankSnapshot) -> tuple[str, PendingOp | None]:
    """(group, the op it waits in) for a waiting rank; the default group first."""
    waiting = sorted((g for g in snap.groups if g.waiting), key=lambda g: (g.group != DEFAULT_GROUP, g.group))
    if waiting:
        group = waiting[0]
        pending = group.pending or PendingOp(op="a collective", seq=group.last_completed + 1
                                             if group.last_completed is not None else None)
        return group.group, pending
    return DEFAULT_GROUP, PendingOp(op=snap.in_collective, age_s=snap.still_s) if snap.in_collective else None


def group_label(group: str) -> str:
    return "the default group" if group in (DEFAULT_GROUP, "default", "default_pg", "WORLD") else f"group {group}"


def _op_text(group: str, op: PendingOp | None) -> str:
    return f"{op.describe() if op else 'a collective'} of {group_label(group)}"


def _ranks_of(snaps: Iterable[RankSnapshot], capital: bool = False) -> str:
    """'rank 3', 'ranks 0-31, 33-4095': the ranks as ranges (bounded at any world size)."""
    return ranks_label([s.rank for s in snaps], capital=capital)


def _waiters_text(waiting: Sequence[RankSnapshot]) -> str:
    """What the waiting ranks are in; ranks in the same call at the same line are said once
    (`ranks 0, 2-3 wait in ...`), so a 4,096-rank job reads as one line per place, a few places
    at most (the largest and the odd ones; the rest counted)."""
    places: dict[tuple[str, str], list[tuple[int, float | None]]] = {}
    texts: dict[tuple[str, str], str] = {}
    for snap in waiting:
        group, op = _waiting_op(snap)
        if not snap.waiting and snap.error is not None:
            text = (f"failed in {_op_text(group, op)}{_where(snap)} with {snap.error.type}: {snap.error.message}")[:400]
            texts.setdefault(("failed", shape(text)), text)
            places.setdefault(("failed", shape(text)), []).append((snap.rank, None))
            continue
        age = op.age_s if op is not None else None
        text = f"{_op_text(group, op)}{_where(snap)}"
        texts.setdefault(("waits", text), text)
        places.setdefault(("waits", text), []).append((snap.rank, age))
    groups = group_ranks((rank, key) for key, members in places.items() for rank, _ in members)
    said, rest = within_budget(groups, MAX_LINES)
    parts = [_place_text(key[0], texts[key], places[key]) for key, _ in said]
    if rest:
        parts.append(f"… and {len(rest)} more ranks ({format_ranks(rest)}) in other places")
    return "; ".join(parts)


def _place_text(verb: str, text: str, members: list[tuple[int, float | None]]) -> str:
    ranks = [rank for rank, _ in members]
    ages = [age for _, age in members if age is not None]
    if len(ranks) == 1:
        since = f" for {ages[0]:.1f} s" if ages else ""
        return f"rank {ranks[0]} {verb} in {text}{since}" if verb == "waits" else f"rank {ranks[0]} {text}"
    since = f" for up to {max(ages):.1f} s" if ages else ""
    label = f"ranks {format_ranks(ranks)}"
    return f"{label} wait in {text}{since}" if verb == "waits" else f"{label} {text}"


def _state_text(snap: RankSnapshot) -> str:
    """One rank's state in a few words, for the JSON's ranks-per-state (every rank, as ranges)."""
    if _blocked(snap):
        group, op = _waiting_op(snap)
        verb = "waits in" if snap.waiting else "failed in"
        return f"{verb} {_op_text(group, op)}{_where(snap)}"
    if snap.status == RUNNING:
        return "running, not in a collective" + _where(snap)
    return _exit_text(snap)


def _progress_text(snap: RankSnapshot, group: str = DEFAULT_GROUP) -> str:
    progress = snap.group(group)
    if progress is None or progress.last_enqueued is None:
        return f"{snap.collectives} collectives issued" if snap.collectives is not None else ""
    return f"its last collective in {group_label(group)}: #{progress.last_enqueued}"


def _exit_text(snap: RankSnapshot) -> str:
    if snap.status == KILLED and snap.exit_code is not None:
        return f"killed by {signal_name(-snap.exit_code)} (exit {snap.exit_code})"
    if snap.died_exiting:
        return f"left the job, then died of {signal_name(-snap.exit_code)} as it exited (exit {snap.exit_code})"
    if snap.exit_code is not None:
        return f"exited with code {snap.exit_code}"
    return {RAISED: "raised", FINISHED: "left the job", UNREACHABLE: "did not answer", RUNNING: "is running",
            EXITED: "ended (its exit status was not seen)"}.get(snap.status, "is in a state this source could not read")


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _stack_lines(snap: RankSnapshot, limit: int = 8) -> list[str]:
    if not snap.stack:
        return []
    lines = [f"  {frame.label} in {frame.function}" if frame.function else f"  {frame.label}" for frame in snap.stack[-limit:]]
    return [f"rank {snap.rank}'s stack (innermost last):", *lines]


MAX_STACKS = 2  # distinct stacks shown in one finding (the ranks sharing each are named)


def _stacks_lines(snaps: Sequence[RankSnapshot]) -> list[str]:
    """The stacks of these ranks, each distinct stack once (the first MAX_STACKS), with who shares it."""
    by_stack = group_ranks((s.rank, tuple((f.file, f.line, f.function) for f in s.stack)) for s in snaps if s.stack)
    first = {s.rank: s for s in snaps}
    lines: list[str] = []
    for _, ranks in by_stack[:MAX_STACKS]:
        own = _stack_lines(first[ranks[0]])
        if len(ranks) > 1:
            own[0] = f"{ranks_label(ranks)}' stack (innermost last):"
        lines += own
    if len(by_stack) > MAX_STACKS:
        lines.append(f"… and {len(by_stack) - MAX_STACKS} more distinct stacks (--format json has every rank's)")
    return lines


def _data(snaps: Sequence[RankSnapshot], **extra: Any) -> dict[str, Any]:
    """What a finding carries: every rank's snapshot, and every rank's state as ranges
    ({"waits in all_reduce #12 ...": [[0, 31], [33, 4095]], ...}), complete at any size."""
    states = group_ranks((s.rank, _state_text(s)) for s in snaps)
    return {**extra, "states": {text: as_ranges(ranks) for text, ranks in states},
            "snapshots": [s.to_dict() for s in snaps]}


def _hosts(snaps: Iterable[RankSnapshot]) -> list[str]:
    return [s.host for s in snaps if s.host]


# -- 1. the first failure ---------------------------------------------------------------------

def _failure_rank(snap: RankSnapshot) -> int | None:
    """How strongly this rank's end is a cause of its own (lower: stronger); None: no failure."""
    if snap.error is not None and not snap.error.consequence:
        return 0
    if snap.status == KILLED and snap.exit_code is not None and -snap.exit_code not in _LAUNCHER_SIGNALS:
        return 1
    if snap.status in (EXITED, RAISED) and snap.exit_code not in (None, 0) and snap.error is None:
        return 2
    return None


def _first_failure(snaps: Sequence[RankSnapshot]) -> Finding | None:
    failed = [(s.error.time if s.error and s.error.time is not None else s.time, _failure_rank(s), s)
              for s in snaps if _failure_rank(s) is not None]
    if not failed:
        return None
    # The earliest in time when the source knows times; otherwise the strongest evidence.
    timed = [f for f in failed if f[0] is not None]
    first = min(timed, key=lambda f: (f[0], f[1], f[2].rank))[2] if timed else min(failed, key=lambda f: (f[1], f[2].rank))[2]
    others = [s for s in snaps if s.rank != first.rank]
    detail_tail = _consequences_text(others)
    if first.error is not None and not first.error.consequence:
        error = first.error
        title = f"Rank {first.rank} raised {error.type}: {error.message}"[:300]
        frame = error.frame or first.where
        lines = [f"rank {first.rank}{' on ' + first.host if first.host else ''} raised {error.type}"
                 + (f" at {frame.describe()}" if frame else "") + (f": {error.message}" if error.message else "")]
        kind = kinds.EXCEPTION
    elif first.status == KILLED and first.exit_code == -signal.SIGKILL:
        title = f"Rank {first.rank} was killed by SIGKILL (exit -9): the out-of-memory killer's signal"
        lines = [f"rank {first.rank}{' on ' + first.host if first.host else ''} was {_exit_text(first)}{_where(first)}"]
        kind = kinds.KILLED
    else:
        title = f"Rank {first.rank} {_exit_text(first)}" + (" before its peers" if others else "")
        lines = [f"rank {first.rank}{' on ' + first.host if first.host else ''} {_exit_text(first)}{_where(first)}"
                 + " without an error this source could read"]
        kind = kinds.MISSING
    if detail_tail:
        lines.append("then, as a consequence: " + detail_tail)
    lines += _stack_lines(first)
    return kind(title, detail="\n".join(lines), ranks=[first.rank], hosts=_hosts([first]),
                data=_data(snaps, first_rank=first.rank,
                           consequences=[s.rank for s in others if _consequence_text(s)]))


def _outcome_text(snap: RankSnapshot) -> str:
    """A peer's own end, without its rank ('failed with X', 'exited with code 1'); '' when none."""
    if snap.error is not None:
        return f"{'failed' if snap.error.consequence else 'also raised'} with {snap.error.describe()}"
    if snap.status in (KILLED, EXITED) and snap.exit_code not in (None, 0):
        return _exit_text(snap)
    return ""


def _consequence_text(snap: RankSnapshot) -> str:
    outcome = _outcome_text(snap)
    if outcome:
        return f"rank {snap.rank} {outcome}"
    return _waiters_text([snap]) if _blocked(snap) else ""


def _consequences_text(others: Sequence[RankSnapshot]) -> str:
    """What the other ranks did afterwards: ranks with the same outcome (but for numbers) said once,
    the ranks still waiting by place."""
    outcomes = [(s.rank, text) for s in others if (text := _outcome_text(s))]
    lines = said_alike(outcomes, lambda label, text, ranks: f"{label} {text}", rest="with other outcomes")
    waiting = [s for s in others if not _outcome_text(s) and _blocked(s)]
    if waiting:
        lines.append(_waiters_text(waiting))
    return "; ".join(lines)


# -- 2-4. a rank that left, went silent or is late -------------------------------------------------

def _left_early(snaps: Sequence[RankSnapshot]) -> Finding | None:
    waiting = [s for s in snaps if _blocked(s)]
    left = [s for s in snaps if not _blocked(s) and (s.status == FINISHED or (s.status == EXITED and s.exit_code == 0))]
    if not waiting or not left:
        return None
    group, op = _waiting_op(waiting[0])
    # A rank that left after completing the collective the others wait in proves their states older
    # than its own (no rank completes a collective alone): they have completed it since. Such a view
    # names no one (the guard's look took a waiting rank's answer before the leaver's last word).
    left = [s for s in left if not _completed(s, group, op)]
    if not left:
        return None
    leavers = "; ".join(said_alike(
        ((s.rank, _exit_text(s) + (f" ({_progress_text(s, group)})" if _progress_text(s, group) else "") + _where(s))
         for s in left), lambda label, text, ranks: f"{label} {text}"))
    title = (f"{_ranks_of(left, capital=True)} left the job while "
             f"{_ranks_of(waiting)} still wait{'' if len(waiting) > 1 else 's'} in {_op_text(group, op)}")
    detail = "\n".join([leavers, _waiters_text(waiting)])
    return kinds.UNEVEN(title, detail=detail, ranks=[s.rank for s in left], hosts=_hosts(left),
                        data=_data(snaps, group=group, seq=op.seq if op else None, op=op.op if op else None,
                                   left=[s.rank for s in left], waiting=[s.rank for s in waiting]))


def _completed(snap: RankSnapshot, group: str, op: PendingOp | None) -> bool:
    """Whether ``snap`` completed the collective ``op`` of ``group`` (by its sequence number)."""
    progress = snap.group(group)
    return (op is not None and op.seq is not None and progress is not None
            and progress.last_completed is not None and progress.last_completed >= op.seq)


def _missing(snaps: Sequence[RankSnapshot]) -> Finding | None:
    waiting = [s for s in snaps if _blocked(s)]
    # An exit whose status the source did not see (the launcher reaped it) is missing too.
    silent = [s for s in snaps if not _blocked(s) and (
        s.status in (UNREACHABLE, UNKNOWN) or (s.status == KILLED and s.exit_code is not None)
        or (s.status == EXITED and s.exit_code is None))]
    if not waiting or not silent:
        return None
    group, op = _waiting_op(waiting[0])
    title = (f"{_ranks_of(silent, capital=True)} "
             f"{'did not answer' if all(s.status not in (KILLED, EXITED) for s in silent) else 'ended'} while the others wait in {_op_text(group, op)}")
    lines = said_alike(((s.rank, f"{' on ' + s.host if s.host else ''} {_exit_text(s)}"
                             + (f" ({'; '.join(s.notes)})" if s.notes else "")) for s in silent),
                           lambda label, text, ranks: f"{label}{text}")
    lines.append(_waiters_text(waiting))
    return kinds.MISSING(title, detail="\n".join(lines), ranks=[s.rank for s in silent], hosts=_hosts(silent),
                         data=_data(snaps, group=group, seq=op.seq if op else None, op=op.op if op else None,
                                    missing=[s.rank for s in silent], waiting=[s.rank for s in waiting]))


def _straggler(snaps: Sequence[RankSnapshot], waited_s: float | None) -> Finding | None:
    waiting = [s for s in snaps if _blocked(s)]
    idle = [s for s in snaps if s.status == RUNNING and not s.waiting]
    if not waiting or not idle:
        return None
    group, op = _waiting_op(waiting[0])
    title = (f"{_ranks_of(idle, capital=True)} {'have' if len(idle) > 1 else 'has'} not arrived at "
             f"{_op_text(group, op)}" + (f": at {idle[0].where.describe()}" if idle[0].where else ""))
    lines = said_alike(((snap.rank, _outside_text(snap, group)) for snap in idle),
                           lambda label, text, ranks: f"{label}{text}")
    lines.append(_waiters_text(waiting) + (f" (the first waited {waited_s:.1f} s)" if waited_s else ""))
    lines += _thread_lines(snaps)
    lines += _stacks_lines(idle)
    return kinds.STRAGGLER(title, detail="\n".join(lines), ranks=[s.rank for s in idle], hosts=_hosts(idle),
                           data=_data(snaps, group=group, seq=op.seq if op else None, op=op.op if op else None,
                                      late=[s.rank for s in idle], waiting=[s.rank for s in waiting]))


def _outside_text(snap: RankSnapshot, group: str) -> str:
    """' on node-b is not in a collective, at `time.sleep(3600)` at train.py:41 for 5.0 s (...)'"""
    progress = _progress_text(snap, group)
    return (f"{' on ' + snap.host if snap.host else ''} is not in a collective"
            + (f", at {snap.where.describe()}" if snap.where else
               " (its stack has no frame of your code)" if snap.stack else " (where in your code is not known)")
            + (f" for {snap.still_s:.1f} s" if snap.still_s else "")
            + (f" ({progress})" if progress else ""))


# -- 5-6. what the ranks are in ------------------------------------------------------------------

def _ops_by_seq(snaps: Sequence[RankSnapshot]) -> dict[tuple[str, int], dict[int, PendingOp]]:
    table: dict[tuple[str, int], dict[int, PendingOp]] = {}
    for snap in snaps:
        for group in snap.groups:
            # The recorder's own entry wins over the pending op at the same number: a rank inside a
            # guarded call shows that call as its pending op (the user's all_reduce, not the guard's
            # verification all_gather the recorder counted), which other ranks' entries do not.
            for op in (*([group.pending] if group.pending else []), *group.recent):
                if op.seq is not None:
                    table.setdefault((group.group, op.seq), {})[snap.rank] = op
    return table


def _odd(values: dict[int, Any]) -> list[int]:
    """Ranks whose value is not the most common (a tie: the lowest rank's value is the norm)."""
    counts = Counter(values.values())
    norm = values[min(values)]
    top = max(counts.values())
    if counts[norm] != top:
        norm = next(v for v, n in counts.items() if n == top)
    return sorted(r for r, v in values.items() if v != norm)


def _mismatch(snaps: Sequence[RankSnapshot]) -> Finding | None:
    for (group, seq), ops in sorted(_ops_by_seq(snaps).items(), key=lambda item: item[0][1]):
        if len(ops) < 2:
            continue
        for field, kind in (("op", kinds.MISMATCH), ("sizes", kinds.SHAPE), ("dtypes", kinds.DTYPE)):
            values = {r: getattr(op, field) for r, op in ops.items()}
            if len(set(values.values())) < 2 or (field == "sizes" and _sizes_may_differ(ops.values())):
                continue
            odd = _odd(values)
            lines = grouped_lines(group_ranks((r, op.describe()) for r, op in ops.items()),
                                  lambda text, ranks: f"{ranks_label(ranks)}: {text}")
            title = f"{ops[min(ops)].op} #{seq} of {group_label(group)} differs in {field} across ranks: " + \
                "; ".join(grouped_lines(group_ranks((r, _field_text(field, op)) for r, op in ops.items()),
                                        lambda text, ranks: f"{ranks_label(ranks)}: {text}", budget=4))
            return kind(title[:400], detail="\n".join(lines), ranks=odd,
                        hosts=_hosts(s for s in snaps if s.rank in odd),
                        data=_data(snaps, group=group, seq=seq, field=field))
    return _diverged(snaps)


def _sizes_may_differ(ops: Iterable[PendingOp]) -> bool:
    return any(op.op in SIZES_MAY_DIFFER for op in ops)


def _field_text(field: str, op: PendingOp) -> str:
    if field == "sizes":
        return ", ".join(str(list(s)) for s in op.sizes) or "no tensor"
    if field == "dtypes":
        return ", ".join(op.dtypes) or "none"
    return op.op


def _diverged(snaps: Sequence[RankSnapshot]) -> Finding | None:
    """Waiting ranks of one group at different sequence numbers: they issued different collectives."""
    at: dict[str, dict[int, PendingOp]] = {}
    for snap in snaps:
        if snap.status != RUNNING:
            continue
        for group in snap.groups:
            if group.pending is not None and group.pending.seq is not None:
                at.setdefault(group.group, {})[snap.rank] = group.pending
    for group, ops in sorted(at.items()):
        if len({op.seq for op in ops.values()}) > 1:
            odd = _odd({r: op.seq for r, op in ops.items()})
            by_op = group_ranks((r, op.describe()) for r, op in ops.items())
            lines = grouped_lines(by_op, lambda text, ranks: f"{ranks_label(ranks)} wait{'s' if len(ranks) == 1 else ''} in {text}")
            return kinds.MISMATCH(
                f"Ranks wait at different collectives of {group_label(group)}: "
                + "; ".join(grouped_lines(by_op, lambda text, ranks: f"{ranks_label(ranks)} in {text}", budget=4)),
                detail="\n".join(lines + ["one rank issued collectives the others did not (a rank-dependent branch, an extra step)"]),
                ranks=odd, hosts=_hosts(s for s in snaps if s.rank in odd), data=_data(snaps, group=group))
    return None


def _all_waiting(snaps: Sequence[RankSnapshot], waited_s: float | None) -> Finding | None:
    """Every rank waits: a cycle of waits no peer can break (job.E006), or one collective that does
    not complete, stuck (job.E009, proven only when no rank's connections moved) or slow but moving
    (job.W011)."""
    waiting = [s for s in snaps if _blocked(s)]
    if not waiting or len(waiting) != len(snaps):
        return None
    waits = {s.rank: _waiting_op(s)[1] for s in waiting}
    if any(op is not None and op.op in POINT_TO_POINT for op in waits.values()):
        verdict, lines = p2p_waits(waits)
        if len(lines) > MAX_LINES:  # a cycle around thousands of ranks: the first pairs say what it is
            lines = lines[:MAX_LINES - 1] + [f"… and {len(lines) - MAX_LINES + 1} more such pairs"]
        if verdict == DEADLOCK:
            return _p2p_deadlock(snaps, waiting, sorted({op.op for op in waits.values() if op}), lines)
        return _in_one(snaps, waiting, waited_s, lines, p2p_unknown=verdict == UNKNOWN_WAITS)
    apart = _apart(waiting)
    if apart is not None:
        return apart
    return _in_one(snaps, waiting, waited_s)


def _in_one(snaps: Sequence[RankSnapshot], waiting: Sequence[RankSnapshot], waited_s: float | None,
            lines: Sequence[str] = (), p2p_unknown: bool = False) -> Finding:
    """Every rank in one collective (or in point-to-point calls that match): stuck, or slow but moving."""
    group, op = _as_called(waiting)
    moves, evidence = motion([(s.rank, _waiting_op(s)[1], s.transport) for s in waiting], waited_s)
    data = _data(snaps, group=group, seq=op.seq if op else None, op=op.op if op else None,
                 waiting=[s.rank for s in waiting], motion=moves, proven=moves == STUCK and not p2p_unknown)
    detail = "\n".join([_waiters_text(waiting), *lines, *([evidence] if evidence else []), *_thread_lines(snaps)])
    since = f" for {waited_s:.1f} s" if waited_s else ""
    if moves == MOVING:
        return kinds.SLOW(f"Every rank is in {_op_text(group, op)}: it has not completed{since}, but it still moves "
                          "data", detail=detail, ranks=[s.rank for s in waiting], hosts=_hosts(waiting), data=data)
    title = f"Every rank waits in {_op_text(group, op)} and it does not complete" + (
        f" ({waited_s:.1f} s)" if waited_s else "")
    return kinds.HANG(title, detail=detail, ranks=[s.rank for s in waiting], hosts=_hosts(waiting), data=data)


def _as_called(waiting: Sequence[RankSnapshot]) -> tuple[str, PendingOp | None]:
    """The collective the ranks wait in as the user called it: a rank inside a guarded call shows
    that call (its all_reduce) where the recorder counted the guard's verification all_gather."""
    for snap in waiting:
        group, op = _waiting_op(snap)
        progress = snap.group(group)
        raw = next((r for r in progress.recent if r.seq == op.seq), None) if progress and op else None
        if raw is not None and (raw.op, raw.sizes) != (op.op, op.sizes):
            return group, op
    return _waiting_op(waiting[0])


def _apart(waiting: Sequence[RankSnapshot]) -> Finding | None:
    """Ranks waiting in collectives of different groups (sequence numbers known) where no collective
    has all its members in it: none can complete (job.E006); None when they wait in one, or when
    some collective has every member (it may complete; the others wait for it)."""
    places: dict[tuple[str, int], list[RankSnapshot]] = {}
    for snap in waiting:
        group, op = _waiting_op(snap)
        if op is None or op.seq is None:
            return None  # told from stacks alone: which collective each is in cannot be compared
        places.setdefault((group, op.seq), []).append(snap)
    if len(places) < 2:
        return None
    everyone = {s.rank for s in waiting}
    for (group, _), members in places.items():
        progress = members[0].group(group)
        needed = set(progress.ranks) if progress is not None and progress.ranks else everyone
        if needed <= {s.rank for s in members}:
            return None
    lines = [f"{ranks_label(sorted(s.rank for s in m))} wait{'s' if len(m) == 1 else ''} in {_op_text(g, _waiting_op(m[0])[1])}"
             for (g, _), m in sorted(places.items())]
    lines = lines if len(lines) <= MAX_LINES else lines[:MAX_LINES - 1] + [f"… and {len(lines) - MAX_LINES + 1} more places"]
    return kinds.MISMATCH(
        "Ranks wait in collectives of different groups, and none of them has every member: "
        + "; ".join(f"rank{'s' if len(m) > 1 else ''} {format_ranks([s.rank for s in m])} in "
                    f"{_op_text(g, _waiting_op(m[0])[1])}" for (g, _), m in sorted(places.items())),
        detail="\n".join(lines + ["each collective waits for a rank that waits in another: the ranks issued the groups' "
                                  "collectives in different orders"]),
        ranks=sorted(everyone), hosts=_hosts(waiting), data=_data(waiting, waiting=sorted(everyone), proven=True))


def _p2p_deadlock(snaps: Sequence[RankSnapshot], waiting: Sequence[RankSnapshot], ops: list[str],
                  lines: Sequence[str] = ()) -> Finding:
    title = f"Every rank waits in a point-to-point call ({', '.join(ops)}) that no peer matches" \
        if set(ops) <= POINT_TO_POINT else f"Ranks wait in point-to-point calls their peers do not match ({', '.join(ops)})"
    return kinds.MISMATCH(
        title, detail="\n".join([_waiters_text(waiting), *lines]), ranks=[s.rank for s in waiting],
        hosts=_hosts(waiting),
        remediation="Order sends and receives so each recv has a peer sending to it at that moment (even ranks "
                    "send first, odd ranks receive first), or post both with dist.batch_isend_irecv",
        data=_data(snaps, ops=ops, waiting=[s.rank for s in waiting], proven=True))


# -- 7. who was not heard from --------------------------------------------------------------------

def _not_heard(snaps: Sequence[RankSnapshot]) -> Finding | None:
    """Ranks wait and others were not heard from: nothing more is known, and that is what is said."""
    silent = [s for s in snaps if s.status == NOT_HEARD]
    waiting = [s for s in snaps if _blocked(s)]
    if not silent or not waiting:
        return None
    group, op = _waiting_op(waiting[0])
    title = (f"Rank{'s' if len(waiting) > 1 else ''} {format_ranks([s.rank for s in waiting])} "
             f"wait{'' if len(waiting) > 1 else 's'} in {_op_text(group, op)}; "
             f"rank{'s' if len(silent) > 1 else ''} {format_ranks([s.rank for s in silent])} "
             f"{'were' if len(silent) > 1 else 'was'} not heard from in time (no cause named yet)")
    lines = [_waiters_text(waiting), *_thread_lines(snaps)]
    return kinds.NOT_HEARD(title, detail="\n".join(lines), ranks=[s.rank for s in silent], hosts=_hosts(silent),
                           data=_data(snaps, group=group, seq=op.seq if op else None, op=op.op if op else None,
                                      waiting=[s.rank for s in waiting]))


def _heard(finding: Finding, snaps: Sequence[RankSnapshot]) -> Finding:
    """The finding with how many ranks were heard from (data) and, when some were not, who (a line)."""
    silent = [s for s in snaps if s.status == NOT_HEARD]
    data = {**finding.data, "heard_from": len(snaps) - len(silent), "ranks_asked": len(snaps)}
    if not silent:
        return finding.with_(data=data)
    data["not_heard"] = [s.rank for s in silent]
    # Ranks whose reasons differ only in numbers (a look's number, a time) are said once, within a
    # bounded number of parts whatever the world size.
    why = said_alike([(s.rank, "; ".join(s.notes) or "no answer") for s in silent],
                     lambda label, text, ranks: f"{label}: {text}")
    line = f"heard from {len(snaps) - len(silent)} of {len(snaps)} ranks; not heard from: " + "; ".join(why)
    return finding.with_(data=data, detail=f"{finding.detail}\n{line}" if finding.detail else line)


def _thread_lines(snaps: Sequence[RankSnapshot]) -> list[str]:
    """Threads that died in ranks still alive (a data loader's prefetch thread behind a stall)."""
    items = []
    for snap in snaps:
        for error in snap.thread_errors[:4]:
            thread = f"its thread {error.thread!r}" if error.thread else "one of its threads"
            items.append((snap.rank, f"{thread} died with {error.type}"
                          + (f" at {error.frame.describe()}" if error.frame else "")
                          + (f": {error.message}" if error.message else "")))
    return said_alike(items, lambda label, text, ranks: f"{label}: {text}", rest="with other threads' errors")
