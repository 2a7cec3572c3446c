"""Progress on a terminal: a rich bar on stderr, only when stderr is a TTY (never in reports)."""

from __future__ import annotations

import sys
from typing import Callable


class Progress:
    """Counts steps of the run; shows them only where a person is watching."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = None
        if enabled and sys.stderr.isatty():
            from rich.console import Console  # rich is loaded only when something is rendered
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeElapsedColumn  # rich is loaded only when something is rendered

            self._bar = RichProgress(TextColumn("bench {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                     TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
            self._task = self._bar.add_task("", total=total)
            self._bar.start()

    def step(self, prefix: str) -> Callable[[str], None]:
        def advance(what: str) -> None:
            if self._bar is not None:
                self._bar.update(self._task, advance=1, description=f"{prefix} {what}")
        return advance

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
