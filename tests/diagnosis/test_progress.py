"""The one progress rule over looks at a job (diagnosis.progress): what moved, and what the looks prove."""

from __future__ import annotations

from distdoctor.diagnosis import progress
from distdoctor.diagnosis.progress import (IDLE, MOVED, ONE_LOOK, RUNNING, STALLED, STILL, UNDECIDED, FAILED,
                                           judge, moved, motion, recent, settled_since, wait_place)
from distdoctor.diagnosis.snapshot import EXITED, KILLED, UNKNOWN, Frame, GroupProgress, PendingOp, RankSnapshot

TRAIN = "/job/train.py"
BACKWARD = "backward (DDP's gradient all-reduce)"


def look(rank: int, t: float, line: int, *, op: str | None = None, cpu: float = 1.0, state: str = "S",
         spin: bool = False, status: str = "running", exit_code: int | None = None, pid: int | None = None,
         groups: tuple[GroupProgress, ...] = ()) -> RankSnapshot:
    """One read of a rank: at TRAIN:line (in op when given), its main thread's CPU and state."""
    where = Frame(TRAIN, line, "main", "")
    return RankSnapshot(rank=rank, host="vm", pid=pid or 100 + rank, status=status, exit_code=exit_code,
                        stack=(Frame(TRAIN, 50, "<module>"), where), where=where, in_collective=op, time=t,
                        source="test", cpu_s=cpu, proc_state=state, may_spin=spin, groups=groups)


def test_a_stack_that_moved_is_progress():
    assert moved(look(0, 0, 39), look(0, 0.5, 42)) == "its stack went from /job/train.py:39 to /job/train.py:42"
    assert moved(look(0, 0, 39), look(0, 0.5, 43, op=BACKWARD)) == \
        f"its stack went from /job/train.py:39 to {BACKWARD} at /job/train.py:43"


def test_cpu_outside_a_wait_is_progress_and_none_is_not():
    assert moved(look(0, 0, 42, cpu=1.0, state="R"), look(0, 0.5, 42, cpu=1.3, state="R")).startswith("it computed: 0.30 s")
    assert moved(look(0, 0, 39, cpu=1.0), look(0, 0.5, 39, cpu=1.0)) is None          # asleep, as in time.sleep
    assert moved(look(0, 0, 39, cpu=1.0), look(0, 10, 39, cpu=1.05)) is None          # 0.5 % of 10 s: wake-ups


def test_cpu_in_the_same_wait_counts_only_when_both_reads_found_it_asleep():
    # Caught in DDP's backward at both reads, having run a whole step in between: it moved.
    a, b = look(0, 0, 43, op=BACKWARD, cpu=1.0), look(0, 0.5, 43, op=BACKWARD, cpu=1.2)
    assert "left backward (DDP's gradient all-reduce) at /job/train.py:43 and came back: 200 ms" in moved(a, b)
    # On a CPU at a read (a wait that spins, or just woken): its CPU is no evidence.
    assert moved(a, look(0, 0.5, 43, op=BACKWARD, cpu=1.2, state="R")) is None
    # A CUDA synchronisation may spin: CPU proves nothing, in a wait or not.
    spin = dict(spin=True, state="R")
    assert moved(look(0, 0, 50, cpu=1.0, **spin), look(0, 0.5, 50, cpu=1.5, **spin)) is None


def test_sequence_numbers_that_grew_are_progress_without_any_stack():
    def counters(t: float, done: int, issued: int) -> RankSnapshot:
        return RankSnapshot(rank=0, status="running", time=t, groups=(GroupProgress("0", last_enqueued=issued,
                                                                                    last_completed=done),))
    assert moved(counters(0, 7, 8), counters(0.25, 9, 10)) == "it completed collectives #8-#9 of the default group"
    assert moved(counters(0, 7, 8), counters(0.25, 7, 9)) == "it issued collectives #9-#9 of the default group"
    assert moved(counters(0, 7, 8), counters(0.25, 7, 8)) is None


def test_a_restart_is_a_move_and_an_end_is_not():
    assert "PID 100 -> 200" in moved(look(0, 0, 39, pid=100), look(0, 1, 39, pid=200))
    assert moved(look(0, 0, 39), look(0, 1, 39, status=EXITED, exit_code=1)) is None


def test_a_rank_is_still_only_across_two_reads_and_unreadable_reads_are_no_evidence():
    assert motion(0, [look(0, 0, 39)]).state == ONE_LOOK
    unread = RankSnapshot(rank=0, status=UNKNOWN, time=0.5)
    still = motion(0, [look(0, 0, 39), unread, look(0, 1, 39)])
    assert still.state == STILL and still.looks == 2 and still.span_s == 1.0
    assert motion(0, [look(0, 0, 39), look(0, 1, 40)]).state == MOVED
    assert motion(0, [unread]).state == "unread"
    assert motion(0, [look(0, 0, 39), look(0, 1, 39, status=KILLED, exit_code=-9)]).state == "ended"


def straggler(times=(0.0, 0.5, 1.0), *, waiter_cpu=(1.0, 1.0, 1.0), late_lines=(39, 39, 39)) -> dict:
    """Rank 0 in DDP's backward at every read; rank 1 at late_lines."""
    return {0: [look(0, t, 43, op=BACKWARD, cpu=c) for t, c in zip(times, waiter_cpu)],
            1: [look(1, t, line) for t, line in zip(times, late_lines)]}


def test_a_stall_is_named_when_the_waiter_stayed_in_its_wait_and_the_late_rank_outside():
    found = judge(straggler())
    assert found.outcome == STALLED and found.decided
    (late,) = found.findings
    assert late.id == "job.E002" and late.ranks == (1,)
    assert "rank 0 stayed still in backward (DDP's gradient all-reduce) at /job/train.py:43 across 3 reads over 1.0 s" in late.detail
    assert "rank 1 stayed still at /job/train.py:39 across 3 reads" in late.detail


def test_a_busy_job_caught_in_backward_at_every_read_is_running():
    # The healthy job: rank 0 is in DDP's backward whenever it is read, rank 1 computing;
    # rank 0's CPU advanced between reads that both found it asleep there: it ran a step each time.
    found = judge(straggler(waiter_cpu=(1.0, 1.15, 1.3), late_lines=(42, 41, 42)))
    assert found.outcome == RUNNING
    (running,) = found.findings
    assert running.id == "job.I001" and running.severity.label == "info"
    assert "rank 0 moved between reads: it left backward" in running.detail


def test_a_waiter_that_moved_withholds_the_stall_and_says_what_one_read_would_have_claimed():
    history = straggler(waiter_cpu=(1.0, 1.0, 1.3))
    history[1] = [look(1, t, 39) for t in (0.0, 0.5, 1.0)]
    history[0][1] = look(0, 0.5, 41)  # it was computing at the middle read
    found = judge(history)
    assert found.outcome == UNDECIDED and not found.decided
    (open_,) = found.findings
    assert open_.id == "job.I002" and open_.severity.label == "info"
    assert "the last read alone would say: Rank 1 has not arrived" in open_.detail
    assert "rank 0, which waits at the last read, moved between reads" in open_.detail


def test_a_late_rank_seen_inside_the_waiters_collective_is_not_called_late():
    history = straggler(late_lines=(39, 39, 39))
    history[1][1] = look(1, 0.5, 43, op=BACKWARD)
    found = judge(history)
    assert found.outcome == UNDECIDED and "job.E002" not in [f.id for f in found.findings]


def test_a_hang_needs_every_rank_still():
    still = {r: [look(r, t, 43, op="all_reduce") for t in (0, 0.5, 1)] for r in range(3)}
    hang = judge(still)
    assert hang.outcome == STALLED and [f.id for f in hang.findings] == ["job.E009"]
    moving = dict(still)
    moving[2] = [look(2, 0, 43, op="all_reduce", cpu=1.0), look(2, 0.5, 43, op="all_reduce", cpu=1.2),
                 look(2, 1, 43, op="all_reduce", cpu=1.4)]
    assert judge(moving).outcome == UNDECIDED


def test_a_receive_cycle_of_still_ranks_is_named():
    cycle = judge({r: [look(r, t, 44, op="recv") for t in (0, 0.5, 1)] for r in range(2)})
    assert [f.id for f in cycle.findings] == ["job.E006"] and "point-to-point" in cycle.findings[0].title


def test_one_read_alone_is_said_so_and_a_failure_needs_no_second_read():
    one = judge({0: [look(0, 0, 43, op=BACKWARD)], 1: [look(1, 0, 39)]})
    assert one.outcome == UNDECIDED
    assert one.findings[0].title == "One read alone cannot tell a busy job from a hung one"
    assert "the last read alone would say: Rank 1 has not arrived" in one.findings[0].detail
    dead = judge({0: [look(0, 0, 43, op=BACKWARD)], 1: [look(1, 0, 39, status=KILLED, exit_code=-9)]})
    assert dead.outcome == FAILED and dead.findings[0].id == "job.E005"


def test_still_ranks_in_no_wait_are_idle_not_hung():
    idle = judge({r: [look(r, t, 39) for t in (0, 0.5, 1)] for r in range(2)})
    assert idle.outcome == IDLE and idle.decided
    assert idle.findings[0].title == "No rank moved between reads, and none waits in a collective its stack names"


def test_a_stall_seen_by_counters_alone_as_the_guard_polls_them():
    """Snapshots with only sequence numbers (no stack, no CPU): the same rule."""
    def rank(r: int, t: float, done: int, pending: bool) -> RankSnapshot:
        group = GroupProgress("0", last_enqueued=done + (1 if pending else 0), last_completed=done,
                              pending=PendingOp("all_reduce", seq=done + 1) if pending else None)
        return RankSnapshot(rank=r, status="running", time=t, groups=(group,), source="guard")
    stuck = {0: [rank(0, t, 7, True) for t in (0, 0.25, 0.5)], 1: [rank(1, t, 7, False) for t in (0, 0.25, 0.5)]}
    found = judge(stuck)
    assert found.outcome == STALLED and found.findings[0].id == "job.E002" and found.findings[0].ranks == (1,)
    passing = {0: [rank(0, 0, 7, True), rank(0, 0.25, 8, True), rank(0, 0.5, 9, True)],
               1: [rank(1, 0, 8, False), rank(1, 0.25, 9, False), rank(1, 0.5, 10, False)]}
    assert judge(passing).outcome == RUNNING


def test_the_window_and_since_when_a_rank_stayed():
    looks = [look(0, t, 39 if t < 2 else 43, op=None if t < 2 else BACKWARD) for t in (0, 1, 2, 2.5, 3, 3.5)]
    assert [s.time for s in recent(looks, min_looks=3, min_span_s=1.0)] == [2.5, 3, 3.5]
    assert [s.time for s in recent(looks[:2], min_looks=3, min_span_s=1.0)] == [0, 1]
    assert settled_since(looks) == 2
    assert settled_since(looks[:1]) is None
    assert wait_place(looks[-1]) == f"{BACKWARD} at {TRAIN}:43" and wait_place(looks[0]) is None


def test_the_new_snapshot_fields_round_trip_and_survive_hostile_input():
    snap = look(0, 1.0, 39, cpu=2.5, state="S", spin=True)
    back = RankSnapshot.from_dict(snap.to_dict())
    assert (back.cpu_s, back.proc_state, back.may_spin) == (2.5, "S", True)
    hostile = RankSnapshot.from_dict({"rank": 0, "cpu_s": "lots", "proc_state": ["R"] * 99, "may_spin": "yes"})
    assert hostile.cpu_s is None and len(hostile.proc_state) <= 1 and hostile.may_spin is False
    assert RankSnapshot.from_dict({"rank": 0, "cpu_s": float("nan")}).cpu_s is None
    assert progress.cpu_between(look(0, 0, 39, cpu=2.0), look(0, 1, 39, cpu=1.0)) == 0.0


def test_a_job_whose_every_rank_ended_cleanly_is_decided_with_nothing_to_say():
    ended = judge({0: [look(0, 0, 39, status=EXITED, exit_code=0)], 1: [look(1, 0, 39, status=EXITED, exit_code=0)]})
    assert ended.outcome == progress.ENDED_ALL and ended.decided and ended.findings == ()
