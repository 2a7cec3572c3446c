"""The guard's watchdog: every stall of the run as an episode, every rank's snapshot through the store, one verdict."""

# One thread per guarded process, waking every ``poll_s``:
#   - it looks whether this rank is stalled (embedded.guard.stall: a guarded call running, a group
#     the flight recorder shows stuck or, without the recorder, a wait the main thread's stack has
#     stayed in: embedded.guard.mainthread). This costs the store nothing. A stall past
#     ``hang_timeout`` opens an episode: this rank requests a *look* (embedded.guard.looks; ranks
#     that stall at once share one), collects every rank's answer until all answered or the answer
#     deadline passed (embedded.guard.cadence: it grows with the world and the store's measured
#     round trip), asks the one diagnosis for the verdict, and embedded.guard.policy decides: end
#     the job now, or report and watch. A rank not heard from in time is said as such, never
#     named late, missing or dead for its silence alone; its answer, when it comes, revises the
#     verdict. The rank that opened an episode owns it: it looks again every ``recheck_s`` (at
#     once when a late rank leaves a final snapshot) and reports again when the verdict changes; it
#     ends a watched stall at the process group's own timeout; and it closes the episode when its
#     stall clears, with one line saying who arrived after how long. Detection then goes on.
#   - it polls one counter key for news at an interval that grows with the world (cadence: the
#     job's store load stays bounded), more often when this rank has not moved for a while (it may
#     be a stall's late rank): on news it answers the look another rank requested (its snapshot,
#     its evidence in the report directory) and reads the verdicts it waits for: a verdict that
#     ends the job ends this rank too, after it said why; an episode another rank watches keeps
#     this rank from opening its own on the same stall until that one closes.
# Every store operation has a deadline; the stuck process group is never used. A fault of the
# watchdog's own is said once (guard.W012) and the thread goes on.

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from distdoctor.core.findings import Finding
from distdoctor.embedded.guard import cadence, policy
from distdoctor.embedded.guard import confirm
from distdoctor.embedded.guard.channel import CONNECT_TIMEOUT_S, ChannelDown, SideChannel
from distdoctor.embedded.guard.episodes import Episode, Ledger, facts
from distdoctor.embedded.guard.looks import Board, parse_answer
from distdoctor.embedded.guard.mainthread import MainThread
from distdoctor.embedded.guard.peers import absent_snapshot
from distdoctor.embedded.guard.record import Recorder
from distdoctor.embedded.guard.stall import Backoff, Stall, StallClock, in_wait, longest, still
from distdoctor.embedded.guard.verdict import cut_problem


class Host(Protocol):
    """What the watchdog needs from the guard of its process (embedded.guard.process.Guard)."""

    rank: int
    started: float

    def state(self, group: str | None = None) -> dict[str, Any]: ...
    def group_ranks(self, name: str) -> list[int]: ...
    def group_timeout(self, name: str) -> float | None: ...
    def group_grace(self, name: str) -> float: ...
    def wait_group(self, pg: Any) -> str: ...
    def decide(self, states: dict[int, Any], ranks: list[int], waited: float, world_known: bool) -> list[Finding]: ...
    def show(self, findings: list[Finding], heading: str, ranks: list[int], decision: policy.Decision) -> Any: ...
    def say(self, line: str) -> None: ...
    def note(self, line: str) -> None: ...
    def end(self, report: Any, why: list[str], rendered_here: bool, findings: list[Finding] | None = None) -> None: ...
    def fault(self, part: str, exc: BaseException) -> None: ...
    def stalls_changed(self) -> None: ...


def recheck_s(hang_timeout: float) -> float:
    """How often the owner of an open episode looks at every rank again."""
    return min(max(hang_timeout, 5.0), 60.0)


@dataclass
class Seen:
    """What one look found: the verdict's findings and what it rests on."""

    findings: list[Finding]
    world_known: bool
    look: int | None = None
    answers: int = 0                                   # ranks other than this one that answered live
    states: dict[int, Any] = field(default_factory=dict)  # every answer read (a revision adds late ones)
    ranks: list[int] = field(default_factory=list)
    failed: bool = False                               # the diagnosis itself failed (said as a fault)
    waited_s: float = 0.0                              # how long it waited for answers
    stale: str = ""                                    # why the answers cannot be one moment (no verdict)

    @property
    def not_heard(self) -> list[int]:
        return [r for r in self.ranks if r not in self.states or self.states[r].get("absent")]


class EpisodeWatch:
    """The watchdog thread of one guarded process: its stalls as episodes, the looks it answers."""

    def __init__(self, host: Host, recorder: Recorder, side: SideChannel | None, *, hang_timeout: float,
                 answer_s: float, poll_s: float, on_hang: str, flight: Any = None, world: int = 0) -> None:
        self.host, self.recorder, self.side, self.flight = host, recorder, side, flight
        self.rank = host.rank
        self.world = world or int(getattr(host, "world", 0) or 2)
        self.hang_timeout, self.answer_s, self.poll_s, self.on_hang = hang_timeout, answer_s, poll_s, on_hang
        self.clock, self.stalls, self.ledger = recorder.clock, StallClock(), Ledger(side)
        self.board = Board(side, self.rank) if side is not None else None
        self.main: MainThread | None = None                # the main thread's looks, when no recorder counts
        self.stopped = threading.Event()
        self.own: Episode | None = None
        self.seen: Seen | None = None                      # the latest look of the episode this rank owns
        self.following: tuple[int, float] | None = None    # (episode another rank watches, when last seen)
        self.channel_error: BaseException | None = None    # the store channel's last failure, said when needed
        self.ended = False
        self.saw_episodes = False                           # this rank opened or answered one (a healthy run: never)
        self.latest: Episode | None = None                  # the episode this rank last opened, changed or closed
        self.backoff = Backoff(max(1.0, hang_timeout / 4), recheck_s(hang_timeout))  # looks that found nothing
        self.moved: tuple[Any, float] = (None, self.clock())  # (what this rank's counters were, since when)
        # The first news poll comes at a random moment of the first interval: ranks that start
        # together do not open their clients together.
        self.last_news = time.monotonic() - random.uniform(0.0, cadence.busy_interval_s(self.world))
        self.next_revision = 0.0
        self.activity = ""                                  # what the poll in progress does, in words
        self.answered = confirm.Answered()                  # the progress this rank answered each look with
        self.status: dict[str, tuple[int, int]] | None = None  # the recorder's counts at the last poll
        self.last_stall: Stall | None = None                # this rank's stall at the last poll
        self.serial = 0                                     # the verdicts this rank published

    def start(self) -> "EpisodeWatch":
        self.thread = threading.Thread(target=self._watch, name="distdoctor-guard-watch", daemon=True)
        self.thread.start()
        return self

    def stop(self, join_s: float = 0.0) -> None:
        """Stop the thread; with join_s, wait that long for a store request it may be in."""
        self.stopped.set()
        thread = getattr(self, "thread", None)
        if join_s and thread is not None and thread is not threading.current_thread():
            thread.join(join_s)

    def busy(self) -> str:
        """What this thread is still doing after stop() ("" when it ended or is between polls)."""
        thread = getattr(self, "thread", None)
        return self.activity if thread is not None and thread.is_alive() else ""

    # -- the loop ---------------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self.stopped.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # the watchdog outlives any fault of its own, and says it once
                self.host.fault("watchdog", exc)

    def poll(self) -> None:
        self.activity = "reading this rank's progress"
        self.recorder.poll()
        stall = self.stall_now()
        self.activity = "asking the job's store for news (a look to answer, a verdict)"
        self._news()
        if self.stopped.is_set() or self.ended:
            self.activity = ""
            return
        self.activity = "looking at a stall through the job's store"
        if self.own is not None:
            self._tend(self.own, stall)
        elif stall is not None and stall.seconds(self.clock()) >= self.hang_timeout and not self._following():
            self._open(stall)
        self.activity = ""

    def stall_now(self) -> Stall | None:
        """This rank's longest stall now: what the flight recorder counts or, without it, the wait the
        main thread's stack shows (looked at every poll), and the guarded calls still running."""
        if self.flight is not None and self.flight.usable:
            status = self.status = self.flight.status()
            self._moving((tuple(sorted(status.items())), self.recorder.calls))
            self.last_stall = longest(self.recorder, self.stalls.update(status, self.clock()))
            return self.last_stall
        self.status = None
        self._moving((self.recorder.calls, len(self.recorder.running_records())))
        self.last_stall = longest(self.recorder, self._main_wait())
        return self.last_stall

    def marks(self) -> confirm.Marks:
        """This rank's progress as of its last poll (embedded.guard.confirm)."""
        stall = self.last_stall
        return confirm.marks(self.status, self.recorder, stall.since if stall is not None else None)

    def _moving(self, counters: Any) -> None:
        if counters != self.moved[0]:
            self.moved = (counters, self.clock())

    def quiet(self) -> bool:
        """This rank's collectives have not moved for a while: it may be a stall's late rank, or stalled."""
        return self.clock() - self.moved[1] >= cadence.quiet_after_s(self.hang_timeout)

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

    # -- news: the looks other ranks request, the verdicts this rank waits for ---------------------
    def _news(self) -> None:
        board = self.board
        if board is None:
            return
        quick = self.quiet() or self.own is not None or self.following is not None
        interval = cadence.awaiting_interval_s(self.world) if board.awaiting else \
            cadence.quiet_interval_s(self.world) if quick else cadence.busy_interval_s(self.world)
        now = time.monotonic()
        if now - self.last_news < interval:
            return
        self.last_news = now
        try:
            if board.news():
                self._on_news(board)
            self.channel_error = None
        except Exception as exc:  # the store went away (or is slow, or not reached yet): said when this rank needs it
            self.channel_error = exc

    def _on_news(self, board: Board) -> None:
        latest = board.latest()
        first = board.answered == 0
        for look in range(max(board.answered + 1, latest - 1), latest + 1):
            if self.ended:
                return
            request = board.request(look)
            if request is None or request.get("rank") == self.rank or not board.fresh(request):
                continue
            if first and board.verdict(look) is not None:
                continue  # a look finished before this rank first asked (it joined late)
            self._answer(look, request.get("group"))
        board.answered = max(board.answered, latest)
        for look, since in sorted(board.awaiting.items()):
            verdict = board.verdict(look)
            if verdict is not None and verdict.get("pending"):
                self._confirm_theirs(look, verdict)  # still awaited: the confirmed verdict follows
            elif verdict is not None:
                board.awaiting.pop(look, None)
                self._follow(look, verdict)
            elif time.monotonic() - since > cadence.MAX_ANSWER_S + 2 * recheck_s(self.hang_timeout):
                board.awaiting.pop(look, None)  # the asking rank ended before its verdict: nothing to follow
        for look in [n for n in board.mine if n not in board.awaiting]:
            verdict = board.verdict(look)  # a look this rank answered, judged again (late answers revise it)
            if verdict is not None and verdict.get("pending"):
                self._confirm_theirs(look, verdict)
        if self.following is not None and board.closed(self.following[0]):
            self.following = None

    def _answer(self, look: int, group: Any = None) -> None:
        board = self.board
        assert board is not None
        group = group if isinstance(group, str) else None  # the stalled group, as the look's request says
        self.answered.keep(look, self.marks(), group or "")
        board.answer(look, self.host.state(group=group))
        board.awaiting[look] = time.monotonic()
        self.saw_episodes = True

    def _confirm_theirs(self, look: int, verdict: dict[str, Any]) -> None:
        """Another rank's pending verdict on a look this rank answered: whether this rank moved since."""
        board, key = self.board, (look, verdict.get("serial"))
        assert board is not None
        if key in self.answered.acked:
            return
        self.answered.acked.add(key)
        moved = self.answered.moved(look, self.marks())
        board.ack(look, verdict.get("serial"), confirm.MOVED if moved else 1)

    def _follow(self, look: int, verdict: dict[str, Any]) -> None:
        board = self.board
        assert board is not None
        episode, action = verdict.get("episode"), verdict.get("action")
        if action == policy.END:
            findings = [Finding.from_dict(f) for f in verdict.get("findings", ())]
            why = [f"{f.id} [{f.cause}] {f.title}" for f in findings] or [str(verdict.get("reason") or "")]
            self.ended = True
            self.host.concluded = True  # an error raised from here on is this end's, not a new cause
            # Said before the acknowledgement: the deciding rank ends once every rank read its verdict,
            # and the launcher then stops the others. So does this rank: the first rank to end makes the
            # launcher stop the rest, and one that had not read the verdict yet would end without a word
            # (torchrun's SIGTERM to a waiting rank of the suite's 4-rank DDP job, 0.1 s after another
            # follower ended).
            for line in [f"the job ends, {verdict.get('reason')} (rank {verdict.get('renderer')}'s verdict): "
                         + why[0], *why[1:]]:
                self.host.say(line)
            board.ack(look, "end")
            answers = verdict.get("answers")
            self._await_readers(look, answers if isinstance(answers, int) else 0)
            self.host.end(None, [], False, findings)
        elif action == policy.WATCH and isinstance(episode, int) and episode != (self.own.id if self.own else None):
            self.following = (episode, self.clock())

    def _following(self) -> bool:
        """True while this rank waits for the verdict of a look it answered, or another rank watches
        an open episode (this rank's stall is most likely the same)."""
        if self.board is not None and self.board.awaiting:
            return True
        if self.following is None or self.side is None:
            return False
        # The owner looks again every recheck_s: silence for three rounds means it is gone.
        limit = 3 * recheck_s(self.hang_timeout) + cadence.MAX_ANSWER_S
        if self.clock() - self.following[1] > limit:
            self.following = None
            return False
        return True

    # -- a look this rank requests ----------------------------------------------------------------
    def _look(self, stall: Stall, previous: Seen | None = None) -> Seen | None:
        """What every rank says of this stall; None when another rank requested this look first (this
        rank answered it instead)."""
        ranks = self.host.group_ranks(stall.group)
        board, seen = self.board, None
        if board is not None:
            try:
                look, mine = self._claim(board, stall, previous is None)
                if not mine:
                    if look is not None and look not in board.mine:
                        self._answer(look, stall.group)
                    return None
                self.answered.keep(look, self.marks(), stall.group)
                board.answer(look, self.host.state(group=stall.group))
                board.bump()
                wait = cadence.answer_wait(len(ranks), self.answer_s, self.side.traffic.rtt_s)
                started = time.monotonic()
                states = self._collect(look, ranks, wait, previous)
                seen = Seen([], True, look, sum(1 for r, s in states.items() if r != self.rank and s.get("live")),
                            states, ranks, waited_s=time.monotonic() - started)
            except Exception as exc:  # the store channel failed now that it is needed: say so, judge alone
                self.host.fault("store channel", exc)
        elif self.channel_error is not None:
            self.host.fault("store channel", self.channel_error)
        if seen is None:
            seen = Seen([], False, states={self.rank: self.host.state(group=stall.group)}, ranks=ranks)
        return self._judged(seen, stall)

    def _claim(self, board: Board, stall: Stall, first: bool) -> tuple[int | None, bool]:
        """(the look for this stall, whether this rank asks for it). Ranks stalled in the same collective
        share one look (claimed per group and sequence number); an owner's later looks are its own."""
        key = self._stall_key(stall) if first else None
        if key is None:
            return board.claim(stall.group)
        look, mine = board.claim_stall(key)
        if not mine:
            return look, False
        # This collective's first: the look another rank is collecting for this group right now (ranks that
        # stall at once in different calls of one group, a receive here, an all-reduce there: one look that
        # hears them all), else a look of its own. Either is numbered for the others stalled in it.
        look, mine = board.claim(stall.group, same_group=True)
        board.number_stall(key, look)
        return look, mine

    def _stall_key(self, stall: Stall) -> str | None:
        """The collective this stall is in, the same on every rank stalled in it: the group and the
        sequence number the recorder (or the guarded call) waits at; None when neither says."""
        seen = self.stalls.seen.get(stall.group)
        if seen is not None and seen[1] == stall.since and seen[0].last_completed is not None:
            return f"{stall.group}/{seen[0].last_completed + 1}"
        running = self.recorder.oldest_running()
        if running is not None and running.started == stall.since and running.seq is not None:
            return f"{running.group}/call{running.seq}"
        return None

    def _judged(self, seen: Seen, stall: Stall) -> Seen:
        """The diagnosis of what a look saw. Its own failure is said as the diagnosis' (guard.W012),
        never as the store's, and leaves the verdict empty and marked failed."""
        try:
            seen.stale = cut_problem(seen.states, seen.ranks)
            seen.findings = [] if seen.stale else \
                self.host.decide(seen.states, seen.ranks, stall.seconds(self.clock()), seen.world_known)
        except Exception as exc:
            self.host.fault("diagnosis", exc)
            seen.findings, seen.failed = [], True
        return seen

    def _collect(self, look: int, ranks: list[int], wait: cadence.AnswerWait,
                 previous: Seen | None = None) -> dict[int, Any]:
        """Every rank's answer to this look (or the final state it left), waiting as cadence says; a
        rank not heard from gets what /proc proves about it, or "not heard from"."""
        board, side = self.board, self.side
        assert board is not None and side is not None
        started = time.monotonic()
        states = board.collect(look, ranks, wait, parse_answer, stop=self.stopped.is_set)
        for state in states.values():
            state["live"] = True
        # A rank that raised or left answers from its watchdog until its process ends: its final
        # snapshot, not that live answer, is its last word.
        states.update({r: parse_answer(v) for r, v in side.read_many("final", ranks).items() if isinstance(v, dict)})
        self._absent(states, ranks, time.monotonic() - started, previous)
        return states

    def _absent(self, states: dict[int, Any], ranks: list[int], waited_s: float, previous: Seen | None) -> None:
        """The ranks not heard from: what /proc proves of each, or "not heard from" with its last answer."""
        missing = [r for r in ranks if r not in states]
        if not missing:
            return
        assert self.side is not None
        hellos = self.side.read_many("hello", missing)
        for rank in missing:
            last = previous.states.get(rank) if previous is not None else None
            said = ""
            if isinstance(last, dict) and last.get("live") and last.get("snapshot") is not None:
                snap = last["snapshot"]
                said = f"its last answer (look {previous.look}): " + (
                    f"in {snap.in_collective}" if snap.in_collective else "waiting" if snap.waiting else "outside any collective")
            states[rank] = {"snapshot": absent_snapshot(rank, hellos.get(rank), waited_s, last=said), "absent": True}

    def _revise(self, episode: Episode, stall: Stall) -> None:
        """Answers that came after the verdict (a loaded store, a slow rank): taken into it, and the
        verdict said again when they change it."""
        seen, board = self.seen, self.board
        if seen is None or board is None or seen.look is None or not seen.not_heard:
            return
        heard = [r for r, s in seen.states.items() if not s.get("absent")]
        late = board.late_answers(seen.look, seen.not_heard, heard)
        if not late:
            return
        kept = {r: s for r, s in seen.states.items() if not s.get("absent")}
        for rank, value in self.side.read_many(f"look/{seen.look}/state", late, listed=late).items():
            if isinstance(value, dict):
                kept[rank] = {**parse_answer(value), "live": True}
        self._absent(kept, seen.ranks, seen.waited_s, None)
        revised = self._judged(Seen([], True, seen.look, seen.answers + len(late), kept, seen.ranks,
                                    waited_s=seen.waited_s), stall)
        self._verdict_again(episode, stall, revised, "revised")

    # -- an episode: opened, tended, closed -------------------------------------------------------
    def _open(self, stall: Stall) -> None:
        if self.backoff.holds(stall, self.clock()):  # the last look at this stall found nothing: not yet
            return
        side = self.side
        if side is not None and not side.connected and not side.gave_up \
                and stall.seconds(self.clock()) < self.hang_timeout + CONNECT_TIMEOUT_S:
            try:  # its client is still being opened: the look waits for it (bounded), not judged alone
                side.client()
            except ChannelDown:
                pass
            if not side.connected:
                return
        seen = self._look(stall)
        if seen is None:
            return
        if seen.failed:  # said as the diagnosis' fault; the ranks waiting for a verdict get none
            self.backoff.empty(stall, self.clock())
            self._publish(seen.look, [], policy.Decision(policy.NONE, "the diagnosis failed"), None, seen.answers)
            return
        decision = self._decision(seen.findings, seen.world_known, stall)
        why = seen.stale or (self._confirmed(seen, decision) if decision.action != policy.NONE else "")
        if why:  # the answers were not one moment: no verdict, the stall is looked at again
            self._look_again(seen, stall, why)
            return
        waited = stall.seconds(self.clock())
        # Nothing to report now: the next look at this stall waits, longer each time (a look every poll
        # would load the store), and the same stall looked at again is said once.
        if decision.action == policy.NONE and self.backoff.empty(stall, self.clock()) > 1:
            self._publish(seen.look, seen.findings, decision, None, seen.answers)
            return
        episode = Episode(id=self._new_id(), owner=self.rank, stall=stall, started_at=time.time() - waited,
                          started_s=stall.since - self.host.started, findings=seen.findings, action=decision.action,
                          deadline_at=decision.deadline_at, last_look=self.clock())
        if decision.action == policy.NONE:  # everyone moved on while the ranks were asked: a false alarm
            episode.seconds = waited
            self.host.say(f"a stall of {waited:.1f} s in {self._group_text(stall.group)} cleared while the ranks "
                          f"were asked (hang timeout {self.hang_timeout:g} s); nothing to report, nothing ends")
            self._publish(seen.look, seen.findings, decision, episode, seen.answers)
            self._keep(episode)
            return
        heading = (f"a collective has not completed for {waited:.1f} s (hang timeout {self.hang_timeout:g} s)"
                   f" [stall {episode.id}]:")
        report = self.host.show(seen.findings, heading, self.host.group_ranks(stall.group), decision)
        self._keep(episode)
        self._publish(seen.look, seen.findings, decision, episode, seen.answers)
        if decision.action == policy.END:
            self._end(report, seen.look, seen.answers, episode)
        self.own, self.seen = episode, seen

    def _confirmed(self, seen: Seen, decision: policy.Decision) -> str:
        """Why this look's verdict does not stand ("" when this rank and every rank that answered
        confirmed that it did not move since its answer: embedded.guard.confirm)."""
        if seen.look is None or self.board is None or self.side is None:
            return ""  # judged from this rank's own view, taken just now
        self.stall_now()  # this rank's progress now: a read of its own recorder, no request
        if self.answered.moved(seen.look, self.marks()):
            return "this rank moved after its answer: the answers were not one moment of the job"
        if not seen.answers:
            return ""
        self.serial += 1
        serial, board = self.serial, self.board
        try:
            board.publish(seen.look, seen.findings, self.rank, decision.action, decision.reason, None, serial,
                          pending=True)
            wait = cadence.answer_wait(len(seen.ranks), self.answer_s, self.side.traffic.rtt_s).last_s
            still_, moved = confirm.await_acks(lambda: board.acks(seen.look, serial), seen.answers, wait,
                                               self.stopped.is_set)
            self.side.forget([self.side.key("look", seen.look, "ack", serial)])
        except Exception as exc:  # the store failed: nothing confirms the answers, so nothing is said on them
            self.host.fault("store channel", exc)
            return f"the ranks' confirmations could not be read ({type(exc).__name__})"
        return confirm.unconfirmed(still_, moved, seen.answers)

    def _look_again(self, seen: Seen, stall: Stall, why: str, episode: Episode | None = None) -> None:
        """No verdict from this look (why: in words): the ranks waiting for one are told, the guard's log
        says why, and the stall is looked at again later (an open episode keeps its verdict)."""
        if episode is None:
            self.backoff.empty(stall, self.clock())
            decision = policy.Decision(policy.NONE, f"no verdict: {why}")
            self._publish(seen.look, [], decision, None, seen.answers)
        else:
            self._publish(seen.look, episode.findings, self._decision(episode.findings, True, episode.stall,
                                                                      episode.deadline_at), episode, seen.answers)
        self.host.note(f"a look at the stall in {self._group_text(stall.group)} gave no verdict: {why}; "
                       "it is looked at again")

    def _tend(self, episode: Episode, stall: Stall | None) -> None:
        if not still(episode.stall, stall):
            self._close(episode)
            return
        assert stall is not None
        due = self.clock() - episode.last_look >= recheck_s(self.hang_timeout)
        at_deadline = episode.deadline_at is not None and time.time() >= episode.deadline_at
        if due or at_deadline or self._late_rank_left(episode):
            self._relook(episode, stall)
        elif time.monotonic() >= self.next_revision:
            self.next_revision = time.monotonic() + cadence.quiet_interval_s(self.world)
            try:
                self._revise(episode, stall)
            except Exception as exc:
                self.channel_error = exc

    def _late_rank_left(self, episode: Episode) -> bool:
        """A late rank raised, left or ended since the last look (it left a final snapshot)."""
        if self.side is None:
            return False
        late = {r for r in facts(episode.findings)["late"] if isinstance(r, int)}
        if not late:
            return False
        try:
            return bool(late & set(self.side.roster("final")))
        except Exception as exc:
            self.channel_error = exc
            return False

    def _relook(self, episode: Episode, stall: Stall) -> None:
        seen = self._look(stall, self.seen)
        episode.last_look = self.clock()
        if seen is None or seen.failed:
            return
        self._verdict_again(episode, stall, seen, "changed")

    def _verdict_again(self, episode: Episode, stall: Stall, seen: Seen, what: str) -> None:
        """A later look's verdict on an open episode: said when it changed, or when it ends the job."""
        if seen.stale:
            self._look_again(seen, stall, seen.stale, episode)
            return
        decision = self._decision(seen.findings, seen.world_known, episode.stall, episode.deadline_at)
        if decision.action == policy.NONE:  # the stall cleared meanwhile: closed at the next poll
            self._publish(seen.look, seen.findings, decision, episode, seen.answers)
            return
        changed = replace(episode, findings=seen.findings).identity != episode.identity
        if changed and decision.action != policy.END and policy.arriving(episode.findings, seen.findings):
            # The late rank arrived and the collective is completing: the stall closes at a poll soon.
            self._publish(seen.look, episode.findings, decision, episode, seen.answers)
            return
        why = self._confirmed(seen, decision) if changed or decision.action == policy.END else ""
        if why:
            self._look_again(seen, stall, why, episode)
            return
        self.seen = seen
        report = None
        if changed or decision.action == policy.END:
            episode.findings, episode.action, episode.reports = seen.findings, decision.action, episode.reports + 1
            episode.deadline_at = decision.deadline_at or episode.deadline_at
            waited = stall.seconds(self.clock())
            verb = what if changed else "goes on"
            heading = f"stall {episode.id} {verb} after {waited:.1f} s (hang timeout {self.hang_timeout:g} s):"
            report = self.host.show(seen.findings, heading, self.host.group_ranks(stall.group), decision)
            self._keep(episode)
        self._publish(seen.look, seen.findings, decision, episode, seen.answers)
        if decision.action == policy.END:
            self._end(report, seen.look, seen.answers, episode)

    def _close(self, episode: Episode) -> None:
        # The episode stays this rank's own until its end is recorded: whoever sees `own` cleared reads
        # the stall's length in the ledger (a test read it a moment too early, at load 10).
        try:
            self._record_end(episode, self.seen.look if self.seen is not None else None)
        finally:
            self.own, self.seen = None, None

    def _record_end(self, episode: Episode, look: int | None) -> None:
        episode.seconds = episode.stall.seconds(self.clock())
        known = facts(episode.findings)
        late = known["late"]
        who = (f"rank {late[0]}" if len(late) == 1 else f"ranks {', '.join(map(str, late))}") if late else ""
        op = f"{known['op']}" + (f" #{known['seq']}" if known.get("seq") is not None else "") if known.get("op") else ""
        where = f" ({op} of {self._group_text(known.get('group') or episode.stall.group)})" if op else ""
        if policy.ended_by_torch(episode.deadline_at, self.recorder.recent(episode.stall.group, 1),
                                 grace=self.host.group_grace(episode.stall.group)):
            episode.ended_run = True
            text = (f"stall {episode.id} ended after {episode.seconds:.1f} s{where}, at the process group's own "
                    "timeout: torch ended the collective (its error follows)")
        elif who and episode.findings and episode.findings[0].id in ("job.E002", "job.E004"):
            text = f"{who} arrived after {episode.seconds:.1f} s{where}; stall {episode.id} is over"
        else:
            text = f"stall {episode.id} cleared after {episode.seconds:.1f} s{where}"
        self.host.say(text)
        self._keep(episode)
        if self.board is not None:
            try:
                self.board.close(episode.id, episode.seconds, look)
            except Exception as exc:
                self.host.fault("store channel", exc)

    def _end(self, report: Any, look: int | None, answers: int, episode: Episode) -> None:
        """This rank decided that the job ends: the episode ends with it; wait (bounded) until the ranks
        that answered read the verdict (this rank may host the store), then end."""
        self.ended = True
        # The others end as they read the verdict: this rank's own collective then fails, and that error is
        # the end this verdict causes, not a new cause for the exception hook to report.
        self.host.concluded = True
        episode.seconds = episode.stall.seconds(self.clock())
        self._keep(episode)
        if look is not None:
            self._await_readers(look, answers)
        self.host.end(report, [], True)

    def _await_readers(self, look: int, answers: int) -> None:
        """Wait (bounded) until the ``answers`` ranks that answered ``look`` read its end."""
        if self.board is None or answers <= 0:
            return
        until = time.monotonic() + cadence.ack_wait_s(self.world)
        try:
            while time.monotonic() < until and self.board.acks(look, "end") < answers:
                time.sleep(0.05)
        except Exception:  # the store is gone: nobody is left to read the verdict
            pass

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
    def _publish(self, look: int | None, findings: list[Finding], decision: policy.Decision,
                 episode: Episode | None, answers: int = 0) -> None:
        if look is None or self.board is None:
            return
        try:
            self.board.publish(look, findings, self.rank, decision.action, decision.reason,
                               episode.id if episode is not None else None, answers=answers)
        except Exception as exc:
            self.host.fault("store channel", exc)

    def _decision(self, findings: list[Finding], world_known: bool, stall: Stall,
                  deadline_at: float | None = None) -> policy.Decision:
        now_at = time.time()
        since_at = now_at - stall.seconds(self.clock())
        return policy.judge(findings, self.on_hang, world_known=world_known, stall_since_at=since_at,
                            group_timeout_s=self.host.group_timeout(stall.group), now_at=now_at,
                            deadline_at=deadline_at, grace=self.host.group_grace(stall.group))

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

    def publish(self, kind: str, value: dict[str, Any]) -> str:
        """Leave ``kind/<rank>`` (the final state at the end) for the others to read; why not, in words
        ("" when it was left, or there is no channel)."""
        if self.side is None:
            return ""
        try:
            # A final state is worth a short wait for a connection still being opened.
            self.side.publish(kind, self.rank, value, wait_s=cadence.FINAL_WAIT_S)
            return ""
        except Exception as exc:  # said if the channel is ever needed
            self.channel_error = exc
            return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
