"""One rank's process and py-spy dump -> a diagnosis.snapshot.RankSnapshot (and a finding when it could not be read)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import psutil

from distdoctor.core.findings import Finding
from distdoctor.diagnosis.frames import display_path, is_user_file, user_frame, with_source
from distdoctor.diagnosis.snapshot import EXITED, KILLED, RUNNING, UNKNOWN, Frame, RankSnapshot
from distdoctor.stacks import attach, pyspy
from distdoctor.stacks.collective import in_collective
from distdoctor.stacks.proc_state import ProcState, read_state
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


def _unread(proc: RankProcess, state: ProcState, dump: pyspy.Dump, host: str, now: float) -> RankView:
    """A rank whose stack was not read: gone (its exit, when it can be told) or unreadable."""
    notes = [n for n in (*proc.notes, state.note) if n]
    if state.status in (EXITED, KILLED) or dump.problem == pyspy.GONE:
        status = state.status if state.status in (EXITED, KILLED) else EXITED
        snap = RankSnapshot(rank=proc.rank if proc.rank is not None else -1, host=host, pid=proc.pid, status=status,
                            exit_code=state.exit_code, time=now, source="stacks",
                            notes=tuple(notes or ["its process ended before its stack was read"]))
        return RankView(snap)
    notes.append(f"its stack could not be read: {dump.message}")
    snap = RankSnapshot(rank=proc.rank if proc.rank is not None else -1, host=host, pid=proc.pid,
                        status=UNKNOWN, time=now, source="stacks",
                        notes=tuple(notes))
    return RankView(snap, finding=_problem_finding(proc, dump, host), seconds=dump.seconds)


def build(proc: RankProcess, dump: pyspy.Dump, state: ProcState, *, native: bool, host: str | None = None) -> RankView:
    """The rank's snapshot from what /proc and py-spy told."""
    host = host or socket.gethostname()
    now = time.time()
    main = dump.main
    if dump.problem is not None or main is None:
        return _unread(proc, state, dump, host, now)
    stack = python_frames(main, _cwd(proc.pid))
    op, how = in_collective(main, native=native)
    notes = [n for n in (*proc.notes, state.note, how) if n]
    if any(proc.env.get(v) for v in _FR_VARS):
        notes.append("the flight recorder is on, but its sequence numbers live inside the process: py-spy cannot read them")
    shown = tuple(Frame(display_path(f.file), f.line, f.function) if is_user_file(f.file) else f for f in stack)
    snap = RankSnapshot(rank=proc.rank if proc.rank is not None else -1, host=host, pid=proc.pid,
                        status=state.status if state.status != EXITED else RUNNING, exit_code=state.exit_code,
                        stack=shown, where=_shown(user_frame(stack)), in_collective=op, time=now, source="stacks",
                        notes=tuple(notes))
    return RankView(snap, threads=dump.threads, seconds=dump.seconds)


def read_rank(proc: RankProcess, *, native: bool = False, pyspy_path: str | None = None,
              timeout_s: float = pyspy.DUMP_TIMEOUT_S, host: str | None = None) -> RankView:
    """Read one rank: its state, its stacks, its state again (did it end during the dump?)."""
    before = read_state(proc.pid)
    if before.status in (EXITED, KILLED):
        return build(proc, pyspy.Dump(problem=pyspy.GONE, message="ended before the dump"), before, native=native, host=host)
    dump = pyspy.dump(proc.pid, native=native, timeout_s=timeout_s, pyspy=pyspy_path)
    after = read_state(proc.pid) if dump.problem is not None else before
    if dump.problem is not None and after.status in (EXITED, KILLED):
        note = ProcState(after.status, after.exit_code, (after.note + "; " if after.note else "") + "it ended during the dump")
        return build(proc, pyspy.Dump(problem=pyspy.GONE, message=dump.message), note, native=native, host=host)
    return build(proc, dump, after, native=native, host=host)
