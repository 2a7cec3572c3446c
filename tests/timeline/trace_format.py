"""A checker of the Trace Event Format as Perfetto's and Chrome's importers read it (the parts trace.json uses).

Format: "Trace Event Format" (Google's document that chrome://tracing and Perfetto's JSON importer
follow): a JSON object with `traceEvents`; every event has `name`, `ph`, `pid`, `tid`; every event
but metadata (`M`) a `ts` in microseconds; `X` a `dur`; `B`/`E` match per thread; flow events `s`/`f`
share `cat`+`id` and bind to a slice enclosing their `ts` on their thread; instants `i` a scope `s`.
Perfetto's maintainers ask for pid > 0 (0 is the idle process) and never a negative ts.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

PHASES = {"X", "B", "E", "i", "I", "M", "s", "t", "f", "C", "b", "e", "n"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index", "process_labels"}


def problems(trace: Any) -> list[str]:
    """What in this document a trace viewer would reject or draw wrong (empty: valid)."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not an object with a traceEvents list"]
    out: list[str] = []
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    last_ts: dict[tuple[int, int], float] = {}
    open_b: dict[tuple[int, int], list[str]] = defaultdict(list)
    flows: dict[tuple[str, Any], dict[str, dict]] = defaultdict(dict)
    named_pids: set[int] = set()
    used_pids: set[int] = set()
    for n, event in enumerate(trace["traceEvents"]):
        where = f"event {n} ({event.get('name') if isinstance(event, dict) else event!r})"
        if not isinstance(event, dict):
            out.append(f"{where}: not an object")
            continue
        ph = event.get("ph")
        if ph not in PHASES:
            out.append(f"{where}: unknown phase {ph!r}")
            continue
        if not isinstance(event.get("name"), str):
            out.append(f"{where}: no name")
        pid, tid = event.get("pid"), event.get("tid")
        if not isinstance(pid, int) or not isinstance(tid, int) or isinstance(pid, bool):
            out.append(f"{where}: pid and tid must be integers")
            continue
        if pid <= 0:
            out.append(f"{where}: pid {pid} (0 is the idle process in Perfetto)")
        if ph == "M":
            if event.get("name") not in METADATA:
                out.append(f"{where}: unknown metadata")
            if not isinstance(event.get("args"), dict):
                out.append(f"{where}: metadata without args")
            if event.get("name") == "process_name":
                named_pids.add(pid)
            if "ts" in event and event["ts"] != 0:
                out.append(f"{where}: metadata with a timestamp")
            continue
        used_pids.add(pid)
        ts = event.get("ts")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or ts < 0 or ts != ts:
            out.append(f"{where}: ts must be a number >= 0, got {ts!r}")
            continue
        track = (pid, tid)
        if ts < last_ts.get(track, float("-inf")):
            out.append(f"{where}: ts {ts} goes back on track {track} (was {last_ts[track]})")
        last_ts[track] = ts
        if ph == "X":
            dur = event.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                out.append(f"{where}: X without a dur >= 0")
            else:
                slices[track].append((ts, ts + dur, event["name"]))
        elif ph == "B":
            open_b[track].append(event.get("name", ""))
        elif ph == "E":
            if not open_b[track]:
                out.append(f"{where}: E without a B on track {track}")
            else:
                open_b[track].pop()
        elif ph in ("i", "I") and event.get("s", "t") not in ("g", "p", "t"):
            out.append(f"{where}: instant with scope {event.get('s')!r}")
        elif ph in ("s", "t", "f"):
            key = (str(event.get("cat")), event.get("id"))
            if event.get("id") is None:
                out.append(f"{where}: flow without an id")
            if ph in flows[key]:
                out.append(f"{where}: a second {ph!r} of flow {key}")
            flows[key][ph] = event
    for track, names in open_b.items():
        if names:
            out.append(f"track {track}: B without E: {names[:3]}")
    out += _nesting(slices)
    out += _flows(flows, slices)
    for pid in sorted(used_pids - named_pids):
        out.append(f"pid {pid}: events but no process_name")
    return out


def _nesting(slices: dict[tuple[int, int], list[tuple[float, float, str]]]) -> list[str]:
    """Slices of one track either nest or follow each other: a partial overlap is drawn wrong. (Microsecond
    floats: ts + dur may exceed the next ts by 1e-10; viewers round to nanoseconds, so 1e-6 us is slack.)"""
    out = []
    for track, items in slices.items():
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start + 1e-6:
                stack.pop()
            if stack and end > stack[-1][1] + 1e-6:
                out.append(f"track {track}: {name!r} [{start}, {end}] overlaps {stack[-1][2]!r} without nesting")
            stack.append((start, end, name))
    return out


def _flows(flows: dict, slices: dict) -> list[str]:
    out = []
    enclosing = {track: _enclosing_index(items) for track, items in slices.items()}
    for key, ends in flows.items():
        if "s" not in ends or "f" not in ends:
            out.append(f"flow {key}: start and finish must both be there ({sorted(ends)})")
            continue
        if ends["f"]["ts"] < ends["s"]["ts"]:
            out.append(f"flow {key}: finishes before it starts")
        for ph in ("s", "f"):
            event = ends[ph]
            starts, reach = enclosing.get((event["pid"], event["tid"]), ([], []))
            at = bisect.bisect_right(starts, event["ts"]) - 1
            if at < 0 or reach[at] < event["ts"]:
                out.append(f"flow {key}: its {ph!r} at {event['ts']} is in no slice of track {(event['pid'], event['tid'])}")
    return out


def _enclosing_index(items: list[tuple[float, float, str]]) -> tuple[list[float], list[float]]:
    """Slices' starts in order, and the furthest end of any slice up to each: a ts is inside a slice
    when the furthest end of the slices starting at or before it reaches it."""
    ordered = sorted(items)
    starts, reach, furthest = [], [], float("-inf")
    for start, end, _ in ordered:
        furthest = max(furthest, end)
        starts.append(start)
        reach.append(furthest)
    return starts, reach
