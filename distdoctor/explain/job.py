"""The job's verdict (diagnosis.diagnose over the ranks' snapshots) merged with the catalog's findings."""

# The catalog reads messages one at a time; the diagnosis reads the job: which rank failed first
# and how, which ranks' errors only followed from it. The two are merged into one answer:
# - the diagnosis's first finding is the cause, unless the catalog read the failing rank's own
#   error as a specific cause (KeyError 'LOCAL_RANK', a DETAIL shape mismatch, CUDA out of memory):
#   then that is the cause, and the rank, its line and the consequences are added to it;
# - the catalog's symptoms, crashes and torchrun's summary lines about the same failure are folded
#   under the cause as its consequences (quoted, not separate findings that outrank it);
# - the verdict gets a confidence: high only where the evidence is specific to that cause (an own
#   exception before any peer failed, a recorder's mismatch), and for what the logs leave open (a
#   rank that printed nothing, a rank that finished while its peers waited) ranked candidates, each
#   with the observation that would tell it apart.

from __future__ import annotations

from typing import AbstractSet, Any, Sequence

from distdoctor.core.findings import Finding, FindingKind
from distdoctor.core.report import format_ranks
from distdoctor.diagnosis import kinds as job_kinds
from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.frames import is_user_file
from distdoctor.diagnosis.snapshot import EXITED, RaisedError, RankSnapshot
from distdoctor.explain.activity import CLOCK_MARGIN_S
from distdoctor.explain.candidates import Ranked, apply_cues, describe, from_threads
from distdoctor.explain.priors import active_priors
from distdoctor.explain.catalog import Catalog
from distdoctor.explain.ranks import CUT_TYPE, RankCollector
from distdoctor.explain.scan import Accumulator
from distdoctor.explain.snapshots import FINISHED_WORDS, KEPT_GOING, QUIET_FIRST

CHECK_NAME = "explain"
SPECIFIC = 0.8
MAX_SNAPSHOTS = 64  # rank snapshots kept in a finding's data
# Catalog signatures that are torchrun's own account of a failure (its summary, the agent's line).
LAUNCHER_SIGNATURES = ("child_failed_generic", "launcher_nonzero_exit", "rank_sigkill", "native_crash",
                       "rank_sigbus", "terminate_called", "launcher_return_code_kill", "shell_killed",
                       "srun_task_exited")

# What each verdict leaves open, read from logs: (cause, confidence, why, what tells it apart).
OPEN: dict[str, list[tuple[str, float, str, str]]] = {
    "job.E002": [
        ("straggler_rank", 0.55, "the rank that printed no error was still busy elsewhere (data loading, evaluation, "
         "a checkpoint) when the others gave up", "its log shows it working past the others' timeout; a longer "
         "timeout= in init_process_group lets the job through"),
        ("rank_missing", 0.3, "the rank was hung (a deadlock, native code holding the GIL), not merely slow",
         "py-spy dump --pid <pid> on it while the job hangs shows where it is stuck"),
        ("collective_mismatch", 0.2, "the rank waited in a different collective than the others",
         "TORCH_DISTRIBUTED_DEBUG=DETAIL, or the flight recorder's dump of every rank, names the collective each is in"),
        ("timeout_config", 0.15, "the process-group timeout is too short for what the job does between collectives",
         "the timeout= given to init_process_group (seconds) against the time one step takes"),
    ],
    "job.E003": [
        ("uneven_inputs", 0.75, "the rank that ended cleanly ran out of batches while the others still issued "
         "collectives", "the ranks' last step numbers differ; len(dataloader) differs between ranks"),
        ("collective_mismatch", 0.3, "a rank-dependent branch skipped a collective on the rank that finished",
         "TORCH_DISTRIBUTED_DEBUG=DETAIL names the first collective the ranks disagree on"),
        ("rank_missing", 0.15, "the rank that ended was stopped from outside before the others",
         "the scheduler's or launcher's record of that rank's end"),
    ],
    "job.E004": [
        ("rank_missing", 0.5, "the rank ended or stopped answering without an error of its own",
         "that rank's own log and its exit code (torchrun's failure summary, the scheduler's record)"),
        ("oom_killed_rank", 0.3, "a process that ends without a word was killed by a signal, most often the OOM killer",
         "dmesg -T | grep -i 'killed process' on that rank's host"),
        ("straggler_rank", 0.25, "the rank was alive and busy elsewhere when the others gave up",
         "its log goes on past the others' timeout"),
        ("uneven_inputs", 0.2, "the rank finished its batches and left while the others still waited",
         "its last line says it finished; its step count is lower than the others'"),
    ],
    "job.E005": [
        ("oom_killed_rank", 0.6, "SIGKILL is the out-of-memory killer's signal",
         "dmesg -T | grep -i -E 'killed process|out of memory' on that rank's host names the process"),
        ("resource_limit", 0.25, "the scheduler killed the job for its memory or time limit",
         "sacct -j <job> -o State,ExitCode,MaxRSS (OUT_OF_MEMORY, TIMEOUT), or the scheduler's log"),
        ("rank_missing", 0.15, "the rank was killed from outside (by hand, preemption, a health check)",
         "who sent the signal: the scheduler's or the node's log at that time"),
    ],
    "job.E009": [
        ("collective_timeout_hang", 0.4, "every rank arrived and the collective itself did not complete",
         "distdoctor check --stage collective on the same nodes"),
        ("straggler_rank", 0.3, "one rank arrived so late that the others had already given up",
         "compare the ranks' timestamps before the collective"),
        ("rank_missing", 0.25, "a rank not in these logs never arrived", "the number of ranks whose logs were given"),
        ("wrong_interface", 0.2, "the backend's traffic goes over an unusable interface",
         "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME and NCCL_DEBUG=INFO's 'NET/Socket : Using' line"),
    ],
}
CONFIDENCE = {"job.E001": 0.9, "job.E006": 0.9, "job.E007": 0.9, "job.E008": 0.9}
RAISED_IN_LIBRARY = 0.75   # an own exception raised inside torch or another library: the message decides
NO_TRACEBACK = 0.7         # an exception known only by its message (an error file, torchrun's summary)
ANONYMOUS_WITH_FRAME = 0.75  # an exception with its traceback, but no rank: which process is not known
CUT_OFF = 0.45             # a traceback the log ends inside: the rank raised, what is not known


def job_findings(snaps: Sequence[RankSnapshot], log_findings: list[Finding], acc: Accumulator,
                 catalog: Catalog, error_lines: dict[int, set[tuple[str, int]]] | None = None,
                 anonymous: tuple[RaisedError, tuple[str, int]] | None = None,
                 activity: dict[int, str] | None = None) -> list[Finding]:
    """The log findings with the job's verdict merged in, most likely cause first.

    error_lines: per rank, the (file, line) of the exceptions its logs show (to tell the catalog's
    reading of that very line from other lines). anonymous: an exception of the job's own code that
    no rank prefix or file names (a process's plain output), used when no rank raised one.
    """
    verdict = diagnose(snaps) if snaps else []
    if anonymous is not None and not any(f.id == job_kinds.EXCEPTION.id for f in verdict[:1]):
        verdict = [_anonymous_verdict(anonymous[0])]
    if verdict and verdict[0].id == job_kinds.HANG.id and (
            len(snaps) < 2 or "gone" in peer_states(snaps, catalog) or any(f.data.get("signature") for f in log_findings)):
        # "Every rank waits" says no more than the timeouts it was read from, and less when the logs
        # are one rank's view or lost a peer none of them is from: the catalog's reading of those
        # lines (the op, the sequence number, the timeout, ranked alternatives) stays the answer.
        verdict = verdict[1:]
    if verdict and verdict[0].id in (job_kinds.STRAGGLER.id, job_kinds.MISSING.id) \
            and peer_states(snaps, catalog) == {"refused"}:
        # A connect refused says the address the peer published had nothing listening (a wrong
        # interface, a filter, a peer gone during set-up), not that the peer came late: the catalog's
        # ranked reading of the refusal stays the answer, with the ranks that were refused.
        return _refused(snaps, log_findings)
    if not verdict:
        return log_findings
    if any(f.data.get("from_report") and f.id == verdict[0].id and f.ranks == verdict[0].ranks for f in log_findings):
        return log_findings  # a report's own verdict over the same snapshots is already shown, as it was
    primary, extra = verdict[0], verdict[1:]
    first = _first_snapshot(primary, snaps)
    lines = (error_lines or {}).get(first.rank, set()) if first is not None else set()
    if first is None and anonymous is not None:
        lines = {anonymous[1]}
    specific = _specific_log_cause(primary, lines, log_findings, {s.rank for s in snaps if s.died_exiting})
    folded = [f for f in log_findings if f is not specific and _folds(f, primary)]
    kept = [f for f in log_findings if f is not specific and f not in folded]
    if specific is not None:
        top = _add_job(specific, primary, folded, first)
    else:
        top = _verdict(primary, first, snaps, folded, acc, catalog, activity or {})
    return [_past_its_loop(top, snaps, catalog)] + [_recorder(f) for f in extra] + kept


def _refused(snaps: Sequence[RankSnapshot], log_findings: list[Finding]) -> list[Finding]:
    """The catalog's reading of a refused connection first, naming the ranks it failed on, with the
    launcher's account of the same failure folded under it."""
    launcher = [f for f in log_findings if f.data.get("signature") in LAUNCHER_SIGNATURES]
    rest = [f for f in log_findings if f not in launcher]
    if not rest:
        return log_findings
    top = rest[0]
    refused = sorted(s.rank for s in snaps if s.error is not None and s.error.consequence)
    lines, folded = _folded_lines(launcher)
    detail = top.detail
    if refused:
        detail += f"\nRank{'s' if len(refused) > 1 else ''} {format_ranks(refused)} failed with it; the other ranks " \
                  "were ended by the launcher."
    if lines:
        detail += "\nWhat the logs also show (the same failure, or its consequences on the other ranks):\n" + "\n".join(lines)
    data = {**top.data, "consequences": list(top.data.get("consequences") or []) + folded}
    return [top.with_(detail=detail, data=data, ranks=top.ranks or refused)] + rest[1:]


MISMATCHES = ("collective_mismatch", "shape_mismatch", "dtype_mismatch")
PAST_LOOP_CONFIDENCE = 0.7


def _in_backward(snap: RankSnapshot) -> bool:
    """Its failing collective ran inside backward (DDP's gradient all-reduce)."""
    return any(f.function in ("backward", "_engine_run_backward", "run_backward") or "/torch/autograd/" in f.file
               for f in snap.stack)


def _past_its_loop(top: Finding, snaps: Sequence[RankSnapshot], catalog: Catalog) -> Finding:
    """A mismatch where one rank's collective is DDP's gradient all-reduce inside backward and another
    rank's is not: that rank had left the training loop (an all_reduce of a metric, a barrier, the
    next epoch's set-up) while its peer still trained — uneven inputs, not two code paths."""
    if top.cause not in MISMATCHES:
        return top
    raised = [s for s in snaps if s.error is not None and s.stack]
    training = [s.rank for s in raised if _in_backward(s)]
    outside = [s for s in raised if not _in_backward(s)]
    if not training or not outside:
        return top
    kind = next(k for k in catalog.kinds.values() if k.cause == "uneven_inputs")
    left = outside[0]
    where = f" at {left.where.label}" if left.where else ""
    ranked = [Ranked(kind, PAST_LOOP_CONFIDENCE, f"rank {format_ranks([s.rank for s in outside])} ran a collective "
                     f"outside backward{where} while rank {format_ranks(training)} still all-reduced gradients in "
                     "backward: it had run out of batches first", "len(dataloader) (or the iterable's length) per rank", []),
              Ranked(_kind_for(top.cause, catalog, job_kinds.MISMATCH), 0.45,
                     f"the ranks' code issues different collectives here ({top.title})",
                     "TORCH_DISTRIBUTED_DEBUG=DETAIL's fingerprints and the two lines named", [])]
    detail = [top.detail, *describe(ranked)]
    return kind(f"Rank {format_ranks([s.rank for s in outside])} left the training loop while rank "
                f"{format_ranks(training)} still ran backward: {top.title}"[:400],
                detail="\n".join(detail), remediation=f"{kind.hint}. To confirm: compare len(dataloader) across ranks "
                "(an IterableDataset must yield the same number of batches on every rank, or use DDP's join()).",
                ranks=[s.rank for s in outside], hosts=top.hosts,
                data={**top.data, "candidates": [r.to_dict() for r in ranked], "signature": "left_training_loop",
                      "in_backward": training}, check=CHECK_NAME, confidence=PAST_LOOP_CONFIDENCE)


def _anonymous_verdict(error: RaisedError) -> Finding:
    where = f" at {error.frame.label}" if error.frame else ""
    return job_kinds.EXCEPTION(
        f"A process raised {error.type}: {error.message}"[:300] + where,
        detail=f"The job's code raised {error.type}" + (f" at {error.frame.describe()}" if error.frame else "")
        + (f": {error.message}" if error.message else "") + "; no rank prefix or file names which rank printed it.",
        data={"anonymous_error": error.to_dict()}, check=CHECK_NAME)


def _first_snapshot(finding: Finding, snaps: Sequence[RankSnapshot]) -> RankSnapshot | None:
    return next((s for s in snaps if finding.ranks and s.rank == finding.ranks[0]), None)


def _specific_log_cause(primary: Finding, lines: set[tuple[str, int]], log: list[Finding],
                        exit_crashes: AbstractSet[int] = frozenset()) -> Finding | None:
    """The catalog's reading of the same failure, when it says more than the verdict.

    - a cause the catalog read on the failing rank's own exception line (a DETAIL mismatch, a
      monitored_barrier naming the late rank, KeyError 'LOCAL_RANK'): more specific than "it raised",
      unless the catalog itself cannot name a cause there (cause unknown);
    - for a verdict that could not read the rank's error (an exit code, a signal), a cause or crash
      the catalog read for the same rank, or a confident cause that names no rank (a usage error);
    - never a crash of ranks that died of it after their loop was over (exit_crashes): how they ended.
    """
    for finding in log:
        role = finding.data.get("role")
        if role not in ("cause", "crash"):
            continue
        shared = set(finding.ranks) & set(primary.ranks)
        if role == "crash" and shared and shared <= exit_crashes:
            continue  # a crash after the rank's loop was over: how it ended, not why its peers failed
        on_line = any((e.get("file"), e.get("line")) in lines for e in finding.data.get("evidence") or ())
        same_rank = bool(shared)
        if primary.id == job_kinds.EXCEPTION.id:
            confident = (finding.confidence or 0) >= SPECIFIC and (same_rank or not finding.ranks)
            if finding.cause not in ("unknown", primary.cause) and (on_line or confident):
                return finding
        elif same_rank or (role == "cause" and not finding.ranks and (finding.confidence or 0) >= SPECIFIC):
            return finding
    return None


def _folds(finding: Finding, primary: Finding) -> bool:
    """A log finding that is the same failure seen again, or what its peers saw afterwards."""
    role = finding.data.get("role")
    if finding.id == "log.W030":
        return True  # "nothing matched" says nothing once the job's verdict names the failure
    if finding.data.get("signature") in LAUNCHER_SIGNATURES or finding.data.get("signature") == "silent_rank_death":
        return True
    if role == "symptom" or finding.data.get("candidates"):
        return True
    return finding.cause == primary.cause or (role == "crash" and not set(finding.ranks) - set(primary.ranks))


def _folded_lines(folded: list[Finding], cause: str = "") -> tuple[list[str], list[dict[str, Any]]]:
    lines, data = [], []
    for f in folded:
        evidence = list(f.data.get("evidence") or [])[:2]
        who = f"rank{'s' if len(f.ranks) > 1 else ''} {format_ranks(f.ranks)}: " if f.ranks else ""
        quote = f" — {evidence[0]['file']}:{evidence[0]['line']}: {evidence[0]['text']}" if evidence else ""
        if f.data.get("signature") in LAUNCHER_SIGNATURES:
            label = "the launcher's account of it"
        elif cause and f.cause != cause:
            label = f"read alone, one line says: {f.title}"  # what the message would mean without the other ranks
        else:
            label = f.title
        lines.append(f"  {who}{label} ({f.id}){quote}"[:500])
        data.append({"id": f.id, "cause_if_alone": f.cause, "title": f.title, "ranks": list(f.ranks),
                     "signature": f.data.get("signature"), "evidence": evidence})
    return lines, data


def _verdict(primary: Finding, first: RankSnapshot | None, snaps: Sequence[RankSnapshot], folded: list[Finding],
             acc: Accumulator, catalog: Catalog, activity: dict[int, str]) -> Finding:
    kind, confidence, ranked = _kind_and_confidence(primary, first, snaps, acc, catalog, activity)
    lines, folded_data = _folded_lines(folded, kind.cause)
    detail = [primary.detail]
    rival = _close_call(first, snaps)
    if rival is not None:
        # Two ranks raised their own errors within what two hosts' clocks may differ by: which was
        # first, these timestamps cannot tell.
        confidence = min(confidence, CLOSE_CALL)
        detail.append(f"Rank {rival.rank} also raised {rival.error.type} within {CLOCK_MARGIN_S:.0f} s of it by "
                      "another clock: which failed first, clocks that may differ cannot tell; read both.")
    notes = [f"  rank {s.rank}: {note}" for s in snaps for note in s.notes]
    if notes:
        detail += ["What each rank's own lines say of its end:", *notes[:16]]
    if lines:
        detail += ["What the logs also show (the same failure, or its consequences on the other ranks):", *lines]
    data: dict[str, Any] = {**primary.data, "signature": "job_" + primary.id.split(".")[-1].lower(), "role": "cause",
                            "job_finding": primary.id}
    if len(data.get("snapshots") or ()) > MAX_SNAPSHOTS:
        # A report stays readable for a 4096-rank job: the ranks named first, the rest counted.
        named = set(primary.ranks) | set(data.get("consequences_ranks") or ())
        kept = [x for x in data["snapshots"] if x.get("rank") in named][:MAX_SNAPSHOTS] or data["snapshots"][:MAX_SNAPSHOTS]
        data["snapshots_left_out"] = len(data["snapshots"]) - len(kept)
        data["snapshots"] = kept
    if folded_data:
        # The catalog's reading of this rank's own failure is the same failure; the rest is what followed.
        same = [f for f in folded_data if f["ranks"] and not set(f["ranks"]) - set(primary.ranks)]
        after = [f for f in folded_data if f not in same]
        after += [c for f in folded for c in f.data.get("consequences") or () if isinstance(c, dict)]
        data["consequences"] = after
        if same:
            data["same_failure"] = same
        data["evidence"] = [e for f in folded_data for e in f["evidence"]][:5]
    if acc.empty_ranks:
        data["empty_logs"] = sorted(acc.empty_ranks)
        detail.append(f"The log of rank {format_ranks(acc.empty_ranks)} is empty: that rank printed nothing (hung, or "
                      "killed before its first line).")
    if ranked:
        data["candidates"] = [r.to_dict() for r in ranked]
        detail += describe(ranked)
    own = kind.id == primary.id
    remediation = next((f.remediation for f in folded if f.cause == kind.cause and f.remediation),
                       primary.remediation if own else kind.hint)
    title = primary.title if own else _retitled(primary, kind, activity)
    if first is not None and first.error is not None and first.error.frame is not None and primary.id == "job.E001":
        title = f"{title} at {first.error.frame.label}"[:400]
    return kind(title, detail="\n".join(detail), remediation=remediation, ranks=primary.ranks, hosts=primary.hosts,
                data=data, check=CHECK_NAME, confidence=confidence)


def _retitled(primary: Finding, kind: FindingKind, activity: dict[int, str]) -> str:
    """A silent rank's title when the evidence ranked another reading of its silence first."""
    if primary.id == job_kinds.MISSING.id and kind.cause == "worker_exception":
        return primary.title.replace(" before its peers", "") + ": its own error is not in these logs"
    if primary.id != job_kinds.MISSING.id or " while " not in primary.title:
        return primary.title
    who = format_ranks(primary.ranks)
    said = {activity.get(rank, "") for rank in primary.ranks}
    how = {"uneven_inputs": "stopped after its last line said it finished" if FINISHED_WORDS in said
           else "left the job", "oom_killed_rank": "ended without a word (a signal?)",
           "straggler_rank": "was still busy elsewhere"}.get(kind.cause)
    if how is None:
        return primary.title
    return f"Rank{'s' if len(primary.ranks) > 1 else ''} {who} {how} while " + primary.title.split(" while ", 1)[1]


def _kind_and_confidence(primary: Finding, first: RankSnapshot | None, snaps: Sequence[RankSnapshot],
                         acc: Accumulator, catalog: Catalog,
                         activity: dict[int, str]) -> tuple[FindingKind, float, list[Ranked]]:
    own = _job_kind(primary.id)
    if primary.id == job_kinds.EXCEPTION.id:
        if first is None and primary.data.get("anonymous_error"):
            raised = RaisedError.from_dict(primary.data["anonymous_error"])
            return own, ANONYMOUS_WITH_FRAME if raised and raised.frame else NO_TRACEBACK, []
        return own, _exception_confidence(first), []
    if primary.id not in OPEN:
        return own, CONFIDENCE.get(primary.id, 0.6), []
    options = OPEN[primary.id]
    family = VERDICT_FAMILY.get(primary.id)
    if primary.id == job_kinds.MISSING.id and first is not None and first.error is None \
            and first.exit_code is not None and first.exit_code > 0:
        options = _exit_without_error(snaps)
        family = "child_failed_only"  # torchrun's summary of a worker whose own error is not in the logs
    if primary.id == job_kinds.UNEVEN.id and not (first and first.status == EXITED and first.exit_code == 0):
        options = [(c, conf - 0.15 if c == "uneven_inputs" else conf, why, tell) for c, conf, why, tell in options]
    ranked = [Ranked(_kind_for(cause, catalog, own), conf, why, tell, []) for cause, conf, why, tell in options]
    said = {activity.get(rank, "") for rank in primary.ranks}
    if primary.id == job_kinds.MISSING.id:
        _weigh_how_peers_failed(ranked, peer_states(snaps, catalog), said_finished=FINISHED_WORDS in said)
    _weigh_activity(ranked, said)
    if family:
        # A verdict read from an exit code alone: how often each cause was behind it in the labelled threads.
        ranked = from_threads(ranked, family, acc, catalog, active_priors())
    # The kill the verdict is about is no further evidence for it.
    ranked = apply_cues(ranked, acc, catalog, ignore=("sigkill_line",) if primary.id == job_kinds.KILLED.id else ())
    top = ranked[0]
    return top.kind, top.confidence, ranked


# Verdicts that a failure signature of the labelled threads stands for: a rank SIGKILLed.
VERDICT_FAMILY = {job_kinds.KILLED.id: "killed_signal"}
CLOSE_CALL = 0.6


def _close_call(first: RankSnapshot | None, snaps: Sequence[RankSnapshot]) -> RankSnapshot | None:
    """Another rank's own error timed within the clock margin of the first's, on another host (or a host
    the logs do not name)."""
    if first is None or first.error is None or first.error.time is None or first.error.consequence:
        return None
    for snap in snaps:
        other = snap.error
        if snap.rank == first.rank or other is None or other.consequence or other.time is None:
            continue
        same_host = bool(first.host) and first.host == snap.host
        if not same_host and abs(other.time - first.error.time) < CLOCK_MARGIN_S and other.time >= first.error.time:
            return snap
    return None


def _exit_without_error(snaps: Sequence[RankSnapshot]) -> list[tuple[str, float, str, str]]:
    """A rank that exited non-zero and whose error the logs do not hold (torchrun's summary alone)."""
    left_cleanly = any(s.status == EXITED and s.exit_code == 0 for s in snaps)
    return [
        ("worker_exception", 0.5, "a non-zero exit code (1) is what Python returns when an exception ends the process; "
         "the exception is in that rank's own output, which these logs do not hold",
         "that rank's own output (torchrun --tee 3 or --log-dir, or @record for an error file)"),
        ("uneven_inputs", 0.45 if left_cleanly else 0.2, "another rank had already exited 0: if this rank failed "
         "because its peer was gone, that peer ran out of batches first",
         "the failing rank's own error names a closed connection or a timeout"),
        ("rank_missing", 0.2, "the rank failed because a peer vanished", "the failing rank's own error"),
        ("oom_killed_rank", 0.15, "memory ran out: a DataLoader worker the OOM killer ended makes its rank raise and "
         "exit 1 (DataLoader worker ... is killed by signal: Killed), and a peer it killed makes the others fail",
         "dmesg -T | grep -i 'killed process' on the rank's host at that time"),
    ]


def peer_states(snaps: Sequence[RankSnapshot], catalog: Catalog) -> set[str]:
    """How the waiting ranks' errors say their peer failed: "gone" (a connection closed or reset: its
    process ended) or "late" (a wait timed out: nobody answered in time), as the catalog reads each
    message (a signature's `peer`), and "late" for a collective NCCL's watchdog timed out."""
    states = set()
    for snap in snaps:
        if snap.error is not None and snap.error.consequence:
            line = f"{snap.error.type}: {snap.error.message}"
            states |= {sig.peer for sig in catalog.signatures
                       if sig.peer and any(t in line for t in sig.tokens) and sig.regex.search(line)}
        if any(g.pending is not None and g.pending.state == "timed out" for g in snap.groups):
            states.add("late")
    return states


def _weigh_how_peers_failed(ranked: list[Ranked], states: set[str], said_finished: bool = False) -> None:
    """The waiting ranks' own errors say whether the silent rank's process was gone or alive but late:
    a closed connection means its process ended (a signal, most often SIGKILL, when it printed nothing
    more; a clean exit when its last line says it finished); a timeout means nobody answered in time
    (late, or hung)."""
    gone, late = "gone" in states, "late" in states
    for r in ranked:
        if gone and r.cause == "oom_killed_rank" and not said_finished:
            r.confidence += 0.27
            r.reasons.append("the waiting ranks lost the connection: the silent rank's process ended without a word")
        if gone and r.cause == "straggler_rank":
            r.confidence -= 0.15
        if late and not gone and r.cause == "straggler_rank":
            r.confidence += 0.25
            r.reasons.append("the waiting ranks timed out: the silent rank did not answer in time (late or hung)")


# How what a rank's output did around its peers' complaints moves the alternatives (snapshots.py).
ACTIVITY_WEIGHTS = {
    KEPT_GOING: ({"straggler_rank": 0.1, "rank_missing": -0.15},
                 "its output went on after its peers reported the timeout: it was alive and busy elsewhere"),
    QUIET_FIRST: ({"straggler_rank": -0.15},
                  "its output stopped before its peers reported anything: it was not busy printing"),
    FINISHED_WORDS: ({"uneven_inputs": 0.4},
                     "its last line says it finished (words support, they do not decide: it fell silent)"),
}


def _weigh_activity(ranked: list[Ranked], seen: set[str]) -> None:
    for word in seen & set(ACTIVITY_WEIGHTS):
        deltas, reason = ACTIVITY_WEIGHTS[word]
        for r in ranked:
            if r.cause in deltas:
                r.confidence += deltas[r.cause]
                r.reasons.append(reason)


def _exception_confidence(first: RankSnapshot | None) -> float:
    """0.9 when the user's own code raised it (the traceback's innermost frame is theirs), 0.75 when a
    library raised it on their behalf (CUDA out of memory inside torch), 0.7 when no traceback says."""
    if first is not None and first.error is not None and first.error.type == CUT_TYPE:
        return CUT_OFF  # it raised, but what: the log ends before the exception's line
    if first is None or first.error is None or first.error.frame is None:
        return NO_TRACEBACK
    innermost = first.stack[-1] if first.stack else first.error.frame
    return CONFIDENCE["job.E001"] if is_user_file(innermost.file) else RAISED_IN_LIBRARY


def _job_kind(finding_id: str) -> FindingKind:
    for kind in (job_kinds.EXCEPTION, job_kinds.STRAGGLER, job_kinds.UNEVEN, job_kinds.MISSING, job_kinds.KILLED,
                 job_kinds.MISMATCH, job_kinds.SHAPE, job_kinds.DTYPE, job_kinds.HANG):
        if kind.id == finding_id:
            return kind
    raise KeyError(finding_id)


def _kind_for(cause: str, catalog: Catalog, own: FindingKind) -> FindingKind:
    """A finding kind with this cause: the job's own first, else the catalog's."""
    if own.cause == cause:
        return own
    for kind in (job_kinds.STRAGGLER, job_kinds.UNEVEN, job_kinds.MISSING, job_kinds.KILLED, job_kinds.MISMATCH,
                 job_kinds.HANG):
        if kind.cause == cause:
            return kind
    return next(k for k in catalog.kinds.values() if k.cause == cause)


def _add_job(specific: Finding, primary: Finding, folded: list[Finding], first: RankSnapshot | None) -> Finding:
    """The catalog's specific cause, with the rank, its line and the consequences the job shows.

    The meaning is the catalog's (a CPU tensor on NCCL, a variable not set); the frame stays in the
    title: which rank raised what, at which line of the user's code."""
    lines, folded_data = _folded_lines(folded)
    detail = [specific.detail, "Across the job: " + primary.detail.replace("\n", "\n  ")]
    if lines:
        detail += ["What the logs also show (consequences):", *lines]
    data = {**specific.data, "job_finding": primary.id, "first_rank": primary.data.get("first_rank")}
    if folded_data:
        data["consequences"] = list(specific.data.get("consequences") or []) + folded_data
    title = specific.title
    if primary.id == job_kinds.EXCEPTION.id and first is not None and first.error is not None:
        frame = first.error.frame or first.where
        title = (f"{title} — rank {first.rank} raised {first.error.type}"
                 + (f" at {frame.label}" if frame else ""))[:400]
    # Its own ranks stay: the message may name another rank than the one that printed it (monitoredBarrier).
    return specific.with_(title=title, detail="\n".join(detail), data=data, ranks=specific.ranks or primary.ranks)


def _recorder(finding: Finding) -> Finding:
    """A mismatch the recorder's history shows beside the verdict: specific evidence."""
    return finding.with_(check=CHECK_NAME, confidence=CONFIDENCE.get(finding.id, 0.6))


RANK_CONFIG_CONFIDENCE = 0.85


def rank_config_finding(collector: RankCollector, catalog: Catalog) -> Finding | None:
    """Ranks that disagree about the job: different world sizes on their own lines, or one rank
    that torchrun's summaries put on two hosts (two processes claimed it)."""
    said = {rank: next(iter(t.world_sizes)) for rank, t in collector.ranks.items() if len(t.world_sizes) == 1}
    claimed = {rank: sorted(t.summary_hosts) for rank, t in collector.ranks.items() if len(t.summary_hosts) > 1}
    by_size: dict[int, list[int]] = {}
    for rank, size in said.items():
        by_size.setdefault(size, []).append(rank)
    if len(by_size) < 2 and not claimed:
        return None
    kind = catalog.kinds["log.E035"]
    lines = [f"rank{'s' if len(r) > 1 else ''} {format_ranks(r)}: world size {size}" for size, r in sorted(by_size.items())]
    lines += [f"rank {rank} was reported by torchrun on {' and '.join(hosts)}" for rank, hosts in sorted(claimed.items())]
    if len(by_size) > 1:
        title = "Ranks disagree on the world size: " + "; ".join(lines[:len(by_size)])
        ranks = [r for size, rs in by_size.items() if len(rs) < max(len(v) for v in by_size.values()) for r in rs]
    else:
        title = f"Rank {format_ranks(claimed)} was claimed by two processes (hosts {', '.join(next(iter(claimed.values())))})"
        ranks = list(claimed)
    return kind(
        title[:400],
        detail="\n".join(["What each rank's own lines say of the job:", *(f"  {line}" for line in lines[:16])]
                         + ["Every timeout or lost peer that follows comes from ranks waiting for peers their "
                            "world does not have (or has twice)."]),
        remediation="Start every process with the same WORLD_SIZE (nnodes x nproc_per_node) and a distinct RANK: "
        "the same --nnodes / --nproc-per-node on every node, a unique --node-rank, and one launcher per node "
        "(not torchrun inside srun -n N).",
        ranks=ranks or list(said), data={"signature": "ranks_disagree", "role": "cause",
                                         "world_sizes": {str(k): sorted(v) for k, v in by_size.items()},
                                         "claimed_twice": {str(k): v for k, v in claimed.items()}, "evidence": []},
        check=CHECK_NAME, confidence=RANK_CONFIG_CONFIDENCE)
