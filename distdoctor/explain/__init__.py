"""`distdoctor explain`: name the cause of a failed job from its logs."""

#     from distdoctor.explain import explain_files
#     report = explain_files(["rank0.log", "rank1.log"])   # a distdoctor.core.report.Report
#
# The signature catalog (catalog.toml) is data; scan.py matches it against the logs in bounded
# memory; reason.py turns the matches into findings with a cause, a confidence and the evidence.
# Importing this package registers the catalog's finding IDs (area ``log``). Nothing here prints.

from __future__ import annotations

import time
from typing import BinaryIO, Iterable, Sequence

from distdoctor.explain.catalog import Catalog, CatalogError, load_catalog
from distdoctor.explain.own_reports import read_reports
from distdoctor.explain.reader import LogInputError, LogSource, open_sources
from distdoctor.explain.reason import findings_from
from distdoctor.explain.scan import Accumulator, Scanner
from distdoctor.core.report import Report, WorldSummary, build_report
import io

__all__ = ["explain_files", "explain_text", "LogInputError", "CatalogError", "load_catalog"]

LAUNCHER = "log"

# Registering the finding kinds is a side effect of loading the catalog.
CATALOG: Catalog = load_catalog()


def explain_files(
    inputs: Sequence[str],
    *,
    stdin: BinaryIO | None = None,
    silence: Iterable[str] = (),
    catalog: Catalog | None = None,
) -> Report:
    """Read the logs (paths, or "-" for stdin) and return a Report; raises LogInputError on bad input."""
    started = time.monotonic()
    catalog = catalog or CATALOG
    sources = open_sources(list(inputs), stdin=stdin)
    acc = Accumulator()
    scanner = Scanner(catalog, acc)
    checks = []
    for index, source in enumerate(sources):
        t0 = time.monotonic()
        before = sum(g.count for g in acc.groups.values())
        reports = read_reports(source)
        if reports is not None:
            acc.own_reports += [(source.name, r) for r in reports]
            found = sum(len(r.get("findings", [])) for r in reports)
            checks.append(_read_check(source, found, time.monotonic() - t0, kind="distdoctor report"))
            continue
        scanner.scan(source, index)
        if source.empty:
            _record_empty(acc, source)
        matched = sum(g.count for g in acc.groups.values()) - before
        checks.append(_read_check(source, matched, time.monotonic() - t0))
    findings = findings_from(acc, catalog)
    order = {id(f): i for i, f in enumerate(findings)}
    ranking = {f.merge_key: order[id(f)] for f in findings}
    report = build_report(
        findings,
        checks,
        world=WorldSummary(size=None, launcher=LAUNCHER, ranks_reported=tuple(sorted(acc.ranks_seen))),
        duration_s=time.monotonic() - started,
        silence=silence,
    )
    # build_report orders by severity and ID; a log diagnosis is ordered by likelihood instead.
    report.findings.sort(key=lambda f: (-int(f.severity), ranking.get(f.merge_key, len(ranking))))
    return report


def explain_text(text: str, **kwargs) -> Report:
    """Explain a log held in memory (tests, notebooks)."""

    return explain_files(["-"], stdin=io.BytesIO(text.encode("utf-8")), **kwargs)


def _record_empty(acc: Accumulator, source: LogSource) -> None:
    """An empty log is evidence: its rank printed nothing (hung or killed before its first line)."""
    acc.empty_files.append(source.name)
    if source.rank_hint is not None:
        acc.empty_ranks.add(source.rank_hint)
        acc.ranks_seen.add(source.rank_hint)


def _read_check(source: LogSource, matched: int, duration: float, kind: str = "log") -> dict:
    """Each log read is listed as a pseudo-check, so --verbose shows what was read."""
    check = {
        "name": f"read {source.name}",
        "stage": "log",
        "status": "fail" if matched else "pass",
        "duration_s": round(duration, 4),
        "lines": source.lines,
        "bytes": source.bytes,
        "matched_lines": matched,
    }
    if source.rank_hint is not None:
        check["rank_hint"] = source.rank_hint
    if source.replaced_bytes:
        check["reason"] = "some bytes were not UTF-8 and were replaced"
    if source.empty:
        check["reason"] = "empty: the process printed nothing"
    if kind != "log":
        check["reason"] = f"read as a {kind}"
    return check
