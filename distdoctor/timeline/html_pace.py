"""The job's pace drawn: a lateness strip per rank over time, and the differential profile of each slow rank."""

# The strip: one lane per rank (the slow ranks' own lanes first, beyond MAX_LANES ranks the others
# folded into one lane of their median), a column per slice of the run; a cell's red is how much the
# others waited for that rank per step in that slice, against the step (the ranks' median wait per
# step minus its own: its own intervals, no clock compared between hosts; the slices are placed by
# each rank's own clock, so a host whose clock is off shifts its cells by that much). The profile:
# per slow rank, the calls where its time goes that its peers' does not, per step.

from __future__ import annotations

import statistics
from typing import Any, Mapping

from distdoctor.core.html_pictures import escape, short
from distdoctor.core.report import format_ranks

COLUMNS = 60
MAX_LANES = 24
WIDTH, LABEL_W, LANE_H, TOP = 1120, 190, 16, 20
LATE = (211, 47, 47)


def _rows(strip: Mapping[str, Any]) -> dict[int, list[Mapping[str, Any]]]:
    out = {}
    for rank, rows in strip.items():
        if str(rank).isdigit() and isinstance(rows, list):
            out[int(rank)] = [r for r in rows if isinstance(r, Mapping) and isinstance(r.get("t0"), (int, float))
                              and isinstance(r.get("t1"), (int, float)) and isinstance(r.get("wait_ms"), (int, float))]
    return {r: rows for r, rows in out.items() if rows}


def _grid(rows: dict[int, list[Mapping[str, Any]]], start: float, width: float) -> dict[int, list[tuple[float, float] | None]]:
    """Per rank, per column: (its wait per step, the step) from the window that covers the column's middle."""
    grid: dict[int, list[tuple[float, float] | None]] = {}
    for rank, windows in rows.items():
        cells: list[tuple[float, float] | None] = []
        for column in range(COLUMNS):
            at = start + (column + 0.5) * width
            hit = next((w for w in windows if w["t0"] <= at <= w["t1"]), None)
            cells.append((float(hit["wait_ms"]), float(hit.get("step_ms") or 0.0)) if hit else None)
        grid[rank] = cells
    return grid


def lateness_strip(pace: Mapping[str, Any], slow: list[int]) -> str:
    rows = _rows(pace.get("strip") if isinstance(pace.get("strip"), Mapping) else {})
    if len(rows) < 2:
        return ""
    start = min(w["t0"] for ws in rows.values() for w in ws)
    length = max(w["t1"] for ws in rows.values() for w in ws) - start or 1.0
    grid = _grid(rows, start, length / COLUMNS)
    medians = [statistics.median([c[0] for c in (grid[r][i] for r in grid) if c]) if any(grid[r][i] for r in grid)
               else None for i in range(COLUMNS)]
    lanes = _lanes(sorted(grid), slow)
    plot_w = WIDTH - LABEL_W - 12
    height = TOP + LANE_H * len(lanes) + 22
    cell_w = plot_w / COLUMNS
    out = [f'<svg role="img" aria-label="lateness strip" viewBox="0 0 {WIDTH} {height}" width="100%" '
           'xmlns="http://www.w3.org/2000/svg">']
    for i, (label, ranks) in enumerate(lanes):
        y = TOP + i * LANE_H
        marked = ' class="late-label"' if set(ranks) & set(slow) else ""
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 12}" text-anchor="end"{marked}>{escape(short(label, 30))}</text>')
        for column in range(COLUMNS):
            cells = [grid[r][column] for r in ranks if grid[r][column]]
            if not cells or medians[column] is None:
                continue
            wait, step = statistics.median(c[0] for c in cells), statistics.median(c[1] for c in cells)
            late = max(0.0, medians[column] - wait)
            share = late / step if step else 0.0
            shade = min(1.0, share / 0.3)
            fill = f"rgb({255 - int((255 - LATE[0]) * shade)},{255 - int((255 - LATE[1]) * shade)},{255 - int((255 - LATE[2]) * shade)})"
            at = column * length / COLUMNS
            title = (f"{label}, {at:.0f}-{at + length / COLUMNS:.0f} s: the others wait {late:.1f} ms per step for it "
                     f"({share:.0%} of a {step:.1f} ms step); it waits {wait:.1f} ms per step itself")
            out.append(f'<rect x="{LABEL_W + column * cell_w:.1f}" y="{y}" width="{cell_w - 0.4:.1f}" height="{LANE_H - 3}" '
                       f'fill="{fill}" stroke="#e3e6ea" stroke-width="0.3"><title>{escape(title)}</title></rect>')
    out.append(f'<text x="{LABEL_W}" y="{height - 6}">{length:.0f} s of the run; darker red: the others wait longer per '
               'step for this rank (30 % of the step or more: full red)</text></svg>')
    return ('<figure>' + "".join(out) + '<figcaption>How late each rank was, over time: per slice of the run, how long '
            'the other ranks waited for it per step (the ranks\' median wait minus its own). Hover a cell for the '
            'figures.</figcaption></figure>')


def _lanes(ranks: list[int], slow: list[int]) -> list[tuple[str, list[int]]]:
    if len(ranks) <= MAX_LANES:
        return [(f"rank {r}", [r]) for r in ranks]
    kept = [r for r in ranks if r in slow][:MAX_LANES - 1]
    rest = [r for r in ranks if r not in kept]
    return [(f"rank {r}", [r]) for r in kept] + [(f"ranks {format_ranks(rest)}", rest)]


def profile_table(finding: Mapping[str, Any]) -> str:
    data = finding.get("data") if isinstance(finding.get("data"), Mapping) else {}
    rows = [r for r in data.get("rows") or () if isinstance(r, Mapping)]
    if not rows:
        return ""
    body = []
    top = max(float(r.get("extra_ms") or 0) for r in rows) or 1.0
    for row in rows:
        frame = row.get("frame") if isinstance(row.get("frame"), list) else []
        inner = row.get("inner") if isinstance(row.get("inner"), list) else None
        call = _frame_text(frame) + (f"<br><span class=\"muted\">inside: {_frame_text(inner)}</span>" if inner else "")
        bar = (f'<svg width="140" height="12" xmlns="http://www.w3.org/2000/svg"><rect width="'
               f'{max(2.0, 140 * float(row.get("extra_ms") or 0) / top):.1f}" height="12" fill="#d32f2f"/></svg>')
        peers = "only this rank" if row.get("only_here") else f"{float(row.get('peers_ms') or 0):.1f}"
        parts = ", ".join(f"{k} {float(row.get(k) or 0):.0%}" for k in ("cpu", "runq", "blocked", "gc", "data")
                          if float(row.get(k) or 0) >= 0.05)
        body.append(f"<tr><td>{call}</td><td class=\"num\">+{float(row.get('extra_ms') or 0):.1f}</td><td>{bar}</td>"
                    f"<td class=\"num\">{float(row.get('slow_ms') or 0):.1f}</td><td class=\"num\">{escape(peers)}</td>"
                    f"<td>{escape(parts)}</td></tr>")
    who = format_ranks(data.get("slow") or finding.get("ranks") or [])
    return (f"<h4>Where rank{'s' if len(data.get('slow') or []) > 1 else ''} {escape(who)} spend{'' if len(data.get('slow') or []) > 1 else 's'} "
            f"the time the others wait for ({escape(data.get('family'))})</h4><table><tr><th>call (the outermost frame "
            "where its stack parts from its peers')</th><th>extra ms per step</th><th></th><th>its ms per step there</th>"
            "<th>its peers' ms per step there</th><th>its time there: on a CPU, runnable (cpu contention), blocked, in "
            "GC, under a DataLoader</th></tr>" + "".join(body) + "</table>")


def _frame_text(frame: list[Any] | None) -> str:
    if not frame:
        return ""
    where = f"{frame[0]}:{frame[1]}" if len(frame) > 1 and frame[1] is not None else str(frame[0])
    code = frame[3] if len(frame) > 3 and frame[3] else ""
    return f"<code>{escape(short(str(code), 100))}</code> {escape(where)}" if code else escape(where)


def pace_section(pace: Mapping[str, Any], timeline: Mapping[str, Any]) -> str:
    findings = [f for f in pace.get("findings") or () if isinstance(f, Mapping)]
    named = [f for f in findings if f.get("id") in ("slow.W001", "slow.W002")]
    slow = sorted({r for f in named for r in (f.get("ranks") or ()) if isinstance(r, int)})
    out = ["<h3>The job's pace</h3>"]
    if findings:
        out.append("<ul>" + "".join(f"<li><span class=\"fid\">{escape(f.get('id'))}</span> {escape(f.get('title'))}</li>"
                                    for f in findings[:20]) + "</ul>")
    else:
        out.append("<p>No rank made the others wait: the ranks kept the same pace.</p>")
    out.append(lateness_strip(pace, slow))
    out += [profile_table(f) for f in named[:8]]
    return "\n".join(x for x in out if x)
