"""Which collectives the guard verifies: the same decision on every rank, without talking first."""

# Every rank must verify exactly the same calls: a verification exchange on one rank against the
# real collective on another would itself be a mismatch. So the decision depends only on the
# group's sequence number and on values all ranks agreed on at the previous verification: the
# first ``verify_first`` calls of a group are verified, then each verification carries every
# rank's proposal for the gap to the next one, and all ranks take the largest. A rank proposes
# the gap that keeps the verification's cost under ``budget`` of the time between the group's
# calls, and at most ``max_gap``. Both are measured only at verified calls (nothing is added to
# the others): the cost is what the last verified call took beyond a plain one, the time between
# calls is the span since the last verified call over the calls in it.

from __future__ import annotations

import math
from typing import Any, Iterable


class Sampler:
    def __init__(self, mode: str, first: int, budget: float, max_gap: int) -> None:
        self.mode, self.first, self.budget, self.max_gap = mode, first, budget, max_gap
        self.next: dict[str, int] = {}
        self.mark: dict[str, tuple[int, float]] = {}  # group -> (seq, start) of its last verified call
        self.spans: dict[str, list[float]] = {}
        self.interval: dict[str, float] = {}
        self.cost = 0.0

    def due(self, group: str, seq: int, now: float | None = None) -> bool:
        """Is call ``seq`` of ``group`` (starting at ``now``) verified? Nothing else is done per call:
        the time between calls is measured over the span between verified calls."""
        mode = self.mode
        if mode != "sample":
            return mode == "all"
        if seq >= self.first and seq < self.next.get(group, self.first):
            return False
        if now is not None:
            self._span(group, seq, now)
        return True

    def _span(self, group: str, seq: int, now: float) -> None:
        """The mean time between the group's calls since its last verified one; the group's pace is
        the median of the last five such spans, so a pause (evaluation, a checkpoint) does not count."""
        mark = self.mark.get(group)
        self.mark[group] = (seq, now)
        if mark is None or seq <= mark[0]:
            return
        spans = self.spans.setdefault(group, [])
        spans.append((now - mark[1]) / (seq - mark[0]))
        del spans[:-5]
        self.interval[group] = sorted(spans)[len(spans) // 2]

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


def verification_cost(last: Any, recent: Iterable[Any], exchange_s: float) -> float:
    """What one verification costs the job: the last verified call's duration beyond the median
    unverified call's (the exchange, the Python around it, the cold caches and the peers' drift it
    adds), never less than this exchange alone; the exchange alone while there is nothing to compare."""
    if last is None or last.ended is None:
        return exchange_s
    plain = sorted(r.ended - r.started for r in recent if not r.verified and r.ended is not None)
    if not plain:
        return exchange_s
    return max(exchange_s, (last.ended - last.started) - plain[len(plain) // 2])
