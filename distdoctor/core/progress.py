"""What the run is doing now (stage, running checks, ranks checked in), and its live status line.

The run's flow records its stage and rank counts in PROGRESS (one per process); the checks that
are running are read from the runner's threads (named distdoctor-check-<name>). On a terminal,
LiveStatus draws one transient line on stderr from it, and clears it before the report prints.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

CHECK_THREAD_PREFIX = "distdoctor-check-"


# Checks running in a forked child (site checks of the local stage): no thread here names them.
_in_children: set[str] = set()


class running_in_child:
    """``with running_in_child(name):`` around the wait for a check run in a child process."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        _in_children.add(self.name)

    def __exit__(self, *exc: object) -> None:
        _in_children.discard(self.name)


def running_checks(done: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The checks still running for this process (in its threads, or in a child it waits for),
    less those in ``done`` (already reported, e.g. abandoned after their own deadline)."""
    names = {t.name[len(CHECK_THREAD_PREFIX):] for t in threading.enumerate()
             if t.name.startswith(CHECK_THREAD_PREFIX) and t.is_alive()}
    return sorted((names | set(_in_children)) - set(done))


class RunProgress:
    """The stage, the ranks checked in and the deadline of this process's run (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stage = "starting"
        self.ranks: tuple[int, int, str] | None = None
        self.started: float | None = None
        self.timeout: float | None = None

    def start(self, started: float, timeout: float) -> None:
        with self._lock:
            self.started, self.timeout = started, timeout

    def set_stage(self, stage: str) -> None:
        with self._lock:
            self.stage = stage

    def set_ranks(self, done: int, total: int, what: str = "checked in") -> None:
        with self._lock:
            self.ranks = (done, total, what)

    def describe(self, clock: Callable[[], float] = time.monotonic) -> str:
        """One line: 'rendezvous · ranks 3/8 checked in · network.dns · 2.1s / 60s'."""
        with self._lock:
            stage, ranks, started, timeout = self.stage, self.ranks, self.started, self.timeout
        parts = [f"{stage} stage" if stage in ("local", "rendezvous", "collective") else stage]
        if ranks is not None and stage != "local":
            parts.append(f"ranks {ranks[0]}/{ranks[1]} {ranks[2]}")
        running = running_checks()
        if running:
            parts.append(", ".join(running[:3]) + (f" +{len(running) - 3}" if len(running) > 3 else ""))
        if started is not None:
            elapsed = f"{clock() - started:.1f}s"
            parts.append(f"{elapsed} / {timeout:g}s" if timeout else elapsed)
        return " · ".join(parts)


PROGRESS = RunProgress()
_ACTIVE: "LiveStatus | None" = None


def stop_live() -> None:
    """Clear this process's status line, if one is drawn (before any other output)."""
    if _ACTIVE is not None:
        _ACTIVE.stop()


def where_now() -> str:
    """The stage and the checks running, for a one-line message: 'the local stage (running: x)'."""
    stage = PROGRESS.stage
    running = running_checks()
    what = f"the {stage} stage" if stage in ("local", "rendezvous", "collective") else f"the {stage} phase"
    return what + (f" (running: {', '.join(running)})" if running else "")


def live_wanted(fmt: str, quiet: bool, stream: Any = None) -> bool:
    """A live status only for a person watching: rich format, not --quiet, stderr a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return tty and fmt == "rich" and not quiet


class LiveStatus:
    """A transient rich status line on stderr, redrawn from PROGRESS; stop() clears it."""

    def __init__(self, enabled: bool, progress: RunProgress = PROGRESS, *, console: Any = None) -> None:
        self.enabled = enabled
        self.progress = progress
        self._console = console
        self._live: Any = None
        self._lock = threading.Lock()

    def start(self) -> "LiveStatus":
        global _ACTIVE
        if not self.enabled:
            return self
        # rich.live is imported here: a run without a terminal never loads it.
        from rich.console import Console
        from rich.live import Live
        from rich.spinner import Spinner

        progress = self.progress
        spinner = Spinner("dots", style="cyan")

        class _Line:
            def __rich__(self) -> Any:
                spinner.update(text=f"distdoctor: {progress.describe()}")
                return spinner

        console = self._console or Console(stderr=True)
        with self._lock:
            self._live = Live(_Line(), console=console, transient=True, refresh_per_second=8,
                              redirect_stdout=False, redirect_stderr=False)
            self._live.start()
        _ACTIVE = self
        return self

    def stop(self) -> None:
        with self._lock:
            live, self._live = self._live, None
        if live is not None:
            try:
                live.stop()
            except Exception:
                pass  # a status line that cannot be cleared must not cost the report

    def __enter__(self) -> "LiveStatus":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wrap(self, render: Callable[[Any], None]) -> Callable[[Any], None]:
        """``render`` that first clears the status line (the report replaces it)."""

        def render_after_clearing(report: Any) -> None:
            self.stop()
            render(report)

        return render_after_clearing
