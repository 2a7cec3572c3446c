"""Cross-rank diagnosis for one rank: local stage, check-in, rendezvous and collective stages, one report.

Every rank runs :func:`run_rank`. The flow, and why each step is where it is:

1. local stage on every rank (no communication).
2. every rank connects to the store (distdoctor.world.store_exchange) and checks in: its local findings and
   check results, and a snapshot (host, pid, versions, NCCL_*/TORCH_*/GLOO_* settings, GPUs,
   the device it will use). A second process claiming a rank learns so from its claim number
   and stays out of the collectives (it would corrupt them), quietly.
3. rank 0 waits for the check-ins (until the run's working deadline), runs the rendezvous stage
   over them and publishes one decision: run the collective stage, or skip it and why. Every
   rank follows that decision, so nobody waits for a collective the others will not join.
4. collective stage on every accepted rank; each rank posts its results and marks itself done.
5. rank 0 gathers, names the ranks that did not finish, renders ONE report, then publishes the
   exit code; the other ranks exit with that code after rank 0 printed (under torchrun an early
   non-zero exit of a worker would make the agent kill rank 0 mid-report).

A watchdog (distdoctor.world.watchdog) holds the overall deadline: past it, rank 0 renders a partial
report naming the stage and the ranks that did not finish, and every rank exits with code 3.
Whenever a rank cannot hand its results to rank 0 (no store, no rank 0), it prints its own
report: somebody must.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

from distdoctor.core.config import Config
from distdoctor.machine.host import build_context
from distdoctor.machine.launchers import MP_SPAWN
from distdoctor.core.interrupt import set_interrupt_handler
from distdoctor.core.progress import PROGRESS
from distdoctor.core.engine import load_registry, report_from_runner
from distdoctor.core.findings import Finding, Severity
from distdoctor.core.kinds import TORCH_LACKS
from distdoctor.machine.probes import Probes
from distdoctor.core.registry import Registry
from distdoctor.core.stages import CROSS_RANK_STAGES
from distdoctor.core.report import Report
from distdoctor.core.runner import Runner
from distdoctor.world.checkin import malformed_finding
from distdoctor.world.kinds import NATIVE_OUTPUT, STORE_ENTRY_MALFORMED, STORE_UNREACHABLE
from distdoctor.world.native_output import NativeOutput, merged_lines
from distdoctor.world.stage_deadline import collective_check_s, stage_need_s
from distdoctor.world.watchdog import MIN_WORLD_S, Watchdog, flush_std_streams, too_little_time
from distdoctor.world.rank_cutoff import TORCH_IMPORT, CutoffFlow
from distdoctor.world.rank_member import MemberFlow
from distdoctor.world.rank_payload import checkin_payload
from distdoctor.world.rank_root import RootFlow
from distdoctor.world.rank_state import (
    ranks_text,
    EMIT_WAIT_S,
    MEMBER_EXPIRE_GRACE_S,
    NON_ROOT_GRACE_S,
    ROOT_EXPIRE_GRACE_S,
    ROOT_MARGIN_S,
    RankOutcome,
    RunProgress,
    working_reserve,
)
from distdoctor.world.store_findings import StoreFindings
from distdoctor.world.store_exchange import World, WorldError
from distdoctor.world.store_open import WorldSpec


class RankRun(RootFlow, MemberFlow, CutoffFlow, StoreFindings):
    """One rank's run of every selected stage; see the module's docstring for the flow."""

    def __init__(
        self,
        config: Config,
        *,
        env: Mapping[str, str] | None = None,
        argv: Sequence[str] | None = None,
        probes: Probes | None = None,
        registry: Registry | None = None,
        all_ranks: bool = False,
        emit: Callable[[Report], None] | None = None,
        started: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        exit: Callable[[int], None] = os._exit,
        watchdog: bool = True,
        teardown: bool = False,
        note: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.started = clock() if started is None else started
        self.deadline = self.started + config.timeout
        self.work_deadline = self.deadline - working_reserve(config.timeout)
        self.registry = load_registry(config, registry)
        self.ctx = build_context(config, env=env, argv=argv, probes=probes)
        self.runner = Runner(
            self.registry,
            timeout=max(self.work_deadline - clock(), 0.01),
            check_timeout=config.check_timeout,
            silence=config.silence,
            clock=clock,
        )
        self.runner.started = self.started  # durations count from the process's start
        self.checks = self.registry.select(config.stages, config.tags)
        self.all_ranks = all_ranks
        self.emit = emit
        self.exit = exit
        self.use_watchdog = watchdog
        # Embedded runs (diagnose() from the API or the pytest plugin) leave no process group
        # behind; the CLI ends the process right after the report instead.
        self.teardown = teardown
        # Where a rank other than 0 writes its one line instead of a report (see _render).
        self.note = note
        self.world: World | None = None
        self._watchdog: Watchdog | None = None
        self.progress = RunProgress()
        self.rank = self.ctx.rank if self.ctx.rank is not None else 0
        # One report per process: the main flow and the watchdog race for it near the deadline.
        self._report_lock = threading.Lock()
        self._reported_code: int | None = None
        # Every failed connect to the store, as it happens: a run cut off while it still waited
        # for the store says what the connects met (world.store_open.wait_for_listener).
        self.store_attempts: list = []
        self._spec: Any = None
        # Set once the report is written: a flow that lost the race waits for it before the
        # process may exit, or the exit would cut the winner's report off (or lose it whole).
        self._emitted = threading.Event()
        self._described = False
        # Set once this rank (not rank 0) saw rank 0's final word (see MemberFlow._watch_final_word).
        self.final_seen = threading.Event()
        # What torch's C++ layer writes on this rank, held off the terminal (a rank of the CLI only).
        self.native: NativeOutput | None = None
        # Why the collective checks have the deadline they have (rank 0's decision says).
        self.deadline_note = ""
        self.out_of_time = False
        self.stage_started: dict[str, float] = {}

    def _enter_stage(self, stage: str) -> None:
        self.stage_started.setdefault(stage, self.clock())  # a cut-off report says where the time went
        self.progress.stage = stage
        PROGRESS.set_stage(stage)

    def _import_torch(self) -> None:
        """Every check of a rank needs torch; importing it before the local stage keeps that time
        out of the first check's own deadline. The import is marked: on a busy node it outlasted a
        23 s deadline on both ranks of a world, and a run cut off there must name it, not the local
        stage's checks (none had begun)."""
        self.stage_started.setdefault(TORCH_IMPORT, self.clock())
        PROGRESS.set_stage("start-up (importing torch)")
        import torch.distributed  # noqa: F401

    def _stage(self, stage: str, skip_reason: str | None = None) -> None:
        self._enter_stage(stage)
        if stage in self.config.stages:
            self.runner.run_stage(stage, self.checks, self.ctx, skip_reason=skip_reason)

    def _own_report(self, extra: Iterable[Finding] = ()) -> Report:
        own = self._native_finding({self.rank: self.native_summary()})
        return report_from_runner(self.runner, self.ctx, extra=[*extra, *self._store_malformed(), *own], ranks=[self.rank])

    def _store_malformed(self) -> list[Finding]:
        """The malformed store entries this process met, as one finding (none when there were none)."""
        if self.world is None:
            return []
        finding = malformed_finding(self.world.protocol, self.rank, STORE_ENTRY_MALFORMED, check="rendezvous.store")
        return [finding] if finding is not None else []

    def _render(self, report: Report, code: int | None = None, alone: bool = False) -> bool:
        """Emit the report unless this process already emitted one (the first one wins).

        ``alone``: this rank could not hand its results to rank 0, so its report is its own.
        """
        with self._report_lock:
            lost = self._reported_code is not None
            if not lost:
                self._reported_code = report.exit_code(self.config.fail_level) if code is None else code
        if lost:
            self._emitted.wait(EMIT_WAIT_S)  # outside the lock: the winner is writing
            return False
        try:
            if self._defers_report(alone):
                # One report per world, rank 0's: this rank says in one line why it has none of its own.
                if self.note is not None:
                    self.note(pointer_line(self.rank, self.ctx.world_size, self._host_text(), report))
                    flush_std_streams()
                return False
            if self.emit is None:
                return False
            self.emit(report)
            flush_std_streams()
            return True
        finally:
            self._emitted.set()

    def _defers_report(self, alone: bool = False) -> bool:
        """Whether another process prints the report this rank's results belong to."""
        if self.all_ranks or self.ctx.rank is None:
            return False
        if self.rank != 0:
            # Rank 0 never got this rank's results: nobody else can report them. In the self-test
            # world the supervisor speaks when rank 0 cannot (one report per command).
            return not alone or self.ctx.launch.launcher == MP_SPAWN
        # torchrun inside a multi-task srun/mpirun step (launch.E004): each task's torchrun forms
        # a world of its own; the world of the scheduler's task 0 prints the one report.
        scheduler_rank = self.ctx.launch.scheduler_rank
        return self.ctx.launch.launcher == "torchrun" and scheduler_rank is not None and bool(scheduler_rank.value)

    def _finish_alone(self, extra: Iterable[Finding] = ()) -> RankOutcome:
        """This rank could not hand its results to rank 0: it reports for itself."""
        report = self._own_report(extra)
        code = report.exit_code(self.config.fail_level)
        return RankOutcome(report, code, self._render(report, code, alone=True), self.world is not None,
                           self._described)

    def run(self) -> RankOutcome:
        spec = WorldSpec.from_launch(self.ctx.launch, self.ctx.env)
        # Every rank starts with rank 0's timing: until it reaches the store, a rank reports for
        # itself when its deadline comes (nobody else has its results), with the time that takes.
        # A rank other than 0 that reaches the store defers to rank 0 (see _defer_to_rank_0).
        watchdog = self._watchdog = Watchdog(
            self.deadline - ROOT_MARGIN_S,
            self._on_deadline,
            clock=self.clock,
            exit=self.exit,
            grace_s=ROOT_EXPIRE_GRACE_S,
        )
        if self.use_watchdog:
            watchdog.start()
        previous_handler = set_interrupt_handler(self._on_interrupt) if self.use_watchdog else None
        try:
            self._described = spec is not None
            if spec is not None:
                if self.use_watchdog and self.ctx.env.get("DISTDOCTOR_NATIVE_STDERR") != "1":
                    # A rank of the CLI (never a user's process): torch's C++ lines go to the report.
                    self.native = NativeOutput.capture()
                self._import_torch()
            self._testing_hang("local")
            self._stage("local")
            if spec is None:
                # No usable world (the local stage says why): the cross-rank stages cannot run.
                reason = "skipped: the environment does not describe a usable world (see the launch findings)"
                for stage in CROSS_RANK_STAGES:
                    self._stage(stage, skip_reason=reason)
                return self._finish_alone()
            # A rank with critical local findings still checks in (saying so), so that rank 0
            # reports for the whole world, once, and skips the collectives for every rank.
            return self._run_in_world(spec)
        finally:
            watchdog.cancel()
            if self.use_watchdog:
                set_interrupt_handler(previous_handler)

    def _run_in_world(self, spec: WorldSpec) -> RankOutcome:
        self._enter_stage("rendezvous")
        left = self.work_deadline - self.clock()
        if left < MIN_WORLD_S:
            return self._out_of_time(left)
        try:
            self._spec = spec
            self.world = World.open(spec, self.work_deadline, self.clock, self.ctx.probes, self.store_attempts)
            if spec.rank != 0:
                self._defer_to_rank_0()
        except WorldError as exc:
            if exc.reason == "no_time":
                return self._out_of_time(self.work_deadline - self.clock())
            hosting = spec.store_host == "rank0" and spec.rank == 0
            reason = ("skipped: rank 0 could not host the rendezvous store" if hosting
                      else "skipped: the rendezvous store could not be reached")
            finding = self._store_finding(spec, exc)  # still in the rendezvous stage, should the deadline pass
            for stage in CROSS_RANK_STAGES:
                self._stage(stage, skip_reason=reason)
            return self._finish_alone([finding])
        world = self.world
        self.ctx.world = world
        try:
            world.check_in({**checkin_payload(self.ctx, self.runner), "blocked": self._blocked(),
                            "native": self.native_summary(), "startup_s": round(self.clock() - self.started, 3)},
                           self.work_deadline)
            world.open_clients_soon(self.deadline)
        except (AttributeError, TypeError, NotImplementedError) as exc:
            # An interface this torch lacks (world.store_api makes up for those it knows): not the
            # network, and nothing about the user's set-up.
            reason = "skipped: this torch lacks a store interface the check-in uses"
            for stage in CROSS_RANK_STAGES:
                self._stage(stage, skip_reason=reason)
            return self._finish_alone([TORCH_LACKS(
                f"Rank {spec.rank}: the check-in through the rendezvous store could not run on this torch",
                detail=f"{type(exc).__name__}: {str(exc).strip()[:300]}", ranks=(spec.rank,), hosts=self._host())])
        except Exception as exc:  # the store dropped this connection (its host ended, or refused us)
            reason = "skipped: the rendezvous store stopped answering during the check-in"
            for stage in CROSS_RANK_STAGES:
                self._stage(stage, skip_reason=reason)
            return self._finish_alone([STORE_UNREACHABLE(
                f"Rank {spec.rank}: the store at {spec.master_addr}:{spec.master_port} stopped answering "
                "during the check-in", detail=str(exc).strip().splitlines()[0][:300] if str(exc).strip() else
                type(exc).__name__, ranks=(spec.rank,), hosts=self._host())])
        if world.is_duplicate:
            return self._run_as_duplicate()
        if world.rank == 0:
            return self._run_root()
        return self._run_member()

    def _defer_to_rank_0(self) -> None:
        """A rank other than 0 in the world: its watchdog fires after rank 0's, so that rank 0
        (which knows the most) reports first and this rank can tell whether it did."""
        self._watchdog.deadline = self.deadline + NON_ROOT_GRACE_S
        self._watchdog.grace_s = MEMBER_EXPIRE_GRACE_S

    def _out_of_time(self, left: float) -> RankOutcome:
        """Too little time is left for the cross-rank stages: skip them with that reason.

        Not a finding about the network. Every rank reports for itself: none reached rank 0.
        """
        reason, finding = too_little_time("rendezvous", left, MIN_WORLD_S, self.config.timeout)
        for stage in CROSS_RANK_STAGES:
            self._stage(stage, skip_reason=reason)
        self.runner.state.incomplete = True
        return self._finish_alone([finding])

    def native_summary(self) -> dict[str, Any] | None:
        return self.native.summary() if self.native is not None else None

    def _native_finding(self, per_rank: Mapping[int, Any]) -> list[Finding]:
        """coll.I009 when torch's C++ layer wrote anything on these ranks (rank -> its summary)."""
        total, ranks, lines = merged_lines({r: s for r, s in per_rank.items() if isinstance(s, Mapping)})
        if not total:
            return []
        return [NATIVE_OUTPUT(
            f"torch's C++ layer wrote {total} line{'s' if total != 1 else ''} on {ranks_text(ranks)} "
            "(kept off the terminal)",
            detail="\n".join(["the most frequent (lines that differ only in numbers counted as one):", *lines]),
            ranks=ranks, check="collective.native_output",
            data={"lines": total, "ranks": {str(r): per_rank[r] for r in ranks}})]

    def _apply_stage_deadline(self, decision: Mapping[str, Any]) -> None:
        """The collective checks' deadline rank 0 published (the same on every rank), when longer."""
        value = decision.get("check_timeout_s")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > self.config.check_timeout:
            self.runner.check_timeout = float(value)
            self.ctx.config = dataclasses.replace(self.ctx.config, check_timeout=float(value))
        note = decision.get("deadline_note")
        self.deadline_note = note if isinstance(note, str) else ""
        if self.world is not None:
            self.world.deadline_note = self.deadline_note

    def _stage_deadline(self, checkins: Any, size: int) -> dict[str, Any]:
        """Rank 0: the collective checks' deadline from the check-ins' spread and the world's size."""
        from distdoctor.world.stage_deadline import arrival_spread, why  # rank 0 only

        spread = arrival_spread(checkins.arrivals)
        check_s = collective_check_s(self.config.check_timeout, spread, size)
        startups = sorted(p["startup_s"] for p in checkins.accepted.values()
                          if isinstance(p.get("startup_s"), (int, float)) and not isinstance(p.get("startup_s"), bool))
        return {"check_timeout_s": check_s, "deadline_note": why(check_s, self.config.check_timeout, spread, size),
                "need_s": round(stage_need_s(spread, size), 1), "spread_s": round(spread, 1),
                "startup_s": [startups[0], startups[-1]] if startups else None}

    def _no_time_for_collectives(self, deadline: Mapping[str, Any]) -> str | None:
        """Rank 0: the skip reason when the world's start-up left too little of the run's deadline
        for the collective stage at this world's scale (named, instead of a stage cut off midway)."""
        left = self.work_deadline - self.clock()
        need = max(float(deadline["need_s"]), MIN_WORLD_S)
        if left >= need:
            return None
        started = self.clock() - self.started
        each = deadline.get("startup_s")
        ranks = f"; each rank took {each[0]:.1f}-{each[1]:.1f}s from its start to its check-in" if each else ""
        why = (f"the world's start-up had taken {started:.1f}s (its ranks checked in over {deadline['spread_s']:g}s"
               f"{ranks}), and forming the group of {self.ctx.world_size or '?'} ranks here needs about {need:g}s")
        reason, finding = too_little_time("collective", left, need, self.config.timeout, why=why)
        self.runner.state.findings.append(finding)
        self.out_of_time = True  # the report is partial: marked once the stage is skipped
        return reason

    def _blocked(self) -> str | None:
        """Why this rank cannot join the world at all: a critical local finding (not silenced)."""
        blocking = [f for f in self.runner.state.blocking_findings() if not self.runner.is_silenced(f)]
        if not blocking:
            return None
        return f"skipped: critical findings in an earlier stage ({', '.join(sorted({f.id for f in blocking}))})"


def pointer_line(rank: int, size: int | None, host: str, report: Report) -> str:
    """The one line a rank other than 0 prints: what stopped it, and where the report is."""
    of = f" of {size}" if size is not None else ""
    worst = max(report.findings, key=lambda f: f.severity, default=None)
    if worst is None or worst.severity < Severity.WARNING:
        why = "its run ended without a word from rank 0" if report.incomplete else "finished"
    else:
        why = f"{worst.id}: {worst.title}"
    return (f"distdoctor: rank {rank}{of} on {host}: {why}. Only rank 0 prints a report "
            "(--all-ranks: every rank).")


def run_rank(config: Config, **kwargs: Any) -> RankOutcome:
    """Run every selected stage as one rank of the world the environment describes."""
    return RankRun(config, **kwargs).run()
