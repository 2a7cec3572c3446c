"""This rank as a diagnosis.RankSnapshot: the recorder's progress, the guard's calls, the main thread's stack."""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from dataclasses import replace
from types import TracebackType
from typing import Any, Callable, Iterable

from distdoctor.diagnosis.frames import display_path, user_frame, with_source
from distdoctor.diagnosis.origin import exception_origin_is_distributed
from distdoctor.diagnosis.snapshot import (RUNNING, Frame, GroupProgress, PendingOp, RaisedError, RankSnapshot)
from distdoctor.embedded.guard.record import COLLECTIVES, POINT_TO_POINT, WORD_COUNT, CallRecord

_GUARD_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# torch's own files, wherever it is installed (display_path keeps them absolute or relative)
_TORCH_FILE = re.compile(r"(^|[/\\\\])torch[/\\\\]")


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
    """Raised out of torch.distributed (a peer's failure seen here), by its origin, never its words."""
    return exception_origin_is_distributed(exc)


def raised_error(exc: BaseException, tb: TracebackType | None, thread: str = "") -> RaisedError:
    frames = traceback_frames(tb)
    frame = where(frames)
    # gloo's messages run on with advice and a source path: the first 240 characters name it.
    message = str(exc).strip().splitlines()[0][:240] if str(exc).strip() else ""
    return RaisedError(type=type(exc).__name__, message=message, frame=frame, time=time.time(),
                       consequence=is_consequence(exc), thread=thread)


def call_text(record: CallRecord) -> str:
    """`all_reduce (float32[4])`: a guarded call as the diagnosis words a collective."""
    return PendingOp(record.op, None, tuple(tuple(x) for x in record.shapes), tuple(record.dtypes)).describe()


def _pending(record: CallRecord, now: float, numbered: bool = True) -> PendingOp:
    """A guarded call as the op its group waits in; a point-to-point call with its peer (its own
    sequence numbers count per peer, not the group's collectives: left out). ``numbered=False``
    beside the flight recorder's groups: the guard's own count is not the recorder's."""
    p2p = record.op in POINT_TO_POINT
    peer = record.params.get("peer") if p2p and isinstance(record.params.get("peer"), int) else None
    return PendingOp(op=record.op, seq=None if p2p or not numbered else record.seq,
                     sizes=tuple(tuple(s) for s in record.shapes),
                     dtypes=tuple(record.dtypes), state="started", age_s=round(now - record.started, 2), peer=peer)


def guard_groups(recorder: Any, groups: dict[str, list[int]]) -> tuple[GroupProgress, ...]:
    """Per group progress from the guard's own records (the Python-issued calls only)."""
    now = recorder.clock()
    running = recorder.running_records()
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
    """The recorder's groups with the guarded calls still running in them.

    A pending op the recorder saw issued inside a guarded call shows as that call (the guard's own
    verification exchange is an all_gather of int64 words: the user called all_reduce). A guarded
    call the recorder does not show pending (point-to-point calls are not in gloo's recorder) is the
    op its group waits in, with its peer."""
    calls: dict[str, CallRecord] = {}
    for record in running:
        calls.setdefault(record.group, record)
    out = []
    for group in groups:
        call, pending = calls.pop(group.group, None), group.pending
        if call is not None and pending is None:
            pending = _pending(call, now, numbered=False)
        elif call is not None and call.op in COLLECTIVES and pending.age_s is not None \
                and pending.age_s <= now - call.started + 0.05:
            pending = PendingOp(call.op, pending.seq, tuple(tuple(x) for x in call.shapes), tuple(call.dtypes),
                                pending.state, pending.age_s)
        group = replace(group, pending=pending)
        out.append(_newest_as_call(group, call) if call is not None and call.op in COLLECTIVES else group)
    out += [GroupProgress(name, pending=_pending(call, now, numbered=False)) for name, call in calls.items()]
    return tuple(out)


def _is_verification(op: PendingOp) -> bool:
    """The guard's own verification exchange: an all_gather of one row of fingerprint words (int64)."""
    return op.op == "all_gather" and op.sizes == ((WORD_COUNT,),) and \
        all(d.lower().removeprefix("torch.") in ("long", "int64") for d in op.dtypes) and bool(op.dtypes)


def _newest_as_call(group: GroupProgress, call: CallRecord) -> GroupProgress:
    """The group's newest recorded op, when it is the guard's verification exchange, as the guarded
    collective it verifies (the exchange is the last thing issued before that call, inside it).

    A diagnosis that finds the recorder's pending op already completed on a peer takes the next op
    from ``recent`` as the one the rank waits in: that is the exchange while the guard verifies the
    user's all_reduce, and the user called all_reduce, not an all_gather of int64 words."""
    if not group.recent:
        return group
    newest = group.recent[-1]
    if newest.seq is None or newest.seq != group.last_enqueued or not _is_verification(newest):
        return group
    as_call = replace(newest, op=call.op, sizes=tuple(tuple(x) for x in call.shapes), dtypes=tuple(call.dtypes))
    pending = group.pending
    if pending is not None and pending.seq == newest.seq and _is_verification(pending):
        pending = replace(pending, op=call.op, sizes=as_call.sizes, dtypes=as_call.dtypes)
    return replace(group, recent=(*group.recent[:-1], as_call), pending=pending)


def in_torch(stack: Iterable[Frame]) -> bool:
    """Whether the main thread is inside torch's code (a call that may wait in a collective issued from
    C++: DDP's all-reduce in backward, FSDP's, a c10d function); a stack that cannot be read counts as in."""
    frames = list(stack)
    return not frames or any(_TORCH_FILE.search(frame.file or "") for frame in frames)


def settled(groups: tuple[GroupProgress, ...], backend_of: Callable[[str], str | None],
            before_s: float | None = None) -> tuple[GroupProgress, ...]:
    """The gloo groups of a rank whose main thread is in none of their collectives, as settled
    (``before_s``: only what was issued more than that many seconds ago, before the point-to-point call
    the main thread is in).

    Gloo runs a collective in the caller's wait and marks it completed in the recorder later, at times
    not until the next one: a rank that returned from its last collective and sleeps, loads data,
    evaluates or waits in a receive shows that collective still pending for as long. A main thread in
    no guarded call and outside torch's code waits in no collective of a gloo group (an async op not
    waited on holds no one: its wait() is a guarded call); nor does one inside a guarded
    point-to-point call, for what it issued before that call (with no Python-issued collective still
    running: an async one is running until its Work completes). Other backends (NCCL: the device runs
    behind the thread) keep what the recorder says."""
    out = []
    for group in groups:
        issued_before = before_s is None or (group.pending is not None and group.pending.age_s is not None
                                             and group.pending.age_s > before_s)
        if group.waiting and issued_before and backend_of(group.group) == "gloo":
            counts = [c for c in (group.last_completed, group.last_enqueued) if c is not None]
            group = replace(group, last_completed=max(counts) if counts else None, pending=None)
        out.append(group)
    return tuple(out)


def _settle(groups: tuple[GroupProgress, ...], running: list[CallRecord], stack: tuple[Frame, ...], now: float,
            backend_of: Callable[[str], str | None]) -> tuple[GroupProgress, ...]:
    """settled() where the main thread is provably in no collective: outside torch with no guarded call
    running; in a guarded point-to-point call (its caller's line on the main thread's stack) with no
    Python-issued collective running, for what was issued before it; or in the one guarded collective
    running, for what the other groups issued before it."""
    if not running:
        return groups if in_torch(stack) else settled(groups, backend_of)
    lines = {frame.label for frame in stack}
    inside = [record for record in running if record.site in lines]
    if not inside:
        return groups
    call = inside[0]
    if call.op in POINT_TO_POINT:
        if any(record.op not in POINT_TO_POINT for record in running):
            return groups
        own = None
    elif len(running) == 1:
        own = call.group  # in one guarded collective, nothing else running: it waits in that one, not before it
    else:
        return groups
    before = {g.group: g for g in settled(tuple(g for g in groups if g.group != own), backend_of,
                                         before_s=now - call.started + 0.05)}
    return tuple(before.get(g.group, g) for g in groups)


def last_issued(groups: Iterable[GroupProgress]) -> str | None:
    """The collective a failed rank issued last (the one its error came from), as text."""
    last = [g.recent[-1] for g in groups if g.recent]
    return max(last, key=lambda op: op.seq or 0).describe() if last else None


def build(*, rank: int, status: str = RUNNING, recorder: Any, groups: dict[str, list[int]], flight: Any = None,
          error: RaisedError | None = None, stack: tuple[Frame, ...] | None = None,
          in_collective: str | None = None, notes: Iterable[str] = (),
          thread_errors: Iterable[RaisedError] = (), failed_call: CallRecord | None = None,
          main: RankSnapshot | None = None, backend_of: Callable[[str], str | None] | None = None) -> RankSnapshot:
    """This rank now. Groups come from torch's flight recorder when it works, else from the guard's
    records. ``failed_call``: the guarded call that just failed (it ended, but the rank was in it).
    ``main``: the watchdog's latest look at the main thread (embedded.guard.mainthread), when no
    recorder counts: the wait its stack shows, how long it stayed there, its CPU time."""
    recorded = flight.groups() if flight is not None and flight.usable else ()
    notes = list(notes)
    if flight is not None and not flight.usable:
        notes.append(f"only Python-issued collectives counted: {flight.problem}")
    running = recorder.running_records() + ([failed_call] if failed_call is not None else [])
    looked = main is not None and stack is None and status == RUNNING
    stack = (main.stack if looked else main_stack()) if stack is None else stack
    if recorded and status == RUNNING and backend_of is not None:
        recorded = _settle(recorded, running, stack, recorder.clock(), backend_of)
    recorded = _as_guarded(recorded, running, recorder.clock()) if running else recorded
    in_collective = in_collective or (call_text(running[0]) if running else None) or (main.in_collective if looked else None)
    if in_collective is None and error is not None and error.consequence:
        # The wait the main thread was last seen in, when no recorder says which collective failed.
        in_collective = last_issued(recorded) or (main.in_collective if main is not None else None)
    return RankSnapshot(
        rank=rank, host=socket.gethostname(), pid=os.getpid(), status=status,
        groups=recorded or guard_groups(recorder, groups), stack=stack,
        where=main.where if looked else where(stack), in_collective=in_collective, error=error, time=time.time(),
        # Without the recorder the guard's count misses every collective issued in C++: not a count of them.
        collectives=recorder.calls if flight is None or flight.usable else None, source="guard", notes=tuple(notes),
        thread_errors=tuple(thread_errors),
        cpu_s=main.cpu_s if looked else None, proc_state=main.proc_state if looked else "",
        may_spin=main.may_spin if looked else False, still_s=main.still_s if looked else None)
