"""The job as a Trace Event Format document (trace.json): what Perfetto UI (and chrome://tracing) opens."""

# One process per rank ("rank N on host"; its pid is the rank + 1, since trace viewers treat pid 0
# as the idle process), sorted by rank. Its tracks (threads): the stalls it was in (tid 1: the late
# rank's span carries its line and verdict, a flow arrow links it to each waiting rank's span), its
# collectives (tid 10 and up: one per lane, so that overlapping calls never mis-nest), and instants
# for a raise, an exit or a kill. Timestamps are microseconds since the earliest event
# (otherData.origin_epoch_s says when that was). Bounded: every stall is kept (stalls.json already
# keeps 200 whole and sums up the rest), at most MAX_WAITING_DRAWN waiting ranks of a stall get their
# own span (the others are named in its arguments), and the collectives of each rank are its last
# ones, at most MAX_COLLECTIVE_SPANS over the whole job (the recorder's ring is the other bound).

from __future__ import annotations

import datetime
import math
from typing import Any

from distdoctor.core.html import producer_version
from distdoctor.core.report import format_ranks
from distdoctor.timeline.collectives import Span, lanes, spans
from distdoctor.timeline.material import Material
from distdoctor.timeline.pace import counters, earliest

MAX_COLLECTIVE_SPANS = 200_000
MIN_PER_RANK = 64
MAX_WAITING_DRAWN = 64
WAIT_OFFSET_US = 1.0   # a waiting rank's span starts this much after the late rank's (see _stall_events)
STALL_TID, FAULT_TID, COLLECTIVE_TID = 1, 2, 10
_FAULT_NAMES = {"raise": "raised", "exit": "exited", "kill": "killed"}


def pid_of(rank: int) -> int:
    return rank + 1


def collective_spans(material: Material) -> dict[int, list[Span]]:
    """Each rank's collectives, within the job's budget (the most recent of each rank)."""
    ranks = sorted(material.entries)
    if not ranks:
        return {}
    per_rank = max(MIN_PER_RANK, MAX_COLLECTIVE_SPANS // len(ranks))
    out = {}
    for rank in ranks:
        dumped = material.dumped_at.get(rank)
        out[rank] = spans(rank, material.entries[rank], material.completed.get(rank, {}),
                          int(dumped * 1e9) if dumped else None, per_rank)
    return out


def origin_s(material: Material, collectives: dict[int, list[Span]]) -> float:
    """The earliest event, rounded down to a whole microsecond (so that every ts is >= 0, exactly)."""
    times_us = [math.floor(s["start"] * 1e6) for s in material.stalls] + [math.floor(f.time * 1e6) for f in material.faults]
    times_us += [items[0].start_ns // 1000 for items in collectives.values() if items]
    paced = earliest(material)
    times_us += [math.floor(paced * 1e6)] if paced is not None else []
    return min(times_us) / 1e6 if times_us else 0.0


def build_trace(material: Material, collectives: dict[int, list[Span]] | None = None) -> dict[str, Any]:
    """The trace document (a dict ready for json.dump); `collectives` from collective_spans, when at hand."""
    collectives = collective_spans(material) if collectives is None else collectives
    origin = origin_s(material, collectives)
    events: list[dict[str, Any]] = []
    ranks = sorted(set(material.ranks) | set(collectives))
    for rank in ranks:
        events += _process(rank, material.ranks[rank].host if rank in material.ranks else "", bool(collectives.get(rank)))
    for rank, items in collectives.items():
        events += _collective_events(rank, items, origin)
    events += _stall_events(material, origin)
    events += counters(material, origin, pid_of)  # the job's pace: each rank's wait per step, window by window
    for fault in material.faults:
        events.append({"name": f"{_FAULT_NAMES.get(fault.kind, fault.kind)}: {fault.text[:120]}", "cat": "fault",
                       "ph": "i", "s": "p", "ts": _us(fault.time - origin), "pid": pid_of(fault.rank), "tid": FAULT_TID,
                       "args": {"rank": fault.rank, "what": fault.kind, "detail": fault.text}})
    # Metadata first, then every event in time order: each track's timestamps only go forward.
    events = [e for e in events if e["ph"] == "M"] + sorted((e for e in events if e["ph"] != "M"), key=lambda e: e["ts"])
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": f"distdoctor {producer_version()}", "origin_epoch_s": round(origin, 6),
                          "origin_utc": _utc(origin), "ranks": len(ranks), "stalls": len(material.stalls),
                          "stalls_summarized": (material.omitted or {}).get("omitted", 0),
                          "collectives": sum(len(v) for v in collectives.values()),
                          "lacks": list(material.lacks)}}


def _utc(epoch: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return ""


def _us(seconds: float) -> float:
    return max(0.0, round(seconds * 1e6, 3))  # a float's last bit never makes a ts negative


def _process(rank: int, host: str, has_collectives: bool) -> list[dict[str, Any]]:
    pid = pid_of(rank)
    name = f"rank {rank} on {host}" if host else f"rank {rank}"
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
           {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": rank}},
           {"name": "thread_name", "ph": "M", "pid": pid, "tid": STALL_TID, "args": {"name": "stalls"}},
           {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": STALL_TID, "args": {"sort_index": 0}},
           {"name": "thread_name", "ph": "M", "pid": pid, "tid": FAULT_TID, "args": {"name": "faults"}},
           {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": FAULT_TID, "args": {"sort_index": 1}}]
    if not has_collectives:
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": COLLECTIVE_TID,
                    "args": {"name": "collectives: no flight-recorder dump of this rank"}})
    return out


def _collective_events(rank: int, items: list[Span], origin: float) -> list[dict[str, Any]]:
    pid = pid_of(rank)
    origin_ns = round(origin * 1e6) * 1000  # integer nanoseconds: a slice ends exactly where the next call begins
    placed = lanes([(s.start_ns, s.end_ns if s.end_ns > s.start_ns else s.start_ns + 1) for s in items])
    out: list[dict[str, Any]] = []
    for lane in sorted(set(placed)):
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": COLLECTIVE_TID + lane,
                    "args": {"name": "collectives" + (f" (overlapping, {lane + 1})" if lane else "")}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": COLLECTIVE_TID + lane,
                    "args": {"sort_index": 2 + lane}})
    for span, lane in zip(items, placed):
        seq = f" #{span.seq}" if span.seq is not None else ""
        out.append({"name": f"{span.op}{seq}", "cat": "p2p" if span.p2p else "collective", "ph": "X",
                    "ts": (span.start_ns - origin_ns) / 1000, "dur": (span.end_ns - span.start_ns) / 1000,
                    "pid": pid, "tid": COLLECTIVE_TID + lane,
                    "args": {"group": span.group, "seq": span.seq, "sizes": span.sizes, "dtypes": span.dtypes,
                             "state": span.state, "end": span.end}})
    return out


def _stall_events(material: Material, origin: float) -> list[dict[str, Any]]:
    stalls = sorted(material.stalls, key=lambda s: s["start"])
    end_of_record = max([s["start"] + (s["seconds"] or 0) for s in stalls] + [max(material.dumped_at.values(), default=0)])
    per_rank: dict[int, list[tuple[dict[str, Any], str, float]]] = {}
    for stall in stalls:
        length = stall["seconds"] if stall["seconds"] is not None else max(0.0, end_of_record - stall["start"])
        for rank in stall["late"]:
            per_rank.setdefault(rank, []).append((stall, "late", length))
        for rank in stall["waiting"][:MAX_WAITING_DRAWN]:
            if rank not in stall["late"]:
                per_rank.setdefault(rank, []).append((stall, "waiting", length))
    track: dict[tuple[int, int], int] = {}   # (rank, episode) -> the tid its span is on
    out: list[dict[str, Any]] = []
    for rank, items in per_rank.items():
        placed = lanes([(s["start"], s["start"] + max(length, 2e-6)) for s, _, length in items])
        for lane in sorted(set(placed) - {0}):
            out.append({"name": "thread_name", "ph": "M", "pid": pid_of(rank), "tid": 100 + lane,
                        "args": {"name": f"stalls (overlapping, {lane + 1})"}})
        for (stall, role, length), lane in zip(items, placed):
            tid = STALL_TID if lane == 0 else 100 + lane
            track[(rank, stall["episode"])] = tid
            out.append(_stall_span(rank, stall, role, length, tid, origin))
    for rank, items in per_rank.items():
        for stall, role, length in items:
            late_tid = track.get((stall["late"][0], stall["episode"])) if stall["late"] else None
            if role != "waiting" or late_tid is None:
                continue
            # An arrow from the late rank's span to each span it holds up. Chrome's DevTools binds a flow's
            # ends to the events of the same ts, pid, tid and cat (and needs two distinct ts), Perfetto to
            # the slice enclosing the ts: the waiting spans start 1 us after the late one, at the arrow's end.
            start = _us(stall["start"] - origin)
            flow = {"name": "holds up", "cat": "stall", "id": stall["episode"] * 1_000_003 + rank}
            out.append({**flow, "ph": "s", "ts": start, "pid": pid_of(stall["late"][0]), "tid": late_tid})
            out.append({**flow, "ph": "f", "bp": "e", "ts": start + WAIT_OFFSET_US, "pid": pid_of(rank),
                        "tid": track[(rank, stall["episode"])]})
    return out


def _stall_span(rank: int, stall: dict[str, Any], role: str, length: float, tid: int, origin: float) -> dict[str, Any]:
    late = stall["late"]
    op = f"{stall['op']} #{stall['seq']}" if stall["op"] and stall["seq"] is not None else stall["op"] or "a collective"
    if "late_text" not in stall:  # once per stall, not per span: 4,096 ranks make a long list
        stall["late_text"], stall["waiting_text"] = format_ranks(late), format_ranks(stall["waiting"])
    args = {"episode": stall["episode"], "verdict": stall["verdict"], "cause": stall["cause"], "title": stall["title"],
            "where": stall["where"], "op": stall["op"], "seq": stall["seq"], "group": stall["group"],
            "seconds": stall["seconds"], "late_ranks": stall["late_text"], "waiting_ranks": stall["waiting_text"],
            "open": stall["seconds"] is None, "role": role}
    if role == "late":
        name = f"late {length:.1f} s" + (f" at {stall['where']}" if stall["where"] else "") + \
               (f" ({stall['verdict']})" if stall["verdict"] else "")
    else:
        name = f"waiting {length:.1f} s for rank{'s' if len(late) != 1 else ''} {stall['late_text'] or '?'} in {op}"
    offset = WAIT_OFFSET_US if role == "waiting" else 0.0
    return {"name": name, "cat": "stall", "ph": "X", "ts": _us(stall["start"] - origin) + offset,
            "dur": max(_us(length) - offset, 1.0), "pid": pid_of(rank), "tid": tid, "args": args}
