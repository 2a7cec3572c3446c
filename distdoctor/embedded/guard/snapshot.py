"""This rank as a diagnosis.RankSnapshot: the recorder's progress, the guard's calls, the main thread's stack."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from types import TracebackType
from typing import Any, Iterable

from distdoctor.diagnosis.frames import display_path, user_frame, with_source
from distdoctor.diagnosis.snapshot import (RUNNING, Frame, GroupProgress, PendingOp, RaisedError, RankSnapshot)
from distdoctor.embedded.guard.record import COLLECTIVES, CallRecord

_GUARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# What a peer's failure looks like in this rank's collective: the cause is elsewhere.
CONSEQUENCE_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out",
                     "timed out", "Socket Timeout", "NCCL communicator was aborted", "ProcessGroup abort",
                     "DistNetworkError", "recvBytes", "sendBytes")


def stack_frames(frame: Any, limit: int = 24) -> tuple[Frame, ...]:
    """A Python stack from ``frame`` outwards, innermost last, without the guard's own frames."""
    frames: list[Frame] = []
    while frame is not None and len(frames) < limit:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_GUARD_DIR):
            frames.append(Frame(display_path(frame.f_code.co_filename), frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return tuple(reversed(frames))


def main_stack() -> tuple[Frame, ...]:
    return stack_frames(sys._current_frames().get(threading.main_thread().ident or 0))


def traceback_frames(tb: TracebackType | None, limit: int = 24) -> tuple[Frame, ...]:
    """The frames of an exception's traceback, innermost last."""
    frames: list[Frame] = []
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append(Frame(display_path(code.co_filename), tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    return tuple(frames[-limit:])


def where(stack: Iterable[Frame]) -> Frame | None:
    frame = user_frame(stack)
    return with_source(frame) if frame is not None else None


def is_consequence(exc: BaseException) -> bool:
    """A collective that failed because a peer went away or timed out (not this rank's own error)."""
    text = f"{type(exc).__name__}: {exc}"
    return type(exc).__name__ in ("DistNetworkError", "DistBackendError") or any(w in text for w in CONSEQUENCE_WORDS)


def raised_error(exc: BaseException, tb: TracebackType | None) -> RaisedError:
    frames = traceback_frames(tb)
    frame = where(frames)
    # gloo's messages run on with advice and a source path: the first 240 characters name it.
    message = str(exc).strip().splitlines()[0][:240] if str(exc).strip() else ""
    return RaisedError(type=type(exc).__name__, message=message, frame=frame, time=time.time(),
                       consequence=is_consequence(exc))


def call_text(record: CallRecord) -> str:
    """`all_reduce (float32[4])`: a guarded call as the diagnosis words a collective."""
    return PendingOp(record.op, None, tuple(tuple(x) for x in record.shapes), tuple(record.dtypes)).describe()


def _pending(record: CallRecord, now: float) -> PendingOp:
    return PendingOp(op=record.op, seq=record.seq, sizes=tuple(tuple(s) for s in record.shapes),
                     dtypes=tuple(record.dtypes), state="started", age_s=round(now - record.started, 2))


def guard_groups(recorder: Any, groups: dict[str, list[int]]) -> tuple[GroupProgress, ...]:
    """Per group progress from the guard's own records (the Python-issued collectives only)."""
    now = recorder.clock()
    running = [r for r in recorder.running_records() if r.op in COLLECTIVES]
    out = []
    for name, ranks in sorted(groups.items()):
        issued = recorder.seqs.get(name)
        mine = [r for r in running if r.group == name]
        recent = tuple(_pending(r, now) for r in recorder.recent(name, 16) if r.op in COLLECTIVES)
        out.append(GroupProgress(group=name, ranks=tuple(ranks), last_enqueued=None if issued is None else issued - 1,
                                 last_completed=recorder.completed.get(name),
                                 pending=_pending(mine[0], now) if mine else None,
                                 recent=tuple(PendingOp(o.op, o.seq, o.sizes, o.dtypes) for o in recent)))
    return tuple(out)


def _as_guarded(groups: tuple[GroupProgress, ...], running: list[CallRecord], now: float) -> tuple[GroupProgress, ...]:
    """A pending op the recorder saw issued inside a guarded call shows as that call (the guard's own
    verification exchange is an all_gather of int64 words: the user called all_reduce)."""
    calls = {r.group: r for r in running if r.op in COLLECTIVES}
    out = []
    for group in groups:
        call, pending = calls.get(group.group), group.pending
        if call is not None and pending is not None and pending.age_s is not None \
                and pending.age_s <= now - call.started + 0.05:
            pending = PendingOp(call.op, pending.seq, tuple(tuple(x) for x in call.shapes), tuple(call.dtypes),
                                pending.state, pending.age_s)
            group = GroupProgress(group.group, group.ranks, group.last_enqueued, group.last_completed, pending,
                                  group.recent)
        out.append(group)
    return tuple(out)


def last_issued(groups: Iterable[GroupProgress]) -> str | None:
    """The collective a failed rank issued last (the one its error came from), as text."""
    last = [g.recent[-1] for g in groups if g.recent]
    return max(last, key=lambda op: op.seq or 0).describe() if last else None


def build(*, rank: int, status: str = RUNNING, recorder: Any, groups: dict[str, list[int]], flight: Any = None,
          error: RaisedError | None = None, stack: tuple[Frame, ...] | None = None,
          in_collective: str | None = None, notes: Iterable[str] = ()) -> RankSnapshot:
    """This rank now. Groups come from torch's flight recorder when it works, else from the guard's records."""
    recorded = flight.groups() if flight is not None and flight.usable else ()
    notes = list(notes)
    if flight is not None and not flight.usable:
        notes.append(f"only Python-issued collectives counted: {flight.problem}")
    running = recorder.running_records()
    recorded = _as_guarded(recorded, running, recorder.clock()) if running else recorded
    stack = main_stack() if stack is None else stack
    in_collective = in_collective or (call_text(running[0]) if running else None)
    if in_collective is None and error is not None and error.consequence:
        in_collective = last_issued(recorded)
    return RankSnapshot(
        rank=rank, host=socket.gethostname(), pid=os.getpid(), status=status,
        groups=recorded or guard_groups(recorder, groups), stack=stack, where=where(stack),
        in_collective=in_collective, error=error, time=time.time(),
        collectives=recorder.calls, source="guard", notes=tuple(notes))
