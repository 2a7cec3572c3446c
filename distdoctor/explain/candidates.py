"""Rank the candidate causes of a generic message, using what the other lines of the logs show."""

# A generic text (a watchdog timeout, "Socket Timeout", "unhandled system error", a bare
# ChildFailedError, "Connection closed by peer") fits several causes. The catalog lists them with
# a hand-set order and the observation that tells each apart; where the labelled public threads
# (threads.toml, dev part) hold enough threads of the text's family, their cause counts set the
# confidences instead (priors.py: smoothed towards the catalog's order), and the context the logs
# show (docker, several hosts, IB, rank 0 working alone ...) moves them as much as it moved the
# causes across those threads. The rest of the logs then reorders them: a cue line (an OOM kill, an NCCL INFO line naming
# docker0, a loopback address) adds to or takes from the causes it bears on, and a per-rank log
# that is empty, or that ends without any error, makes "that rank died or never came" likelier.
# The result is one ranked list: alternatives of one finding, never separate errors.

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from distdoctor.explain.catalog import Catalog, Signature, render_template
from distdoctor.explain.priors import Priors, active_priors
from distdoctor.explain.scan import Accumulator
from distdoctor.core.findings import FindingKind

# A generic text never reaches this: its answer stays a ranked guess, however strong the cues.
GENERIC_CEILING = 0.75
FLOOR = 0.02
# An empty per-rank log, or one without any error line, while other ranks report a failure.
SILENT_RANK_BOOST = {"rank_missing": 0.2, "oom_killed_rank": 0.15, "straggler_rank": 0.05}
# The cross-validated figure (tests/explain/corpus_figures.py --cross) leaves out the hand-set rules that only
# the judged log's thread supports, and records which rules a log fires: rule names "cue:<cue>" and
# "if:<finding id>:<field>:<cause>". Both are empty/None in use.
HELD_OUT_RULES: ContextVar[frozenset[str]] = ContextVar("held_out_rules", default=frozenset())
FIRED_RULES: ContextVar["set[str] | None"] = ContextVar("fired_rules", default=None)


def _rule(name: str) -> bool:
    """Whether a hand-set rule applies (not held out), recording that it fired."""
    fired = FIRED_RULES.get()
    if fired is not None:
        fired.add(name)
    return name not in HELD_OUT_RULES.get()


@dataclass
class Ranked:
    kind: FindingKind
    confidence: float
    why: str
    tell: str
    reasons: list[str]

    @property
    def cause(self) -> str:
        return self.kind.cause

    def to_dict(self) -> dict:
        out = {"id": self.kind.id, "cause": self.cause, "confidence": round(self.confidence, 3), "why": self.why,
               "tell": self.tell}
        if self.reasons:
            out["reordered_by"] = list(self.reasons)
        return out


def rank_candidates(sig: Signature, fields: dict, acc: Accumulator, catalog: Catalog, silent_ranks: list[int],
                    base: float | None = None, priors: Priors | None = None) -> list[Ranked]:
    """The signature's own cause and its candidates, adjusted by the evidence, most likely first."""
    cues = {c.name: c for c in catalog.cues}
    own_conf = sig.confidence if base is None else base
    ranked = [Ranked(sig.kind, own_conf, render_template(sig.title, fields), render_template(sig.tell, fields), [])]
    ranked += [Ranked(c.kind, c.confidence, render_template(c.why, fields), render_template(c.tell, fields), [])
               for c in sig.candidates]
    own = ranked[0]
    ranked = from_threads(ranked, sig.family, acc, catalog, active_priors() if priors is None else priors)
    if sig.role == "cause":
        # The message names its cause: it keeps its own confidence (what else the logs show still
        # moves it); the threads rank its alternatives.
        own.confidence = own_conf
    _add_cues(ranked, acc, cues)
    for field_name, cause, delta, note in sig.boost_if:
        if fields.get(field_name) and _rule(f"if:{sig.kind.id}:{field_name}:{cause}"):
            for r in ranked:
                if r.cause == cause:
                    r.confidence += delta
                    r.reasons.append(note)
    if silent_ranks:
        who = ", ".join(map(str, silent_ranks[:8]))
        for r in ranked:
            delta = SILENT_RANK_BOOST.get(r.cause)
            if delta:
                r.confidence += delta
                r.reasons.append(f"rank {who}'s log is empty or ends without an error")
    _on_one_host(ranked, acc)
    for r in ranked:
        ceiling = max(GENERIC_CEILING, own_conf) if r is own and sig.role == "cause" else GENERIC_CEILING
        r.confidence = round(min(ceiling, max(FLOOR, r.confidence)), 3)
    # Stable: equal confidences keep the catalog's (prior) order.
    return sorted(_causes_only(ranked) if sig.role == "crash" else ranked, key=lambda r: -r.confidence)


# Causes that need a network between hosts: on one host every address is the host's own.
BETWEEN_HOSTS = ("wrong_interface", "firewall", "ib_rdma_issue", "slow_link")


def _on_one_host(ranked: list[Ranked], acc: Accumulator) -> None:
    """A job the logs show on one host: the causes that need a network between hosts are out."""
    if not acc.one_host:
        return
    for r in ranked:
        if r.cause in BETWEEN_HOSTS:
            r.confidence = FLOOR
            r.reasons.append(f"one host ({acc.one_host}): no network between hosts to fail")


def _causes_only(ranked: list[Ranked]) -> list[Ranked]:
    """`unknown` is no cause to rank: a crash whose own reading is unknown (a native crash) keeps its
    alternatives, which are. (A rank's own error read as `unknown`, CUDA out of memory, stays: the job's
    diagnosis names it the rank's own failure.)"""
    causes = [r for r in ranked if r.cause != "unknown"]
    return causes or ranked


THREAD_COUNT_SUFFIX = " labelled threads with this message"


def from_threads(ranked: list[Ranked], family: str, acc: Accumulator, catalog: Catalog,
                 priors: Priors) -> list[Ranked]:
    """The candidates' confidences from the labelled threads of their signature's family (priors.py):
    how often each cause was behind it in the dev threads, smoothed towards the catalog's order, then
    moved by the context the logs show (docker, several hosts, IB ...) as much as that context moved
    the causes across the dev threads. The catalog's order stands where the threads are too few."""
    if not family:
        return ranked
    base = {r.cause: r.confidence for r in ranked}
    posterior = priors.posterior(family, base)
    if posterior is None:
        return ranked
    counts, n = priors.family_counts.get(family, {}), priors.family_threads(family)
    by_cause = {r.cause: r for r in ranked}
    for cause in posterior:
        if cause not in by_cause and cause != "unknown":
            kind = cause_kind(cause, catalog)
            if kind is None:
                continue
            what = "a torch.distributed failure no signature names" if family == "other_distributed" else "this message"
            by_cause[cause] = Ranked(kind, 0.0, f"the cause behind {what} in {counts.get(cause, 0)} of {n} "
                                     "labelled public threads", catalog.tells.get(cause, kind.hint), [])
    for cause, r in by_cause.items():
        r.confidence = posterior.get(cause, 0.0)
        if counts.get(cause):
            r.reasons.append(f"{cause} in {counts[cause]} of {n}{THREAD_COUNT_SUFFIX}")
    context = seen_context(acc, catalog)
    for cue, where in context.items():
        for cause, r in by_cause.items():
            lift = priors.lift(cue, cause)
            if lift is None or abs(lift - 1.0) < 0.15:
                continue
            r.confidence *= lift
            had, showing = priors.cue_support(cue, cause)
            r.reasons.append(f"{cue.replace('_', ' ')} ({where}): {cause} in {had} of the {showing} labelled threads "
                             f"that show it ({'more' if lift > 1 else 'less'} often than their messages alone predict)")
    total = sum(r.confidence for r in by_cause.values()) or 1.0
    for r in by_cause.values():
        r.confidence /= total
    return list(by_cause.values())


def rank_family(family: str, options: list[tuple[str, float, str, str]], acc: Accumulator,
                catalog: Catalog) -> list[Ranked]:
    """Candidates for a failure no signature names: (cause, hand-set confidence, why, tell) ranked by
    the labelled threads of the family and the context the logs show, capped as a generic text."""
    ranked = []
    for cause, confidence, why, tell in options:
        kind = cause_kind(cause, catalog)
        if kind is not None:
            ranked.append(Ranked(kind, confidence, why, tell, []))
    ranked = from_threads(ranked, family, acc, catalog, active_priors())
    ranked = apply_cues(ranked, acc, catalog)
    return ranked


def seen_context(acc: Accumulator, catalog: Catalog) -> dict[str, str]:
    """The threads' context cues these logs show, each with where (file:line, or what shows it)."""
    found = {}
    for cue in catalog.cues:
        if cue.thread_cue and cue.name in acc.cues:
            evidence = acc.cues[cue.name][1]
            found.setdefault(cue.thread_cue, f"{evidence['file']}:{evidence['line']}")
    if len(acc.hosts_seen) > 1 and "multi_node" not in found:
        found["multi_node"] = "hosts " + ", ".join(sorted(acc.hosts_seen)[:3])
    versions = sorted(v for v in acc.nccl_versions if v)
    if len(versions) > 1:
        found["version_mismatch"] = "NCCL versions " + ", ".join(versions[:3])
    return found


def cause_kind(cause: str, catalog: Catalog) -> FindingKind | None:
    """The catalog's finding kind for a cause (its first), if it has one."""
    return next((k for k in catalog.kinds.values() if k.cause == cause and k.id.startswith("log.E")), None)


def _add_cues(ranked: list[Ranked], acc: Accumulator, cues: dict) -> None:
    for name, (count, evidence) in acc.cues.items():
        cue = cues.get(name)
        if cue is None or (cue.boost and not _rule(f"cue:{name}")):
            continue
        for r in ranked:
            delta = cue.boost.get(r.cause)
            if delta:
                r.confidence += delta
                r.reasons.append(f"{cue.note} ({evidence['file']}:{evidence['line']})")


def apply_cues(ranked: list[Ranked], acc: Accumulator, catalog: Catalog, ignore: tuple[str, ...] = ()) -> list[Ranked]:
    """Alternatives the job's verdict leaves open, reordered by the cue lines of the logs (capped, sorted)."""
    _add_cues(ranked, acc, {c.name: c for c in catalog.cues if c.name not in ignore})
    _on_one_host(ranked, acc)
    for r in ranked:
        r.confidence = round(min(GENERIC_CEILING, max(FLOOR, r.confidence)), 3)
    return sorted(ranked, key=lambda r: -r.confidence)


def describe(ranked: list[Ranked]) -> list[str]:
    """Detail lines: the ranked alternatives, each with the observation that decides."""
    lines = ["Possible causes, most likely first (alternatives of this one finding):"]
    for i, r in enumerate(ranked, 1):
        lines.append(f"  {i}. {r.cause} ({round(r.confidence * 100)}%): {r.why}")
        if r.tell:
            lines.append(f"     tells it apart: {r.tell}")
    reasons = list(dict.fromkeys(reason for r in ranked for reason in r.reasons))
    counted = [reason for reason in reasons if reason.endswith(THREAD_COUNT_SUFFIX)]
    if counted:
        lines.append("Ranked by the labelled public threads with this message (threads.toml): "
                     + ", ".join(reason[:-len(THREAD_COUNT_SUFFIX)] for reason in counted[:6]))
    moved = [reason for reason in reasons if reason not in counted]
    if moved:
        lines.append("Reordered by what else the logs show: " + "; ".join(moved[:4]))
    return lines
