"""A verdict from one moment: a look whose answers were taken while the job moved says nothing and ends
nothing (the ranks that moved after answering say so); the same verdict on ranks that stayed still stands.

Three ranks on an in-memory store with the real watchdog, looks and policy (test_guard_episodes' fakes)."""

from __future__ import annotations

import threading
import time

from distdoctor.diagnosis.snapshot import RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot
from distdoctor.embedded.guard import policy
from distdoctor.embedded.guard.channel import SideChannel
from distdoctor.embedded.guard.record import Recorder
from distdoctor.embedded.guard.watch import EpisodeWatch
from test_guard_episodes import FakeClock, FakeHost, MemoryStore, call, state, wait_until


def in_all_gather(rank: int) -> dict:
    """A rank inside DDP's start-up all_gather #1, as a look answered early in a moving job reads it."""
    pending = PendingOp("all_gather", 1, ((1,),), ("Long",), "scheduled", 0.5)
    group = GroupProgress("0", (0, 1, 2), last_enqueued=1, last_completed=0, pending=pending)
    frame = Frame("loop.py", 10, "<module>")
    inside = Frame("/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 3000, "all_gather")
    snap = RankSnapshot(rank=rank, status=RUNNING, groups=(group,), stack=(frame, inside), where=frame,
                        source="guard")
    return {"snapshot": snap.to_dict(), "running": [], "dropped": []}


def three_ranks(rank1_moves: bool):
    """Ranks 0 and 2 stall in all_reduce #5; rank 1 answers from all_gather #1 and then, if
    ``rank1_moves``, goes on (its next collective issued right after its answer)."""
    store, clock = MemoryStore(), FakeClock()
    recorders = {r: Recorder(clock=clock) for r in range(3)}

    def rank1_state() -> dict:
        if rank1_moves:
            threading.Timer(0.05, lambda: recorders[1].begin_collective(call(2))).start()
        return in_all_gather(1)

    hosts = {0: FakeHost(0, lambda: state(0, pending_seq=5), 1800), 1: FakeHost(1, rank1_state, 1800),
             2: FakeHost(2, lambda: state(2, pending_seq=5), 1800)}
    for host in hosts.values():
        host.group_ranks = lambda name: [0, 1, 2]
    watches = {r: EpisodeWatch(hosts[r], recorders[r], SideChannel(store, "p"), hang_timeout=5, answer_s=1.0,
                               poll_s=0.01, on_hang="auto", world=3) for r in range(3)}
    for watch in watches.values():
        watch.start()
    for rank in (0, 2):
        recorders[rank].begin_collective(call(5))
    clock.now += 6
    return hosts, watches, clock


def stop(watches) -> None:
    for watch in watches.values():
        watch.stop()


def test_a_verdict_on_answers_taken_while_the_job_moved_says_nothing_and_ends_nothing():
    hosts, watches, _ = three_ranks(rank1_moves=True)
    try:
        assert wait_until(lambda: any("gave no verdict" in line for h in hosts.values() for line in h.noted), 30)
        time.sleep(0.5)
        noted = [line for h in hosts.values() for line in h.noted]
        assert any("1 rank moved after answering: the answers were not one moment" in line for line in noted), noted
        # The verdict those answers make (job.E006, ranks at different collectives) would end the job.
        assert not any(h.ended for h in hosts.values()) and not any(h.shown for h in hosts.values())
        assert not any(h.said for h in hosts.values())  # nothing on the job's terminal
    finally:
        stop(watches)


def test_the_same_verdict_on_ranks_that_stayed_still_stands_and_ends_the_job():
    hosts, watches, clock = three_ranks(rank1_moves=False)
    try:
        # A look that gave no verdict on a loaded machine (its confirmations late) is taken again after its back-off.
        assert wait_until(lambda: all(h.ended for h in hosts.values()), 30, clock=clock, watches=watches)
        decider = next(h for h in hosts.values() if h.shown)
        findings, _, decision = decider.shown[0]
        assert findings[0].id == "job.E006" and decision.action == policy.END
        assert not any(line for h in hosts.values() for line in h.noted)
    finally:
        stop(watches)
