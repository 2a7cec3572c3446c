"""What torch's C++ layer writes on a rank of distdoctor's own: kept off the terminal, summarised in the report."""

# A rank of `distdoctor check` (the self-test's, or one under a launcher) runs torch's c10d code:
# its store clients, gloo's rendezvous. At scale that code writes to file descriptor 2 directly
# (glog's "[W1127 ... socket.cpp:469] [c10d] waitForInput: ... timed out", C++ stack traces of a
# failed connect), dozens of lines per rank that land in the middle of the user's terminal. Here
# descriptor 2 goes to a file of the rank's own while Python's sys.stderr keeps the terminal (the
# pointer lines, the status line, a last word); what the file caught is summarised — lines that
# differ only in numbers counted as one — and travels with the rank's results, so that rank 0's
# report says what torch printed, on which ranks, as evidence (coll.I009).

from __future__ import annotations

import io
import os
import re
import sys
import tempfile
from typing import Any, Iterable, Mapping

from distdoctor.core.rank_groups import ranks_label, shape

# What one rank's summary carries: the most frequent distinct lines, each cut to this length.
MAX_SHAPES = 6
MAX_LINE_CHARS = 300
# Read at most this much of the file (a rank stuck in a retry loop can write megabytes).
MAX_READ_BYTES = 1 << 20
# glog's prefix: severity letter, date, time, thread/pid, file:line; torch 2.1-2.14 write
# "[W1127 07:10:06.614042676 socket.cpp:469] " or "W1127 07:10:06.614000 18430 file.py:1028] ".
_GLOG = re.compile(r"^\[?([IWEF])\d{4} [\d:.]+(?: +\d+)? [^\]]*\] ?")


class NativeOutput:
    """File descriptor 2 of this process, held in an unlinked file (nothing is left behind, whatever
    ends the process); sys.stderr stays the terminal's."""

    def __init__(self, read_fd: int, saved_fd: int, previous: Any) -> None:
        self._read_fd = read_fd
        self._saved_fd = saved_fd
        self._previous = previous

    @classmethod
    def capture(cls) -> "NativeOutput | None":
        """Send descriptor 2 to a file from now on; None when it cannot (no descriptor 2)."""
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError, AttributeError):
            return None
        try:
            handle, path = tempfile.mkstemp(prefix="distdoctor-native-", suffix=".log")
            os.unlink(path)
            os.dup2(handle, 2)
            terminal = io.TextIOWrapper(io.FileIO(os.dup(saved), "w"), encoding=getattr(sys.stderr, "encoding", None)
                                        or "utf-8", errors="backslashreplace", line_buffering=True)
        except OSError:
            os.close(saved)
            return None
        previous, sys.stderr = sys.stderr, terminal
        return cls(handle, saved, previous)

    def summary(self) -> dict[str, Any]:
        """{"lines": how many, "shapes": [[count, first line of that shape], ...]} of what was caught."""
        try:
            text = os.pread(self._read_fd, MAX_READ_BYTES, 0).decode("utf-8", "replace")
        except OSError:
            return {"lines": 0, "shapes": []}
        return summarise(text.splitlines())

    def restore(self) -> None:
        """Descriptor 2 back to where it was (the summary was taken before)."""
        try:
            sys.stderr.flush()
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            os.close(self._read_fd)
        except OSError:
            pass
        sys.stderr = self._previous


def summarise(lines: Iterable[str]) -> dict[str, Any]:
    """Lines -> their count and the most frequent shapes (glog's prefix off, numbers masked)."""
    counts: dict[str, list] = {}
    total = 0
    for line in lines:
        line = line.rstrip()
        if not line.strip():
            continue
        total += 1
        text = _GLOG.sub("", line)
        key = shape(text)
        if key in counts:
            counts[key][0] += 1
        else:
            counts[key] = [1, text[:MAX_LINE_CHARS]]
    shapes = sorted(counts.values(), key=lambda c: -c[0])[:MAX_SHAPES]
    return {"lines": total, "shapes": shapes}


def merged_lines(per_rank: Mapping[int, Mapping[str, Any]], limit: int = MAX_SHAPES) -> tuple[int, list[int], list[str]]:
    """Every rank's summary -> (lines in all, the ranks that wrote any, a few lines: each distinct
    text once, with how often and on which ranks)."""
    total, ranks = 0, []
    where: dict[str, list] = {}
    for rank, summary in sorted(per_rank.items()):
        count = summary.get("lines") if isinstance(summary, Mapping) else None
        if not isinstance(count, int) or count <= 0:
            continue
        total += count
        ranks.append(rank)
        for item in summary.get("shapes") or []:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)):
                continue
            key = shape(str(item[1]))
            entry = where.setdefault(key, [0, str(item[1])[:MAX_LINE_CHARS], []])
            entry[0] += item[0]
            entry[2].append(rank)
    top = sorted(where.values(), key=lambda e: -e[0])[:limit]
    lines = [f"{count}x on {ranks_label(on)}: {text}" for count, text, on in top]
    return total, ranks, lines
