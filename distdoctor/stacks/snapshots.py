"""One rank's process and py-spy dump -> a diagnosis.snapshot.RankSnapshot (and a finding when it could not be read)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, replace

import psutil

from distdoctor.core.findings import Finding
from distdoctor.diagnosis.frames import display_path, is_user_file, user_frame, with_source
from distdoctor.diagnosis.snapshot import EXITED, KILLED, RUNNING, UNKNOWN, Frame, RankSnapshot
from distdoctor.machine.thread_clock import read_thread
from distdoctor.stacks import attach, pyspy
from distdoctor.stacks.collective import Reading, read_wait
from distdoctor.stacks.proc_state import Clock, ProcState, read_clock, read_state
from distdoctor.stacks.procs import RankProcess

_FR_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


@dataclass(frozen=True)
class RankView:
    """A rank as `stacks` saw it: the snapshot, every thread's stack, and a finding if reading failed."""

    snapshot: RankSnapshot
    threads: tuple[pyspy.Thread, ...] = ()
    finding: Finding | None = None
    seconds: float = 0.0           # how long py-spy took


def _cwd(pid: int) -> str | None:
    try:
        return psutil.Process(pid).cwd()
    except (psutil.Error, OSError):
        return None


def python_frames(thread: pyspy.Thread, cwd: str | None) -> tuple[Frame, ...]:
    """The thread's Python frames, innermost last; the user's files as paths readable here."""
    frames = []
    for raw in reversed(thread.frames):
        if raw.native:
            continue
        path = raw.file
        if cwd and not os.path.isabs(path) and not path.startswith("<"):
            path = os.path.join(cwd, path)  # relative to the rank's working directory, not ours
        frames.append(Frame(path if is_user_file(path) else raw.short, raw.line, raw.function))
    return tuple(frames)


def _shown(frame: Frame | None) -> Frame | None:
    """The user's frame with its source line, its path shortened for the report."""
    if frame is None:
        return None
    full = with_source(frame)
    return Frame(display_path(full.file), full.line, full.function, full.code)


def _rank_label(proc: RankProcess) -> str:
    return f"rank {proc.rank}" if proc.rank is not None else f"process {proc.pid}"


def _problem_finding(proc: RankProcess, dump: pyspy.Dump, host: str) -> Finding:
    ranks = [proc.rank] if proc.rank is not None else []
    data = {"pid": proc.pid, "rank": proc.rank, "py_spy": dump.message}
    who = f"{_rank_label(proc)} (PID {proc.pid})"
    if dump.problem == pyspy.DENIED:
        why = attach.explain_denied(proc.pid)
        return attach.CANNOT_ATTACH(f"py-spy may not read {who}: {why.reason.replace('_', ' ')}",
                                    detail=f"{why.detail}\npy-spy said: {dump.message}", remediation=why.fix,
                                    ranks=ranks, hosts=[host], data={**data, "reason": why.reason})
    if dump.problem == pyspy.NOT_PYTHON:
        return pyspy.NOT_PYTHON(f"{who} is not a Python program py-spy can read ({proc.cmdline[:80] or '?'})",
                                detail=f"py-spy said: {dump.message}", ranks=ranks, hosts=[host], data=data)
    return pyspy.DUMP_FAILED(f"py-spy could not read {who}: {dump.message}"[:300],
                             detail=f"py-spy said: {dump.message}", ranks=ranks, hosts=[host], data=data)


def _unread(read: "Read", host: str) -> RankView:
    """A rank whose stack was not read: gone (its exit, when it can be told) or unreadable."""
    proc, state, dump = read.proc, read.state, read.dump
    notes = [n for n in (*proc.notes, state.note) if n]
    if state.status in (EXITED, KILLED) or dump.problem == pyspy.GONE:
        status = state.status if state.status in (EXITED, KILLED) else EXITED
        snap = RankSnapshot(rank=proc.rank if proc.rank is not None else -1, host=host, pid=proc.pid, status=status,
                            exit_code=state.exit_code, time=read.time, source="stacks",
                            notes=tuple(notes or ["its process ended before its stack was read"]))
        return RankView(snap, seconds=dump.seconds)
    notes.append(f"its stack could not be read: {dump.message}")
    snap = RankSnapshot(rank=proc.rank if proc.rank is not None else -1, host=host, pid=proc.pid,
                        status=UNKNOWN, time=read.time, source="stacks", notes=tuple(notes))
    return RankView(snap, finding=_problem_finding(proc, dump, host), seconds=dump.seconds)


@dataclass(frozen=True)
class Read:
    """One read of one rank: its state and clock from /proc, then py-spy's dump."""

    proc: RankProcess
    dump: pyspy.Dump
    state: ProcState
    clock: Clock = Clock()
    time: float | None = None          # epoch seconds of the /proc read, just before the dump
    native: bool = False               # read with --native
    cwd: str | None = None             # its working directory (relative paths in its stack)
    runs: int | None = None            # times its main thread was put on a CPU, before the dump
    carried_from: float | None = None  # a read without py-spy: the dump is the one read at this time


    @property
    def main(self) -> pyspy.Thread | None:
        return self.dump.main if self.dump.problem is None else None


@dataclass(frozen=True)
class Facts:
    """What one rank's reads together tell about each of them."""

    ddp: bool | str = False            # a DistributedDataParallel model among its frames' variables (any read),
                                       # or a text saying how else it is known (its script's source)
    gpu: bool = False                  # its process drives a GPU
    carried: Reading | None = None     # a native read's finding, for a read at the same place since


def build(read: Read, facts: Facts = Facts(), *, host: str | None = None) -> RankView:
    """The rank's snapshot from what /proc and py-spy told."""
    host = host or socket.gethostname()
    main = read.main
    if main is None:
        return _unread(read, host)
    proc, state = read.proc, read.state
    stack = python_frames(main, read.cwd)
    found = facts.carried or read_wait(main, native=read.native, ddp=facts.ddp, gpu=facts.gpu, others=read.dump.threads)
    notes = [n for n in (*proc.notes, state.note, found.note) if n]
    # A GPU process's main thread may spin in a CUDA synchronisation that only native frames show.
    spin = found.may_spin or (facts.gpu and not read.native and facts.carried is None)
    if spin and not found.may_spin:
        notes.append("its process uses a GPU: without --native its CPU time is no evidence of progress (the CPU "
                     "may spin in a CUDA synchronisation), only its stack moving is (cannot tell otherwise)")
    if read.carried_from is not None:
        notes.append(f"its stack is the one read {max(0.0, (read.time or 0.0) - read.carried_from):.1f} s earlier: its "
                     "main thread has not run since (the same CPU time and count of runs, asleep at both reads)")
    if any(proc.env.get(v) for v in _FR_VARS):
        notes.append("the flight recorder is on, but its sequence numbers live inside the process: py-spy cannot read them")
    shown = tuple(Frame(display_path(f.file), f.line, f.function) if is_user_file(f.file) else f for f in stack)
    snap = RankSnapshot(rank=proc.rank if proc.rank is not None else -1, host=host, pid=proc.pid,
                        status=state.status if state.status != EXITED else RUNNING, exit_code=state.exit_code,
                        stack=shown, where=_shown(user_frame(stack)), in_collective=found.op, time=read.time,
                        source="stacks", notes=tuple(notes), cpu_s=read.clock.cpu_s, proc_state=read.clock.state,
                        may_spin=spin)
    return RankView(snap, threads=read.dump.threads, seconds=read.dump.seconds)


def read_rank(proc: RankProcess, *, native: bool = False, pyspy_path: str | None = None,
              timeout_s: float = pyspy.DUMP_TIMEOUT_S, started: int | None = None, local_types: bool = True,
              beside_native: bool = False) -> Read:
    """Read one rank: its clock and state, its stacks, its state again (did it end during the
    dump?). started: its process's start time at an earlier read (a PID reused since differs);
    beside_native: our own native read of it runs now (a tracing stop is py-spy's, not the job's)."""
    now, clock, runs = time.time(), read_clock(proc.pid), read_thread(f"/proc/{proc.pid}/task/{proc.pid}").runs
    if started is not None and clock.start is not None and clock.start != started:
        gone = ProcState(EXITED, None, f"PID {proc.pid} now belongs to another process: this rank ended (its exit "
                                       "status was not seen)")
        return Read(proc, pyspy.Dump(problem=pyspy.GONE, message="its PID was reused"), gone, Clock(), now)
    before = read_state(proc.pid)
    if beside_native and before.status == RUNNING and before.note.startswith("its process is tracing-stop"):
        before = ProcState(RUNNING)
    if before.status in (EXITED, KILLED):
        return Read(proc, pyspy.Dump(problem=pyspy.GONE, message="ended before the dump"), before, clock, now)
    cwd = _cwd(proc.pid)
    dump = pyspy.dump(proc.pid, native=native, timeout_s=timeout_s, pyspy=pyspy_path, local_types=local_types)
    if dump.problem is None:
        return Read(proc, dump, before, clock, now, native, cwd, runs)
    after = read_state(proc.pid)
    if after.status in (EXITED, KILLED):
        note = ProcState(after.status, after.exit_code, (after.note + "; " if after.note else "") + "it ended during the dump")
        return Read(proc, pyspy.Dump(problem=pyspy.GONE, message=dump.message, seconds=dump.seconds), note, clock, now)
    return Read(proc, dump, after, clock, now, native, cwd, runs)


# Kernel states of a thread off any CPU: a thread found in one at two reads, with the same count of
# runs and CPU time, executed nothing in between, so its stack cannot have changed.
_ASLEEP = frozenset("SDI")


def still_read(proc: RankProcess, previous: Read) -> Read | None:
    """A read of the rank without py-spy, when /proc proves its main thread did not run since
    ``previous`` (a read with a stack): the same start, the same count of runs and CPU time, asleep
    at both. None when it may have run (then py-spy must read it). A hung job's ranks sleep in
    their waits: after one dump each, the reads that show they stayed cost a /proc read, not a
    py-spy process (64 ranks: 64 dumps, not 192)."""
    if previous.main is None or previous.runs is None or previous.clock.state not in _ASLEEP:
        return None
    now, clock, thread = time.time(), read_clock(proc.pid), read_thread(f"/proc/{proc.pid}/task/{proc.pid}")
    if (clock.start != previous.clock.start or thread.runs != previous.runs or clock.cpu_s != previous.clock.cpu_s
            or clock.state not in _ASLEEP):
        return None
    state = read_state(proc.pid)
    if state.status != RUNNING:
        return None
    return replace(previous, state=state, clock=clock, time=now,
                   carried_from=previous.carried_from if previous.carried_from is not None else previous.time)
