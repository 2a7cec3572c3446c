"""A gloo rank outside every collective is not read as waiting in one (gloo marks completion late)."""

from __future__ import annotations

from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.snapshot import RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot
from distdoctor.embedded.guard.snapshot import in_torch, settled

SLEEPING = (Frame("train.py", 110, "<module>"),)
IN_BACKWARD = (Frame("train.py", 40, "<module>"),
               Frame("/usr/lib/python3.11/site-packages/torch/autograd/graph.py", 825, "_engine_run_backward"))
LAGGING = GroupProgress("0", last_enqueued=16, last_completed=15,
                        pending=PendingOp("all_reduce", 16, ((4,),), ("Float",), "scheduled", 6.0))


def test_a_lagging_gloo_count_of_a_rank_in_its_own_code_is_settled():
    assert not in_torch(SLEEPING) and in_torch(IN_BACKWARD) and in_torch(())
    [group] = settled((LAGGING,), lambda name: "gloo")
    assert not group.waiting and group.pending is None and group.last_completed == 16


def test_other_backends_and_backends_not_known_keep_the_recorders_word():
    for backend in ("nccl", None, "ucc"):
        assert settled((LAGGING,), lambda name: backend) == (LAGGING,)


def test_the_issues_dropped_send_job_is_no_deadlock_once_the_sender_is_settled():
    """The 2-rank job of issue 43: rank 0 sleeps before its send (its last all_reduce not yet marked
    completed), rank 1 waits in recv from it. Read as pending, rank 0 "waits in a collective" and the
    two make a point-to-point deadlock (job.E006); settled, rank 0 is the late rank at its line."""
    receiver = RankSnapshot(rank=1, status=RUNNING, in_collective="recv (float32[4])", where=Frame("train.py", 113, "<module>"),
                            groups=(GroupProgress("0", last_enqueued=16, last_completed=16,
                                                  pending=PendingOp("recv", None, ((4,),), ("float32",), "started", 3.1,
                                                                    peer=0)),))
    as_read = RankSnapshot(rank=0, status=RUNNING, where=SLEEPING[0], groups=(LAGGING,))
    assert [f.id for f in diagnose([as_read, receiver])] == ["job.E006"]  # what 0.6's first cut said
    sender = RankSnapshot(rank=0, status=RUNNING, where=SLEEPING[0], groups=settled((LAGGING,), lambda name: "gloo"))
    ids = [f.id for f in diagnose([sender, receiver])]
    assert "job.E006" not in ids and ids and ids[0] == "job.E002", ids
