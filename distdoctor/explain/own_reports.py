"""Read distdoctor's own JSON reports (schema distdoctor.report/1) given to `explain`, and say what they found."""

# `distdoctor check --format json`, `preflight()`'s report and the runtime guard's hang reports all
# use the one schema; they are read generically: every finding they carry is shown again, with its
# own ID and cause, marked as coming from that report. Several reports in one file (one JSON object
# per rank, or JSON lines) are all read. Anything that is not such a report is read as a log.

from __future__ import annotations

import json
from typing import Any, Iterator

from distdoctor.explain.reader import LogSource, peek
from distdoctor.explain.sanitize import clean_quote
from distdoctor.core.causes import CAUSES
from distdoctor.core.findings import ID_PATTERN, Finding, Severity

SCHEMA_PREFIX = "distdoctor.report/"
MAX_REPORT_BYTES = 32 << 20  # larger inputs are logs, read in bounded blocks
MAX_FINDINGS = 500
MAX_TEXT = 4000
CHECK_NAME = "explain"


def read_reports(source: LogSource) -> list[dict] | None:
    """The reports in this input, or None when it is not a distdoctor report (then read it as a log)."""
    objects = read_json(source)
    reports = [obj for obj in objects or () if _is_report(obj)]
    if not reports:
        return None
    consume(source)
    return reports


def read_json(source: LogSource) -> list[Any] | None:
    """The JSON objects an input holds (one, several, JSON lines), or None when it does not start as JSON.

    The bytes stay in source.prefix, so an input that is not what the caller wants is read as a log.
    """
    if source.json_read:
        return source.json_objects
    source.json_read = True
    head = source.prefix if source.prefix else peek(source, 64)
    if not head.lstrip().startswith(b"{"):
        return None
    rest = source.stream.read(MAX_REPORT_BYTES) if source.stream is not None else b""
    data = head + rest
    source.prefix = data
    if len(data) > MAX_REPORT_BYTES:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    source.json_objects = list(_json_objects(text))
    return source.json_objects


def consume(source: LogSource) -> None:
    """The input was read as structured data: count it, and do not scan it again as a log."""
    data = source.prefix
    source.prefix = b""
    source.bytes = len(data)
    source.lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _json_objects(text: str) -> Iterator[Any]:
    """One JSON object, several concatenated, or JSON lines; stops at the first non-JSON text."""
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return
        yield obj


def _is_report(obj: Any) -> bool:
    return isinstance(obj, dict) and str(obj.get("schema", "")).startswith(SCHEMA_PREFIX) \
        and isinstance(obj.get("findings", []), list)


def findings_of_report(report: dict, file: str) -> list[Finding]:
    """The report's findings, shown again as they were (ID, cause, severity), marked with their source."""
    status = _text(report.get("status", "?"), 40)
    kind = "hang report" if _looks_like_hang_report(report) else "report"
    out = []
    for raw in report.get("findings", [])[:MAX_FINDINGS]:
        finding = _finding(raw, file, status, kind)
        if finding is not None:
            out.append(finding)
    return out


MAX_FILES_NAMED = 3  # reports named in a folded finding's detail; data.also_in lists the rest by count


def fold_alike(findings: list[Finding]) -> list[Finding]:
    """One finding for each verdict several reports carry: every rank of a failed job may write its
    own report with the same verdict (the failing rank's, and each peer whose call failed with it),
    and 4,096 copies of one answer read as 4,096 answers. The first keeps its place and names the others."""
    firsts: dict[tuple, int] = {}
    files: dict[int, list[str]] = {}
    out: list[Finding] = []
    for finding in findings:
        key = (finding.id, finding.cause, finding.ranks, finding.title)
        if key in firsts:
            files[firsts[key]].append(str(finding.data.get("from_report", "")))
            continue
        firsts[key] = len(out)
        files[len(out)] = []
        out.append(finding)
    for index, others in files.items():
        if others:
            named = ", ".join(others[:MAX_FILES_NAMED]) + (f" and {len(others) - MAX_FILES_NAMED} more"
                                                           if len(others) > MAX_FILES_NAMED else "")
            finding = out[index]
            out[index] = finding.with_(
                detail=f"{finding.detail}\nThe same finding is in {len(others)} more report"
                       f"{'s' if len(others) > 1 else ''}: {named}",
                data={**finding.data, "also_in": len(others)})
    return out


def summary(reports: list[dict]) -> str:
    """One line: what the reports say overall."""
    statuses = [_text(r.get("status", "?"), 40) for r in reports]
    counts = sum(len(r.get("findings", [])) for r in reports)
    incomplete = any(r.get("incomplete") for r in reports)
    return (f"{len(reports)} distdoctor report{'s' if len(reports) != 1 else ''} (status {', '.join(statuses)}), "
            f"{counts} finding{'s' if counts != 1 else ''}" + (", cut off by its deadline (incomplete)" if incomplete else ""))


def _looks_like_hang_report(report: dict) -> bool:
    """The runtime guard's reports name a hang (by check or cause); the schema is the same."""
    for f in report.get("findings", [])[:MAX_FINDINGS]:
        if not isinstance(f, dict):
            continue
        where = f"{f.get('check', '')} {f.get('id', '')}".lower()
        if f.get("cause") == "collective_timeout_hang" or any(w in where for w in ("hang", "guard", "watchdog")):
            return True
    return False


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    return clean_quote(str(value)[:limit])


def _finding(raw: Any, file: str, status: str, kind: str) -> Finding | None:
    """A finding read back; None for an entry that is not a valid finding (a hand-edited file)."""
    if not isinstance(raw, dict) or not ID_PATTERN.match(str(raw.get("id", ""))[:40]):
        return None
    cause = str(raw.get("cause", "unknown"))
    try:
        severity = Severity.parse(str(raw.get("severity", "")))
        ranks = tuple(int(r) for r in raw.get("ranks", ()) if isinstance(r, int) and 0 <= r < 10_000_000)
    except (ValueError, TypeError):
        return None
    check = _text(raw.get("check", ""), 200)
    data = raw.get("data") if isinstance(raw.get("data"), dict) else {}
    detail = [f"From distdoctor's {kind} {file} (status {status}{', check ' + check if check else ''}):"]
    if raw.get("detail"):
        # Line by line: cleaning strips control characters, and a report's detail keeps its lines.
        detail += [_text(line) for line in str(raw["detail"])[:MAX_TEXT].splitlines()]
    return Finding(
        id=str(raw["id"]),
        severity=severity,
        cause=cause if cause in CAUSES else "unknown",
        title=_text(raw.get("title", ""), 400),
        detail="\n".join(detail),
        remediation=_text(raw.get("remediation", "")),
        ranks=ranks,
        hosts=tuple(_text(h, 200) for h in raw.get("hosts", ())[:64] if isinstance(h, str)),
        check=CHECK_NAME,
        data={"from_report": file, "report_status": status, "original_check": check,
              "original_data_keys": sorted(str(k)[:80] for k in list(data)[:50])},
        # A live check's finding has no confidence (it observed, it did not infer): keep it so.
        confidence=None if raw.get("confidence") is None else _confidence(raw.get("confidence")),
    )


def _confidence(value: Any) -> float | None:
    try:
        return min(1.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return None
