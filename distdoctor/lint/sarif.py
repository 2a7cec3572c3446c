"""SARIF 2.1.0 output of a lint report, for GitHub code scanning and other SARIF viewers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from distdoctor.core.findings import Finding, Severity
from distdoctor.core.report import Report

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.CRITICAL: "error", Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def render_sarif(report: Report, kinds: list[Any], *, version: str, root: Path | None = None) -> str:
    """One run; every rule that was selected is listed, suppressed findings carry an inSource suppression."""
    root = (root or Path.cwd()).resolve()
    rules = [_rule(kind) for kind in kinds]
    index = {kind.id: i for i, kind in enumerate(kinds)}
    results = [_result(f, index, root, suppressed=False) for f in report.findings]
    results += [_result(f, index, root, suppressed=True) for f in report.silenced]
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "distdoctor", "semanticVersion": version, "version": version,
                                "rules": rules}},
            "originalUriBaseIds": {"SRCROOT": {"uri": root.as_uri() + "/"}},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }
    return json.dumps(log, indent=2)


def _rule(kind: Any) -> dict[str, Any]:
    return {
        "id": kind.id,
        "name": kind.id.replace(".", "_"),
        "shortDescription": {"text": kind.title},
        "fullDescription": {"text": f"{kind.title} (cause: {kind.cause})"},
        "help": {"text": kind.hint, "markdown": f"{kind.hint}\n\nRun `distdoctor show {kind.id}` for the wrong and right examples."},
        "defaultConfiguration": {"level": _LEVEL[kind.severity]},
        "properties": {"cause": kind.cause, "tags": ["distributed", kind.cause]},
    }


def _result(finding: Finding, index: dict[str, int], root: Path, *, suppressed: bool) -> dict[str, Any]:
    data = finding.data or {}
    line = max(int(data.get("line", 1) or 1), 1)
    region: dict[str, Any] = {"startLine": line, "startColumn": max(int(data.get("col", 1) or 1), 1),
                              "endLine": max(int(data.get("end_line", line) or line), line)}
    if data.get("source"):
        region["snippet"] = {"text": str(data["source"])}
    message = finding.title + (f": {finding.detail.splitlines()[0].split(': ', 1)[-1]}" if finding.detail else "")
    result: dict[str, Any] = {
        "ruleId": finding.id,
        "level": _LEVEL[finding.severity],
        "message": {"text": message},
        "locations": [{"physicalLocation": {
            "artifactLocation": _artifact(str(data.get("path", "")), root),
            "region": region,
        }}],
        "properties": {"cause": finding.cause, "remediation": finding.remediation},
    }
    if finding.id in index:
        result["ruleIndex"] = index[finding.id]
    if suppressed:
        result["suppressions"] = [{"kind": "inSource", "justification": "# distdoctor: ignore[...] comment"}]
    return result


def _artifact(path: str, root: Path) -> dict[str, Any]:
    """A URI relative to the source root where possible (what code scanning expects)."""
    if not path or path.startswith("<"):
        return {"uri": "stdin"}
    absolute = Path(os.path.abspath(path))
    try:
        relative = absolute.relative_to(root)
        return {"uri": relative.as_posix(), "uriBaseId": "SRCROOT"}
    except ValueError:
        return {"uri": absolute.as_uri()}
