"""One thread of this process as the scheduler counts it, read cheaply and often: time on a CPU, time runnable, state."""

# The guard's slow-rank accounting reads its main thread's counters at every collective it waits
# in and at every profile sample: open()+read() of a /proc file costs ~70 us, a pread() of a file
# kept open ~3 us (the kernel regenerates a seq_file at each read from offset 0). schedstat gives
# the nanoseconds the thread ran and the nanoseconds it was runnable but waited for a CPU (CPU
# contention); what is left of the wall time, it was blocked (a collective's wait, I/O, a sleep).
# The time it ran is read from its CPU clock (clock_gettime, ~1 us) where there is one: schedstat's
# run time is brought up to date only at a tick or a switch, so a thread that has run 2 ms since it
# last woke reads up to a tick (4 ms at HZ=250) short, and a wait that follows reads that much short
# (a rank's waits for a slower peer read half of what it lost on a 2-core machine). Its runnable
# time is brought up to date when the thread is switched in, so it is current when the thread reads
# its own, at most the present wait behind when another thread does; on Linux 6.18 a thread woken
# on a CPU shared with a busy process can read milliseconds it did not spend (the guard's regions
# do not subtract a reading longer than the time off a CPU).
# A kernel without schedstats (or a /proc that refuses) gives None: the caller says what it
# cannot measure.

from __future__ import annotations

import os
import threading
import time
from typing import NamedTuple


class SchedTimes(NamedTuple):
    """Cumulative nanoseconds the thread ran on a CPU, and waited runnable for one."""

    run_ns: int
    runq_ns: int


class ThreadSched:
    """The scheduler's counters of one thread, through file descriptors kept open."""

    def __init__(self, tid: int | None = None) -> None:
        self.tid = tid if tid is not None else getattr(threading.main_thread(), "native_id", None)
        self._sched = self._open("schedstat")
        self._stat = self._open("stat")
        self._clock = _cpu_clock(self.tid)

    def _open(self, name: str) -> int | None:
        if self.tid is None:
            return None
        try:
            return os.open(f"/proc/self/task/{self.tid}/{name}", os.O_RDONLY)
        except OSError:  # not Linux, a /proc that refuses, a kernel without schedstats
            return None

    @property
    def usable(self) -> bool:
        return self._sched is not None

    def times(self) -> SchedTimes | None:
        """(ran, waited runnable) in ns since the thread began; None when unreadable."""
        fd = self._sched
        if fd is None:
            return None
        try:
            parts = os.pread(fd, 96, 0).split()
            run = time.clock_gettime_ns(self._clock) if self._clock is not None else int(parts[0])
            return SchedTimes(run, int(parts[1]))
        except (OSError, ValueError, IndexError):
            return None

    def state(self) -> str:
        """The thread's state letter now (R running or runnable, S sleeping, D in uninterruptible I/O), or ""."""
        fd = self._stat
        if fd is None:
            return ""
        try:
            raw = os.pread(fd, 512, 0)
            return chr(raw[raw.rindex(b")") + 2])
        except (OSError, ValueError, IndexError):
            return ""

    def close(self) -> None:
        for fd in (self._sched, self._stat):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._sched = self._stat = None


def _cpu_clock(tid: int | None) -> int | None:
    """The CPU clock of this process's thread ``tid``, or None (not a thread of this process now, no such clock)."""
    ident = next((t.ident for t in threading.enumerate() if tid is not None and t.native_id == tid), None)
    getter = getattr(time, "pthread_getcpuclockid", None)
    if ident is None or getter is None:
        return None
    try:
        clock = getter(ident)
        time.clock_gettime_ns(clock)
        return clock
    except (OSError, OverflowError, ValueError):
        return None
