"""Weigh the matches of a scan into findings: causes first, consequences folded into them."""

# The rules, in order:
# 0. A warning a healthy job prints while it retries (an IPv6 lookup that fails, a connect refused
#    before the store is up) is dropped when the same input shows the job making progress after it.
# 1. A signature that `explains` another (catalog data) absorbs it: a host name that does not
#    resolve explains the store connect timeout that follows; a rank killed by SIGKILL explains the
#    "Connection reset by peer" its peers see.
# 2. Symptoms (a peer vanished, a wait timed out) that no rule absorbed become consequences of the
#    first cause or crash in time, when there is one: the first failure is the cause, what other
#    ranks saw afterwards is its consequence.
# 3. What is left is ranked by confidence (a crash that its peers' symptoms corroborate, or that
#    torchrun's summary calls the first observed failure, gains a little), then by time.
# 4. A text with several possible causes (a generic text) yields one finding whose cause is the
#    first of its ranked candidates (candidates.py): the other lines of the logs reorder them,
#    and the finding lists them all as alternatives, each with the observation that decides.
# 5. Several ranks timing out in NCCL collectives with different op types at one sequence number is
#    a collective mismatch, whatever each line alone suggests; the fingerprints torch < 2.0's DETAIL
#    check printed one per rank, compared, name which aspect differs (fingerprints.py).
# 6. Ranks lost a peer ("Connection reset by peer") and one rank's own log stops without any error
#    line: that rank died without a word, which a Python exception never does; a signal did it,
#    most often SIGKILL from the out-of-memory killer. It is named, with moderate confidence.
# 7. Nothing matched: cause `unknown`, quoting the lines that looked most relevant; or, when some
#    per-rank logs are empty, that those ranks printed nothing (hung or killed before their first line).
# 8. distdoctor's own JSON reports among the inputs: their findings are shown again, as they were.
# 9. One global rank announced by two processes in one start-up (Lightning's "GLOBAL_RANK: g" line twice,
#    no failure between): a configuration error that comes first, whatever failed after it (claims.py).

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from distdoctor.explain.advice import advice
from distdoctor.explain.candidates import (BETWEEN_HOSTS, GENERIC_CEILING, Ranked, describe, rank_candidates,
                                          rank_family)
from distdoctor.diagnosis.origin import DIST_ERRORS
from distdoctor.explain.catalog import Catalog, render_template
from distdoctor.explain.claims import claims_finding
from distdoctor.explain.fingerprints import SIGNATURE as FINGERPRINTS, compared_fingerprints
from distdoctor.explain.own_reports import findings_of_report, fold_alike
from distdoctor.explain.ranks import split_prefix
from distdoctor.explain.sanitize import clean_quote
from distdoctor.explain.scan import MAX_EVIDENCE, Accumulator, Group
from distdoctor.explain.stopped import stopped_after_nccl_init, stopped_in_collective
from distdoctor.core.findings import Finding
from distdoctor.core.report import format_ranks

CHECK_NAME = "explain"
CORROBORATION_BONUS = 0.1
FIRST_FAILURE_BONUS = 0.05
MAX_CONFIDENCE = 0.95
EVIDENCE_IN_DETAIL = 3
EMPTY_LOG_CONFIDENCE = 0.4


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
    _fold_fallbacks(roots)
    for root in roots.values():
        _absorb_same_line(root)
        if root.group.signature.role == "crash" and any(c.ranks - root.group.ranks for c in root.consequences):
            root.confidence = min(MAX_CONFIDENCE, root.confidence + CORROBORATION_BONUS)
    return sorted(roots.values(), key=lambda r: (-r.confidence, r.group.order))


def _fold_fallbacks(roots: dict[int, Root]) -> None:
    """Rule 1b: a line that says something failed without saying what (a fallback signature) speaks
    only when nothing else does; beside another reading it is that reading's consequence."""
    speaking = sorted((r for r in roots.values() if not r.group.signature.fallback), key=lambda r: r.group.order)
    if not speaking:
        return
    for gid, root in list(roots.items()):
        if root.group.signature.fallback:
            speaking[0].consequences += [root.group, *root.consequences]
            del roots[gid]


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


def findings_from(acc: Accumulator, catalog: Catalog, progress: dict[int, int] | None = None) -> list[Finding]:
    """Every finding of a scan, most likely cause first.

    progress: per input, the last line that shows the job making progress; a transient warning
    (a retry) that every input went on past is no failure (rule 0)."""
    found = _findings_of(acc, catalog, progress)
    if not acc.rank_claims:
        return found
    failures = [(src, line) for _, src, line, _, text in acc.relevant if "Traceback (most recent call last)" in text]
    failures += [(src, line) for _, src, line, *_ in failure_lines(acc)]
    claimed = claims_finding(acc, catalog, failures)
    if claimed is None:
        return found
    return [claimed] + [f for f in found if f.id != "log.W030"]  # rule 9: it comes before what failed after it


def _findings_of(acc: Accumulator, catalog: Catalog, progress: dict[int, int] | None) -> list[Finding]:
    reported = fold_alike([f for file, report in acc.own_reports for f in findings_of_report(report, file)])
    groups = [g for g in acc.groups.values() if not _outgrown(g, progress or {}) and not _ended(g, acc)]
    if not groups:
        if acc.empty_files:
            return reported + [_empty_logs_finding(acc, catalog)]
        if acc.own_reports:
            return reported
        went_on = _went_on(acc, progress or {})
        found = _exception_finding(acc, catalog) or _unknown_finding(acc, catalog, went_on)
        return [_distributed_fallback(found, acc, catalog, went_on)]
    roots = assign_roots(groups)
    findings: list[Finding] = list(reported)
    mismatch = watchdog_mismatch(roots)
    if mismatch is not None:
        findings.append(_watchdog_mismatch_finding(mismatch, catalog))
        involved = {id(mismatch.group), *(id(g) for g in mismatch.consequences)}
        roots = [r for r in roots if id(r.group) not in involved]
    for root in roots:
        if root.group.signature.name in PEER_LOST and _silent(acc) - root.group.ranks:
            findings.append(_silent_death_finding(root, acc, catalog))
            continue
        compared = compared_fingerprints(root.group, catalog) if root.group.signature.name == FINGERPRINTS else None
        findings.append(compared or _finding(root, acc, catalog))
    return findings


def _outgrown(group: Group, progress: dict[int, int]) -> bool:
    """A transient warning whose every occurrence the job went on past, in the same input."""
    return group.signature.transient and all(progress.get(src, -1) > line for src, line in group.last_at.items())


def _ended(group: Group, acc: Accumulator) -> bool:
    """What the group says was ended later in every input it is in (a rendezvous that then completed)."""
    ends = acc.ended.get(group.signature.name)
    return bool(ends) and all(ends.get(src, -1) > line for src, line in group.last_at.items())


def _silent(acc: Accumulator) -> set[int]:
    """Ranks whose own log is empty or holds no error-looking line."""
    return acc.quiet_ranks | acc.empty_ranks


PEER_LOST = ("gloo_peer_lost", "nccl_remote_error", "nccl_peer_closed")
SILENT_DEATH_CONFIDENCE = 0.55


def _silent_death_finding(root: Root, acc: Accumulator, catalog: Catalog) -> Finding:
    group = root.group
    quiet = sorted(_silent(acc) - group.ranks)
    kind = catalog.kinds["log.E025"]
    ranked = rank_candidates(group.signature, _fields_for(group), acc, catalog, quiet)
    who = format_ranks(quiet)
    lost = format_ranks(group.ranks) or "other ranks"
    detail = [
        f"Rank{'s' if len(quiet) > 1 else ''} {who}: the log ends without any error line, while rank"
        f"{'s' if len(group.ranks) > 1 else ''} {lost} lost the connection to a peer:",
        *_quote(group.evidence),
        "A Python exception or a failed assertion always prints; a process that stops silently was killed by a "
        "signal (SIGKILL from the OOM killer or the scheduler) or crashed in native code.",
        *describe(_with_first(ranked, kind, SILENT_DEATH_CONFIDENCE)),
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
            "empty_logs": sorted(acc.empty_ranks - group.ranks),
            "candidates": [r.to_dict() for r in _with_first(ranked, kind, SILENT_DEATH_CONFIDENCE)],
            "evidence": list(group.evidence),
            "consequences": [_consequence(group)] + [_consequence(c) for c in root.consequences],
        },
        check=CHECK_NAME,
        confidence=SILENT_DEATH_CONFIDENCE,
    )


# torch.multiprocessing.spawn raises the error of the first process it sees fail: when that is a lost
# peer, the peer's own error (which its wrapper wrote to a file) is printed nowhere.
SPAWN_SHOWS_ONE = ("mp.spawn prints the error of the first process it sees fail, and only that one: the peer's own "
                   "error, if it raised one, is in no log.")
SPAWN_TO_SEE_ALL = ("Under mp.spawn, print each process's own error where it happens (try/except around the spawned "
                    "function with traceback.print_exc(), then raise), or start the job with torchrun --tee 3.")


def _finding(root: Root, acc: Accumulator, catalog: Catalog) -> Finding:
    group, sig = root.group, root.group.signature
    fields = _fields_for(group)
    quoted = {(e["file"], e["line"]) for e in group.evidence[:EVIDENCE_IN_DETAIL]}
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
            detail.append(_consequence_line(c, quoted))
    silent = _silent_ranks(root, acc)
    detail += _other_ranks(silent, sorted(acc.empty_ranks - group.ranks), data)
    spawned = sig.peer == "gone" and "ctx_mp_spawn" in acc.cues
    if spawned:
        detail.append(SPAWN_SHOWS_ONE)
    kind, confidence, remediation = sig.kind, root.confidence, render_template(sig.remediation, fields)
    if sig.candidates:
        quiet = sorted((_silent(acc) | set(silent)) - group.ranks)
        ranked = rank_candidates(sig, fields, acc, catalog, quiet, base=root.confidence)
        if sig.peer == "late" and len(group.ranks) > 1 and not silent and not acc.empty_ranks and not quiet:
            ranked = _every_rank_waited(ranked, group.ranks)
        top = ranked[0]
        kind, confidence = top.kind, top.confidence
        ruled_out = bool(acc.one_host) and sig.cause in BETWEEN_HOSTS
        if ruled_out:
            # The reading the message itself gives needs two hosts: said first, never offered as the fallback.
            detail.insert(0, f"These logs show one host ({acc.one_host}): the network between hosts (the "
                             "interface, a firewall) cannot be at fault here.")
            data["one_host"] = acc.one_host
        if top.kind is not sig.kind:
            remediation = f"{top.kind.hint}. To confirm: {top.tell}" + ("" if ruled_out else
                                                                         f"\n(If it is not that: {remediation})")
        data["candidates"] = [r.to_dict() for r in ranked]
        data["tell_apart"] = render_template(sig.tell_apart, fields)
        detail += describe(ranked)
        detail.append("To tell them apart: " + data["tell_apart"])
    if spawned:
        remediation += f"\n{SPAWN_TO_SEE_ALL}"
    if group.count > len(group.evidence) and len(group.evidence) == MAX_EVIDENCE:
        data["evidence_truncated"] = True
    return kind(
        render_template(sig.title, fields),
        detail="\n".join(detail),
        remediation=remediation,
        ranks=group.ranks,
        hosts=group.hosts,
        data=data,
        check=CHECK_NAME,
        confidence=confidence,
    )


def _other_ranks(silent: list[int], empty: list[int], data: dict[str, Any]) -> list[str]:
    """What the logs show of the ranks that did not report this error (noted in data)."""
    lines = []
    if silent:
        data["ranks_without_error"] = silent
        lines.append(f"Ranks seen in the logs that reported no such error: {format_ranks(silent)} — "
                     "look at their logs first: the rank that did not join is usually the cause.")
    if empty:
        data["empty_logs"] = empty
        lines.append(f"The log of rank {format_ranks(empty)} is empty: that rank printed nothing (hung, or killed "
                     "before its first line).")
    return lines


EVERY_RANK_WAITED = 0.15


def _every_rank_waited(ranked: list[Ranked], ranks: set[int]) -> list[Ranked]:
    """Every rank the logs show timed out in the same wait, and none is silent: none of them is missing
    or late as far as these logs go, and the collective itself hanging gains."""
    for r in ranked:
        if r.cause == "collective_timeout_hang":
            r.confidence = min(GENERIC_CEILING, r.confidence + EVERY_RANK_WAITED)
            r.reasons.append(f"every rank these logs show ({format_ranks(ranks)}) timed out in it, none is silent")
    return sorted(ranked, key=lambda r: -r.confidence)


def _consequence_line(c: Group, quoted: set) -> str:
    """One line per consequence; a line already quoted above is named, not quoted again."""
    who = f"rank{'s' if len(c.ranks) > 1 else ''} {format_ranks(c.ranks)}: " if c.ranks else ""
    first = c.evidence[0] if c.evidence else None
    if first is None:
        text = c.signature.name
    elif (first["file"], first["line"]) in quoted:
        text = f"(the line quoted above, {first['file']}:{first['line']})"
    else:
        quoted.add((first["file"], first["line"]))
        text = first["text"]
    return f"  {who}{text} ({c.count}x, {c.signature.name})"


def _with_first(ranked: list[Ranked], kind, confidence: float) -> list[Ranked]:
    """The silent-death answer first, then the signature's own ranked alternatives (its cause once)."""
    head = Ranked(kind, confidence, "the rank whose log stops without an error was killed (SIGKILL: the OOM "
                  "killer or the scheduler)", "dmesg -T | grep -i 'killed process' on that rank's host", [])
    return [head] + [r for r in ranked if r.cause != kind.cause]


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


# An exception line as Python prints it, after whatever a launcher or a paste put before it.
_RAISED = re.compile(r"(?:^|[\s|:\]]\s?)(?P<type>(?:[A-Za-z_]\w{0,60}\.){0,6}[A-Z]\w{0,60}(?:Error|Exception))"
                     r"(?:: (?P<message>.{0,300}))?$")
EXCEPTION_CONFIDENCE = 0.5


def _exception_finding(acc: Accumulator, catalog: Catalog) -> Finding | None:
    """No signature matched, but a process raised an exception: that exception is the failure.

    Only its message is known (no traceback, or one that names no rank), so the confidence stays
    moderate; a traceback with its rank is read by the job's diagnosis instead.
    """
    lines = sorted(acc.relevant, key=lambda item: (item[1], item[2]))
    for _, _, number, file, text in lines:
        match = _RAISED.search(text.rstrip())
        if match is None:
            continue
        rank, _ = split_prefix(text.strip().lstrip("| "))
        kind = catalog.kinds["log.E037"]
        raised = clean_quote(f"{match['type']}: {match['message'] or ''}".rstrip(": "))
        evidence = [{"file": file, "line": number, "text": clean_quote(text)}]
        return kind(
            f"A process raised {raised}"[:300],
            detail="\n".join(["No distributed failure signature matched; this exception ended the process:",
                              *_quote(evidence), "Its traceback (with the rank's prefix) would name the rank and "
                              "the line; what other ranks printed afterwards is a consequence of it."]),
            remediation=f"Fix the cause of {match['type']} in the job's code or data (the traceback above this line "
            "names the file and line).",
            ranks=[rank] if rank is not None else [],
            data={"signature": "raised_exception", "role": "cause", "exception": match["type"],
                  "evidence": evidence},
            check=CHECK_NAME,
            confidence=EXCEPTION_CONFIDENCE,
        )
    return None


# What a torch.distributed failure that no signature names was, most likely first (hand-set; the
# labelled threads of the family `other_distributed` reorder them).
UNRECOGNISED = [
    ("worker_exception", 0.3, "a rank's own code or data raised, and torch.distributed's error is what its peers saw",
     "a Python traceback in the first failing rank's own log (--log-dir, its [rankN]: prefix)"),
    ("rank_missing", 0.25, "a rank crashed, was killed or never started, and the others failed waiting for it",
     "a rank whose log is missing, empty or ends early; torchrun's summary names it"),
    ("version_incompat", 0.15, "torch, CUDA, NCCL or the driver differ between nodes or do not fit together",
     "python -m torch.utils.collect_env on every node"),
    ("wrong_interface", 0.15, "the backend's traffic goes over an interface that does not link the hosts",
     "NCCL_DEBUG=INFO's 'NET/Socket : Using' line; it works with NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME set"),
    ("collective_timeout_hang", 0.1, "a collective did not complete and nothing more specific is known",
     "distdoctor check --stage collective on the same nodes"),
]


_DISTRIBUTED = re.compile(r"torch[/.]distributed|distributed_c10d|ProcessGroup|c10d|NCCL WARN|gloo/")


# A line whose only error word is a timeout's setting ("'timeout': 900", "timeout=1800") configures, it
# does not fail.
_SETTING = re.compile(r"(?i)time_?out['\"]?\s{0,3}[:=]")
_FAILING = re.compile(r"(?i)error|fail|exception|killed|abort|fatal|timed out|segmentation")


# NCCL < 2.8 warned on every host without InfiniBand, then used sockets: a line of a healthy start-up.
_BENIGN = re.compile(r"NCCL WARN Failed to open libibverbs")


def failure_lines(acc: Accumulator) -> list[tuple[int, int, int, str, str]]:
    """The relevant lines that look like a failure (an error word), not a timeout's setting nor a benign warning."""
    return [r for r in acc.relevant if r[0] >= 2 and (not _SETTING.search(r[4]) or _FAILING.search(r[4]))
            and not _BENIGN.search(r[4])]


def _went_on(acc: Accumulator, progress: dict[int, int]) -> bool:
    """The output shows the job at work after its last error-looking line (in that line's input), or at
    all when no line looks like an error: as far as these logs tell, nothing failed."""
    errors = [(src, line) for _, src, line, *_ in failure_lines(acc)]
    if not errors:
        return acc.progress_seen
    return all(progress.get(src, -1) > line for src, line in errors)


def _distributed_fallback(found: Finding, acc: Accumulator, catalog: Catalog, went_on: bool) -> Finding:
    """A failure with torch.distributed in the log that no signature names: still ranked candidates,
    never 'unknown'. A log with nothing of torch.distributed in it, or one that shows no failure
    (no error line, or the job at work after it), keeps its reading, unless it stops inside a
    collective's frames or right after NCCL's start-up: a hang (stopped.py)."""
    # A failure: an error-looking line, or a traceback (cut before its exception line, it has none).
    if not failure_lines(acc) and not any("Traceback (most recent call last)" in text for *_, text in acc.relevant):
        if found.id != "log.W030" or went_on:
            return found
        return stopped_in_collective(found, acc, catalog) or stopped_after_nccl_init(found, acc, catalog) or found
    if "ctx_torch_distributed" not in acc.cues and not any(_DISTRIBUTED.search(text) for *_, text in acc.relevant):
        return found
    if found.id == "log.W030" and went_on:
        return found  # the job went on: as far as these logs tell, nothing failed
    raised = (found.data.get("exception") or "").rsplit(".", 1)[-1]
    if raised and raised != "RuntimeError" and raised not in DIST_ERRORS:
        return found  # an exception type torch.distributed does not raise: the rank's own, by its origin
    ranked = rank_family("other_distributed", UNRECOGNISED, acc, catalog)
    if not ranked:
        return found
    top = ranked[0]
    lead = ("A torch.distributed failure that no known signature names: "
            + (found.title if found.id != "log.W030" else "its most relevant lines are quoted below"))
    data = {**found.data, "signature": "distributed_unrecognised", "role": "symptom",
            "candidates": [r.to_dict() for r in ranked], "family": "other_distributed"}
    return top.kind(lead[:400], detail="\n".join([found.detail, *describe(ranked)]),
                    remediation=f"{top.kind.hint}. To confirm: {top.tell}", ranks=found.ranks, hosts=found.hosts,
                    data=data, check=CHECK_NAME, confidence=min(top.confidence, EXCEPTION_CONFIDENCE))


def _unknown_finding(acc: Accumulator, catalog: Catalog, went_on: bool) -> Finding:
    kind = catalog.kinds["log.W030"]
    lines = sorted(acc.relevant, key=lambda item: (item[1], item[2]))
    evidence = [{"file": f, "line": n, "text": clean_quote(t)} for _, _, n, f, t in lines]
    steps = advice(acc, len(catalog.signatures), bool(failure_lines(acc)) and not went_on)
    if evidence and went_on:
        detail = ["No known failure signature matched, and the output shows the job at work (progress bars, steps, "
                  "losses): as far as these logs tell, nothing failed. The lines that look most relevant:"] \
            + _quote(evidence, len(evidence))
    elif evidence:
        detail = ["No known failure signature matched. The lines that look most relevant:"] + _quote(evidence, len(evidence))
    elif went_on:
        detail = ["No line looks like an error (no 'error', 'failed', 'timeout', 'killed' ...), and the output shows "
                  "the job at work (progress bars, steps, losses): as far as these logs tell, nothing failed. If the "
                  "job hung, its last lines are where each rank stopped; for a live job, distdoctor stacks shows where "
                  "each rank waits."]
    else:
        detail = ["No known failure signature matched, and no line looks like an error (no 'error', 'failed', "
                  "'timeout', 'killed' ...). The job may have been stopped from outside, or the log is not its output."]
    return kind(
        detail="\n".join(detail + steps.lines()),
        remediation="Collect " + "; then ".join(steps.collect_next[:2]) + ".",
        data={"evidence": evidence, "signature": None, **steps.to_dict()},
        check=CHECK_NAME,
        confidence=0.0,
    )


def _empty_logs_finding(acc: Accumulator, catalog: Catalog) -> Finding:
    """Nothing matched, and some logs are empty: an empty per-rank log is what a hung rank leaves."""
    files = acc.empty_files
    ranks = sorted(acc.empty_ranks)
    if not ranks:
        kind = catalog.kinds["log.W030"]
        return kind(
            f"{', '.join(files[:4])}: the log is empty",
            detail="The log holds no text at all: the process printed nothing (it hung or was killed before its "
            "first line, or its output went elsewhere), or this is not the file the job wrote.",
            remediation="Check where the job's output goes (the scheduler's --output, torchrun --log-dir, "
            "kubectl logs --previous); for a hung process, py-spy dump --pid <pid> shows where it waits.",
            data={"signature": "empty_log", "empty_files": files, "evidence": []},
            check=CHECK_NAME,
            confidence=0.0,
        )
    kind = catalog.kinds["log.E006"]
    who = format_ranks(ranks)
    others = sorted(acc.ranks_seen - set(ranks))
    detail = [f"The log of rank {who} is empty: that rank printed nothing — it hung before its first line, was "
              "killed early, or never started."]
    if others:
        detail.append(f"The other ranks' logs ({format_ranks(others)}) name no known failure.")
    return kind(
        f"Rank {who} printed nothing: hung, killed early or never started",
        detail="\n".join(detail + [f"  {f}: 0 lines" for f in files[:8]]),
        remediation=f"On rank {who}'s host: is the process alive (ps, py-spy dump --pid <pid> shows where it "
        "waits)? dmesg -T | grep -i 'killed process' for an OOM kill; the scheduler's record for a task that "
        "never started.",
        ranks=ranks,
        data={"signature": "empty_rank_log", "empty_logs": ranks, "empty_files": files, "evidence": []},
        check=CHECK_NAME,
        confidence=EMPTY_LOG_CONFIDENCE,
    )


MAX_SKIPPED_SHOWN = 20


def skipped_finding(skipped: list[str], catalog: Catalog) -> Finding:
    """Files found in a directory that could not be read (binary, not UTF-8, a broken dump): named, not fatal."""
    kind = catalog.kinds["log.W036"]
    shown = skipped[:MAX_SKIPPED_SHOWN]
    more = len(skipped) - len(shown)
    return kind(
        f"{len(skipped)} input file{'s' if len(skipped) != 1 else ''} could not be read and {'were' if len(skipped) != 1 else 'was'} skipped",
        detail="\n".join(["The other files were read; these were not:", *(f"  {clean_quote(s)}" for s in shown)]
                         + ([f"  … and {more} more"] if more else [])),
        remediation="If one of them is the log that matters, convert it to UTF-8 text (iconv) or pass the right file.",
        data={"signature": "skipped_inputs", "skipped": [clean_quote(s) for s in skipped[:500]], "evidence": []},
        check=CHECK_NAME,
        confidence=None,
    )
