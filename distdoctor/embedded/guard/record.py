"""The guard's record of each call: what it was, from which line, and which calls are still running."""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

from distdoctor.diagnosis.frames import display_path

# Calls whose arguments must agree on every rank of the group (they are verified before the call).
COLLECTIVES = (
    "broadcast", "all_reduce", "reduce", "all_gather", "all_gather_into_tensor", "gather", "scatter",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "barrier",
    "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list",
)
# Calls between two ranks: recorded and tracked, never verified (no group-wide moment to compare).
POINT_TO_POINT = ("send", "recv", "isend", "irecv", "send_object_list", "recv_object_list", "batch_isend_irecv")
_COLLECTIVE_SET = frozenset(COLLECTIVES)
# Fingerprint fields compared across ranks, in the order of the exchanged words.
COMPARED = ("op", "shapes", "dtypes", "devices", "params")
WORD_MAGIC = 0x6464  # "dd": a row that lacks it did not come from a guard's verification
# The words of a fingerprint (CallRecord.words): magic, seq, the compared fields, site, proposal.
WORD_COUNT = 2 + len(COMPARED) + 2


# Point-to-point numbering: a key per (group, direction, peer, tag) in use; beyond this many, a new
# key's calls are left unnumbered (-1) rather than one evicted and counted anew from 0 (that would
# pair one message with another's receive). A job that sends with a new tag every step reaches it.
MAX_P2P_KEYS = 4096
# The receive counts a look's answer carries (the most recently used keys): enough for pipeline and
# ring patterns, bounded at any world size.
SHOWN_RECEIVE_KEYS = 64


def p2p_direction(op: str) -> str:
    """"recv" for a receiving point-to-point call, "batch" for a batch (its ops are numbered one by one:
    works.batch_parts), "send" for the others."""
    return "recv" if op.startswith(("recv", "irecv")) else "batch" if op == "batch_isend_irecv" else "send"


_FIELDS = ("op", "group", "seq", "shapes", "dtypes", "devices", "params", "site", "function", "started",
           "ended", "failed", "verified")


class CallRecord:
    """One guarded call. ``seq`` counts the collectives of ``group``; a point-to-point call's counts its
    group's calls in its direction with its peer and tag (Recorder.next_p2p_seq).

    A guarded call knows its caller's code and instruction (``where``); the line and the shown
    file name are worked out when first read (``site``, ``function``), not on the hot path: the
    line table's walk alone cost ~11 µs a call with the CPU's caches cold from a training step.
    """

    __slots__ = ("op", "group", "seq", "shapes", "dtypes", "devices", "params", "where", "_site", "_function",
                 "started", "ended", "failed", "verified")

    def __init__(self, op: str, group: str, seq: int, shapes: tuple = (), dtypes: tuple = (), devices: tuple = (),
                 params: dict | None = None, site: str = "?", function: str = "?", started: float = 0.0,
                 ended: float | None = None, failed: bool = False, verified: bool = False, where: Any = None) -> None:
        self.op, self.group, self.seq = op, group, seq
        self.shapes, self.dtypes, self.devices = shapes, dtypes, devices
        self.params = {} if params is None else params
        self._site, self._function, self.where = site, function, where
        self.started, self.ended, self.failed, self.verified = started, ended, failed, verified

    @property
    def site(self) -> str:
        """'train.py:42': the caller's line (outside torch and the guard)."""
        self._resolve()
        return self._site

    @site.setter
    def site(self, value: str) -> None:
        self._resolve()  # the function keeps what the caller's code says
        self._site = value

    @property
    def function(self) -> str:
        self._resolve()
        return self._function

    @function.setter
    def function(self, value: str) -> None:
        self._resolve()  # the site keeps what the caller's code says
        self._function = value

    def _resolve(self) -> None:
        where = self.where
        if where is not None:  # the watchdog's thread may resolve it too: the same result either way
            self._site, self._function = shown_site(*where)
            self.where = None

    def copy(self, **changes: Any) -> "CallRecord":
        values = {name: getattr(self, name) for name in _FIELDS}
        values.update(changes)
        return CallRecord(**values)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not CallRecord:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in _FIELDS)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        return f"CallRecord({', '.join(f'{name}={getattr(self, name)!r}' for name in _FIELDS)})"

    def label(self) -> str:
        """'all_reduce #5' or, for a point-to-point call, 'isend #2 to rank 1'."""
        if self.op in POINT_TO_POINT:
            peer = self.params.get("peer")
            direction = "from" if self.op.startswith(("recv", "irecv")) else "to"
            return f"{self.op} #{self.seq}" + (f" {direction} rank {peer}" if peer is not None else "")
        return f"{self.op} #{self.seq}"

    def summary(self) -> str:
        """'all_reduce #5 (float32[2, 3], op SUM) at train.py:42 in train'."""
        bits = [f"{d}{list(s)}" for s, d in zip(self.shapes, self.dtypes)] if self.shapes else list(self.dtypes)
        bits += [f"{k} {v}" for k, v in sorted(self.params.items()) if k != "peer"]
        args = f" ({', '.join(bits)})" if bits else ""
        return f"{self.label()}{args} at {self.site} in {self.function}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "group": self.group, "seq": self.seq, "shapes": [list(s) for s in self.shapes],
            "dtypes": list(self.dtypes), "devices": list(self.devices), "params": dict(self.params),
            "site": self.site, "function": self.function, "completed": self.ended is not None,
            "failed": self.failed, "verified": self.verified,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "CallRecord":
        record = cls(op=str(raw.get("op", "?")), group=str(raw.get("group", "?")), seq=int(raw.get("seq", -1)),
                     shapes=tuple(tuple(s) for s in raw.get("shapes", ())), dtypes=tuple(raw.get("dtypes", ())),
                     devices=tuple(raw.get("devices", ())), params=dict(raw.get("params") or {}),
                     site=str(raw.get("site", "?")), function=str(raw.get("function", "?")))
        record.failed, record.verified = bool(raw.get("failed")), bool(raw.get("verified"))
        record.ended = 0.0 if raw.get("completed") else None
        return record

    def compared(self) -> dict[str, Any]:
        """The fields that must be equal on every rank of the group."""
        return {"op": self.op, "shapes": self.shapes, "dtypes": self.dtypes, "devices": self.devices,
                "params": tuple(sorted(self.params.items()))}

    def words(self, proposal: int = 1) -> list[int]:
        """The fingerprint as int64 words: magic, seq, one hash per compared field, then the two
        words that may differ: the site and this rank's proposed gap to the next verification."""
        fields = self.compared()
        return [WORD_MAGIC, self.seq, *(_hash64(fields[name]) for name in COMPARED), _hash64(self.site), proposal]


def _hash64(value: Any) -> int:
    # Python's hash() of a str differs between processes; blake2b is the same on every rank.
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little", signed=True)


# -- what a call was -----------------------------------------------------------------------------


_DTYPES: dict[Any, str] = {}


def tensor_facts(value: Any) -> tuple[tuple, str, str] | None:
    """(shape, dtype name, device type) of a tensor (or anything shaped like one); None otherwise."""
    try:  # a tensor: plain attribute reads (this runs on every guarded call)
        shape, dtype = value.shape, value.dtype
    except AttributeError:
        return None
    if shape is None or dtype is None:
        return None
    name = _DTYPES.get(dtype)
    if name is None:
        name = _DTYPES[dtype] = str(dtype).replace("torch.", "")
    try:  # is_cpu / is_cuda are plain flags; device.type builds a string (4x their cost)
        device = "cpu" if value.is_cpu else "cuda" if value.is_cuda else str(value.device.type)
    except AttributeError:
        try:
            device = str(value.device.type)
        except AttributeError:
            device = "?"
    return tuple(shape), name, device


class Recorder:
    """The ring buffer of recent calls, the sequence counters and the calls still running.

    The main thread adds and ends calls; the episode watchdog reads them from its own thread, so
    both sides go through one lock (uncontended in a healthy job).
    """

    def __init__(self, ring_size: int = 256, clock: Callable[[], float] = time.monotonic) -> None:
        self.ring: deque[CallRecord] = deque(maxlen=max(8, int(ring_size)))
        self.clock = clock
        self.seqs: dict[str, int] = {}
        self.p2p_seqs: dict[tuple, int] = {}
        self.p2p_full = False  # a point-to-point key was left unnumbered (MAX_P2P_KEYS)
        self.completed: dict[str, int] = {}
        self.running: dict[int, CallRecord] = {}
        self.works: dict[int, Any] = {}  # token -> the Work whose completion ends that running call
        self.calls = 0
        self._lock = threading.Lock()
        self._next = 0

    def next_p2p_seq(self, group: str, op: str, peer: Any, tag: Any = 0) -> int:
        """This call's index among this rank's point-to-point calls of ``group`` in its direction with
        ``peer`` and ``tag``: gloo matches the i-th send from S to R with tag T to R's i-th receive from
        S with tag T (one queue per peer and tag, in order). -1 once the table is full."""
        key = (group, p2p_direction(op), peer, tag if isinstance(tag, int) else 0)
        table = self.p2p_seqs
        seq = table.pop(key, None)  # re-inserted below: the table stays in the order of last use
        if seq is None:
            if len(table) >= MAX_P2P_KEYS:
                self.p2p_full = True
                return -1
            seq = 0
        table[key] = seq + 1
        return seq

    def receive_counts(self) -> dict[str, Any]:
        """How many receives this rank issued per (group, peer, tag), the most recently used keys
        (``peer`` "any": from any source); ``complete`` when every receive key is listed."""
        keys = [(k, n) for k, n in list(self.p2p_seqs.items()) if k[1] == "recv"]
        shown = keys[-SHOWN_RECEIVE_KEYS:]
        return {"counts": [[group, peer, tag, n] for (group, _, peer, tag), n in shown],
                "complete": not self.p2p_full and len(shown) == len(keys)}

    def begin_collective(self, record: CallRecord) -> int:
        """begin() for a collective: it takes the group's next sequence number first (one call,
        on the hot path)."""
        group = record.group
        seq = record.seq = self.seqs.get(group, 0)
        self.seqs[group] = seq + 1
        return self.begin(record)

    def begin(self, record: CallRecord) -> int:
        record.started = self.clock()
        # No lock on the hot path: each of these is one atomic operation under the GIL, and the
        # watchdog only takes snapshots (list(...)) of them.
        self._next += 1
        token = self._next
        self.running[token] = record
        self.ring.append(record)
        self.calls += 1
        return token

    def attach(self, token: int, work: Any) -> None:
        """The call returned a Work: it is running until the Work says it completed."""
        with self._lock:
            if token in self.running:
                self.works[token] = work

    def end(self, token: int, failed: bool = False) -> None:
        record = self.running.pop(token, None)
        if record is None:
            return
        if self.works:
            self.works.pop(token, None)
        record.ended, record.failed = self.clock(), failed
        if not failed and record.op in _COLLECTIVE_SET and self.completed.get(record.group, -1) < record.seq:
            self.completed[record.group] = record.seq

    def poll(self) -> None:
        """End the calls whose Work completed (asynchronous calls, NCCL's sync calls)."""
        with self._lock:
            waiting = list(self.works.items())
        for token, work in waiting:
            try:
                done = bool(work.is_completed())
            except Exception:  # a failed Work has completed, with an error
                done = True
            if done:
                self.end(token)

    def oldest_running(self) -> CallRecord | None:
        with self._lock:
            records = list(self.running.values())
        return min(records, key=lambda r: r.started, default=None)

    def running_records(self) -> list[CallRecord]:
        with self._lock:
            return sorted(self.running.values(), key=lambda r: r.started)

    def recent(self, group: str | None = None, limit: int = 16) -> list[CallRecord]:
        with self._lock:
            records = list(self.ring)
        if group is not None:
            records = [r for r in records if r.group == group]
        return records[-limit:]


# -- where a call came from ----------------------------------------------------------------------

# id(code) -> (code, is it torch's or the guard's): keyed by id because a code object's hash is
# computed anew on every lookup, over its constants and every function nested in them (a training
# script's module code: tens of microseconds on each guarded call). The code object is kept in the
# value, so its id cannot be reused while the entry stands.
_INTERNAL: dict[int, tuple[Any, bool]] = {}
# File name -> how it is shown (the working directory does not change under a training job).
_SHOWN: dict[str, str] = {}


def _internal_dirs() -> tuple[str, ...]:
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    torch = sys.modules.get("torch")
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep if torch and getattr(torch, "__file__", None) else None
    return tuple(d for d in (here, torch_dir) if d)


def call_site(skip: int = 2) -> tuple[str, str]:
    """('train.py:42', 'train'): the innermost frame outside torch and the guard."""
    where = where_of(sys._getframe(skip))
    return shown_site(*where) if where is not None else ("?", "?")


def where_of(frame: Any) -> tuple[Any, int] | None:
    """(code, instruction offset) of the innermost frame outside torch and the guard, from ``frame``
    outwards (the guarded wrapper passes its caller's): what the line is worked out from later."""
    dirs = None
    while frame is not None:
        code = frame.f_code
        known = _INTERNAL.get(id(code))
        if known is not None and known[0] is code:
            internal = known[1]
        else:
            dirs = dirs or _internal_dirs()
            internal = os.path.abspath(code.co_filename).startswith(dirs)
            _INTERNAL[id(code)] = (code, internal)
        if not internal:
            return code, frame.f_lasti
        frame = frame.f_back
    return None


def shown_site(code: Any, offset: int) -> tuple[str, str]:
    """('train.py:42', 'train') for the instruction at ``offset`` of ``code``."""
    shown = _SHOWN.get(code.co_filename)
    if shown is None:
        shown = _SHOWN[code.co_filename] = display_path(code.co_filename)
    return f"{shown}:{line_at(code, offset)}", code.co_name


def line_at(code: Any, offset: int) -> int:
    """The source line of the instruction at byte ``offset`` (what frame.f_lineno reads)."""
    line = None
    try:
        for start, end, number in code.co_lines():
            if start <= offset < end:
                line = number
                break
    except Exception:  # a code object without a line table
        pass
    return line if line is not None else code.co_firstlineno
