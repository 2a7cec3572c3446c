"""Findings: what a check found, as data.

A :class:`FindingKind` is declared once per finding ID (``net.E001``) with its cause, a default
title and a one-line hint; checks turn it into a :class:`Finding` by calling it with the
specifics. IDs follow Django's system-check style: ``<area>.<letter><number>`` where the letter
is the severity (I, W, E, C). A severity change therefore gets a new ID, and IDs are never
reused (retired ones stay documented in docs/findings/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any, Iterable, Mapping

from distdoctor.core.causes import CAUSES


class Severity(IntEnum):
    INFO = 20
    WARNING = 30
    ERROR = 40
    # critical: the job cannot even start; later stages are skipped (nothing to test).
    CRITICAL = 50

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def letter(self) -> str:
        return self.name[0]

    @classmethod
    def parse(cls, value: str | "Severity") -> "Severity":
        if isinstance(value, Severity):
            return value
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            names = ", ".join(s.label for s in cls)
            raise ValueError(f"unknown severity {value!r} (expected one of: {names})") from None


ID_PATTERN = re.compile(r"^(?P<area>[a-z][a-z0-9_]*)\.(?P<letter>[IWEC])(?P<num>\d{3})$")
_LETTER_TO_SEVERITY = {s.letter: s for s in Severity}


def severity_of_id(finding_id: str) -> Severity:
    match = ID_PATTERN.match(finding_id)
    if not match:
        raise ValueError(
            f"finding ID {finding_id!r} is not of the form 'area.E001' "
            "(lower-case area, a severity letter I/W/E/C, three digits)"
        )
    return _LETTER_TO_SEVERITY[match["letter"]]


@dataclass(frozen=True)
class Finding:
    """One thing a check found. Immutable; ``to_dict`` gives the JSON contract's shape."""

    id: str
    severity: Severity
    cause: str
    title: str
    detail: str = ""
    remediation: str = ""
    ranks: tuple[int, ...] = ()
    hosts: tuple[str, ...] = ()
    check: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    # Only log diagnosis (explain) is uncertain; live checks leave it None.
    confidence: float | None = None

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"finding {self.id}: cause {self.cause!r} is not in the vocabulary")
        object.__setattr__(self, "severity", Severity.parse(self.severity))
        object.__setattr__(self, "ranks", tuple(sorted(set(int(r) for r in self.ranks))))
        object.__setattr__(self, "hosts", tuple(dict.fromkeys(str(h) for h in self.hosts)))

    def with_(self, **changes: Any) -> "Finding":
        return replace(self, **changes)

    @property
    def merge_key(self) -> tuple:
        """Findings equal under this key are the same finding seen on different ranks."""
        return (self.id, self.title, self.detail, self.remediation, self.check)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "severity": self.severity.label,
            "cause": self.cause,
            "title": self.title,
            "detail": self.detail,
            "remediation": self.remediation,
            "ranks": list(self.ranks),
            "hosts": list(self.hosts),
            "check": self.check,
        }
        if self.data:
            out["data"] = dict(self.data)
        if self.confidence is not None:
            out["confidence"] = round(float(self.confidence), 3)
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Finding":
        """Inverse of to_dict; used for findings that crossed the wire from other ranks."""
        return cls(
            id=str(raw["id"]),
            severity=Severity.parse(raw["severity"]),
            cause=str(raw["cause"]),
            title=str(raw.get("title", "")),
            detail=str(raw.get("detail", "")),
            remediation=str(raw.get("remediation", "")),
            ranks=tuple(int(r) for r in raw.get("ranks", ())),
            hosts=tuple(str(h) for h in raw.get("hosts", ())),
            check=str(raw.get("check", "")),
            data=dict(raw.get("data") or {}),
            confidence=raw.get("confidence"),
        )


@dataclass(frozen=True)
class FindingKind:
    """The declaration of one finding ID: what it means, whatever the specifics.

    Create kinds with :func:`distdoctor.core.registry.finding_kind` so that the ID is registered
    (and a duplicate rejected); call the kind to make a finding.
    """

    id: str
    cause: str
    title: str
    hint: str
    severity: Severity = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "severity", severity_of_id(self.id))
        if self.cause not in CAUSES:
            raise ValueError(f"finding kind {self.id}: cause {self.cause!r} is not in the vocabulary")
        if "\n" in self.title or "\n" in self.hint:
            raise ValueError(f"finding kind {self.id}: title and hint are one line each")

    def __call__(
        self,
        title: str | None = None,
        *,
        detail: str = "",
        remediation: str | None = None,
        ranks: Iterable[int] = (),
        hosts: Iterable[str] = (),
        data: Mapping[str, Any] | None = None,
        check: str = "",
        confidence: float | None = None,
    ) -> Finding:
        return Finding(
            id=self.id,
            severity=self.severity,
            cause=self.cause,
            title=title or self.title,
            detail=detail,
            remediation=remediation if remediation is not None else self.hint,
            ranks=tuple(ranks),
            hosts=tuple(hosts),
            check=check,
            data=dict(data or {}),
            confidence=confidence,
        )

    def describe(self) -> dict[str, str]:
        return {
            "id": self.id,
            "severity": self.severity.label,
            "cause": self.cause,
            "title": self.title,
            "hint": self.hint,
        }
