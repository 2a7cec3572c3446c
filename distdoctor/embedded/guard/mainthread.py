"""The main thread read from the guard's watchdog: its stack, the wait it shows, its CPU time, and since when it stayed."""

# Without torch's flight recorder the guard counts only the collectives that pass through the
# Python functions it wraps; DDP's gradient all-reduce (inside `loss.backward()`) and FSDP's
# waits on async Works pass unseen. But the guard runs inside the rank, so its watchdog can look at
# the main thread the way `distdoctor stacks` looks from outside, and see more: every poll it reads
# the main thread's Python frames (sys._current_frames), and from /proc/self/task/<tid> the
# thread's kernel state, CPU time and how often it was put on a CPU. The shared rule
# (diagnosis.waits) names the wait the stack shows: a c10d function, or an idle backward of a
# DistributedDataParallel model found among the frames' own variables (the frame objects are at
# hand in-process) on a process that uses no GPU (torch.cuda says so here). The thread stayed
# where it was since the last look when diagnosis.progress.stayed says so and the kernel did not
# run it meanwhile. A wait it has stayed in is a stall, with the time since it started; a line of
# the user's code it has stayed at (a sleep, a slow read) is "at train.py:31 for 8.2 s" in its
# snapshot. Everything is read from this process: no torch API but torch.cuda.is_initialized
# (probed), none of it in the training thread; a look costs about 0.3 ms (a 17-frame stack on a
# loaded 2-core machine), 0.1 % of one core at one poll every 0.25 s.

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass, replace
from typing import Any, Iterator

from distdoctor.machine.thread_clock import ThreadClock, read_thread
from distdoctor.diagnosis.frames import display_path, is_user_file, with_source
from distdoctor.diagnosis.progress import ASLEEP, CPU_FLOOR_S, CPU_SHARE, stayed, wait_place
from distdoctor.diagnosis.snapshot import RUNNING, Frame, RankSnapshot
from distdoctor.diagnosis.waits import (BACKWARD_DDP, DDP_TYPES, Reading, backward_wait, file_names_ddp, fsdp_wait, in_backward,
                                        python_wait)

_GUARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
STACK_LIMIT = 24
# A look older than this many polls no longer says what the thread does now.
FRESH_POLLS = 3


@dataclass(frozen=True)
class CodeFrame:
    """A frame as diagnosis.waits reads it (innermost first)."""

    file: str
    function: str


@dataclass(frozen=True)
class Look:
    """One look at the main thread: the snapshot, the wait's reading, and since when it stayed."""

    snapshot: RankSnapshot
    reading: Reading
    since: float             # time.monotonic() since which the thread stayed where this look found it
    at: float                # time.monotonic() of this look
    runs: int | None = None  # how often the kernel had put the thread on a CPU (ThreadClock.runs)


def thread_clock(tid: int | None) -> ThreadClock:
    """The kernel's counters of one thread of this process; empty fields where unreadable."""
    return ThreadClock() if tid is None else read_thread(f"/proc/self/task/{tid}")


def woke(before: int | None, after: int | None) -> bool:
    """The thread was put on a CPU between two reads of its count: it left whatever it waited in,
    even when a later step finds it in the same wait again (a fast loop waiting for a slow peer)."""
    return before is not None and after is not None and after != before


def _is_ddp(value: Any) -> bool:
    return any(cls.__name__ in DDP_TYPES for cls in type(value).__mro__)


def _candidates(variables: Any) -> list[Any]:
    """A frame's variables, and the attributes and submodules of its `self` (a trainer's self.model)."""
    values = list(variables.values())
    owner = variables.get("self")
    for inner in (getattr(owner, "__dict__", None), getattr(owner, "_modules", None)):
        if isinstance(inner, dict):
            values += list(inner.values())
    return values


def _locals_are_a_view() -> bool:
    """Whether a function frame's f_locals is a view (PEP 667, Python 3.13) rather than a copy: read
    from another thread, a copy stays stored in the frame and keeps every variable it held alive
    (an old batch's tensors) until the frame ends, so only a view is read."""
    return not isinstance(sys._getframe().f_locals, dict)


_LOCALS_VIEW = _locals_are_a_view()
_CO_OPTIMIZED = 0x1  # a function's frame (a module's frame's variables are its globals)


def _frame_variables(frame: Any) -> list[Any]:
    """A function frame's variables, where reading them leaves nothing behind (see above)."""
    if not _LOCALS_VIEW or not frame.f_code.co_flags & _CO_OPTIMIZED:
        return []
    try:
        return _candidates(frame.f_locals)
    except Exception:  # a frame whose variables cannot be read: no evidence
        return []


def gpu_in_use() -> bool | None:
    """Whether this process drives a GPU (torch.cuda initialised); None when this torch cannot say."""
    probe = getattr(sys.modules.get("torch.cuda"), "is_initialized", None)
    if probe is None:
        return None
    try:
        return bool(probe())
    except Exception:  # a probe must not take the watchdog down
        return None


class MainThread:
    """The watchdog's view of this process's main thread, look after look."""

    def __init__(self, rank: int, clock: Any = time.monotonic) -> None:
        main = threading.main_thread()
        self.rank, self.clock = rank, clock
        self.ident, self.tid = main.ident, getattr(main, "native_id", None)
        self.latest: Look | None = None
        self.ddp: Any = None                      # a weak reference to the DDP model, once one was seen
        self._files: dict[str, tuple[str, bool]] = {}

    # -- one look, every poll ------------------------------------------------------------------
    def look(self) -> Look | None:
        """Read the main thread now; None when it is gone (the interpreter is ending)."""
        frame = sys._current_frames().get(self.ident or 0)
        if frame is None:
            return None
        frames = list(self._frames(frame))
        shown = [self._frame(f) for f in frames]  # the lines now, before the thread runs on
        state, cpu, runs = thread_clock(self.tid)
        now, at = time.time(), self.clock()
        previous = self.latest
        reading = self._reading(frames, self._idle(previous, state, cpu, now))
        where = next((f for f, mine in shown if mine), None)
        snap = RankSnapshot(rank=self.rank, status=RUNNING, pid=os.getpid(), stack=tuple(f for f, _ in reversed(shown)),
                            where=where, in_collective=reading.op, time=now, source="guard", cpu_s=cpu,
                            proc_state=state, may_spin=reading.may_spin)
        self.latest = Look(snap, reading, self._since(previous, snap, runs, at), at, runs)
        return self.latest

    @staticmethod
    def _since(previous: Look | None, snap: RankSnapshot, runs: int | None, at: float) -> float:
        """Since when the thread has stayed where ``snap`` finds it. Two looks alike are not enough: a
        loop of short steps waiting for a slow peer shows the same wait at the same line look after
        look with too little CPU between them to count as work (measured: 1-2 ms a step of a small
        DDP model), so a thread the kernel put on a CPU meanwhile did not stay (a wait that may spin
        runs without leaving: its count is no evidence)."""
        if previous is None or not stayed(previous.snapshot, snap):
            return at
        spins = snap.may_spin or previous.snapshot.may_spin
        return at if not spins and woke(previous.runs, runs) else previous.since

    def _frames(self, frame: Any) -> Iterator[Any]:
        """The thread's frames innermost first, without the guard's own (its wrappers around a call)."""
        count = 0
        while frame is not None and count < STACK_LIMIT:
            if not frame.f_code.co_filename.startswith(_GUARD_DIR):
                count += 1
                yield frame
            frame = frame.f_back

    def _frame(self, frame: Any) -> tuple[Frame, bool]:
        """(the frame as the diagnosis shows it, whether it is the user's code)."""
        path = frame.f_code.co_filename
        known = self._files.get(path)
        if known is None:  # worked out once per file: the poll stays cheap
            known = self._files[path] = (display_path(path), is_user_file(path))
        return Frame(known[0], frame.f_lineno, frame.f_code.co_name), known[1]

    @staticmethod
    def _idle(previous: Look | None, state: str, cpu: float | None, now: float) -> bool:
        """Asleep now, and (nearly) no CPU used since the last look (diagnosis.progress's thresholds)."""
        if previous is None or cpu is None or previous.snapshot.cpu_s is None or state not in ASLEEP:
            return False
        used = max(0.0, cpu - previous.snapshot.cpu_s)
        elapsed = max(0.0, now - (previous.snapshot.time or now))
        return used < CPU_FLOOR_S or used < CPU_SHARE * elapsed

    def _reading(self, frames: list[Any], idle: bool) -> Reading:
        """What the stack waits in (diagnosis.waits), with what only this process knows: whether it
        drives a GPU, and whether its model is DDP (the frames' own variables)."""
        code = [CodeFrame(f.f_code.co_filename, f.f_code.co_name) for f in frames]
        found = python_wait(code)
        if found is None:
            gpu = gpu_in_use()
            found = fsdp_wait(code, idle=idle, gpu=gpu)
            if found is None:
                ddp = idle and in_backward(code) and self._ddp_seen(frames)
                found = backward_wait(code, idle=idle, ddp=ddp, gpu=gpu)
        return found or Reading()

    def _ddp_seen(self, frames: list[Any]) -> bool | str:
        """Whether the model in backward is DDP, and how that is known: a DistributedDataParallel among
        the variables of the user's modules (their globals) or, where reading them leaves nothing
        behind, of the frames; else the user's script naming DistributedDataParallel. The first
        model seen is remembered (weakly) for the looks after."""
        if self.ddp is not None and self.ddp() is not None:
            return True
        for frame in frames:
            model = self._ddp_in(frame)
            if model is not None:
                try:
                    self.ddp = weakref.ref(model)
                except TypeError:
                    pass
                return True
        for frame in frames:
            path = frame.f_code.co_filename
            if file_names_ddp(path):
                return f"its script {display_path(path)} wraps a model in DistributedDataParallel"
        return False

    def _ddp_in(self, frame: Any) -> Any:
        """A DDP model among a frame's variables: its module's globals (the user's modules only: a
        library's globals are not the user's model), else its own variables where that is safe."""
        mine = self._files.get(frame.f_code.co_filename, ("", False))[1]
        try:  # the main thread runs on meanwhile: a dict it grows under us, an attribute that raises
            found = next((v for v in _candidates(frame.f_globals) if _is_ddp(v)), None) if mine else None
        except Exception:
            found = None
        return found if found is not None else next((v for v in _frame_variables(frame) if _is_ddp(v)), None)

    def failed_in(self, tb: Any) -> str | None:
        """The wait a collective's failure (a peer's consequence) came out of, from its traceback's
        frames: a c10d function, or backward of a DDP model (its reducer's all-reduce failed)."""
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        frames.reverse()  # innermost first, as diagnosis.waits reads them
        for frame in frames:
            self._frame(frame)
        code = [CodeFrame(f.f_code.co_filename, f.f_code.co_name) for f in frames]
        found = python_wait(code)
        if found is None and in_backward(code) and self._ddp_seen(frames):
            return BACKWARD_DDP
        return found.op if found is not None else None

    # -- what the watchdog and the snapshot ask ---------------------------------------------------
    def ddp_group(self) -> Any:
        """The process group of the DDP model seen, if one was (its all-reduce runs in that group)."""
        model = self.ddp() if self.ddp is not None else None
        return getattr(model, "process_group", None) if model is not None else None

    def waits_since(self) -> float | None:
        """Since when (time.monotonic) the thread has stayed in the wait its latest look shows; None
        when it waits in nothing its stack shows."""
        latest = self.latest
        if latest is None or wait_place(latest.snapshot) is None:
            return None
        return latest.since

    def described(self, poll_s: float) -> RankSnapshot | None:
        """The latest look, when recent, as this rank's snapshot: the wait its stack shows (and how it
        was told), how long it has stayed there, its CPU time; the user's line with its source."""
        latest = self.latest
        now = self.clock()
        if latest is None or now - latest.at > FRESH_POLLS * poll_s + 0.5:
            return None
        snap = latest.snapshot
        still = round(now - latest.since, 2) if latest.since < latest.at else None
        return replace(snap, where=with_source(snap.where) if snap.where is not None else None, still_s=still,
                       notes=(latest.reading.note,) if latest.reading.note else ())
