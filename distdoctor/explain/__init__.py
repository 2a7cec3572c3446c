"""`distdoctor explain`: name the cause of a failed job from its logs."""

#     from distdoctor.explain import explain_files
#     report = explain_files(["rank0.log", "rank1.log"])   # a distdoctor.core.report.Report
#
# The signature catalog (catalog.toml) is data; scan.py matches it against the logs in bounded
# memory; reason.py turns the matches into findings with a cause, a confidence and the evidence.
# Beside the scan, ranks.py collects what each rank's own lines say (its exception, its exit in
# torchrun's summary, NCCL's watchdog progress, where its output was last seen working);
# structured.py reads error files, flight-recorder dumps and snapshots; activity.py sets each rank's
# output against its peers' first complaints (who kept going, who went quiet); snapshots.py makes
# one RankSnapshot per rank and job.py merges the one diagnosis (distdoctor.diagnosis.diagnose) with
# the catalog's findings: the first failure is the cause, the rest its consequences, and a
# recognised exception's meaning is the cause while its frame stays in the title. candidates.py ranks
# what a message that names no cause could mean, from the labelled threads (threads.toml, priors.py);
# attempts.py reads a job torchelastic restarted attempt by attempt. Importing this package registers
# the catalog's finding IDs (area ``log``). Nothing here prints.

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import BinaryIO, Iterable, Sequence

from distdoctor.core.kinds import CHECK_CRASHED

from distdoctor.explain.attempts import (earlier_attempts_finding, keep_stdin, mark_last_attempt,
                                              split_attempts)
from distdoctor.explain.catalog import Catalog, CatalogError, load_catalog
from distdoctor.explain.own_reports import read_reports
from distdoctor.explain.reader import LogInputError, LogSource, open_sources
from distdoctor.explain import reader as _reader
from distdoctor.explain.reason import findings_from, skipped_finding
from distdoctor.explain.scan import Accumulator, Scanner
from distdoctor.explain.job import job_findings, rank_config_finding
from distdoctor.explain.locality import one_host
from distdoctor.explain.snapshots import JobEvidence, anonymous_error, build_snapshots, error_lines
from distdoctor.explain.structured import read_structured
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
    """Read the logs (paths, directories, or "-" for stdin) and return a Report; raises LogInputError on bad input."""
    started = time.monotonic()
    catalog = catalog or CATALOG
    sources = open_sources(list(inputs), stdin=stdin)
    spool = keep_stdin(sources)
    try:
        job = _read_job(sources, catalog, marks={})
        attempts = split_attempts(sources, job.marks, spool)
        if len(attempts) > 1:
            # Each attempt read on its own: the job ended as its last attempt did; the earlier ones
            # are listed with their own causes.
            runs = [(number, _read_job(part, catalog)) for number, part in attempts]
            last = runs[-1][1]
            earlier = earlier_attempts_finding([(n, r.findings) for n, r in runs[:-1]], runs[-1][0], catalog)
            job = _Job(mark_last_attempt(last.findings, runs[-1][0], len(runs)) + [earlier], job.checks,
                       job.ranks_seen | last.ranks_seen, job.marks)
    finally:
        if spool is not None:
            spool.close()
    order = {id(f): i for i, f in enumerate(job.findings)}
    ranking = {f.merge_key: order[id(f)] for f in job.findings}
    report = build_report(
        job.findings,
        job.checks,
        world=WorldSummary(size=None, launcher=LAUNCHER, ranks_reported=tuple(sorted(job.ranks_seen))),
        duration_s=time.monotonic() - started,
        silence=silence,
    )
    # build_report orders by severity and ID; a log diagnosis is ordered by likelihood instead.
    report.findings.sort(key=lambda f: (-int(f.severity), ranking.get(f.merge_key, len(ranking))))
    return report


@dataclass
class _Job:
    findings: list
    checks: list[dict]
    ranks_seen: set[int]
    marks: dict


def _read_job(sources: list[LogSource], catalog: Catalog, marks: dict | None = None) -> _Job:
    """Read the inputs as one job: the catalog's findings merged with the job's diagnosis. marks: where
    torchelastic's attempts start in each input, filled while reading (None: not looked for)."""
    acc = Accumulator()
    evidence = JobEvidence()
    scanner = Scanner(catalog, acc, evidence.collector, marks=marks)
    checks, skipped = [], []
    for index, source in enumerate(sources):
        try:
            checks.append(_read_one(source, index, acc, scanner, evidence))
        except LogInputError as exc:
            if not source.in_directory:
                raise
            # One bad file among a directory's many is named, not fatal.
            skipped.append(str(exc))
            checks.append({"name": f"read {source.name}", "stage": "log", "status": "skip", "duration_s": 0.0,
                           "reason": str(exc)})
        finally:
            _close(source)
    # A rank is silent only if all its files are empty (--log-dir's stderr.log is empty when all went well).
    spoke = {r for r, t in evidence.collector.ranks.items() if t.lines}
    acc.empty_ranks -= spoke
    # --log-dir's stderr.log is empty when its rank printed only to stdout.log: not a silent rank.
    acc.empty_files = [f for f in acc.empty_files if acc.empty_file_ranks.get(f) not in spoke]
    acc.progress_seen = bool(evidence.collector.progress)
    acc.quiet_ranks -= {r for r, t in evidence.collector.ranks.items() if t.errors or t.error_file}
    acc.one_host = one_host(acc, evidence.collector)
    findings = findings_from(acc, catalog, evidence.collector.progress)
    snaps: list = []
    try:
        snaps = build_snapshots(evidence, catalog, empty=acc.empty_ranks)
        anonymous = anonymous_error(evidence.collector, snaps, catalog)
        findings = job_findings(snaps, findings, acc, catalog, error_lines(evidence.collector), anonymous,
                                evidence.activity)
        disagreement = rank_config_finding(evidence.collector, catalog)
        if disagreement is not None:
            findings.insert(0, disagreement)  # the job was not one world: what failed afterwards follows from it
    except Exception as exc:  # noqa: BLE001 - the line-by-line reading stands; a report, never a traceback
        findings.append(_reading_broke(exc))
    if skipped:
        findings.append(skipped_finding(skipped, catalog))
    return _Job(findings, checks, acc.ranks_seen | {s.rank for s in snaps}, marks or {})


def _read_one(source: LogSource, index: int, acc: Accumulator, scanner: Scanner, evidence: JobEvidence) -> dict:
    """Read one input as what it is (a report, an error file, a recorder dump, a log); its pseudo-check."""
    t0 = time.monotonic()
    if source.skip_reason:
        raise LogInputError(f"{source.name}: {source.skip_reason}")
    before = sum(g.count for g in acc.groups.values())
    structured = read_structured(source, evidence)
    if structured is not None:
        # Evidence for the job's diagnosis, not a failure found in this file by itself.
        return _read_check(source, 0, time.monotonic() - t0, kind=structured)
    reports = read_reports(source)
    if reports is not None:
        acc.own_reports += [(source.name, r) for r in reports]
        found = sum(len(r.get("findings", [])) for r in reports)
        return _read_check(source, found, time.monotonic() - t0, kind="distdoctor report")
    scanner.scan(source, index)
    if source.empty:
        _record_empty(acc, source)
    matched = sum(g.count for g in acc.groups.values()) - before
    return _read_check(source, matched, time.monotonic() - t0)


def _reading_broke(exc: Exception):
    """The reading across ranks raised (a bug): said, with the traceback's end for the report."""
    tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
    return CHECK_CRASHED(
        "explain's reading across ranks raised an exception; the findings above come from the lines alone",
        detail=f"{type(exc).__name__}: {exc}\n{tail}"[:2000], check="explain")


def _close(source: LogSource) -> None:
    """A directory may hold thousands of files: never keep one open past its reading."""
    if source.owns_stream and source.stream is not None:
        source.stream.close()
        source.stream = None


def explain_text(text: str, **kwargs) -> Report:
    """Explain a log held in memory (tests, notebooks)."""

    return explain_files(["-"], stdin=io.BytesIO(text.encode("utf-8")), **kwargs)


def _record_empty(acc: Accumulator, source: LogSource) -> None:
    """An empty log is evidence: its rank printed nothing (hung or killed before its first line)."""
    acc.empty_files.append(source.name)
    if source.rank_hint is not None:
        acc.empty_file_ranks[source.name] = source.rank_hint
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
    if source.not_utf8:
        check["reason"] = ("not UTF-8 text (latin-1, cp1252, GBK ...?): its bytes that are not UTF-8 were replaced; "
                           "the English messages torch and NCCL print read exactly")
    if source.encoding != "utf-8":
        check["reason"] = f"read as {source.encoding.upper()} text"
    if source.skipped_bytes:
        check["reason"] = (f"too large to read whole: its first {_reader.HEAD_BYTES >> 20} MiB and its last "
                           f"{max(0, source.bytes - source.skipped_bytes - _reader.HEAD_BYTES) >> 20} MiB were read, the "
                           f"{source.skipped_bytes >> 20} MiB between only counted (line numbers stay true)")
        check["skipped_bytes"] = source.skipped_bytes
    if source.empty:
        check["reason"] = "empty: the process printed nothing"
    if kind != "log":
        check["reason"] = f"read as a {kind}"
    return check
