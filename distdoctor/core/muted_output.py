"""stdout and stderr that drop what chosen threads write: a site check's print() never reaches a report.

Site checks of the cross-rank stages run on threads of this process (they need its live process
groups), where a print() would land in the middle of a JSON report. While such a check runs,
sys.stdout and sys.stderr are proxies that drop the writes of its thread and pass every other
thread's through; they are put back once no muted thread is left (an abandoned thread stays muted).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Iterator

_LOCK = threading.Lock()
_MUTED: set[int] = set()


class _ThreadFilteredStream:
    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def write(self, text: str) -> int:
        if threading.get_ident() in _MUTED:
            return len(text)
        return self._wrapped.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)


def _install() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _ThreadFilteredStream):
            setattr(sys, name, _ThreadFilteredStream(stream))


def _uninstall() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _ThreadFilteredStream):
            setattr(sys, name, stream._wrapped)


@contextlib.contextmanager
def muted_thread() -> Iterator[None]:
    """Drop what the current thread writes to sys.stdout/sys.stderr inside the block."""
    ident = threading.get_ident()
    with _LOCK:
        _MUTED.add(ident)
        _install()
    try:
        yield
    finally:
        with _LOCK:
            _MUTED.discard(ident)
            if not _MUTED:
                _uninstall()
