"""Whether this rank is stalled, in which group and since when: the one place the guard decides "it did not move"."""

# The guard's rule of progress is the diagnosis' (diagnosis.progress.group_advanced, what `stacks`
# and `explain` judge by too): a process group is stalled while it has a collective issued and its
# completed count has not moved (torch's flight recorder, read every poll); a guarded Python call
# is stalled while it runs. Only the completed count matters: on NCCL
# the main thread keeps enqueueing while the first stuck collective holds every later one back.
# Gloo marks completion about 0.5 s late, so a stall shorter than that is not seen at all.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from distdoctor.diagnosis.progress import group_advanced
from distdoctor.diagnosis.snapshot import GroupProgress

# A stall that starts within this many seconds of the one an episode opened on is the same stall
# (polls see the recorder's completion a little late or early).
SAME_STALL_S = 1.0


@dataclass(frozen=True)
class Stall:
    """One group of this rank not moving: since when (time.monotonic), by which count."""

    group: str
    since: float

    def seconds(self, now: float) -> float:
        return max(0.0, now - self.since)


class StallClock:
    """Since when each group's completed count has stood still with a collective pending (the
    shared rule: diagnosis.progress.group_advanced)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[GroupProgress, float]] = {}

    def update(self, status: Mapping[str, tuple[int, int]], now: float) -> Stall | None:
        """The group stalled longest, or None when no group has a pending collective."""
        worst: Stall | None = None
        for group, (enqueued, completed) in status.items():
            current = GroupProgress(group, last_enqueued=enqueued, last_completed=completed)
            if not current.waiting:
                self.seen.pop(group, None)
                continue
            previous = self.seen.get(group)
            # A count that went down is a group made anew (destroyed and re-created): its clock restarts.
            same = previous is not None and (previous[0].last_completed or 0) <= completed
            since = previous[1] if same and not group_advanced(previous[0], current) else now
            self.seen[group] = (current, since)
            if worst is None or since < worst.since:
                worst = Stall(group, since)
        return worst


def longest(recorder: Any, recorded: Stall | None) -> Stall | None:
    """This rank's longest stall: a guarded call still running, or a group the recorder shows stuck."""
    oldest = recorder.oldest_running()
    mine = Stall(oldest.group, oldest.started) if oldest is not None else None
    found = [s for s in (mine, recorded) if s is not None]
    return min(found, key=lambda s: s.since) if found else None


def still(opened: Stall, now: Stall | None) -> bool:
    """True while the stall an episode opened on holds: this rank has not moved since."""
    return now is not None and now.since <= opened.since + SAME_STALL_S
