"""The collective stage's deadline per check, from the world's measured start-up and its size."""

# Every collective check waits for the slowest rank: forming the gloo group is a barrier over
# N ranks (each rank's store reads and its N-1 connections), and on a node with more ranks than
# cores each rank gets a share of a core. A fixed --check-timeout (10 s) is right for 2-8 ranks
# and wrong at 32-48: measured on the project's 2-core test machine, forming the group took 5.7 s
# at 48 self-test ranks and 10.3-10.6 s at 32 ranks under torchrun (each imported torch itself),
# which the fixed 10 s cut off. So rank 0, which saw every check-in arrive, publishes one deadline
# per check for the stage with its decision, and every rank applies the same one:
#
#   max(--check-timeout, --check-timeout / 2 + the check-ins' spread + PER_RANK_S x world size)
#
# The spread (from the first check-in to the last, on rank 0's clock) is the world's start-up
# measured: ranks that arrived that far apart reach a barrier that far apart, and a node slow
# enough to spread them is as slow at the barrier's own work. Capped by what the run's deadline
# leaves (the runner's own bound), so --timeout still holds.

from __future__ import annotations

from typing import Any, Iterable

# Per rank of the world: a rank's part in forming a group (store reads, connections), on a
# loaded node (measured: 48 ranks, 5.7 s on 2 cores).
PER_RANK_S = 0.1


def arrival_spread(arrivals: Iterable[Any]) -> float:
    """Seconds from the first check-in of the world to the last, as rank 0 saw them (first claims)."""
    seen = [a.seen_s for a in arrivals if getattr(a, "claim", 1) == 1]
    return max(seen) - min(seen) if len(seen) > 1 else 0.0


def collective_check_s(check_timeout: float, spread_s: float, size: int) -> float:
    """The deadline of each collective check (see the module's comment)."""
    return round(max(check_timeout, check_timeout / 2 + spread_s + PER_RANK_S * max(size, 1)), 1)


def stage_need_s(spread_s: float, size: int) -> float:
    """What the stage needs beyond a small world's few tenths of a second: the ranks' spread and
    their share of forming the group (a run whose deadline leaves less skips the stage, saying so)."""
    return spread_s + PER_RANK_S * max(size, 1)


def why(check_s: float, check_timeout: float, spread_s: float, size: int) -> str:
    """In words, for the report: why the stage's checks had the deadline they had."""
    if check_s <= check_timeout:
        return f"each collective check had --check-timeout ({check_timeout:g} s)"
    return (f"each collective check had {check_s:g} s instead of --check-timeout ({check_timeout:g} s): the world's "
            f"{size} ranks checked in over {spread_s:.1f} s, and forming a group waits for the last of them")
