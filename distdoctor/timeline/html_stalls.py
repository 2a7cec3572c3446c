"""The guard's stalls drawn: a timeline with one lane per rank (or per group of ranks), and the straggler profile."""

# Lanes: one per rank up to MAX_RANK_LANES ranks; beyond, ranks that took the same part in every
# stall (late in episodes 3 and 7, waiting in the others...) share a lane labelled with their range,
# and past MAX_LANES lanes the quietest are folded into one "other ranks" lane. The late rank's bar
# is red and its lane label marked; hover (an SVG <title>) gives the line, the verdict and the
# seconds. At most MAX_STALLS_DRAWN stalls are drawn (the longest); the table below counts them all.

from __future__ import annotations

from typing import Any, Mapping

from distdoctor.core.html_pictures import escape, short
from distdoctor.core.report import format_ranks

MAX_RANK_LANES = 32
MAX_LANES = 40
MAX_STALLS_DRAWN = 2000
MAX_PROFILE_ROWS = 20
WIDTH, LABEL_W, LANE_H, TOP = 1120, 190, 24, 28
BAR_H, STRIP_H = 13, 6   # a stall's bar, and under it the rank's collectives per slice of time
LATE, WAITING, FAULT, ACTIVE = "#d32f2f", "#f2b35d", "#4a148c", "#8ea4c8"


def stall_timeline(timeline: Mapping[str, Any]) -> str:
    stalls = [s for s in timeline.get("stalls") or () if isinstance(s, Mapping)]
    faults = [f for f in timeline.get("faults") or () if isinstance(f, Mapping)]
    length = float(timeline.get("length_s") or 0.0) or 1.0
    drawn = sorted(stalls, key=lambda s: -_seconds(s))[:MAX_STALLS_DRAWN]
    lanes = plan_lanes(timeline, stalls, faults)
    activity = timeline.get("activity") if isinstance(timeline.get("activity"), Mapping) else {}
    top = TOP + (LANE_H if activity.get("all") else 0)
    height = top + LANE_H * len(lanes) + 34
    plot_w = WIDTH - LABEL_W - 12
    x = lambda t: LABEL_W + max(0.0, min(1.0, t / length)) * plot_w  # noqa: E731
    out = [f'<svg role="img" aria-label="stall timeline" viewBox="0 0 {WIDTH} {height}" width="100%" '
           f'xmlns="http://www.w3.org/2000/svg">']
    out += _axis(length, x, height)
    if activity.get("all"):
        out.append(f'<text x="{LABEL_W - 6}" y="{TOP + 15}" text-anchor="end">collectives, all ranks</text>')
        out += _strip(activity["all"], TOP + LANE_H - 4, LANE_H - 6, plot_w, "collectives enqueued by all ranks")
    index = {rank: i for i, lane in enumerate(lanes) for rank in lane["ranks"]}
    per_rank = activity.get("per_rank") if isinstance(activity.get("per_rank"), Mapping) else {}
    for i, lane in enumerate(lanes):
        y = top + i * LANE_H
        label_class = ' class="late-label"' if lane["late_s"] > 0 else ""
        mark = "▲ " if lane["late_s"] > 0 else ""
        out.append(f'<rect x="{LABEL_W}" y="{y}" width="{plot_w}" height="{LANE_H - 2}" fill="{"#f7f8fa" if i % 2 else "#fff"}"/>')
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 13}" text-anchor="end"{label_class}><title>{escape(lane["title"])}'
                   f'</title>{escape(mark + short(lane["label"], 30))}</text>')
        counts = per_rank.get(str(lane["ranks"][0])) if len(lane["ranks"]) == 1 else None
        if isinstance(counts, list):
            out += _strip(counts, y + LANE_H - 3, STRIP_H, plot_w, f"collectives enqueued by {lane['label']}")
    for stall in drawn:
        out += _bars(stall, lanes, index, x, top)
    for fault in faults[:2000]:
        lane = index.get(fault.get("rank"))
        if lane is None:
            continue
        cx, cy = x(float(fault.get("at_s") or 0)), top + lane * LANE_H + 9
        text = f"rank {fault.get('rank')} {fault.get('kind')} at {float(fault.get('at_s') or 0):.1f} s: {fault.get('text')}"
        out.append(f'<path d="M{cx - 5:.1f},{cy - 5} l10,10 m0,-10 l-10,10" stroke="{FAULT}" stroke-width="2.5">'
                   f"<title>{escape(text)}</title></path>")
    out.append("</svg>")
    caption = (f"{len(stalls)} stall{'s' if len(stalls) != 1 else ''} over {length:.1f} s"
               + (f"; the {len(drawn)} longest drawn" if len(drawn) < len(stalls) else "")
               + ". Red: the late rank (▲ marks its lane), amber: ranks waiting for it, ✕: a rank that raised, exited "
               "or was killed, grey: collectives enqueued (from the flight recorder). Hover a bar for the line, the "
               "verdict and the seconds.")
    return (f'<figure>{"".join(out)}<figcaption>{escape(caption)}</figcaption></figure>')


def _seconds(stall: Mapping[str, Any]) -> float:
    value = stall.get("seconds")
    if isinstance(value, (int, float)):
        return float(value)
    return float(stall.get("open_s") or 0.0)


def _axis(length: float, x: Any, height: int) -> list[str]:
    step = _nice_step(length / 8)
    out = []
    t = 0.0
    while t <= length + 1e-9 and len(out) < 60:
        px = x(t)
        out.append(f'<line x1="{px:.1f}" y1="{TOP - 4}" x2="{px:.1f}" y2="{height - 30}" stroke="#e3e6ea"/>')
        out.append(f'<text x="{px:.1f}" y="{TOP - 8}" text-anchor="middle">{_clock(t)}</text>')
        t += step
    out.append(f'<text x="{LABEL_W}" y="{height - 10}">seconds since the first event of the record</text>')
    return out


def _nice_step(raw: float) -> float:
    for step in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14400, 21600,
                 43200, 86400):
        if step >= raw:
            return float(step)
    return 86400.0 * max(1, round(raw / 86400))


def _clock(t: float) -> str:
    if t >= 3600:
        return f"{int(t // 3600)}h{int(t % 3600 // 60):02d}"
    if t >= 60:
        return f"{int(t // 60)}m{int(t % 60):02d}"
    return f"{t:g}s"


def _strip(counts: list[Any], bottom: float, height: float, plot_w: float, what: str) -> list[str]:
    """Columns of height by count, one per slice of the record (the grey of the timeline)."""
    values = [c if isinstance(c, int) and c > 0 else 0 for c in counts[:1000]]
    top = max(values, default=0)
    if not top:
        return []
    step = plot_w / len(values)
    out = []
    for i, count in enumerate(values):
        if count:
            h = max(1.0, height * count / top)
            out.append(f'<rect x="{LABEL_W + i * step:.1f}" y="{bottom - h:.1f}" width="{max(step - 0.3, 0.5):.2f}" '
                       f'height="{h:.1f}" fill="{ACTIVE}"/>')
    return [f"<g><title>{escape(what)} (darker, taller: more per slice of time)</title>{''.join(out)}</g>"]


def _bars(stall: Mapping[str, Any], lanes: list[dict[str, Any]], index: Mapping[int, int], x: Any, top: float) -> list[str]:
    start, seconds = float(stall.get("start_s") or 0.0), _seconds(stall)
    late = [r for r in stall.get("late") or () if isinstance(r, int)]
    waiting = [r for r in stall.get("waiting") or () if isinstance(r, int)]
    x0 = x(start)
    width = max(2.0, x(start + seconds) - x0)
    where = stall.get("where") or "an unknown line"
    what = f"{stall.get('op')} #{stall.get('seq')}" if stall.get("op") else "a collective"
    open_note = " (still open at the end of the record)" if stall.get("seconds") is None else ""
    late_text = (f"stall {stall.get('episode')}: rank{'s' if len(late) != 1 else ''} {format_ranks(late) or '?'} late "
                 f"{seconds:.1f} s at {where} ({stall.get('verdict') or 'no verdict'}){open_note} — {stall.get('title') or ''}")
    wait_text = (f"stall {stall.get('episode')}: rank{'s' if len(waiting) != 1 else ''} {format_ranks(waiting)} waited "
                 f"{seconds:.1f} s in {what} for rank{'s' if len(late) != 1 else ''} {format_ranks(late) or '?'}{open_note}")
    roles: dict[int, str] = {}
    for rank in waiting:
        if rank in index:
            roles.setdefault(index[rank], "waiting")
    for rank in late:
        if rank in index:
            roles[index[rank]] = "late"
    out = []
    for lane, role in sorted(roles.items()):
        y = top + lane * LANE_H + 2
        color, text = (LATE, late_text) if role == "late" else (WAITING, wait_text)
        out.append(f'<rect x="{x0:.1f}" y="{y}" width="{width:.1f}" height="{BAR_H}" rx="2" fill="{color}">'
                   f"<title>{escape(text)}</title></rect>")
        if role == "late" and width > 70:
            out.append(f'<text x="{x0 + 4:.1f}" y="{y + 11}" fill="#fff" style="fill:#fff">{escape(short(str(where), int(width / 6.5)))}</text>')
    return out


def plan_lanes(timeline: Mapping[str, Any], stalls: list[Mapping[str, Any]], faults: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The lanes: each {ranks, label, title, late_s}; a rank per lane while few, grouped by part when many."""
    hosts = timeline.get("hosts") if isinstance(timeline.get("hosts"), Mapping) else {}
    world = timeline.get("world_size") if isinstance(timeline.get("world_size"), int) else None
    ranks = set(range(world)) if world and world <= 1 << 20 else set()
    parts: dict[int, list[tuple[int, str]]] = {}
    late_s: dict[int, float] = {}
    for stall in stalls:
        for rank in stall.get("waiting") or ():
            if isinstance(rank, int):
                parts.setdefault(rank, []).append((stall.get("episode") or 0, "w"))
        for rank in stall.get("late") or ():
            if isinstance(rank, int):
                parts.setdefault(rank, []).append((stall.get("episode") or 0, "L"))
                late_s[rank] = late_s.get(rank, 0.0) + _seconds(stall)
    for fault in faults:
        if isinstance(fault.get("rank"), int):
            parts.setdefault(fault["rank"], []).append((-1, str(fault.get("kind"))))
    ranks |= set(parts) | {int(r) for r in hosts if str(r).isdigit()}
    if len(ranks) <= MAX_RANK_LANES:
        return [_lane([r], late_s, hosts) for r in sorted(ranks)]
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(ranks):
        groups.setdefault(tuple(sorted(parts.get(rank, ()))), []).append(rank)
    lanes = [_lane(members, late_s, hosts) for members in groups.values()]
    if len(lanes) > MAX_LANES:
        lanes.sort(key=lambda lane: (-lane["late_s"], -len(lane["involved"]), lane["ranks"][0]))
        rest = [r for lane in lanes[MAX_LANES - 1:] for r in lane["ranks"]]
        lanes = lanes[:MAX_LANES - 1] + [_lane(rest, late_s, hosts, other=True)]
    return sorted(lanes, key=lambda lane: lane["ranks"][0])


def _lane(members: list[int], late_s: Mapping[int, float], hosts: Mapping[str, Any], other: bool = False) -> dict[str, Any]:
    members = sorted(members)
    seconds = sum(late_s.get(r, 0.0) for r in members)
    if len(members) == 1:
        host = hosts.get(str(members[0]))
        label = f"rank {members[0]}" + (f" on {host}" if host else "")
    else:
        label = ("other ranks " if other else "ranks ") + format_ranks(members)
    title = label if len(members) == 1 else f"{label} ({len(members)} ranks)"
    return {"ranks": members, "label": label, "title": title, "late_s": seconds,
            "involved": [r for r in members if late_s.get(r)]}


def straggler_profile(timeline: Mapping[str, Any]) -> str:
    """Per late rank: how many stalls, the seconds the others waited for it, the calls it was in (the outermost
    frame of its code where its stack parts from a waiting rank's: one row for a rank-0-only evaluation, not one
    per line its samples caught inside it)."""
    stalls = [s for s in timeline.get("stalls") or () if isinstance(s, Mapping)]
    hosts = timeline.get("hosts") if isinstance(timeline.get("hosts"), Mapping) else {}
    rows: dict[int, dict[str, Any]] = {}
    for stall in stalls:
        for rank in stall.get("late") or ():
            if not isinstance(rank, int):
                continue
            row = rows.setdefault(rank, {"stalls": 0, "seconds": 0.0, "waited": 0.0, "lines": {}})
            row["stalls"] += 1
            row["seconds"] += _seconds(stall)
            row["waited"] += _seconds(stall) * len(stall.get("waiting") or ())
            line = stall.get("call") or stall.get("where") or "(line unknown)"
            row["lines"][line] = row["lines"].get(line, 0) + 1
    if not rows:
        return ""
    ordered = sorted(rows.items(), key=lambda kv: (-kv[1]["seconds"], kv[0]))
    top = max(r["seconds"] for r in rows.values()) or 1.0
    body = []
    for rank, row in ordered[:MAX_PROFILE_ROWS]:
        lines = sorted(row["lines"].items(), key=lambda kv: -kv[1])[:3]
        bar = (f'<svg width="160" height="12" xmlns="http://www.w3.org/2000/svg"><rect width="{max(2, 160 * row["seconds"] / top):.1f}" '
               f'height="12" fill="{LATE}"/></svg>')
        host = hosts.get(str(rank))
        body.append(f"<tr><td>rank {rank}{escape(f' on {host}' if host else '')}</td><td class=\"num\">{row['stalls']}</td>"
                    f"<td class=\"num\">{row['seconds']:.1f}</td><td>{bar}</td><td class=\"num\">{row['waited']:.1f}</td>"
                    f"<td>{'<br>'.join(escape(f'{line} ({n}x)') for line, n in lines)}</td></tr>")
    more = (f'<p class="muted">{len(ordered) - MAX_PROFILE_ROWS} more late ranks in the JSON report.</p>'
            if len(ordered) > MAX_PROFILE_ROWS else "")
    return ("<h3>Straggler profile</h3><table><tr><th>late rank</th><th>stalls</th><th>seconds late</th><th></th>"
            "<th>rank-seconds waited by the others</th><th>where it was (the calls, most frequent first)</th></tr>"
            + "".join(body) + "</table>" + more)
