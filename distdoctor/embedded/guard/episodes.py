"""Every stall as an episode: opened past hang_timeout, re-reported when it changes, closed when it clears."""

# An episode belongs to the rank that saw the stall first (its owner): it collected the snapshots,
# rendered the report, and watches its own stall until it clears. Its record (the objects of
# stalls.json) lives in the job's store so that any rank can read every episode: rank 0 says at
# the end of the run how many there were, how long ranks waited in all and the longest, with its
# rank and line. A week-long job may have thousands: the first MAX_KEPT are kept whole, the rest
# are folded into one summary (how many, how long in all, the longest). Without a cross-rank
# channel (a FileStore) each rank keeps its own.

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from distdoctor.core.findings import Finding
from distdoctor.diagnosis.snapshot import Frame
from distdoctor.embedded.guard.stall import Stall

MAX_KEPT = 200
STALLS_FILE = "stalls.json"


@dataclass
class Episode:
    """One stall past hang_timeout, as its owner knows it."""

    id: int
    owner: int
    stall: Stall
    started_at: float                      # epoch seconds the stall began
    started_s: float                       # seconds since the owner's guard started
    findings: list[Finding] = field(default_factory=list)
    action: str = ""
    deadline_at: float | None = None       # epoch seconds the guard ends it (the group's timeout), when watched
    seconds: float | None = None           # its duration once closed
    reports: int = 1
    last_look: float = 0.0                 # time.monotonic of the last look at every rank
    ended_run: bool = False                # torch's timeout ended its collective, or the run ended with it open

    @property
    def identity(self) -> tuple:
        """What the stall is: the first finding and the ranks it names (a change is re-reported)."""
        first = self.findings[0] if self.findings else None
        return (first.id, tuple(first.ranks)) if first is not None else ()

    def facts(self) -> dict[str, Any]:
        return facts(self.findings)

    def record(self) -> dict[str, Any]:
        """The object stalls.json holds for this episode."""
        first = self.findings[0] if self.findings else None
        known = self.facts()
        late = known["late"]
        return {
            "episode": self.id, "late_rank": late[0] if len(late) == 1 else late, "waiting_ranks": known["waiting"],
            "where": known["where"], "call": known["call"], "op": known["op"], "seq": known["seq"],
            "group": known["group"],
            "started_s": round(self.started_s, 3), "started_at": round(self.started_at, 3),
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "verdict": first.id if first else None, "cause": first.cause if first else None,
            # A stall the guard watched and that cleared is a warning; one that ended the job (the guard,
            # torch's timeout) or was still open when the run ended is an error (policy.shown).
            "severity": "error" if self.action == "end" or self.ended_run else "warning",
            "title": first.title if first else None, "action": self.action, "reports": self.reports,
            "reported_by": self.owner,
        }


def facts(findings: list[Finding]) -> dict[str, Any]:
    """Who is late, who waits, where and in what, from the first finding of a verdict."""
    if not findings:
        return {"late": [], "waiting": [], "where": None, "call": None, "op": None, "seq": None, "group": None}
    first = findings[0]
    data = first.data or {}
    late = [r for r in (data.get("late") or data.get("missing") or data.get("left") or
                        ([data["first_rank"]] if data.get("first_rank") is not None else list(first.ranks)))
            if isinstance(r, int)]
    waiting = [r for r in data.get("waiting") or () if isinstance(r, int)]
    snapshots = data.get("snapshots") or ()
    return {"late": late, "waiting": waiting, "where": _where(snapshots, late[0] if late else None),
            "call": _call(snapshots, late[0] if late else None, waiting[0] if waiting else None),
            "op": data.get("op"), "seq": data.get("seq"), "group": data.get("group")}


def _call(snapshots: Iterable[Any], late: int | None, waiting: int | None) -> str | None:
    """The late rank's call where its stack parts from a waiting rank's (diagnosis.pace_where): one row of the
    straggler profile per call, whatever line inside it each look caught."""
    from distdoctor.diagnosis.pace_where import parting_frame  # the pace's code loads only once a stall is told

    stacks = {s.get("rank"): s.get("stack") for s in snapshots if isinstance(s, dict)}
    if late is None or waiting is None or not isinstance(stacks.get(late), list):
        return None
    frames = [[Frame(str(f.get("file")), f.get("line"), str(f.get("function") or ""), str(f.get("code") or ""))
               for f in stacks.get(rank) or () if isinstance(f, dict)] for rank in (late, waiting)]
    found = parting_frame(frames[0], frames[1])
    if found is None:
        return None
    return f"{found.file}:{found.line}" + (f" `{found.code}`" if found.code else f" in {found.function}")


def _where(snapshots: Iterable[Any], rank: int | None) -> str | None:
    for snap in snapshots:
        if isinstance(snap, dict) and snap.get("rank") == rank:
            where = (snap.get("error") or {}).get("frame") or snap.get("where")
            if isinstance(where, dict) and where.get("file"):
                return f"{where['file']}:{where['line']}" if where.get("line") is not None else str(where["file"])
    return None


class Ledger:
    """The job's episodes: in the store (every rank reads them) or, without one, in this process."""

    def __init__(self, side: Any = None) -> None:
        self.side = side
        self.local: dict[int, dict[str, Any]] = {}
        self.local_omitted: dict[str, Any] | None = None
        self.local_count = 0

    def new_id(self) -> int:
        if self.side is not None:
            return self.side.count(self.side.key("episodes"))
        self.local_count += 1
        return self.local_count

    def keep(self, episode: Episode) -> None:
        record = episode.record()
        if episode.id <= MAX_KEPT:
            if self.side is not None:
                self.side.put(self.side.key("episode", episode.id), record)
            else:
                self.local[episode.id] = record
        elif episode.seconds is not None:
            self._fold(record)

    def _fold(self, record: dict[str, Any]) -> None:
        """An episode past the first MAX_KEPT, closed: into the summary of the rest."""
        if self.side is None:
            self.local_omitted = folded(self.local_omitted, record)
            return
        key = self.side.key("omitted")
        for _ in range(8):  # compare_set: ranks that close episodes at once do not lose one
            old = self.side.talk.get(key).decode() if self.side.there(key) else ""
            new = json.dumps(folded(json.loads(old) if old else None, record))
            got = self.side.talk.compare_set(key, old, new)
            if (got.decode() if isinstance(got, bytes) else str(got)) == new:
                return

    def read(self) -> tuple[list[dict[str, Any]], dict[str, Any] | None, int]:
        """(the records kept, the summary of the rest or None, how many episodes in all)."""
        if self.side is None:
            return [self.local[k] for k in sorted(self.local)], self.local_omitted, self.local_count
        side = self.side
        total = side.count(side.key("episodes"), 0)
        kept = list(range(1, min(total, MAX_KEPT) + 1))
        records = [r for r in side.read_many("episode", kept).values() if isinstance(r, dict)]
        omitted = side.get(side.key("omitted")) if total > MAX_KEPT and side.there(side.key("omitted")) else None
        return sorted(records, key=lambda r: r.get("episode", 0)), omitted, total


def folded(summary: dict[str, Any] | None, record: dict[str, Any]) -> dict[str, Any]:
    out = dict(summary or {"omitted": 0, "seconds": 0.0, "longest": None})
    out["omitted"] += 1
    out["seconds"] = round(out["seconds"] + (record.get("seconds") or 0.0), 3)
    longest = out.get("longest")
    if longest is None or (record.get("seconds") or 0) > (longest.get("seconds") or 0):
        out["longest"] = {k: record.get(k) for k in ("episode", "seconds", "late_rank", "where", "op", "seq", "verdict")}
    return out


def stalls_document(records: list[dict[str, Any]], omitted: dict[str, Any] | None, total: int) -> list[dict[str, Any]]:
    """stalls.json: one object per episode; past MAX_KEPT, a last object summarizing the rest."""
    out = list(records)
    if total > len(records):
        rest = dict(omitted or {"omitted": 0, "seconds": 0.0, "longest": None})
        rest["omitted"] = total - len(records)
        rest["note"] = (f"episodes after the first {MAX_KEPT} are summarized here: how many, their seconds in all "
                        "(closed ones), the longest")
        out.append(rest)
    return out


def summary_line(records: list[dict[str, Any]], omitted: dict[str, Any] | None, total: int) -> str | None:
    """'3 stalls past the hang timeout, 21.3 s waited in all; the longest 12.1 s: rank 1 at train.py:13'."""
    if total <= 0:
        return None
    closed = [r for r in records if r.get("seconds") is not None]
    seconds = sum(r["seconds"] for r in closed) + float((omitted or {}).get("seconds") or 0.0)
    candidates = closed + ([omitted["longest"]] if omitted and omitted.get("longest") else [])
    open_now = sum(1 for r in records if r.get("seconds") is None)
    text = f"{total} stall{'s' if total != 1 else ''} past the hang timeout in this run, {seconds:.1f} s waited in all"
    if candidates:
        top = max(candidates, key=lambda r: r.get("seconds") or 0)
        late = top.get("late_rank")
        who = f"rank {late}" if isinstance(late, int) else f"ranks {', '.join(map(str, late or ()))}" if late else "?"
        op = f" in {top['op']}" + (f" #{top['seq']}" if top.get("seq") is not None else "") if top.get("op") else ""
        text += f"; the longest {top['seconds']:.1f} s: {who}" + (f" at {top['where']}" if top.get("where") else "") + op
    if open_now:
        text += f"; {open_now} still open as this rank ends (an error: the run ended with {'it' if open_now == 1 else 'them'} open)"
    return text
