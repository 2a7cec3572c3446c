"""What a stall's verdict means for the job: end it now, or report it and watch (on_hang)."""

# on_hang="auto" (the default) ends a job only when it cannot finish, and never before torch would:
#   - a rank raised, died or was killed (job.E001, E005; E004 when its process is known to have
#     ended), a rank left while the others wait (E003), ranks wait in collectives that cannot
#     match (E006-E008, a dropped send guard.E009: a receive cycle, a peer waiting in a collective),
#     or every rank waits in one collective and no rank's connections moved data (E009 proven by
#     the transport's counters): the job ends right after the report;
#   - everything else is reported and watched: a live rank outside any collective (job.E002: a
#     rank-0-only checkpoint, evaluation, I/O, a slow batch), a rank that does not answer but may
#     still be alive (E004, frozen, stopped or on another host), a collective that still moves data
#     (job.W011) or whose motion cannot be read or is not yet proven (E009 unproven: NCCL, /proc
#     unreadable, less than 30 s without data), a matched send and receive that are merely slow, a
#     dropped send no receive waits for (guard.W013), and any verdict seen from one rank alone. A
#     watched stall is ended at the process group's own timeout counted from when the guard saw it
#     begin, plus the backend's grace_s (never earlier than torch ends the collective; torch raises
#     first, and the guard's exception hook then reports it with this diagnosis).
# on_hang="exit" ends the job at the first verdict (the tests' policy: CI wants the failure now);
# on_hang="report" never ends it.
# Severity follows the consequence: a watched stall is shown as a warning (the job goes on); a
# verdict that ends the job, or a stall still open when the run ends, is an error.

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from distdoctor.core.findings import Finding, Severity
from distdoctor.diagnosis.snapshot import EXITED, KILLED

END, WATCH, NONE = "end", "watch", "none"
CANNOT_FINISH = frozenset({"job.E001", "job.E003", "job.E005", "job.E006", "job.E007", "job.E008", "job.E009",
                           "guard.E009"})
# Why a verdict that may still clear is watched, by its finding.
_WATCHED = {
    "job.E002": "a rank that may still arrive is outside the collective",
    "job.E004": "a rank that does not answer may still be alive (frozen, stopped, or slow to answer)",
    "job.W011": "every rank is in the collective and it still moves data: slow, not stuck",
    "job.E009": "every rank is in the collective, but that it no longer moves data is not proven (its motion cannot "
                "be read, or it has not been silent long enough)",
    "job.E006": "the point-to-point calls may still match (their peers cannot all be read)",
}


# How long after the group's timeout the guard's backstop waits, per backend, so that torch, whose
# timeout runs from the collective's start, always ends a watched stall first (the guard's start of a
# stall is its first poll that saw the group stand still: at or after the collective's start, by up to
# the recorder's completion marking).
#   gloo: measured on torch 2.13 (2 ranks, one never arriving; T = 1, 2, 5, 10 s; all_reduce, recv,
#     barrier, broadcast; load 5-10 on 2 cores): the call raised "Timed out waiting T ms" 5-24 ms after
#     T, and the flight recorder marked a completed all_reduce 5-18 ms after it returned (300 calls).
#     5 s is a hundred times that, for a loaded scheduler. tests/guard/test_guard_grace.py measures
#     the installed torch's overshoot against it.
#   nccl: read from ProcessGroupNCCL.cpp: the watchdog checks every kWatchdogThreadSleepMillis (10 s in
#     torch 2.1, 100 ms from 2.2) and, on a timeout with the flight recorder's dump on, waits for the
#     dump up to TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (2 s, 60 s or 15 s by release) before it ends the
#     process: 60 s + 10 s + margin.
#   any other backend (mpi, ucc, one registered by a plugin) or one not known: the largest.
GRACE_BY_BACKEND = {"gloo": 5.0, "nccl": 75.0}
GRACE_S = max(GRACE_BY_BACKEND.values())
# A stall that clears this close to the group's timeout (or whose guarded call failed) was ended by
# torch's own timeout, not by the late rank arriving.
TORCH_ENDED_S = 1.0


def grace_s(backend: str | None, env: Any = None) -> float:
    """The backstop's wait after the group's timeout for a group on ``backend`` (None: not known)."""
    grace = GRACE_BY_BACKEND.get(str(backend or "").lower(), GRACE_S)
    if backend == "nccl":  # a dump wait set longer than the default lengthens torch's end too
        raw = str((os.environ if env is None else env).get("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "")).strip()
        if raw.isdigit():
            grace = max(grace, int(raw) / 1000 + 15.0)
    return grace


@dataclass(frozen=True)
class Decision:
    action: str                      # END, WATCH or NONE (nothing found: the stall cleared meanwhile)
    reason: str                      # in words, for the report
    deadline_at: float | None = None  # epoch seconds: when a watched stall is ended (the group's timeout)


def _ended(finding: Finding) -> bool:
    """job.E004 whose missing ranks' processes are known to have ended (not merely silent)."""
    missing = set((finding.data or {}).get("missing") or finding.ranks)
    snaps = [s for s in (finding.data or {}).get("snapshots") or () if isinstance(s, dict) and s.get("rank") in missing]
    return bool(snaps) and all(s.get("status") in (KILLED, EXITED) for s in snaps)


def _proven(finding: Finding) -> bool:
    """A finding the diagnosis could not prove (a hang whose motion it could not read, waits whose
    peers it could not all read) says so with data["proven"] False."""
    return (finding.data or {}).get("proven", True) is not False


def cannot_finish(findings: list[Finding]) -> Finding | None:
    """The finding that says no rank can advance, if any."""
    for finding in findings:
        if (finding.id in CANNOT_FINISH and _proven(finding)) or (finding.id == "job.E004" and _ended(finding)):
            return finding
    return None


def judge(findings: list[Finding], on_hang: str, *, world_known: bool, stall_since_at: float,
          group_timeout_s: float | None, now_at: float, deadline_at: float | None = None,
          grace: float = GRACE_S) -> Decision:
    """The decision for a verdict under ``on_hang`` (auto / exit / report); ``deadline_at``: the one
    set when the episode opened (a look later keeps it); ``grace``: the stalled group's backend's
    (grace_s)."""
    if not findings:
        return Decision(NONE, "the stall cleared before its verdict")
    if on_hang == "report":
        return Decision(WATCH, "on_hang='report': the guard reports and never ends the job")
    if on_hang == "exit":
        return Decision(END, "on_hang='exit'")
    blocker = cannot_finish(findings) if world_known else None
    if blocker is not None:
        return Decision(END, f"no rank can advance ({blocker.id} [{blocker.cause}])")
    why = ("every rank but this one is unseen (no cross-rank view)" if not world_known
           else _WATCHED.get(findings[0].id, "the job may still finish"))
    if group_timeout_s is None:
        return Decision(WATCH, f"{why}; the group's timeout could not be read, so the guard watches until the stall "
                               "clears or torch's own timeout ends the job")
    deadline = deadline_at if deadline_at is not None else stall_since_at + group_timeout_s + grace
    if now_at >= deadline:
        return Decision(END, f"{why}, but the process group's timeout ({group_timeout_s:g} s) has passed since the "
                             "stall began: torch would have ended the job by now", deadline)
    return Decision(WATCH, f"{why}: the job goes on; the guard ends it only if the stall lasts the process group's own "
                           f"timeout ({group_timeout_s:g} s; {deadline - now_at:.0f} s from now), when torch would end "
                           "it too", deadline)


def ended_by_torch(deadline_at: float | None, last_calls: list[Any], now_at: float | None = None,
                   grace: float = GRACE_S) -> bool:
    """Whether a watched stall that just cleared was ended by torch (its timeout, the call failing);
    ``grace``: the one its deadline was set with."""
    if last_calls and getattr(last_calls[-1], "failed", False):
        return True
    now_at = time.time() if now_at is None else now_at
    return deadline_at is not None and now_at >= deadline_at - grace - TORCH_ENDED_S


def arriving(before: list[Finding], now: list[Finding]) -> bool:
    """A stall of a late or silent rank whose new look finds every rank in the collective and data
    moving: the late rank arrived and the collective is completing, not a new verdict."""
    return bool(before and now) and before[0].id in ("job.E002", "job.E004") and now[0].id == "job.W011"


def shown(findings: list[Finding], decision: Decision) -> list[Finding]:
    """The verdict as it is shown: a stall the guard watches is a warning while it lasts (the job goes
    on); one that ends the job stays an error. IDs stay; only the severity says the consequence."""
    if decision.action != WATCH:
        return list(findings)
    return [f.with_(severity=Severity.WARNING) if f.severity > Severity.WARNING else f for f in findings]


def group_timeout_s(pg: Any) -> float | None:
    """The process group's own timeout in seconds, read from its backend's options; None when this
    torch does not say (ProcessGroup._device_types / _get_backend / Options._timeout are probed)."""
    if pg is None:
        return None
    import torch  # torch is imported on first use: it costs seconds, and `import distdoctor` must stay cheap

    devices = list(getattr(pg, "_device_types", None) or ()) or [torch.device("cpu")]
    for device in devices:
        try:
            timeout = pg._get_backend(device).options._timeout
            seconds = float(timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout)
        except Exception:  # a private API: any failure means "this torch does not say"
            continue
        if seconds > 0:
            return seconds
    return None
