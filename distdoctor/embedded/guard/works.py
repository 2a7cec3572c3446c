"""Point-to-point hygiene: every Work from isend/irecv/batch_isend_irecv must be waited on."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable

from distdoctor.embedded.guard.record import CallRecord, Recorder, tensor_facts


class _Tracked:
    __slots__ = ("record", "waited")

    def __init__(self, record: CallRecord) -> None:
        self.record, self.waited = record, False


class WorkTracker:
    """Knows each p2p Work until it is waited on, completed-and-checked, or dropped.

    ``on_dropped(record)`` runs when a Work is garbage-collected before wait() (in whatever
    thread dropped it). Work.wait / Work.is_completed are patched on the class while the guard
    is on, so waits through any reference count; a blocking wait is itself a recorded call.
    """

    def __init__(self, work_class: Any, on_dropped: Callable[[CallRecord], None],
                 on_wait: Callable[[CallRecord], Callable[[bool], None]]) -> None:
        self.work_class = work_class
        self.on_dropped, self.on_wait = on_dropped, on_wait
        self.tracked: dict[int, _Tracked] = {}
        self._lock = threading.Lock()
        self._originals: dict[str, Any] = {}

    def install(self) -> None:
        cls, tracker = self.work_class, self
        wait, is_completed = cls.wait, cls.is_completed
        self._originals = {"wait": wait, "is_completed": is_completed}

        def guarded_wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            entry = tracker.tracked.get(id(work))
            if entry is None:
                return wait(work, *args, **kwargs)
            done = tracker.on_wait(entry.record)
            try:
                result = wait(work, *args, **kwargs)
            except BaseException:
                done(True)
                raise
            entry.waited = True
            done(False)
            return result

        def guarded_is_completed(work: Any) -> Any:
            result = is_completed(work)
            entry = tracker.tracked.get(id(work)) if result else None
            if entry is not None:
                entry.waited = True  # polled to completion: as good as a wait
            return result

        cls.wait, cls.is_completed = guarded_wait, guarded_is_completed

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(self.work_class, name, original)
        self._originals = {}

    def track(self, work: Any, record: CallRecord) -> None:
        if work is None:
            return
        key = id(work)
        with self._lock:
            self.tracked[key] = _Tracked(record)
        try:
            weakref.finalize(work, self._finalized, key)
        except TypeError:  # a Work type without weak references: cannot see it dropped
            pass

    def _finalized(self, key: int) -> None:
        with self._lock:
            entry = self.tracked.pop(key, None)
        if entry is not None and not entry.waited:
            self.on_dropped(entry.record)

    def pending(self) -> list[CallRecord]:
        """Works still referenced and never waited on (at destroy_process_group or exit)."""
        with self._lock:
            return [e.record for e in self.tracked.values() if not e.waited]


def batch_parts(record: CallRecord, ops: Iterable[Any], recorder: Recorder) -> list[CallRecord]:
    """A batch_isend_irecv's ops as the isend / irecv calls they are (gloo posts each as a lone call
    and matches it the same way), each numbered among this rank's calls with its peer and tag."""
    parts = []
    for op in ops:
        name = str(getattr(getattr(op, "op", None), "__name__", ""))
        kind = "irecv" if name.endswith("recv") else "isend"
        peer, tag = getattr(op, "peer", None), getattr(op, "tag", 0)
        peer = int(peer) if isinstance(peer, int) or hasattr(peer, "__index__") else "?"
        tag = int(tag) if isinstance(tag, int) else 0
        facts = tensor_facts(getattr(op, "tensor", None))
        shapes, dtypes, devices = ((facts[0],), (facts[1],), (facts[2],)) if facts else ((), (), ())
        parts.append(record.copy(op=kind, seq=recorder.next_p2p_seq(record.group, kind, peer, tag),
                                 params={"peer": peer, "tag": tag}, shapes=shapes, dtypes=dtypes, devices=devices))
    return parts


def published(records: Iterable[CallRecord], now: float,
              backend_of: Callable[[str, tuple], str | None]) -> list[dict[str, Any]]:
    """Dropped Works as a look's answer carries them: each with how long ago it was issued (``now``:
    the recorder's clock) and the backend that carries it in its group (None: not known)."""
    out = []
    for record in records:
        entry = record.to_dict()
        entry["age_s"] = round(max(0.0, now - record.started), 1)
        entry["backend"] = backend_of(record.group, tuple(record.devices))
        out.append(entry)
    return out
