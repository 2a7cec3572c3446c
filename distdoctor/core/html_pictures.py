"""The pictures of the HTML report that core draws (`stacks`' ranks, `bench`'s links); others come as drawers."""

# A picture is drawn from a report's plain data, one key each: data.stacks, data.bench here; the
# guard's run (data.timeline) is drawn beside its data in distdoctor.timeline (timeline.html_run),
# whose callers hand its drawer to core.html.render_html: core imports nothing above it.

from __future__ import annotations

import html
import statistics
from typing import Any, Callable, Mapping

from distdoctor.core.findings import Finding
from distdoctor.core.report import format_ranks

Drawer = Callable[[Mapping[str, Any], list[Finding]], str]

MAX_GROUP_ROWS = 30
MAX_CELLS_SIDE = 64
CELL = 11


def escape(value: Any) -> str:
    """Any value as HTML text: <, >, &, quotes escaped (a log's text never becomes markup)."""
    return html.escape("" if value is None else str(value), quote=True)


def short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sections(data: Mapping[str, Any], findings: list[Finding], drawers: Mapping[str, Drawer] | None = None) -> list[str]:
    """The picture sections this report's data has (none for a report without figures); ``drawers``: the
    pictures drawn above core, by the data key they draw (timeline: the guard's run)."""
    out = []
    for key, draw in (drawers or {}).items():
        if isinstance(data.get(key), Mapping):
            out.append(draw(data[key], findings))
    stacks = data.get("stacks")
    if isinstance(stacks, Mapping) and isinstance(stacks.get("jobs"), list):
        out.append(stacks_section(stacks["jobs"]))
    if isinstance(data.get("bench"), Mapping):
        out.append(bench_section(data["bench"], findings))
    return [s for s in out if s]


def stacks_section(jobs: list[Any]) -> str:
    out = ["<h2>Ranks, grouped by where they are</h2>"]
    for job in jobs[:16]:
        if not isinstance(job, Mapping):
            continue
        snaps = [s for s in job.get("snapshots") or () if isinstance(s, Mapping) and isinstance(s.get("rank"), int)]
        groups: dict[tuple[str, str, str], list[int]] = {}
        for snap in snaps:
            groups.setdefault((_state(snap), _waits_in(snap), _line(snap)), []).append(snap["rank"])
        ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]) > 1, len(kv[1]), kv[1][0]))
        total = max(1, len(snaps))
        rows = []
        for (state, waits, line), ranks in ordered[:MAX_GROUP_ROWS]:
            bar = (f'<svg width="120" height="12" xmlns="http://www.w3.org/2000/svg"><rect width="{max(2, 120 * len(ranks) / total):.1f}" '
                   f'height="12" fill="{"#d32f2f" if len(ranks) < total / 2 and len(groups) > 1 else "#5c85d6"}"/></svg>')
            rows.append(f"<tr><td>{escape(short(format_ranks(ranks), 60))}</td><td class=\"num\">{len(ranks)}</td><td>{bar}</td>"
                        f"<td>{escape(state)}</td><td>{escape(waits)}</td><td><code>{escape(line)}</code></td></tr>")
        more = (f'<p class="muted">{len(ordered) - MAX_GROUP_ROWS} more groups in the JSON report.</p>'
                if len(ordered) > MAX_GROUP_ROWS else "")
        out.append(f"<h3>job {escape(job.get('job'))}: {len(snaps)} rank{'s' if len(snaps) != 1 else ''}"
                   f"{escape(' on ' + ', '.join(list(map(str, job.get('nodes') or ()))[:8])) if job.get('nodes') else ''}</h3>"
                   "<table><tr><th>ranks</th><th>how many</th><th></th><th>state</th><th>waits in</th><th>at</th></tr>"
                   + "".join(rows) + "</table>" + more)
    out.append('<p class="muted">The fewest first: the odd ranks out (in red) are usually the ones to look at.</p>')
    return "\n".join(out)


def _state(snap: Mapping[str, Any]) -> str:
    state = str(snap.get("status") or "unknown")
    if snap.get("proc_state"):
        state += f" ({snap['proc_state']})"
    return state


def _waits_in(snap: Mapping[str, Any]) -> str:
    for group in snap.get("groups") or ():
        pending = group.get("pending") if isinstance(group, Mapping) else None
        if isinstance(pending, Mapping) and pending.get("op"):
            seq = f" #{pending.get('seq')}" if pending.get("seq") is not None else ""
            return f"{pending.get('op')}{seq} of group {group.get('group')}"
    return str(snap.get("in_collective") or "")


def _line(snap: Mapping[str, Any]) -> str:
    where = snap.get("where")
    if isinstance(where, Mapping) and where.get("file"):
        code = f"  {where.get('code')}" if where.get("code") else ""
        return short(f"{where.get('file')}:{where.get('line')}{code}", 160)
    return ""


def bench_section(bench: Mapping[str, Any], findings: list[Finding]) -> str:
    links = bench.get("links") if isinstance(bench.get("links"), Mapping) else {}
    pairs = [p for p in links.get("pairs") or () if isinstance(p, Mapping) and isinstance(p.get("a"), int)
             and isinstance(p.get("b"), int) and isinstance(p.get("bw_gbs"), (int, float))]
    if not pairs:
        return ""
    size = bench.get("world_size") if isinstance(bench.get("world_size"), int) else max(max(p["a"], p["b"]) for p in pairs) + 1
    return "<h2>Links between ranks</h2>" + link_heatmap(pairs, size, slow_pairs(findings)) + sweep_table(bench)


def sweep_table(bench: Mapping[str, Any]) -> str:
    """The collectives' bandwidth per size, as the terminal's table has it."""
    rows = [r for r in bench.get("sweep") or () if isinstance(r, Mapping)][:400]
    if not rows:
        return ""
    cells = "".join(
        f"<tr><td>{escape(r.get('op'))}</td><td class=\"num\">{escape(r.get('size'))}</td>"
        f"<td class=\"num\">{escape(r.get('time_us'))}</td><td class=\"num\">{escape(r.get('algbw_gbs'))}</td>"
        f"<td class=\"num\">{escape(r.get('busbw_gbs'))}</td><td>{'ok' if r.get('correct') else escape('WRONG on ' + str(r.get('wrong_ranks')))}</td></tr>"
        for r in rows)
    return ("<h3>Collectives</h3><table><tr><th>op</th><th>bytes</th><th>time (us)</th><th>algbw (GB/s)</th>"
            f"<th>busbw (GB/s)</th><th>result</th></tr>{cells}</table>")


def slow_pairs(findings: list[Finding]) -> set[tuple[Any, Any]]:
    """The links bench's findings name as slow: (rank, rank) for a link inside a host, (host, host)
    for a link between hosts."""
    out: set[tuple[Any, Any]] = set()
    for finding in findings:
        data = finding.data if isinstance(finding.data, Mapping) else {}
        edges = [e for e in data.get("links") or () if isinstance(e, Mapping)] or ([data] if "a" in data else [])
        for edge in edges:
            a, b = str(edge.get("a")), str(edge.get("b"))
            if edge.get("kind") == "inter_host" or not (a.isdigit() and b.isdigit()):
                out.add((a, b))
            else:
                out.add((int(a), int(b)))
    return out


def link_heatmap(pairs: list[Mapping[str, Any]], size: int, slow: set[tuple[Any, Any]]) -> str:
    """Bandwidth per rank pair, darker where faster; up to MAX_CELLS_SIDE ranks a side, else ranks binned (the slowest link of a bin)."""
    bins = min(size, MAX_CELLS_SIDE)
    bin_of = lambda r: min(bins - 1, r * bins // max(1, size))  # noqa: E731
    cells: dict[tuple[int, int], tuple[float, Mapping[str, Any], bool]] = {}
    for pair in pairs:
        for a, b in ((pair["a"], pair["b"]), (pair["b"], pair["a"])):
            key = (bin_of(a), bin_of(b))
            marked = bool({(pair["a"], pair["b"]), (pair["b"], pair["a"]), (str(pair.get("host_a")), str(pair.get("host_b"))),
                           (str(pair.get("host_b")), str(pair.get("host_a")))} & slow)
            held = cells.get(key)
            if held is None or pair["bw_gbs"] < held[0]:
                cells[key] = (float(pair["bw_gbs"]), pair, marked or (held[2] if held else False))
            elif marked:
                cells[key] = (held[0], held[1], True)
    values = [v[0] for v in cells.values()]
    top, median = max(values) or 1.0, statistics.median(values)
    cell = max(CELL, min(44, 560 // bins))
    left, head = 54, 30
    side = left + bins * cell + 230
    out = [f'<svg role="img" aria-label="link matrix" viewBox="0 0 {side} {head + bins * cell + 40}" '
           f'width="{min(side, 1100)}" xmlns="http://www.w3.org/2000/svg">']
    label = lambda i: (f"{i * size // bins}" if bins == size else f"{i * size // bins}-{(i + 1) * size // bins - 1}")  # noqa: E731
    for i in range(0, bins, max(1, bins // 16)):
        out.append(f'<text x="{left - 4}" y="{head + i * cell + cell / 2 + 4:.1f}" text-anchor="end">{escape(label(i))}</text>')
        out.append(f'<text x="{left + i * cell + cell / 2:.1f}" y="{head - 6}" text-anchor="middle">{escape(label(i))}</text>')
    for (i, j), (bw, pair, marked) in sorted(cells.items()):
        shade = 0.15 + 0.85 * bw / top
        fill = f"rgb({int(255 - 200 * shade)},{int(255 - 120 * shade)},{int(255 - 40 * shade)})"
        stroke = ' stroke="#d32f2f" stroke-width="2"' if marked else ""
        title = (f"ranks {pair['a']} and {pair['b']}: {bw:.3g} GB/s, {pair.get('lat_us')} us latency "
                 f"({pair.get('host_a')} - {pair.get('host_b')})" + (" — named slow by the findings below" if marked else ""))
        out.append(f'<rect x="{left + j * cell}" y="{head + i * cell}" width="{cell - 1}" height="{cell - 1}" fill="{fill}"{stroke}>'
                   f"<title>{escape(title)}</title></rect>")
    legend_x = left + bins * cell + 16
    out.append(f'<text x="{legend_x}" y="{head + 10}">darker: faster (top {top:.3g} GB/s)</text>')
    out.append(f'<text x="{legend_x}" y="{head + 26}">median {median:.3g} GB/s</text>')
    out.append(f'<rect x="{legend_x}" y="{head + 36}" width="10" height="10" fill="#fff" stroke="#d32f2f" stroke-width="2"/>'
               f'<text x="{legend_x + 16}" y="{head + 45}">slow link</text>')
    out.append("</svg>")
    caption = ("Bandwidth of each rank pair (hover a cell for the figures)" +
               ("" if bins == size else f"; {size} ranks in {bins} bins a side, each cell the slowest link of its bins") + ".")
    return f"<figure>{''.join(out)}<figcaption>{escape(caption)}</figcaption></figure>"
