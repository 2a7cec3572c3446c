"""The finding documentation: docs/findings/<area>.md, one '## <ID>' section per finding ID.

The wheel carries docs/ as distdoctor/_docs; a source checkout (editable install) reads the
repository's docs/ directly. IDs are documented forever: a retired ID keeps its section.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

_HEADING = re.compile(r"^## +(?P<id>[a-z][a-z0-9_]*\.[IWEC]\d{3})\b.*$", re.M)


def docs_root() -> Path | None:
    package = Path(__file__).resolve().parents[1]  # distdoctor/, above core/
    for candidate in (package / "_docs", package.parent / "docs"):
        if (candidate / "findings").is_dir():
            return candidate
    return None


@lru_cache(maxsize=1)
def finding_sections() -> dict[str, tuple[str, str]]:
    """ID -> (file name, section text). Where an ID has two sections, the first wins."""
    root = docs_root()
    sections: dict[str, tuple[str, str]] = {}
    if root is None:
        return sections
    for file in sorted((root / "findings").glob("*.md")):
        text = file.read_text(encoding="utf-8")
        matches = list(_HEADING.finditer(text))
        for i, match in enumerate(matches):
            end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
            sections.setdefault(match["id"], (file.name, text[match.start():end].strip()))
    return sections


def all_headings() -> list[tuple[str, str]]:
    """Every (file name, ID) heading, duplicates included, for the docs consistency test."""
    root = docs_root()
    if root is None:
        return []
    out = []
    for file in sorted((root / "findings").glob("*.md")):
        out += [(file.name, m["id"]) for m in _HEADING.finditer(file.read_text(encoding="utf-8"))]
    return out


def finding_doc(finding_id: str) -> str | None:
    entry = finding_sections().get(finding_id)
    return entry[1] if entry else None
