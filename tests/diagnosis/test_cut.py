"""diagnosis.cut: snapshots whose sequence numbers one moment could not have produced are named; every
possible combination (a straggler, a real departure, a root's collective done first) stays silent."""

from __future__ import annotations

from distdoctor.diagnosis.cut import impossible
from distdoctor.diagnosis.snapshot import FINISHED, RUNNING, GroupProgress, PendingOp, RankSnapshot


def op(name: str, seq: int) -> PendingOp:
    return PendingOp(name, seq, ((4,),), ("Float",))


def snap(rank: int, issued: int, done: int, ops: dict[int, str], group: str = "0", members=(), status=RUNNING):
    """A rank that issued collectives up to #issued and completed up to #done; ``ops``: seq -> op name."""
    recent = tuple(op(name, seq) for seq, name in sorted(ops.items()) if seq <= issued)
    pending = next((o for o in recent if o.seq > done), None)
    return RankSnapshot(rank=rank, status=status, groups=(GroupProgress(group, tuple(members), issued, done, pending,
                                                                        recent),))


DDP = {1: "all_gather", 2: "broadcast", 3: "broadcast", 4: "all_reduce", 5: "all_reduce", 6: "all_reduce"}


def test_ranks_all_in_one_collective_are_one_moment():
    assert impossible([snap(r, 5, 4, DDP) for r in range(4)]) == []


def test_a_straggler_that_has_not_issued_the_collective_the_others_wait_in_is_possible():
    assert impossible([snap(0, 5, 4, DDP), snap(1, 4, 4, DDP), snap(2, 6, 4, DDP)]) == []


def test_a_rank_that_had_not_issued_what_a_peer_completed_answered_earlier():
    # Rank 3 answered while it had issued only all_gather #1; rank 0 later, having completed all_reduce #4.
    lines = impossible([snap(0, 5, 4, DDP), snap(1, 5, 4, DDP), snap(2, 5, 4, DDP), snap(3, 1, 0, DDP)])
    assert lines == ["Rank 3 had not issued #4 of the default group when it answered, which rank 0 had completed: "
                     "its answer is older than rank 0's"]


def test_a_root_collective_completed_first_proves_nothing():
    # A broadcast's root can complete it before the others issue it.
    assert impossible([snap(0, 3, 3, DDP), snap(1, 1, 1, DDP)]) == []


def test_a_rank_that_left_after_completing_what_a_waiter_had_not_issued_yet_makes_the_waiter_older():
    left = snap(1, 6, 6, DDP, status=FINISHED)
    assert impossible([snap(0, 5, 4, DDP), left])[0].startswith("Rank 0 had not issued #6")
    # A real departure: the waiter issued past what the leaver completed.
    assert impossible([snap(0, 7, 6, {**DDP, 7: "all_reduce"}), left]) == []


def test_groups_are_read_apart_and_only_their_members_count():
    ops = {1: "all_reduce", 2: "all_reduce"}
    sub = [snap(0, 2, 2, ops, group="1", members=(0, 1)), snap(1, 2, 1, ops, group="1", members=(0, 1))]
    outsider = snap(2, 0, -1, ops, group="1", members=(0, 1))  # not a member of group 1: its count means nothing
    assert impossible([*sub, outsider]) == []
    stale = impossible([snap(0, 2, 2, ops, group="1"), snap(1, 1, 0, ops, group="1")])
    assert stale and "of group 1" in stale[0]


def test_thousands_of_stale_ranks_are_said_as_ranges_in_one_line():
    snaps = [snap(r, 5, 4, DDP) for r in range(4096)]
    snaps[17:1000] = [snap(r, 1, 0, DDP) for r in range(17, 1000)]
    [line] = impossible(snaps)
    assert line.startswith("Ranks 17-999 had not issued #4") and len(line) < 300


def test_the_48_rank_start_up_cut_is_possible_by_its_numbers_and_left_to_the_confirmation():
    # The healthy 48-rank job of the report: answers taken 0.5-1.5 s apart while the job left its start-up.
    # Ranks still in all_gather #1 had issued it, so the numbers alone are possible together; the ranks'
    # confirmation (they moved after answering) is what stops this verdict (tests/guard/test_guard_cut.py).
    snaps = [snap(r, 1, 0, DDP) for r in range(19)] + [snap(r, 4, 3, DDP) for r in range(19, 48)]
    assert impossible(snaps) == []
