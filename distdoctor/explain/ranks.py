"""What each rank's own lines say: its exception and traceback, its exit (torchrun's summary), its last words."""

# The catalog reads messages; a job diagnosis also needs to know, per rank, what it raised (type,
# message, the frames of its traceback), how it ended (torchrun's failure summary: exit code,
# signal, error file, time) and whether it printed anything at all. This module collects that while
# scan.py reads the blocks, with the same economy: a few tokens searched per block with str.find,
# lines parsed only around the hits, and a bounded sample of line prefixes (which ranks print).
#
# A line belongs to a rank by its prefix: torchrun's `[default1]:` (--tee / the console) and torch's
# own `[rank1]:`, `srun -l`'s `1: `, `mpirun --tag-output`'s `[1,1]<stderr>:`; else by the rank of
# its file (rank1.log, --log-dir's attempt_0/1/stderr.log).

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from distdoctor.diagnosis.snapshot import Frame
from distdoctor.explain.presence import BlockWords, may_hold
from distdoctor.explain.sanitize import clean_quote

MAX_TRACEBACK_LINES = 400   # lines looked at after "Traceback (...)" before giving up on its end
MAX_FRAMES = 64              # frames kept per traceback (the innermost ones)
MAX_ERRORS = 8               # exceptions kept per rank
MAX_RANKS = 100_000
PREFIX_SAMPLE = 4096         # characters at each end of a block whose line prefixes are sampled
MAX_MESSAGE = 300
MAX_WATCHDOG_LINES = 4096    # watchdog lines read per token and block (a rank prints a handful)
MAX_INTERLEAVED = 65_536     # interleaved tracebacks' headers and exception lines remembered per input

TRACEBACK = "Traceback (most recent call last)"
# What a traceback the log ends inside raised is not known; it stands in for the exception line.
CUT_TYPE = "TracebackCutOff"
CUT_MESSAGE = "the log ends inside this traceback, before the exception's line"
SUMMARY_TOKEN = "exitcode  : "         # torchrun >= 1.11's failure summary, one per failed rank
OLD_SUMMARY_TOKEN = "exitcode: "        # torchrun 1.9-1.10 (and the agent's own log line)

_PREFIX = re.compile(
    r"(?:\[(?:default|rank)(?P<tr>\d{1,7})\]:"            # torchrun --tee / torch's [rankN]:
    r"|\[\d{1,7},(?P<mpi>\d{1,7})\]<(?:stdout|stderr|stddiag)>:"  # mpirun --tag-output
    r"|(?P<srun> {0,6}\d{1,7}): )")                       # srun -l
# What pasting or collecting a log puts before a rank's prefix: a viewer's line number ("[80746] "),
# Ray's worker tag ("(RayTrainWorker pid=19799, ip=10.0.0.6) "), docker compose's "name  | ".
_FOREIGN_PREFIX = re.compile(r"\[\d{1,9}\] |\((?:\w{1,40} )?pid=\d{1,10}(?:, ip=[\w.:-]{1,60})?\) |[\w.-]{1,60} {0,8}\| ")
_WORLD_SIZE = re.compile(r"(?<![A-Za-z_])(?i:world[_ ]size)\s*[=:]?\s*(\d{1,7})(?!\d)")
_SPAWNED = re.compile(r"-- Process (\d{1,7}) terminated with the following error:\s*$")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]{1,500})", line (?P<line>\d{1,9})(?:, in (?P<fn>.{1,200}))?')
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]{0,200})(?::(?P<msg>.*))?$")
# An exception line without a message, told from a word another process printed by its type's name.
_EXCEPTION_NAME = re.compile(r"(?:Error|Exception|Interrupt|Exit|Iteration)$")
_SUMMARY_RANK = re.compile(r"rank\s*:\s*(?P<rank>\d{1,7}) \(local_rank: (?P<local>\d{1,7})\)")
_SUMMARY_TIME = re.compile(r"time\s*:\s*(?P<time>\d{4}-\d\d-\d\d_\d\d:\d\d:\d\d)")
_SUMMARY_HOST = re.compile(r"host\s*:\s*(?P<host>[^\s]{1,200})")
_SUMMARY_EXIT = re.compile(r"exitcode\s*:\s*(?P<code>-?\d{1,4}) \(pid: (?P<pid>\d{1,9})\)")
_SUMMARY_FILE = re.compile(r"error_file\s*:\s*(?P<file>[^\n]{1,500})")
_SUMMARY_TB = re.compile(r"traceback\s*:\s*(?P<tb>[^\n]{0,500})")
# ProcessGroupNCCL's watchdog, per rank and group (torch 2.x): which collective timed out and how far
# the group had got. logPrefix() is "[PG ID 0 PG GUID 0(default_pg) Rank 1] " (2.4+) or "[PG 0 Rank 1] ".
WATCHDOG_TOKENS = ("detected by watchdog at work", "Timeout at NCCL work: ", "Watchdog caught collective operation timeout")
_WATCHDOG_STATUS = re.compile(
    r"\[PG (?:ID )?(?P<pg>\d{1,6})(?: PG GUID [^\]]{0,80})? Rank (?P<rank>\d{1,7})\]\s+(?:"
    r"failure detected by watchdog at work sequence id: (?P<seq>\d{1,12}) PG status: last enqueued work: "
    r"(?P<enq>-?\d{1,12}), last completed work: (?P<done>-?\d{1,12})"
    r"|(?:Exception \(either an error or timeout\) detected by watchdog at work|Timeout at NCCL work): "
    r"(?P<seq2>\d{1,12}), last enqueued NCCL work: (?P<enq2>-?\d{1,12}), last completed NCCL work: (?P<done2>-?\d{1,12}))")
_WATCHDOG_OP = re.compile(r"(?:\[Rank (?P<rank>\d{1,7})\] )?Watchdog caught collective operation timeout: "
                          r"WorkNCCL\(SeqNum=(?P<seq>\d{1,12}), OpType=(?P<op>\w{1,40})")
# glog's month-day: torch writes "E0321" or "E321" (no zero before a one-digit month).
_LOG_TIME = re.compile(r"[EWIF](?P<md>\d{3,4}) (?P<hms>\d\d:\d\d:\d\d(?:\.\d{1,9})?)|"
                       r"(?P<iso>\d{4}-\d\d-\d\d[ T_]\d\d:\d\d:\d\d(?:[.,]\d{1,9})?)")
# std::terminate's own line when a thread is left running as the process ends (torch's process-group
# threads at interpreter exit): how the rank ended, not what it was doing, so never its last line.
_ENDING_ABORT = re.compile(r"terminate called without an active exception")
# A last line that says the loop ended (what a rank that left early prints).
_FINISHED = re.compile(r"\b(?:done|finished|completed?|training (?:is )?(?:over|ended)|exiting)\b", re.I)
# Lines that show a job at work: a tqdm bar, a step/iteration/epoch/loss count, a rate.
_PROGRESS = re.compile(r"\d%\||\d(?:it|s)/(?:s|it)\b|\b(?:step|iter(?:ation)?|epoch|batch|loss)\b\W{0,3}\d|"
                       r"\bloss\b|[Ss]canning|[Cc]aching|[Ll]oading|[Ss]aving|[Ee]valuat", re.I)
# Lines that are a failure, the launcher or torch talking, not the rank's work (nccl-tests' header has "step: 2").
_NOT_ACTIVITY = re.compile(r"[Ee]rror|Exception|Traceback|^\s+File \"|[Tt]ime[d ]? ?out|[Ww]atchdog|"
                           r"SIG[A-Z]{2,4}|terminate|frame #|torch[./]distributed[./]elastic|[Ff]ailed|[Kk]illed|"
                           r"NCCL (?:WARN|INFO)|ProcessGroup|c10d|exitcode|ChildFailed|nGpus \d+ minBytes")
# Exception types that belong to the launcher, not to a rank's own code: torchrun's summary,
# torch.multiprocessing.spawn's wrapper of a process's error (ProcessRaisedException: the process's
# own traceback follows "-- Process N terminated with the following error:") and of its exit
# (ProcessExitedException: "process N terminated with exit code C / signal S").
_LAUNCHER_TYPES = ("ChildFailedError", "ProcessRaisedException", "ProcessExitedException")
# A subprocess launcher re-raising its child's failure (accelerate's and DeepSpeed's simple launchers:
# subprocess.CalledProcessError) is the launcher's when its traceback runs through the launcher's code.
_LAUNCHER_FRAMES = re.compile(r"[/\\](?:accelerate[/\\]commands|deepspeed[/\\]launcher|torch[/\\]distributed[/\\]"
                              r"(?:run|launch|launcher)|lightning[/\\](?:fabric|pytorch)[/\\]strategies[/\\]launchers)")
# Python's chain markers: the traceback after one is the exception raised while (or because) the one
# before it was handled; the one before is nearer the cause.
CHAINED = ("The above exception was the direct cause of the following exception:",
           "During handling of the above exception, another exception occurred:")
# Exceptions that mean nothing by themselves when they start a chain (control flow, a queue's wait):
# the exception raised while handling them is the one that says what happened (a DataLoader's
# `queue.Empty` -> "DataLoader worker (pid N) exited unexpectedly").
PLUMBING_TYPES = frozenset({"Empty", "StopIteration", "StopAsyncIteration", "GeneratorExit", "RemoteTraceback"})


@dataclass
class RaisedText:
    """One exception as a log shows it: type, first line of its message, frames, where it was read."""

    type: str
    message: str
    frames: tuple[Frame, ...]
    file: str
    line: int
    order: tuple[int, int]            # (input index, line): log order
    time: str | None = None           # a timestamp read on the exception line, when it has one
    # The exception this one was raised from or while handling (Python's chain, printed above it).
    inner: "RaisedText | None" = None

    def innermost(self) -> "RaisedText":
        """The innermost exception of its chain that means something: what happened, not its wrappers."""
        chain = [self]
        while chain[-1].inner is not None and len(chain) < MAX_ERRORS:
            chain.append(chain[-1].inner)
        for raised in reversed(chain):
            if raised.type.rsplit(".", 1)[-1] not in PLUMBING_TYPES:
                return raised
        return self


@dataclass
class Exit:
    """torchrun's summary entry for one rank."""

    code: int | None
    pid: int | None = None
    signal: str = ""
    error_file: str = ""
    time: float | None = None
    host: str = ""
    local_rank: int | None = None
    root_cause: bool = False
    text: str = ""


@dataclass
class RankText:
    """Everything one rank's lines told."""

    rank: int
    errors: list[RaisedText] = field(default_factory=list)
    exit: Exit | None = None
    lines: int = 0                    # prefixed lines sampled (a rank that printed at all)
    last_line: str = ""
    # Where its output was last seen doing something other than failing: (input index, line), and
    # the latest timestamp its lines carry. What "kept going" is judged by (activity.py).
    last_seen: tuple[int, int] | None = None
    last_seen_text: str = ""
    last_time: str | None = None
    # Where it first complained (NCCL's watchdog, a timeout line): (input index, line), timestamp.
    complained: tuple[int, int] | None = None
    complained_time: str | None = None
    noticed: int = 0                  # error-looking lines in its own per-rank files
    files: set[str] = field(default_factory=set)
    error_file: RaisedText | None = None  # from a TORCHELASTIC error file (error.json)
    bare: list[RaisedText] = field(default_factory=list)  # exception lines seen without their traceback's header
    # NCCL's watchdog: group id -> (timed-out sequence number, last enqueued, last completed); seq -> op.
    watchdog: dict[str, tuple[int, int | None, int | None]] = field(default_factory=dict)
    watchdog_ops: dict[int, str] = field(default_factory=dict)
    watchdog_line: str = ""
    # What the rank said the job is: the world sizes its lines name, the hosts torchrun's summaries
    # put it on (two hosts for one rank: two processes claimed it).
    world_sizes: set[int] = field(default_factory=set)
    summary_hosts: set[str] = field(default_factory=set)


@dataclass
class _Pending:
    prefix: str
    rank: int | None
    frames: list[Frame]
    file: str
    line: int
    order: tuple[int, int]
    time: str | None = None    # the timestamp of the rank's last line before the traceback
    scanned: int = 0
    chained: bool = False      # printed after Python's chain marker: it wraps the exception before it
    # A prefix that varies from line to line (a viewer's line numbers): lines are matched by the rank
    # their prefixes name and the separator width, not by the exact text.
    varying: bool = False
    by_prefix: int | None = None
    separator: int = 0
    # Another traceback with the same prefix began before this one's exception line: two processes
    # printing to one console at once (no rank prefix before the process group exists), line by line.
    interleaved: bool = False


class RankCollector:
    """Per-rank evidence from the blocks of every input (bounded: ranks, errors and frames are capped)."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankText] = {}
        self.summary_seen = False
        self.unattributed: list[RaisedText] = []
        self._world_seen: list[int] = []
        self._pending: list[_Pending] = []
        # Interleaved tracebacks: the headers that began inside another traceback, and the exception
        # lines already taken (input index, line), so that two tracebacks never share one.
        self._interleaved_headers: set[tuple[int, int]] = set()
        self._claimed: set[tuple[int, int]] = set()
        # Per input: the last line without a rank prefix that shows a job making progress (a progress
        # bar, a step/loss line): (line, timestamp, text). Whose it is, activity.py decides.
        self.anonymous: dict[int, tuple[int, str | None, str]] = {}
        # Per input: the last line (any rank's or none's) that shows the job making progress.
        self.progress: dict[int, int] = {}

    def rank(self, number: int) -> RankText | None:
        if number not in self.ranks and len(self.ranks) >= MAX_RANKS:
            return None
        return self.ranks.setdefault(number, RankText(number))

    # -- per input ------------------------------------------------------------------------------

    def start_source(self) -> None:
        self._pending = []
        self._interleaved_headers.clear()
        self._claimed.clear()

    def end_source(self) -> None:
        """A traceback the input ends inside (a log cut mid-traceback): its rank raised, what is not known."""
        for pending in self._pending:
            # Only a rank's: a cut traceback no rank owns is as likely the launcher's own (torchrun's
            # entry point, cut where a paste ends) as the job's.
            if pending.frames and pending.rank is not None:
                self._raised(pending, f"{CUT_TYPE}: {CUT_MESSAGE}", pending.line + pending.scanned)
        self._pending = []

    def block(self, block: str, first_line: int, name: str, index: int, rank_hint: int | None,
              words: BlockWords | None = None) -> None:
        """``words``: what the scan found the block holds (a text it cannot hold is not searched)."""
        if self._pending:
            self._pending = [p for p in self._pending if not self._continue(p, block, 0, first_line)]
        self._sample_prefixes(block, first_line, index, rank_hint, name)
        if may_hold(words, TRACEBACK) and TRACEBACK in block:
            self._tracebacks(block, first_line, name, index, rank_hint)
        if any(may_hold(words, t) and t in block for t in (SUMMARY_TOKEN, OLD_SUMMARY_TOKEN)):
            self._summaries(block)
        if any(may_hold(words, t) and t in block for t in ("atchdog", "Timeout at NCCL work")):
            self._watchdog(block, first_line, index, rank_hint)
        if any(may_hold(words, t) and t in block for t in ("orld_size", "orld size", "ORLD_SIZE")):
            self._world_sizes(block, rank_hint)

    # -- which ranks print --------------------------------------------------------------------

    def _sample_prefixes(self, block: str, first_line: int, index: int, rank_hint: int | None, name: str) -> None:
        """Ranks seen in a bounded sample of the block's lines (its first and last few KB), and where
        each was last seen working."""
        if rank_hint is not None:
            text = self.rank(rank_hint)
            if text is not None:
                text.files.add(name)
                text.lines += 1
                tail = _last_words(block)
                if tail.strip():
                    text.last_line = clean_quote(tail[-MAX_MESSAGE:])
        if len(block) <= 2 * PREFIX_SAMPLE:
            self._sample_lines(block.split("\n"), first_line, index, rank_hint)
            return
        head = block[:PREFIX_SAMPLE].split("\n")[:-1]   # the last piece is cut mid-line
        self._sample_lines(head, first_line, index, rank_hint)
        tail = block[-PREFIX_SAMPLE:].split("\n")[1:]   # the first piece is cut mid-line
        last = first_line + block.count("\n") - (0 if block.endswith("\n") else -1)
        self._sample_lines(tail, last - len(tail) + 1, index, rank_hint)

    def _sample_lines(self, lines: list[str], line_no: int, index: int, rank_hint: int | None) -> None:
        for offset, raw in enumerate(lines):
            rank, rest = split_prefix(raw)
            owner = rank if rank is not None else rank_hint
            if not rest.strip():
                continue
            progressing = is_progress(rest)
            if progressing:
                self.progress[index] = max(self.progress.get(index, 0), line_no + offset)
            if owner is None:
                if progressing:
                    self.anonymous[index] = (line_no + offset, _line_time(rest), rest[-MAX_MESSAGE:])
                continue
            text = self.rank(owner)
            if text is None:
                continue
            if rank is not None:
                text.lines += 1
                if not _ENDING_ABORT.search(rest):
                    text.last_line = rest[-MAX_MESSAGE:]
            if not _NOT_ACTIVITY.search(rest):
                text.last_seen = (index, line_no + offset)
                text.last_seen_text = rest[-MAX_MESSAGE:]
                stamp = _line_time(rest)
                if stamp and (text.last_time is None or stamp > text.last_time):
                    text.last_time = stamp

    # -- tracebacks -----------------------------------------------------------------------------

    def _tracebacks(self, block: str, first_line: int, name: str, index: int, rank_hint: int | None) -> None:
        pos = block.find(TRACEBACK)
        while pos != -1:
            start = block.rfind("\n", 0, pos) + 1
            prefix = block[start:pos]
            if prefix and _carets_only(prefix):
                # Two processes on one console: this header was glued to the end of the other's caret line
                # (Python 3.11's "^^^^" under a frame); it is a traceback of its own, at the line's start.
                prefix = ""
            rank, _ = split_prefix(prefix)
            if rank is None and not prefix:
                # torch.multiprocessing.spawn: "-- Process 3 terminated with the following error:" above it.
                spawned = _SPAWNED.search(block[max(0, start - 200):start])
                rank = int(spawned.group(1)) if spawned else None
            if prefix.strip().startswith("traceback") and prefix.rstrip().endswith(":"):
                # torchrun's summary quotes the error file's traceback, indented, under its rank's entry.
                entry = _last(_SUMMARY_RANK, block[max(0, start - 600):start])
                prefix, rank = "  ", int(entry["rank"]) if entry else None
            line_no = first_line + block.count("\n", 0, start)
            pending = _Pending(prefix, rank if rank is not None else rank_hint, [], name, line_no, (index, line_no),
                               time=_time_before(block, start, prefix), chained=_after_chain_marker(block, start),
                               interleaved=(index, line_no) in self._interleaved_headers)
            named, end_of = prefix_span(prefix)
            if _FOREIGN_PREFIX.match(prefix) and prefix[end_of:].strip() == "":
                pending.varying, pending.by_prefix, pending.separator = True, named, len(prefix) - end_of
            end = block.find("\n", pos)
            if end == -1:
                self._pending.append(pending)
                return
            if not self._continue(pending, block, end + 1, line_no + 1):
                self._pending.append(pending)
            pos = block.find(TRACEBACK, end)

    def _continue(self, pending: _Pending, block: str, pos: int, line_no: int) -> bool:
        """Read the traceback's lines from pos; True when its exception line was found (or it was given up)."""
        while pos < len(block):
            end = block.find("\n", pos)
            end = len(block) if end == -1 else end
            raw = block[pos:end].rstrip("\r")
            pos, line_no = end + 1, line_no + 1
            pending.scanned += 1
            if pending.scanned > MAX_TRACEBACK_LINES:
                return True
            if pending.varying:
                named, end_of = prefix_span(raw)
                if named != pending.by_prefix or end_of == 0:
                    continue  # another rank's line, or output without the viewer's prefix
                rest = raw[end_of:]
                rest = rest[pending.separator:] if rest[:pending.separator].isspace() else rest
            elif not raw.startswith(pending.prefix):
                continue  # another rank's line interleaved
            else:
                rest = raw[len(pending.prefix):]
            if not rest.strip():
                continue
            if TRACEBACK in rest and _carets_only(rest[:rest.find(TRACEBACK)]):
                # Another process's traceback began (on its own line, or glued to a caret line of ours).
                if len(self._interleaved_headers) < MAX_INTERLEAVED:
                    self._interleaved_headers.add((pending.order[0], line_no - 1))
                pending.interleaved = True
                continue
            if rest[0] in " \t":
                frame = _FRAME.match(rest)
                if frame:
                    pending.frames.append(Frame(frame["file"], int(frame["line"]), (frame["fn"] or "").strip()))
                    del pending.frames[:-MAX_FRAMES]
                elif pending.frames and not pending.frames[-1].code and rest.strip().strip("^~ "):
                    last = pending.frames[-1]
                    pending.frames[-1] = Frame(last.file, last.line, last.function, rest.strip()[:MAX_MESSAGE])
                continue
            if pending.interleaved:
                rest = _untangled(rest)
                if rest is None or (pending.order[0], line_no - 1) in self._claimed:
                    continue  # the other traceback's line, or its exception line
                if len(self._claimed) < MAX_INTERLEAVED:
                    self._claimed.add((pending.order[0], line_no - 1))
            if not pending.frames and _EXCEPTION.match(rest.strip()) is None:
                # The rank's stdout, flushed after the traceback's first line reached stderr
                # (one console, two streams): the frames are still to come.
                continue
            self._raised(pending, rest, line_no - 1)
            return True
        return False

    def _raised(self, pending: _Pending, line: str, line_no: int) -> None:
        match = _EXCEPTION.match(line.strip())
        if match is None:
            return
        raised = RaisedText(match["type"], clean_quote((match["msg"] or "").strip()[:MAX_MESSAGE]),
                            tuple(pending.frames), pending.file, line_no, (pending.order[0], line_no),
                            time=_line_time(pending.prefix + line) or pending.time)
        if _launchers(raised):
            return
        if pending.chained:
            previous = self._last_error(pending.rank)
            if previous is not None and previous.order < raised.order:
                raised.inner = previous
        if pending.rank is None:
            # An exception without a rank prefix (torch < 2.2 printed none): torchrun's summary may say whose.
            if len(self.unattributed) < MAX_ERRORS:
                self.unattributed.append(raised)
            return
        text = self.rank(pending.rank)
        if text is not None and len(text.errors) < MAX_ERRORS:
            text.errors.append(raised)

    def _last_error(self, rank: int | None) -> RaisedText | None:
        if rank is None:
            return self.unattributed[-1] if self.unattributed else None
        text = self.ranks.get(rank)
        return text.errors[-1] if text is not None and text.errors else None

    def bare_exception(self, line: str, line_no: int, name: str, index: int, rank_hint: int | None) -> None:
        """An exception line of a rank (its prefix, or its file), kept in case no traceback header precedes it."""
        rank, rest = split_prefix(line)
        rank = rank if rank is not None else rank_hint
        match = _EXCEPTION.match(rest.strip())
        if rank is None or match is None or match["msg"] is None or rest[:1] in " \t":
            return
        if match["type"].rsplit(".", 1)[-1] in _LAUNCHER_TYPES:
            return
        text = self.rank(rank)
        if text is not None and len(text.bare) < MAX_ERRORS:
            text.bare.append(RaisedText(match["type"], clean_quote(match["msg"].strip()[:MAX_MESSAGE]), (), name,
                                        line_no, (index, line_no), time=_line_time(line)))

    # -- what each rank thinks the world is ------------------------------------------------------

    def _world_sizes(self, block: str, rank_hint: int | None) -> None:
        """`world_size=4`, `WORLD_SIZE: 4`, `world size 4` on a rank's own lines (its prefix or its file).

        torch's store barrier prints the world size it was given; so do most training scripts. The
        number is bounded (7 digits) and only lines that name their rank count.
        """
        for match in _WORLD_SIZE.finditer(block):
            if len(self._world_seen) >= MAX_WATCHDOG_LINES:
                return
            start = block.rfind("\n", 0, match.start()) + 1
            rank, _ = split_prefix(block[start:match.start()])
            rank = rank if rank is not None else rank_hint
            text = self.rank(rank) if rank is not None else None
            if text is not None and len(text.world_sizes) < 8:
                text.world_sizes.add(int(match.group(1)))
                self._world_seen.append(rank)

    # -- NCCL's watchdog ---------------------------------------------------------------------------

    def _watchdog(self, block: str, first_line: int, index: int, rank_hint: int | None) -> None:
        for token in WATCHDOG_TOKENS:
            pos = block.find(token)
            seen, counted, line_no = 0, 0, first_line
            while pos != -1 and seen < MAX_WATCHDOG_LINES:
                seen += 1
                start = block.rfind("\n", 0, pos) + 1
                line_no += block.count("\n", counted, start)
                counted = start
                end = block.find("\n", pos)
                line = block[start:end if end != -1 else len(block)][:2000]
                self._watchdog_line(line, rank_hint, (index, line_no))
                pos = block.find(token, end) if end != -1 else -1

    def _watchdog_line(self, line: str, rank_hint: int | None, where: tuple[int, int]) -> None:
        prefix_rank, _ = split_prefix(line)
        status = _WATCHDOG_STATUS.search(line)
        if status is not None:
            text = self.rank(int(status["rank"]))
            if text is None:
                return
            _complained(text, where, line)
            seq, enq, done = (status["seq"], status["enq"], status["done"]) if status["seq"] else \
                (status["seq2"], status["enq2"], status["done2"])
            text.watchdog.setdefault(status["pg"], (int(seq), _nonneg(enq), _nonneg(done)))
            return
        op = _WATCHDOG_OP.search(line)
        if op is None:
            return
        rank = int(op["rank"]) if op["rank"] else prefix_rank if prefix_rank is not None else rank_hint
        text = self.rank(rank) if rank is not None else None
        if text is not None:
            _complained(text, where, line)
            text.watchdog_ops.setdefault(int(op["seq"]), op["op"][:40])
            text.watchdog_line = text.watchdog_line or clean_quote(line[:MAX_MESSAGE])

    # -- torchrun's failure summary -------------------------------------------------------------------

    def _summaries(self, block: str) -> None:
        for token in (SUMMARY_TOKEN, OLD_SUMMARY_TOKEN):
            pos = block.find(token)
            while pos != -1:
                self._summary_entry(block, pos)
                end = block.find("\n", pos)
                pos = block.find(token, end) if end != -1 else -1

    def _summary_entry(self, block: str, pos: int) -> None:
        before = block[max(0, pos - 400):pos]
        after = block[pos:pos + 800]
        rank = _last(_SUMMARY_RANK, before)
        code = _SUMMARY_EXIT.match(after[after.find("exitcode"):]) if "exitcode" in after else None
        if rank is None or code is None:
            return  # the agent's own "failed (exitcode: 1) local_rank: 1" line, or a foreign text
        text = self.rank(int(rank["rank"]))
        if text is None:
            return
        self.summary_seen = True
        when = _last(_SUMMARY_TIME, before)
        host = _last(_SUMMARY_HOST, before)
        if host is not None and len(text.summary_hosts) < 8:
            text.summary_hosts.add(clean_quote(host["host"]))
        efile = _SUMMARY_FILE.search(after)
        tb = _SUMMARY_TB.search(after)
        signal = re.search(r"\((SIG[A-Z0-9]{2,10})\)", after.split("\n", 1)[0])
        entry_start = before.rfind("]:\n")
        text.exit = Exit(
            code=int(code["code"]), pid=int(code["pid"]), signal=signal.group(1) if signal else "",
            error_file=clean_quote(efile["file"].strip()) if efile else "",
            time=_epoch(when["time"]) if when else None, host=clean_quote(host["host"]) if host else "",
            local_rank=int(rank["local"]), root_cause="Root Cause" in before[max(0, entry_start - 60):],
            text=clean_quote(tb["tb"].strip()) if tb else "")


def _launchers(raised: RaisedText) -> bool:
    """The launcher's own exception (its summary of a child's failure), not a rank's."""
    name = raised.type.rsplit(".", 1)[-1]
    if name in _LAUNCHER_TYPES:
        return True
    return name == "CalledProcessError" and any(_LAUNCHER_FRAMES.search(f.file) for f in raised.frames)


def _after_chain_marker(block: str, start: int) -> bool:
    """Python's chain marker on the last non-blank line before a traceback's header (prefixes aside)."""
    end = start
    for _ in range(3):
        if end <= 0:
            return False
        begin = block.rfind("\n", 0, end - 1) + 1
        line = split_prefix(block[begin:end - 1])[1].strip()
        end = begin
        if line:
            return line in CHAINED
    return False


def _complained(text: RankText, where: tuple[int, int], line: str) -> None:
    if text.complained is None or where < text.complained:
        text.complained = where
        text.complained_time = _line_time(split_prefix(line)[1])


def is_progress(text: str) -> bool:
    """A line that shows a job at work (a progress bar, a step or loss line), not a failure."""
    return bool(_PROGRESS.search(text)) and not _NOT_ACTIVITY.search(text)


def prefix_span(line: str) -> tuple[int | None, int]:
    """(rank, where the prefixes end) without stripping what follows them: a frame keeps its indent."""
    rank, end = None, 0
    for _ in range(4):
        match = _PREFIX.match(line, end)
        if match is not None:
            rank = int((match["tr"] or match["mpi"] or match["srun"]).strip())
            end = match.end()
            continue
        foreign = _FOREIGN_PREFIX.match(line, end) if rank is None else None
        if foreign is None:
            break
        end = foreign.end()
    return rank, end


def split_prefix(line: str) -> tuple[int | None, str]:
    """(rank, the rest) of a line with a launcher's rank prefix; the innermost prefix names the rank."""
    rank = None
    rest = line
    for _ in range(4):
        match = _PREFIX.match(rest)
        if match is None:
            foreign = _FOREIGN_PREFIX.match(rest) if rank is None else None
            if foreign is None:
                break
            rest = rest[foreign.end():]  # a viewer's line number, Ray's worker tag, a container's name
            continue
        value = match["tr"] or match["mpi"] or match["srun"]
        rank = int(value.strip())
        rest = rest[match.end():].lstrip(" ") if match["tr"] or match["mpi"] else rest[match.end():]
    return rank, rest


def parse_traceback_text(text: str, file: str, rank: int, index: int = 0) -> RaisedText | None:
    """A traceback held in one string (an error file's py_callstack) -> its exception and frames."""
    collector = RankCollector()
    collector.start_source()
    collector.block(text if text.endswith("\n") else text + "\n", 1, file, index, rank)
    errors = collector.ranks.get(rank).errors if rank in collector.ranks else []
    return errors[-1] if errors else None


def finished_line(text: str) -> bool:
    """The last line says the loop ended ("done", "finished", "training complete")."""
    return bool(text) and bool(_FINISHED.search(text)) and "error" not in text.lower()


def _carets_only(text: str) -> bool:
    """Only Python 3.11's caret marks (or nothing) before a header: another process's caret line it was glued to."""
    return not text.strip(" \t^~")


def _untangled(line: str) -> str | None:
    """The exception line in a traceback interleaved with another's: the line itself, or one glued after
    the other's caret line (Python 3.11's "^^^^" under a frame, its characters mixed into ours); None for
    a line that is not an exception's (the other process's code, carets, output)."""
    if line[:1] in "^~":
        line = line.lstrip("^~ \t").replace("^", "")
    match = _EXCEPTION.match(line.strip())
    if match is None or (match["msg"] is None and not _EXCEPTION_NAME.search(match["type"])):
        return None
    return line


def _last_words(block: str) -> str:
    """The block's last line that is not the process's ending abort (among its last three)."""
    for line in block.rstrip("\n").rsplit("\n", 3)[::-1][:3]:
        if line.strip() and not _ENDING_ABORT.search(line):
            return line
    return ""


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = None
    for found in pattern.finditer(text):
        pass
    return found


def _nonneg(value: str | None) -> int | None:
    """A sequence number; -1 (nothing yet) is None."""
    number = int(value) if value is not None else -1
    return number if number >= 0 else None


def _epoch(stamp: str) -> float | None:
    """torchrun's summary time (local time, '2026-11-25_08:43:09') as epoch seconds."""
    try:
        return datetime.strptime(stamp, "%Y-%m-%d_%H:%M:%S").timestamp()
    except ValueError:
        return None


def _time_before(block: str, start: int, prefix: str, lines: int = 30) -> str | None:
    """When the rank failed: the timestamp of its nearest line before the traceback (a logger's, glog's).

    Python prints no time on a traceback; the line the rank logged just before it is the closest
    clock reading, and what orders two ranks' failures when both raised.
    """
    end = start
    for _ in range(lines):
        if end <= 0:
            return None
        begin = block.rfind("\n", 0, end - 1) + 1
        line = block[begin:end - 1]
        end = begin
        if line.startswith(prefix):
            stamp = _line_time(line[len(prefix):] if prefix.strip() else line)
            if stamp:
                return stamp
    return None


def _line_time(text: str) -> str | None:
    match = _LOG_TIME.search(text[:120])
    if match is None:
        return None
    if match["iso"]:
        return match["iso"].replace("T", " ").replace("_", " ").replace(",", ".")
    return f"{match['md'].zfill(4)} {match['hms']}"
