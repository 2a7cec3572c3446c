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
#      (no rank's connections received data) or slow but moving (diagnosis.stuck).
# Nothing failed and nobody waits: no finding (the caller says what it looked at).

from __future__ import annotations

import re
import signal
from collections import Counter
from dataclasses import replace
from typing import Any, Iterable, Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.report import format_ranks
from distdoctor.diagnosis import kinds
from distdoctor.diagnosis.frames import is_user_file
from distdoctor.diagnosis.snapshot import (EXITED, FINISHED, KILLED, RAISED, RUNNING, UNKNOWN, UNREACHABLE,
                                           GroupProgress, PendingOp, RankSnapshot)
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
               or (None if mismatch else _all_waiting(snaps, waited_s)))
    found = [_unnumbered(f, snaps) for f in (primary, mismatch) if f is not None]
    return [f.with_(check=kinds.CHECK) for f in found]


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
    (broadcast, reduce, gather, scatter) can complete on the root before the others received.
    """
    done: dict[str, int] = {}
    for snap in snaps:
        for group in snap.groups:
            if group.last_completed is not None:
                done[group.group] = max(done.get(group.group, -1), group.last_completed)
    out = []
    for snap in snaps:
        groups = []
        for group in snap.groups:
            top = done.get(group.group)
            if (group.pending is not None and group.pending.seq is not None and top is not None
                    and group.pending.seq <= top and (_outside_torch(snap) or _passed(group))):
                completed = min(top, group.last_enqueued) if group.last_enqueued is not None else top
                later = next((op for op in group.recent if op.seq is not None and op.seq > completed), None)
                group = replace(group, last_completed=max(group.last_completed or -1, completed), pending=later)
            groups.append(group)
        out.append(replace(snap, groups=tuple(groups)))
    return out


EVERY_RANK_TAKES_PART = frozenset({"all_reduce", "allreduce", "all_gather", "allgather", "_allgather_base",
                                   "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                                   "_reduce_scatter_base", "barrier", "all_to_all", "all_to_all_single", "alltoall",
                                   "alltoall_base", "allreduce_coalesced", "allgather_coalesced"})


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


MAX_LISTED = 16  # ranks described one by one in a detail line; a 1024-rank job names the rest by count


def _listed(parts: list[str]) -> str:
    if len(parts) <= MAX_LISTED:
        return "; ".join(parts)
    return "; ".join(parts[:MAX_LISTED]) + f"; … and {len(parts) - MAX_LISTED} more ranks"


def _waiters_text(waiting: Sequence[RankSnapshot]) -> str:
    """What the waiting ranks are in; ranks in the same call at the same line are said once
    (`ranks 0, 2-3 wait in ...`), so a 64-rank job reads as one line per place."""
    places: dict[tuple[str, str], list[tuple[int, float | None]]] = {}
    for snap in waiting:
        group, op = _waiting_op(snap)
        if not snap.waiting and snap.error is not None:
            text = (f"failed in {_op_text(group, op)}{_where(snap)} with {snap.error.type}: {snap.error.message}")[:400]
            places.setdefault(("failed", text), []).append((snap.rank, None))
            continue
        age = op.age_s if op is not None else None
        places.setdefault(("waits", f"{_op_text(group, op)}{_where(snap)}"), []).append((snap.rank, age))
    parts = [_place_text(verb, text, members) for (verb, text), members in places.items()]
    if len(parts) > MAX_LISTED:
        return "; ".join(parts[:MAX_LISTED]) + f"; … and {len(parts) - MAX_LISTED} more places"
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


def _progress_text(snap: RankSnapshot, group: str = DEFAULT_GROUP) -> str:
    progress = snap.group(group)
    if progress is None or progress.last_enqueued is None:
        return f"{snap.collectives} collectives issued" if snap.collectives is not None else ""
    return f"its last collective in {group_label(group)}: #{progress.last_enqueued}"


def _exit_text(snap: RankSnapshot) -> str:
    if snap.status == KILLED and snap.exit_code is not None:
        return f"killed by {signal_name(-snap.exit_code)} (exit {snap.exit_code})"
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


def _data(snaps: Sequence[RankSnapshot], **extra: Any) -> dict[str, Any]:
    return {**extra, "snapshots": [s.to_dict() for s in snaps]}


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
    consequences = [_consequence_text(s) for s in others]
    detail_tail = [c for c in consequences if c]
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
        lines.append("then, as a consequence: " + _listed(detail_tail))
    lines += _stack_lines(first)
    return kind(title, detail="\n".join(lines), ranks=[first.rank], hosts=_hosts([first]),
                data=_data(snaps, first_rank=first.rank,
                           consequences=[s.rank for s in others if _consequence_text(s)]))


def _consequence_text(snap: RankSnapshot) -> str:
    if snap.error is not None:
        return f"rank {snap.rank} {'failed' if snap.error.consequence else 'also raised'} with {snap.error.describe()}"
    if snap.status in (KILLED, EXITED) and snap.exit_code not in (None, 0):
        return f"rank {snap.rank} {_exit_text(snap)}"
    if _blocked(snap):
        return _waiters_text([snap])
    return ""


# -- 2-4. a rank that left, went silent or is late -------------------------------------------------

def _left_early(snaps: Sequence[RankSnapshot]) -> Finding | None:
    waiting = [s for s in snaps if _blocked(s)]
    left = [s for s in snaps if not _blocked(s) and (s.status == FINISHED or (s.status == EXITED and s.exit_code == 0))]
    if not waiting or not left:
        return None
    group, op = _waiting_op(waiting[0])
    leavers = "; ".join(f"rank {s.rank} {_exit_text(s)}" + (f" ({_progress_text(s, group)})" if _progress_text(s, group) else "")
                        + _where(s) for s in left)
    title = (f"Rank{'s' if len(left) > 1 else ''} {', '.join(str(s.rank) for s in left)} left the job while "
             f"rank{'s' if len(waiting) > 1 else ''} {', '.join(str(s.rank) for s in waiting)} still "
             f"wait{'' if len(waiting) > 1 else 's'} in {_op_text(group, op)}")
    detail = "\n".join([leavers, _waiters_text(waiting)])
    return kinds.UNEVEN(title, detail=detail, ranks=[s.rank for s in left], hosts=_hosts(left),
                        data=_data(snaps, group=group, seq=op.seq if op else None, op=op.op if op else None,
                                   left=[s.rank for s in left], waiting=[s.rank for s in waiting]))


def _missing(snaps: Sequence[RankSnapshot]) -> Finding | None:
    waiting = [s for s in snaps if _blocked(s)]
    # An exit whose status the source did not see (the launcher reaped it) is missing too.
    silent = [s for s in snaps if not _blocked(s) and (
        s.status in (UNREACHABLE, UNKNOWN) or (s.status == KILLED and s.exit_code is not None)
        or (s.status == EXITED and s.exit_code is None))]
    if not waiting or not silent:
        return None
    group, op = _waiting_op(waiting[0])
    title = (f"Rank{'s' if len(silent) > 1 else ''} {', '.join(str(s.rank) for s in silent)} "
             f"{'did not answer' if all(s.status not in (KILLED, EXITED) for s in silent) else 'ended'} while the others wait in {_op_text(group, op)}")
    lines = [f"rank {s.rank}{' on ' + s.host if s.host else ''} {_exit_text(s)}"
             + (f" ({'; '.join(s.notes)})" if s.notes else "") for s in silent]
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
    late = ", ".join(str(s.rank) for s in idle)
    title = (f"Rank{'s' if len(idle) > 1 else ''} {late} {'have' if len(idle) > 1 else 'has'} not arrived at "
             f"{_op_text(group, op)}" + (f": at {idle[0].where.describe()}" if idle[0].where else ""))
    lines = []
    for snap in idle:
        progress = _progress_text(snap, group)
        lines.append(f"rank {snap.rank}{' on ' + snap.host if snap.host else ''} is not in a collective"
                     + (f", at {snap.where.describe()}" if snap.where else
                        " (its stack has no frame of your code)" if snap.stack else " (where in your code is not known)")
                     + (f" for {snap.still_s:.1f} s" if snap.still_s else "")
                     + (f" ({progress})" if progress else ""))
    lines.append(_waiters_text(waiting) + (f" (the first waited {waited_s:.1f} s)" if waited_s else ""))
    lines += _thread_lines(snaps)
    for snap in idle:
        lines += _stack_lines(snap)
    return kinds.STRAGGLER(title, detail="\n".join(lines), ranks=[s.rank for s in idle], hosts=_hosts(idle),
                           data=_data(snaps, group=group, seq=op.seq if op else None, op=op.op if op else None,
                                      late=[s.rank for s in idle], waiting=[s.rank for s in waiting]))


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
            lines = [f"rank {r}: {ops[r].describe()}" for r in sorted(ops)]
            title = f"{ops[min(ops)].op} #{seq} of {group_label(group)} differs in {field} across ranks: " + \
                "; ".join(f"rank {r}: {_field_text(field, ops[r])}" for r in sorted(ops))
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
            lines = [f"rank {r} waits in {ops[r].describe()}" for r in sorted(ops)]
            return kinds.MISMATCH(
                f"Ranks wait at different collectives of {group_label(group)}: "
                + "; ".join(f"rank {r} in {ops[r].describe()}" for r in sorted(ops)),
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
    lines = [f"rank {s.rank} waits in {_op_text(*_waiting_op(s))}" for s in waiting][:MAX_LISTED]
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


def _thread_lines(snaps: Sequence[RankSnapshot]) -> list[str]:
    """Threads that died in ranks still alive (a data loader's prefetch thread behind a stall)."""
    lines = []
    for snap in snaps:
        for error in snap.thread_errors[:4]:
            thread = f"its thread {error.thread!r}" if error.thread else "one of its threads"
            lines.append(f"rank {snap.rank}: {thread} died with {error.type}"
                         + (f" at {error.frame.describe()}" if error.frame else "")
                         + (f": {error.message}" if error.message else ""))
    return lines
