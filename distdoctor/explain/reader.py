"""Read log files (or stdin) as text blocks, in bounded memory, refusing what is not a text log."""

# A log is read in blocks of about BLOCK_SIZE bytes cut at a line end, so memory does not grow with
# the file: a 100 MB log costs one block plus the partial line carried to the next. A single line
# longer than a block is cut (nobody's error message is a megabyte long; a binary blob would be).
#
# What is refused, with a message for the user (LogInputError, which the CLI turns into exit 2):
# a missing path, a directory, a FIFO or device (reading one could block forever: pipe it into
# `-` instead), an unreadable file and binary data (NUL bytes or mostly control characters).
# Text in another encoding is read, not refused: UTF-16 and UTF-32 (PowerShell's `>` writes
# UTF-16 with a byte-order mark; without one, the NUL bytes between ASCII letters tell it) are
# decoded; 8-bit text that is not UTF-8 (latin-1, cp1252, GBK ...) is read with the bytes that are
# not UTF-8 replaced, so the messages torch, NCCL and the launchers print in English read exactly
# and the check says what was replaced. An empty log is not refused: a rank that printed nothing
# is evidence (it hung or was killed before its first line).

from __future__ import annotations

import codecs
import collections
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from distdoctor.explain.sanitize import strip_controls

BLOCK_SIZE = 1 << 20
# A log larger than this is not scanned whole: its first HEAD_BYTES and its last TAIL_BYTES are, and
# the lines between are counted (line numbers stay true). Time is then bounded by reading the bytes,
# memory by the tail kept (a 10 GB log of a job that ran for days fails at its end).
HEAD_BYTES = 1 << 30
TAIL_BYTES = 64 << 20
# The middle of such a log is not scanned, but its failures are not lost: each block of it is searched
# for these texts (one bytes.find each), and the lines around a hit are scanned with their true line
# numbers, up to MIDDLE_WINDOWS windows of about MIDDLE_WINDOW_BYTES each per input, over the first
# MIDDLE_BYTES of the middle (each text costs about 0.3 s per GB searched; beyond, lines are counted only).
MIDDLE_BYTES = 2 << 30
MIDDLE_TOKENS = (b"Traceback (most recent call last)", b"Watchdog caught", b"Timeout at NCCL work", b"NCCL WARN",
                 b"ChildFailedError", b"exitcode", b"Socket Timeout", b"Segmentation fault", b"timed out")
MIDDLE_WINDOWS = 256
MIDDLE_WINDOW_BYTES = 32 << 10
STDIN_NAME = "<stdin>"
_ANSI = re.compile(r"\x1b\[[0-?]{0,64}[ -/]{0,8}[@-~]|\x1b\][^\x07\x1b\n]{0,4096}(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_.-]?([0-9]{1,7})(?![0-9])", re.I)
MAX_RANK_DIGITS = 7
MAX_DIRECTORY_FILES = 10_000


class LogInputError(Exception):
    """An input cannot be read as a text log; the message is meant for the user."""


@dataclass
class LogSource:
    """One input: a file path or stdin, and the rank its name suggests (rank3.log -> 3)."""

    name: str
    path: Path | None = None
    rank_hint: int | None = None
    # Filled while reading.
    lines: int = 0
    bytes: int = 0
    replaced_bytes: bool = False
    empty: bool = False
    stream: BinaryIO | None = field(default=None, repr=False)
    # Bytes already read from the stream (to tell a JSON report from a log) and not yet scanned.
    prefix: bytes = field(default=b"", repr=False)
    owns_stream: bool = False
    # Found by walking a directory given on the command line: an unreadable one is skipped, not fatal.
    in_directory: bool = False
    skip_reason: str = ""             # not read at all (a directory's files beyond the bound)
    json_read: bool = field(default=False, repr=False)
    json_objects: list | None = field(default=None, repr=False)
    encoding: str = "utf-8"           # what the text was read as (utf-16 and utf-32 are transcoded)
    not_utf8: bool = False            # 8-bit text in another encoding: its non-UTF-8 bytes were replaced
    # Only these lines (first, last; 1-based) are read: one attempt of a job torchelastic restarted.
    line_range: tuple[int, int] | None = None
    # Bytes of a huge input that were counted, not scanned (between its head and its tail).
    skipped_bytes: int = 0


def rank_from_name(path: Path) -> int | None:
    """rank3.log, job-rank_12.err -> the rank; torchrun --log-dir's attempt_0/<local rank>/stderr.log too."""
    match = _RANK_IN_NAME.search(path.name)
    if match:
        return int(match.group(1))
    parent = path.parent.name
    if path.name in ("stdout.log", "stderr.log", "error.json") and parent.isascii() and parent.isdigit() \
            and len(parent) <= MAX_RANK_DIGITS:
        return int(parent)
    # mpirun --output-filename DIR: DIR/1/rank.3/stdout
    match = _RANK_IN_NAME.search(parent) if path.name in ("stdout", "stderr") else None
    return int(match.group(1)) if match else None


def peek(source: LogSource, size: int) -> bytes:
    """The first bytes of an input, kept so that iter_blocks still yields them."""
    if source.stream is None:
        try:
            source.stream = open(source.path, "rb")  # type: ignore[arg-type]
            source.owns_stream = True
        except OSError as exc:
            raise LogInputError(f"{source.name}: cannot open ({exc.strerror or exc})") from None
    try:
        source.prefix = source.stream.read(size)
    except OSError as exc:
        raise LogInputError(f"{source.name}: read failed ({exc.strerror or exc})") from None
    return source.prefix


def open_sources(inputs: list[str], stdin: BinaryIO | None = None) -> list[LogSource]:
    """Check every input up front, so that a typo in the 5th path fails before any work."""
    if not inputs:
        raise LogInputError("no log given: pass one or more files, or - to read stdin")
    sources: list[LogSource] = []
    if inputs.count("-") > 1:
        raise LogInputError("'-' (stdin) can be given only once")
    for item in inputs:
        if item == "-":
            stream = stdin if stdin is not None else sys.stdin.buffer
            if stdin is None and sys.stdin.isatty():
                raise LogInputError("'-' reads the log from stdin, but stdin is a terminal: pipe a log in (… | distdoctor explain -)")
            sources.append(LogSource(name=STDIN_NAME, stream=stream))
            continue
        path = Path(item)
        # The name is shown (evidence, messages): a file name can carry escape sequences too.
        item = strip_controls(item)
        try:
            info = path.stat()
        except FileNotFoundError:
            raise LogInputError(f"{item}: no such file") from None
        except PermissionError:
            raise LogInputError(f"{item}: permission denied") from None
        except OSError as exc:
            raise LogInputError(f"{item}: cannot read ({exc.strerror or exc})") from None
        if stat.S_ISDIR(info.st_mode):
            found = directory_sources(path, item)
            if not found:
                raise LogInputError(f"{item}: is an empty directory (no files to read)")
            sources += found
            continue
        if not stat.S_ISREG(info.st_mode):
            # A FIFO with no writer (or a device) would block or never end: refuse, say how instead.
            raise LogInputError(f"{item}: is not a regular file (a pipe, socket or device); "
                                f"feed it through stdin instead: cat {item} | distdoctor explain -")
        if not os.access(path, os.R_OK):
            raise LogInputError(f"{item}: permission denied")
        sources.append(LogSource(name=item, path=path, rank_hint=rank_from_name(path)))
    return sources


def directory_sources(path: Path, shown: str) -> list[LogSource]:
    """Every regular file under a directory (torchrun --log-dir's tree, a folder of per-rank logs and dumps).

    Bounded: at most MAX_DIRECTORY_FILES files are read; the walk itself stops soon after, and the
    report says how many were left.
    """
    found: list[LogSource] = []
    left = 0
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = Path(root) / name
            if len(found) >= MAX_DIRECTORY_FILES:
                left += 1
                continue
            try:
                if not stat.S_ISREG(full.stat().st_mode):
                    continue  # FIFOs, sockets, devices in a log folder are not logs (a FIFO would block)
            except OSError:
                continue  # a dangling link, a file gone since the walk
            shown_name = strip_controls(str(Path(shown) / full.relative_to(path)))
            found.append(LogSource(name=shown_name, path=full, rank_hint=rank_from_name(full), in_directory=True))
        if left > MAX_DIRECTORY_FILES:
            break  # a directory of millions of files: do not walk it all just to count
    if left:
        found.append(LogSource(name=shown, in_directory=True,
                               skip_reason=f"{left}{'+' if left > MAX_DIRECTORY_FILES else ''} more files not read "
                               f"(at most {MAX_DIRECTORY_FILES} per directory)"))
    return found


def _looks_binary(sample: bytes) -> bool:
    if b"\x00" in sample:
        return True
    # Control bytes other than tab, newline, carriage return, form feed and escape (colour codes).
    control = sum(1 for b in sample if b < 32 and b not in (9, 10, 12, 13, 27)) + sample.count(0x7F)
    return control > max(8, len(sample) // 100)


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def wide_encoding(sample: bytes) -> str | None:
    """UTF-16/32 by its byte-order mark, or UTF-16 without one by the NULs between ASCII letters."""
    for bom, encoding in _BOMS:
        if sample.startswith(bom):
            return None if encoding == "utf-8-sig" else encoding
    sample = sample[:4096]
    if len(sample) < 8:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    half = len(sample) // 2
    if odd > half * 0.4 and even < half * 0.05:
        return "utf-16-le"
    if even > half * 0.4 and odd < half * 0.05:
        return "utf-16-be"
    return None


class _Transcoded:
    """A UTF-16/32 byte stream read as UTF-8 bytes, one bounded chunk at a time."""

    def __init__(self, raw: BinaryIO, encoding: str, head: bytes) -> None:
        self._raw = raw
        self._decoder = codecs.getincrementaldecoder(encoding)("replace")
        self._pending = self._decoder.decode(head).encode("utf-8")
        self._done = False

    def read(self, size: int) -> bytes:
        while len(self._pending) < size and not self._done:
            chunk = self._raw.read(size)
            self._done = not chunk
            self._pending += self._decoder.decode(chunk, final=self._done).encode("utf-8")
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def close(self) -> None:
        self._raw.close()


def _check_first_block(source: LogSource, data: bytes) -> None:
    sample = data[:65536]
    if _looks_binary(sample):
        raise LogInputError(f"{source.name}: looks like binary data, not a text log")
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    try:
        decoder.decode(sample, final=len(data) <= len(sample))
    except UnicodeDecodeError:
        # 8-bit text in another encoding: its ASCII (every message torch prints) reads exactly.
        source.not_utf8 = source.replaced_bytes = True


def iter_blocks(source: LogSource, block_size: int = BLOCK_SIZE) -> Iterator[tuple[str, int]]:
    """Yield (text, number of the block's first line), each block ending at a line end; only the lines
    of source.line_range when it is set (line numbers stay those of the whole input).

    Raises LogInputError for input that is not a text log (checked on the first block).
    """
    if source.line_range is None:
        yield from _blocks(source, block_size)
        return
    first, last = source.line_range
    for text, line_no in _blocks(source, block_size):
        end = line_no + text.count("\n") - 1
        if end < first:
            continue
        if line_no > last:
            return
        start = _nth_line(text, first - line_no) if line_no < first else 0
        stop = _nth_line(text, last - line_no + 1) if end > last else len(text)
        if start < stop:
            yield text[start:stop], max(line_no, first)


def _nth_line(text: str, n: int) -> int:
    """Where the n-th line (0-based) of text starts."""
    pos = 0
    for _ in range(n):
        pos = text.find("\n", pos) + 1
        if pos == 0:
            return len(text)
    return pos


def _blocks(source: LogSource, block_size: int) -> Iterator[tuple[str, int]]:
    opened = source.stream is None or source.owns_stream
    try:
        stream = source.stream if source.stream is not None else open(source.path, "rb")  # type: ignore[arg-type]
    except OSError as exc:
        raise LogInputError(f"{source.name}: cannot open ({exc.strerror or exc})") from None
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    carry = b""
    first = True
    line_no = 1
    try:
        while True:
            try:
                chunk = stream.read(block_size)
            except OSError as exc:
                raise LogInputError(f"{source.name}: read failed ({exc.strerror or exc})") from None
            if source.prefix:
                chunk, source.prefix = source.prefix + chunk, b""
            if first:
                first = False
                wide = wide_encoding(chunk)
                if wide is not None:
                    source.encoding = wide
                    stream = _Transcoded(stream, wide, chunk)  # type: ignore[assignment]
                    chunk = stream.read(block_size)
                elif chunk.startswith(codecs.BOM_UTF8):
                    chunk = chunk[len(codecs.BOM_UTF8):]
                if not chunk.strip() and len(chunk) < block_size:
                    source.empty = True  # evidence, not an error: the caller records it
                    return
                _check_first_block(source, chunk)
            if not chunk:
                if carry:
                    yield from _emit(source, decoder, carry, line_no, final=True)
                return
            source.bytes += len(chunk)
            if source.bytes > HEAD_BYTES and source.line_range is None:
                # A log too large to read whole: its head was read; the middle is counted, the tail read.
                yield from _skip_to_tail(source, stream, carry + chunk, decoder, block_size)
                return
            data = carry + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                # One line longer than a block: treat the block as a line of its own.
                if len(data) >= block_size:
                    cut = len(data)
                else:
                    carry = data
                    continue
            carry = data[cut:]
            for text, count in _emit(source, decoder, data[:cut], line_no, final=False):
                yield text, count
            line_no = source.lines + 1
    finally:
        if opened:
            stream.close()


def _skip_to_tail(source: LogSource, stream, pending: bytes, decoder, block_size: int) -> Iterator[tuple[str, int]]:
    """Past HEAD_BYTES: read on without scanning, counting lines, keeping the last TAIL_BYTES; then scan
    them (from their first whole line), with their true line numbers. Time stays that of reading the
    bytes (no matching); memory that of the tail kept."""
    tail: collections.deque[bytes] = collections.deque()
    kept = 0
    windows = [MIDDLE_WINDOWS]
    while True:
        tail.append(pending)
        kept += len(pending)
        while len(tail) > 1 and kept - len(tail[0]) >= TAIL_BYTES:
            dropped = tail.popleft()
            kept -= len(dropped)
            if windows[0] > 0 and source.skipped_bytes < MIDDLE_BYTES:
                yield from _middle_windows(source, dropped, windows)
            source.lines += dropped.count(b"\n")
            source.skipped_bytes += len(dropped)
        try:
            pending = stream.read(block_size)
        except OSError as exc:
            raise LogInputError(f"{source.name}: read failed ({exc.strerror or exc})") from None
        if not pending:
            break
        source.bytes += len(pending)
    data = b"".join(tail)
    start = data.find(b"\n") + 1 if source.skipped_bytes else 0
    source.lines += data.count(b"\n", 0, start)
    source.skipped_bytes += start
    decoder.reset()
    pos = start
    while pos < len(data):
        end = min(pos + block_size, len(data))
        if end < len(data):
            newline = data.rfind(b"\n", pos, end)
            end = newline + 1 if newline >= pos else end  # blocks end at a line end (a longer line is cut)
        yield from _emit(source, decoder, data[pos:end], source.lines + 1, final=end >= len(data))
        pos = end


def _middle_windows(source: LogSource, chunk: bytes, budget: list[int]) -> Iterator[tuple[str, int]]:
    """The lines around each failure text in a chunk of a huge log's middle, as blocks with their true
    line numbers (source.lines is the count of lines before the chunk). A window is cut at line ends
    inside the chunk; overlapping ones are merged; budget[0] counts the windows left for this input."""
    spans: list[list[int]] = []
    for token in MIDDLE_TOKENS:
        hit = chunk.find(token)
        while hit != -1 and len(spans) < budget[0]:
            start = chunk.rfind(b"\n", 0, max(0, hit - MIDDLE_WINDOW_BYTES // 2)) + 1
            end = chunk.find(b"\n", min(len(chunk), hit + MIDDLE_WINDOW_BYTES // 2))
            spans.append([start, len(chunk) if end == -1 else end + 1])
            hit = chunk.find(token, spans[-1][1])
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    for start, end in merged[:budget[0]]:
        budget[0] -= 1
        text = chunk[start:end].decode("utf-8", "replace")
        text = _ANSI.sub("", text) if "\x1b" in text else text
        yield (text if text.endswith("\n") else text + "\n"), source.lines + chunk.count(b"\n", 0, start) + 1


def _emit(source: LogSource, decoder: codecs.IncrementalDecoder, data: bytes, line_no: int, *, final: bool):
    text = decoder.decode(data, final=final)
    if "\ufffd" in text and not source.replaced_bytes and b"\xef\xbf\xbd" not in data:
        source.replaced_bytes = True
    if "\x1b" in text:
        # Colours and terminal titles around a rank's prefix would hide it: dropped before anything reads
        # the block (never a newline: line numbers stay true).
        text = _ANSI.sub("", text)
    if not text.endswith("\n"):
        text += "\n"
    source.lines += text.count("\n")
    yield text, line_no
