"""The CLI's output: a rendered report to stdout or --output, tables and Markdown on a terminal or piped."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

from distdoctor.cli.options import fail_usage


def emit(text: str | None, output: Path | None) -> None:
    """Write a rendered report to --output (or stdout), turning I/O errors into usage errors."""
    if text is None:
        return
    if output is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
        return
    try:
        output.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    except OSError as exc:
        fail_usage(f"cannot write --output {output}: {exc.strerror or exc}")


def render_report(report: Any, fmt: str, output: Path | None, *, verbose: bool, quiet: bool) -> None:
    from distdoctor.core.render import render  # each command loads only its own logic: start-up stays light
    from distdoctor.machine.snapshot import report_facts  # each command loads only its own logic: start-up stays light

    if report.about is None:
        report.about = report_facts()

    if fmt == "html":
        from distdoctor.core.html import render_html  # loaded only when a page is asked for

        drawers = None
        if isinstance(report.data, dict) and "timeline" in report.data:  # a guarded run among the inputs
            from distdoctor.timeline.html_run import DRAWERS as drawers  # its pictures live beside its data
        emit(render_html(report, verbose=verbose, drawers=drawers), output)
    elif fmt == "rich" and output is not None:

        buffer = io.StringIO()
        render(report, "rich", buffer, verbose=verbose, quiet=quiet)
        emit(buffer.getvalue(), output)
    else:
        emit(render(report, fmt, verbose=verbose, quiet=quiet), output)


def render_bench_report(report: Any, fmt: str, output: Path | None, verbose: bool) -> None:
    from distdoctor.bench.render import render_bench  # loaded only when this path runs

    if fmt == "html":
        from distdoctor.core.html import render_html  # loaded only when a page is asked for

        emit(render_html(report, title="distdoctor bench", verbose=verbose), output)
    elif fmt == "rich" and output is not None:

        buffer = io.StringIO()
        render_bench(report, "rich", buffer, verbose=verbose)
        emit(buffer.getvalue(), output)
    else:
        emit(render_bench(report, fmt, verbose=verbose), output)


def plain_columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns as wide as their widest value; the last column is never padded."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    return ["  ".join([*(str(v).ljust(w) for v, w in zip(row, widths)), str(row[-1])]).rstrip()
            for row in [header, *rows]]


def print_table(console: Any, title: str, header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A rich table whose first column (the ID or check name) is never cut; the others wrap."""
    from rich.table import Table  # rich is loaded only when something is rendered

    table = Table(title=title)
    first = max(len(r[0]) for r in rows) if rows else len(header[0])
    table.add_column(header[0], no_wrap=True, min_width=first)
    for column in header[1:]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def check_markdown(check: Any, finding_doc: Any) -> str:
    """A check as Markdown: its stage, tags and description, then the docs of what it emits."""
    lines = [f"# {check.name}", "", f"stage `{check.stage}`" + (f" · tags {', '.join(check.tags)}" if check.tags else ""), ""]
    if check.description:
        lines += [check.description, ""]
    if check.emits:
        lines += ["Findings it can report: " + ", ".join(f"`{k.id}`" for k in check.emits), ""]
    for kind in check.emits:
        lines += [finding_doc(kind.id) or f"## {kind.id} — {kind.title}", ""]
    return "\n".join(lines)


def show_markdown(text: str) -> None:
    """Markdown rendered with rich on a terminal; the Markdown source itself when piped."""
    from distdoctor.core.render import make_console  # each command loads only its own logic: start-up stays light

    console = make_console()
    if not console.is_terminal:
        emit(text, None)
        return
    from rich.markdown import Markdown  # rich is loaded only when something is rendered

    console.print(Markdown(text))
