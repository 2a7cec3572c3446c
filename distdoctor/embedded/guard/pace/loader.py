"""The main thread's time inside a DataLoader's next(), timed exactly: the profile's data lines need no sampling luck."""

# Samples every ~100 ms place a rank's time on its lines with an error of a few percent of the step
# over a window (about 1.5 ms of a 27 ms step over 10 s): enough to swap a 4 ms slower read with a
# line that differs by nothing. A batch is the commonest thing one rank waits longer for, and its
# time is cheap to measure exactly: clock reads around `_BaseDataLoaderIter.__next__` (the iterator
# of every DataLoader, single- and multi-process), about 2 us a batch on a loaded 2-core VM. The
# sampler splits its samples in two strata, inside next() and outside; the window's document gives
# the inside samples' paths the time measured here, in proportion to their sampled time
# (post-stratification), and leaves the others as sampled. A call still running when a window
# closes is split at the close.

from __future__ import annotations

import threading
import time


class LoaderClock:
    """The main thread's time inside DataLoader iterators' __next__ since the last take.

    No lock: a DataLoader worker forked while another thread held one would inherit it held, and
    its next() (a dataset that iterates a DataLoader itself) would never return. The main thread
    instead replaces one tuple (an atomic store under the GIL): (ns of the calls ended so far, calls
    ended, the running call's start or None); the taking thread reads it once and keeps what it
    already counted, so a call running at a take is split there without a shared write.
    """

    def __init__(self) -> None:
        self.main = threading.main_thread().ident
        self.depth = 0              # > 0: the main thread is inside a next() now (the sampler's stratum)
        self.enabled = True
        self._state: tuple[int, int, int | None] = (0, 0, None)
        self._counted = (0, 0)      # the taking thread's: ns and calls already taken

    def enter(self) -> bool:
        """At a next()'s start on the main thread: True when it is timed (while enabled; nested ones count once)."""
        if not self.enabled:
            return False
        self.depth += 1
        if self.depth == 1:
            ended, calls, _ = self._state
            self._state = (ended, calls, time.perf_counter_ns())
        return True

    def leave(self) -> None:
        self.depth = max(0, self.depth - 1)
        ended, calls, started = self._state
        if self.depth == 0 and started is not None:
            self._state = (ended + time.perf_counter_ns() - started, calls + 1, None)

    def take(self) -> tuple[int, int]:
        """(ns inside next(), calls ended) since the last take; a call still running gives its time so far."""
        ended, calls, started = self._state
        so_far = ended + (time.perf_counter_ns() - started if started is not None else 0)
        counted_ns, counted_calls = self._counted
        self._counted = (so_far, calls)
        return max(0, so_far - counted_ns), calls - counted_calls
