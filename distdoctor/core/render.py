"""Renderers: Report -> rich terminal text, JSON, or Markdown. Nothing here decides anything."""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

from distdoctor.core.findings import Finding, Severity
from distdoctor.core.rank_groups import shape
from distdoctor.core.report import Report, format_ranks, format_where

_STYLE = {
    Severity.CRITICAL: "bold white on red",
    Severity.ERROR: "bold red",
    Severity.WARNING: "yellow",
    Severity.INFO: "cyan",
}
_HEADING = {
    Severity.CRITICAL: "Critical",
    Severity.ERROR: "Errors",
    Severity.WARNING: "Warnings",
    Severity.INFO: "Info",
}


def docs_pointer(finding_id: str) -> str:
    return f"distdoctor show {finding_id}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def summary_line(report: Report) -> str:
    counts = report.counts()
    parts = [
        f"{counts['critical']} critical" if counts["critical"] else None,
        _plural(counts["error"], "error"),
        _plural(counts["warning"], "warning"),
        f"{counts['info']} info",
    ]
    checks = report.check_counts()
    check_bits = ", ".join(f"{n} {status}" for status, n in sorted(checks.items()))
    line = f"{report.status.upper()}: " + ", ".join(p for p in parts if p)
    line += f" · {_plural(len(report.checks), 'check')}" + (f" ({check_bits})" if check_bits else "")
    if report.silenced:
        line += f" · {len(report.silenced)} silenced ({', '.join(sorted({f.id for f in report.silenced}))})"
    if report.world.size:
        line += f" · world {report.world.size} via {report.world.launcher}"
        if report.world.ranks_missing:
            line += f", missing {len(report.world.ranks_missing)}"
    line += f" · {report.duration_s:.2f}s"
    return line


def about_line(about: dict) -> str:
    """'distdoctor 0.1.0 · Python 3.11.7 · torch 2.13.0+cpu · CUDA none · NCCL none · host vm · 2026-...Z'."""
    names = (("distdoctor", "distdoctor"), ("python", "Python"), ("torch", "torch"), ("cuda", "CUDA"),
             ("nccl", "NCCL"), ("host", "host"))
    parts = [f"{label} {about.get(key) if about.get(key) is not None else 'none'}" for key, label in names if key in about]
    if about.get("time_utc"):
        parts.append(str(about["time_utc"]))
    return " · ".join(parts)


def render_rich(report: Report, console: Console, *, verbose: bool = False, quiet: bool = False) -> None:
    """Findings grouped by severity, each with where, detail, fix and docs; then a summary."""
    # rich is imported where it draws: a JSON or Markdown report never loads it.
    from rich.markup import escape
    from rich.text import Text

    for severity in sorted(Severity, reverse=True):
        group = [f for f in report.findings if f.severity == severity]
        if not group or (quiet and severity < Severity.ERROR):
            continue
        console.print(Text(f"{_HEADING[severity]} ({len(group)})", style=_STYLE[severity] + " underline"))
        for finding in group:
            _render_finding(console, finding, verbose=verbose)
        console.print()
    if verbose:
        console.print(Text("Checks", style="bold underline"))
        for check, alike in check_rows(report.checks):
            reason = f" — {check['reason']}" if check.get("reason") else ""
            ranks = f" [ranks {format_ranks(check['ranks'])}]" if check.get("ranks") else ""
            more = f" … and {alike} more alike (--format json lists each)" if alike else ""
            console.print(
                f"  {check['status']:<7} {escape(check['name'])} ({check['stage']}, {check['duration_s']:.3f}s){escape(ranks)}{escape(reason)}{more}",
                highlight=False,
            )
        console.print()
    style = {"ok": "bold green", "warning": "bold yellow", "error": "bold red", "incomplete": "bold magenta"}[report.status]
    console.print(Text(summary_line(report), style=style))


# Checks listed one by one under --verbose; past it, checks whose name and reason differ only in
# numbers (`stacks`' "read rank 17 (PID 4858) on vm" per rank) are one line with a count.
MAX_CHECK_ROWS = 64
# Detail lines of one finding in the Markdown report (the JSON has all of them).
MAX_MD_DETAIL_LINES = 40


def check_rows(checks: list[dict]) -> list[tuple[dict, int]]:
    """(check, how many more alike were folded into it), in the checks' order."""
    if len(checks) <= MAX_CHECK_ROWS:
        return [(c, 0) for c in checks]
    rows: list[list] = []
    index: dict[tuple, int] = {}
    for check in checks:
        key = (check.get("status"), check.get("stage"), shape(str(check.get("name", ""))), shape(str(check.get("reason") or "")))
        if key in index:
            rows[index[key]][1] += 1
        else:
            index[key] = len(rows)
            rows.append([check, 0])
    return [(c, n) for c, n in rows]


def _render_finding(console: Console, finding: Finding, *, verbose: bool) -> None:
    from rich.text import Text  # see render_rich: rich only where it draws

    head = Text()
    head.append(f"  {finding.id} ", style=_STYLE[finding.severity])
    head.append(f"[{finding.cause}] ", style="dim")
    head.append(finding.title, style="bold")
    if finding.confidence is not None:
        head.append(f" (confidence {finding.confidence:.0%})", style="dim")
    console.print(head)
    where = format_where(finding)
    if where:
        console.print(Text(f"    where: {where}", style="dim"))
    if finding.detail:
        detail = finding.detail if verbose or finding.detail.count("\n") < 12 else "\n".join(
            finding.detail.splitlines()[:12] + ["…(--verbose for the rest)"]
        )
        for line in detail.splitlines():
            console.print(Text(f"    {line}"))
    if finding.remediation:
        lines = finding.remediation.splitlines() or [""]
        console.print(Text(f"    fix: {lines[0]}", style="green"))
        for line in lines[1:]:
            console.print(Text(f"         {line}", style="green"))
    console.print(Text(f"    docs: {docs_pointer(finding.id)}", style="dim"))


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def render_markdown(report: Report, *, title: str = "distdoctor report") -> str:
    """GitHub-flavoured Markdown, sized for a CI job summary."""
    icon = {"ok": "✅", "warning": "⚠️", "error": "❌", "incomplete": "⏱️"}[report.status]
    lines = [f"## {icon} {title}: {report.status}", "", summary_line(report), ""]
    if report.about:
        lines += [about_line(report.about), ""]
    if report.findings:
        lines += ["| severity | ID | cause | finding | where | fix |", "| --- | --- | --- | --- | --- | --- |"]
        for f in report.findings:
            lines.append(
                f"| {f.severity.label} | `{f.id}` | `{f.cause}` | {_md_escape(f.title)} | "
                f"{_md_escape(format_where(f))} | {_md_escape(f.remediation)} |"
            )
        lines.append("")
        details = [f for f in report.findings if f.detail]
        if details:
            lines += ["<details><summary>Details</summary>", ""]
            for f in details:
                detail = f.detail.splitlines()
                if len(detail) > MAX_MD_DETAIL_LINES:
                    detail = detail[:MAX_MD_DETAIL_LINES] + [f"…({len(detail) - MAX_MD_DETAIL_LINES} more lines: --format json)"]
                lines += [f"**{f.id}** — {_md_escape(f.title)}", "", "```", "\n".join(detail), "```", ""]
            lines += ["</details>", ""]
    else:
        lines += ["No findings.", ""]
    return "\n".join(lines)


def make_console(file: IO[str] | None = None, *, force_terminal: bool | None = None) -> Console:
    """A console that is rich on a terminal and plain text (no colour codes) elsewhere."""
    from rich.console import Console  # see render_rich: rich only where it draws

    console = Console(file=file, force_terminal=force_terminal, highlight=False, emoji=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(file=file, no_color=True, highlight=False, emoji=False, soft_wrap=True, color_system=None)
    return console


def render(report: Report, fmt: str, file: IO[str] | None = None, *, verbose: bool = False, quiet: bool = False) -> str | None:
    """Render in a format; rich goes to the file/console, the others are returned as text."""
    if fmt == "json":
        return render_json(report)
    if fmt == "markdown":
        return render_markdown(report)
    render_rich(report, make_console(file), verbose=verbose, quiet=quiet)
    return None
