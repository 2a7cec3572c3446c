"""A run cut off by its deadline or a signal: the partial report and the last word to the other ranks."""

from __future__ import annotations

import dataclasses
import os
import time

from distdoctor.core.interrupt import exit_code_for, signal_name
from distdoctor.core.kinds import RUN_DEADLINE, RUN_INTERRUPTED
from distdoctor.core.findings import Finding
from distdoctor.machine.probes import call_with_deadline
from distdoctor.core.stages import CROSS_RANK_STAGES
from distdoctor.core.rank_groups import ranks_label
from distdoctor.core.report import EXIT_INCOMPLETE, Report
from distdoctor.world.watchdog import running_checks
from distdoctor.world.checkin import FINAL
from distdoctor.world.rank_state import EMIT_WAIT_S, GOODBYE_ON_EXPIRE_S, INTERRUPT_FINAL_WAIT_S, STORE_READ_S
from distdoctor.world.store_exchange import World
from distdoctor.world.store_open import verdict_so_far

# The mark a rank sets when it starts importing torch.distributed, before its local stage: a run
# cut off there says so, instead of "the local stage did not finish" with no check ever started.
TORCH_IMPORT = "torch import"
_PHASES = {TORCH_IMPORT: "importing torch.distributed", "local": "the local stage",
           "rendezvous": "the rendezvous (every rank's check-in)", "collective": "the collective stage"}


class CutoffFlow:
    """RankRun's watchdog and signal side (mixed into RankRun; runs on their threads)."""

    def _on_deadline(self) -> int | None:
        """Watchdog thread: the main flow is stuck. Rank 0 renders what it knows; others stay quiet.

        Returns the exit code when the main flow already reported (it was finishing just as the
        watchdog fired): the process then ends with that report's code, not with 3.
        """
        return self._last_word(EXIT_INCOMPLETE)

    def _on_interrupt(self, signum: int) -> None:
        """Signal thread (SIGINT/SIGTERM): rank 0 renders the partial report naming the stage; the
        process then exits with 128 + the signal's number."""
        self._last_word(exit_code_for(signum), interrupted=signal_name(signum))

    def _writing_report(self) -> None:
        """The report is built and printed from here on: the watchdog's hard exit waits for it a
        little longer on a loaded machine (watchdog.WRITE_GRACE_S) instead of cutting it off."""
        if self._watchdog is not None:
            self._watchdog.writing()

    def _last_word(self, code: int, interrupted: str | None = None) -> int | None:
        with self._report_lock:
            reported = self._reported_code
        if reported is not None:
            # The main flow claimed the report just before the deadline: let it finish writing
            # (bounded) before the process ends, or a rank alone would exit with nothing printed.
            self._emitted.wait(EMIT_WAIT_S)
            return reported
        self._writing_report()  # all that follows is bounded: each store read has its own deadline
        is_root = self.world is not None and self.world.is_root and self.world.rank == 0
        if not is_root and not self.all_ranks:
            if self.rank == 0 or not self._described:
                # Rank 0 stuck before it reached the world (in the local stage), or a process
                # with no world at all: it reports for itself. Other ranks stay quiet: rank 0
                # names them as missing (under the self-test, the supervisor speaks if it cannot).
                self._render(self._partial(None, interrupted), code)
            elif not self._rank0_final_word(INTERRUPT_FINAL_WAIT_S if interrupted else STORE_READ_S):
                # Rank 0 is gone or stuck without a word: nobody else will report this rank's
                # results. (Rank 0's own watchdog fires before this one and leaves its word; a
                # signal sent to every rank reaches rank 0 too, which then gives it within the wait.)
                self._render(self._partial(None, interrupted, rank0_silent=True), code, alone=True)
            return None
        if not self._render(self._partial(self.world if is_root else None, interrupted), code):
            with self._report_lock:
                if self._reported_code is not None and self._reported_code != code:
                    return self._reported_code
        if is_root and self.world is not None:
            # Tell the others (bounded: the store may be what hangs) so they end quietly.
            world = self.world
            claims = sorted(f"{r}:{c}" for r, c in (self.progress.checkins.payloads if self.progress.checkins else {}))
            call_with_deadline(lambda: world.put("final", {"exit": code, "claims": claims}),
                               STORE_READ_S, "final")
            if world.hosted:
                # The store ends with this process: let the others read the final word first.
                arrived = len(self.progress.checkins.arrivals) if self.progress.checkins else self._roster_size(world)
                if arrived > 1:
                    world.await_goodbyes(arrived - 1, self.clock() + GOODBYE_ON_EXPIRE_S)
        return None

    def _rank0_final_word(self, wait_s: float) -> bool:
        """Whether rank 0 left its final word in the store (or does within ``wait_s``)."""
        if self.final_seen.is_set():
            return True
        world = self.world
        if world is None:
            return False
        got = call_with_deadline(lambda: world.fetch_first({"final": FINAL}, self.clock() + wait_s),
                                 wait_s + 0.1, "final")
        return isinstance(got, tuple) and got[0] == "final"

    def _roster_size(self, world: World) -> int:
        roster = call_with_deadline(world.roster, STORE_READ_S, "roster")
        return len(roster) if isinstance(roster, list) else 0

    def _partial(self, world: World | None, interrupted: str | None = None, rank0_silent: bool = False) -> Report:
        stage = self.progress.stage
        stuck: list[int] = sorted({0, self.rank}) if rank0_silent else [self.rank]
        if world is not None and stage in CROSS_RANK_STAGES:
            expected = self.progress.expected or list(range(world.size))
            if stage == "rendezvous" and self.progress.checkins is None:
                roster = call_with_deadline(world.roster, STORE_READ_S, "roster")
                arrived = {r for r, _ in roster} if isinstance(roster, list) else set()
                stuck = [r for r in expected if r not in arrived] or [0]
            else:
                done = call_with_deadline(lambda: world.done_ranks(stage), STORE_READ_S, "progress")
                done = done if isinstance(done, set) else set()
                stuck = sorted({0, *(r for r in expected if r != 0 and r not in done)})
        running = running_checks({r.name for r in list(self.runner.state.results)})
        deadline_finding = self._cutoff_finding(stage, stuck, running, interrupted)
        if rank0_silent:
            deadline_finding = dataclasses.replace(
                deadline_finding, data={**deadline_finding.data, "rank0_final_word": False},
                detail=deadline_finding.detail + " Rank 0 had left no final word in the store by then (it is gone "
                "or stuck), so this rank reports for itself.")
        findings = [f for f in list(self.runner.state.findings) if f.id not in (RUN_DEADLINE.id, RUN_INTERRUPTED.id)]
        unanswered = verdict_so_far(self._spec, self.store_attempts) if self.world is None and self._spec else None
        if unanswered is not None and not any(f.data.get("probe") for f in findings):
            findings.append(self._store_finding(self._spec, unanswered, name_holder=False))
        self.runner.state.findings = findings
        self.runner.state.incomplete = True
        if world is not None:
            report = self._consolidated(extra=[deadline_finding])
        else:
            report = self._own_report([deadline_finding])
        # One word on the cut-off: the main flow may have marked its own stage meanwhile (its
        # runner's core.E004, check "runner"); the watchdog's names the stage and ranks for all.
        report.findings = [f for f in report.findings
                           if f.id not in (RUN_DEADLINE.id, RUN_INTERRUPTED.id) or f.check in ("watchdog", "signal")]
        report.incomplete = True
        return report

    def _cutoff_finding(self, stage: str, stuck: list[int], running: list[str], signame: str | None) -> Finding:
        """The word on a cut-off run: the deadline (core.E004), or a signal when ``signame`` (core.E006)."""
        doing = f" (running: {', '.join(running)})" if running else ""
        during = f", while {', '.join(running)} {'was' if len(running) == 1 else 'were'} running" if running else ""
        where = self._where(stage)
        title_where = where[0].upper() + where[1:]
        data = {"stage": stage, "running": running}
        if signame:
            return RUN_INTERRUPTED(
                f"{title_where} was interrupted by {signame} on {ranks_label(stuck)}{doing}",
                detail=f"distdoctor received {signame} {self.clock() - self.started:.1f}s after it started, "
                f"in {where}{during}; the report is partial.",
                ranks=stuck, check="signal", data={**data, "signal": signame},
            )
        spent = self._stage_times()
        return RUN_DEADLINE(
            f"{title_where} did not finish before the run's deadline on {ranks_label(stuck)}{doing}",
            detail=f"The watchdog ended the run {self.config.timeout:g}s after distdoctor started, "
            f"in {where}{during}; the report is partial."
            + (f" Where the time went on this rank: {spent}." if spent else ""),
            ranks=stuck, check="watchdog", data={**data, **({"stage_times": spent} if spent else {})},
        )

    def _where(self, stage: str) -> str:
        """'the local stage', or the start-up when the rank was still importing torch (no check had begun)."""
        marks = getattr(self, "stage_started", {})
        if stage == "local" and TORCH_IMPORT in marks and "local" not in marks:
            return "the start-up (importing torch.distributed; no check had begun)"
        return f"the {stage} stage"

    def _stage_times(self) -> str:
        """'start-up 1.2s, importing torch.distributed 3.1s, the local stage 0.1s, the rendezvous (every
        rank's check-in) 6.3s, the collective stage 12.4s (each collective check had 13.2 s ...)': what
        was slow, in words; the start-up is distdoctor's own before the first of these began."""
        marks = sorted(getattr(self, "stage_started", {}).items(), key=lambda kv: kv[1])
        now = self.clock()
        ends = [t for _, t in marks[1:]] + [now]
        parts = [f"start-up {(marks[0][1] if marks else now) - self.started:.1f}s"]
        for (stage, began), end in zip(marks, ends):
            parts.append(f"{_PHASES.get(stage, stage)} {end - began:.1f}s")
        note = getattr(self, "deadline_note", "")
        return ", ".join(parts) + (f" ({note})" if note and marks and marks[-1][0] == "collective" else "")

    def _testing_hang(self, stage: str) -> None:
        """Test-only: DISTDOCTOR_TESTING=1 DISTDOCTOR_TEST_HANG=<rank>:<stage> blocks this flow.

        It stands for a hang no deadline can interrupt (a C++ wait), to prove the watchdog ends
        the run; it is ignored unless DISTDOCTOR_TESTING=1.
        """
        env = self.ctx.env
        if env.get("DISTDOCTOR_TESTING") != "1":
            return
        want = env.get("DISTDOCTOR_TEST_HANG", "")
        if want == f"{self.rank}:{stage}":
            self._enter_stage("collective" if stage == "gather" else stage)
            mark = env.get("DISTDOCTOR_TEST_HANG_FILE")
            if mark:  # tells a test that the hang has begun (it then sends a signal, say)
                with open(mark, "w") as fh:
                    fh.write(str(os.getpid()))
            while True:
                time.sleep(3600)
