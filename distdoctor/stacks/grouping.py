"""Ranks grouped by identical main-thread stack: which ranks share one, which differ (py-spy's habit, as a finding)."""

from __future__ import annotations

from typing import Sequence

from distdoctor.core.findings import Finding
from distdoctor.core.registry import finding_kind
from distdoctor.core.rank_groups import ranks_label, within_budget
from distdoctor.diagnosis.snapshot import Frame, RankSnapshot

_SHOWN_FRAMES = 10
# Stacks described in the finding (the largest group and the odd ones); the rest are counted.
_SHOWN_GROUPS = 4

STACK_GROUPS = finding_kind(
    "stacks.I002", cause="unknown", title="Ranks grouped by identical main-thread stack",
    hint="The ranks whose stack differs from the others' are where to look first; `--format json` holds every thread of every rank (data.stacks)")


def stack_key(snap: RankSnapshot) -> tuple:
    return tuple((f.file, f.line, f.function) for f in snap.stack)


def groups(snaps: Sequence[RankSnapshot]) -> list[list[RankSnapshot]]:
    """Ranks with a stack, grouped by identical stack; the largest group first."""
    by_key: dict[tuple, list[RankSnapshot]] = {}
    for snap in snaps:
        if snap.stack:
            by_key.setdefault(stack_key(snap), []).append(snap)
    return sorted(by_key.values(), key=lambda g: (-len(g), g[0].rank))


def _ranks_text(members: Sequence[RankSnapshot]) -> str:
    return ranks_label(s.rank for s in members)


def _frame_line(frame: Frame) -> str:
    return f"    {frame.label} in {frame.function}" if frame.function else f"    {frame.label}"


def _describe(members: Sequence[RankSnapshot]) -> list[str]:
    first = members[0]
    op = f", in {first.in_collective}" if first.in_collective else ""
    where = f" at {first.where.describe()}" if first.where else ""
    lines = [f"{_ranks_text(members)}{where}{op} (innermost last):"]
    lines += [_frame_line(f) for f in first.stack[-_SHOWN_FRAMES:]]
    return lines


NCCL_NOTE = ("no rank's Python stack is inside a collective. With NCCL, collectives run on the GPU and the CPU "
             "waits later, at a synchronization (loss.item(), .cpu(), an optimizer step): run with --native to see "
             "those waits")


def stack_groups(snaps: Sequence[RankSnapshot], *, native: bool = False) -> Finding | None:
    """One info finding: the groups of identical stacks (None when no stack was read)."""
    found = groups(snaps)
    if not found:
        return None
    if len(found) == 1:
        title = f"All {len(found[0])} ranks read share one stack" if len(found[0]) > 1 else "One rank read"
    else:
        odd = [s for g in found[1:] for s in g]
        title = (f"{_ranks_text(found[0])} share{'s' if len(found[0]) == 1 else ''} one stack; "
                 f"{_ranks_text(odd)} differ{'s' if len(odd) == 1 else ''}")
    by_rank = {g[0].rank: g for g in found}
    shown, rest = within_budget([(g[0].rank, [s.rank for s in g]) for g in found], _SHOWN_GROUPS)
    detail = [line for first, _ in shown for line in _describe(by_rank[first])]
    if rest:
        detail.append(f"… and {len(found) - len(shown)} more distinct stacks, of {ranks_label(rest)} "
                      "(--format json has every rank's)")
    if not native and not any(s.in_collective for g in found for s in g):
        detail.append(NCCL_NOTE)
    hosts = sorted({s.host for g in found for s in g if s.host})
    return STACK_GROUPS(title, detail="\n".join(detail), ranks=[s.rank for g in found for s in g], hosts=hosts,
                        data={"groups": [[s.rank for s in g] for g in found]})
