"""What a stall's verdict means for the job: end it now, or report it and watch (on_hang)."""

# on_hang="auto" (the default) ends a job only when it cannot finish:
#   - a rank raised, died or was killed (job.E001, E005; E004 when its process is known to have
#     ended), a rank left while the others wait (E003), ranks wait in collectives that cannot
#     match (E006-E008, a dropped send guard.E009), or every rank waits in one collective that
#     does not complete (E009): the job ends right after the report;
#   - a live rank outside any collective (job.E002: a rank-0-only checkpoint, evaluation, I/O, a
#     slow batch) or a rank that does not answer but may still be alive (E004, frozen or on
#     another host), and any verdict seen from one rank alone (no cross-rank view): reported and
#     watched, and ended only when the process group's own timeout would end the job anyway; the
#     guard then ends it a little before torch does, with its diagnosis instead of a generic one.
# on_hang="exit" ends the job at the first verdict (the tests' policy: CI wants the failure now);
# on_hang="report" never ends it.

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distdoctor.core.findings import Finding
from distdoctor.diagnosis.snapshot import EXITED, KILLED

END, WATCH, NONE = "end", "watch", "none"
CANNOT_FINISH = frozenset({"job.E001", "job.E003", "job.E005", "job.E006", "job.E007", "job.E008", "job.E009",
                           "guard.E009"})


@dataclass(frozen=True)
class Decision:
    action: str                      # END, WATCH or NONE (nothing found: the stall cleared meanwhile)
    reason: str                      # in words, for the report
    deadline_at: float | None = None  # epoch seconds: when a watched stall is ended (the group's timeout)


def margin_s(timeout_s: float) -> float:
    """How long before the group's timeout the guard ends a watched stall (it must come first)."""
    return min(60.0, max(3.0, 0.03 * timeout_s))


def _ended(finding: Finding) -> bool:
    """job.E004 whose missing ranks' processes are known to have ended (not merely silent)."""
    missing = set((finding.data or {}).get("missing") or finding.ranks)
    snaps = [s for s in (finding.data or {}).get("snapshots") or () if isinstance(s, dict) and s.get("rank") in missing]
    return bool(snaps) and all(s.get("status") in (KILLED, EXITED) for s in snaps)


def cannot_finish(findings: list[Finding]) -> Finding | None:
    """The finding that says no rank can advance, if any."""
    for finding in findings:
        if finding.id in CANNOT_FINISH or (finding.id == "job.E004" and _ended(finding)):
            return finding
    return None


def judge(findings: list[Finding], on_hang: str, *, world_known: bool, stall_since_at: float,
          group_timeout_s: float | None, now_at: float, deadline_at: float | None = None) -> Decision:
    """The decision for a verdict under ``on_hang`` (auto / exit / report); ``deadline_at``: the one
    set when the episode opened (a look later keeps it)."""
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
           else "a rank that may still arrive is outside the collective")
    if group_timeout_s is None:
        return Decision(WATCH, f"{why}; the group's timeout could not be read, so the guard watches until the stall "
                               "clears or torch's own timeout ends the job")
    deadline = deadline_at if deadline_at is not None else stall_since_at + group_timeout_s - margin_s(group_timeout_s)
    if now_at >= deadline:
        return Decision(END, f"{why}, but the process group's timeout ({group_timeout_s:g} s) ends the job now "
                             "anyway", deadline)
    return Decision(WATCH, f"{why}: the job goes on; the guard ends it only at the process group's own timeout "
                           f"({group_timeout_s:g} s), in {deadline - now_at:.0f} s, if the stall has not cleared",
                    deadline)


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
