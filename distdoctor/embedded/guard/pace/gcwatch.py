"""Python's garbage collector timed from gc.callbacks: how long, how often, and whether it runs right now."""

# A full collection of a large heap takes tens of milliseconds with the GIL held; when it falls on
# different steps on different ranks, each one makes every peer wait. gc.callbacks (Python 3.3+)
# calls back at the start and the stop of every collection, in the thread that collects: two
# perf_counter reads each (about a microsecond), with gen-0 collections every few hundred
# allocations. A collection holds the GIL, so no sample of the main thread falls inside one: a
# collection of the main thread that took at least LONG_NS is handed to `on_long` with the frame that
# triggered it (the profile gives it its own line), and `total_ns` lets the sampler take every
# collection's time out of the interval it samples. Nothing here may import: a collection can run in
# the middle of an import, and an import from inside it breaks that one (CPython 3.11's module locks:
# "KeyError" in importlib._bootstrap, seen in nanoGPT's start-up).

from __future__ import annotations

import gc
import sys
import threading
import time
from typing import Any, Callable

LONG_NS = 1_000_000


class GcWatch:
    """Collections of generations 1 and 2 since the last take: their time (ns), count, full (generation 2) ones."""

    def __init__(self) -> None:
        self.active = False
        self.ns = self.count = self.full = 0
        self.total_ns = 0                 # never taken: the sampler's own account
        self._started = 0
        self.installed = False
        self.enabled = True
        self.main = threading.main_thread().ident
        self.on_long: Callable[[Any, int], None] | None = None

    def __call__(self, phase: str, info: Any) -> None:
        if not self.enabled or info.get("generation") == 0:
            # The youngest generation is collected every few hundred allocations, in microseconds: not timed,
            # so that the callback costs a step next to nothing.
            self.active = False
            return
        if phase == "start":
            self._started, self.active = time.perf_counter_ns(), True
            return
        if self.active:
            spent = time.perf_counter_ns() - self._started
            self.ns += spent
            self.total_ns += spent
            self.count += 1
            if info.get("generation") == 2:
                self.full += 1
            if spent >= LONG_NS and self.on_long is not None and threading.get_ident() == self.main:
                try:
                    frame = sys._getframe(1)
                except ValueError:  # a collection with no Python frame above it (the interpreter's end)
                    frame = None
                if frame is not None:
                    self.on_long(frame, spent)
        self.active = False

    def install(self) -> bool:
        callbacks = getattr(gc, "callbacks", None)
        if not isinstance(callbacks, list):
            return False
        callbacks.append(self)
        self.installed = True
        return True

    def uninstall(self) -> None:
        if self.installed:
            try:
                gc.callbacks.remove(self)
            except ValueError:
                pass
            self.installed = False

    def take(self) -> tuple[int, int, int]:
        """(ns, collections, full collections) since the last take."""
        out = (self.ns, self.count, self.full)
        self.ns = self.count = self.full = 0
        return out
