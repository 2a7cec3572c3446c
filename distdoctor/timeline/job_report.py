"""A guarded run's evidence as one Report: the guard's findings, and in data.timeline what the pictures draw."""

# data.timeline (plain data; core.html draws it): the run's origin (epoch seconds) and length, every
# rank's host, the stalls (start in seconds since the origin, length, late and waiting ranks, line,
# verdict), the summary of the stalls stalls.json folded, the faults (a raise, an exit, a kill), the
# collectives drawn per rank, the job's pace (slow_ranks.json: timeline.pace) and what the evidence lacks.
# The JSON of this report is complete; the HTML bounds what it draws (docs/report.md).

from __future__ import annotations

from typing import Any

from distdoctor.core.redact import scrub
from distdoctor.core.report import Report, WorldSummary, build_report
from distdoctor.timeline.collectives import Span
from distdoctor.timeline.material import Material
from distdoctor.timeline.trace import collective_spans, origin_s

SCHEMA = "distdoctor.timeline/1"


def job_report(material: Material, collectives: dict[int, list[Span]] | None = None) -> Report:
    """The run as a Report; `collectives` as build_trace drew them (computed again when not given)."""
    collectives = collective_spans(material) if collectives is None else collectives
    origin = origin_s(material, collectives)
    ranks = sorted(set(material.ranks) | set(collectives))
    world = material.world_size or (max(ranks) + 1 if ranks else None)
    stalls = [_stall(s, origin) for s in sorted(material.stalls, key=lambda s: s["start"])]
    ends = [s["start_s"] + (s["seconds"] or 0.0) for s in stalls]
    ends += [items[-1].end_ns / 1e9 - origin for items in collectives.values() if items]
    ends += [f.time - origin for f in material.faults]
    if material.pace is not None:  # the job's pace: its strip's last window
        ends += [r["t1"] - origin for rows in material.pace["strip"].values() for r in rows]
    length = max(ends, default=0.0)
    for stall in stalls:  # an episode still open at the end of the record lasts until then
        if stall["seconds"] is None:
            stall["open_s"] = round(max(0.0, length - stall["start_s"]), 3)
    timeline: dict[str, Any] = {
        "schema": SCHEMA, "origin_epoch_s": round(origin, 3), "length_s": round(length, 3), "world_size": world,
        "hosts": {str(r): material.ranks[r].host for r in ranks if r in material.ranks and material.ranks[r].host},
        "stalls": stalls, "omitted": material.omitted,
        "faults": [{"rank": f.rank, "kind": f.kind, "at_s": round(f.time - origin, 3), "text": f.text}
                   for f in sorted(material.faults, key=lambda f: f.time)],
        "collectives": {str(r): len(v) for r, v in collectives.items()},
        "activity": _activity(collectives, origin, length),
        "lacks": list(material.lacks),
    }
    if material.pace is not None:
        timeline["pace"] = material.pace
    report = build_report(material.findings, [{"name": "timeline", "stage": "collective", "status": "pass",
                                               "duration_s": 0.0}],
                          world=WorldSummary(size=world, launcher="guard", ranks_reported=tuple(ranks)),
                          duration_s=length)
    report.data = {"timeline": scrub(timeline, [])}  # lines of code and titles: secrets out, as in the findings
    return report


def _stall(stall: dict[str, Any], origin: float) -> dict[str, Any]:
    return {"episode": stall["episode"], "start_s": round(stall["start"] - origin, 3), "seconds": stall["seconds"],
            "late": stall["late"], "waiting": stall["waiting"], "where": stall["where"], "call": stall.get("call"),
            "op": stall["op"],
            "seq": stall["seq"], "group": stall["group"], "verdict": stall["verdict"], "cause": stall["cause"],
            "title": stall["title"], "action": stall["action"]}


ACTIVITY_BUCKETS = 240
ACTIVITY_RANKS = 32   # per rank while the timeline has a lane per rank; beyond, all ranks summed only


def _activity(collectives: dict[int, list[Any]], origin: float, length: float) -> dict[str, Any]:
    """Collectives enqueued per slice of the record (ACTIVITY_BUCKETS of them): per rank, and all summed."""
    total = [0] * ACTIVITY_BUCKETS
    per_rank: dict[str, list[int]] = {}
    width = (length or 1.0) / ACTIVITY_BUCKETS
    for rank, items in collectives.items():
        counts = [0] * ACTIVITY_BUCKETS
        for span in items:
            at = int((span.start_ns / 1e9 - origin) / width)
            counts[min(max(at, 0), ACTIVITY_BUCKETS - 1)] += 1
        total = [a + b for a, b in zip(total, counts)]
        if len(collectives) <= ACTIVITY_RANKS:
            per_rank[str(rank)] = counts
    return {"buckets": ACTIVITY_BUCKETS, "all": total, "per_rank": per_rank} if collectives else {}
