"""The runner: stages in order, a deadline per check and per run, isolation, silencing.

Each check runs in a daemon thread joined with its deadline, so a check stuck in a socket, a
DNS lookup or a collective is abandoned (finding core.W003) and the run goes on. A check that
raises becomes finding core.W001. When the run's own deadline passes, the remaining checks are
marked and the report is partial (status "incomplete", exit code 3).

Stages gate each other: a critical finding (the job cannot start) skips the later stages,
and the rendezvous and collective stages are skipped when no cross-rank world is configured.
Orchestrators that must act between stages (the cross-rank world exchanges the local findings
before the rendezvous stage) call :meth:`Runner.run_stage` themselves.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from distdoctor.core.context import CheckContext
from distdoctor.core.muted_output import muted_thread
from distdoctor.core.kinds import CHECK_CRASHED, CHECK_TIMED_OUT, RUN_DEADLINE
from distdoctor.core.findings import Finding, Severity
from distdoctor.core.registry import Check, Registry, SkipCheck
from distdoctor.core.stages import STAGES
import os
import traceback
from fnmatch import fnmatchcase
from distdoctor.core.check_child import run_in_child
from distdoctor.core.progress import running_in_child
from distdoctor.core.report import format_ranks

PASS, FAIL, SKIP, ERROR, TIMEOUT = "pass", "fail", "skip", "error", "timeout"


@dataclass
class CheckResult:
    name: str
    stage: str
    status: str
    duration_s: float = 0.0
    reason: str = ""
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "stage": self.stage,
            "status": self.status,
            "duration_s": round(self.duration_s, 4),
        }
        if self.reason:
            out["reason"] = self.reason
        return out


@dataclass
class RunState:
    """What a run has produced so far; the runner appends, the report is built from it."""

    results: list[CheckResult] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    incomplete: bool = False
    stuck_stage: str | None = None

    def blocking_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity >= Severity.CRITICAL]


def runs_in_child(check: Check) -> bool:
    """Local-stage checks that are not distdoctor's own run in a forked child (a thread cannot
    stop a check that holds the interpreter lock or ends the process). Cross-rank site checks
    stay in this process: they use the live process groups, which a child cannot share."""

    return check.stage == "local" and check.source != "builtin" and not check.source.startswith("builtin ") \
        and hasattr(os, "fork")


def _consume(value: Any) -> list[Finding]:
    if value is None:
        return []
    if isinstance(value, Finding):
        return [value]
    items = list(value)
    for item in items:
        if not isinstance(item, Finding):
            raise TypeError(f"a check must return findings, got {type(item).__name__}: {item!r}")
    return items


def _now_doing(ctx: CheckContext) -> str:
    """What a cross-rank world says this rank was doing ('' when it cannot say at once): a check
    cut off by its deadline names the step and the ranks that were slow."""
    describe = getattr(ctx.world, "now_doing", None)
    if not callable(describe):
        return ""
    try:
        text = describe()
    except Exception:
        return ""
    return text if isinstance(text, str) else ""


class Runner:
    def __init__(
        self,
        registry: Registry,
        *,
        timeout: float,
        check_timeout: float,
        silence: Iterable[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.check_timeout = check_timeout
        self.silence = tuple(silence)
        self.clock = clock
        self.started = clock()
        self.deadline = self.started + timeout
        self.state = RunState()
        # Threads of checks that overran; kept so tests (and the watchdog) can see them.
        self.abandoned: list[threading.Thread] = []

    def remaining(self) -> float:
        return self.deadline - self.clock()

    # -- one check ----------------------------------------------------------------------
    def run_check(self, check: Check, ctx: CheckContext) -> CheckResult:
        limit = min(check.timeout or self.check_timeout, max(self.remaining(), 0.0))
        if limit <= 0:
            return CheckResult(check.name, check.stage, TIMEOUT, reason="the run's deadline had passed")
        box: dict[str, Any] = {}

        quiet = muted_thread if check.source != "builtin" and not check.source.startswith("builtin ") else nullcontext

        def target() -> None:
            try:
                with quiet():  # a plugin's print() must not land inside the report
                    box["findings"] = _consume(check.func(ctx))
            except SkipCheck as skip:
                box["skip"] = skip.reason
            except BaseException as exc:  # isolation: a broken check never ends the run
                box["error"] = exc

        start = self.clock()
        if runs_in_child(check):

            with running_in_child(check.name):  # named in the status line and on a signal
                alive = run_in_child(check, ctx, limit, box, _consume)
        else:
            thread = threading.Thread(target=target, name=f"distdoctor-check-{check.name}", daemon=True)
            thread.start()
            thread.join(limit)
            alive = thread.is_alive()
            if alive:
                self.abandoned.append(thread)
        duration = self.clock() - start
        if alive:
            run_deadline_hit = self.remaining() <= 0
            reason = "the run's deadline passed" if run_deadline_hit else f"still running after {limit:g}s"
            doing = _now_doing(ctx)
            finding = CHECK_TIMED_OUT(
                f"Check {check.name} did not finish within {limit:g}s",
                detail=f"Stage {check.stage}: {reason}; what it verifies is unknown."
                + (f" When it was cut off, this rank was {doing}." if doing else ""),
                check=check.name,
                data={"timeout_s": limit, "stage": check.stage},
            )
            return CheckResult(check.name, check.stage, TIMEOUT, duration, reason, [finding])
        if "skip" in box:
            return CheckResult(check.name, check.stage, SKIP, duration, box["skip"])
        if "error" in box:
            exc = box["error"]

            tb = box.get("traceback") or "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-4))
            finding = CHECK_CRASHED(
                f"Check {check.name} raised {type(exc).__name__}: {exc}",
                detail=tb.strip(),
                check=check.name,
                data={"exception": type(exc).__name__, "message": str(exc)},
            )
            return CheckResult(check.name, check.stage, ERROR, duration, f"{type(exc).__name__}: {exc}", [finding])
        findings = [self._annotate(f, check, ctx) for f in box.get("findings", [])]
        failed = any(f.severity >= Severity.WARNING for f in findings)
        return CheckResult(check.name, check.stage, FAIL if failed else PASS, duration, "", findings)

    @staticmethod
    def _annotate(finding: Finding, check: Check, ctx: CheckContext) -> Finding:
        """A local finding names this rank and host unless the check named others."""
        changes: dict[str, Any] = {}
        if not finding.check:
            changes["check"] = check.name
        if not finding.ranks and not finding.hosts:
            if ctx.rank is not None and ctx.launch.is_distributed:
                changes["ranks"] = (ctx.rank,)
            host = ctx.memo("hostname", ctx.probes.hostname)
            if isinstance(host, str):
                changes["hosts"] = (host,)
        return finding.with_(**changes) if changes else finding

    # -- stages -------------------------------------------------------------------------
    def skip_reason(self, stage: str, ctx: CheckContext) -> str | None:
        blocking = [f for f in self.state.blocking_findings() if not self.is_silenced(f)]
        if blocking:
            ids = ", ".join(sorted({f.id for f in blocking}))
            return f"skipped: critical findings in an earlier stage ({ids})"
        if stage != "local" and ctx.world is None:
            return "skipped: no cross-rank world is configured (no launcher, no --nproc)"
        return None

    def run_stage(self, stage: str, checks: Iterable[Check], ctx: CheckContext, skip_reason: str | None = None) -> list[CheckResult]:
        reason = skip_reason or self.skip_reason(stage, ctx)
        results: list[CheckResult] = []
        for check in checks:
            if check.stage != stage:
                continue
            if self.state.incomplete:
                result = CheckResult(check.name, stage, SKIP, reason="not reached: the run's deadline had passed")
            elif reason:
                result = CheckResult(check.name, stage, SKIP, reason=reason)
            else:
                result = self.run_check(check, ctx)
                if result.status == TIMEOUT and self.remaining() <= 0:
                    self.mark_incomplete(stage, ctx)
            results.append(result)
            self.state.results.append(result)
            self.state.findings.extend(result.findings)
            ctx.earlier_findings.extend(result.findings)
        return results

    def mark_incomplete(self, stage: str, ctx: CheckContext, ranks: Iterable[int] = (), detail: str = "") -> None:
        if self.state.incomplete:
            return
        self.state.incomplete = True
        self.state.stuck_stage = stage
        ranks = tuple(ranks)
        who = ""
        if ranks:

            who = f" on rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)}"
        self.state.findings.append(
            RUN_DEADLINE(
                f"The {stage} stage did not finish before the run's deadline{who}",
                detail=detail or f"The diagnosis stopped in the {stage} stage; the report is partial.",
                ranks=ranks,
                check="runner",
                data={"stage": stage},
            )
        )

    def run(self, ctx: CheckContext, checks: Iterable[Check], stages: Iterable[str] = STAGES) -> RunState:
        checks = list(checks)
        for stage in STAGES:
            if stage in set(stages):
                self.run_stage(stage, checks, ctx)
        return self.state

    def is_silenced(self, finding: Finding) -> bool:

        return any(fnmatchcase(finding.id, pattern) for pattern in self.silence)

    def elapsed(self) -> float:
        return self.clock() - self.started
