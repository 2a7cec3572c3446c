"""The oldest torch release distdoctor supports, and the one line that refuses an older one at start.

Everything distdoctor uses of torch is probed where it is used (world.store_api and the
others), with a fallback where a release lacks it; the oldest release where every way in passes
the compatibility matrix (compat/matrix.py, docs/compatibility.md) is the floor. Below it
nothing is vouched for, so the commands that run torch code (check, bench, guard) and the
embedded API say so in one line instead of failing somewhere inside. The version comes from the
torch package's version.py, read without importing torch: the import costs seconds, reading the
package metadata (importlib.metadata) a tenth of that, and a torch too old may not even import
cleanly.
"""

from __future__ import annotations

import os
import re

OLDEST = (2, 1)
OLDEST_TEXT = "2.1"


def installed_version() -> str | None:
    """The version of the torch this interpreter would import (``2.1.2+cu121``), read from its
    torch/version.py without importing it; None when there is none to tell."""
    import importlib.util  # only when a command that runs torch starts

    try:
        spec = importlib.util.find_spec("torch")
        origin = spec.origin if spec is not None else None
        if not origin:
            return None
        with open(os.path.join(os.path.dirname(origin), "version.py"), encoding="utf-8") as fh:
            text = fh.read(4096)
    except (ImportError, OSError, ValueError):  # not installed (the checks say so: backend.C006)
        return None
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else None


def release(version: str) -> tuple[int, ...] | None:
    """(2, 1, 2) for '2.1.2+cu121' or '2.1.0a0+git1234'; None for what is not a version."""
    match = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups() if part is not None)


def refusal(version: str | None = None) -> str | None:
    """The line that refuses this torch, or None when it is supported (or cannot be told)."""
    version = installed_version() if version is None else version
    parts = release(version) if version else None
    if parts is None or parts[:2] >= OLDEST:
        return None
    return (f"distdoctor supports torch {OLDEST_TEXT} and newer; this environment has torch {version}. "
            f"Install a newer torch (pip install 'torch>={OLDEST_TEXT}'), or use a distdoctor release that "
            "supports it; docs/compatibility.md lists the releases it is tested with.")
