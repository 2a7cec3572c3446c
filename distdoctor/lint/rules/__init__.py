"""The lint rules. Importing this package registers every rule and its finding kind."""

from __future__ import annotations

from distdoctor.lint.rules import (  # noqa: F401  (imported for their registrations)
    checkpoints,
    collectives,
    data,
    devices,
    launch,
    ordering,
    p2p,
    seeds,
    wrapping,
)
from distdoctor.lint.rules.base import RULES, Hit, Rule

__all__ = ["RULES", "Rule", "Hit", "rules_by_id"]


def rules_by_id() -> dict[str, Rule]:
    return {r.id: r for r in sorted(RULES, key=lambda r: r.id[-3:])}
