"""A gloo rank outside every collective is not read as waiting in one (gloo marks completion late)."""

from __future__ import annotations

from dataclasses import replace

from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.snapshot import RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot
from distdoctor.embedded.guard.record import WORD_COUNT, CallRecord
from distdoctor.embedded.guard.snapshot import _as_guarded, _settle, in_torch, settled

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


# A rank whose main thread waits in a guarded receive (rank 1 of the same job, run 10 of a loaded
# repetition): gloo still shows its all_reduce #16 of step 7 pending, issued 6.5 s ago, while the
# receive it called after it started 3.2 s ago.
IN_RECV = (Frame("proof_job.py", 113, "<module>"),
           Frame("/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2500, "recv"))
NOW = 100.0


def _call(op: str, started: float, site: str = "proof_job.py:113") -> CallRecord:
    return CallRecord(op, "0", 0, shapes=((4,),), dtypes=("float32",), params={"peer": 0, "tag": 0}, site=site,
                      function="<module>", started=started)


def _lagging(age_s: float) -> GroupProgress:
    return GroupProgress("0", last_enqueued=16, last_completed=15,
                         pending=PendingOp("all_reduce", 16, ((4,),), ("Float",), "scheduled", age_s))


def test_a_collective_issued_before_the_receive_the_main_thread_waits_in_is_settled_on_gloo():
    [group] = _settle((_lagging(6.5),), [_call("recv", NOW - 3.2)], IN_RECV, NOW, lambda name: "gloo")
    assert group.pending is None and group.last_completed == 16
    [shown] = _as_guarded((group,), [_call("recv", NOW - 3.2)], NOW)
    assert shown.pending.op == "recv" and shown.pending.peer == 0


def test_what_the_receive_does_not_prove_keeps_the_recorders_word():
    recv = _call("recv", NOW - 3.2)
    cases = {
        "issued inside the receive": ((_lagging(3.0),), [recv], IN_RECV, "gloo"),
        "a Python-issued collective still running (async)": ((_lagging(6.5),), [recv, _call("all_reduce", NOW - 7)],
                                                              IN_RECV, "gloo"),
        "the receive runs on another thread": ((_lagging(6.5),), [_call("recv", NOW - 3.2, "loader.py:9")], IN_RECV, "gloo"),
        "nccl": ((_lagging(6.5),), [recv], IN_RECV, "nccl"),
        "backend not known": ((_lagging(6.5),), [recv], IN_RECV, None),
    }
    for why, (groups, running, stack, backend) in cases.items():
        assert _settle(groups, running, stack, NOW, lambda name: backend) == groups, why


def test_the_receivers_stale_collective_is_not_read_as_the_wait_and_the_straggler_is_named_at_recv():
    """Both ranks completed all_reduce #16; rank 0 sleeps before its send, rank 1 waits in recv. Read as
    the recorder shows it, rank 1 "waits in all_reduce #16" and rank 0 is late for it; settled, rank 0 is
    late for the receive rank 1 waits in."""
    sender = RankSnapshot(rank=0, status=RUNNING, where=SLEEPING[0],
                          groups=(GroupProgress("0", last_enqueued=16, last_completed=16),))
    recv = _call("recv", NOW - 3.2)
    receiving = _as_guarded(_settle((_lagging(6.5),), [recv], IN_RECV, NOW, lambda name: "gloo"), [recv], NOW)
    receiver = RankSnapshot(rank=1, status=RUNNING, in_collective="recv (float32[4])", where=IN_RECV[0],
                            groups=receiving)
    [first, *_] = diagnose([sender, receiver])
    assert first.id == "job.E002" and "recv" in first.title and "all_reduce" not in first.title, first.title


# A rank in the guard's verification of its all_reduce (the suite's policy job, 2026-11-29): the recorder
# shows the verification exchange (an all_gather of the fingerprint's int64 words) as the newest op,
# #7, and still all_reduce #5 pending (gloo had not marked it); the peer, asleep before its all_reduce,
# completed #6. The diagnosis settles #5 and takes the next op from `recent`: the exchange.
def _verifying() -> GroupProgress:
    words = ((WORD_COUNT,),)
    recent = tuple(PendingOp("all_gather" if seq % 2 else "all_reduce", seq, words if seq % 2 else ((4,),),
                             ("Long",) if seq % 2 else ("Float",), "scheduled") for seq in range(1, 8))
    return GroupProgress("0", last_enqueued=7, last_completed=4,
                         pending=PendingOp("all_reduce", 5, ((4,),), ("Float",), "scheduled", 14.25), recent=recent)


def test_a_rank_in_the_guards_verification_waits_in_the_call_it_verifies_not_in_an_all_gather():
    call = CallRecord("all_reduce", "0", 3, shapes=((4,),), dtypes=("float32",), params={}, site="policy_job.py:83",
                      function="<module>", started=NOW - 3.7)
    [shown] = _as_guarded((_verifying(),), [call], NOW)
    assert shown.recent[-1].signature() == ("all_reduce", ((4,),), ("float32",)) and shown.recent[-1].seq == 7
    assert [op.op for op in shown.recent[:-1]] == [op.op for op in _verifying().recent[:-1]]  # history kept
    waiting = RankSnapshot(rank=0, status=RUNNING, in_collective="all_reduce (float32[4])",
                           where=Frame("policy_job.py", 83, "<module>"), groups=(shown,))
    late = RankSnapshot(rank=1, status=RUNNING, where=Frame("policy_job.py", 80, "<module>"),
                        groups=(GroupProgress("0", last_enqueued=6, last_completed=6, recent=_verifying().recent[:-1]),))
    [first, *_] = diagnose([waiting, late])
    assert first.id == "job.E002" and "all_reduce #7 (float32[4])" in first.title and "all_gather" not in first.title, \
        first.title


def test_a_users_own_all_gather_or_an_exchange_that_is_not_the_newest_op_is_kept():
    call = CallRecord("all_reduce", "0", 3, shapes=((4,),), dtypes=("float32",), params={}, site="policy_job.py:83",
                      function="<module>", started=NOW - 3.7)
    users = replace(_verifying(), recent=(*_verifying().recent[:-1], PendingOp("all_gather", 7, ((9, 2),), ("Long",))))
    older = replace(_verifying(), last_enqueued=8)
    for group in (users, older):
        [shown] = _as_guarded((group,), [call], NOW)
        assert shown.recent == group.recent


def test_a_rank_in_a_guarded_collective_of_another_group_has_its_earlier_default_group_collective_settled():
    """The suite's proof job (2026-11-29): rank 0 in the guarded all_reduce of group 1 (its line on the main
    stack), gloo still showing the default group's all_reduce issued before it pending: the rank waits in
    group 1's call, not in the default group's."""
    call = CallRecord("all_reduce", "1", 0, shapes=((4,),), dtypes=("float32",), params={}, site="proof_job.py:82",
                      function="<module>", started=NOW - 3.0)
    stack = (Frame("proof_job.py", 82, "<module>"),
             Frame("/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2800, "all_reduce"))
    default, own = _lagging(6.5), GroupProgress("1", last_enqueued=0, last_completed=None)
    [settled_default, kept_own] = _settle((default, own), [call], stack, NOW, lambda name: "gloo")
    assert settled_default.pending is None and kept_own == own
    # Issued inside the call (younger than it), another thread's call, or an async one beside it: kept.
    assert _settle((_lagging(2.0), own), [call], stack, NOW, lambda name: "gloo")[0].pending is not None
    assert _settle((default, own), [call, _call("all_reduce", NOW - 7)], stack, NOW, lambda n: "gloo")[0] == default
    elsewhere = CallRecord("all_reduce", "1", 0, shapes=((4,),), dtypes=("float32",), params={}, site="loader.py:9",
                           function="<module>", started=NOW - 3.0)
    assert _settle((default, own), [elsewhere], stack, NOW, lambda name: "gloo")[0] == default


# The suite's DDP checkpoint job (tests/guard/scripts/long_job.py pauses, a quiet CI run, 2026-11-29): rank 0
# writes its snapshot alone after completing all_reduce #7; rank 1, in backward, waits in all_reduce #8 for it,
# while gloo still shows a broadcast #6 of rank 1's pending. A root's collective proves nothing by itself (it
# can complete on the root first), but all_reduce #7 could not complete on rank 0 without rank 1's part in it.
def _ddp_pair(rank0_completed: int):
    snapshotting = RankSnapshot(rank=0, status=RUNNING, where=Frame("long_job.py", 30, "save_snapshot"),
                                groups=(GroupProgress("0", last_enqueued=rank0_completed, last_completed=rank0_completed,
                                                      recent=(PendingOp("broadcast", 6, ((1,),), ("Int",), "completed"),
                                                              PendingOp("all_reduce", 7, ((165,),), ("Float",),
                                                                        "completed"))[:rank0_completed - 5]),))
    backward = RankSnapshot(rank=1, status=RUNNING, where=IN_BACKWARD[-1], stack=IN_BACKWARD,
                            groups=(GroupProgress("0", last_enqueued=8, last_completed=5,
                                                  pending=PendingOp("broadcast", 6, ((1,),), ("Int",), "started", 3.0),
                                                  recent=(PendingOp("broadcast", 6, ((1,),), ("Int",), "started"),
                                                          PendingOp("all_reduce", 7, ((165,),), ("Float",), "started"),
                                                          PendingOp("all_reduce", 8, ((165,),), ("Float",),
                                                                    "started"))),))
    return snapshotting, backward


def test_a_roots_stale_collective_is_settled_by_a_later_collective_every_rank_completed():
    [first, *_] = diagnose(list(_ddp_pair(rank0_completed=7)))
    assert first.id == "job.E002" and "all_reduce #8" in first.title and "broadcast" not in first.title, first.title


def test_a_broadcast_every_other_rank_completed_is_not_what_the_rank_that_issued_more_waits_in():
    # Rank 0 completed broadcast #6 and issued nothing after it; rank 1 issued all_reduce #7 and #8 after it.
    # Read as the recorder shows it, rank 0 "has not arrived at broadcast #6", its last collective #6.
    [first, *_] = diagnose(list(_ddp_pair(rank0_completed=6)))
    assert first.id == "job.E002" and "all_reduce #7" in first.title and "broadcast" not in first.title, first.title


# Lightning 2.6's per-step broadcast (its sigterm flag, Long[1], src=0) in the suite's Lightning job, a CI-equivalent
# run of 2026-11-29: rank 1 received #31 and sleeps in its step; rank 0, the root, waits in the all_reduce #32
# of its backward while gloo still shows its broadcast #31 pending. Named before: "Rank 1 has not arrived at
# broadcast #31", beside "its last collective: #31".
def _lightning_pair(rank1_enqueued: int, rank1_completed: int, heard: bool = True) -> list[RankSnapshot]:
    ops = tuple(PendingOp("broadcast" if seq % 2 else "all_reduce", seq, ((1,),) if seq % 2 else ((11,),),
                          ("Long",) if seq % 2 else ("Float",), "scheduled") for seq in range(29, 33))
    root = RankSnapshot(rank=0, status=RUNNING, where=IN_BACKWARD[-1], stack=IN_BACKWARD,
                        groups=(GroupProgress("0", last_enqueued=32, last_completed=30,
                                              pending=replace(ops[2], age_s=3.2), recent=ops),))
    if not heard:
        return [root]
    asleep = RankSnapshot(rank=1, status=RUNNING, where=Frame("lightning_job.py", 21, "training_step"),
                          stack=(Frame("lightning_job.py", 21, "training_step"),),
                          groups=(GroupProgress("0", last_enqueued=rank1_enqueued, last_completed=rank1_completed,
                                                recent=ops[:rank1_enqueued - 28]),))
    return [root, asleep]


def test_a_roots_broadcast_its_receiver_completed_is_settled_and_the_receiver_is_late_for_the_next():
    [first, *_] = diagnose(_lightning_pair(31, 31))
    assert first.id == "job.E002" and first.ranks == (1,), first.title
    assert "all_reduce #32" in first.title and "broadcast" not in first.title, first.title


def test_a_broadcast_the_other_rank_never_issued_or_not_heard_from_keeps_the_recorders_word():
    [first, *_] = diagnose(_lightning_pair(30, 30))  # rank 1 never issued #31: late for it, as the recorder says
    assert first.id == "job.E002" and "broadcast #31" in first.title, first.title
    alone = diagnose(_lightning_pair(31, 31, heard=False), world_size=2)
    assert all("all_reduce #32" not in f.title for f in alone), [f.title for f in alone]


# The suite's dead-prefetch job (tests/guard/scripts/long_job.py deadthread, a CI-equivalent run of 2026-11-29):
# both ranks completed an uneven all_to_all_single (#2) and build DDP, whose first construction imports
# torch._dynamo (seconds under load). Gloo still showed #2 pending on rank 1 past the 3 s hang timeout, and rank 0
# (which completed it) was named late for it: with --on-hang exit the guard would have ended a job that was only
# importing. Rank 0's completion of an all_to_all needed rank 1's part in it.
IMPORTING = (Frame("long_job.py", 56, "<module>"),
             Frame("/usr/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 850, "__init__"),
             Frame("<frozen importlib._bootstrap>", 1147, "_find_and_load"),
             Frame("/usr/lib/python3.11/site-packages/torch/distributed/_functional_collectives.py", 1, "<module>"),
             Frame("/usr/lib/python3.11/site-packages/torch/_dynamo/convert_frame.py", 210, "<module>"))
IN_ALL_TO_ALL = (Frame("long_job.py", 54, "<module>"),
                 Frame("/usr/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", 81, "wrapper"),
                 Frame("/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 4410,
                       "all_to_all_single"))


def _importing_pair(rank1_stack, op: str = "all_to_all") -> list[RankSnapshot]:
    done = PendingOp(op, 2, ((6,),), ("Float",), "completed")
    ahead = RankSnapshot(rank=0, status=RUNNING, where=IMPORTING[0], stack=IMPORTING,
                         groups=(GroupProgress("0", last_enqueued=2, last_completed=2, recent=(done,)),))
    behind = RankSnapshot(rank=1, status=RUNNING, where=rank1_stack[0], stack=rank1_stack,
                          groups=(GroupProgress("0", last_enqueued=2, last_completed=1,
                                                pending=replace(done, state="started", age_s=3.4),
                                                recent=(replace(done, state="started"),)),))
    return [ahead, behind]


def test_a_collective_every_rank_takes_part_in_is_not_waited_in_by_a_rank_that_is_importing():
    assert diagnose(_importing_pair(IMPORTING)) == []


def test_a_rank_still_in_the_call_or_behind_a_roots_collective_keeps_the_recorders_word():
    # Its main thread in the all_to_all itself (the data in flight, or a link that died under it): still in it.
    [first, *_] = diagnose(_importing_pair(IN_ALL_TO_ALL))
    assert "all_to_all #2" in first.title, first.title
    # A broadcast the root completed does not prove the receiver received it, wherever the receiver is.
    [first, *_] = diagnose(_importing_pair(IMPORTING, op="broadcast"))
    assert "broadcast #2" in first.title, first.title
    # A stack not known (no main thread read): nothing to go by.
    ahead, behind = _importing_pair(IMPORTING)
    [first, *_] = diagnose([ahead, replace(behind, stack=(), where=None)])
    assert "all_to_all #2" in first.title, first.title
