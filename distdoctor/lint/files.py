"""Which files a lint run reads: paths and directories (recursively), or stdin."""

from __future__ import annotations

import io
import os
import tokenize
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence
import sys

STDIN = "-"
# Directories that hold other people's code or build output, never the project's own sources.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", "node_modules", "site-packages", ".eggs", "build", "dist"})


class LintInputError(Exception):
    """A path does not exist or stdin cannot be read (a usage error, exit 2)."""


@dataclass(frozen=True)
class SourceFile:
    name: str  # as reported: the path as given / found, or "<stdin>"
    text: str | None
    error: str | None = None  # why the bytes could not be decoded


def iter_sources(paths: Sequence[str], *, exclude: Sequence[str] = (), stdin: BinaryIO | None = None,
                 stdin_name: str = "<stdin>") -> Iterator[SourceFile]:
    """Every source to lint, in a stable order; raises LintInputError for a path that does not exist."""
    for path in _expand(paths, exclude):
        if path == STDIN:
            stream = stdin if stdin is not None else _stdin_bytes()
            try:
                data = stream.read()
            except OSError as exc:
                raise LintInputError(f"cannot read stdin: {exc}") from None
            yield decode(stdin_name, data)
            continue
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            yield SourceFile(path, None, f"cannot be read: {exc.strerror or exc}")
            continue
        yield decode(path, data)


def _stdin_bytes() -> BinaryIO:

    return sys.stdin.buffer


def _expand(paths: Sequence[str], exclude: Sequence[str]) -> Iterator[str]:
    missing = [p for p in paths if p != STDIN and not os.path.exists(p)]
    if missing:
        raise LintInputError(f"no such file or directory: {', '.join(missing)}")
    for path in paths:
        if path == STDIN or os.path.isfile(path):
            yield path  # named explicitly: linted whatever its name or the exclude patterns
        else:
            yield from _walk(path, exclude)


def _walk(root: str, exclude: Sequence[str]) -> Iterator[str]:
    for directory, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith(".")
                             and not _excluded(os.path.join(directory, d), exclude))
        for filename in sorted(filenames):
            full = os.path.join(directory, filename)
            if filename.endswith(".py") and not _excluded(full, exclude):
                yield full


def _excluded(path: str, patterns: Sequence[str]) -> bool:
    posix = Path(path).as_posix()
    return any(fnmatch(posix, p) or fnmatch(posix, f"*/{p}") or fnmatch(Path(path).name, p) for p in patterns)


def decode(name: str, data: bytes) -> SourceFile:
    """Bytes to text the way Python reads a source file (PEP 263 coding cookie, BOM)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return SourceFile(name, data.decode(encoding))
    except (SyntaxError, LookupError, UnicodeDecodeError) as exc:
        return SourceFile(name, None, f"cannot be decoded: {exc}")
