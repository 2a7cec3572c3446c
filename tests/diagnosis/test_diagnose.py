"""The one diagnosis over per-rank snapshots: the order of causation, the ranks and lines it names."""

from __future__ import annotations

from dataclasses import replace

import pytest

from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.frames import is_user_file, parse_frame, user_frame
from distdoctor.diagnosis.snapshot import (Frame, GroupProgress, PendingOp, RaisedError, RankSnapshot)

BACKWARD = Frame("train.py", 25, "main", "loss.backward()")
SLEEP = Frame("train.py", 18, "main", "time.sleep(120)")


def waiting(rank: int, seq: int = 12, op: str = "all_reduce", sizes=((4,),), dtypes=("Float",)) -> RankSnapshot:
    pending = PendingOp(op, seq, sizes, dtypes, "scheduled", 10.0)
    return RankSnapshot(rank, host="node-a", status="running", where=BACKWARD,
                        groups=(GroupProgress("0", (0, 1), seq, seq - 1, pending),))


def idle(rank: int, last: int = 11) -> RankSnapshot:
    return RankSnapshot(rank, host="node-b", status="running", where=SLEEP,
                        groups=(GroupProgress("0", (0, 1), last, last),))


def only(findings):
    assert len(findings) == 1, [f.id for f in findings]
    return findings[0]


def test_a_rank_outside_any_collective_is_the_straggler_with_both_lines():
    finding = only(diagnose([waiting(0), idle(1)]))
    assert (finding.id, finding.cause, finding.ranks, finding.hosts) == ("job.E002", "straggler_rank", (1,), ("node-b",))
    assert "all_reduce #12" in finding.title and "`time.sleep(120)` at train.py:18" in finding.title
    assert "rank 0 waits in all_reduce #12" in finding.detail and "`loss.backward()` at train.py:25" in finding.detail
    assert finding.data["late"] == [1] and finding.data["seq"] == 12


def test_the_first_exception_is_the_cause_and_the_peers_failure_its_consequence():
    raised = RankSnapshot(1, status="raised", exit_code=1, time=100.0,
                          error=RaisedError("ValueError", "bad batch on rank 1", Frame("train.py", 31, "main"), 100.0))
    peer = RankSnapshot(0, status="raised", exit_code=1, time=101.0,
                        error=RaisedError("RuntimeError", "Connection closed by peer", None, 101.0, consequence=True))
    finding = only(diagnose([peer, raised]))
    assert (finding.id, finding.cause, finding.ranks) == ("job.E001", "worker_exception", (1,))
    assert "ValueError" in finding.title and "train.py:31" in finding.detail
    assert "rank 0 failed with RuntimeError: Connection closed by peer" in finding.detail


def test_of_two_own_exceptions_the_earlier_is_the_cause():
    late = RankSnapshot(0, status="raised", error=RaisedError("KeyError", "'x'", None, 200.0))
    early = RankSnapshot(1, status="raised", error=RaisedError("OSError", "disk full", None, 150.0))
    assert only(diagnose([late, early])).ranks == (1,)


@pytest.mark.parametrize("code, kind, cause", [(-9, "job.E005", "oom_killed_rank"), (-11, "job.E004", "rank_missing"),
                                               (3, "job.E004", "rank_missing")])
def test_a_rank_ended_by_a_signal_or_an_unexplained_exit(code, kind, cause):
    status = "killed" if code < 0 else "exited"
    finding = only(diagnose([waiting(0), RankSnapshot(1, status=status, exit_code=code)]))
    assert (finding.id, finding.cause, finding.ranks) == (kind, cause, (1,))


def test_the_launchers_sigterm_is_a_consequence_not_a_cause():
    finding = only(diagnose([RankSnapshot(0, status="killed", exit_code=-15),
                             RankSnapshot(1, status="raised", error=RaisedError("ValueError", "x"))]))
    assert finding.ranks == (1,) and finding.cause == "worker_exception"


def test_a_rank_that_exited_cleanly_while_others_wait_had_fewer_batches():
    left = RankSnapshot(1, status="exited", exit_code=0, groups=(GroupProgress("0", (), 11, 11),))
    finding = only(diagnose([waiting(0), left]))
    assert (finding.id, finding.cause, finding.ranks) == ("job.E003", "uneven_inputs", (1,))
    assert "its last collective in the default group: #11" in finding.detail and "Join" in finding.remediation


def test_a_rank_that_left_after_completing_the_collective_others_wait_in_proves_their_view_old():
    # The guard's look took rank 0's answer (waiting in #12), then rank 1 arrived, both completed #12
    # and more, and rank 1 left: its last word (#16) is newer than rank 0's. No rank is named.
    left = RankSnapshot(1, status="exited", exit_code=0, groups=(GroupProgress("0", (), 16, 16),))
    assert [f.id for f in diagnose([waiting(0), left])] == []
    # The twin: it left at #11, before the collective rank 0 waits in: uneven inputs.
    left = RankSnapshot(1, status="exited", exit_code=0, groups=(GroupProgress("0", (), 11, 11),))
    assert only(diagnose([waiting(0), left])).id == "job.E003"


def test_a_rank_that_never_answered_is_missing():
    finding = only(diagnose([waiting(0)], world_size=2))
    assert (finding.id, finding.ranks) == ("job.E004", (1,))


def test_every_rank_in_the_same_collective_is_a_hang():
    finding = only(diagnose([waiting(0), waiting(1)], waited_s=30.0))
    assert finding.id == "job.E009" and finding.ranks == (0, 1)


@pytest.mark.parametrize("change, kind", [({"op": "broadcast"}, "job.E006"), ({"sizes": ((5,),)}, "job.E007"),
                                          ({"dtypes": ("Half",)}, "job.E008")])
def test_ranks_that_disagree_at_one_sequence_number(change, kind):
    args = {"op": "all_reduce", "sizes": ((4,),), "dtypes": ("Float",), **change}
    finding = only(diagnose([waiting(0), waiting(1), waiting(2, **args)]))
    assert finding.id == kind and finding.ranks == (2,)


def test_ranks_waiting_at_different_sequence_numbers_issued_different_collectives():
    finding = only(diagnose([waiting(0, seq=12), waiting(1, seq=13), waiting(2, seq=12)]))
    assert finding.id == "job.E006" and finding.ranks == (1,)


def test_a_healthy_job_has_no_finding():
    assert diagnose([idle(0), idle(1)]) == []
    assert diagnose([]) == []


def test_snapshots_survive_json_and_hostile_input_is_not_an_exception():
    snap = waiting(0)
    assert RankSnapshot.from_dict(snap.to_dict()) == snap
    assert RankSnapshot.from_dict({"rank": "x"}) is None
    odd = RankSnapshot.from_dict({"rank": 3, "status": "bogus", "groups": [7, {"group": "0", "last_enqueued": "nan"}],
                                  "stack": "no", "error": {"type": ""}, "where": {"file": ""}})
    assert odd.status == "unknown" and odd.groups[0].last_enqueued is None and odd.error is None and odd.where is None


def test_the_users_frame_is_the_innermost_outside_torch_and_the_stdlib():
    stack = [Frame("train.py", 40, "main"), Frame("/usr/lib/python3.11/site-packages/torch/_tensor.py", 600, "backward"),
             Frame("/usr/lib/python3.11/threading.py", 300, "wait")]
    assert user_frame(stack) == stack[0]
    assert not is_user_file("<frozen importlib._bootstrap>")
    assert parse_frame("train.py:12 in <module>") == Frame("train.py", 12, "<module>")


def failed_waiting(rank: int, message: str = "Connection closed by peer [127.0.0.1]:9429") -> RankSnapshot:
    """A rank as a log shows it: it gave up inside all_reduce with a peer's failure and ended."""
    return RankSnapshot(rank, status="raised", exit_code=1, in_collective="all_reduce",
                        error=RaisedError("RuntimeError", message, BACKWARD, consequence=True))


def test_a_rank_that_failed_inside_a_collective_with_a_peers_failure_counts_as_waiting():
    left = RankSnapshot(0, status="exited", exit_code=0)
    finding = only(diagnose([left, failed_waiting(1)]))
    assert (finding.id, finding.cause, finding.ranks) == ("job.E003", "uneven_inputs", (0,))
    assert "rank 1 failed in all_reduce" in finding.detail and "Connection closed by peer" in finding.detail
    late = RankSnapshot(1, status="running")
    assert only(diagnose([failed_waiting(0, "Timed out waiting 5000ms for recv operation to complete"), late])).id == "job.E002"
    assert only(diagnose([failed_waiting(0), RankSnapshot(1, status="unknown")])).id == "job.E004"
    assert only(diagnose([failed_waiting(0), failed_waiting(1)])).id == "job.E009"


def test_a_rank_that_left_the_job_waits_in_nothing_whatever_its_error():
    left = RankSnapshot(0, status="finished", error=RaisedError("RuntimeError", "Connection closed by peer",
                                                                  consequence=True))
    assert diagnose([left, RankSnapshot(1, status="exited", exit_code=0)]) == []


def test_a_thousand_ranks_failing_alike_are_said_once_as_ranges():
    raised = RankSnapshot(0, status="raised", error=RaisedError("ValueError", "x", None, 1.0))
    peers = [failed_waiting(r, f"Connection closed by peer [127.0.0.1]:{9000 + r}") for r in range(1, 1024)]
    finding = only(diagnose([raised] + peers))
    assert finding.id == "job.E001" and "ranks 1-1023 failed with RuntimeError" in finding.detail
    assert "differ only in numbers" in finding.detail  # each peer's message names its own port
    assert len(finding.detail.splitlines()) <= 3 and len(finding.detail) < 2_000


def failed_in_collective(rank: int) -> RankSnapshot:
    """A rank whose collective failed because of a peer ("Connection closed by peer"): it was waiting."""
    return RankSnapshot(rank, status="raised", where=BACKWARD, in_collective="all_reduce #12 (Float[4])",
                        error=RaisedError("RuntimeError", "Connection closed by peer", BACKWARD, 101.0, consequence=True))


def test_a_rank_whose_collective_failed_after_a_peer_left_is_uneven_inputs_not_silence():
    left = RankSnapshot(1, status="finished", where=Frame("train.py", 40, "main", "dist.destroy_process_group()"),
                        groups=(GroupProgress("0", (0, 1), 11, 11),))
    finding = only(diagnose([failed_in_collective(0), left]))
    assert (finding.id, finding.ranks) == ("job.E003", (1,))
    assert "rank 0 failed in all_reduce #12 (Float[4]) of the default group at `loss.backward()`" in finding.detail


def test_a_rank_whose_collective_failed_after_a_peer_vanished_names_the_missing_rank():
    gone = RankSnapshot(1, status="unreachable", notes=("its process is gone",))
    finding = only(diagnose([failed_in_collective(0), gone]))
    assert (finding.id, finding.ranks) == ("job.E004", (1,)) and "its process is gone" in finding.detail


def test_a_collective_another_rank_completed_is_not_what_a_rank_waits_in():
    # Gloo marks completion late: rank 1 sleeps in its data loader, its recorder still shows #11 pending.
    lagging = RankSnapshot(1, status="running", where=SLEEP, stack=(SLEEP,), groups=(
        GroupProgress("0", (0, 1), 11, 10, PendingOp("all_reduce", 11, ((4,),), ("Float",), "scheduled", 2.1)),))
    finding = only(diagnose([waiting(0, seq=12), lagging]))
    assert (finding.id, finding.ranks) == ("job.E002", (1,)) and "all_reduce #12" in finding.title
    # In a torch call (its innermost frame is torch's), the same recorder counts stand: it waits there.
    inside = replace(lagging, stack=(SLEEP, Frame("/x/site-packages/torch/distributed/distributed_c10d.py", 3000, "wait")))
    assert only(diagnose([waiting(0, seq=12), inside])).id == "job.E006"


def test_a_rank_that_left_waits_in_nothing_even_when_its_recorder_lags():
    left = RankSnapshot(1, status="finished", groups=(
        GroupProgress("0", (0, 1), 11, 10, PendingOp("all_reduce", 11, ((4,),), ("Float",), "scheduled", 0.3)),))
    finding = only(diagnose([waiting(0, seq=12), left]))
    assert (finding.id, finding.ranks) == ("job.E003", (1,))


def test_a_rank_that_ended_with_an_exit_status_nobody_saw_is_missing():
    # `distdoctor stacks` finds no process of rank 1 (its launcher reaped it): ended, code unknown.
    gone = RankSnapshot(1, status="exited", notes=("no process of this rank on this node",))
    finding = only(diagnose([waiting(0), gone]))
    assert (finding.id, finding.cause, finding.ranks) == ("job.E004", "rank_missing", (1,))
    assert "ended while the others wait" in finding.title and "no process of this rank" in finding.detail


def test_every_rank_in_a_recv_is_a_cycle_of_point_to_point_calls_not_a_transport_fault():
    finding = only(diagnose([waiting(0, op="recv", sizes=(), dtypes=()), waiting(1, op="recv", sizes=(), dtypes=())]))
    assert finding.id == "job.E006" and "point-to-point" in finding.title and "batch_isend_irecv" in finding.remediation


def test_a_lone_rank_that_exited_is_not_said_to_have_peers():
    finding = only(diagnose([RankSnapshot(0, status="exited", exit_code=7)]))
    assert finding.title == "Rank 0 exited with code 7"


def test_uneven_all_to_all_split_sizes_are_legal_but_uneven_all_reduce_sizes_are_not():
    # Every mixture-of-experts layer sends each rank a different number of tokens.
    a2a = diagnose([waiting(0, op="all_to_all", sizes=((3,),)), waiting(1, op="all_to_all", sizes=((5,),))])
    assert [f.id for f in a2a] == ["job.E009"], [f.title for f in a2a]
    objects = diagnose([waiting(0, op="all_gather_object", sizes=((12,),)),
                        waiting(1, op="all_gather_object", sizes=((40,),))])
    assert "job.E007" not in [f.id for f in objects]
    twin = diagnose([waiting(0, sizes=((3,),)), waiting(1, sizes=((5,),))])
    assert "job.E007" in [f.id for f in twin]


def p2p(rank: int, op: str, peer: int | None) -> RankSnapshot:
    pending = PendingOp(op, None, ((4,),), ("float32",), "started", 9.0, peer=peer)
    return RankSnapshot(rank, status="running", where=BACKWARD, in_collective=op,
                        groups=(GroupProgress("0", (0, 1), 3, 3, pending),))


def test_two_ranks_receiving_from_each_other_are_a_cycle_with_their_peers_named():
    finding = only(diagnose([p2p(0, "recv", 1), p2p(1, "recv", 0)]))
    assert finding.id == "job.E006", finding.title
    assert "rank 0 waits in recv from rank 1 (float32[4]) while rank 1 waits in recv from rank 0" in finding.detail
    # The same state as `stacks` sees it (the op's name, no peer) gives the same finding.
    bare = [RankSnapshot(r, status="running", where=BACKWARD, in_collective="recv") for r in (0, 1)]
    assert only(diagnose(bare)).id == "job.E006"
    # A receive whose sender waits in a collective cannot match either.
    mixed = only(diagnose([p2p(0, "recv", 1), waiting(1)]))
    assert mixed.id == "job.E006" and "rank 1 waits in all_reduce #12" in mixed.detail, mixed.detail
    # The healthy twin: a send meets its receive, nothing is stuck in a cycle.
    assert diagnose([p2p(0, "send", 1), idle(1)])[0].id == "job.E002"


def test_a_thread_that_died_in_the_late_rank_is_shown_with_the_stall():
    dead = RaisedError("ConnectionError", "storage gone", Frame("loader.py", 12, "prefetch"), 90.0, thread="prefetch")
    late = replace(idle(1), thread_errors=(dead,))
    finding = only(diagnose([waiting(0), late]))
    assert finding.id == "job.E002"
    assert "rank 1: its thread 'prefetch' died with ConnectionError at loader.py:12 in prefetch: storage gone" in finding.detail
    again = RankSnapshot.from_dict(late.to_dict())
    assert again.thread_errors == (dead,)


@pytest.mark.parametrize("names, message, expected", [
    (["RuntimeError"], "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error", True),
    (["DistBackendError", "RuntimeError"], "NCCL error in: ProcessGroupNCCL.cpp:1234, unhandled system error", True),
    (["DistStoreError", "DistError", "RuntimeError"], "wait timeout after 30000ms", True),
    (["TimeoutError", "OSError"], "Read timed out.", False),                       # the user's own, whatever it says
    (["ReadTimeout", "Timeout", "RequestException", "OSError"], "Read timed out. (read timeout=5)", False),
    (["RuntimeError"], "Connection closed by peer", False),                         # words alone prove nothing
    (["RuntimeError"], "[my_ext/kernel.cpp:10] bad input", False),                  # a C++ error, not torch.distributed's
])
def test_an_exception_is_a_peers_consequence_by_its_origin_not_its_words(names, message, expected):
    from distdoctor.diagnosis.origin import from_torch_distributed

    assert from_torch_distributed(names, message) is expected


def test_a_rank_waiting_in_the_stdlib_outside_torch_is_where_the_others_completed_count_says():
    # Rank 1 left all_reduce #10 (rank 0 completed it and waits in #11) and blocks in queue.get;
    # gloo has not yet marked #10 completed in rank 1's recorder.
    queue_wait = (Frame("train.py", 67, "<module>", "batches.get()"), Frame("/usr/lib/python3.11/queue.py", 180, "get"))
    stale = RankSnapshot(1, status="running", stack=queue_wait, where=queue_wait[0],
                         groups=(GroupProgress("0", (0, 1), 10, 9, PendingOp("all_reduce", 10, ((4,),), ("Float",))),))
    ahead = replace(waiting(0, seq=11), groups=(GroupProgress("0", (0, 1), 11, 10,
                                                              PendingOp("all_reduce", 11, ((4,),), ("Float",))),))
    finding = only(diagnose([ahead, stale]))
    assert (finding.id, finding.ranks) == ("job.E002", (1,)), finding.title
