"""What the main thread waited for its peers: its blocked time inside torch's distributed calls, per group and step."""

# A rank's own wait inside a collective needs no clock of another host: the time the main thread
# spent inside a call that waits for peers (a guarded collective, a DDP model's backward with its
# gradient all-reduce, a DDP forward that broadcasts buffers, an FSDP forward) and was neither on a
# CPU nor runnable (the scheduler's counters, machine.thread_sched) is time it waited for data from
# the others. The rank the group waits for waits least. Torch's flight recorder cannot say it on
# gloo: its entries carry the enqueue time only (time_discovered_*_ns and duration_ms stay None;
# measured on torch 2.13), and the completed count it updates is read every 0.25 s, far coarser
# than a step.
#
# Steps: a backward of a DDP (or FSDP) model that syncs its gradients ends one step of that model's
# group; a group without one counts each of its calls as a step. A step's wait is the sum of its
# regions' waits, kept in a histogram with bins growing by 1.8x from 20 us, so a judge can tell a
# rank that is always last (its waits stay at the transfer floor) from ranks that take turns.
#
# Cost: two pread()s of schedstat per measured region (a few us). Steps shorter than STEP_TARGET_NS
# are measured one in `stride` (the same statistics, a bounded cost: measured in the DDP tutorial's
# 3.7 ms step, every other step measured cost about 2 % of the step on a loaded 2-core machine); every
# step is counted.

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from distdoctor.diagnosis.pace import BINS, edges_ms
from distdoctor.embedded.guard.record import POINT_TO_POINT

EDGES_MS = tuple(edges_ms())  # the last bin holds the rest
STEP_TARGET_NS = 50_000_000   # a measured step at most every 50 ms of the job's time
MAX_STRIDE = 16
COLLECTIVE, P2P = "collective", "p2p"


def bin_of(ms: float) -> int:
    """The histogram bin of a wait in milliseconds."""
    for index, edge in enumerate(EDGES_MS):
        if ms < edge:
            return index
    return BINS - 1


@dataclass
class GroupWaits:
    """One group's waits over a window."""

    waited_ns: int = 0
    regions: int = 0
    measured_regions: int = 0
    steps: int = 0
    measured_steps: int = 0
    hist: list[int] = field(default_factory=lambda: [0] * BINS)
    pending_ns: int = 0           # the open step's measured wait so far
    pending_measured: bool = False

    def close_step(self, measured: bool) -> None:
        self.steps += 1
        if measured or self.pending_measured:
            self.measured_steps += 1
            self.hist[bin_of(self.pending_ns / 1e6)] += 1
        self.pending_ns, self.pending_measured = 0, False


class Regions:
    """The waits of one process's main thread, as torch's distributed calls enter and leave."""

    def __init__(self, sched: Any, default_group: str = "0") -> None:
        self.sched = sched                       # machine.thread_sched.ThreadSched of the main thread, or None
        self.ident = threading.main_thread().ident
        self.default_group = default_group
        self.enabled = True
        self.depth = 0                           # nested regions (FSDP's modules, a collective inside backward)
        self.groups: dict[tuple[str, str], GroupWaits] = {}
        self.stepped: set[str] = set()           # groups whose steps are backwards
        self.sync_group: str | None = None       # the group of the last DDP/FSDP forward that syncs gradients
        self.stride, self.ordinal, self.measuring = 1, 0, True

    # -- a region, on the main thread -----------------------------------------------------------
    def enter(self) -> Any:
        """At a region's start: a token (None: nested or off, nothing to measure)."""
        self.depth += 1
        if self.depth > 1 or not self.enabled:
            return None
        if not self.measuring:
            return False
        times = self.sched.times() if self.sched is not None else None
        return (time.perf_counter_ns(), times) if times is not None else False

    def leave(self, token: Any, group: str, kind: str = COLLECTIVE, step: bool = True) -> None:
        """At a region's end: its blocked time added to ``group``; ``step``: a call that is a step of a
        group whose steps are not backwards."""
        self.depth = max(0, self.depth - 1)
        if token is None:
            return
        waits = self._waits(kind, group)
        waits.regions += 1
        if token:
            blocked = self._blocked(token)
            waits.waited_ns += blocked
            waits.pending_ns += blocked
            waits.measured_regions += 1
            waits.pending_measured = True
        if step and group not in self.stepped:
            self._close(waits)

    def leave_call(self, token: Any, record: Any, is_async: bool) -> None:
        """A guarded call ends (embedded.guard.calls.run_call): an async one waited for nothing yet."""
        if is_async:
            self.depth = max(0, self.depth - 1)
            return
        self.leave(token, record.group, P2P if record.op in POINT_TO_POINT else COLLECTIVE)

    def leave_backward(self, token: Any) -> None:
        """A backward ends: a step of the group whose model synced its gradients in it."""
        group = self.sync_group
        self.sync_group = None
        self.leave(token, group or self.default_group, step=False)
        if token is not None and group is not None:
            self.stepped.add(group)
            self._close(self._waits(COLLECTIVE, group))

    def _blocked(self, token: tuple[int, Any]) -> int:
        wall0, sched0 = token
        sched1 = self.sched.times()
        wall = time.perf_counter_ns() - wall0
        if sched1 is None:
            return 0
        off_cpu = wall - (sched1.run_ns - sched0.run_ns)
        runq = sched1.runq_ns - sched0.runq_ns
        if runq > off_cpu:
            # More time runnable than off a CPU: not time runnable but a stale stamp (on Linux 6.18, a thread woken
            # from a sleep begun right after running, on a CPU shared with a busy process, reads milliseconds of
            # runnable time it did not spend). Its time off a CPU is the wait; a reading that stays under it is kept.
            runq = 0
        return max(0, off_cpu - runq)

    def _waits(self, kind: str, group: str) -> GroupWaits:
        key = (kind, group)
        waits = self.groups.get(key)
        if waits is None:
            waits = self.groups[key] = GroupWaits()
        return waits

    def _close(self, waits: GroupWaits) -> None:
        waits.close_step(False)
        self.ordinal += 1
        self.measuring = self.ordinal % self.stride == 0

    # -- the window, from the accounting thread ---------------------------------------------------
    def take(self, wall_ns: int) -> dict[tuple[str, str], GroupWaits]:
        """The window's waits (and a fresh set for the next); the stride follows the window's step time."""
        taken, self.groups = self.groups, {}
        steps = max((w.steps for w in taken.values()), default=0)
        if steps and wall_ns > 0:
            self.stride = max(1, min(MAX_STRIDE, int(STEP_TARGET_NS // max(1, wall_ns // steps)) or 1))
        return taken
