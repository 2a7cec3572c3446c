"""The guard's look at a main thread without torch's flight recorder, piece by piece on real threads: the
kernel's counters, a look at a thread in a function, since when it stayed, and the lower confidence."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from distdoctor.diagnosis.diagnose import NO_COUNT_CONFIDENCE, diagnose
from distdoctor.diagnosis.progress import stayed
from distdoctor.diagnosis.snapshot import Frame, GroupProgress, PendingOp, RankSnapshot
from distdoctor.diagnosis.waits import BACKWARD_DDP
from distdoctor.embedded.guard.mainthread import MainThread, ThreadClock, thread_clock, woke
from distdoctor.embedded.guard.record import Recorder
from distdoctor.embedded.guard.watch import EpisodeWatch


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Worker:
    """A real thread running ``body(self)``; ``tid`` and ``ident`` once it has started."""

    def __init__(self, body) -> None:
        self.go, self.done, self.started = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, args=(body,), daemon=True)
        self.thread.start()
        assert self.started.wait(10)

    def _run(self, body) -> None:
        self.tid = threading.get_native_id()
        self.started.set()
        body(self)

    def watched(self, clock: FakeClock) -> MainThread:
        """A MainThread that reads this thread instead of the process's main thread."""
        main = MainThread(rank=0, clock=clock)
        main.ident, main.tid = self.thread.ident, self.tid
        return main

    def end(self) -> None:
        self.go.set()
        self.done.set()
        self.thread.join(10)


def _checkpoint(worker: Worker) -> None:
    worker.go.wait(60)  # LINE:checkpoint
    _after(worker)


def _after(worker: Worker) -> None:
    worker.done.wait(60)


def _polling(worker: Worker) -> None:
    while not worker.go.is_set(): time.sleep(0.05)  # noqa: E701 (one line: every look finds the same line)


def _spin_then_park(worker: Worker) -> None:
    start = time.thread_time()
    while time.thread_time() - start < 0.2:
        pass
    worker.spun = time.thread_time() - start
    worker.go.wait(60)


def test_thread_clock_reads_a_threads_cpu_time_state_and_runs_and_nothing_for_a_gone_one():
    worker = Worker(_spin_then_park)
    try:
        while not hasattr(worker, "spun"):
            time.sleep(0.01)
        time.sleep(0.1)  # parked in Event.wait by now
        first, second = thread_clock(worker.tid), thread_clock(worker.tid)
        assert first.state in "SD" and first.cpu_s >= 0.9 * worker.spun, (first, worker.spun)
        assert first.runs is not None and not woke(first.runs, second.runs)  # parked: the kernel did not run it
    finally:
        worker.end()
    # A task that is gone: no fields, no exception. Not the worker's own id: the kernel may give it
    # to another thread by now (seen under load); no task can have an id above pid_max.
    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    assert thread_clock(gone) == ThreadClock()
    assert thread_clock(None) == ThreadClock()
    assert not woke(None, 3) and not woke(3, None) and woke(3, 4)


def test_a_look_finds_the_function_a_thread_sleeps_in_and_how_long_it_stayed_there():
    clock = FakeClock()
    worker = Worker(_checkpoint)
    main = worker.watched(clock)
    try:
        time.sleep(0.1)
        first = main.look()
        assert first.snapshot.where.function == "_checkpoint" and __file__.endswith(first.snapshot.where.file)
        assert first.snapshot.in_collective is None and first.since == 100.0
        assert first.snapshot.stack[-1].function == "wait"  # innermost last: threading's Event.wait
        clock.now = 105.0
        assert main.look().since == 100.0  # the same line, not run by the kernel between the looks
        described = main.described(poll_s=0.25)
        assert described.still_s == 5.0 and described.where.code == "worker.go.wait(60)  # LINE:checkpoint"
        assert main.waits_since() is None  # at a line of the user's code, not in a wait
        worker.go.set()
        time.sleep(0.1)
        clock.now = 106.0
        moved = main.look()
        assert moved.snapshot.where.function == "_after" and moved.since == 106.0
        clock.now = 106.0 + 3 * 0.25 + 1.0
        assert main.described(poll_s=0.25) is None  # a look this old no longer says what the thread does
    finally:
        worker.end()
    assert main.look() is None  # the thread is gone: no look, no exception


def test_a_thread_woken_again_and_again_at_one_line_did_not_stay_even_with_little_cpu():
    """A fast loop waiting for a slow peer shows one place look after look; the kernel ran it between."""
    clock = FakeClock()
    worker = Worker(_polling)
    main = worker.watched(clock)
    try:
        time.sleep(0.05)
        main.look()
        time.sleep(0.3)
        clock.now = 101.0
        second = main.look()
        assert second.snapshot.where.function == "_polling"
        assert second.since == 101.0 and main.described(poll_s=0.25).still_s is None
    finally:
        worker.end()


def _look(rank: int, where: Frame, wait: str | None, cpu: float, at: float, state: str = "S") -> RankSnapshot:
    return RankSnapshot(rank, status="running", where=where, stack=(where,), in_collective=wait, cpu_s=cpu, time=at,
                        proc_state=state, source="guard")


BACKWARD = Frame("/job/train.py", 43, "<module>", "loss.backward()")
SLEEP = Frame("/job/train.py", 36, "<module>", "time.sleep(120)")


def test_stayed_is_the_same_wait_at_the_same_line_with_no_work_between():
    assert stayed(_look(0, BACKWARD, BACKWARD_DDP, 1.0, 10.0), _look(0, BACKWARD, BACKWARD_DDP, 1.0005, 11.0))
    assert not stayed(_look(0, BACKWARD, BACKWARD_DDP, 1.0, 10.0), _look(0, BACKWARD, None, 1.0, 11.0))
    assert not stayed(_look(0, SLEEP, None, 1.0, 10.0), _look(0, BACKWARD, BACKWARD_DDP, 1.0, 11.0))
    # Asleep in the same wait at both looks, 50 ms of CPU between them: it left and came back.
    assert not stayed(_look(0, BACKWARD, BACKWARD_DDP, 1.0, 10.0), _look(0, BACKWARD, BACKWARD_DDP, 1.05, 11.0))


def test_a_straggler_and_a_hang_told_from_stacks_alone_say_so_with_a_lower_confidence():
    waiter = _look(0, BACKWARD, BACKWARD_DDP, 1.0, 10.0)
    late = _look(1, SLEEP, None, 1.0, 10.0)
    [straggler] = diagnose([waiter, late])
    assert (straggler.id, straggler.ranks) == ("job.E002", (1,))
    assert straggler.confidence == NO_COUNT_CONFIDENCE["job.E002"] == 0.8
    assert "without sequence numbers" in straggler.detail and "likely, not certain" in straggler.detail
    [hang] = diagnose([waiter, _look(1, BACKWARD, BACKWARD_DDP, 1.0, 10.0)], waited_s=10.0)
    assert (hang.id, hang.confidence) == ("job.E009", 0.6) and "without sequence numbers" in hang.detail
    # The same straggler with the collective counted: the count says it, at full confidence.
    pending = PendingOp("all_reduce", 12, ((4,),), ("Float",), "scheduled", 10.0)
    counted = RankSnapshot(0, status="running", where=BACKWARD, groups=(GroupProgress("0", (0, 1), 12, 11, pending),))
    [sure] = diagnose([counted, RankSnapshot(1, status="running", where=SLEEP, groups=(GroupProgress("0", (0, 1), 11, 11),))])
    assert sure.id == "job.E002" and sure.confidence != 0.8 and "without sequence numbers" not in sure.detail


class Host:
    """What the watchdog asks of its Guard: here only the fault it says and the state it publishes."""

    rank, started = 0, 0.0

    def __init__(self) -> None:
        self.faults: list = []

    def fault(self, part, exc):
        self.faults.append((part, exc))

    def wait_group(self, pg):
        return "0"


def test_a_look_that_fails_is_one_fault_and_the_poll_goes_on():
    host = Host()
    watch = EpisodeWatch(host, Recorder(clock=FakeClock()), None, hang_timeout=3.0, answer_s=1.0, poll_s=0.25,
                      on_hang="auto", flight=SimpleNamespace(usable=False))

    def broken() -> None:
        raise OSError("no /proc here")

    watch.main_thread().look = broken
    watch.poll()
    watch.poll()
    assert watch.stall_now() is None and not watch.ended
    assert [(part, type(exc).__name__) for part, exc in host.faults] == [("main-thread look", "OSError")] * 3
