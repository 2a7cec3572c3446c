"""Every rank of a job read again and again, in parallel and bounded: each rank's reads over time."""

# One read of a rank is /proc's clock and state (its main thread's CPU time and kernel state) and
# then one py-spy dump. Ranks are read independently — a rank whose py-spy is slow does not hold
# the others' reads back — by a bounded pool of threads (each runs one py-spy at a time), each
# rank at most once per interval. With --native only a rank's first read is native (py-spy must
# symbolise libtorch: seconds per dump); what it found is carried to later reads that find the
# thread at the same place without having run since. A rank that ended is not read again; a PID
# that another process took over ends its rank.

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Deque, Sequence

from distdoctor.diagnosis.progress import CPU_FLOOR_S
from distdoctor.diagnosis.snapshot import EXITED, KILLED, UNKNOWN
from distdoctor.stacks import pyspy
from distdoctor.stacks.collective import DDP_TYPES, read_wait
from distdoctor.stacks.sources import source_names_ddp
from distdoctor.stacks.proc_state import ProcState, uses_gpu
from distdoctor.stacks.procs import RankProcess
from distdoctor.stacks.snapshots import Facts, RankView, Read, build, python_frames, read_rank, still_read

MAX_PARALLEL = 16       # py-spy processes at once (64 ranks: four rounds)
MAX_INFLIGHT = 1        # reads of one rank running at once (2 was measured slower on a loaded node)
KEPT_READS = 64         # reads kept per rank (a --watch runs for hours)
VIEWED_READS = 16       # the latest of them turned into snapshots (a verdict's window is shorter)


@dataclass
class Track:
    """One rank's reads so far, oldest first."""

    proc: RankProcess
    reads: Deque[Read] = field(default_factory=lambda: deque(maxlen=KEPT_READS))
    started: int | None = None         # its process's start time at the first read
    gpu: bool = False
    inflight: int = 0                  # its reads running now
    started_reads: int = 0             # its reads started so far
    native_running: bool = False       # its native read (the first, with --native) is still running
    last_start: float = float("-inf")  # when its last read was started (monotonic clock)
    failures: int = 0                  # reads whose stack could not be read
    last_failure: str = ""

    @property
    def knows_model(self) -> bool:
        """A read already found its model's wrapper type (later reads need not read variables)."""
        return any(r.main is not None and r.main.wrappers for r in self.reads)

    @property
    def ended(self) -> bool:
        return bool(self.reads) and self.reads[-1].state.status in (EXITED, KILLED)

    def add(self, read: Read) -> None:
        if self.started is None and read.clock.start is not None:
            self.started = read.clock.start
            self.gpu = bool(uses_gpu(self.proc.pid))
        if read.main is None and read.state.status not in (EXITED, KILLED) and read.dump.problem != pyspy.GONE:
            self.failures += 1
            self.last_failure = read.dump.message
        self.reads.append(read)
        if len(self.reads) > 1 and read.time is not None and (self.reads[-2].time or 0) > read.time:
            ordered = sorted(self.reads, key=lambda r: r.time or 0.0)  # two reads overlapped: keep time order
            self.reads.clear()
            self.reads.extend(ordered)

    def views(self, host: str, last: int = VIEWED_READS) -> list[RankView]:
        """The last reads as RankViews, judged with what all the reads know (the model is DDP, a
        native read's finding still holds)."""
        reads = list(self.reads)
        ddp: bool | str = any(r.main is not None and any(t in r.main.wrappers for t in DDP_TYPES) for r in reads)
        if not ddp and not self.knows_model:
            ddp = source_names_ddp(reads)
        anchor = next((r for r in reads if r.native and r.main is not None), None)
        out = []
        for read in reads[-last:]:
            carried = None
            if anchor is not None and read is not anchor and _unmoved(anchor, read):
                carried = read_wait(anchor.main, native=True, ddp=ddp, gpu=self.gpu, others=anchor.dump.threads)
            out.append(build(read, Facts(ddp, self.gpu, carried), host=host))
        return [self._noted(v) for v in out]

    def _noted(self, view: RankView) -> RankView:
        """A readable view says how many reads of this rank failed (they are not evidence)."""
        if not self.failures or view.snapshot.status == UNKNOWN:
            return view
        from dataclasses import replace

        note = f"py-spy failed on {self.failures} of {len(self.reads)} reads of it: {self.last_failure}"[:300]
        return replace(view, snapshot=replace(view.snapshot, notes=(*view.snapshot.notes, note)))

    def due(self, now: float, interval_s: float) -> bool:
        """Not ended, interval_s past the start of its last read, and fewer than MAX_INFLIGHT of
        its reads running — one more while its native read runs (symbolising libtorch takes
        seconds: the plain reads go on beside it)."""
        limit = MAX_INFLIGHT + (1 if self.native_running else 0)
        return not self.ended and self.inflight < limit and now - self.last_start >= interval_s


def _unmoved(anchor: Read, later: Read) -> bool:
    """The thread did not run between the two reads and is at the same Python place."""
    a, b = anchor.clock.cpu_s, later.clock.cpu_s
    if a is None or b is None or b - a >= CPU_FLOOR_S or later.main is None:
        return False
    key = lambda r: tuple((f.file, f.line, f.function) for f in python_frames(r.main, r.cwd))  # noqa: E731
    return key(anchor) == key(later)


class Sampler:
    """Reads of many ranks, scheduled: each rank at most once per interval, MAX_PARALLEL at once."""

    def __init__(self, ranks: Sequence[RankProcess], *, native: bool, pyspy_path: str, host: str,
                 dump_timeout_s: float, interval_s: float) -> None:
        self.tracks = [Track(r) for r in ranks]
        self.native, self.pyspy_path, self.host = native, pyspy_path, host
        self.dump_timeout_s, self.interval_s = dump_timeout_s, interval_s
        # As many threads as ranks, up to MAX_PARALLEL (a watch adds ranks later: MAX_PARALLEL).
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(ranks) * MAX_INFLIGHT or MAX_PARALLEL)),
                                        thread_name_prefix="distdoctor-pyspy")
        self._running: dict[Future, Track] = {}
        self._native: set[Future] = set()       # the native reads still running

    def add(self, ranks: Sequence[RankProcess]) -> None:
        """Read these ranks too, from the next step on."""
        self.tracks += [Track(r) for r in ranks]

    def _read(self, track: Track, timeout_s: float, first: bool, beside_native: bool) -> Read:
        try:
            previous = track.reads[-1] if track.reads else None
            if previous is not None and not first:
                still = still_read(track.proc, previous)  # its main thread did not run: no py-spy needed
                if still is not None:
                    return still
            return read_rank(track.proc, native=self.native and first, pyspy_path=self.pyspy_path,
                             timeout_s=timeout_s, started=track.started, local_types=not track.knows_model,
                             beside_native=beside_native)
        except Exception as exc:  # one rank's surprise must not cost the others' report
            dump = pyspy.Dump(problem=pyspy.FAILED, message=f"{type(exc).__name__}: {exc}"[:300])
            return Read(track.proc, dump, ProcState(UNKNOWN), time=time.time())

    def _start_due(self, deadline: float | None, wanted: Callable[[Track], bool] | None) -> None:
        now = time.monotonic()
        left = self.dump_timeout_s if deadline is None else min(self.dump_timeout_s, deadline - now)
        if left <= 0.05:
            return
        for track in self.tracks:
            if track.due(now, self.interval_s) and (wanted is None or wanted(track)):
                track.inflight, track.last_start = track.inflight + 1, now
                track.started_reads += 1
                first = track.started_reads == 1
                future = self._pool.submit(self._read, track, left, first, track.native_running)
                self._running[future] = track
                if first and self.native:
                    track.native_running = True
                    self._native.add(future)

    def step(self, until: float, deadline: float | None = None, wanted: Callable[[Track], bool] | None = None) -> int:
        """Start the reads that are due (of the tracks wanted), then wait until one ends or
        `until` (monotonic); returns how many reads ended."""
        self._start_due(deadline, wanted)
        if not self._running:
            time.sleep(max(0.0, min(until, self._next_due()) - time.monotonic()))
            return 0
        done, _ = wait(list(self._running), timeout=max(0.0, until - time.monotonic()), return_when=FIRST_COMPLETED)
        for future in done:
            track = self._running.pop(future)
            track.inflight -= 1
            if future in self._native:
                self._native.discard(future)
                track.native_running = False
            track.add(future.result())
        return len(done)

    def _next_due(self) -> float:
        """When the next read is due (monotonic clock)."""
        starts = [t.last_start + self.interval_s for t in self.tracks if not t.ended and t.inflight < MAX_INFLIGHT]
        return min(starts) if starts else float("inf")

    def settle(self, limit_s: float) -> None:
        """Let the reads still running end (each is bounded by its own timeout), at most limit_s."""
        end = time.monotonic() + limit_s
        while self._running and time.monotonic() < end:
            self.step(end, deadline=0.0)

    def never_read(self, why: str) -> None:
        """A rank with no read at all (its only read is still running) gets a failed one saying why."""
        for track in self.tracks:
            if not track.reads:
                track.add(Read(track.proc, pyspy.Dump(problem=pyspy.FAILED, message=why), ProcState(UNKNOWN),
                               time=time.time()))

    @property
    def idle(self) -> bool:
        return not self._running and all(t.ended for t in self.tracks)

    def close(self) -> None:
        """No new reads, and the py-spy processes still running ended (by PID): a decided look
        does not wait for a slow dump."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        pyspy.end_running()
