"""A job torchelastic restarted (--max-restarts) logs several attempts: where each one starts and ends."""

# torchrun runs the worker group again after a failure while restarts are left; its console then
# holds every attempt, one after the other, and --log-dir holds one attempt_<N> directory each
# (torch/distributed/elastic/multiprocessing/api.py). Each attempt is read on its own: the job ended
# the way its last attempt did, and an earlier attempt's failure is its own story (the first may
# have raised in the training loop, the restart failed to even connect).
#
# Where an attempt ends, in torch's own words (torch/distributed/elastic):
#   - multiprocessing/api.py, at ERROR level (always printed): the agent's line for the attempt's
#     first failed worker, `failed (exitcode: C) local_rank: R (pid: P) of binary: ...`;
#   - agent/server/api.py, at INFO level (LOGLEVEL=INFO): `[<role>] Worker group FAILED. N/M attempts
#     left; will restart worker group`, and the next attempt's `Rendezvous complete for workers.
#     Result:` block with `restart_count=N`.
# The last attempt's failed line is followed by torchrun's own traceback and its failure summary
# (the launcher reporting, not a new attempt): an attempt starts after a failed line only when a
# worker's line follows it, or a `restart_count=` of 1 or more. A worker's line alone is not enough
# (--tee's output of a SIGTERMed rank can be flushed after the agent's line): the attempt it starts
# must itself end with another failed line, or the job must end without torchrun's failure summary
# (the restart ran to its end).

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field, replace
from typing import BinaryIO

from distdoctor.explain.presence import BlockWords, may_hold

AGENT_FAILED = "failed (exitcode: "
WILL_RESTART = "will restart worker group"
RESTART_COUNT = "restart_count="
SUMMARY = "ChildFailedError"
_AGENT_FAILED = re.compile(r"\] failed \(exitcode: -?\d{1,4}\) local_rank: \d{1,7}")
_RESTART_COUNT = re.compile(r"(?:^|\]) {0,4}restart_count=(\d{1,6})\s*$")
# The launcher talking: torchelastic's own log lines (glog-style, from torch/distributed/...), the
# indented fields of its "Result:" block, and blank lines.
_LAUNCHER_LINE = re.compile(r"^\s*$|^[IWE]\d{3,4} [\d:.]{8,20} +\d{1,9} .{0,200}torch[/\\]distributed[/\\]|"
                            r"^\s{2}\w{1,40}=|^\[\w{1,40}\] (?:Rendezvous|Starting|Stopping|Worker group)")
# The launcher's own traceback at the very end (torchrun's entry point raising ChildFailedError).
_LAUNCHER_FRAME = re.compile(r'File "(?:<frozen runpy>|[^"]{0,400}(?:bin[/\\]torchrun|torch[/\\]distributed[/\\]'
                             r'(?:run|launch)\.py|distributed[/\\]launcher[/\\]api\.py|accelerate|deepspeed))')
LOOKAHEAD_LINES = 64        # lines read after a failed line to see what follows it
MAX_ATTEMPTS = 16           # attempts read apart (a job restarted more often: the last ones)
_ATTEMPT_DIR = re.compile(r"(?:^|[/\\])attempt_(\d{1,6})(?:[/\\]|$)")


@dataclass
class Marks:
    """One input's attempt boundaries: (line, restart_count or None) where a new attempt starts."""

    starts: list[tuple[int, int | None]] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)      # the agent's failed lines
    summaries: list[int] = field(default_factory=list)   # torchrun's failure summaries (ChildFailedError)
    _pending_end: int | None = None      # a failed line whose follower is in the next block

    def block(self, block: str, first_line: int, words: BlockWords | None = None) -> None:
        """``words``: what the scan found the block holds (a text it cannot hold is not searched)."""
        if self._pending_end is not None:
            self._follow(block, 0, first_line, self._pending_end)
        for token in (AGENT_FAILED, WILL_RESTART, RESTART_COUNT, SUMMARY):
            pos = block.find(token) if may_hold(words, token) else -1
            while pos != -1 and len(self.starts) < 4 * MAX_ATTEMPTS:
                start = block.rfind("\n", 0, pos) + 1
                end = block.find("\n", pos)
                end = len(block) if end == -1 else end
                line_no = first_line + block.count("\n", 0, start)
                line = block[start:end]
                if token == SUMMARY:
                    if len(self.summaries) < 4 * MAX_ATTEMPTS:
                        self.summaries.append(line_no)
                elif token == RESTART_COUNT:
                    count = _RESTART_COUNT.search(line)
                    if count and int(count.group(1)) > 0:
                        self._add(line_no - 1, int(count.group(1)))  # its "Rendezvous complete" line above
                elif token == WILL_RESTART or _AGENT_FAILED.search(line):
                    if token == AGENT_FAILED:
                        self.failed.append(line_no)
                    self._follow(block, end + 1, line_no + 1, line_no)
                pos = block.find(token, end)

    def _follow(self, block: str, pos: int, line_no: int, end_line: int) -> None:
        """What follows an attempt's end: a worker's line starts the next attempt; the launcher's own
        traceback or summary (or nothing) does not."""
        self._pending_end = None
        for _ in range(LOOKAHEAD_LINES):
            if pos >= len(block):
                self._pending_end = end_line  # the next block holds what follows
                return
            end = block.find("\n", pos)
            end = len(block) if end == -1 else end
            line = block[pos:end].rstrip("\r")
            if not _LAUNCHER_LINE.search(line):
                if line.startswith("Traceback (most recent call last)") and _LAUNCHER_FRAME.search(block[end:end + 600]):
                    return  # torchrun reporting the job's failure: the last attempt's end
                if "ChildFailedError" in line or line.startswith("="):
                    return
                self._add(line_no, None)
                return
            pos, line_no = end + 1, line_no + 1

    def _add(self, line_no: int, count: int | None) -> None:
        # An end and the next attempt's "restart_count=" block describe one boundary: keep the first line.
        for i, (line, known) in enumerate(self.starts):
            if abs(line - line_no) <= LOOKAHEAD_LINES:
                self.starts[i] = (min(line, line_no), known if known is not None else count)
                return
        self.starts.append((line_no, count))

    def segments(self, lines: int) -> list[tuple[int, int, int]]:
        """(attempt number, first line, last line) of each attempt, in order; one when there is none."""
        starts = sorted(s for s in self.starts if 1 < s[0] <= lines and self._confirmed(s))
        if not starts:
            return [(0, 1, lines)]
        out, begin, number = [], 1, 0
        for line, count in starts:
            out.append((number, begin, line - 1))
            begin, number = line, count if count is not None else number + 1
        out.append((number, begin, lines))
        return out[-MAX_ATTEMPTS:]


    def _confirmed(self, start: tuple[int, int | None]) -> bool:
        """A start torch named (restart_count=N), or one whose attempt ended with the agent's failed line
        too, or followed by no failure summary (the restart ran to its end)."""
        line, count = start
        return count is not None or any(f > line for f in self.failed) or not any(s > line for s in self.summaries)


def attempt_of_path(name: str) -> int | None:
    """torchrun --log-dir's attempt_<N> directory in a file's path, if any."""
    match = _ATTEMPT_DIR.search(name)
    return int(match.group(1)) if match else None


# -- reading the attempts apart ------------------------------------------------------------------------

# stdin is read once; a job's attempts are read again from a copy kept while it was read, up to this
# size (a larger stdin is read as one job, and the report says its attempts were not told apart).
MAX_STDIN_COPY = 64 << 20


class StdinCopy:
    """stdin as it is read, copied (to memory, then a temporary file) so its attempts can be read again."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.copy = tempfile.SpooledTemporaryFile(max_size=8 << 20)
        self.size = 0
        self.complete = True

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if self.complete:
            if self.size + len(data) > MAX_STDIN_COPY:
                self.complete = False
                self.copy.truncate(0)
            else:
                self.copy.write(data)
                self.size += len(data)
        return data

    def reader(self) -> "_CopyReader":
        return _CopyReader(self.copy)

    def close(self) -> None:
        self.copy.close()


class _CopyReader:
    """One more read of the copy from its start (each attempt's reading has its own position)."""

    def __init__(self, copy) -> None:
        self._copy, self._pos = copy, 0

    def read(self, size: int = -1) -> bytes:
        self._copy.seek(self._pos)
        data = self._copy.read(size)
        self._pos += len(data)
        return data

    def close(self) -> None:
        pass


def keep_stdin(sources: list) -> StdinCopy | None:
    """stdin among the inputs: read through a copy, for its attempts' second reading."""
    for source in sources:
        if source.path is None and source.stream is not None and not source.skip_reason:
            copy = StdinCopy(source.stream)
            source.stream = copy
            return copy
    return None


def split_attempts(sources: list, marks: dict[int, Marks], stdin: StdinCopy | None) -> list[tuple[int, list]]:
    """(attempt number, the inputs of that attempt) for a job whose inputs hold several attempts, else [].

    A console log is cut at its attempts' boundaries; a --log-dir tree's files go to their attempt_<N>;
    inputs that say nothing of attempts (an error file given alone, a report) go with the last attempt."""
    per_input: dict[int, list[tuple[int, int, int]]] = {}
    for index, source in enumerate(sources):
        found = marks.get(index)
        if found is None or (source.path is None and (stdin is None or not stdin.complete)):
            continue
        if source.skipped_bytes:
            continue  # too large to read whole: its attempts are read as one job (reading it again would not be)
        segments = found.segments(source.lines)
        if len(segments) > 1:
            per_input[index] = segments
    by_dir = {i: attempt_of_path(s.name) for i, s in enumerate(sources) if i not in per_input}
    by_dir = {i: n for i, n in by_dir.items() if n is not None}
    numbers = sorted({n for segs in per_input.values() for n, _, _ in segs} | set(by_dir.values()))
    if len(numbers) < 2:
        return []
    numbers = numbers[-MAX_ATTEMPTS:]
    out = []
    for number in numbers:
        part = []
        for index, source in enumerate(sources):
            if index in per_input:
                part += [_window(source, stdin, first, last) for n, first, last in per_input[index] if n == number]
            elif index in by_dir:
                if by_dir[index] == number:
                    part.append(_window(source, stdin, None, None))
            elif number == numbers[-1]:
                part.append(_window(source, stdin, None, None))
        out.append((number, part))
    return [(n, part) for n, part in out if part]


def _window(source, stdin: StdinCopy | None, first: int | None, last: int | None):
    """A fresh input over the same file (or stdin's copy), limited to these lines."""
    copy = replace(source, lines=0, bytes=0, replaced_bytes=False, empty=False, prefix=b"", json_read=False,
                   json_objects=None, owns_stream=False, encoding="utf-8", not_utf8=False,
                   line_range=(first, last) if first is not None else None)
    copy.stream = stdin.reader() if source.path is None and stdin is not None else None
    return copy


def mark_last_attempt(findings: list, number: int, count: int) -> list:
    """The job's answer is its last attempt's: said in the top finding."""
    if not findings:
        return findings
    top = findings[0]
    note = (f"This is attempt {number} of the job (restart_count={number}), the last of the {count} attempts its "
            "logs show: the job ended this way. The earlier attempts and their own causes are listed in log.I041.")
    if top.id == "log.W030":
        note = (f"This is attempt {number} of the job (restart_count={number}), the last of the {count} attempts its "
                "logs show, and it shows no failure: torchelastic's restart got past what ended the earlier "
                "attempts (listed in log.I041).")
    data = {**top.data, "attempt": number, "attempts": count}
    return [top.with_(detail=f"{note}\n{top.detail}" if top.detail else note, data=data)] + findings[1:]


def earlier_attempts_finding(runs: list[tuple[int, list]], last: int, catalog):
    """One finding listing each earlier attempt with what ended it."""
    kind = catalog.kinds["log.I041"]
    lines, attempts = [], []
    for number, findings in runs:
        top = findings[0] if findings else None
        if top is None:
            continue
        candidates = [c["cause"] for c in top.data.get("candidates", [])][:3]
        ranks = f" (rank{'s' if len(top.ranks) > 1 else ''} {', '.join(map(str, top.ranks[:8]))})" if top.ranks else ""
        lines.append(f"  attempt {number}: {top.id} [{top.cause}] {top.title}{ranks}"
                     + (f" — candidates: {', '.join(candidates)}" if candidates else ""))
        attempts.append({"attempt": number, "id": top.id, "cause": top.cause, "title": top.title,
                         "ranks": list(top.ranks), "confidence": top.confidence, "candidates": candidates,
                         "evidence": list(top.data.get("evidence") or [])[:2]})
    return kind(
        f"torchelastic restarted the job: {len(runs)} earlier attempt{'s' if len(runs) != 1 else ''} before attempt "
        f"{last}, each read on its own",
        detail="\n".join(["Each attempt's own first failure (the job's end is the last attempt's, above):", *lines]),
        remediation="Fix the last attempt's cause first (it is why the job ended); an earlier attempt's cause is "
        "why torchelastic restarted it, and may return once the last is fixed.",
        data={"signature": "earlier_attempts", "role": "context", "attempts": attempts, "evidence": []},
        check="explain", confidence=None)
