"""Which collectives the guard verifies: the same decision on every rank, without talking first."""

# Every rank must verify exactly the same calls: a verification exchange on one rank against the
# real collective on another would itself be a mismatch. So the decision depends only on the
# group's sequence number and on values all ranks agreed on at the previous verification: the
# first ``verify_first`` calls of a group are verified, then each verification carries every
# rank's proposal for the gap to the next one, and all ranks take the largest. A rank proposes
# the gap that keeps the verification's cost (its measured exchange time) under ``budget`` of the
# time between the group's calls, and at most ``max_gap``.

from __future__ import annotations

import math


class Sampler:
    def __init__(self, mode: str, first: int, budget: float, max_gap: int) -> None:
        self.mode, self.first, self.budget, self.max_gap = mode, first, budget, max_gap
        self.next: dict[str, int] = {}
        self.last_call: dict[str, float] = {}
        self.interval: dict[str, float] = {}
        self.cost = 0.0

    def note_call(self, group: str, now: float) -> None:
        """A guarded collective of ``group`` starts now (a moving average of the time between calls)."""
        last = self.last_call.get(group)
        self.last_call[group] = now
        if last is not None:
            previous = self.interval.get(group)
            gap = now - last
            if previous is not None:
                # A pause (evaluation, a checkpoint) is not the job's pace: clip it.
                gap = min(gap, 4 * previous)
            self.interval[group] = gap if previous is None else 0.9 * previous + 0.1 * gap

    def due(self, group: str, seq: int) -> bool:
        if self.mode == "all":
            return True
        if self.mode == "off":
            return False
        return seq < self.first or seq >= self.next.get(group, self.first)

    def proposal(self, group: str) -> int:
        """This rank's gap to the next verification, from what verifying and calling cost here."""
        interval = self.interval.get(group)
        if not interval or not self.cost or self.budget <= 0:
            return 1
        return max(1, min(self.max_gap, math.ceil(self.cost / (self.budget * interval))))

    def agreed(self, group: str, seq: int, gaps: list[int], cost_s: float) -> None:
        """After a verification at ``seq``: every rank takes the same next one (the largest gap)."""
        self.cost = cost_s if not self.cost else 0.8 * self.cost + 0.2 * cost_s
        self.next[group] = seq + max(1, min(self.max_gap, max(gaps, default=1)))
