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

from distdoctor.core.findings import Finding
from distdoctor.core.kinds import DEADLINE_TOO_SHORT
from distdoctor.core.progress import running_checks  # noqa: F401  (re-exported for the world)
from distdoctor.core.report import EXIT_INCOMPLETE

# How long on_expire may take (render a report, read a few store keys) before the hard exit.
EXPIRE_GRACE_S = 2.0
# Once on_expire says it is writing its report (bounded work: build and print, each store read under
# its own deadline), the hard exit waits this much longer for it, once: a loaded machine (a rank
# importing torch on a busy core holds the interpreter for seconds) must not turn a late report into
# no report at all.
WRITE_GRACE_S = 2.0


# The least working time a world needs once its ranks run: open the store, check in, let rank 0
# decide, form a gloo group and run the collectives (about 0.3 s on an idle 2-core machine).
MIN_WORLD_S = 1.0
# What a self-test needs before it starts its ranks: the above, plus forking them and their
# import of torch.distributed and local stage (about 0.5 s idle).
MIN_SELFTEST_S = 2.0
# What the local stage needs at the least (its probes: interfaces, DNS, ports).
MIN_LOCAL_S = 0.5


def too_little_time(stage: str, left: float, need: float, timeout: float, why: str = "") -> tuple[str, Finding]:
    """The skip reason and the finding for a stage that the deadline leaves too little time for.

    Running out of time is never a finding about the network or the job: this names the stage
    that was not run, the time left, and what the stage needs.
    """
    left = max(left, 0.0)
    reason = (f"skipped: {left:.1f}s of the {timeout:g}s deadline were left, too little for the "
              f"{stage} stage (it needs at least {need:g}s); raise --timeout")
    finding = DEADLINE_TOO_SHORT(
        f"The {stage} stage was not run: {left:.1f}s of the {timeout:g}s deadline were left",
        detail=(f"When the {stage} stage was due, {why}. " if why else "")
        + f"The {stage} stage and the stages after it need at least {need:g}s; they were skipped, "
        "so nothing is known about what they examine. The report is partial.",
        check="deadline",
        data={"stage": stage, "left_s": round(left, 3), "needed_s": need, "timeout_s": timeout,
              **({"why": why} if why else {})},
    )
    return reason, finding


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
        self._writing = threading.Event()

    def start(self) -> "Watchdog":
        self._thread = threading.Thread(target=self._watch, name=self.name, daemon=True)
        self._thread.start()
        return self

    def cancel(self) -> None:
        """The run finished in time (or exits by itself): never fire."""
        self._cancelled.set()

    def writing(self) -> None:
        """on_expire's own thread: the report is being built and written now (bounded local work), so
        the hard exit grants WRITE_GRACE_S more, once, if it comes first."""
        self._writing.set()

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
        backstop = threading.Timer(self.grace_s, self._backstop)
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

    def _backstop(self) -> None:
        if self._writing.is_set():
            last = threading.Timer(WRITE_GRACE_S, self._hard_exit)
            last.daemon = True
            last.start()
            return
        self._hard_exit()

    def _hard_exit(self, code: int = EXIT_INCOMPLETE) -> None:
        if not self._exiting.acquire(blocking=False):
            return  # the backstop and the normal path both end up here; exit once
        flush_std_streams()
        self._exit(code)
