"""What the logs, error files and recorder dumps said of each rank, as the diagnosis's RankSnapshots."""

# One rank's snapshot from what was read afterwards:
# - its error: the last exception its own lines show (a traceback with the rank's prefix, in its
#   file, or in its TORCHELASTIC error file), with the innermost frame of the user's code; it is a
#   consequence when it was raised out of torch.distributed (diagnosis.origin: its type, the C++
#   location its message names, torch.distributed's innermost frame) or is the launcher's signal;
# - its end: torchrun's summary (exit code, signal, time, host); a rank the summary does not list
#   while it lists others of the same agent exited 0; a rank ended by the launcher's SIGTERM without
#   an error of its own was still running when its peer failed (it is the one the others waited for);
# - where it waited: the collective its traceback shows it in (distributed_c10d.<op>), or its
#   flight-recorder dump's groups.
# What nobody said stays unknown: a rank seen in the logs with no error and no exit is `unknown`.

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Iterable

from distdoctor.diagnosis.diagnose import signal_name
from distdoctor.diagnosis.frames import user_frame
from distdoctor.diagnosis.origin import DISTRIBUTED, OWN, SIGNAL_TYPES, origin_of
from distdoctor.diagnosis.snapshot import (EXITED, FINISHED, KILLED, RAISED, RUNNING, UNREACHABLE, Frame,
                                           GroupProgress, PendingOp, RaisedError, RankSnapshot)
from distdoctor.core.report import format_ranks
from distdoctor.explain.activity import (Complaint, anonymous_progress, complaints, implied_ranks, kept_going,
                                         went_quiet_first)
from distdoctor.explain.catalog import Catalog
from distdoctor.explain.ranks import RaisedText, RankCollector, RankText, finished_line
from distdoctor.explain.sanitize import clean_quote

SOURCE = "log"
_C10D = re.compile(r"[/\\]torch[/\\]distributed[/\\](?:distributed_c10d|c10d_logger)\.py$")
_OP_IN_MESSAGE = re.compile(r"OpType=(?P<op>\w{1,40})|for (?P<io>recv|send) operation")
_YEAR = re.compile(r"^\d{4}-")
# Exit codes of a crash in native code that a process ending after its loop may die of.
EXIT_CRASH_CODES = frozenset({-6, -11})  # SIGABRT, SIGSEGV
KEPT_GOING, QUIET_FIRST, FINISHED_WORDS = "kept_going", "quiet_first", "finished_words"


@dataclass
class JobEvidence:
    """Per-rank evidence gathered from every input, and what was made of it."""

    collector: RankCollector = field(default_factory=RankCollector)
    groups: dict[int, tuple[GroupProgress, ...]] = field(default_factory=dict)   # from recorder dumps
    reported: list[RankSnapshot] = field(default_factory=list)                   # from distdoctor's reports
    # What each rank's output did around its peers' complaints (KEPT_GOING, QUIET_FIRST, FINISHED_WORDS):
    # the verdict's alternatives are weighed by it (job.py).
    activity: dict[int, str] = field(default_factory=dict)


def is_consequence(raised: RaisedText, catalog: Catalog) -> bool:
    """A peer's failure seen here, or the launcher's signal: judged by where it was raised
    (diagnosis.origin), never by its words.

    torch.distributed's own errors (DistError, a C++ error raised in gloo, c10d or NCCL, a
    RuntimeError out of torch.distributed's code) are a consequence; an exception raised in the
    user's code or a library is the rank's own, whatever it says (`TimeoutError('Read timed out.')`,
    `RuntimeError('Timed out waiting for the dataset server')`). Only where the log does not show
    the origin (an exception line without its traceback; a RuntimeError out of torch's C++ with no
    location, as release builds of old torch print them) is the text itself asked: one that
    torch.distributed prints when a peer failed (a catalog symptom: the exact message, not a word)
    comes from torch.distributed.
    """
    name = raised.type.rsplit(".", 1)[-1]
    if name in SIGNAL_TYPES:
        return True
    origin = origin_of([name], raised.message, [f.file for f in raised.frames], traceback_read=bool(raised.frames),
                       innermost_code=raised.frames[-1].code if raised.frames else "")
    line = f"{raised.type}: {raised.message}"
    if origin == DISTRIBUTED:
        # torch.distributed refusing this rank's own call (a CPU tensor on NCCL, a collective before
        # init) is the rank's failure, not a peer's: the catalog reads that exact text as a cause.
        return catalog_reading(line, catalog, "cause") is None
    if origin == OWN:
        return False
    return catalog_reading(line, catalog, "symptom") is not None


def catalog_reading(line: str, catalog: Catalog, role: str):
    """The catalog's signature of that role whose exact torch.distributed message this line is, if any."""
    for sig in catalog.signatures:
        if sig.role == role and any(t in line for t in sig.tokens) and sig.regex.search(line):
            return sig
    return None


def collective_of(raised: RaisedText) -> str | None:
    """The collective a traceback shows the rank in (torch's distributed_c10d frame), or its message names."""
    for frame in reversed(raised.frames):
        if _C10D.search(frame.file) and frame.function not in ("wrapper", "<module>"):
            return frame.function[:100]
    match = _OP_IN_MESSAGE.search(raised.message)
    if match:
        return (match["op"] or match["io"]).lower()
    return None


def _error(raised: RaisedText, catalog: Catalog, year: int) -> tuple[RaisedError, Frame | None, bool]:
    frame = user_frame(raised.frames)
    consequence = is_consequence(raised, catalog)
    return (RaisedError(raised.type.rsplit(".", 1)[-1] if raised.type.count(".") > 2 else raised.type,
                        raised.message, frame, _time(raised.time, year), consequence), frame, consequence)


def _own_error(text: RankText) -> RaisedText | None:
    """The exception that ended the rank: the last one its lines show (read through its chain to the
    innermost that means something: `raise ... from`, "During handling of the above exception"),
    else its error file's."""
    if text.errors:
        return text.errors[-1].innermost()
    if text.error_file is not None:
        return text.error_file.innermost()
    return text.bare[-1] if text.bare else None


@dataclass
class _Reading:
    """What every rank's snapshot is read against: the job's clock year, torchrun's summary, the
    ranks' first complaints and the progress lines no rank prefix claims."""

    year: int
    agent_ranks: range | None           # one agent's ranks, when its failure summary was read
    complained: list[Complaint]
    silent: set[int]                    # ranks the logs show nothing of but their existence
    anonymous: str | None               # a progress line after the complaints, no rank prefix

    def time(self, stamp: str | None) -> float | None:
        return _time(stamp, self.year)


def build_snapshots(evidence: JobEvidence, catalog: Catalog, empty: set[int]) -> list[RankSnapshot]:
    """One snapshot per rank that any input named, or that the job must have had (rank 0, small gaps)."""
    collector = evidence.collector
    _attribute(collector)
    year = _summary_year(collector) or datetime.now().year
    seen = set(collector.ranks) | set(evidence.groups) | empty
    implied = implied_ranks(seen)
    reading = _Reading(year, _agent_ranks(collector), [], set(), None)
    reading.complained = complaints(collector, _consequence_errors(collector, catalog, reading), reading.time)
    reading.silent = {r for r in seen | implied if _shows_nothing(collector.ranks.get(r), evidence, r)}
    reading.anonymous = anonymous_progress(collector, reading.complained)
    if not (reading.anonymous and len(reading.silent) == 1):
        # A rank known only to exist adds nothing but "it did not answer", which the complaints'
        # own reading ranks better; it is named when unclaimed progress lines can only be its.
        implied = set()
    # The agent whose summary was read started every rank of its range: one it does not list exited 0.
    implied |= set(reading.agent_ranks or ()) - seen
    snaps = {s.rank: s for s in merge_reported(evidence.reported)}
    for rank in sorted(seen | implied):
        text = collector.ranks.get(rank) or RankText(rank)
        read = _snapshot(text, evidence, catalog, reading, rank in empty)
        activity = _activity_of(read)
        if activity:
            evidence.activity[rank] = activity
        reported = snaps.get(rank)
        if reported is None:
            snaps[rank] = read
        elif read.error is not None or read.exit_code is not None:
            # The logs saw how the rank ended (after the report's moment): that end is the newer fact;
            # the report's progress per group stays where the logs have none.
            snaps[rank] = replace(read, groups=read.groups or reported.groups, host=read.host or reported.host,
                                  stack=reported.stack)
    return _in_log_order([snaps[r] for r in sorted(snaps)], collector)


def _activity_of(snap: RankSnapshot) -> str:
    """The reading of a rank's output that _status wrote into its notes, as a word job.py weighs."""
    for note, word in (("its output goes on after", KEPT_GOING), ("its last line says it finished", FINISHED_WORDS),
                       ("its output stopped before any peer", QUIET_FIRST)):
        if any(n.startswith(note) for n in snap.notes):
            return word
    return ""


def _agent_ranks(collector: RankCollector) -> range | None:
    """The ranks of the one torchrun agent whose failure summary was read: from its first rank (a listed
    rank minus its local rank) to the highest rank it listed. A rank in that range it does not list
    exited 0 before the failure. None when no summary, or summaries of several agents, were read."""
    exits = [t for t in collector.ranks.values() if t.exit is not None]
    if not collector.summary_seen or len({t.exit.host for t in exits}) != 1:
        return None
    bases = {t.rank - t.exit.local_rank for t in exits if t.exit.local_rank is not None}
    if len(bases) != 1:
        return None
    return range(bases.pop(), max(t.rank for t in exits) + 1)


def _consequence_errors(collector: RankCollector, catalog: Catalog,
                        reading: _Reading) -> dict[int, tuple[tuple[int, int], float | None]]:
    found = {}
    for rank, text in collector.ranks.items():
        raised = _own_error(text)
        if raised is not None and is_consequence(raised, catalog):
            found[rank] = (raised.order, reading.time(raised.time))
    return found


def _shows_nothing(text: RankText | None, evidence: JobEvidence, rank: int) -> bool:
    """No line, error, exit or dump of this rank was read: only its existence is known."""
    if rank in evidence.groups:
        return False
    return text is None or not (text.lines or text.errors or text.bare or text.exit or text.error_file
                                or text.watchdog or text.watchdog_ops or text.complained)


def _in_log_order(snaps: list[RankSnapshot], collector: RankCollector) -> list[RankSnapshot]:
    """Ranks that each raised, in one log with no clock: the order they printed in is the order they failed.

    Only within one input (across files, line numbers say nothing about time) and only when no own
    error has a time; the times given are the summary's (or 0) plus a microsecond per line, for
    ordering only.
    """
    own = [s for s in snaps if s.error is not None and not s.error.consequence]
    if len(own) < 2 or any(s.error.time is not None and s.source != SOURCE for s in own):
        return snaps
    read = {s.rank: _own_error(collector.ranks[s.rank]) for s in own if s.rank in collector.ranks}
    if len(read) != len(own) or any(r is None or r.time for r in read.values()) \
            or len({r.order[0] for r in read.values()}) != 1:
        return snaps
    base = min((s.time for s in snaps if s.time is not None), default=0.0)
    timed = {rank: base + r.order[1] * 1e-6 for rank, r in read.items()}
    return [replace(s, error=replace(s.error, time=timed[s.rank])) if s.rank in timed else s for s in snaps]


def _attribute(collector: RankCollector) -> None:
    """An exception printed without a rank prefix belongs to the rank torchrun's summary calls the root
    cause, when that rank shows no exception of its own (a one-process job's log, torch < 2.2's output)."""
    if not collector.unattributed:
        return
    root = [t for t in collector.ranks.values() if t.exit and t.exit.root_cause and not t.errors]
    if len(root) == 1 and root[0].exit.code not in (None, 0) and root[0].exit.code > 0:
        root[0].errors.append(collector.unattributed[-1])


def _snapshot(text: RankText, evidence: JobEvidence, catalog: Catalog, reading: _Reading,
              empty: bool) -> RankSnapshot:
    raised = _own_error(text)
    exit_ = text.exit
    notes: list[str] = []
    error = where = collective = None
    if raised is not None:
        error, where, consequence = _error(raised, catalog, reading.year)
        collective = collective_of(raised) if consequence else None
        if consequence and collective is None:
            collective = "a collective"  # a peer's failure surfaces inside communication
        if error.time is None and exit_ is not None and exit_.time is not None and exit_.code not in (None, 0, -15):
            error = RaisedError(error.type, error.message, error.frame, exit_.time, error.consequence)
    status, code = _status(text, raised is not None, reading, empty, notes)
    groups = evidence.groups.get(text.rank, ()) or watchdog_groups(text)
    if groups and not evidence.groups.get(text.rank) and error is None:
        # NCCL's watchdog fired while the rank waited: at that moment it was alive, in that collective.
        status, code = RUNNING, None
        notes.clear()
        notes.append(f"NCCL's watchdog timed out its collective: {text.watchdog_line[:160]}")
    return RankSnapshot(rank=text.rank, host=exit_.host if exit_ else "",
                        pid=exit_.pid if exit_ else None, status=status, exit_code=code,
                        # The traceback is the rank's stack at the moment it raised (innermost last).
                        stack=raised.frames[-32:] if raised is not None else (),
                        groups=groups, where=where, in_collective=collective, error=error,
                        time=exit_.time if exit_ else None, source=SOURCE, notes=tuple(notes))


def watchdog_groups(text: RankText) -> tuple[GroupProgress, ...]:
    """The progress NCCL's watchdog printed for a rank: per group, the collective it timed out in."""
    groups = []
    for pg, (seq, enqueued, completed) in sorted(text.watchdog.items()):
        op = text.watchdog_ops.get(seq, "a collective").lower()
        groups.append(GroupProgress(pg, (), enqueued if enqueued is not None else seq, completed,
                                    PendingOp(op, seq, state="timed out")))
    if not groups and text.watchdog_ops:
        seq = min(text.watchdog_ops)
        groups.append(GroupProgress("0", (), seq, seq - 1, PendingOp(text.watchdog_ops[seq].lower(), seq,
                                                                      state="timed out")))
    return tuple(groups)


def _status(text: RankText, has_error: bool, reading: _Reading, empty: bool,
            notes: list[str]) -> tuple[str, int | None]:
    exit_ = text.exit
    if exit_ is not None and exit_.code is not None:
        return _ended(text, has_error, notes)
    if has_error:
        return RAISED, None
    if empty:
        notes.append("its log is empty")
        return UNREACHABLE, None  # gone without a trace, as far as what was given can tell
    if reading.agent_ranks is not None and text.rank in reading.agent_ranks:
        notes.append("torchrun's failure summary does not list it: it exited 0")
        return EXITED, 0
    busy = kept_going(text, reading.complained, reading.time)
    if busy is None and text.rank in reading.silent and len(reading.silent) == 1:
        busy = reading.anonymous
        if busy:
            notes.append("lines without a rank prefix go on after the others' timeouts, and this is the only rank "
                         "the logs show nothing else of")
    if busy:
        peers = sorted({c.rank for c in reading.complained if c.rank != text.rank})
        notes.append(f"its output goes on after rank{'s' if len(peers) > 1 else ''} {format_ranks(peers)} reported a "
                     f"timeout or a lost peer: {busy}")
        return RUNNING, None
    last = clean_quote(text.last_line)
    if finished_line(last):
        # Words support, never decide: the rank fell silent; its last line suggests it had finished.
        notes.append(f"its last line says it finished: {last[:120]}")
    elif went_quiet_first(text, reading.complained):
        notes.append("its output stopped before any peer reported a timeout" + (f" (last line: {last[:120]})"
                                                                              if last else ""))
    elif text.rank in reading.silent:
        notes.append("no line of it was read (a rank the job must have had)")
    else:
        notes.append("its log ends without an error" + (f" (last line: {last[:120]})" if last else ""))
    return UNREACHABLE, None  # it fell silent: what it was doing, nothing given says


def _ended(text: RankText, has_error: bool, notes: list[str]) -> tuple[str, int | None]:
    """A rank whose exit torchrun's summary gives."""
    code = text.exit.code
    if code == -15 and not has_error:
        last = clean_quote(text.last_line)
        if finished_line(last):
            # Its loop was over (it was tearing down) when the launcher's SIGTERM came.
            notes.append(f"its last line says it finished ({last[:120]}) before the launcher's SIGTERM")
            return FINISHED, None
        notes.append("ended by the launcher's SIGTERM after a peer failed: it was still running then")
        return RUNNING, None
    if code in EXIT_CRASH_CODES and not has_error and finished_line(clean_quote(text.last_line)):
        # Its loop was over when native code aborted the process: torch's process-group threads as
        # the interpreter ends ("terminate called without an active exception"), or a library's teardown.
        # It had left the job; the crash is how it ended, not why its peers failed.
        notes.append(f"its last line says it finished ({clean_quote(text.last_line)[:120]}) before it died of "
                     f"{signal_name(-code)} while exiting")
        return FINISHED, code
    if code < 0:
        return (RAISED if has_error else KILLED), code
    return (RAISED if has_error else EXITED), code


def _summary_year(collector: RankCollector) -> int | None:
    """The year glog's MMDD stamps are in: torchrun's summary's, else a dated line's of the same logs."""
    for text in collector.ranks.values():
        if text.exit and text.exit.time:
            return datetime.fromtimestamp(text.exit.time).year
    for text in collector.ranks.values():
        for stamp in (text.last_time, text.complained_time, *(e.time for e in text.errors)):
            if stamp and _YEAR.match(stamp):
                return int(stamp[:4])
    return None


def _time(stamp: str | None, year: int) -> float | None:
    """A log line's timestamp as epoch seconds (glog's MMDD has no year: the summary's or this one)."""
    if not stamp:
        return None
    try:
        if _YEAR.match(stamp):
            return datetime.fromisoformat(stamp[:26]).timestamp()
        return datetime.strptime(f"{year}{stamp[:4]} {stamp[5:20]}", "%Y%m%d %H:%M:%S.%f"
                                 if "." in stamp else "%Y%m%d %H:%M:%S").timestamp()
    except ValueError:
        return None


def merge_reported(snaps: Iterable[RankSnapshot]) -> list[RankSnapshot]:
    """Snapshots carried by distdoctor's own reports (the guard's, stacks'): the first per rank."""
    out: dict[int, RankSnapshot] = {}
    for snap in snaps:
        out.setdefault(snap.rank, snap)
    return list(out.values())


def error_lines(collector: RankCollector) -> dict[int, set[tuple[str, int]]]:
    """Per rank, where its exceptions were read (file, line)."""
    return {rank: {(e.file, e.line) for e in (*text.errors, *text.bare)}
            for rank, text in collector.ranks.items() if text.errors or text.bare}


def anonymous_error(collector: RankCollector, snaps: list[RankSnapshot],
                    catalog: Catalog) -> tuple[RaisedError, tuple[str, int]] | None:
    """The first exception raised in the job's own code that no rank claims (and where it was read),
    when no rank raised one itself. An exception with no frame of the user's code is the launcher's
    (torchrun's RendezvousTimeoutError) or a library's, not the job's."""
    if any(s.error is not None and not s.error.consequence for s in snaps):
        return None
    for raised in collector.unattributed:
        error, frame, consequence = _error(raised, catalog, datetime.now().year)
        if frame is not None and not consequence:
            return error, (raised.file, raised.line)
    return None
