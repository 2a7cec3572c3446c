"""Weigh the matches of a scan into findings: causes first, consequences folded into them.

The rules, in order:
1. A signature that `explains` another (catalog data) absorbs it: a host name that does not
   resolve explains the store connect timeout that follows; a rank killed by SIGKILL explains the
   "Connection reset by peer" its peers see.
2. Symptoms (a peer vanished, a wait timed out) that no rule absorbed become consequences of the
   first cause or crash in time, when there is one: the first failure is the cause, what other
   ranks saw afterwards is its consequence.
3. What is left is ranked by confidence (a crash that its peers' symptoms corroborate, or that
   torchrun's summary calls the first observed failure, gains a little), then by time.
4. A text with several possible causes yields its candidates too, each with its confidence, and
   the finding says what to run to tell them apart.
5. Several ranks timing out in NCCL collectives with different op types at one sequence number is
   a collective mismatch, whatever each line alone suggests.
6. Ranks lost a peer ("Connection reset by peer") and one rank's own log stops without any error
   line: that rank died without a word, which a Python exception never does; a signal did it,
   most often SIGKILL from the out-of-memory killer. It is named, with moderate confidence.
7. Nothing matched: cause `unknown`, quoting the lines that looked most relevant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distdoctor.explain.catalog import Catalog, render_template
from distdoctor.explain.scan import MAX_EVIDENCE, Accumulator, Group
from distdoctor.core.findings import Finding
from distdoctor.core.report import format_ranks

CHECK_NAME = "explain"
CORROBORATION_BONUS = 0.1
FIRST_FAILURE_BONUS = 0.05
MAX_CONFIDENCE = 0.95
# Candidates never look surer than this: the text alone cannot decide between them.
CANDIDATE_CEILING = 0.55
EVIDENCE_IN_DETAIL = 3


@dataclass
class Root:
    group: Group
    confidence: float
    consequences: list[Group] = field(default_factory=list)
    # A finding that reasoning across groups made (rule 5) rather than one signature.
    override: Finding | None = None


def _is_primary(group: Group) -> bool:
    return group.signature.role in ("cause", "crash")


def _fields_for(group: Group) -> dict[str, Any]:
    fields: dict[str, Any] = dict(group.fields)
    if group.ranks:
        fields["rank"] = format_ranks(group.ranks)
        fields.setdefault("ranks", format_ranks(group.ranks))
    elif fields.get("local_rank_failed"):
        fields["rank"] = f"(local rank {fields['local_rank_failed']})"
    if group.hosts:
        fields["host"] = ", ".join(sorted(group.hosts))
    return fields


def _quote(evidence: list[dict[str, Any]], limit: int = EVIDENCE_IN_DETAIL) -> list[str]:
    return [f"  {e['file']}:{e['line']}: {e['text']}" for e in evidence[:limit]]


def _where(group: Group) -> str:
    files = ", ".join(f"{name} ({n}x)" if n > 1 else name for name, n in list(group.files.items())[:4])
    more = f" and {len(group.files) - 4} more files" if len(group.files) > 4 else ""
    return f"{group.count} matching line{'s' if group.count != 1 else ''} in {files}{more}"


def assign_roots(groups: list[Group]) -> list[Root]:
    by_name: dict[str, list[Group]] = {}
    for group in groups:
        by_name.setdefault(group.signature.name, []).append(group)
    owner: dict[int, Group] = {}
    # Rule 1: explicit explanations, strongest explainer first.
    for group in sorted(groups, key=lambda g: (-g.signature.confidence, g.order)):
        if id(group) in owner:
            continue
        for name in group.signature.explains:
            for other in by_name.get(name, ()):
                if other is not group and id(other) not in owner and not _explains(other, group):
                    owner[id(other)] = group
    roots = {id(g): Root(g, _base_confidence(g)) for g in groups if id(g) not in owner}
    # Rule 2: leftover symptoms are consequences of the first cause/crash, when there is one.
    primaries = sorted((r for r in roots.values() if _is_primary(r.group)), key=lambda r: r.group.order)
    if primaries:
        first = primaries[0].group
        for gid, root in list(roots.items()):
            if not _is_primary(root.group):
                owner[gid] = first
                del roots[gid]
    for group in groups:
        explainer = owner.get(id(group))
        while explainer is not None and id(explainer) not in roots:
            explainer = owner.get(id(explainer))
        if explainer is not None:
            roots[id(explainer)].consequences.append(group)
    for root in roots.values():
        _absorb_same_line(root)
        if root.group.signature.role == "crash" and any(c.ranks - root.group.ranks for c in root.consequences):
            root.confidence = min(MAX_CONFIDENCE, root.confidence + CORROBORATION_BONUS)
    return sorted(roots.values(), key=lambda r: (-r.confidence, r.group.order))


def _absorb_same_line(root: Root) -> None:
    """A consequence matched on the root's own line is the same message read by another signature
    (DETAIL's 'Op type: X vs Y' and its 'Rank 0 ... but Rank 1 ...'): it lends its ranks and fields."""
    lines = {(e["file"], e["line"]) for e in root.group.evidence}
    for c in list(root.consequences):
        if c.evidence and all((e["file"], e["line"]) in lines for e in c.evidence):
            root.group.ranks |= c.ranks
            for k, v in c.fields.items():
                root.group.fields.setdefault(k, v)
            root.consequences.remove(c)


def _explains(a: Group, b: Group) -> bool:
    return b.signature.name in a.signature.explains


def _base_confidence(group: Group) -> float:
    confidence = group.signature.confidence
    if group.flagged_first_failure:
        confidence = min(MAX_CONFIDENCE, confidence + FIRST_FAILURE_BONUS)
    return confidence


def watchdog_mismatch(roots: list[Root]) -> Root | None:
    """Rule 5: NCCL watchdog timeouts at one SeqNum with different OpTypes across ranks."""
    by_seq: dict[str, list[Root]] = {}
    for root in roots:
        if root.group.signature.name == "nccl_watchdog_timeout":
            by_seq.setdefault(root.group.fields.get("seq", ""), []).append(root)
    for seq, same_seq in by_seq.items():
        ops = {r.group.fields.get("op") for r in same_seq}
        if len(ops) > 1:
            return Root(same_seq[0].group, 0.8, consequences=[r.group for r in same_seq[1:]], override=None)
    return None


def findings_from(acc: Accumulator, catalog: Catalog) -> list[Finding]:
    """Every finding of a scan, most likely cause first."""
    groups = list(acc.groups.values())
    if not groups:
        return [_unknown_finding(acc, catalog)]
    roots = assign_roots(groups)
    findings: list[Finding] = []
    mismatch = watchdog_mismatch(roots)
    if mismatch is not None:
        findings.append(_watchdog_mismatch_finding(mismatch, catalog))
        involved = {id(mismatch.group), *(id(g) for g in mismatch.consequences)}
        roots = [r for r in roots if id(r.group) not in involved]
    for root in roots:
        if root.group.signature.name in PEER_LOST and acc.quiet_ranks - root.group.ranks:
            findings.append(_silent_death_finding(root, acc, catalog))
            findings += _candidate_findings(root, ranks=acc.quiet_ranks - root.group.ranks)
            continue
        findings.append(_finding(root, acc))
        findings += _candidate_findings(root)
    return findings


PEER_LOST = ("gloo_peer_lost", "nccl_remote_error")
SILENT_DEATH_CONFIDENCE = 0.55


def _silent_death_finding(root: Root, acc: Accumulator, catalog: Catalog) -> Finding:
    group = root.group
    quiet = sorted(acc.quiet_ranks - group.ranks)
    kind = catalog.kinds["log.E025"]
    who = format_ranks(quiet)
    lost = format_ranks(group.ranks) or "other ranks"
    detail = [
        f"Rank{'s' if len(quiet) > 1 else ''} {who}: the log ends without any error line, while rank"
        f"{'s' if len(group.ranks) > 1 else ''} {lost} lost the connection to a peer:",
        *_quote(group.evidence),
        "A Python exception or a failed assertion always prints; a process that stops silently was killed by a "
        "signal (SIGKILL from the OOM killer or the scheduler) or crashed in native code.",
    ]
    return kind(
        f"Rank {who} stopped without an error while rank{'s' if len(group.ranks) > 1 else ''} {lost} lost their peer",
        detail="\n".join(detail),
        remediation=f"On rank {who}'s host run: dmesg -T | grep -i -E 'killed process|out of memory' (an OOM kill "
        "names the process); check the scheduler's record of the job (sacct -j <job> -o State,ExitCode,MaxRSS); "
        "running under torchrun prints each rank's exit code and signal in its failure summary.",
        ranks=quiet,
        hosts=group.hosts,
        data={
            "signature": "silent_rank_death",
            "quiet_ranks": quiet,
            "evidence": list(group.evidence),
            "consequences": [_consequence(group)] + [_consequence(c) for c in root.consequences],
        },
        check=CHECK_NAME,
        confidence=SILENT_DEATH_CONFIDENCE,
    )


def _finding(root: Root, acc: Accumulator) -> Finding:
    group, sig = root.group, root.group.signature
    fields = _fields_for(group)
    detail = [f"{_where(group)}; first:"] + _quote(group.evidence)
    data: dict[str, Any] = {
        "signature": sig.name,
        "role": sig.role,
        "evidence": list(group.evidence),
        "occurrences": group.count,
        "files": dict(group.files),
    }
    data.update({k: v for k, v in group.fields.items() if k not in data and k != "ranks"})
    if group.first_time:
        data["first_seen"] = group.first_time
    if group.flagged_first_failure:
        data["torchrun_first_failure"] = True
        detail.append("torchrun's summary lists this as the first observed failure.")
    if root.consequences:
        data["consequences"] = [_consequence(c) for c in root.consequences]
        detail.append("What followed (consequences, not causes):")
        for c in root.consequences:
            who = f"rank{'s' if len(c.ranks) > 1 else ''} {format_ranks(c.ranks)}: " if c.ranks else ""
            detail.append(f"  {who}{c.evidence[0]['text'] if c.evidence else c.signature.name}"
                          f" ({c.count}x, {c.signature.name})")
    silent = _silent_ranks(root, acc)
    if silent:
        data["ranks_without_error"] = silent
        detail.append(f"Ranks seen in the logs that reported no such error: {format_ranks(silent)} — "
                      "look at their logs first: the rank that did not join is usually the cause.")
    if sig.candidates:
        data["candidates"] = [
            {"id": c.kind.id, "cause": c.kind.cause, "confidence": min(c.confidence, CANDIDATE_CEILING)}
            for c in sig.candidates
        ]
        data["tell_apart"] = render_template(sig.tell_apart, fields)
        detail.append("This text has several possible causes; the others are listed as candidates.")
        detail.append("To tell them apart: " + data["tell_apart"])
    if group.count > len(group.evidence) and len(group.evidence) == MAX_EVIDENCE:
        data["evidence_truncated"] = True
    return sig.kind(
        render_template(sig.title, fields),
        detail="\n".join(detail),
        remediation=render_template(sig.remediation, fields),
        ranks=group.ranks,
        hosts=group.hosts,
        data=data,
        check=CHECK_NAME,
        confidence=root.confidence,
    )


def _silent_ranks(root: Root, acc: Accumulator) -> list[int]:
    """For a timeout that several ranks report: the ranks seen in the logs that did not report it."""
    if root.group.signature.role != "symptom" or not root.group.ranks:
        return []
    reporting = set(root.group.ranks)
    for c in root.consequences:
        reporting |= c.ranks
    return sorted(acc.ranks_seen - reporting)


def _consequence(group: Group) -> dict[str, Any]:
    return {
        "signature": group.signature.name,
        "cause_if_alone": group.signature.cause,
        "ranks": sorted(group.ranks),
        "occurrences": group.count,
        "evidence": list(group.evidence[:2]),
    }


def _candidate_findings(root: Root, ranks: set[int] | None = None) -> list[Finding]:
    group, sig = root.group, root.group.signature
    if not sig.candidates:
        return []
    fields = _fields_for(group)
    out = []
    for cand in sig.candidates:
        why = render_template(cand.why, fields)
        out.append(
            cand.kind(
                f"Possible cause ({cand.kind.cause}): {why}",
                detail="\n".join(
                    [f"Candidate explanation of: {render_template(sig.title, fields)}", f"Why: {why}"]
                    + _quote(group.evidence, 1)
                    + ["To tell apart: " + render_template(sig.tell_apart, fields)]
                ),
                remediation=cand.kind.hint,
                ranks=group.ranks if ranks is None else ranks,
                hosts=group.hosts,
                data={
                    "signature": sig.name,
                    "candidate_of": sig.kind.id,
                    "why": why,
                    "evidence": list(group.evidence[:1]),
                },
                check=CHECK_NAME,
                confidence=min(cand.confidence, CANDIDATE_CEILING, root.confidence),
            )
        )
    return out


def _watchdog_mismatch_finding(root: Root, catalog: Catalog) -> Finding:
    groups = [root.group, *root.consequences]
    kind = catalog.kinds["log.E018"]
    seq = root.group.fields.get("seq", "?")
    per_op = {}
    for g in groups:
        per_op.setdefault(g.fields.get("op", "?"), set()).update(g.ranks)
    summary = "; ".join(f"{op} on rank{'s' if len(r) > 1 else ''} {format_ranks(r) or '?'}" for op, r in per_op.items())
    evidence = [e for g in groups for e in g.evidence][:MAX_EVIDENCE]
    ranks = set().union(*(g.ranks for g in groups))
    return kind(
        f"Ranks timed out in different collectives at SeqNum {seq}: {summary}",
        detail="\n".join(["NCCL's watchdog reports a different OpType for the same sequence number on different ranks:"]
                         + _quote(evidence, MAX_EVIDENCE)),
        remediation="Every rank must issue the same collectives in the same order; find the rank-dependent branch "
        "that issues the odd one. TORCH_DISTRIBUTED_DEBUG=DETAIL names it at the first mismatch.",
        ranks=ranks,
        hosts=set().union(*(g.hosts for g in groups)),
        data={"signature": "nccl_watchdog_timeout", "seq": seq, "op_types": {k: sorted(v) for k, v in per_op.items()},
              "evidence": evidence},
        check=CHECK_NAME,
        confidence=root.confidence,
    )


def _unknown_finding(acc: Accumulator, catalog: Catalog) -> Finding:
    kind = catalog.kinds["log.W030"]
    lines = sorted(acc.relevant, key=lambda item: (item[1], item[2]))
    evidence = [{"file": f, "line": n, "text": t} for _, _, n, f, t in lines]
    if evidence:
        detail = ["No known failure signature matched. The lines that look most relevant:"] + _quote(evidence, len(evidence))
    else:
        detail = ["No known failure signature matched, and no line looks like an error (no 'error', 'failed', "
                  "'timeout', 'killed' ...). The job may have been stopped from outside, or the log is not its output."]
    return kind(
        detail="\n".join(detail),
        remediation="Read the quoted lines; rerun with NCCL_DEBUG=INFO TORCH_DISTRIBUTED_DEBUG=DETAIL "
        "TORCH_CPP_LOG_LEVEL=INFO for more, or run distdoctor check on the nodes.",
        data={"evidence": evidence, "signature": None},
        check=CHECK_NAME,
        confidence=0.0,
    )
