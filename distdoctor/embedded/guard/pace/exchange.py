"""The windows through the job's store: each rank's published once a window, every rank's read by the judging rank."""

# The store load is bounded as the guard's healthy polling is (embedded.guard.cadence): a rank
# publishes at most every max(window, N / 64 s) — one request (`pace/<rank>`; the first time
# also its number on the roster, so the roster grows once per rank, never per window) — so the
# job's publications stay under 64 requests a second whatever its size. The judging rank reads
# the roster and the documents it lists, 256 per multi_get: a few requests per window at 4,096
# ranks. Nothing waits for a key that may be missing.

from __future__ import annotations

from typing import Any

from distdoctor.embedded.guard import cadence

KIND = "pace"


def interval_s(window_s: float, world: int) -> float:
    """How often a rank publishes its window (and the judging rank reads them all)."""
    return max(window_s, cadence.busy_interval_s(world))


class Exchange:
    """One rank's side of the windows' exchange."""

    def __init__(self, side: Any, rank: int) -> None:
        self.side, self.rank = side, rank
        self.listed = False

    def publish(self, document: dict[str, Any], wait_s: float = 0.0) -> None:
        if not self.listed:
            self.side.publish(KIND, self.rank, document, wait_s=wait_s)
            self.listed = True
        else:
            if wait_s:
                self.side.client(wait_s)
            self.side.put(self.side.key(KIND, self.rank), document)

    def gather(self) -> dict[int, Any]:
        """Every published rank's latest window document."""
        roster = self.side.roster(KIND)
        return self.side.read_many(KIND, roster, listed=roster) if roster else {}
