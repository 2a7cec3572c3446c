"""One rank of a job at one moment, as plain data: what the guard, `stacks` and `explain` all build."""

# The guard (live, through the store), `distdoctor stacks` (py-spy, from outside) and `explain`
# (logs and flight-recorder dumps, afterwards) each describe every rank they can see as a
# RankSnapshot; diagnosis.diagnose turns a set of them into findings. Every field but the rank is
# optional: each source knows different things, and what it does not know stays None / empty.
# to_dict/from_dict give the JSON form (reports, the store channel); from_dict never trusts its
# input: a malformed value becomes "not known", never an exception.

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

# What a rank's process is doing, as far as the source can tell.
RUNNING = "running"          # alive (in a collective or not: see groups / in_collective)
RAISED = "raised"            # its code raised an exception (the process ended or is ending)
EXITED = "exited"            # the process ended with exit_code (0: a clean exit)
KILLED = "killed"            # ended by a signal: exit_code is minus the signal number
FINISHED = "finished"        # it left the job (loop done, destroy_process_group) but may still be alive
UNREACHABLE = "unreachable"  # it does not answer and the source has evidence why (stopped, frozen, gone without a trace)
NOT_HEARD = "not_heard"      # asked, it did not answer in time, and nothing proves why: slow, frozen, dead or
                             # elsewhere; a verdict never names a rank for this alone (diagnosis.diagnose)
UNKNOWN = "unknown"
STATUSES = (RUNNING, RAISED, EXITED, KILLED, FINISHED, UNREACHABLE, NOT_HEARD, UNKNOWN)

_MAX_TEXT = 2000
_MAX_ITEMS = 64


def _text(value: Any, limit: int = _MAX_TEXT) -> str:
    return str(value)[:limit] if value is not None else ""


def _int(value: Any) -> int | None:
    try:
        return int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None


def _seconds(value: Any) -> float | None:
    number = _float(value)
    return number if number is not None and math.isfinite(number) and number >= 0 else None


def _state_letter(value: Any) -> str:
    return value if isinstance(value, str) and len(value) == 1 and value.isalpha() else ""


def _is_map(value: Any) -> bool:
    # A JSON object is a dict: checked first, since Mapping's ABC check costs more than the rest of a
    # snapshot's parsing (a look over 4,096 ranks parses 40,000 of these).
    return type(value) is dict or isinstance(value, Mapping)


def _items(value: Any) -> list[Any]:
    return list(value)[:_MAX_ITEMS] if isinstance(value, (list, tuple)) else []


@dataclass(frozen=True)
class Frame:
    """One Python frame: file, line, function and, when it could be read, the source line."""

    file: str
    line: int | None = None
    function: str = ""
    code: str = ""

    @property
    def label(self) -> str:
        """`train.py:42`"""
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def describe(self) -> str:
        """`loss.backward() at train.py:42` when the source line is known, else `train.py:42 in train`."""
        if self.code:
            return f"`{self.code.strip()}` at {self.label}"
        return f"{self.label} in {self.function}" if self.function else self.label

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}

    @classmethod
    def from_dict(cls, raw: Any) -> "Frame | None":
        if not _is_map(raw) or not raw.get("file"):
            return None
        return cls(_text(raw.get("file"), 500), _int(raw.get("line")), _text(raw.get("function"), 200),
                   _text(raw.get("code"), 300))


@dataclass(frozen=True)
class PendingOp:
    """A collective as the flight recorder or the guard saw it: operation, sequence number, sizes."""

    op: str                                   # all_reduce, broadcast, ... (no backend prefix)
    seq: int | None = None                    # its collective sequence number in its group
    sizes: tuple[tuple[int, ...], ...] = ()   # input sizes
    dtypes: tuple[str, ...] = ()              # input dtypes
    state: str = ""                           # scheduled / started / completed (the recorder's words)
    age_s: float | None = None                # how long it has been pending, when known
    peer: int | None = None                   # a point-to-point call's peer (global rank), when known

    def signature(self) -> tuple[str, tuple, tuple]:
        return (self.op, self.sizes, self.dtypes)

    @property
    def receives(self) -> bool:
        return self.op.startswith(("recv", "irecv"))

    def describe(self) -> str:
        """`all_reduce #7 (Float[3])`; `recv from rank 1 (float32[4])`"""
        seq = f" #{self.seq}" if self.seq is not None else ""
        peer = f" {'from' if self.receives else 'to'} rank {self.peer}" if self.peer is not None else ""
        shapes = ", ".join(f"{d}{list(s)}" for d, s in zip(self.dtypes or ("",) * len(self.sizes), self.sizes))
        return f"{self.op}{seq}{peer}" + (f" ({shapes})" if shapes else "")

    def to_dict(self) -> dict[str, Any]:
        # Made once (it is immutable, and one parsed op is shared by thousands of ranks' snapshots).
        made = self.__dict__.get("_as_dict")
        if made is None:
            made = self.__dict__["_as_dict"] = {
                "op": self.op, "seq": self.seq, "sizes": [list(s) for s in self.sizes],
                "dtypes": list(self.dtypes), "state": self.state, "age_s": self.age_s, "peer": self.peer}
        return dict(made)

    @classmethod
    def from_dict(cls, raw: Any) -> "PendingOp | None":
        if not _is_map(raw) or not raw.get("op"):
            return None
        # Thousands of ranks' snapshots carry the same recent collectives: one parse each (immutable).
        key = _op_key(raw)
        made = _OPS.get(key) if key is not None else None
        if made is not None:
            return made
        sizes = tuple(tuple(v for v in (_int(x) for x in _items(s)) if v is not None) for s in _items(raw.get("sizes")))
        made = cls(_text(raw.get("op"), 100), _int(raw.get("seq")), sizes,
                   tuple(_text(d, 40) for d in _items(raw.get("dtypes"))), _text(raw.get("state"), 40),
                   _float(raw.get("age_s")), _int(raw.get("peer")))
        if key is not None:
            if len(_OPS) >= _MAX_OPS:
                _OPS.clear()
            _OPS[key] = made
        return made


_OPS: dict[tuple, "PendingOp"] = {}
_MAX_OPS = 65536


def _op_key(raw: Mapping[str, Any]) -> tuple | None:
    """What a PendingOp is made of, as a key; None when a value is not of the kinds JSON gives (parsed anew)."""
    seq, age, peer = raw.get("seq"), raw.get("age_s"), raw.get("peer")
    if True in (type(seq) is bool, type(age) is bool, type(peer) is bool):  # True == 1 as a key: parsed anew
        return None
    try:
        key = (raw.get("op"), seq, tuple(map(tuple, raw.get("sizes") or ())), tuple(raw.get("dtypes") or ()),
               raw.get("state"), age, peer)
        hash(key)
    except TypeError:
        return None
    return key


@dataclass(frozen=True)
class GroupProgress:
    """One process group on one rank: how far it got, what it waits in, what it last ran."""

    group: str                                # the group's id ("0" is the default group)
    ranks: tuple[int, ...] = ()               # its global ranks, when known
    last_enqueued: int | None = None          # highest collective sequence number issued
    last_completed: int | None = None         # highest one completed
    pending: PendingOp | None = None          # the oldest collective issued and not completed
    recent: tuple[PendingOp, ...] = ()        # the last collectives recorded (to compare ranks at one seq)

    @property
    def waiting(self) -> bool:
        if self.pending is not None:
            return True
        return (self.last_enqueued is not None and self.last_completed is not None
                and self.last_enqueued > self.last_completed)

    def to_dict(self) -> dict[str, Any]:
        made = self.__dict__.get("_as_dict")  # made once: it is immutable (a snapshot copied shares it)
        if made is None:
            made = self.__dict__["_as_dict"] = {
                "group": self.group, "ranks": list(self.ranks), "last_enqueued": self.last_enqueued,
                "last_completed": self.last_completed,
                "pending": self.pending.to_dict() if self.pending else None,
                "recent": [op.to_dict() for op in self.recent]}
        return dict(made)

    @classmethod
    def from_dict(cls, raw: Any) -> "GroupProgress | None":
        if not _is_map(raw) or raw.get("group") is None:
            return None
        recent = tuple(op for op in (PendingOp.from_dict(r) for r in _items(raw.get("recent"))) if op)
        return cls(_text(raw.get("group"), 100),
                   tuple(r for r in (_int(x) for x in _items(raw.get("ranks"))) if r is not None),
                   _int(raw.get("last_enqueued")), _int(raw.get("last_completed")),
                   PendingOp.from_dict(raw.get("pending")), recent)


@dataclass(frozen=True)
class RaisedError:
    """An exception a rank raised: type, message, the innermost frame of the user's code."""

    type: str
    message: str = ""
    frame: Frame | None = None
    time: float | None = None                 # epoch seconds, when known
    consequence: bool = False                 # raised out of torch.distributed: a peer's failure seen here
    thread: str = ""                          # the thread it ended, when not the main thread

    def describe(self) -> str:
        text = f"{self.type}: {self.message}" if self.message else self.type
        return text + (f" at {self.frame.label}" if self.frame else "")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message,
                "frame": self.frame.to_dict() if self.frame else None, "time": self.time,
                "consequence": self.consequence, "thread": self.thread}

    @classmethod
    def from_dict(cls, raw: Any) -> "RaisedError | None":
        if not _is_map(raw) or not raw.get("type"):
            return None
        return cls(_text(raw.get("type"), 200), _text(raw.get("message")), Frame.from_dict(raw.get("frame")),
                   _float(raw.get("time")), bool(raw.get("consequence")), _text(raw.get("thread"), 100))


@dataclass(frozen=True)
class Transport:
    """The backend's own connections of one rank, read when it answered (TCP_INFO of its sockets):
    whether a collective that does not complete still moves data."""

    idle_s: float | None = None               # since any of them last received data; None: unreadable
    bytes: int | None = None                  # payload bytes they received so far
    connections: int = 0                      # how many were read
    note: str = ""                            # why it could not be read, or what was read

    def to_dict(self) -> dict[str, Any]:
        return {"idle_s": self.idle_s, "bytes": self.bytes, "connections": self.connections, "note": self.note}

    @classmethod
    def from_dict(cls, raw: Any) -> "Transport | None":
        if not isinstance(raw, Mapping):
            return None
        count = _int(raw.get("bytes"))
        return cls(_seconds(raw.get("idle_s")), count if count is not None and count >= 0 else None,
                   max(0, _int(raw.get("connections")) or 0), _text(raw.get("note"), 300))


@dataclass(frozen=True)
class RankSnapshot:
    """One rank: its process, its progress per process group, its main thread's stack, its error."""

    rank: int
    host: str = ""
    pid: int | None = None
    status: str = UNKNOWN
    exit_code: int | None = None              # the process's exit code; minus the signal when killed
    groups: tuple[GroupProgress, ...] = ()
    stack: tuple[Frame, ...] = ()             # the main thread's Python stack, innermost last
    where: Frame | None = None                # the innermost frame of the user's code in that stack
    in_collective: str | None = None          # the collective its stack shows it in, when no recorder says
    error: RaisedError | None = None
    time: float | None = None                 # epoch seconds of this snapshot (or of the exit)
    collectives: int | None = None            # how many collectives it issued (default group), when known
    source: str = ""                          # guard / stacks / flight_recorder / log
    notes: tuple[str, ...] = ()               # what this source could not tell, in words
    thread_errors: tuple[RaisedError, ...] = ()  # exceptions that ended other threads of this rank (still alive)
    # Progress between looks (diagnosis.progress), when the source can read them:
    cpu_s: float | None = None                # CPU seconds its main thread has used so far
    proc_state: str = ""                      # its main thread's kernel state: R, S, D, T, Z ...
    may_spin: bool = False                    # it sits where the CPU may spin without progress
    still_s: float | None = None              # how long its main thread has stayed where it is now (the same
                                              # wait, or the same line doing no work), when its source watched it
    transport: Transport | None = None        # its backend's connections, when its source could read them (the guard)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            object.__setattr__(self, "status", UNKNOWN)

    @property
    def alive(self) -> bool:
        return self.status in (RUNNING, FINISHED)

    @property
    def died_exiting(self) -> bool:
        """It left the job, then died of a signal as its process ended (a source that read both says so)."""
        return self.status == FINISHED and self.exit_code is not None and self.exit_code < 0

    @property
    def waiting(self) -> bool:
        """In a collective, by the recorder's count or by its stack."""
        return self.alive and (any(g.waiting for g in self.groups) or bool(self.in_collective))

    def group(self, name: str) -> GroupProgress | None:
        return next((g for g in self.groups if g.group == name), None)

    def to_dict(self) -> dict[str, Any]:
        # Made once per snapshot (it is immutable): a look over thousands of ranks makes it while it
        # still waits for the last answers, and the findings' data reuse it.
        made = self.__dict__.get("_as_dict")
        if made is None:
            made = self.__dict__["_as_dict"] = self._to_dict()
        return dict(made)

    def _to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "pid": self.pid, "status": self.status,
                "exit_code": self.exit_code, "groups": [g.to_dict() for g in self.groups],
                "stack": [f.to_dict() for f in self.stack], "where": self.where.to_dict() if self.where else None,
                "in_collective": self.in_collective, "error": self.error.to_dict() if self.error else None,
                "time": self.time, "collectives": self.collectives, "source": self.source,
                "notes": list(self.notes), "thread_errors": [e.to_dict() for e in self.thread_errors],
                "cpu_s": self.cpu_s, "proc_state": self.proc_state, "may_spin": self.may_spin, "still_s": self.still_s,
                "transport": self.transport.to_dict() if self.transport else None}

    @classmethod
    def from_dict(cls, raw: Any) -> "RankSnapshot | None":
        if not _is_map(raw) or _int(raw.get("rank")) is None:
            return None
        groups = tuple(g for g in (GroupProgress.from_dict(x) for x in _items(raw.get("groups"))) if g)
        stack = tuple(f for f in (Frame.from_dict(x) for x in _items(raw.get("stack"))) if f)
        collective = raw.get("in_collective")
        return cls(
            rank=int(raw["rank"]), host=_text(raw.get("host"), 200), pid=_int(raw.get("pid")),
            status=_text(raw.get("status"), 20) or UNKNOWN, exit_code=_int(raw.get("exit_code")),
            groups=groups, stack=stack, where=Frame.from_dict(raw.get("where")),
            in_collective=_text(collective, 100) if collective else None,
            error=RaisedError.from_dict(raw.get("error")), time=_float(raw.get("time")),
            collectives=_int(raw.get("collectives")), source=_text(raw.get("source"), 40),
            notes=tuple(_text(n, 500) for n in _items(raw.get("notes"))),
            thread_errors=tuple(e for e in (RaisedError.from_dict(x) for x in _items(raw.get("thread_errors"))) if e),
            cpu_s=_seconds(raw.get("cpu_s")), proc_state=_state_letter(raw.get("proc_state")),
            may_spin=raw.get("may_spin") is True, still_s=_seconds(raw.get("still_s")),
            transport=Transport.from_dict(raw.get("transport")),
        )
