"""Rank 0's part of a world run: the check-ins, the decision, the gathering, one consolidated report."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from distdoctor.core.kinds import RUN_DEADLINE
from distdoctor.core.findings import Finding
from distdoctor.core.redact import secret_values
from distdoctor.core.report import Report, WorldSummary, build_report, format_ranks
from distdoctor.checks.rendezvous import collision_findings
from distdoctor.world.decision import group_blockers, nccl_decision
from distdoctor.world.rank_payload import findings_from, merge_check_entries
from distdoctor.world.rank_state import GOODBYE_S, ROOT_MARGIN_S, SETTLE_S, RankOutcome, ranks_text, working_reserve
from distdoctor.world.store_exchange import Arrival, CheckIns


class RootFlow:
    """RankRun's rank-0 flow (mixed into RankRun; uses its state and helpers)."""

    def _run_root(self) -> RankOutcome:
        world = self.world
        assert world is not None
        self.progress.expected = list(range(world.size))
        self._testing_hang("rendezvous")
        # Stop waiting early enough that the rendezvous checks still run before the deadline.
        checkin_deadline = self.work_deadline - working_reserve(self.config.timeout)
        checkins = world.wait_for_checkins(checkin_deadline, settle_s=SETTLE_S)
        world.checkins = checkins
        self.progress.checkins = checkins
        self._stage("rendezvous")
        accepted = sorted(r for r in checkins.accepted if 0 <= r < world.size)
        skip = None
        if "collective" not in self.config.stages:
            skip = "skipped: the collective stage was not selected"
        else:
            skip = self.runner.skip_reason("collective", self.ctx)
            if skip is None and checkins.missing:
                skip = f"skipped: ranks {format_ranks(checkins.missing)} never checked in"
        blocked = {r: p["blocked"] for r, p in checkins.accepted.items()
                   if r != 0 and 0 <= r < world.size and p.get("blocked")}
        if skip is None and blocked:
            skip = f"skipped: {ranks_text(sorted(blocked))} cannot join ({next(iter(blocked.values()))})"
        blockers = group_blockers(checkins)
        if skip is None and blockers["gloo"]:
            skip = ("skipped: the gloo process group cannot form, as these ranks' local findings show: "
                    + "; ".join(blockers["gloo"]))
        deadline = self._stage_deadline(checkins, world.size)
        if skip is None and "collective" in self.config.stages:
            skip = self._no_time_for_collectives(deadline)
        decision = {"skip": skip, "accepted": accepted, "size": world.size,
                    **nccl_decision(checkins, self.config, blockers["nccl"]),
                    "check_timeout_s": deadline["check_timeout_s"], "deadline_note": deadline["deadline_note"]}
        world.decide(decision)
        self._apply_stage_deadline(decision)
        self.progress.expected = accepted
        self._stage("collective", skip_reason=skip)
        if self.out_of_time:
            self.runner.state.incomplete = True
        self._testing_hang("gather")
        others = [r for r in accepted if r != 0]
        self._enter_stage("collective")
        done = world.wait_done("collective", others, self.work_deadline) if others else set()
        self.progress.remote = world.results("collective", done)
        not_done = sorted(set(others) - done)
        cut_off = sorted(r for r, res in self.progress.remote.items() if isinstance(res, dict) and res.get("incomplete"))
        if self.runner.state.incomplete:
            cut_off = sorted({0, *cut_off})
        if not_done or cut_off:
            self._mark_stuck(not_done, cut_off)
        report = self._consolidated(extra=self._late_duplicates(checkins))
        code = report.exit_code(self.config.fail_level)
        reported = self._render(report, code)
        reported_claims = sorted(f"{r}:{c}" for r, c in checkins.payloads)
        world.put("final", {"exit": code, "claims": reported_claims})
        self._release(expect_goodbyes=len(checkins.arrivals) - 1)
        return RankOutcome(report, code, reported, True)

    def _mark_stuck(self, not_done: list[int], cut_off: list[int]) -> None:
        stuck = sorted(set(not_done) | set(cut_off))
        stuck_checks = sorted({
            str(self.progress.remote.get(r, {}).get("stuck_check"))
            for r in cut_off if self.progress.remote.get(r, {}).get("stuck_check")
        })
        detail = []
        if not_done:
            detail.append(f"{ranks_text(not_done).capitalize()} never reported the end of the collective stage.")
        if cut_off:
            detail.append(f"{ranks_text(cut_off).capitalize()} {'was' if len(cut_off) == 1 else 'were'} cut off by "
                          "their deadline inside it"
                          + (f" (in {', '.join(stuck_checks)})." if stuck_checks else "."))
        self.runner.state.incomplete = False  # re-marked below with the ranks named
        self.runner.state.findings = [f for f in self.runner.state.findings if f.id != RUN_DEADLINE.id]
        self.runner.mark_incomplete("collective", self.ctx, stuck, " ".join(detail))

    def _late_duplicates(self, checkins: CheckIns) -> list[Finding]:
        """Processes that claimed a rank after the check-in phase: named too."""
        world = self.world
        assert world is not None
        try:
            late, _ = world.late_claims(list(checkins.payloads) + list(checkins.unreadable))
        except Exception:
            return []
        if not late:
            return []
        for rank, claim in late:
            checkins.arrivals.append(Arrival(rank, claim, checkins.waited_s))
        checkins.payloads.update(late)
        return collision_findings(checkins, only_ranks={r for r, _ in late})

    def _consolidated(self, extra: Iterable[Finding] = ()) -> Report:
        checkins = self.progress.checkins
        findings: list[Finding] = [*self.registry.load_problems, *self.runner.state.findings, *extra,
                                   *self._store_malformed()]
        examined = checkins.reported if checkins else [0]
        entries: list[tuple[Sequence[int], Mapping[str, Any]]] = []
        for result in self.runner.state.results:
            ranks = examined if result.stage == "rendezvous" else [0]
            entries.append((ranks, result.to_dict()))
        if checkins:
            for rank, payload in sorted(checkins.accepted.items()):
                if rank == 0 or not 0 <= rank < checkins.expected:
                    continue
                findings += findings_from(payload.get("findings", ()))
                entries += [([rank], c) for c in payload.get("checks", ()) if isinstance(c, Mapping)]
        # Rank 0 names the ranks cut off by their deadline in its own word on the cut-off
        # (_mark_stuck); theirs would say it a second time.
        named = {r for f in findings if f.id == RUN_DEADLINE.id for r in f.ranks}
        native = {0: self.native_summary()}
        if checkins:
            native.update({r: p.get("native") for r, p in checkins.accepted.items() if r != 0 and 0 <= r < checkins.expected})
        native.update({r: res.get("native") for r, res in self.progress.remote.items()
                       if isinstance(res, Mapping) and res.get("native") is not None})
        findings += self._native_finding(native)
        for rank, result in sorted(self.progress.remote.items()):
            if not isinstance(result, Mapping):
                continue
            findings += [f for f in findings_from(result.get("findings", ()))
                         if f.id != RUN_DEADLINE.id or not set(f.ranks or (rank,)) <= named]
            entries += [([rank], c) for c in result.get("checks", ()) if isinstance(c, Mapping)]
        world = self.world
        summary = WorldSummary(
            size=world.size if world else self.ctx.world_size,
            launcher=self.ctx.launch.launcher,
            ranks_reported=tuple(checkins.reported) if checkins else (self.rank,),
            ranks_missing=tuple(checkins.missing) if checkins else (),
        )
        return build_report(
            findings,
            merge_check_entries(entries),
            world=summary,
            duration_s=self.clock() - self.started,
            incomplete=self.runner.state.incomplete,
            silence=self.config.silence,
            secrets=secret_values(self.ctx.env),
        )

    def _release(self, expect_goodbyes: int) -> None:
        world = self.world
        assert world is not None
        if world.hosted and expect_goodbyes > 0:
            # The others read "final" from the store this process hosts: let them, briefly.
            world.await_goodbyes(expect_goodbyes, min(self.clock() + GOODBYE_S, self.deadline - ROOT_MARGIN_S))
        world.close(destroy_groups=self.teardown)
