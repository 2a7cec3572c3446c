"""What the guard hands the user: GuardError, the rendered report, and the exit after a hang."""

from __future__ import annotations

import io
from typing import Callable

from distdoctor.core.report import Report

# A hang the guard diagnosed ends every rank with this code (findings at the fail level).
HANG_EXIT_CODE = 1
EXIT_HOOKS: list[Callable[[Report], None]] = []


class GuardError(RuntimeError):
    """Raised on every rank of a group whose ranks called one collective differently.

    ``str(error)`` is the rendered report; ``error.report`` the Report (schema distdoctor.report/1).
    """

    def __init__(self, report: Report, heading: str = "distdoctor guard stopped a collective before it ran:") -> None:
        self.report = report
        super().__init__(render_text(report, heading))


def render_text(report: Report, heading: str) -> str:
    from distdoctor.core.render import make_console, render_rich  # loaded only on this path, to keep start-up light

    buffer = io.StringIO()
    render_rich(report, make_console(buffer))
    return heading + "\n" + buffer.getvalue().rstrip()


def on_hang_exit(hook: Callable[[Report], None]) -> None:
    """Run ``hook(report)`` just before the guard ends this process after a hang (test harnesses)."""
    EXIT_HOOKS.append(hook)


