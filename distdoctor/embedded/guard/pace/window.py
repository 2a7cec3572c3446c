"""One window of a rank's pace as plain data: its waits per group, its main thread's time, GC, the profile."""

# The document every rank publishes once a window (schema distdoctor.pace/1, read by
# diagnosis.pace): a few hundred bytes of waits and times, and the profile's heaviest paths (about
# a kilobyte). Times are this rank's own intervals (perf_counter, the scheduler's counters); the
# window's epoch start and end are there to draw it, never to compare ranks' clocks.

from __future__ import annotations

import time
from typing import Any

from distdoctor.diagnosis.pace import SCHEMA

WAIT_FIELDS = ("waited_ns", "regions", "measured_regions", "steps", "measured_steps")


def _hist(values: list[int]) -> list[int]:
    out = list(values)
    while out and out[-1] == 0:
        out.pop()
    return out


class Windows:
    """The windows of one rank: each closed into its document, the counters started again."""

    def __init__(self, rank: int, host: str, sched: Any, regions: Any, sampler: Any, gcwatch: Any) -> None:
        self.rank, self.host = rank, host
        self.sched, self.regions, self.sampler, self.gcwatch = sched, regions, sampler, gcwatch
        self.index = 0
        self.notes: list[str] = []
        self.gpu = False
        self._start = self._mark()

    def _mark(self) -> tuple[float, int, Any]:
        return time.time(), time.perf_counter_ns(), self.sched.times() if self.sched is not None else None

    def restart(self) -> None:
        """Start the first window now (the first step): what came before is set-up, not the job's pace."""
        self._start = self._mark()
        if self.regions is not None:
            self.regions.take(0)
        if self.gcwatch is not None:
            self.gcwatch.take()
        if self.sampler is not None:
            self.sampler.take()

    def close(self, final: bool = False) -> dict[str, Any]:
        """This window as its document; the next window starts now."""
        (t0, wall0, sched0), end = self._start, self._mark()
        self._start = end
        wall = end[1] - wall0
        cpu = None
        if sched0 is not None and end[2] is not None:
            run, runq = end[2].run_ns - sched0.run_ns, end[2].runq_ns - sched0.runq_ns
            cpu = {"run_s": round(run / 1e9, 4), "runq_s": round(runq / 1e9, 4),
                   "blocked_s": round(max(0, wall - run - runq) / 1e9, 4)}
        waits = []
        for (kind, group), w in sorted(self.regions.take(wall).items()) if self.regions is not None else ():
            waits.append({"group": group, "kind": kind, "waited_s": round(w.waited_ns / 1e9, 5),
                          **{k: getattr(w, k) for k in WAIT_FIELDS if k != "waited_ns"}, "hist": _hist(w.hist)})
        gc_doc = None
        if self.gcwatch is not None and self.gcwatch.installed:
            ns, count, full = self.gcwatch.take()
            gc_doc = {"s": round(ns / 1e9, 4), "n": count, "full": full}
        doc = {"schema": SCHEMA, "rank": self.rank, "host": self.host, "window": self.index, "final": final,
               "t0": round(t0, 3), "t1": round(end[0], 3), "wall_s": round(wall / 1e9, 4), "cpu": cpu, "gc": gc_doc,
               "waits": waits, "profile": self.sampler.take().document() if self.sampler is not None else None,
               "gpu": self.gpu, "notes": list(self.notes)}
        self.index += 1
        return doc
