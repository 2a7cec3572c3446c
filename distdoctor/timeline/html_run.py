"""The guard's run drawn for the HTML page: the stalls, the straggler profile, the job's pace; core draws the page around it."""

# core.html draws the page and the pictures core owns; the run's pictures live here, beside the data
# they draw (data.timeline, made by timeline.job_report): callers hand DRAWERS to render_html, or
# call run_page.

from __future__ import annotations

import datetime
from typing import Any, Mapping

from distdoctor.core.findings import Finding
from distdoctor.core.html import render_html
from distdoctor.core.html_pictures import escape
from distdoctor.timeline.html_pace import pace_section
from distdoctor.timeline.html_stalls import stall_timeline, straggler_profile


def run_section(timeline: Mapping[str, Any], findings: list[Finding]) -> str:
    stalls = [s for s in timeline.get("stalls") or () if isinstance(s, Mapping)]
    out = ["<h2>The run</h2>"]
    omitted = timeline.get("omitted") if isinstance(timeline.get("omitted"), Mapping) else None
    total = sum(float(s.get("seconds") or 0) for s in stalls) + float((omitted or {}).get("seconds") or 0)
    count = len(stalls) + int((omitted or {}).get("omitted") or 0)
    origin = timeline.get("origin_epoch_s")
    out.append(f'<p>{count} stall{"s" if count != 1 else ""} past the hang timeout, {total:.1f} s waited in all, over '
               f'{float(timeline.get("length_s") or 0):.1f} s of record'
               + (f' from {escape(_utc(origin))}' if isinstance(origin, (int, float)) else "") + ".</p>")
    if stalls or timeline.get("faults"):
        out.append(stall_timeline(timeline))
    if omitted and omitted.get("omitted"):
        longest = omitted.get("longest") if isinstance(omitted.get("longest"), Mapping) else {}
        out.append(f'<p class="muted">{escape(omitted.get("omitted"))} more stalls are summed up in stalls.json, not drawn'
                   + (f'; the longest of them {escape(longest.get("seconds"))} s: rank {escape(longest.get("late_rank"))} '
                      f'at {escape(longest.get("where"))}' if longest else "") + ".</p>")
    out.append(straggler_profile(timeline))
    if isinstance(timeline.get("pace"), Mapping):
        out.append(pace_section(timeline["pace"], timeline))
    lacks = [str(x) for x in timeline.get("lacks") or ()]
    if lacks:
        out.append('<h3>What the record lacks</h3><ul class="lacks">' + "".join(f"<li>{escape(x)}</li>" for x in lacks[:20])
                   + "</ul>")
    return "\n".join(out)


DRAWERS = {"timeline": run_section}


def run_page(report: Any, *, title: str = "distdoctor: the run", verbose: bool = False) -> str:
    """The whole page of a report whose data holds a guarded run."""
    return render_html(report, title=title, verbose=verbose, drawers=DRAWERS)


def _utc(epoch: float) -> str:
    try:
        return datetime.datetime.fromtimestamp(float(epoch), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return "?"
