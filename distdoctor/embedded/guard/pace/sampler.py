"""Where the main thread spends the time it does not wait for peers: its stack sampled, the time between samples weighed."""

# Every sample (about every 100 ms, jittered so it never beats with the step) reads the main thread's
# frames and keeps the path of the user's frames, outermost first (at most MAX_DEPTH): the differential
# profile compares these paths between a slow rank and its peers, and the call where they part is the
# one a user recognises (diagnosis.pace_where). The time since the previous sample is given to the
# path, split as the scheduler counts it: on a CPU, runnable (contention), blocked. A sample inside a
# region (regions.Regions) while the thread sleeps is a wait for peers and is only counted. Each sample
# notes whether it fell inside a garbage collection and whether a DataLoader frame is on the stack.
# Samples taken while the main thread is inside a DataLoader's next() are a stratum of their own: the
# document gives their paths the time the loader clock measured exactly (pace.loader), in proportion to
# their sampled time. The paths of the samples that waited for peers are counted too: the frames the
# waits are under enclose the step (a `main()`, a `train_step()`), which the differential profile opens,
# and a call that holds no wait (`next(loader)`) is a call of the step, named as such however much of the
# time it takes. About 40 us a sample (frames, two pread()s); on a loaded machine the GIL's
# hand-over to and from this thread costs the training thread more than that: 20 samples a second cost
# the DDP tutorial's step about 2 %, 5 a second 1 % (benchmarks/bench_pace.py), hence 10.

from __future__ import annotations

import linecache
import sys
import time
from typing import Any

from distdoctor.diagnosis.frames import display_path, is_user_file

MAX_DEPTH = 8
MAX_FRAMES_WALKED = 512
DATA_MARK = "/torch/utils/data/"
TOP_PATHS = 8
CODE_CHARS = 72
# A path's figures: samples, wall ns, on-CPU ns, runnable ns, samples in a GC, samples under a DataLoader.
N, WALL, RUN, RUNQ, GC, DATA = range(6)
# A path's stratum: sampled outside a DataLoader's next(), sampled inside one, timed exactly (a long collection).
OUTSIDE, INSIDE, EXACT = range(3)


class Profile:
    """One window's samples; ``loader``: (ns, calls) inside DataLoader next() over the window, timed exactly."""

    def __init__(self) -> None:
        self.strata: dict[tuple[tuple, int], list[int]] = {}
        self.samples = self.waiting = 0
        self.waits: dict[tuple, int] = {}   # the paths of the samples that waited for peers -> samples
        self.loader: tuple[int, int] | None = None

    @property
    def paths(self) -> dict[tuple, list[int]]:
        """Each path's figures, its strata added; the inside stratum at the time the loader clock measured."""
        scale = self._inside_scale()
        out: dict[tuple, list[int]] = {}
        for (path, stratum), row in self.strata.items():
            acc = out.setdefault(path, [0] * 6)
            factor = scale if stratum == INSIDE else 1.0
            for i, value in enumerate(row):
                acc[i] += round(value * factor) if i in (WALL, RUN, RUNQ) else value
        return out

    def _inside_sampled_ns(self) -> int:
        return sum(row[WALL] for (_, stratum), row in self.strata.items() if stratum == INSIDE)

    def _inside_scale(self) -> float:
        sampled = self._inside_sampled_ns()
        return self.loader[0] / sampled if self.loader is not None and sampled > 0 else 1.0

    def add(self, path: tuple, wall: int, run: int, runq: int, in_gc: bool, data: bool, stratum: int = OUTSIDE) -> None:
        row = self.strata.get((path, stratum))
        if row is None:
            row = self.strata[(path, stratum)] = [0, 0, 0, 0, 0, 0]
        row[N] += 1
        row[WALL] += wall
        row[RUN] += run
        row[RUNQ] += runq
        row[GC] += in_gc
        row[DATA] += data
        self.samples += 1

    def document(self, top: int = TOP_PATHS) -> dict[str, Any]:
        """The heaviest paths as plain data: a table of frames (each with its source line), paths as indices."""
        ordered = sorted(self.paths.items(), key=lambda kv: -kv[1][WALL])
        total = sum(row[WALL] for _, row in ordered)
        frames: list[list[Any]] = []
        index: dict[tuple, int] = {}

        def ids_of(path: tuple) -> list[int]:
            ids = []
            for frame in path:
                if frame not in index:
                    index[frame] = len(frames)
                    code = linecache.getline(frame[0], frame[1]).strip()[:CODE_CHARS] if frame[1] else ""
                    frames.append([display_path(frame[0]), frame[1], frame[2], code])
                ids.append(index[frame])
            return ids

        paths = [[ids_of(path), row[N], round(row[WALL] / 1e9, 4), round(row[RUN] / 1e9, 4), round(row[RUNQ] / 1e9, 4),
                  row[GC], row[DATA]] for path, row in ordered[:top]]
        waits = [[ids_of(path), n] for path, n in sorted(self.waits.items(), key=lambda kv: -kv[1])[:top]]
        rest = [sum(row[i] for _, row in ordered[top:]) for i in range(6)]
        loader = None if self.loader is None else {"s": round(self.loader[0] / 1e9, 4), "calls": self.loader[1],
                                                   "sampled_s": round(self._inside_sampled_ns() / 1e9, 4)}
        return {"samples": self.samples, "waiting": self.waiting, "s": round(total / 1e9, 4), "frames": frames,
                "paths": paths, "waits": waits, "rest": [rest[N], round(rest[WALL] / 1e9, 4), round(rest[RUN] / 1e9, 4),
                                         round(rest[RUNQ] / 1e9, 4), rest[GC], rest[DATA]], "loader": loader}


class Sampler:
    """Samples one thread's stack into the current Profile."""

    def __init__(self, ident: int | None, sched: Any, regions: Any, gcwatch: Any, loader: Any = None) -> None:
        self.ident, self.sched, self.regions, self.gcwatch, self.loader = ident, sched, regions, gcwatch, loader
        self.profile = Profile()
        self._files: dict[str, bool] = {}
        self._last: tuple[int, Any] | None = None
        self._gc_seen = 0
        self.collections: list[tuple[list, int]] = []   # long collections not yet filed (collected)
        if gcwatch is not None:
            gcwatch.on_long = self.collected

    def take(self) -> Profile:
        self._file_collections()
        taken, self.profile = self.profile, Profile()
        if self.loader is not None:
            taken.loader = self.loader.take()
        return taken

    def sample(self) -> None:
        if self.gcwatch is not None and self.gcwatch.active:
            return  # inside a collection (its callbacks let this thread in): it gets its own line, whole
        after_collection = bool(self.collections)
        self._file_collections()
        inside = self.loader is not None and self.loader.depth > 0  # read microseconds before the frames
        frame = sys._current_frames().get(self.ident or 0)
        now, times = time.perf_counter_ns(), self.sched.times() if self.sched is not None else None
        last, self._last = self._last, (now, times)
        collected = 0
        if self.gcwatch is not None:  # the collections since the last sample have their own lines (collected)
            collected, self._gc_seen = self.gcwatch.total_ns - self._gc_seen, self.gcwatch.total_ns
        if frame is None or last is None:
            return
        if self.regions is not None and self.regions.depth > 0 and self.sched is not None \
                and self.sched.state() in ("S", "D"):
            self.profile.waiting += 1  # waiting for peers: the regions measure it exactly; where, counted
            path, _ = self._path(_raw(frame))
            self.profile.waits[path] = self.profile.waits.get(path, 0) + 1
            return
        if after_collection:
            # A long collection held the GIL: this sample ran when the main thread next let go of it, already on
            # a line after the collection, at a moment the collection set. The interval's time is on no one line
            # (before the collection, and after it up to the switch interval): placed on this one, it made the
            # line after every collection look slow on the collecting rank only. The collection has its own line.
            return
        path, data = self._path(_raw(frame))
        wall = max(0, now - last[0] - collected)
        run = runq = 0
        if times is not None and last[1] is not None:
            run = max(0, times.run_ns - last[1].run_ns - collected)
            runq = max(0, times.runq_ns - last[1].runq_ns)
        self.profile.add(path, wall, min(run, wall), min(runq, wall), False, data, INSIDE if inside else OUTSIDE)

    def collected(self, frame: Any, ns: int) -> None:
        """A long collection of the main thread, for the line that triggered it. Called inside the collection,
        maybe in the middle of an import: it only copies the frames' names (anything that could import here
        would break the import it interrupts), and the sampler's thread files it at its next sample."""
        self.collections.append((_raw(frame), ns))

    def _file_collections(self) -> None:
        while self.collections:
            raw, ns = self.collections.pop(0)
            path, data = self._path(raw)
            self.profile.add(path, ns, ns, 0, True, data, EXACT)

    def _path(self, raw: list[tuple[str, int, str]]) -> tuple[tuple, bool]:
        """The user's frames outermost first (at most MAX_DEPTH), and whether a DataLoader frame is on the stack."""
        mine: list[tuple[str, int, str]] = []
        data = False
        for frame in raw:
            path = frame[0]
            user = self._files.get(path)
            if user is None:
                user = self._files[path] = is_user_file(path)
            if user:
                mine.append(frame)
            elif not data and DATA_MARK in path:
                data = True
        mine.reverse()
        return tuple(mine[:MAX_DEPTH]), data


def _raw(frame: Any) -> list[tuple[str, int, str]]:
    """A stack's (file, line, function), innermost first: attribute reads only."""
    out = []
    while frame is not None and len(out) < MAX_FRAMES_WALKED:
        code = frame.f_code
        out.append((code.co_filename, frame.f_lineno, code.co_name))
        frame = frame.f_back
    return out
