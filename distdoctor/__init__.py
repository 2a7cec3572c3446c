"""distdoctor: diagnostics and troubleshooting for PyTorch distributed training.

Importing distdoctor is cheap: every name below is loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.6.0"  # the same as pyproject.toml's (tests/test_version.py); CHANGELOG.md says what each release changed

__all__ = ["Finding", "FindingKind", "Severity", "SkipCheck", "check", "finding_kind", "__version__"]

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from distdoctor.core.findings import Finding, FindingKind, Severity
    from distdoctor.core.registry import SkipCheck, check, finding_kind

# Loaded on first use: the check authors' API (the registry reads entry points, 30 ms) is not
# needed before `distdoctor check` has started the child that imports torch; the embedded API
# (preflight, init_process_group, PreflightError, guard, GuardError) imports torch.
_LAZY = {
    "Finding": "distdoctor.core.findings",
    "FindingKind": "distdoctor.core.findings",
    "Severity": "distdoctor.core.findings",
    "SkipCheck": "distdoctor.core.registry",
    "check": "distdoctor.core.registry",
    "finding_kind": "distdoctor.core.registry",
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
