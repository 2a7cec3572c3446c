"""Report -> one self-contained HTML page: the findings as the terminal shows them, and pictures of the run."""

# Self-contained: inline CSS and SVG, no script, no network (a Content-Security-Policy forbids any
# load and any script, so even a string that escaped escaping could not run). Every text that comes
# from a job — rank names, hosts, lines of code, exception messages — goes through escape(). The
# pictures are drawn from the report's plain data: data.stacks (`stacks`' ranks) and data.bench (the
# link matrix) by core.html_pictures; the guard's run (data.timeline) by the drawer its caller hands
# in (timeline.html_run.DRAWERS). Nothing here prints.

from __future__ import annotations

import sys
from typing import Any, Mapping

from distdoctor.core import html_pictures as pictures
from distdoctor.core.html_pictures import escape
from distdoctor.core.findings import Finding, Severity
from distdoctor.core.render import about_line, summary_line
from distdoctor.core.report import Report, format_ranks, format_where

HEAD_MARK = "<!DOCTYPE html>\n<!-- distdoctor report"
MAX_DETAIL_LINES = 60
MAX_FINDINGS_SHOWN = 300
_HEADING = {Severity.CRITICAL: "Critical", Severity.ERROR: "Errors", Severity.WARNING: "Warnings", Severity.INFO: "Info"}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:18px 22px 40px}
h1{font-size:21px;margin:4px 0 6px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #d9dde3;padding-bottom:4px}
.status{display:inline-block;padding:1px 9px;border-radius:10px;font-size:13px;color:#fff;vertical-align:2px}
.s-ok{background:#2e7d32}.s-warning{background:#b26a00}.s-error{background:#c62828}.s-incomplete{background:#6a1b9a}
.summary{font-weight:600;margin:4px 0}.about,.muted{color:#5b6473;font-size:12.5px}
.card{background:#fff;border:1px solid #dde1e7;border-left:5px solid #999;border-radius:5px;padding:9px 13px;margin:9px 0}
.sev-critical{border-left-color:#7f0000}.sev-error{border-left-color:#c62828}.sev-warning{border-left-color:#d98c00}
.sev-info{border-left-color:#1e88e5}
.fid{font:600 13px ui-monospace,SFMono-Regular,Menlo,monospace}.cause{color:#5b6473;font-size:12.5px}
.title{font-weight:600}.where{color:#404a5a;font-size:13px;margin:3px 0}
pre{background:#f3f4f6;border-radius:4px;padding:7px 9px;overflow-x:auto;font:12.5px/1.4 ui-monospace,Menlo,monospace;
white-space:pre-wrap;word-break:break-word;margin:6px 0}
.fix{color:#1b5e20;margin:4px 0}.docs{color:#5b6473;font-size:12px}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0}
th,td{border:1px solid #dde1e7;padding:4px 8px;text-align:left;vertical-align:top}th{background:#eef0f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{background:#fff;border:1px solid #dde1e7;border-radius:5px;margin:8px 0;padding:8px 10px}
figcaption{font-size:12.5px;color:#404a5a;margin-top:4px}
svg text{font:11px system-ui,sans-serif;fill:#1d2330}svg .late-label{fill:#b71c1c;font-weight:700}
.lacks li{color:#6d4c00}
"""


def producer_version() -> str:
    """distdoctor's version, read from the package already loaded (core imports nothing above it)."""
    return str(getattr(sys.modules.get("distdoctor"), "__version__", "unknown"))


def render_html(report: Report, *, title: str = "distdoctor report", verbose: bool = False,
                drawers: Mapping[str, pictures.Drawer] | None = None) -> str:
    """The whole page; ``drawers``: pictures drawn above core, by the data key they draw."""
    status = report.status
    __version__ = producer_version()
    parts = [f"{HEAD_MARK} {escape(__version__)} -->", '<html lang="en"><head><meta charset="utf-8">',
             f'<meta name="generator" content="distdoctor {escape(__version__)}">',
             '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'; '
             'img-src data:">', '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{escape(title)}: {escape(status)}</title>", f"<style>{STYLE}</style></head><body><main>",
             f'<h1>{escape(title)} <span class="status s-{escape(status)}">{escape(status)}</span></h1>',
             f'<p class="summary">{escape(_summary(report))}</p>']
    if report.about:
        parts.append(f'<p class="about">{escape(_about(report.about))}</p>')
    data = report.data if isinstance(report.data, Mapping) else {}
    parts += pictures.sections(data, report.findings, drawers)
    parts.append(_findings(report, verbose=verbose))
    if verbose and report.checks:
        parts.append(_checks(report.checks))
    parts.append('<p class="muted">The JSON of this report (<code>--format json</code>) holds every value; this page '
                 "bounds what it draws and says where.</p></main></body></html>")
    return "\n".join(parts) + "\n"


def _summary(report: Report) -> str:
    return summary_line(report)  # the terminal's summary, word for word


def _about(about: Mapping[str, Any]) -> str:
    return about_line(dict(about))


def _findings(report: Report, *, verbose: bool) -> str:
    if not report.findings:
        return "<h2>Findings</h2><p>No findings.</p>"
    out = ["<h2>Findings</h2>"]
    shown = 0
    for severity in sorted(Severity, reverse=True):
        group = [f for f in report.findings if f.severity == severity]
        if not group:
            continue
        out.append(f"<h3>{escape(_HEADING[severity])} ({len(group)})</h3>")
        for finding in group:
            if shown >= MAX_FINDINGS_SHOWN:
                break
            out.append(_finding(finding, verbose=verbose))
            shown += 1
    if len(report.findings) > shown:
        out.append(f'<p class="muted">{len(report.findings) - shown} more findings in the JSON report.</p>')
    return "\n".join(out)


def _finding(finding: Finding, *, verbose: bool) -> str:
    sev = finding.severity.label
    head = (f'<div class="card sev-{escape(sev)}"><span class="fid">{escape(finding.id)}</span> '
            f'<span class="cause">[{escape(finding.cause)}]</span> <span class="title">{escape(finding.title)}</span>')
    if finding.confidence is not None:
        head += f' <span class="muted">(confidence {finding.confidence:.0%})</span>'
    body = [head]
    where = format_where(finding)
    if where:
        body.append(f'<div class="where">where: {escape(where)}</div>')
    if finding.detail:
        lines = finding.detail.splitlines()
        if not verbose and len(lines) > MAX_DETAIL_LINES:
            lines = lines[:MAX_DETAIL_LINES] + [f"… {len(finding.detail.splitlines()) - MAX_DETAIL_LINES} more lines "
                                                "(--verbose, or the JSON report)"]
        body.append(f"<pre>{escape(chr(10).join(lines))}</pre>")
    if finding.remediation:
        body.append(f'<div class="fix">fix: {escape(finding.remediation)}</div>')
    body.append(f'<div class="docs">docs: distdoctor show {escape(finding.id)}</div></div>')
    return "\n".join(body)


def _checks(checks: list[dict[str, Any]]) -> str:
    rows = "".join(f"<tr><td>{escape(c.get('name'))}</td><td>{escape(c.get('stage'))}</td><td>{escape(c.get('status'))}"
                   f"</td><td class=\"num\">{float(c.get('duration_s') or 0):.3f}</td><td>"
                   f"{escape(format_ranks(c['ranks']) if c.get('ranks') else '')}</td><td>{escape(c.get('reason') or '')}"
                   "</td></tr>" for c in checks[:2000])
    return ("<h2>Checks</h2><table><tr><th>check</th><th>stage</th><th>status</th><th>seconds</th><th>ranks</th>"
            f"<th>reason</th></tr>{rows}</table>")
