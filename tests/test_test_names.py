"""Test modules outside a package have unique basenames: pytest imports them by basename (rootdir mode)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def top_level_module_name(path: Path) -> str:
    """The name pytest imports `path` under: its dotted path from the first folder without __init__.py."""
    parts = [path.stem]
    folder = path.parent
    while (folder / "__init__.py").exists():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def test_no_two_test_modules_share_an_import_name():
    # Two tests/<dir>/test_x.py in folders without __init__.py collide at collection
    # ("import file mismatch") — only on a clean clone, where no __pycache__ hides it.
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "corpus" in path.parts or "fixtures" in path.parts:
            continue
        seen[top_level_module_name(path)].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
