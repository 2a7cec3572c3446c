"""The guard's slow-rank accounting: which rank the job waits for, what it costs, where and why (docs/slow-ranks.md)."""

from __future__ import annotations

import sys
from typing import Any

SLOW_FILE = "slow_ranks.json"


def start(guard: Any) -> Any:
    """The accounting of this guarded process, started; None when it is off (GuardSettings.slow)."""
    settings = guard.settings
    if getattr(settings, "slow", "off") != "on":
        return None
    from distdoctor.embedded.guard.pace.meter import Meter  # the accounting's modules load only when it is on

    return Meter(guard, settings.slow_window).start()


def conclude(guard: Any, meter: Any) -> bool:
    """At the end of the run: every rank's last window published; on rank 0 the run's verdict said
    (a balanced job says nothing), slow_ranks.json and the JSON report written. True when rank 0 wrote them."""
    from distdoctor.embedded.guard import evidence  # only at the end of a run

    verdict = meter.finish()
    watcher = meter.watcher
    if verdict is None or watcher is None or not (verdict.findings or watcher.episodes):
        return False
    report_dir = guard.settings.report_dir
    # The run is drawn (report.html, trace.json: evidence.finish) when a rank held it up; a spread or
    # contention alone is said and kept in the JSON report, and a healthy run's directory stays as it was.
    named = watcher.episodes or any(f.id in ("slow.W001", "slow.W002") for f in verdict.findings)
    wrote = bool(named) and evidence.write_document(report_dir, SLOW_FILE, watcher.document(verdict)) is not None
    findings = verdict.findings
    if findings:
        report = guard.report(findings, ranks=sorted(watcher.totals))
        where = f"; every figure in {report_dir}/{SLOW_FILE}" if wrote else ""
        heading = (f"distdoctor guard (rank {guard.rank}): the job's pace over the run "
                   f"({len(watcher.totals)} ranks heard from{where}):")
        try:
            sys.stderr.write(guard.render(report, heading) + "\n")
            sys.stderr.flush()
        except Exception:  # stderr closed: the files keep it
            pass
        guard.write_json(report, "slow")
    return wrote
