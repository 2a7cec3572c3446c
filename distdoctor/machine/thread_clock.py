"""One thread's counters as the kernel keeps them in /proc: state, CPU time, times put on a CPU."""

# Read by `distdoctor stacks` (another process's main thread, between two py-spy dumps) and by
# the guard's watchdog (its own process's main thread, every poll): one reader, so both judge
# "did this thread do anything between two looks" from the same numbers (the stat line parsed by
# machine.proc_stat, the one reader of /proc/<pid>/stat).

from __future__ import annotations

import os
from typing import NamedTuple

from distdoctor.machine.proc_stat import stat_fields

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ThreadClock(NamedTuple):
    """What the kernel says of one thread: its state letter, CPU seconds, and how often it was put on a CPU."""

    state: str = ""
    cpu_s: float | None = None
    runs: int | None = None


def read_thread(task_dir: str) -> ThreadClock:
    """The counters of the thread at ``task_dir`` (/proc/<pid>/task/<tid>); empty fields where
    unreadable, never raises."""
    state, cpu, runs = "", None, None
    fields = stat_fields(f"{task_dir}/stat")
    if fields:
        state = fields[0][:1]
        try:
            cpu = (int(fields[11]) + int(fields[12])) / TICKS
        except (ValueError, IndexError):
            pass
    try:  # time on a CPU in ns (finer than stat's clock ticks) and times put on one (kernels with schedstats)
        with open(f"{task_dir}/schedstat", encoding="ascii") as fh:
            ran_ns, _, slices = fh.read().split()[:3]
        cpu, runs = int(ran_ns) / 1e9, int(slices)
    except (OSError, ValueError):
        runs = _context_switches(task_dir)
    return ThreadClock(state, cpu, runs)


def _context_switches(task_dir: str) -> int | None:
    """Voluntary and involuntary context switches of a thread (where the kernel keeps no schedstat)."""
    try:
        with open(f"{task_dir}/status", encoding="ascii", errors="replace") as fh:
            return sum(int(line.split()[1]) for line in fh if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))
    except (OSError, ValueError, IndexError):
        return None
