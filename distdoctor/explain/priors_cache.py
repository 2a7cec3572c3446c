"""The priors' counts kept between runs in the user's cache directory, keyed by the threads file's digest."""

# Parsing threads.toml (4,000 keys, pure-Python tomllib) costs 0.08 s of CPU in every fresh `explain`:
# 90 % of what explaining a small log costs, 4 % of a 30 MB one. The counts it yields are a few
# kilobytes of JSON; they are written once to $DISTDOCTOR_CACHE_DIR (else $XDG_CACHE_HOME/distdoctor,
# else ~/.cache/distdoctor) under the SHA-256 of the file's bytes and read back by later runs, so an
# edited threads file is never read stale. Everything here is best effort: a cache that cannot be
# read, parsed or written is simply not used (the file is parsed as before), never an error.

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

SCHEMA = "distdoctor.priors-cache/1"


def cache_dir() -> Path | None:
    """Where the cache lives; None without an absolute place for it (no HOME: never a "~" folder in the cwd)."""
    explicit = os.environ.get("DISTDOCTOR_CACHE_DIR")
    base = explicit or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                                    "distdoctor")
    return Path(base) if os.path.isabs(base) else None


def cached(raw: bytes, compute: Callable[[], dict[str, Any]], valid: Callable[[Any], bool]) -> dict[str, Any]:
    """compute()'s result for the file whose bytes are ``raw``: from the cache when it holds a ``valid`` one,
    else computed and (best effort) kept."""
    where = cache_dir()
    if where is None:
        return compute()
    path = where / f"priors-{hashlib.sha256(raw).hexdigest()[:32]}.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA and valid(doc.get("counts")):
            return doc["counts"]
    except (OSError, ValueError):
        pass
    counts = compute()
    _keep(path, counts)
    return counts


def _keep(path: Path, counts: dict[str, Any]) -> None:
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".priors-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"schema": SCHEMA, "counts": counts}, fh)
        os.replace(temporary, path)  # whole or absent: a run reading beside this one never sees half a file
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
