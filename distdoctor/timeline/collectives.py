"""A rank's flight-recorder entries as spans in time: from enqueue to completion, as far as the recorder says."""

# An entry has time_created_ns (enqueued) and, where the backend's events report it (NCCL),
# time_discovered_started_ns / time_discovered_completed_ns and duration_ms. Gloo records neither
# (its entries stay "scheduled"): such an entry is drawn up to the next call enqueued on the same
# thread, and says so ("end": "next call"). The last of them, and one still pending at the dump,
# end at the dump (or at the entry itself when the dump's time is unknown). Every span carries which
# of these its end is, so nobody reads a guess as a measurement.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

RECORDED, FROM_DURATION, NEXT_CALL, PENDING, UNKNOWN = "recorded", "duration", "next call", "pending at the dump", "unknown"


@dataclass
class Span:
    """One collective (or point-to-point call) of one rank."""

    rank: int
    group: str
    op: str
    seq: int | None
    p2p: bool
    start_ns: int
    end_ns: int
    end: str                      # how the end is known: RECORDED, FROM_DURATION, NEXT_CALL, PENDING, UNKNOWN
    sizes: str
    dtypes: str
    state: str
    thread: str


def _ns(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _shape(raw: Any) -> str:
    if not isinstance(raw, (list, tuple)):
        return ""
    shapes = ["x".join(str(d) for d in s[:8]) if isinstance(s, (list, tuple)) else "?" for s in list(raw)[:8]]
    return ", ".join(f"[{s}]" for s in shapes) + (", ..." if len(raw) > 8 else "")


def _names(raw: Any) -> str:
    return ", ".join(str(d)[:20] for d in list(raw)[:8]) if isinstance(raw, (list, tuple)) else ""


def spans(rank: int, entries: list[Mapping[str, Any]], completed: Mapping[str, int], dumped_ns: int | None,
          limit: int) -> list[Span]:
    """The rank's last `limit` entries as spans, oldest first."""
    timed = sorted((e for e in entries if _ns(e.get("time_created_ns"))), key=lambda e: e["time_created_ns"])
    timed = timed[-limit:] if limit > 0 else []
    out: list[Span] = []
    next_on_thread: dict[str, int] = {}
    for entry in reversed(timed):
        thread = str(entry.get("thread_id") or entry.get("thread_name") or "")[:40]
        created = entry["time_created_ns"]
        out.append(_span(rank, entry, created, next_on_thread.get(thread), completed, dumped_ns, thread))
        next_on_thread[thread] = created
    out.reverse()
    return out


def _span(rank: int, entry: Mapping[str, Any], created: int, following: int | None, completed: Mapping[str, int],
          dumped_ns: int | None, thread: str) -> Span:
    group_raw = entry.get("process_group")
    group = str(group_raw[0])[:100] if isinstance(group_raw, (list, tuple)) and group_raw else str(entry.get("pg_id", "?"))
    p2p = bool(entry.get("is_p2p"))
    seq = entry.get("p2p_seq_id" if p2p else "collective_seq_id")
    seq = seq if isinstance(seq, int) and not isinstance(seq, bool) else None
    name = str(entry.get("profiling_name") or "?")
    op = (name.split(":", 1)[1] if ":" in name else name)[:60]
    started = _ns(entry.get("time_discovered_started_ns"))
    finished = _ns(entry.get("time_discovered_completed_ns"))
    duration = entry.get("duration_ms")
    if finished and finished >= created:
        end, how = finished, RECORDED
    elif started and isinstance(duration, (int, float)) and duration >= 0:
        end, how = started + int(duration * 1e6), FROM_DURATION
    else:
        done = completed.get(group)
        pending = not p2p and seq is not None and done is not None and seq > done and not entry.get("retired")
        if pending and dumped_ns and dumped_ns >= created:
            end, how = dumped_ns, PENDING
        elif following is not None and not pending:
            end, how = following, NEXT_CALL
        else:
            end, how = created, UNKNOWN
    return Span(rank=rank, group=group, op=op, seq=seq, p2p=p2p, start_ns=created, end_ns=max(end, created), end=how,
                sizes=_shape(entry.get("input_sizes")), dtypes=_names(entry.get("input_dtypes")),
                state=str(entry.get("state") or "")[:20], thread=thread)


def lanes(items: list[tuple[float, float]]) -> list[int]:
    """A lane per item so that no two items of one lane overlap (trace viewers nest slices per track)."""
    ends: list[float] = []
    out = []
    for start, end in items:
        for lane, last in enumerate(ends):
            if last <= start:
                ends[lane] = end
                out.append(lane)
                break
        else:
            ends.append(end)
            out.append(len(ends) - 1)
    return out
