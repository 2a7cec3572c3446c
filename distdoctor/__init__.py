"""distdoctor: diagnostics and troubleshooting for PyTorch distributed training.

Importing distdoctor is cheap: torch is imported only by the checks and APIs that need it.
"""

from __future__ import annotations

from typing import Any

from distdoctor.core.findings import Finding, FindingKind, Severity
from distdoctor.core.registry import SkipCheck, check, finding_kind
import importlib

__version__ = "0.1.0"

__all__ = ["Finding", "FindingKind", "Severity", "SkipCheck", "check", "finding_kind", "__version__"]

# Loaded on first use: the embedded API (preflight, init_process_group, PreflightError, guard,
# GuardError) imports torch, and the probes' helpers for check authors are not needed by
# `import distdoctor`.
_LAZY = {
    "preflight": "distdoctor.embedded.preflight",
    "init_process_group": "distdoctor.embedded.preflight",
    "PreflightError": "distdoctor.embedded.preflight",
    "guard": "distdoctor.embedded.guard",
    "GuardError": "distdoctor.embedded.guard",
    "Unknown": "distdoctor.machine.probes",
    "call_with_deadline": "distdoctor.machine.probes",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'distdoctor' has no attribute {name!r}")

    return getattr(importlib.import_module(module), name)
