"""`distdoctor lint`: distributed-training mistakes visible in the source, found without running it.

    from distdoctor.lint import lint_paths, lint_text
    report = lint_paths(["train.py"])          # a distdoctor Report; findings carry data.path/line/col

Sources are parsed with ast and never imported or run. Each rule (distdoctor.lint.rules) is a
small function over a one-walk index of the module; importing this package registers the rules'
finding kinds (area ``lint``). Nothing here prints.
"""

from __future__ import annotations

import gc
import time
from typing import BinaryIO, Sequence

from distdoctor.core.findings import Finding
from distdoctor.lint.files import LintInputError, iter_sources
from distdoctor.lint.rules import RULES, Rule, rules_by_id
from distdoctor.lint.settings import LintSettings, LintSettingsError, load_settings
from distdoctor.lint.source import NOT_PARSED, SourceResult, lint_source
from distdoctor.core.report import Report, WorldSummary, build_report
import io

__all__ = ["lint_paths", "lint_text", "all_ids", "LintInputError", "LintSettings", "LintSettingsError",
           "load_settings", "RULES"]

LAUNCHER = "lint"


def all_ids() -> list[str]:
    return sorted([NOT_PARSED.id, *rules_by_id()], key=lambda i: i[-3:])


def lint_paths(paths: Sequence[str], settings: LintSettings | None = None, *, stdin: BinaryIO | None = None,
               stdin_name: str = "<stdin>") -> Report:
    """Lint files, directories (recursively) or "-" (stdin); raises LintInputError for a missing path."""
    settings = settings or LintSettings()
    started = time.monotonic()
    rules = [r for r in rules_by_id().values() if settings.wants(r.id)]
    findings: list[Finding] = []
    suppressed: list[Finding] = []
    files = lines = analysed = 0
    timings: dict[str, float] = {}
    # Syntax trees hold no reference cycles (refcounting frees them), yet their millions of small
    # objects keep triggering the cycle collector: pausing it makes linting markedly faster.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for source in iter_sources(paths, exclude=settings.exclude, stdin=stdin, stdin_name=stdin_name):
            files += 1
            if source.text is None:
                result = SourceResult(findings=[_unreadable(source.name, source.error or "")])
            else:
                result = lint_source(source.text, source.name, rules)
            lines += result.lines
            analysed += result.analysed
            for step, seconds in result.timings.items():
                timings[step] = timings.get(step, 0.0) + seconds
            findings += [f for f in result.findings if settings.wants(f.id)]
            suppressed += [f for f in result.suppressed if settings.wants(f.id)]
    finally:
        if collecting:
            gc.enable()
    elapsed = time.monotonic() - started
    counts = {"files": files, "lines": lines, "analysed": analysed}
    return _report(findings, suppressed, rules, counts, timings, elapsed)


def lint_text(text: str, path: str = "<string>", settings: LintSettings | None = None) -> Report:
    """Lint a source held in memory (tests, editors)."""

    return lint_paths(["-"], settings, stdin=io.BytesIO(text.encode("utf-8")), stdin_name=path)


def _unreadable(name: str, error: str) -> Finding:
    return NOT_PARSED(f"{name} could not be read, so it was not linted", detail=f"{name}: {error}",
                      data={"path": name, "line": 1, "col": 1, "end_line": 1, "source": "", "rule": "read"},
                      check="lint")


def _report(findings: list[Finding], suppressed: list[Finding], rules: list[Rule], counts: dict,
            timings: dict[str, float], elapsed: float) -> Report:
    """One pseudo-check per rule (its findings, its time summed over the files), and one for parsing."""
    per_rule: dict[str, int] = {}
    for finding in findings:
        per_rule[finding.id] = per_rule.get(finding.id, 0) + 1
    checks = [{"name": f"{r.id} {r.find.__name__}", "stage": "lint", "status": "fail" if per_rule.get(r.id) else "pass",
               "duration_s": round(timings.get(r.id, 0.0), 4), "findings": per_rule.get(r.id, 0)} for r in rules]
    checks.append({"name": "parse", "stage": "lint", "status": "fail" if per_rule.get(NOT_PARSED.id) else "pass",
                   "duration_s": round(timings.get("parse", 0.0), 4), "index_s": round(timings.get("index", 0.0), 4),
                   **counts})
    report = build_report(findings, checks, world=WorldSummary(launcher=LAUNCHER), duration_s=elapsed)
    report.silenced = suppressed
    report.findings.sort(key=_location_order)
    return report


def _location_order(finding: Finding) -> tuple:
    data = finding.data or {}
    return (-int(finding.severity), str(data.get("path", "")), int(data.get("line", 0)), int(data.get("col", 0)),
            finding.id)
