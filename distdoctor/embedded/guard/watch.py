"""The guard's watchdog: every stall of the run as an episode, every rank's snapshot through the store, one verdict."""

# One thread per guarded process, waking every ``poll_s``:
#   - it looks whether this rank is stalled (embedded.guard.stall: a guarded call running, a group
#     the flight recorder shows stuck or, without the recorder, a wait the main thread's stack has
#     stayed in: embedded.guard.mainthread). A stall past ``hang_timeout`` opens an episode: this
#     rank requests a *look* (`look/<n>/request`, claimed with compare_set, so ranks that stall at
#     once share one), collects every rank's snapshot for ``answer_s`` at most, asks the one
#     diagnosis for the verdict, and embedded.guard.policy decides: end the job now, or report and
#     watch. The rank that opened an episode owns it: it looks again every ``recheck_s`` (at once
#     when a late rank leaves a final snapshot) and reports again when the verdict changes; it
#     ends a watched stall at the process group's own timeout; and it closes the episode when its
#     stall clears, with one line saying who arrived after how long. Detection then goes on.
#   - it answers every look another rank requested (its snapshot, its evidence in the report
#     directory) and reads the verdict: a verdict that ends the job ends this rank too, after it
#     said why; an episode another rank watches keeps this rank from opening its own on the same
#     stall until that one closes.
# Every store operation has a deadline; the stuck process group is never used. A fault of the
# watchdog's own is said once (guard.W012) and the thread goes on.

from __future__ import annotations

import json
import threading
import time
from typing import Any, Protocol

from distdoctor.core.findings import Finding
from distdoctor.embedded.guard import policy
from distdoctor.embedded.guard.channel import STORE_OP_TIMEOUT_S, SideChannel
from distdoctor.embedded.guard.episodes import Episode, Ledger, facts
from distdoctor.embedded.guard.peers import absent_snapshot
from distdoctor.embedded.guard.record import Recorder
from distdoctor.embedded.guard.mainthread import MainThread
from distdoctor.embedded.guard.stall import Backoff, Stall, StallClock, in_wait, longest, still


class Host(Protocol):
    """What the watchdog needs from the guard of its process (embedded.guard.process.Guard)."""

    rank: int
    started: float

    def state(self) -> dict[str, Any]: ...
    def group_ranks(self, name: str) -> list[int]: ...
    def group_timeout(self, name: str) -> float | None: ...
    def wait_group(self, pg: Any) -> str: ...
    def decide(self, states: dict[int, Any], ranks: list[int], waited: float, world_known: bool) -> list[Finding]: ...
    def show(self, findings: list[Finding], heading: str, ranks: list[int], decision: policy.Decision) -> Any: ...
    def say(self, line: str) -> None: ...
    def end(self, report: Any, why: list[str], rendered_here: bool, findings: list[Finding] | None = None) -> None: ...
    def fault(self, part: str, exc: BaseException) -> None: ...
    def stalls_changed(self) -> None: ...


def recheck_s(hang_timeout: float) -> float:
    """How often the owner of an open episode looks at every rank again."""
    return min(max(hang_timeout, 5.0), 60.0)


class HangWatch:
    """The watchdog thread of one guarded process."""

    def __init__(self, host: Host, recorder: Recorder, side: SideChannel | None, *, hang_timeout: float,
                 answer_s: float, poll_s: float, on_hang: str, flight: Any = None) -> None:
        self.host, self.recorder, self.side, self.flight = host, recorder, side, flight
        self.rank = host.rank
        self.hang_timeout, self.answer_s, self.poll_s, self.on_hang = hang_timeout, answer_s, poll_s, on_hang
        self.clock, self.stalls, self.ledger = recorder.clock, StallClock(), Ledger(side)
        self.main: MainThread | None = None                # the main thread's looks, when no recorder counts
        self.stopped = threading.Event()
        self.next_look = 1
        self.answered_look = 0
        self.own: Episode | None = None
        self.following: tuple[int, float] | None = None   # (episode another rank watches, when last seen)
        self.channel_error: BaseException | None = None   # the store channel's last failure, said when needed
        self.ended = False
        self.saw_episodes = False                          # this rank opened or answered one (a healthy run: never)
        self.latest: Episode | None = None                 # the episode this rank last opened, changed or closed
        self.backoff = Backoff(max(1.0, hang_timeout / 4), recheck_s(hang_timeout))  # looks that found nothing

    def start(self) -> "HangWatch":
        self.thread = threading.Thread(target=self._watch, name="distdoctor-guard-watch", daemon=True)
        self.thread.start()
        return self

    def stop(self, join_s: float = 0.0) -> None:
        """Stop the thread; with join_s, wait that long for a store request it may be in."""
        self.stopped.set()
        thread = getattr(self, "thread", None)
        if join_s and thread is not None and thread is not threading.current_thread():
            thread.join(join_s)

    # -- the loop ---------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # the watchdog outlives any fault of its own, and says it once
                self.host.fault("watchdog", exc)

    def poll(self) -> None:
        self.recorder.poll()
        stall = self.stall_now()
        self._answer_looks()
        if self.stopped.is_set() or self.ended:
            return
        if self.own is not None:
            self._tend(self.own, stall)
        elif stall is not None and stall.seconds(self.clock()) >= self.hang_timeout and not self._following():
            self._open(stall)

    def stall_now(self) -> Stall | None:
        """This rank's longest stall now: what the flight recorder counts or, without it, the wait the
        main thread's stack shows (looked at every poll), and the guarded calls still running."""
        if self.flight is not None and self.flight.usable:
            return longest(self.recorder, self.stalls.update(self.flight.status(), self.clock()))
        return longest(self.recorder, self._main_wait())

    def _main_wait(self) -> Stall | None:
        """The wait the main thread has stayed in, as a stall. A fault in reading it is said once
        (guard.W012) and costs only this evidence: the poll goes on to answer the other ranks' looks."""
        main = self.main_thread()
        try:
            return in_wait(main, lambda: self.host.wait_group(main.ddp_group())) if main.look() is not None else None
        except Exception as exc:
            self.host.fault("main-thread look", exc)
            return None

    def main_thread(self) -> MainThread:
        """The main thread's looks (made on first use: only a rank without the recorder needs them)."""
        if self.main is None:
            self.main = MainThread(self.rank, self.clock)
        return self.main

    # -- answering the looks other ranks request --------------------------------------------------
    def _answer_looks(self) -> None:
        side = self.side
        if side is None:
            return
        try:
            while not self.ended and side.there(side.key("look", self.next_look, "request")):
                look = self.next_look
                self.next_look += 1
                self._answer(look)
            self.channel_error = None
        except Exception as exc:  # the store went away (or is slow): said when this rank needs it
            self.channel_error = exc

    def _put_state(self, look: int) -> None:
        side = self.side
        assert side is not None
        side.put(side.key("look", look, "state", self.rank), self.host.state())
        if self.answered_look:
            side.forget([side.key("look", self.answered_look, "state", self.rank)])
        self.answered_look = look

    def _answer(self, look: int) -> None:
        side = self.side
        assert side is not None
        self._put_state(look)
        if not side.wait_for(side.key("look", look, "verdict"), self.answer_s + STORE_OP_TIMEOUT_S):
            return  # the requesting rank ended before its verdict: nothing to follow
        verdict = side.get(side.key("look", look, "verdict"))
        episode, action = verdict.get("episode"), verdict.get("action")
        self.saw_episodes = self.saw_episodes or isinstance(episode, int)
        if action == policy.END:
            findings = [Finding.from_dict(f) for f in verdict.get("findings", ())]
            why = [f"{f.id} [{f.cause}] {f.title}" for f in findings] or [str(verdict.get("reason") or "")]
            self.ended = True
            # Said before the acknowledgement: the deciding rank ends once every rank read its verdict,
            # and the launcher then stops the others.
            for line in [f"the job ends, {verdict.get('reason')} (rank {verdict.get('renderer')}'s verdict): "
                         + why[0], *why[1:]]:
                self.host.say(line)
            side.count(side.key("look", look, "ack"))
            self.host.end(None, [], False, findings)
        elif action == policy.WATCH and isinstance(episode, int) and episode != (self.own.id if self.own else None):
            self.following = (episode, self.clock())

    def _following(self) -> bool:
        """True while another rank watches an open episode (this rank's stall is most likely the same)."""
        if self.following is None or self.side is None:
            return False
        episode, seen = self.following
        try:
            closed = self.side.there(self.side.key("episode", episode, "closed"))
        except Exception as exc:
            self.channel_error, closed = exc, True
        # The owner looks again every recheck_s: silence for three rounds means it is gone.
        if closed or self.clock() - seen > 3 * recheck_s(self.hang_timeout) + self.answer_s + STORE_OP_TIMEOUT_S:
            self.following = None
            return False
        return True

    # -- a look this rank requests ----------------------------------------------------------------
    def _look(self, stall: Stall) -> tuple[list[Finding], bool, int | None, int] | None:
        """(findings, world_known, the look's number or None, answers) for this stall; None when
        another rank requested this look first (this rank answers it instead)."""
        ranks = self.host.group_ranks(stall.group)
        waited = stall.seconds(self.clock())
        side = self.side
        if side is not None:
            try:
                look = self.next_look
                got = side.claim(side.key("look", look, "request"), json.dumps({"rank": self.rank, "group": stall.group}))
                if json.loads(got).get("rank") != self.rank:
                    return None
                self.next_look += 1
                side.forget([side.key("look", look - 2, part) for part in ("request", "verdict", "ack")])
                self._put_state(look)
                states = self._collect(look, ranks)
                answers = sum(1 for r, s in states.items() if r != self.rank and not s.get("absent") and not s.get("final"))
            except Exception as exc:  # the store channel failed now that it is needed: say so, judge alone
                self.host.fault("store channel", exc)
            else:
                found = self._diagnosed(stall, states, ranks, waited, True)
                if found is None:  # said as the diagnosis' fault; the ranks waiting for a verdict get none
                    self._publish(look, [], policy.Decision(policy.NONE, "the diagnosis failed"), None)
                    return None
                return found, True, look, answers
        elif self.channel_error is not None:
            self.host.fault("store channel", self.channel_error)
        found = self._diagnosed(stall, {self.rank: self.host.state()}, ranks, waited, False)
        return (found, False, None, 0) if found is not None else None

    def _diagnosed(self, stall: Stall, states: dict[int, Any], ranks: list[int], waited: float,
                   world_known: bool) -> list[Finding] | None:
        """The diagnosis' verdict; None when it failed: said once as its own fault (not the store's),
        and the next look at this stall backs off."""
        try:
            return self.host.decide(states, ranks, waited, world_known)
        except Exception as exc:
            self.host.fault("diagnosis", exc)
            self.backoff.empty(stall, self.clock())
            return None

    def _collect(self, look: int, ranks: list[int]) -> dict[int, Any]:
        """Every rank's state for this look (or the final one it left), waiting at most answer_s."""
        side = self.side
        assert side is not None
        until = time.monotonic() + self.answer_s
        states: dict[int, Any] = {}
        while True:
            missing = [r for r in ranks if r not in states]
            found = {r: v for r, v in zip(missing, side.present([side.key("look", look, "state", r) for r in missing])) if v}
            for rank in found:
                try:
                    states[rank] = side.get(side.key("look", look, "state", rank))
                except (ValueError, TypeError):
                    continue
            states.update(side.read_many("final", [r for r in ranks if r not in states]))
            if len(states) == len(ranks) or time.monotonic() >= until:
                break
            time.sleep(0.05)
        # A rank that raised or left answers from its watchdog until its process ends: its final
        # snapshot, not that live answer, is its last word.
        states.update(side.read_many("final", ranks))
        hellos = side.read_many("hello", [r for r in ranks if r not in states])
        for rank in ranks:
            if rank not in states:
                states[rank] = {"snapshot": absent_snapshot(rank, hellos.get(rank), self.answer_s).to_dict(),
                                "absent": True}
        return states

    def _publish(self, look: int | None, findings: list[Finding], decision: policy.Decision,
                 episode: Episode | None) -> None:
        if look is None or self.side is None:
            return
        try:
            self.side.put(self.side.key("look", look, "verdict"),
                          {"findings": [f.to_dict() for f in findings], "renderer": self.rank,
                           "action": decision.action, "reason": decision.reason,
                           "episode": episode.id if episode is not None else None})
        except Exception as exc:
            self.host.fault("store channel", exc)

    def _decision(self, findings: list[Finding], world_known: bool, stall: Stall,
                  deadline_at: float | None = None) -> policy.Decision:
        now_at = time.time()
        since_at = now_at - stall.seconds(self.clock())
        return policy.judge(findings, self.on_hang, world_known=world_known, stall_since_at=since_at,
                            group_timeout_s=self.host.group_timeout(stall.group), now_at=now_at,
                            deadline_at=deadline_at)

    # -- an episode: opened, tended, closed -------------------------------------------------------
    def _open(self, stall: Stall) -> None:
        if self.backoff.holds(stall, self.clock()):  # the last look at this stall found nothing: not yet
            return
        seen = self._look(stall)
        if seen is None:
            return
        findings, world_known, look, answers = seen
        decision = self._decision(findings, world_known, stall)
        waited = stall.seconds(self.clock())
        if decision.action == policy.NONE and self.backoff.empty(stall, self.clock()) > 1:
            self._publish(look, findings, decision, None)  # the same stall looked at again: said once
            return
        episode = Episode(id=self._new_id(), owner=self.rank, stall=stall, started_at=time.time() - waited,
                          started_s=stall.since - self.host.started, findings=findings, action=decision.action,
                          deadline_at=decision.deadline_at, last_look=self.clock())
        if decision.action == policy.NONE:  # everyone moved on while the ranks were asked: a false alarm
            episode.seconds = waited
            self.host.say(f"a stall of {waited:.1f} s in {self._group_text(stall.group)} cleared while the ranks "
                          f"were asked (hang timeout {self.hang_timeout:g} s); nothing to report, nothing ends")
            self._publish(look, findings, decision, episode)
            self._keep(episode)
            return
        heading = (f"a collective has not completed for {waited:.1f} s (hang timeout {self.hang_timeout:g} s)"
                   f" [stall {episode.id}]:")
        report = self.host.show(findings, heading, self.host.group_ranks(stall.group), decision)
        self._keep(episode)
        self._publish(look, findings, decision, episode)
        if decision.action == policy.END:
            self._end(report, look, answers, episode)
        self.own = episode

    def _tend(self, episode: Episode, stall: Stall | None) -> None:
        if not still(episode.stall, stall):
            self._close(episode)
            return
        due = self.clock() - episode.last_look >= recheck_s(self.hang_timeout)
        at_deadline = episode.deadline_at is not None and time.time() >= episode.deadline_at
        if due or at_deadline or self._late_rank_left(episode):
            self._relook(episode, stall)

    def _late_rank_left(self, episode: Episode) -> bool:
        """A late rank raised, left or ended since the last look (it left a final snapshot)."""
        if self.side is None:
            return False
        late = [r for r in facts(episode.findings)["late"] if isinstance(r, int)]
        try:
            return any(self.side.present([self.side.key("final", r) for r in late]))
        except Exception as exc:
            self.channel_error = exc
            return False

    def _relook(self, episode: Episode, stall: Stall) -> None:
        seen = self._look(stall)
        episode.last_look = self.clock()
        if seen is None:
            return
        findings, world_known, look, answers = seen
        decision = self._decision(findings, world_known, episode.stall, episode.deadline_at)
        if decision.action == policy.NONE:  # the stall cleared meanwhile: closed at the next poll
            self._publish(look, findings, decision, episode)
            return
        changed = [f.id for f in findings[:1]] != [f.id for f in episode.findings[:1]] or \
            (findings and episode.findings and findings[0].ranks != episode.findings[0].ranks)
        if changed and decision.action != policy.END and policy.arriving(episode.findings, findings):
            # The late rank arrived and the collective is completing: the stall closes at a poll soon.
            self._publish(look, episode.findings, decision, episode)
            return
        report = None
        if changed or decision.action == policy.END:
            episode.findings, episode.action, episode.reports = findings, decision.action, episode.reports + 1
            episode.deadline_at = decision.deadline_at or episode.deadline_at
            waited = stall.seconds(self.clock())
            what = "changed" if changed else "goes on"
            heading = f"stall {episode.id} {what} after {waited:.1f} s (hang timeout {self.hang_timeout:g} s):"
            report = self.host.show(findings, heading, self.host.group_ranks(stall.group), decision)
            self._keep(episode)
        self._publish(look, findings, decision, episode)
        if decision.action == policy.END:
            self._end(report, look, answers, episode)

    def _close(self, episode: Episode) -> None:
        self.own = None
        episode.seconds = episode.stall.seconds(self.clock())
        known = facts(episode.findings)
        late = known["late"]
        who = (f"rank {late[0]}" if len(late) == 1 else f"ranks {', '.join(map(str, late))}") if late else ""
        op = f"{known['op']}" + (f" #{known['seq']}" if known.get("seq") is not None else "") if known.get("op") else ""
        where = f" ({op} of {self._group_text(known.get('group') or episode.stall.group)})" if op else ""
        if policy.ended_by_torch(episode.deadline_at, self.recorder.recent(episode.stall.group, 1)):
            episode.ended_run = True
            text = (f"stall {episode.id} ended after {episode.seconds:.1f} s{where}, at the process group's own "
                    "timeout: torch ended the collective (its error follows)")
        elif who and episode.findings and episode.findings[0].id in ("job.E002", "job.E004"):
            text = f"{who} arrived after {episode.seconds:.1f} s{where}; stall {episode.id} is over"
        else:
            text = f"stall {episode.id} cleared after {episode.seconds:.1f} s{where}"
        self.host.say(text)
        self._keep(episode)
        if self.side is not None:
            try:
                self.side.put(self.side.key("episode", episode.id, "closed"), round(episode.seconds, 3))
            except Exception as exc:
                self.host.fault("store channel", exc)

    def _end(self, report: Any, look: int | None, answers: int, episode: Episode) -> None:
        """This rank decided that the job ends: the episode ends with it; wait (bounded) until the ranks
        that answered read the verdict (this rank may host the store), then end."""
        self.ended = True
        episode.seconds = episode.stall.seconds(self.clock())
        self._keep(episode)
        if look is not None and self.side is not None and answers:
            until = time.monotonic() + 1.0
            try:
                while time.monotonic() < until and self.side.count(self.side.key("look", look, "ack"), 0) < answers:
                    time.sleep(0.02)
            except Exception:  # the store is gone: nobody is left to read the verdict
                pass
        self.host.end(report, [], True)

    def finish(self) -> None:
        """At shutdown (the thread stopped): the episode this rank owns is closed if its stall cleared."""
        episode = self.own
        if episode is not None and not self.ended:
            try:
                if not still(episode.stall, self.stall_now()):
                    self._close(episode)
            except Exception as exc:
                self.host.fault("watchdog", exc)

    # -- bookkeeping ------------------------------------------------------------------------------
    def _new_id(self) -> int:
        try:
            return self.ledger.new_id()
        except Exception as exc:
            self.host.fault("store channel", exc)
            self.ledger = Ledger(None)  # this rank keeps its own record from here on
            return self.ledger.new_id()

    def _keep(self, episode: Episode) -> None:
        self.saw_episodes, self.latest = True, episode
        try:
            self.ledger.keep(episode)
        except Exception as exc:
            self.host.fault("store channel", exc)
        self.host.stalls_changed()

    @staticmethod
    def _group_text(group: str) -> str:
        return "the default group" if group in ("0", "default") else f"group {group}"

    def publish(self, kind: str, value: dict[str, Any]) -> None:
        """Leave ``kind/<rank>`` (hello at start, final at the end) for the others to read."""
        if self.side is None:
            return
        try:
            self.side.put(self.side.key(kind, self.rank), value)
        except Exception as exc:  # said if the channel is ever needed
            self.channel_error = exc
