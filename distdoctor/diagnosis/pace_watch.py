"""The job's pace followed window after window: a line when a slow rank starts and stops holding the job up, the run kept."""

# The judging rank feeds every rank's latest window document here at its own cadence. Each new
# window joins the rank's horizon (its last HORIZON windows, judged together: a verdict rests on
# seconds of steps, not one) and its run totals; a strip of per-window figures is kept for the
# picture. A slow rank is said when two judgments in a row name it, and said gone after two that
# do not (no flapping), at most MAX_LINES lines a run (the end of the run says the rest). What the
# whole run says is judged from the totals at the end.

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from distdoctor.diagnosis.pace import RankPace, from_doc, merge, to_doc
from distdoctor.diagnosis.pace_judge import Verdict, judge
from distdoctor.diagnosis.pace_where import frame_text

HORIZON = 2
CONFIRM = 2
MAX_LINES = 20
MAX_STRIP = 512
DOCUMENT_SCHEMA = "distdoctor.slow_ranks/1"


@dataclass
class Episode:
    """A span of the run during which the judge named the same slow rank(s) of a group."""

    group: str
    ranks: list[int]
    started_at: float
    ended_at: float | None = None
    worst: dict[str, Any] = field(default_factory=dict)


class Watcher:
    """Every rank's windows, judged as they come."""

    def __init__(self, world: int | None = None, window_s: float = 0.0) -> None:
        self.world, self.window_s = world, window_s
        self.recent: dict[int, deque[RankPace]] = {}
        self.totals: dict[int, RankPace] = {}
        self.strip: dict[int, list[dict[str, Any]]] = {}
        self.hits: dict[tuple, int] = {}         # (group, ranks) -> judgments in a row naming it, not yet said
        self.misses: dict[tuple, int] = {}       # ... said, and judgments in a row not naming it since
        self.open: dict[tuple, Episode] = {}
        self.episodes: list[Episode] = []
        self.lines = 0
        self.judgments = 0
        self.latest: Verdict | None = None

    def feed(self, docs: Mapping[int, Any], now: float) -> list[str]:
        """New windows in, one judgment over the horizon, the lines to say now."""
        fresh = 0
        for rank, doc in docs.items():
            if isinstance(doc, Mapping) and not doc.get("final") and isinstance(doc.get("window"), int) \
                    and doc["window"] <= self._seen(rank):
                continue  # read again before its next window: nothing new to parse
            pace = from_doc(doc)
            if pace is None or pace.rank != rank:
                continue
            if pace.final:  # the rank's own totals of its whole run: every window, none missed between two reads
                self.totals[rank] = pace
                continue
            if pace.last_window <= self._seen(rank):
                continue
            fresh += 1
            self.recent.setdefault(rank, deque(maxlen=HORIZON)).append(pace)
            self.totals[rank] = merge(self.totals[rank], pace) if rank in self.totals else pace
            self._strip(rank, pace)
        if not fresh:
            return []
        horizon = {}
        for rank, windows in self.recent.items():
            spans = list(windows)
            merged = spans[0]
            for later in spans[1:]:
                merged = merge(merged, later)
            horizon[rank] = merged
        self.latest = judge(horizon, self.world)
        self.judgments += 1
        return self._follow(self.latest, now)

    def _seen(self, rank: int) -> int:
        windows = self.recent.get(rank)
        return windows[-1].last_window if windows else -1

    def _strip(self, rank: int, pace: RankPace) -> None:
        main = max(pace.groups.values(), key=lambda g: g.steps, default=None)
        if main is None or not main.steps:
            return
        record = {"t0": pace.t0, "t1": pace.t1, "group": main.group, "steps": main.steps,
                  "step_ms": round(pace.wall_s / main.steps * 1e3, 3),
                  "wait_ms": round(main.waited_s / main.measured_steps * 1e3, 3) if main.measured_steps else None}
        rows = self.strip.setdefault(rank, [])
        rows.append(record)
        if len(rows) > MAX_STRIP:  # a week-long run: neighbours merged, the strip keeps its length
            self.strip[rank] = [_pair(rows[i], rows[i + 1]) if i + 1 < len(rows) else rows[i]
                                for i in range(0, len(rows), 2)]

    def _follow(self, verdict: Verdict, now: float) -> list[str]:
        named: dict[tuple, dict[str, Any]] = {}
        for figures in verdict.named.values():
            named.setdefault((figures["group"], tuple(figures["slow"])), figures)
        lines = []
        for key, figures in named.items():
            if key in self.open:
                self.misses.pop(key, None)
                self._worst(self.open[key], figures)
                continue
            self.hits[key] = self.hits.get(key, 0) + 1
            if self.hits[key] >= CONFIRM:
                self.hits.pop(key)
                self.open[key] = Episode(key[0], list(key[1]), now)
                self._worst(self.open[key], figures)
                lines.append(_start_line(verdict, key))
        for key in [k for k in self.hits if k not in named]:
            self.hits.pop(key)
        for key in [k for k in self.open if k not in named]:
            self.misses[key] = self.misses.get(key, 0) + 1
            if self.misses[key] >= CONFIRM:
                self.misses.pop(key)
                episode = self.open.pop(key)
                episode.ended_at = now
                self.episodes.append(episode)
                lines.append(_end_line(episode))
        return self._bounded(lines)

    def _worst(self, episode: Episode, figures: Mapping[str, Any]) -> None:
        if figures.get("cost_ms_per_step", 0) >= episode.worst.get("cost_ms_per_step", -1):
            keys = ("cost_ms_per_step", "share", "saved_ms_per_step", "speedup", "family", "line")
            episode.worst = {k: figures.get(k) for k in keys}

    def _bounded(self, lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            self.lines += 1
            if self.lines < MAX_LINES:
                out.append(line)
            elif self.lines == MAX_LINES:
                out.append("more slow-rank changes are not said live; the end of the run sums them up")
        return out

    def final(self) -> Verdict:
        """The whole run's verdict, from every rank's totals."""
        return judge(self.totals, self.world)

    def document(self, verdict: Verdict) -> dict[str, Any]:
        """slow_ranks.json: every figure of the run."""
        episodes = self.episodes + list(self.open.values())
        return {"schema": DOCUMENT_SCHEMA, "world": self.world, "window_s": self.window_s,
                "heard_from": sorted(self.totals), "judgments": self.judgments,
                "findings": [f.to_dict() for f in verdict.findings], "groups": verdict.groups,
                "episodes": [{"group": e.group, "ranks": e.ranks, "started_at": round(e.started_at, 3),
                              "ended_at": None if e.ended_at is None else round(e.ended_at, 3), **e.worst}
                             for e in episodes],
                "strip": {str(r): rows for r, rows in sorted(self.strip.items())},
                "ranks": {str(r): to_doc(p) for r, p in sorted(self.totals.items())}}


def _pair(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    steps = (a.get("steps") or 0) + (b.get("steps") or 0)

    def mean(key: str) -> float | None:
        if a.get(key) is None or b.get(key) is None or not steps:
            return a.get(key) if b.get(key) is None else b.get(key)
        return round((a[key] * a["steps"] + b[key] * b["steps"]) / steps, 3)

    return {"t0": a.get("t0"), "t1": b.get("t1"), "group": a.get("group"), "steps": steps,
            "step_ms": mean("step_ms"), "wait_ms": mean("wait_ms")}


def _start_line(verdict: Verdict, key: tuple) -> str:
    finding = next(f for f in verdict.findings if f.data.get("slow") == list(key[1]) and f.data.get("group") == key[0])
    rows = finding.data.get("rows") or []
    where = f"; +{rows[0]['extra_ms']:.1f} ms per step at {frame_text(tuple(rows[0]['frame']))}" if rows else ""
    return (f"slow rank: {finding.title}; it arrives last at {finding.data.get('last_share', 0):.0%} of steps{where}; "
            f"why: {finding.data.get('family')}")


def _end_line(episode: Episode) -> str:
    who = f"rank {episode.ranks[0]}" if len(episode.ranks) == 1 else f"ranks {', '.join(map(str, episode.ranks[:8]))}"
    lasted = (episode.ended_at or episode.started_at) - episode.started_at
    return (f"{who} no longer {'makes' if len(episode.ranks) == 1 else 'make'} the others wait (said {lasted:.0f} s ago; "
            f"at worst {episode.worst.get('cost_ms_per_step', 0):.1f} ms per step)")
