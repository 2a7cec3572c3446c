"""A rank's pace as plain data: what it waited for its peers per group and step, where its other time went."""

# Each guarded rank publishes one document per window (schema distdoctor.pace/1, written by
# embedded.guard.pace.window); the judge reads every rank's through the job's store, which has no
# authentication, so from_doc trusts nothing: a malformed field is "not measured", never an
# exception, and every list is bounded. Windows of one rank add up (merge) into the figures over a
# span: the judge's horizon, the whole run.

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

SCHEMA = "distdoctor.pace/1"
BIN_FIRST_MS, BIN_FACTOR, BINS = 0.02, 1.8, 25
MAX_GROUPS = 32
MAX_PATHS = 64          # paths kept per rank when windows are merged (the heaviest)
MAX_FRAMES = 8
Frame4 = tuple  # (file, line, function, code): the frame's identity is its first three


@dataclass
class GroupPace:
    """A rank's waits in one group (kind: collective or p2p)."""

    group: str
    kind: str
    waited_s: float = 0.0
    regions: int = 0
    measured_regions: int = 0
    steps: int = 0
    measured_steps: int = 0
    hist: list[int] = field(default_factory=lambda: [0] * BINS)

    @property
    def wait_per_step_s(self) -> float | None:
        return self.waited_s / self.measured_steps if self.measured_steps else None


@dataclass
class PathRow:
    """One path of the user's frames (outermost first) and the time the samples gave it."""

    frames: tuple[Frame4, ...]
    n: int = 0
    s: float = 0.0
    cpu: float = 0.0
    runq: float = 0.0
    gc: int = 0
    data: int = 0
    key: tuple = field(init=False, repr=False, compare=False)  # the frames' identity (file, line, function)

    def __post_init__(self) -> None:
        self.key = tuple(f[:3] for f in self.frames)


@dataclass
class RankPace:
    """One rank over a span of windows."""

    rank: int
    host: str = ""
    t0: float | None = None
    t1: float | None = None
    wall_s: float = 0.0
    run_s: float | None = None
    runq_s: float | None = None
    blocked_s: float | None = None
    gc_s: float | None = None
    gc_n: int = 0
    gc_full: int = 0
    groups: dict[tuple[str, str], GroupPace] = field(default_factory=dict)
    paths: dict[tuple, PathRow] = field(default_factory=dict)
    samples: int = 0
    waiting: int = 0
    wait_paths: dict[tuple, int] = field(default_factory=dict)  # where the samples that waited for peers were
    profile_s: float = 0.0
    loader_s: float | None = None   # inside DataLoader next(), timed exactly (None: not timed)
    loader_n: int = 0
    gpu: bool = False
    notes: tuple[str, ...] = ()
    windows: int = 0
    final: bool = False
    last_window: int = -1


def _num(value: Any, default: float | None = 0.0) -> float | None:
    kind = type(value)  # exact types first: a judge at 4,096 ranks reads hundreds of thousands of these
    if (kind is float or kind is int) and 0 <= value < math.inf:
        return float(value)
    return default


def _count(value: Any) -> int:
    number = _num(value, 0.0)
    return int(min(number or 0.0, 1e12))


def _hist(raw: Any) -> list[int]:
    values = raw[:BINS] if type(raw) is list else []
    if not all(type(v) is int and 0 <= v < 1 << 40 for v in values):
        values = [_count(v) for v in values]
    return values + [0] * (BINS - len(values))


def _frame(raw: Any) -> Frame4 | None:
    if not isinstance(raw, list) or len(raw) < 3:
        return None
    line = raw[1] if isinstance(raw[1], int) and not isinstance(raw[1], bool) else None
    code = str(raw[3])[:120] if len(raw) > 3 and raw[3] is not None else ""
    return (str(raw[0])[:300], line, str(raw[2])[:120], code)


def _groups(raw: Any) -> dict[tuple[str, str], GroupPace]:
    out: dict[tuple[str, str], GroupPace] = {}
    for item in (raw if isinstance(raw, list) else [])[:MAX_GROUPS]:
        if not isinstance(item, Mapping) or item.get("kind") not in ("collective", "p2p"):
            continue
        group = GroupPace(str(item.get("group"))[:100], item["kind"], _num(item.get("waited_s")) or 0.0,
                          _count(item.get("regions")), _count(item.get("measured_regions")), _count(item.get("steps")),
                          _count(item.get("measured_steps")), _hist(item.get("hist")))
        out[(group.kind, group.group)] = group
    return out


def _frame_table(raw: Any) -> list[Frame4 | None]:
    """A profile's table of frames, which its paths and its waits index."""
    if not isinstance(raw, Mapping):
        return []
    return [_frame(f) for f in (raw.get("frames") if isinstance(raw.get("frames"), list) else [])[:512]]


def _paths(raw: Any, frames: list[Frame4 | None]) -> tuple[dict[tuple, PathRow], int, int, float]:
    if not isinstance(raw, Mapping):
        return {}, 0, 0, 0.0
    out: dict[tuple, PathRow] = {}
    for item in (raw.get("paths") if isinstance(raw.get("paths"), list) else [])[:MAX_PATHS]:
        if not isinstance(item, list) or len(item) < 7 or not isinstance(item[0], list):
            continue
        picked = [frames[i] for i in item[0][:MAX_FRAMES] if isinstance(i, int) and 0 <= i < len(frames)]
        if any(f is None for f in picked):
            continue
        row = PathRow(tuple(picked), _count(item[1]), _num(item[2]) or 0.0, _num(item[3]) or 0.0, _num(item[4]) or 0.0,
                      _count(item[5]), _count(item[6]))
        out[row.key] = merge_path(out[row.key], row) if row.key in out else row
    return out, _count(raw.get("samples")), _count(raw.get("waiting")), _num(raw.get("s")) or 0.0


def _wait_paths(raw: Any, frames: list[Frame4 | None]) -> dict[tuple, int]:
    """The keys (file, line, function per frame) of the paths the samples that waited for peers had -> samples."""
    if not isinstance(raw, Mapping) or not isinstance(raw.get("waits"), list):
        return {}
    out: dict[tuple, int] = {}
    for item in raw["waits"][:MAX_PATHS]:
        if not isinstance(item, list) or len(item) < 2 or not isinstance(item[0], list):
            continue
        picked = [frames[i] for i in item[0][:MAX_FRAMES] if isinstance(i, int) and 0 <= i < len(frames)]
        if picked and all(f is not None for f in picked):
            key = tuple(f[:3] for f in picked)
            out[key] = out.get(key, 0) + _count(item[1])
    return out


def _loader(raw: Any) -> tuple[float | None, int]:
    loader = raw.get("loader") if isinstance(raw, Mapping) else None
    if not isinstance(loader, Mapping):
        return None, 0
    return _num(loader.get("s"), None), _count(loader.get("calls"))


def from_doc(doc: Any) -> RankPace | None:
    """A window's document (or a merged one) as a RankPace; None when it is not one."""
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA or not isinstance(doc.get("rank"), int):
        return None
    cpu = doc.get("cpu") if isinstance(doc.get("cpu"), Mapping) else {}
    gc = doc.get("gc") if isinstance(doc.get("gc"), Mapping) else None
    profile = doc.get("profile")
    frames = _frame_table(profile)
    paths, samples, waiting, profile_s = _paths(profile, frames)
    loader_s, loader_n = _loader(profile)
    return RankPace(
        rank=doc["rank"], host=str(doc.get("host") or "")[:200], t0=_num(doc.get("t0"), None), t1=_num(doc.get("t1"), None),
        wall_s=_num(doc.get("wall_s")) or 0.0, run_s=_num(cpu.get("run_s"), None), runq_s=_num(cpu.get("runq_s"), None),
        blocked_s=_num(cpu.get("blocked_s"), None), gc_s=_num(gc.get("s"), None) if gc else None,
        gc_n=_count(gc.get("n")) if gc else 0, gc_full=_count(gc.get("full")) if gc else 0, groups=_groups(doc.get("waits")),
        paths=paths, samples=samples, waiting=waiting, wait_paths=_wait_paths(profile, frames), profile_s=profile_s,
        loader_s=loader_s, loader_n=loader_n,
        gpu=bool(doc.get("gpu")),
        notes=tuple(str(n)[:300] for n in (doc.get("notes") if isinstance(doc.get("notes"), list) else [])[:8]),
        windows=max(1, _count(doc.get("windows"))), final=bool(doc.get("final")),
        last_window=int(_count(doc.get("window"))))


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def merge_path(a: PathRow, b: PathRow) -> PathRow:
    return PathRow(a.frames, a.n + b.n, a.s + b.s, a.cpu + b.cpu, a.runq + b.runq, a.gc + b.gc, a.data + b.data)


def merge(a: RankPace, b: RankPace) -> RankPace:
    """Two spans of one rank as one (b the later)."""
    groups = dict(a.groups)  # GroupPace values are never changed in place: a sum is a new one
    for key, g in b.groups.items():
        o = groups.get(key)
        groups[key] = g if o is None else GroupPace(
            o.group, o.kind, o.waited_s + g.waited_s, o.regions + g.regions, o.measured_regions + g.measured_regions,
            o.steps + g.steps, o.measured_steps + g.measured_steps, [x + y for x, y in zip(o.hist, g.hist)])
    paths = dict(a.paths)
    for key, row in b.paths.items():
        paths[key] = merge_path(paths[key], row) if key in paths else row
    if len(paths) > MAX_PATHS:
        paths = dict(sorted(paths.items(), key=lambda kv: -kv[1].s)[:MAX_PATHS])
    waits = dict(a.wait_paths)
    for key, n in b.wait_paths.items():
        waits[key] = waits.get(key, 0) + n
    if len(waits) > MAX_PATHS:
        waits = dict(sorted(waits.items(), key=lambda kv: -kv[1])[:MAX_PATHS])
    return RankPace(
        rank=a.rank, host=b.host or a.host, t0=a.t0 if a.t0 is not None else b.t0, t1=b.t1 if b.t1 is not None else a.t1,
        wall_s=a.wall_s + b.wall_s, run_s=_add(a.run_s, b.run_s), runq_s=_add(a.runq_s, b.runq_s),
        blocked_s=_add(a.blocked_s, b.blocked_s), gc_s=_add(a.gc_s, b.gc_s), gc_n=a.gc_n + b.gc_n,
        gc_full=a.gc_full + b.gc_full, groups=groups, paths=paths, samples=a.samples + b.samples,
        waiting=a.waiting + b.waiting, wait_paths=waits, profile_s=a.profile_s + b.profile_s,
        loader_s=_add(a.loader_s, b.loader_s),
        loader_n=a.loader_n + b.loader_n, gpu=a.gpu or b.gpu,
        notes=tuple(dict.fromkeys(a.notes + b.notes))[:8], windows=a.windows + b.windows, final=b.final,
        last_window=max(a.last_window, b.last_window))


def edges_ms() -> list[float]:
    return [BIN_FIRST_MS * BIN_FACTOR ** i for i in range(BINS - 1)]


def fraction_below(hist: list[int], ms: float) -> float | None:
    """The share of steps whose wait was under ``ms`` (linear inside a bin); None without steps."""
    total = sum(hist)
    if not total:
        return None
    below, low = 0.0, 0.0
    for count, high in zip(hist, edges_ms() + [math.inf]):
        if ms >= high:
            below += count
        else:
            if math.isfinite(high) and ms > low:
                below += count * (ms - low) / (high - low)
            break
        low = high
    return below / total


def share_above_integral_ms(hist: list[int], low_ms: float, high_ms: float) -> float | None:
    """The integral of the share of waits above s, for s from low_ms to high_ms (ms x share); None without steps.

    That share is linear inside a bin (as fraction_below reads it), so the trapezoid over the bin edges in
    between is exact for it. From low to low + cap it is E[min(max(W - low, 0), cap)]; to the top, E[max(W - low, 0)].
    """
    if fraction_below(hist, low_ms) is None:
        return None
    high_ms = min(high_ms, edges_ms()[-1] * BIN_FACTOR)
    if high_ms <= low_ms:
        return 0.0
    points = [low_ms] + [e for e in edges_ms() if low_ms < e < high_ms] + [high_ms]
    above = [1.0 - (fraction_below(hist, s) or 0.0) for s in points]
    return sum((b - a) * (fa + fb) / 2 for a, b, fa, fb in zip(points, points[1:], above, above[1:]))


def quantile_ms(hist: list[int], q: float) -> float | None:
    """The q-quantile of the steps' waits in ms, linear inside its bin (bins are a factor 1.8 wide)."""
    total = sum(hist)
    if not total:
        return None
    bounds = [0.0] + edges_ms() + [edges_ms()[-1] * BIN_FACTOR]
    target, seen = q * total, 0.0
    for index, count in enumerate(hist):
        if count and seen + count >= target:
            return bounds[index] + (bounds[index + 1] - bounds[index]) * (target - seen) / count
        seen += count
    return bounds[-1]


def to_doc(pace: RankPace) -> dict[str, Any]:
    """The inverse of from_doc: a span of one rank as the document a window is (windows: how many)."""
    frames: list[list[Any]] = []
    index: dict[tuple, int] = {}

    def index_of(frame: tuple) -> int:
        """The frame's place in the table (a wait path's frames have no source line: "")."""
        if frame[:3] not in index:
            index[frame[:3]] = len(frames)
            frames.append([*frame[:3], frame[3] if len(frame) > 3 else ""])
        return index[frame[:3]]

    paths = [[[index_of(f) for f in row.frames], row.n, round(row.s, 4), round(row.cpu, 4), round(row.runq, 4), row.gc,
              row.data] for row in sorted(pace.paths.values(), key=lambda r: -r.s)]
    waits = [[[index_of(f) for f in key], n] for key, n in sorted(pace.wait_paths.items(), key=lambda kv: -kv[1])]
    cpu = None if pace.run_s is None else {"run_s": round(pace.run_s, 4), "runq_s": round(pace.runq_s or 0.0, 4),
                                           "blocked_s": round(pace.blocked_s or 0.0, 4)}
    return {"schema": SCHEMA, "rank": pace.rank, "host": pace.host, "window": pace.last_window, "windows": pace.windows,
            "final": pace.final, "t0": pace.t0, "t1": pace.t1, "wall_s": round(pace.wall_s, 4), "cpu": cpu,
            "gc": None if pace.gc_s is None else {"s": round(pace.gc_s, 4), "n": pace.gc_n, "full": pace.gc_full},
            "waits": [{"group": g.group, "kind": g.kind, "waited_s": round(g.waited_s, 5), "regions": g.regions,
                       "measured_regions": g.measured_regions, "steps": g.steps, "measured_steps": g.measured_steps,
                       "hist": g.hist} for g in pace.groups.values()],
            "profile": {"samples": pace.samples, "waiting": pace.waiting, "s": round(pace.profile_s, 4),
                        "frames": frames, "paths": paths, "waits": waits,
                        "loader": None if pace.loader_s is None else {"s": round(pace.loader_s, 4),
                                                                      "calls": pace.loader_n}},
            "gpu": pace.gpu, "notes": list(pace.notes)}
