"""Whether the ranks' snapshots can describe one moment of the job: a cut whose sequence numbers are possible together."""

# A look at a running job gathers its ranks' answers over seconds (each rank answers when its watchdog
# next polls), so its snapshots are a cut through the job, not one instant. A cut taken while the job
# moves can pair a rank's old state with a peer's newer one, and a diagnosis of such a pair finds what
# never was: ranks "waiting at different collectives", a rank "left while the others wait". So a
# verdict is made only from a cut that one moment could have produced. The rule read here: a
# collective every member of its group takes part in (all_reduce, all_gather, a barrier ...)
# completes on a rank only once every member issued it. A snapshot whose rank had not yet issued
# collective #s of a group while a peer's snapshot shows #s completed is older than that completion:
# the two were not one moment. (A root's collective -- broadcast, reduce, gather, scatter -- can
# complete on the root before the others issue it, so it proves nothing here.) The cut that passes
# this is still only possible, not proven: the guard confirms a verdict with every answering rank
# (embedded.guard.watch: nothing moved since its answer) before it says or does anything.

from __future__ import annotations

from typing import Iterable, Sequence

from distdoctor.core.rank_groups import ranks_label
from distdoctor.diagnosis.snapshot import GroupProgress, RankSnapshot

EVERY_RANK_TAKES_PART = frozenset({"all_reduce", "allreduce", "all_gather", "allgather", "_allgather_base",
                                   "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                                   "_reduce_scatter_base", "barrier", "all_to_all", "all_to_all_single", "alltoall",
                                   "alltoall_base", "allreduce_coalesced", "allgather_coalesced"})
MAX_LINES = 4


def completed_by_all(progress: GroupProgress) -> int | None:
    """The highest sequence number this rank completed of a collective every member takes part in."""
    done = progress.last_completed
    if done is None:
        return None
    ops = (*progress.recent, *([progress.pending] if progress.pending else ()))
    seqs = [op.seq for op in ops if op.seq is not None and op.seq <= done and op.op in EVERY_RANK_TAKES_PART]
    return max(seqs) if seqs else None


def _groups(snaps: Iterable[RankSnapshot]) -> dict[str, list[tuple[RankSnapshot, GroupProgress]]]:
    out: dict[str, list[tuple[RankSnapshot, GroupProgress]]] = {}
    for snap in snaps:
        for progress in snap.groups:
            out.setdefault(progress.group, []).append((snap, progress))
    return out


def impossible(snaps: Sequence[RankSnapshot]) -> list[str]:
    """Why these snapshots cannot be one moment, a line per group that shows it (at most MAX_LINES);
    [] when their sequence numbers are possible together."""
    lines: list[str] = []
    for group, members in sorted(_groups(snaps).items()):
        floor, by = None, None
        for snap, progress in members:
            done = completed_by_all(progress)
            if done is not None and (floor is None or done > floor):
                floor, by = done, snap.rank
        if floor is None:
            continue
        behind = sorted(snap.rank for snap, progress in members
                        if progress.last_enqueued is not None and progress.last_enqueued < floor
                        and (not progress.ranks or snap.rank in progress.ranks))
        if behind:
            name = "the default group" if group in ("0", "default") else f"group {group}"
            lines.append(f"{ranks_label(behind, capital=True)} had not issued #{floor} of {name} when "
                         f"{'they' if len(behind) > 1 else 'it'} answered, which rank {by} had completed: "
                         f"{'their answers are' if len(behind) > 1 else 'its answer is'} older than rank {by}'s")
    return lines[:MAX_LINES]
