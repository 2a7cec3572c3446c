"""One rank's pace accounting: its regions, samples and GC measured, a window published, the job judged on rank 0."""

# A thread of its own ("distdoctor-guard-pace"): every ~sample_s (0.1 s, jittered: a sample never beats
# with the step) it samples the main thread; every window it closes the window's document and
# publishes it (exchange.Exchange); rank 0 then reads every rank's and follows the verdict
# (diagnosis.pace_watch), saying a line when a slow rank starts or stops holding the job up. At
# the end of the run every rank publishes its last window and rank 0 judges the whole run: the
# report on stderr, slow_ranks.json and a JSON report in the report directory. Any fault of its own
# is said once (guard.W012) and the accounting goes on; it never touches the training thread
# beyond the wrapped regions' few microseconds.

from __future__ import annotations

import random
import socket
import threading
import time
from typing import Any

from distdoctor.diagnosis.pace import from_doc, merge, to_doc
from distdoctor.diagnosis.pace_watch import Watcher
from distdoctor.embedded.guard import cadence, calls
from distdoctor.embedded.guard.mainthread import gpu_in_use
from distdoctor.embedded.guard.pace.exchange import Exchange, interval_s
from distdoctor.embedded.guard.pace.gcwatch import GcWatch
from distdoctor.embedded.guard.pace.hooks import LOADER_ITER, Hooks
from distdoctor.embedded.guard.pace.loader import LoaderClock
from distdoctor.embedded.guard.pace.regions import Regions
from distdoctor.embedded.guard.pace.sampler import Sampler
from distdoctor.embedded.guard.pace.window import Windows
from distdoctor.machine.thread_sched import ThreadSched

SAMPLE_S = 0.1
JOIN_S = 6.0           # above a store request's own deadline: the thread is never left inside one at exit
FINAL_GATHER_S = 3.0   # how long rank 0 waits at the end for the others' last windows
GPU_NOTE = ("waits inside collectives are not measured on a process that drives a GPU (its main thread also waits "
            "for the device); NCCL's own durations need TORCH_NCCL_ENABLE_TIMING=1")
SCHED_NOTE = ("CPU contention and the waits inside collectives cannot be measured: this system has no "
              "/proc/self/task/<tid>/schedstat")


class Meter:
    """The accounting of one guarded process."""

    def __init__(self, guard: Any, window_s: float, sample_s: float = SAMPLE_S) -> None:
        self.guard, self.window_s, self.sample_s = guard, window_s, sample_s
        self.rank, self.world = guard.rank, guard.world
        sched = ThreadSched()
        self.sched = sched if sched.usable else None
        self.regions = Regions(self.sched, default_group=guard.pg_name(guard.c10d.GroupMember.WORLD))
        self.gc = GcWatch()
        self.loader = LoaderClock()
        self.sampler = Sampler(threading.main_thread().ident, self.sched, self.regions, self.gc, self.loader)
        self.windows = Windows(self.rank, socket.gethostname(), self.sched, self.regions, self.sampler, self.gc)
        self.hooks = Hooks(self.regions, self._group_of, self.loader)
        side = guard.watch.side if guard.watch is not None else None
        self.exchange = Exchange(side, self.rank) if side is not None else None
        self.watcher = Watcher(self.world, window_s) if self.rank == 0 and side is not None else None
        self.interval = interval_s(window_s, self.world)
        self.stopped = threading.Event()
        self.error: BaseException | None = None   # the store's last failure (the next window tries again)
        self.paused = False
        self.thread: threading.Thread | None = None
        self.totals: Any = None   # this rank's windows merged: its final document is its whole run

    def pause(self, paused: bool) -> None:
        """Measure nothing (the wrappers pass through, no samples) while paused: benchmarks/bench_pace.py sets
        it block by block to weigh the accounting against the same guard without it, in one run."""
        self.paused = paused
        self.regions.enabled = not paused and not self.windows.gpu
        self.gc.enabled = self.loader.enabled = not paused

    def _group_of(self, pg: Any) -> str:
        return self.regions.default_group if pg is None else self.guard.pg_name(pg)

    def start(self) -> "Meter":
        lacks = self.hooks.install(self.guard.torch)
        self.gc.install()
        calls.REGIONS[0] = self.regions
        if self.sched is None:
            self.windows.notes.append(SCHED_NOTE)
        waits = [name for name in lacks if name != LOADER_ITER]
        if waits:
            self.windows.notes.append("this torch has no " + ", ".join(waits) + ": the waits there are not measured")
        if LOADER_ITER in lacks:
            self.windows.notes.append(f"this torch has no {LOADER_ITER}: the time batches take is sampled, not measured")
        self._check_gpu()
        self.thread = threading.Thread(target=self._run, name="distdoctor-guard-pace", daemon=True)
        self.thread.start()
        return self

    def _check_gpu(self) -> None:
        if not self.windows.gpu and gpu_in_use():
            self.windows.gpu, self.regions.enabled = True, False
            self.windows.notes.append(GPU_NOTE)

    def _run(self) -> None:
        due = read = None
        while not self.stopped.wait(self.sample_s * random.uniform(0.5, 1.5)):
            try:
                if due is None:  # the first step starts the accounting: set-up time (DDP's construction) is no step's
                    if self.regions.ordinal == 0:
                        continue
                    self.windows.restart()
                    due = read = time.monotonic() + self.interval
                if not self.paused:
                    self.sampler.sample()
                now = time.monotonic()
                if now >= due:
                    due = now + self.interval
                    self._window()
                if self.watcher is not None and now >= read:
                    # Twice a window in a small job, so that a window published between two reads is seen; once
                    # a window past 256 ranks, where a read and its judgment cost rank 0 a second of a core.
                    read = now + (self.interval / 2 if self.world <= 256 else self.interval)
                    self._judge()
            except Exception as exc:  # the accounting never takes the guard down; said once
                self.guard.fault("slow-rank accounting", exc)

    def _window(self) -> None:
        self.hooks.install_fsdp()
        self._check_gpu()
        document = self.windows.close()
        window = from_doc(document)
        self.totals = window if self.totals is None else merge(self.totals, window)
        if self.exchange is None:
            return
        try:
            self.exchange.publish(document)
        except Exception as exc:  # the store is slow or not reached yet: the next window tries again
            self.error = exc

    def _judge(self) -> None:
        try:
            docs = self.exchange.gather() if self.exchange is not None else {}
        except Exception as exc:
            self.error = exc
            return
        for line in self.watcher.feed(docs, time.time()):
            self.guard.say(line)

    def stop(self) -> None:
        """Stop the thread (bounded) and undo the wrappers."""
        self._halt()
        self._undo()

    def _halt(self) -> None:
        self.stopped.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(JOIN_S)

    def _undo(self) -> None:
        self.hooks.uninstall()
        self.gc.uninstall()
        if calls.REGIONS[0] is self.regions:
            calls.REGIONS[0] = None

    def finish(self) -> Any:
        """At the rank's end: its last window published; on rank 0 the whole run judged. Returns the
        run's verdict on rank 0 (None elsewhere, or when nothing was heard)."""
        self._halt()
        last = from_doc(self.windows.close())  # before the wrappers and the GC's callback go
        self._undo()
        totals = last if self.totals is None else merge(self.totals, last)
        final = {**to_doc(totals), "final": True}
        if self.exchange is None:
            return None
        try:
            self.exchange.publish(final, wait_s=cadence.FINAL_WAIT_S)
        except Exception:  # no store at the end: rank 0 judges what it has
            pass
        if self.watcher is None:
            return None
        docs = self._gather_finals(final)
        self.watcher.feed(docs, time.time())
        return self.watcher.final()

    def _gather_finals(self, mine: dict[str, Any]) -> dict[int, Any]:
        """Every rank's latest window, waiting (bounded) for the last ones of ranks still ending."""
        until = time.monotonic() + FINAL_GATHER_S
        docs: dict[int, Any] = {}
        while True:
            try:
                docs = self.exchange.gather() if self.exchange is not None else {}
            except Exception:
                break
            if all(isinstance(d, dict) and d.get("final") for r, d in docs.items() if r != self.rank) \
                    or time.monotonic() >= until:
                break
            time.sleep(0.2)
        docs[self.rank] = mine
        return docs
