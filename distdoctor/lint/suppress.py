"""Per-line suppression comments: `# distdoctor: ignore[lint.W003]` (or `ignore` for every rule)."""

from __future__ import annotations

import re

_COMMENT = re.compile(r"#\s*distdoctor:\s*ignore(?:\[(?P<ids>[^\]]*)\])?")


def suppressed_ids(line: str) -> set[str] | None:
    """The IDs a line's comment suppresses; {"*"} for a bare ignore; None without a comment."""
    if "distdoctor" not in line:
        return None
    match = _COMMENT.search(line)
    if match is None:
        return None
    ids = match["ids"]
    if ids is None:
        return {"*"}
    return {part.strip() for part in ids.split(",") if part.strip()}


def is_suppressed(lines: list[str], finding_id: str, first: int, last: int) -> bool:
    """A comment on any line of the flagged construct (first..last, 1-based) suppresses it."""
    for lineno in range(max(first, 1), min(last, len(lines)) + 1):
        ids = suppressed_ids(lines[lineno - 1])
        if ids and ("*" in ids or finding_id in ids):
            return True
    return False
