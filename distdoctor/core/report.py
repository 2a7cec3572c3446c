"""The Report: findings and check results as data, with status and exit code.

Rendering lives in distdoctor.core.render; this module never prints. The JSON shape is the contract
documented in docs/report.md (schema ``distdoctor.report/1``); fields beyond it (``data``, ``confidence``,
``reason``, ``silenced``, ``about``) are additive and consumers ignore what they do not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Iterable, Mapping, Sequence

from distdoctor.core.findings import Finding, Severity
from distdoctor.core.rank_groups import MAX_LINES, hosts_text, ranges_text, ranks_label, shape, where_text
from distdoctor.core.redact import scrub

SCHEMA = "distdoctor.report/1"
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3


@dataclass(frozen=True)
class WorldSummary:
    size: int | None = None
    launcher: str = "none"
    ranks_reported: tuple[int, ...] = ()
    ranks_missing: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "launcher": self.launcher,
            "ranks_reported": sorted(self.ranks_reported),
            "ranks_missing": sorted(self.ranks_missing),
        }


def format_ranks(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 3, 5, 7, 8] -> '0-3, 5, 7-8'; bounded at scale ('0, 2, 4, …, 4094 (2048 ranks)'),
    see core.rank_groups."""
    return ranges_text(ranks)


def format_where(finding: Finding) -> str:
    """Where a finding was seen: 'ranks 0-7 on node-a; rank 8 on node-b' (bounded: a few hosts by
    name, the rest counted)."""
    where = finding.data.get("where") if finding.data else None
    if isinstance(where, Mapping) and where:
        return where_text(where)
    bits = []
    if finding.ranks:
        bits.append(ranks_label(finding.ranks))
    if finding.hosts:
        bits.append("on " + hosts_text(finding.hosts))
    return " ".join(bits)


def merge_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Merge identical findings seen on many ranks into one, keeping which ranks on which host.

    Cost is linear in the number of findings (one dict lookup each), so rank 0 can merge the
    findings of thousands of ranks.
    """
    first_seen: dict[tuple, Finding] = {}
    ranks: dict[tuple, set[int]] = {}
    hosts: dict[tuple, dict[str, None]] = {}
    where: dict[tuple, dict[str, set[int]]] = {}
    for finding in findings:
        key = finding.merge_key
        if key not in first_seen:
            first_seen[key], ranks[key], hosts[key], where[key] = finding, set(), {}, {}
        ranks[key].update(finding.ranks)
        hosts[key].update(dict.fromkeys(finding.hosts))
        per_host = where[key]
        own = finding.data.get("where") if finding.data else None
        if isinstance(own, Mapping):
            # The check already said which ranks are on which host: keep its pairing.
            for host, host_ranks in own.items():
                per_host.setdefault(str(host), set()).update(int(r) for r in host_ranks)
        elif len(finding.hosts) == 1:
            per_host.setdefault(finding.hosts[0], set()).update(finding.ranks)
        # A finding naming several hosts without a pairing says nothing about which rank is where.
    out = []
    for key, finding in first_seen.items():
        merged = finding.with_(ranks=tuple(ranks[key]), hosts=tuple(hosts[key]))
        per_host = {h: sorted(r) for h, r in where[key].items()}
        covered = set().union(*where[key].values()) if per_host else set()
        # Only a complete pairing is shown; a partial one would hide ranks from the reader.
        if covered >= set(merged.ranks) and (len(per_host) > 1 or (per_host and len(merged.ranks) > 1)):
            merged = merged.with_(data={**merged.data, "where": per_host})
        out.append(merged)
    return sorted(fold_alike(out), key=lambda f: (-int(f.severity), f.id, min(f.ranks) if f.ranks else -1))


def fold_alike(findings: list[Finding], budget: int = MAX_LINES) -> list[Finding]:
    """Findings that differ only in numbers (a rank's own "... on rank 17", its port, its time) are
    one finding when there are more than ``budget`` of them: a check that fails on 4,096 ranks
    reads as one finding naming them as ranges, not 4,096. Its data keeps each one ("alike")."""
    groups: dict[tuple, list[Finding]] = {}
    for finding in findings:
        key = (finding.id, finding.check, shape(finding.title), shape(finding.detail), finding.remediation)
        groups.setdefault(key, []).append(finding)
    out = []
    for members in groups.values():
        if len(members) <= budget:
            out += members
            continue
        first = members[0]
        ranks = sorted({r for f in members for r in f.ranks})
        others = sorted({r for f in members[1:] for r in f.ranks} - set(first.ranks))
        alike = [{"title": f.title, "detail": f.detail, "ranks": list(f.ranks), "hosts": list(f.hosts)} for f in members]
        out.append(first.with_(
            title=f"{first.title} (and {len(members) - 1} alike" + (f", on {ranks_label(others)}" if others else "") + ")",
            detail=f"{first.detail}\n({len(members)} findings alike, differing only in numbers: --format json has each)"
            .lstrip("\n"),
            ranks=tuple(ranks), hosts=tuple(dict.fromkeys(h for f in members for h in f.hosts)),
            data={**first.data, "alike": alike}))
    return out


def split_silenced(findings: Sequence[Finding], patterns: Iterable[str]) -> tuple[list[Finding], list[Finding]]:
    patterns = tuple(patterns)
    kept, silenced = [], []
    for finding in findings:
        (silenced if any(fnmatchcase(finding.id, p) for p in patterns) else kept).append(finding)
    return kept, silenced


@dataclass
class Report:
    findings: list[Finding]
    checks: list[dict[str, Any]] = field(default_factory=list)
    world: WorldSummary = field(default_factory=WorldSummary)
    duration_s: float = 0.0
    incomplete: bool = False
    silenced: list[Finding] = field(default_factory=list)
    # Versions (distdoctor, Python, torch, CUDA, NCCL), host and UTC time, set by the caller that
    # renders the report (the CLI); additive to the schema: absent when unknown.
    about: dict[str, Any] | None = None
    # Figures that belong to the run rather than to one finding (`distdoctor bench` puts its
    # measurements under "bench"); only in the JSON when present.
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        if self.incomplete:
            return "incomplete"
        worst = max((f.severity for f in self.findings), default=None)
        if worst is None or worst < Severity.WARNING:
            return "ok"
        return "warning" if worst < Severity.ERROR else "error"

    def exit_code(self, fail_level: Severity = Severity.ERROR) -> int:
        if self.incomplete:
            return EXIT_INCOMPLETE
        if any(f.severity >= fail_level for f in self.findings):
            return EXIT_FINDINGS
        return EXIT_OK

    def counts(self) -> dict[str, int]:
        counts = {s.label: 0 for s in Severity}
        for finding in self.findings:
            counts[finding.severity.label] += 1
        return counts

    def check_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for check in self.checks:
            counts[check["status"]] = counts.get(check["status"], 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "status": self.status,
            "world": self.world.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "checks": list(self.checks),
            "duration_s": round(self.duration_s, 4),
            "silenced": {"count": len(self.silenced), "ids": sorted({f.id for f in self.silenced})},
            **({"about": dict(self.about)} if self.about else {}),
            **({"data": self.data} if self.data else {}),
        }


def build_report(
    findings: Iterable[Finding],
    checks: Iterable[Mapping[str, Any]] = (),
    *,
    world: WorldSummary | None = None,
    duration_s: float = 0.0,
    incomplete: bool = False,
    silence: Iterable[str] = (),
    secrets: Sequence[str] = (),
) -> Report:
    """Merge across ranks, apply silencing and scrub secret values out of every string."""
    merged = merge_findings(findings)
    # The last word on secrets and on JSON: every string is redacted (known values and secret
    # shapes, in linear time) and anything JSON cannot carry becomes its repr.
    merged = [Finding.from_dict(scrub(f.to_dict(), list(secrets))) for f in merged]
    kept, silenced = split_silenced(merged, silence)
    return Report(
        findings=kept,
        checks=[scrub(dict(c), list(secrets)) for c in checks],
        world=world or WorldSummary(),
        duration_s=duration_s,
        incomplete=incomplete,
        silenced=silenced,
    )
