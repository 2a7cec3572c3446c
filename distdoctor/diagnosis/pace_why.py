"""Why a rank's step is longer, from what it measures about itself: GC, CPU contention, I/O, data, uneven work."""

# The slow rank's time per step outside the waits, against its peers', in four parts that add up
# to it: Python's garbage collector (gc.callbacks), other time on a CPU, time runnable but not
# running (schedstat: another process or thread holds its core), and time blocked outside the
# collectives (I/O, a sleep, a lock, a DataLoader queue). The largest difference names the family;
# the time inside DataLoader next(), timed on every rank, and the differential profile's first row
# refine it: data loading when the batches' extra time is at least half of it, a line only this
# rank runs, DataLoader frames under the row.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distdoctor.diagnosis.pace import RankPace

GC, CONTENTION, IO, DATA, RANK_ONLY, UNEVEN, UNKNOWN = ("gc", "cpu contention", "I/O or a wait outside collectives",
                                                       "data loading", "a line only this rank runs", "uneven work",
                                                       "not told")
FIXES = {
    GC: "Collect at the same step on every rank: gc.freeze() once the model and data are built, or gc.disable() and "
        "gc.collect() every N steps on every rank; keep fewer long-lived Python objects",
    CONTENTION: "Give the rank cores of its own: move the other process away, pin each rank to its own cores (taskset, "
                "numactl, the launcher's binding), set OMP_NUM_THREADS to the cores per rank",
    IO: "Take the named line's I/O out of the step (a checkpoint written by a thread, buffered logs), or make it faster",
    DATA: "Feed the rank faster: more DataLoader workers (num_workers), pin_memory and prefetch_factor, transforms "
          "cached or precomputed, samples of equal size on every rank",
    RANK_ONLY: "Run that work on every rank (sharded), less often or in the background; if it must stay on one rank, "
               "the others wait that long",
    UNEVEN: "Give every rank the same work per step: equal batch sizes, samples bucketed by length, the same partition",
    UNKNOWN: "Compare what the slow rank does at the named line with its peers",
}


CONTENTION_MARGIN = 0.1   # its share of time runnable but not running, above its peers', to be contention
LOADER_SHARE = 0.5        # the batches' extra time, of the family's part, to be data loading


@dataclass
class Why:
    family: str
    text: str
    fix: str
    parts: dict[str, float]      # slow rank minus peers, seconds per step: gc, cpu, runq, blocked


def _per_step(pace: RankPace, steps: float, waited: float) -> dict[str, float] | None:
    if pace.run_s is None or pace.runq_s is None or pace.blocked_s is None or steps <= 0:
        return None
    # A collection's wall time holds its own CPU time and its own waits for a CPU: the rest of both is scaled down.
    gc = pace.gc_s or 0.0
    busy = pace.run_s + pace.runq_s
    rest = max(0.0, 1.0 - gc / busy) if busy > 0 else 1.0
    return {"gc": gc / steps, "cpu": pace.run_s * rest / steps, "runq": pace.runq_s * rest / steps,
            "blocked": max(0.0, pace.blocked_s - waited) / steps}


def why(slow: tuple[RankPace, float, float], peers: list[tuple[RankPace, float, float]], rows: list[Any]) -> Why:
    """(pace, steps, all its waits in seconds) of the slow rank and of its peers, and its profile's rows."""
    mine = _per_step(*slow)
    theirs = [p for p in (_per_step(*peer) for peer in peers) if p is not None]
    gc_only = _gc_difference(slow, peers)
    if mine is None or not theirs:
        return _from_rows(rows, gc_only)
    parts = {k: mine[k] - sum(t[k] for t in theirs) / len(theirs) for k in mine}
    if _runq_share(mine) - sum(_runq_share(t) for t in theirs) / len(theirs) < CONTENTION_MARGIN:
        # Waiting for a CPU as much, for its share of the work, as its peers: more work, not contention
        # (a rank given twice the batch waits twice as long for a core on a shared machine).
        parts["cpu"], parts["runq"] = parts["cpu"] + parts["runq"], 0.0
    top = max(parts, key=lambda k: parts[k])
    if parts[top] <= 0:
        return _from_rows(rows, gc_only, parts)
    first = rows[0] if rows else None
    ms = parts[top] * 1e3
    loader = _loader_extra(slow, peers)
    batches = loader is not None and loader >= LOADER_SHARE * parts[top]
    timed = f"; its batches (DataLoader next()) take +{loader * 1e3:.1f} ms per step, timed" if batches else ""
    if top == "gc":
        return Why(GC, f"Python's garbage collector: +{ms:.1f} ms per step ({_gc_counts(slow, peers)})", FIXES[GC], parts)
    if top == "runq":
        share = mine["runq"] / max(1e-12, sum(mine.values()))
        their = sum(t["runq"] / max(1e-12, sum(t.values())) for t in theirs) / len(theirs)
        return Why(CONTENTION, f"CPU contention: runnable but not running +{ms:.1f} ms per step ({share:.0%} of its "
                   f"time outside the waits, its peers {their:.0%})", FIXES[CONTENTION], parts)
    if top == "blocked":
        family = DATA if batches or (first is not None and first.data_loading) else IO
        return Why(family, f"{family}: off a CPU outside the collectives +{ms:.1f} ms per step{timed}", FIXES[family],
                   parts)
    family = DATA if batches else RANK_ONLY if first is not None and first.only_here and first.share >= 0.5 else \
        DATA if first is not None and first.data_loading else UNEVEN
    what = {RANK_ONLY: "a line only this rank runs", DATA: "data loading (DataLoader frames under the line)",
            UNEVEN: "uneven work: the same lines take longer on this rank"}[family]
    return Why(family, f"{what}: +{ms:.1f} ms per step on a CPU{timed}", FIXES[family], parts)


def _runq_share(part: dict[str, float]) -> float:
    busy = part["cpu"] + part["runq"] + part["gc"]
    return part["runq"] / busy if busy > 0 else 0.0


def _loader_extra(slow: tuple[RankPace, float, float], peers: list[tuple[RankPace, float, float]]) -> float | None:
    """The slow rank's time inside DataLoader next() per step above its peers' mean; None when not timed everywhere."""
    if slow[0].loader_s is None or not peers or any(p.loader_s is None for p, _, _ in peers):
        return None
    theirs = sum((p.loader_s or 0.0) / max(steps, 1e-9) for p, steps, _ in peers) / len(peers)
    return slow[0].loader_s / max(slow[1], 1e-9) - theirs


def _gc_difference(slow: tuple[RankPace, float, float], peers: list[tuple[RankPace, float, float]]) -> float:
    mine = (slow[0].gc_s or 0.0) / max(slow[1], 1e-9)
    theirs = [(p.gc_s or 0.0) / max(steps, 1e-9) for p, steps, _ in peers]
    return mine - (sum(theirs) / len(theirs) if theirs else 0.0)


def _gc_counts(slow: tuple[RankPace, float, float], peers: list[tuple[RankPace, float, float]]) -> str:
    mine = slow[0].gc_full / max(slow[1], 1e-9)
    theirs = sum(p.gc_full / max(steps, 1e-9) for p, steps, _ in peers) / max(1, len(peers))
    return f"{mine:.2f} full collections per step on this rank, {theirs:.2f} on its peers"


def _from_rows(rows: list[Any], gc_extra: float, parts: dict[str, float] | None = None) -> Why:
    """Without the scheduler's counters: what the profile's rows and the GC's own timing tell."""
    first = rows[0] if rows else None
    if gc_extra > 0 and (first is None or gc_extra >= 0.5 * first.extra_s):
        return Why(GC, f"Python's garbage collector: +{gc_extra * 1e3:.1f} ms per step", FIXES[GC], parts or {})
    if first is None:
        return Why(UNKNOWN, "not told: no profile of its extra time", FIXES[UNKNOWN], parts or {})
    family = RANK_ONLY if first.only_here else DATA if first.data_loading else UNEVEN
    return Why(family, f"{family} (from the profile; CPU contention cannot be measured here)", FIXES[family], parts or {})
