"""A --watch Screen as a rich table (a terminal) or as one line per change (a pipe, a file); nothing here prints."""

from __future__ import annotations

import time
from typing import Any, Sequence

from distdoctor.core.findings import Finding, Severity
from distdoctor.core.rank_groups import MAX_LINES, hosts_text, ranges_text, ranks_label
from distdoctor.stacks.watch import Row, Screen

_STYLE = {"error": "bold red", "warning": "yellow", "critical": "bold red"}
_SHOWN_ROWS = 256   # a terminal shows this many rows at most; the rest are counted
# Past this many ranks, ranks in the same state at the same line are one row (`0, 2-63`): a
# 4,096-rank job shows as many rows as it has distinct states, not one per rank.
_GROUP_ABOVE = 16


def grouped_rows(rows: Sequence[Row]) -> list[list[Row]]:
    """The rows, each alone in a small job; in a large one grouped by job, state, line and highlight."""
    if len(rows) <= _GROUP_ABOVE:
        return [[row] for row in rows]
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        groups.setdefault((row.job, row.kind, row.where, row.flag), []).append(row)
    return sorted(groups.values(), key=lambda members: min(r.rank for r in members))


def _group_cells(members: Sequence[Row]) -> list[str]:
    first = members[0]
    if len(members) == 1:
        return [str(first.rank), first.host, str(first.pid or ""), first.state, _cpu(first), first.where]
    cpus = [r.cpu_pct for r in members if r.cpu_pct is not None]
    return [ranges_text(r.rank for r in members), hosts_text([r.host for r in members], 2), f"{len(members)} PIDs",
            max((r.state for r in members), key=len), f"{max(cpus):.0f}" if cpus else "", first.where]


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def _cpu(row: Row) -> str:
    return f"{row.cpu_pct:.0f}" if row.cpu_pct is not None else ""


def verdict_lines(screen: Screen) -> list[tuple[str, str]]:
    """(style, text) per job: its verdict's findings, the strongest first."""
    out = []
    several = len(screen.verdicts) > 1
    for job, found in screen.verdicts.items():
        for finding in sorted(found, key=lambda f: -int(f.severity)):
            prefix = f"{job}: " if several else ""
            out.append((_STYLE.get(finding.severity.label, "dim" if finding.severity <= Severity.INFO else ""),
                        f"{prefix}{finding.id} {finding.title}"))
    for problem in screen.problems:
        out.append((_STYLE.get(problem.severity.label, ""), f"{problem.id} {problem.title}"))
    if not out and screen.rows:
        out.append(("dim", "reading: a verdict forms once every rank was read 3 times over --span"))
    if not out and screen.unread:
        # Found, but py-spy's first dump has not come back (it takes longer than --interval on a busy host).
        out.append(("dim", f"found {screen.unread} rank process{'es' if screen.unread > 1 else ''}; "
                           "reading their stacks for the first time"))
    return out or [("dim", "no torch.distributed job found yet; looking again every few seconds")]


def table(screen: Screen, *, interval_s: float) -> Any:
    """The live view: one row per rank (the ranks a verdict names highlighted) and the verdicts."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    several = len({r.job for r in screen.rows}) > 1
    grid = Table(title=f"distdoctor stacks --watch · {_clock(screen.time)} · every {interval_s:g} s · "
                       f"{screen.reads} reads · Ctrl-C for the report", title_justify="left", expand=False)
    for name, justify in (("rank", "right"), ("host", "left"), ("PID", "right"), ("state", "left"),
                          ("CPU %", "right"), ("where", "left")):
        wraps = name in ("state", "where")
        grid.add_column(name, justify=justify, overflow="fold" if wraps else "ellipsis", no_wrap=not wraps,
                        ratio=2 if name == "where" else 1 if name == "state" else None,
                        min_width=12 if wraps else None)
    if several:
        grid.add_column("job", overflow="ellipsis")
    groups = grouped_rows(screen.rows)
    for members in groups[:_SHOWN_ROWS]:
        grid.add_row(*_group_cells(members), *([members[0].job] if several else []),
                     style=_STYLE.get(members[0].flag, ""))
    if len(groups) > _SHOWN_ROWS:
        left = sum(len(m) for m in groups[_SHOWN_ROWS:])
        grid.caption = f"… and {left} more ranks (--format json at the end holds them all)"
    verdicts = [Text(text, style=style) for style, text in verdict_lines(screen)]
    return Group(grid, *verdicts)


def _row_line(row: Row, epoch: float) -> str:
    cpu = f" · CPU {row.cpu_pct:.0f}%" if row.cpu_pct is not None else ""
    where = f" · {row.where}" if row.where else ""
    mark = f" [{row.flag}]" if row.flag else ""
    return f"{_clock(epoch)} rank {row.rank} (PID {row.pid}) on {row.host}: {row.state}{cpu}{where}{mark}"


def _group_line(members: Sequence[Row], epoch: float) -> str:
    if len(members) == 1:
        return _row_line(members[0], epoch)
    _, host, pids, state, cpu, where = _group_cells(members)
    mark = f" [{members[0].flag}]" if members[0].flag else ""
    return (f"{_clock(epoch)} {ranks_label(r.rank for r in members)} ({pids}) on {host}: {state}"
            + (f" · CPU up to {cpu}%" if cpu else "") + (f" · {where}" if where else "") + mark)


def _verdict_key(found: Sequence[Finding]) -> tuple:
    return tuple((f.id, f.ranks) for f in found)


def changes(before: Screen | None, now: Screen) -> list[str]:
    """One line per rank whose state, place or highlight changed, and per verdict that formed or
    cleared, since the screen before (every row the first time)."""
    old = {(r.job, r.rank): r for r in before.rows} if before is not None else {}
    changed = [row for row in now.rows
               if (prev := old.get((row.job, row.rank))) is None
               or (prev.kind, prev.flag, prev.pid) != (row.kind, row.flag, row.pid)
               or (row.kind != "moving" and prev.where != row.where)]
    if len(changed) <= MAX_LINES:
        lines = [_row_line(row, now.time) for row in changed]
    else:  # many ranks changed at once (a stall forming across the job): one line per state and line
        lines = [_group_line(members, now.time) for members in grouped_rows(changed)]
    for job, found in now.verdicts.items():
        earlier = before.verdicts.get(job) if before is not None else None
        if earlier is not None and _verdict_key(earlier) == _verdict_key(found):
            continue
        label = f" ({job})" if len(now.verdicts) > 1 else ""
        for finding in sorted(found, key=lambda f: -int(f.severity)):
            lines.append(f"{_clock(now.time)} verdict{label}: {finding.severity.label} {finding.id} {finding.title}")
    if before is None and not now.rows:
        lines += [text for _, text in verdict_lines(now)]
    return lines
