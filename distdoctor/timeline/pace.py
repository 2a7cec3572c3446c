"""The job's pace in the picture: slow_ranks.json read without trust, for the page (data.timeline.pace) and the trace."""

# slow_ranks.json (embedded.guard.pace, schema distdoctor.slow_ranks/1) holds every rank's totals, a
# strip of per-window figures per rank, the live episodes and the run's findings. The page draws the
# strip and each slow rank's differential profile; trace.json gets, per rank, two counters over time
# (its wait per step for its peers, its step); the JSON report keeps the strip, the episodes and the
# findings whole. A malformed part is named in `lacks` and left out; nothing here raises.

from __future__ import annotations

from typing import Any, Mapping

from distdoctor.core.findings import Finding

PACE_SCHEMA = "distdoctor.slow_ranks/1"
MAX_STRIP_ROWS = 512
MAX_RANKS = 100_000


def take_pace(obj: Mapping[str, Any], material: Any) -> None:
    strip: dict[str, list[dict[str, Any]]] = {}
    raw = obj.get("strip") if isinstance(obj.get("strip"), Mapping) else {}
    for rank, rows in list(raw.items())[:MAX_RANKS]:
        if not str(rank).isdigit() or not isinstance(rows, list):
            continue
        strip[str(rank)] = [_row(r) for r in rows[:MAX_STRIP_ROWS] if isinstance(r, Mapping) and _row(r)]
    findings = [f for f in obj.get("findings") or () if isinstance(f, Mapping)] if isinstance(obj.get("findings"), list) else []
    material.pace = {"window_s": obj.get("window_s"), "heard_from": [r for r in obj.get("heard_from") or ()
                                                                    if isinstance(r, int)][:MAX_RANKS],
                     "strip": strip, "episodes": [e for e in obj.get("episodes") or () if isinstance(e, Mapping)][:1000],
                     "groups": [g for g in obj.get("groups") or () if isinstance(g, Mapping)][:64], "findings": findings[:64]}
    for raw_finding in findings[:64]:
        try:
            finding = Finding.from_dict(raw_finding)
        except (KeyError, ValueError, TypeError, AttributeError):
            material.lack("slow_ranks.json: a finding that is not one was left out")
            continue
        if not any(f.id == finding.id and f.title == finding.title for f in material.findings):
            material.findings.append(finding)
    ranks = obj.get("ranks") if isinstance(obj.get("ranks"), Mapping) else {}
    for rank, doc in list(ranks.items())[:MAX_RANKS]:
        if str(rank).isdigit() and isinstance(doc, Mapping) and isinstance(doc.get("host"), str):
            facts = material.rank(int(rank))
            facts.host = facts.host or doc["host"][:200]


def _row(row: Mapping[str, Any]) -> dict[str, Any] | None:
    values = {k: row.get(k) for k in ("t0", "t1", "wait_ms", "step_ms", "steps")}
    if not all(isinstance(values[k], (int, float)) and not isinstance(values[k], bool) for k in ("t0", "t1")):
        return None
    if values["t1"] < values["t0"]:
        return None
    out = {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out["group"] = str(row.get("group"))[:100]
    return out


def earliest(material: Any) -> float | None:
    """The earliest time the pace's strip has (epoch seconds), for the picture's origin."""
    if material.pace is None:
        return None
    times = [r["t0"] for rows in material.pace["strip"].values() for r in rows]
    return min(times) if times else None


def counters(material: Any, origin: float, pid_of: Any) -> list[dict[str, Any]]:
    """Trace Event Format counters: per rank, its wait per step for its peers and its step, window by window."""
    if material.pace is None:
        return []
    out = []
    for rank, rows in material.pace["strip"].items():
        for row in sorted(rows, key=lambda r: r["t0"]):
            args = {"waits for its peers (ms per step)": row.get("wait_ms", 0.0), "step (ms)": row.get("step_ms", 0.0)}
            out.append({"name": "pace", "ph": "C", "ts": max(0.0, round((row["t0"] - origin) * 1e6, 3)),
                        "pid": pid_of(int(rank)), "tid": 0, "args": args})
    return out
