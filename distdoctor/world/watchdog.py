"""The run's overall deadline, enforced from a thread that no hang can block.

A collective stuck in C++ (a gloo or NCCL wait, a destroy_process_group that never returns)
cannot be interrupted from Python. So when the deadline passes, the watchdog thread itself ends
the run: it calls ``on_expire`` (rank 0 renders the partial report naming the stuck stage and
the ranks that did not finish it; other ranks stay quiet), flushes, and ends the process with
``os._exit(3)`` -- or with the code ``on_expire`` returns, when the run had in fact just
reported by itself. A second, independent timer guarantees the exit even if ``on_expire`` itself
blocks (a store that no longer answers), so the process never outlives ``deadline + grace``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

from distdoctor.core.report import EXIT_INCOMPLETE

# How long on_expire may take (render a report, read a few store keys) before the hard exit.
EXPIRE_GRACE_S = 2.0


def flush_std_streams() -> None:
    """Flush stdout and stderr before an os._exit (which skips Python's own flushing)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass


class Watchdog:
    def __init__(
        self,
        deadline: float,
        on_expire: Callable[[], int | None] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], None] = os._exit,
        grace_s: float = EXPIRE_GRACE_S,
        name: str = "distdoctor-watchdog",
    ) -> None:
        self.deadline = deadline
        self.on_expire = on_expire
        self.clock = clock
        self._exit = exit
        self.grace_s = grace_s
        self.name = name
        self.fired = threading.Event()
        self._cancelled = threading.Event()
        self._thread: threading.Thread | None = None
        self._exiting = threading.Lock()

    def start(self) -> "Watchdog":
        self._thread = threading.Thread(target=self._watch, name=self.name, daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """The run finished in time (or exits by itself): never fire."""
        self._cancelled.set()

    def __enter__(self) -> "Watchdog":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def _watch(self) -> None:
        while not self._cancelled.is_set():
            left = self.deadline - self.clock()
            if left <= 0:
                break
            self._cancelled.wait(min(left, 0.5))
        if self._cancelled.is_set():
            return
        self.fired.set()
        backstop = threading.Timer(self.grace_s, self._hard_exit)
        backstop.daemon = True
        backstop.start()
        code = EXIT_INCOMPLETE
        try:
            if self.on_expire is not None:
                returned = self.on_expire()
                if isinstance(returned, int) and not isinstance(returned, bool):
                    code = returned
        except BaseException as exc:  # the exit below must happen whatever went wrong
            try:
                sys.stderr.write(f"distdoctor: the watchdog could not write the partial report: {exc}\n")
            except Exception:
                pass
        self._hard_exit(code)

    def _hard_exit(self, code: int = EXIT_INCOMPLETE) -> None:
        if not self._exiting.acquire(blocking=False):
            return  # the backstop and the normal path both end up here; exit once
        flush_std_streams()
        self._exit(code)
