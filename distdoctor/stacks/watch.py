"""`distdoctor stacks --watch`: a running job read again and again, one row per rank, the verdict as it forms and clears."""

# Each refresh is data (a Screen: one Row per rank, each job's verdict); stacks.watch_view renders
# it and the CLI draws it. The reads are the one-shot look's (stacks.sampling: /proc's clock and a
# py-spy dump per rank, parallel and bounded), kept per rank; the verdict is the shared diagnosis'
# over each rank's latest reads (diagnosis.progress over stacks.job's view), so what --watch
# highlights is what `distdoctor stacks` would say at that moment. The node is scanned again every
# few seconds: a rank that torchrun restarts is a new process (a new row replaces the old one).

from __future__ import annotations

import signal
import socket
import time
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from distdoctor.core.findings import Finding, Severity
from distdoctor.core.report import Report
from distdoctor.diagnosis import progress
from distdoctor.diagnosis.snapshot import EXITED, KILLED, UNKNOWN, RankSnapshot
from distdoctor.stacks import pyspy
from distdoctor.stacks.job import JobView, verdict
from distdoctor.stacks.look import SPAN_S, settled, assemble, job_view
from distdoctor.stacks.procs import Discovery, RankProcess, discover
from distdoctor.stacks.sampling import Sampler, Track

RESCAN_S = 5.0          # how often the node is scanned again for the job's processes
_COMPUTING_PCT = 5.0    # CPU % of a core above which a rank that moved is "computing"


@dataclass(frozen=True)
class Row:
    """One rank as the live view shows it."""

    job: str
    rank: int
    host: str
    pid: int | None
    state: str                  # computing / in `all_reduce` for 12 s / idle for 3 s / exited 1 / ...
    kind: str                   # the state without its seconds, "moving" while it moves (what a change is)
    cpu_pct: float | None       # its process's CPU use between its last two reads, % of one core
    where: str                  # the innermost line of the user's code (or the innermost frame)
    flag: str = ""              # the severity of the verdict naming this rank: error / warning / ""


@dataclass(frozen=True)
class Screen:
    """One refresh: the rows, each job's verdict findings, and what was read so far."""

    time: float
    rows: tuple[Row, ...]
    verdicts: Mapping[str, tuple[Finding, ...]]
    reads: int
    problems: tuple[Finding, ...] = ()     # what could not be looked at (no job, py-spy missing ...)
    unread: int = 0                         # rank processes found whose first read has not come back yet


def _ended_text(snap: RankSnapshot) -> str:
    if snap.status == KILLED and snap.exit_code is not None:
        try:
            return f"killed by {signal.Signals(-snap.exit_code).name}"
        except ValueError:
            return f"killed by signal {-snap.exit_code}"
    return f"exited {snap.exit_code}" if snap.exit_code is not None else "ended (status not seen)"


def _cpu_pct(track: Track) -> float | None:
    reads = [r for r in track.reads if r.clock.process_cpu_s is not None and r.time is not None]
    if len(reads) < 2 or reads[-1].time <= reads[-2].time:
        return None
    return 100.0 * max(0.0, reads[-1].clock.process_cpu_s - reads[-2].clock.process_cpu_s) / (reads[-1].time - reads[-2].time)


def _state(looks: Sequence[RankSnapshot], cpu_pct: float | None, since: float | None, now: float) -> tuple[str, str]:
    """(the state with its seconds, the state alone) from a rank's reads, oldest first; since:
    when it came to stay where it is (None: it moved at its latest read)."""
    latest = looks[-1]
    if latest.status in (EXITED, KILLED):
        text = _ended_text(latest)
        return text, text
    if latest.status == UNKNOWN:
        return "unreadable", "unreadable"
    held = f" for {now - since:.0f} s" if since is not None and now - since >= 1 else ""
    if len(looks) < 2:
        return "reading", "reading"
    place = progress.wait_place(latest)
    moving = since is None
    if place is not None:
        op = place.split(" at ", 1)[0]
        return f"in `{op}`{held}", "moving" if moving else f"in `{op}`"
    if moving:
        busy = cpu_pct is not None and cpu_pct >= _COMPUTING_PCT
        return ("computing" if busy else "running"), "moving"
    if latest.may_spin:
        return f"cannot tell{held} (the CPU may spin here)", "cannot tell"
    return f"idle{held}", "idle"


def _where(snap: RankSnapshot) -> str:
    if snap.where is not None:
        return snap.where.describe()
    return f"{snap.stack[-1].label} in {snap.stack[-1].function}" if snap.stack else ""


@dataclass
class Watch:
    """The state of a --watch: its ranks' reads; poll() reads for one interval and says what it saw."""

    pids: Sequence[int] = ()
    native: bool = False
    interval_s: float = 2.0
    timeout_s: float = 10.0             # one py-spy dump's bound
    span_s: float = SPAN_S
    job_filter: Mapping[str, str] | None = None
    env: Mapping[str, str] | None = None
    host: str = field(default_factory=socket.gethostname)
    found: Discovery = field(default_factory=Discovery)
    sampler: Sampler | None = None
    problems: list[Finding] = field(default_factory=list)
    _scanned: float = float("-inf")
    _reads: int = 0
    # pid -> (place, since): when a rank came to stay where it is, kept beyond the reads kept.
    _since: dict[int, tuple[str | None, float]] = field(default_factory=dict)

    def _held(self, snap: RankSnapshot, looks: Sequence[RankSnapshot]) -> float | None:
        """Since when the rank has stayed where it is (its reads are a bounded window: an earlier
        start seen at the same place, with no move in between, is kept)."""
        since = progress.settled_since(looks)
        if snap.pid is None:
            return since
        if since is None:
            self._since.pop(snap.pid, None)
            return None
        place = progress.wait_place(snap) or (snap.where.label if snap.where else None)
        earlier = self._since.get(snap.pid)
        reaches_back = bool(looks) and looks[0].time is not None and since <= looks[0].time
        if earlier is not None and earlier[0] == place and reaches_back:
            since = min(since, earlier[1])  # still since before the reads it has now
        self._since[snap.pid] = (place, since)
        return since

    def _scan(self) -> None:
        found = discover(self.pids, self.job_filter)
        program = pyspy.find_pyspy(self.env)
        if program is None and found.jobs:
            self.problems = [pyspy.PYSPY_MISSING(detail="no `py-spy` in any directory of PATH", hosts=[self.host])]
            self.found = found
            return
        if self.sampler is None:
            self.sampler = Sampler([], native=self.native, pyspy_path=program or "py-spy", host=self.host,
                                   dump_timeout_s=self.timeout_s, interval_s=self.interval_s)
        known = {t.proc.pid for t in self.sampler.tracks}
        self.sampler.add([m for members in found.jobs.values() for m in members if m.pid not in known])
        # Ranks seen before and not found now stay in their job (their end is shown, as read).
        for key, members in self.found.jobs.items():
            now_members = found.jobs.setdefault(key, [])
            have = {m.pid for m in now_members}
            now_members += [m for m in members if m.pid not in have]
        self.found, self.problems = found, list(found.findings)

    def poll(self, stop=None) -> Screen:
        """Read for one interval (stop: an Event that ends it early) and describe the job now."""
        now = time.monotonic()
        if now - self._scanned >= max(RESCAN_S, self.interval_s):
            self._scan()
            self._scanned = now
        end = now + self.interval_s
        while self.sampler is not None and time.monotonic() < end and not (stop is not None and stop.is_set()):
            self._reads += self.sampler.step(min(end, time.monotonic() + 0.2))
        if self.sampler is None:
            remaining = end - time.monotonic()
            if remaining > 0 and stop is not None:
                stop.wait(remaining)
        return self.screen()

    def views(self) -> list[JobView]:
        if self.sampler is None:
            return []
        by_pid = {t.proc.pid: t for t in self.sampler.tracks}
        out = []
        for key, members in self.found.jobs.items():
            tracks = [by_pid[m.pid] for m in _current(members, by_pid) if m.pid in by_pid and by_pid[m.pid].reads]
            if tracks:
                out.append(job_view(key, members, tracks, self.host, picked=key in self.found.picked,
                                    native=self.native, span_s=self.span_s))
        return out

    def screen(self) -> Screen:
        now = time.time()
        rows: list[Row] = []
        verdicts: dict[str, tuple[Finding, ...]] = {}
        by_pid = {t.proc.pid: t for t in self.sampler.tracks} if self.sampler else {}
        for view in self.views():
            # A verdict forms once every rank was read enough (as `distdoctor stacks` waits for).
            ready = all(settled(by_pid[s.pid], self.span_s) for s in view.snapshots if s.pid in by_pid)
            found = verdict(view).findings if ready else ()
            verdicts[view.key] = found
            named = {r: f.severity for f in found for r in f.ranks if f.severity >= Severity.WARNING}
            for snap in view.snapshots:
                track = by_pid.get(snap.pid) if snap.pid is not None else None
                cpu = _cpu_pct(track) if track else None
                looks = view.looks(snap.rank)
                state, kind = _state(looks, cpu, self._held(snap, looks), now)
                rows.append(Row(view.key, snap.rank, snap.host, snap.pid, state, kind, cpu, _where(snap),
                                named[snap.rank].label if snap.rank in named else ""))
        shown = {row.pid for row in rows}
        unread = sum(1 for members in self.found.jobs.values() for m in members if m.pid not in shown)
        return Screen(now, tuple(rows), verdicts, self._reads, tuple(self.problems), unread)

    def report(self, started: float, silence: Sequence[str] = ()) -> Report:
        """The final report: what `distdoctor stacks` would say now, from the reads kept."""
        return assemble(self.views(), self.problems, started=started, silence=silence,
                        extra={"nodes": [self.host], "watch": {"interval_s": self.interval_s, "reads": self._reads}})

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()


def _current(members: Sequence[RankProcess], by_pid: Mapping[int, Track]) -> list[RankProcess]:
    """One process per rank: a rank restarted under a new PID replaces its ended predecessor."""
    latest: dict[object, RankProcess] = {}
    for member in members:
        key = member.rank if member.rank is not None else ("pid", member.pid)
        held = latest.get(key)
        track = by_pid.get(member.pid)
        if held is None or (track is not None and not track.ended and by_pid.get(held.pid) is not None
                            and by_pid[held.pid].ended):
            latest[key] = member
    return list(latest.values())

