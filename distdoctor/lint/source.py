"""Lint one source text: parse it (never import or run it), index it, run the selected rules."""

from __future__ import annotations

import ast
import time
import warnings
from dataclasses import dataclass, field
from typing import Iterable

from distdoctor.core.findings import Finding
from distdoctor.lint.index import build_index
from distdoctor.lint.rules import Rule
from distdoctor.lint.suppress import is_suppressed
from distdoctor.core.registry import finding_kind

NOT_PARSED = finding_kind(
    "lint.W001", cause="unknown",
    title="The file could not be parsed, so it was not linted",
    hint="Fix the syntax error (or the encoding); Python itself will refuse the file the same way.",
)
# A file that never mentions these cannot match any rule; it is parsed (for syntax errors) only.
RELEVANT_WORDS = ("istributed", "local_rank", "local-rank")  # Distributed* and torch.distributed


@dataclass
class SourceResult:
    findings: list[Finding] = field(default_factory=list)
    suppressed: list[Finding] = field(default_factory=list)
    lines: int = 0
    analysed: bool = False
    # Seconds spent per step: "parse", "index" and each rule's ID.
    timings: dict[str, float] = field(default_factory=dict)


def lint_source(text: str, path: str, rules: Iterable[Rule]) -> SourceResult:
    result = SourceResult(lines=text.count("\n") + (0 if text.endswith("\n") or not text else 1))
    clock = time.perf_counter
    started = clock()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for invalid escapes is not ours to report
            tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        result.findings.append(not_parsed(path, exc, text))
        return result
    finally:
        result.timings["parse"] = clock() - started
    if not any(word in text for word in RELEVANT_WORDS):
        return result
    result.analysed = True
    try:
        started = clock()
        index = build_index(path, tree, text)
        result.timings["index"] = clock() - started
        for rule in rules:
            started = clock()
            for hit in rule.find(index):
                finding = make_finding(rule, hit, index)
                last = getattr(hit.node, "end_lineno", None) or hit.node.lineno
                if is_suppressed(index.lines, rule.id, hit.node.lineno, last):
                    result.suppressed.append(finding)
                else:
                    result.findings.append(finding)
            result.timings[rule.id] = clock() - started
    except RecursionError as exc:
        # Expressions nested thousands deep (generated code) exceed the analysis' recursion.
        result.findings = [not_parsed(path, exc, text, analysis=True)]
        result.suppressed = []
    return result


def make_finding(rule: Rule, hit, index) -> Finding:
    node = hit.node
    line = node.lineno
    source = index.source_line(line)
    col = char_column(source, node.col_offset)
    return rule.kind(
        hit.title,
        detail=f"{index.path}:{line}:{col}: {hit.detail}\n    {line} | {source.strip()}",
        data={"path": index.path, "line": line, "col": col, "end_line": getattr(node, "end_lineno", None) or line,
              "source": source, "rule": rule.find.__name__},
        check="lint",
    )


def char_column(line: str, byte_offset: int) -> int:
    """ast gives UTF-8 byte offsets; reports give 1-based character columns."""
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="replace")) + 1


def not_parsed(path: str, exc: BaseException, text: str, *, analysis: bool = False) -> Finding:
    line = getattr(exc, "lineno", None) or 1
    offset = getattr(exc, "offset", None) or 1
    lines = text.splitlines()
    source = lines[line - 1] if 0 < line <= len(lines) else ""
    message = getattr(exc, "msg", None) or str(exc)
    if isinstance(exc, RecursionError):
        message = "an expression is nested too deeply to " + ("analyse" if analysis else "parse")
    return NOT_PARSED(
        None if not analysis else "The file is nested too deeply to lint",
        detail=f"{path}:{line}:{offset}: {type(exc).__name__}: {message}",
        data={"path": path, "line": line, "col": offset, "end_line": line, "source": source, "rule": "parse"},
        check="lint",
    )
