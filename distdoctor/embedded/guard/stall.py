"""Whether this rank is stalled, in which group and since when: the one place the guard decides "it did not move"."""

# The guard's rule of progress is the diagnosis' (diagnosis.progress.group_advanced, what `stacks`
# and `explain` judge by too): a process group is stalled while it has a collective issued and its
# completed count has not moved (torch's flight recorder, read every poll); a guarded Python call
# is stalled while it runs. Only the completed count matters: on NCCL
# the main thread keeps enqueueing while the first stuck collective holds every later one back.
# Gloo marks completion about 0.5 s late, so a stall shorter than that is not seen at all.
# Without the recorder, a wait the main thread's stack shows (embedded.guard.mainthread: DDP's
# all-reduce in backward, a c10d function, FSDP's Work.wait()) is stalled for as long as the thread
# has stayed in it: the shared rule again (diagnosis.progress.stayed), look after look.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

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


def in_wait(main: Any, group_of: Callable[[], str]) -> Stall | None:
    """The main thread's stay in the wait its latest look shows, as a stall of its group (asked of
    ``group_of`` only then); None when its stack shows no wait (``main``:
    embedded.guard.mainthread.MainThread, looked at this poll)."""
    since = main.waits_since()
    return Stall(group_of(), since) if since is not None else None


def longest(recorder: Any, *found: Stall | None) -> Stall | None:
    """This rank's longest stall: a guarded call still running, a group the recorder shows stuck, or
    a wait the main thread's stack has stayed in."""
    oldest = recorder.oldest_running()
    mine = Stall(oldest.group, oldest.started) if oldest is not None else None
    stalls = [s for s in (mine, *found) if s is not None]
    return min(stalls, key=lambda s: s.since) if stalls else None


def still(opened: Stall, now: Stall | None) -> bool:
    """True while the stall an episode opened on holds: this rank has not moved since."""
    return now is not None and now.since <= opened.since + SAME_STALL_S


class Backoff:
    """Looks at one stall that came back without a verdict (everyone had moved, or the diagnosis
    failed) are spaced out: the first retry after ``first_s``, each next one twice as late, at most
    ``most_s``; a new stall starts afresh."""

    def __init__(self, first_s: float, most_s: float) -> None:
        self.first_s, self.most_s = first_s, max(first_s, most_s)
        self.stall: Stall | None = None
        self.until = 0.0
        self.wait_s = 0.0
        self.tries = 0

    def _same(self, stall: Stall) -> bool:
        return self.stall is not None and abs(stall.since - self.stall.since) <= SAME_STALL_S

    def holds(self, stall: Stall, now: float) -> bool:
        """True while this stall's next look must wait."""
        if not self._same(stall):
            self.stall, self.tries = None, 0
            return False
        return now < self.until

    def empty(self, stall: Stall, now: float) -> int:
        """A look at ``stall`` gave no verdict: the next waits longer. Returns how many in a row."""
        same = self._same(stall)
        self.wait_s = min(self.most_s, self.wait_s * 2) if same else self.first_s
        self.stall, self.until, self.tries = stall, now + self.wait_s, (self.tries + 1 if same else 1)
        return self.tries
