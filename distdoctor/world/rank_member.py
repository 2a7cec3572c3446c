"""The other ranks' part of a world run: follow rank 0's decision, post results, wait for its final word."""

from __future__ import annotations

import threading
from typing import Any, Iterable

from distdoctor.core.kinds import RUN_DEADLINE
from distdoctor.core.findings import Finding
from distdoctor.checks.rendezvous import collision_findings
from distdoctor.world.checkin import FINAL
from distdoctor.world.kinds import NO_DECISION
from distdoctor.world.rank_state import MEMBER_WAIT_S, NON_ROOT_GRACE_S, RankOutcome
from distdoctor.world.store_exchange import DECISION, Arrival, CheckIns, World, fit


class MemberFlow:
    """RankRun's flow for ranks other than 0 and for a duplicate claimant (mixed into RankRun)."""

    def _run_member(self) -> RankOutcome:
        world = self.world
        assert world is not None
        self._testing_hang("rendezvous")
        # Rank 0 decides only when its check-in wait ends: wait for it up to this rank's own end,
        # or for rank 0's final word if its deadline ended the run before it decided.
        key, decision = world.fetch_first({"decision": DECISION, "final": FINAL}, self.deadline + MEMBER_WAIT_S)
        if key == "final" and isinstance(decision, dict):
            reason = "skipped: rank 0 ended the run (its deadline passed) before it published a decision"
            self._stage("rendezvous", skip_reason=reason)
            self._stage("collective", skip_reason=reason)
            return self._finish_member(decision)
        if not isinstance(decision, dict):
            reason = "skipped: rank 0 published no decision before this rank's deadline"
            self._stage("rendezvous", skip_reason=reason)
            self._stage("collective", skip_reason=reason)
            finding = NO_DECISION(
                ranks=(world.rank,),
                hosts=self._host(),
                detail="This rank checked in, but rank 0 never published the outcome of the check-in "
                "(rank 0 not started, stuck, or killed)." + (f" Then {world.lost}." if world.lost else ""),
            )
            self.runner.mark_incomplete("rendezvous", self.ctx, (0,), "Rank 0 did not finish the rendezvous stage.")
            return self._finish_member(None, [finding])
        world.decision = decision
        self._apply_stage_deadline(decision)
        skip = decision.get("skip")
        if skip is None and world.rank not in decision.get("accepted", ()):
            skip = f"skipped: rank {world.rank} is not part of rank 0's world of {decision.get('size')}"
        if skip is None and decision.get("size") != world.size:
            skip = f"skipped: WORLD_SIZE here ({world.size}) differs from rank 0's ({decision.get('size')})"
        if self.use_watchdog:  # only the watchdog reads it; an embedded run has none (and exits normally)
            self._watch_final_word(world)
        self._stage("collective", skip_reason=skip)
        self._testing_hang("gather")
        try:
            world.mark_done("collective", self._results_message())
        except Exception as exc:
            world.lost = f"the store went away: {exc}"
            return self._finish_member(None)
        _, final = world.fetch_first({"final": FINAL}, self.deadline + MEMBER_WAIT_S)
        return self._finish_member(final)

    def _watch_final_word(self, world: World) -> None:
        """Note rank 0's final word the moment it appears, from a thread: should this rank's own
        flow hang (in a collective, say), its watchdog then knows that rank 0 reported for it,
        even once rank 0 has ended and its store is gone. The thread's store wait ends by the
        watchdog's own time at the latest; the process ends with os._exit (a thread blocked in a
        store client at interpreter exit can abort the process)."""

        def watch() -> None:
            if isinstance(world.wait_for_final(self.deadline + NON_ROOT_GRACE_S), dict):
                self.final_seen.set()

        threading.Thread(target=watch, name="distdoctor-final-word", daemon=True).start()

    def _results_message(self) -> dict[str, Any]:
        results = [r for r in self.runner.state.results if r.stage == "collective"]
        stuck = next((r.name for r in results if r.status == "timeout"), None)
        findings = [f for r in results for f in r.findings]
        findings += [f for f in self.runner.state.findings if f.id == RUN_DEADLINE.id]
        findings += self._store_malformed()
        return fit(
            {
                "checks": [r.to_dict() for r in results],
                "findings": [f.to_dict() for f in findings],
                "incomplete": self.runner.state.incomplete,
                "stuck_check": stuck,
                "native": self.native_summary(),
            },
            droppable=("findings",),
        )

    def _run_as_duplicate(self) -> RankOutcome:
        """A second process claiming a taken rank: it stays out of the collectives, quietly."""
        world = self.world
        assert world is not None
        reason = f"skipped: another process already claimed rank {world.rank}"
        self._stage("rendezvous", skip_reason=reason)
        self._stage("collective", skip_reason=reason)
        _, final = world.fetch_first({"final": FINAL}, self.deadline + MEMBER_WAIT_S)
        claims = final.get("claims") if isinstance(final, dict) else None
        if claims is not None and f"{world.rank}:{world.claim}" not in claims:
            # Rank 0 finished before this process arrived: nobody else will name the collision.
            return self._finish_alone(self._own_collision())
        return self._finish_member(final)

    def _own_collision(self) -> list[Finding]:
        world = self.world
        assert world is not None and world.claim is not None
        try:
            keys = [(r, c) for r, c in world.roster() if r == world.rank and c <= world.claim]
            payloads, _ = world.read_checkins(keys)
        except Exception:
            payloads = {}
        keys = sorted(payloads)
        checkins = CheckIns(world.size, [Arrival(r, c, 0.0) for r, c in keys], payloads)
        return collision_findings(checkins)

    def _finish_member(self, final: Any, extra: Iterable[Finding] = ()) -> RankOutcome:
        world = self.world
        report = self._own_report(extra)
        if isinstance(final, dict) and isinstance(final.get("exit"), int):
            code = int(final["exit"])
            reported = self._render(report, code) if self.all_ranks else False
        else:
            # Rank 0 never said how it went: this rank reports what it knows itself.
            if not self.runner.state.incomplete:
                why = f" ({world.lost})" if world is not None and world.lost else ""
                self.runner.mark_incomplete("collective", self.ctx, (0,),
                                            f"Rank 0 published no final report before this rank's deadline{why}.")
                report = self._own_report(extra)
            code = report.exit_code(self.config.fail_level)
            reported = self._render(report, code, alone=True)
        if world is not None:
            try:
                world.say_goodbye()
            except Exception:
                pass
            world.close(destroy_groups=self.teardown)
        return RankOutcome(report, code, reported, True)
