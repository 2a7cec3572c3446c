"""distdoctor: diagnostics and troubleshooting for PyTorch distributed training.

Importing distdoctor is cheap: torch is imported only by the checks and APIs that need it.
"""

from __future__ import annotations

from typing import Any

from distdoctor.findings import Finding, FindingKind, Severity
from distdoctor.registry import SkipCheck, check, finding_kind

__version__ = "0.1.0"

__all__ = ["Finding", "FindingKind", "Severity", "SkipCheck", "check", "finding_kind", "__version__"]

# The embedded API (preflight, init_process_group, PreflightError, guard, GuardError) imports
# torch; load it lazily.
_LAZY = {"preflight": "distdoctor.api", "init_process_group": "distdoctor.api", "PreflightError": "distdoctor.api",
         "guard": "distdoctor.embedded.guard", "GuardError": "distdoctor.embedded.guard"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'distdoctor' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
