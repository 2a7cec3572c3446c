"""Point-to-point proof without a process group: a dropped send pairs with a receive only by group, peers,
tag and place in order (as gloo pairs them); anything else is a leak (guard.W013), never guard.E009."""

from __future__ import annotations

from types import SimpleNamespace

from distdoctor.diagnosis.snapshot import RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot
from distdoctor.embedded.guard import policy
from distdoctor.embedded.guard.record import MAX_P2P_KEYS, CallRecord, Recorder
from distdoctor.embedded.guard.verdict import decide
from distdoctor.embedded.guard.works import batch_parts, published


def snap(rank: int, where=("train.py", 30, "step"), waits_for: int | None = None) -> dict:
    """A rank of the default group; ``waits_for``: the peer of the receive it waits in."""
    frame = Frame(*where)
    pending = PendingOp("recv", None, ((4,),), ("float32",), "started", 7.0, peer=waits_for) if waits_for is not None else None
    group = GroupProgress("0", (0, 1), last_enqueued=4, last_completed=4, pending=pending)
    return RankSnapshot(rank=rank, status=RUNNING, groups=(group,), stack=(frame,), where=frame, source="guard").to_dict()


def send(seq: int, tag: int = 0, group: str = "0", peer: int = 1, age: float = 3.0, backend: str | None = "gloo",
         op: str = "isend") -> dict:
    record = CallRecord(op, group, seq, params={"peer": peer, "tag": tag}, site="a.py:3", function="main")
    return {**record.to_dict(), "age_s": age, "backend": backend}


def recv(seq: int, tag: int = 0, group: str = "0", peer=0) -> dict:
    return CallRecord("recv", group, seq, params={"peer": peer, "tag": tag}, site="a.py:9", function="main").to_dict()


def receives(*counts, complete: bool = True) -> dict:
    return {"counts": [list(c) for c in counts], "complete": complete}


def states(dropped: list, running: list, counts: dict, sender_where=("train.py", 12, "load")) -> dict:
    """Rank 0 dropped ``dropped`` and sleeps outside any collective; rank 1 waits in ``running``."""
    return {0: {"snapshot": snap(0, sender_where), "running": [], "dropped": dropped, "receives": receives()},
            1: {"snapshot": snap(1, waits_for=0), "running": running, "dropped": [], "receives": counts}}


def ids(found) -> list[str]:
    return [f.id for f in found]


def test_a_receive_in_the_dropped_sends_place_is_guard_e009_first_and_ends_the_job():
    found = decide(states([send(0)], [recv(0)], receives(("0", 0, 0, 1))), [0, 1], 7.0)
    assert ids(found) == ["guard.E009", "job.E002"] and found[0].ranks == (0,) and found[0].data["proven"] is True
    assert "Rank 0 dropped isend #0 to rank 1 at a.py:3 without wait(); rank 1 waits in recv #0 from rank 0" in found[0].title
    assert policy.cannot_finish(found) is found[0]


def test_a_send_dropped_long_ago_and_an_unrelated_receive_much_later_is_a_leak_not_a_deadlock():
    # Dropped at step 3 (send #3); rank 1's receive at step 400 is its #397 from rank 0 with tag 0.
    found = decide(states([send(3, age=600.0)], [recv(397)], receives(("0", 0, 0, 398))), [0, 1], 7.0)
    assert "guard.E009" not in ids(found) and policy.cannot_finish(found) is None
    assert ids(found) == ["job.E002"]  # rank 1 took its place (#3 was received): nothing leaked now


def test_a_dropped_send_with_another_tag_that_no_receive_took_is_a_warning_of_its_own():
    found = decide(states([send(0, tag=7, age=612.4)], [recv(0)], receives(("0", 0, 0, 1))), [0, 1], 7.0)
    assert ids(found) == ["job.E002", "guard.W013"] and policy.cannot_finish(found) is None
    leak = found[1]
    assert leak.title == "Rank 0 dropped isend #0 to rank 1 (tag 7) at a.py:3, 612.4 s ago; no receive waits for it"
    assert leak.severity.name == "WARNING" and leak.ranks == (0,)
    decision = policy.judge(found, "auto", world_known=True, stall_since_at=0.0, group_timeout_s=1800.0, now_at=10.0)
    assert decision.action == policy.WATCH


def test_a_leak_alone_is_no_verdict():
    quiet = {0: {"snapshot": snap(0), "running": [], "dropped": [send(0, tag=7)], "receives": receives()},
             1: {"snapshot": snap(1), "running": [], "dropped": [], "receives": receives()}}
    assert decide(quiet, [0, 1], 7.0) == []


def test_the_pairing_needs_the_same_group_tag_place_and_peers():
    counts = receives(("0", 0, 0, 3), ("1", 0, 0, 1))
    for dropped, waiting in ((send(1), recv(2)),                 # another place in order
                             (send(2, tag=5), recv(2)),          # another tag
                             (send(2, group="1"), recv(2)),      # another group
                             (send(2), recv(2, peer=3)),         # another sender
                             (send(2, peer=2), recv(2))):        # sent to another rank
        found = decide(states([dropped], [waiting], counts), [0, 1], 7.0)
        assert "guard.E009" not in ids(found), (dropped, waiting, ids(found))


def test_a_dropped_receive_is_never_paired_with_a_receive():
    dropped = {**CallRecord("irecv", "0", 0, params={"peer": 1, "tag": 0}, site="a.py:3").to_dict(), "backend": "gloo"}
    found = decide(states([dropped], [recv(0)], receives(("0", 0, 0, 1))), [0, 1], 7.0)
    assert ids(found) == ["job.E002"]


def test_a_receive_from_any_source_is_never_paired_and_says_why():
    found = decide(states([send(0)], [recv(0, peer="any")], receives(("0", "any", 0, 1))), [0, 1], 7.0)
    assert "guard.E009" not in ids(found) and ids(found)[-1] == "guard.W013"
    assert "from any source: which send it takes cannot be told" in found[-1].detail
    # A rank that ever received from any source with that tag: its places in order cannot be paired.
    mixed = receives(("0", 0, 0, 1), ("0", "any", 0, 2))
    assert "guard.E009" not in ids(decide(states([send(0)], [recv(0)], mixed), [0, 1], 7.0))


def test_counts_that_are_not_all_known_or_an_unnumbered_place_are_never_paired():
    partial = receives(("0", 5, 0, 9), complete=False)  # rank 0's key fell out of the counts shown
    assert "guard.E009" not in ids(decide(states([send(0)], [recv(0)], partial), [0, 1], 7.0))
    unnumbered = decide(states([send(-1)], [recv(-1)], receives(("0", 0, 0, 1))), [0, 1], 7.0)
    assert "guard.E009" not in ids(unnumbered)


def test_on_another_backend_the_pairing_is_said_but_not_proven():
    for backend in ("nccl", None):
        found = decide(states([send(0, backend=backend)], [recv(0)], receives(("0", 0, 0, 1))), [0, 1], 7.0)
        assert ids(found) == ["job.E002", "guard.E009"] and found[1].data["proven"] is False
        assert policy.cannot_finish(found) is None and "may still complete" in found[1].detail


def test_a_receiver_not_heard_from_gets_no_claim_either_way():
    found = decide({0: {"snapshot": snap(0), "running": [recv(0, peer=1)], "dropped": [send(0, peer=1)],
                        "receives": receives()}}, [0, 1], 7.0)
    assert "guard.E009" not in ids(found) and "guard.W013" not in ids(found)


def test_many_leaks_are_one_bounded_finding():
    dropped = [send(i, tag=100 + i, age=float(i)) for i in range(40)]
    found = decide(states(dropped, [recv(0)], receives(("0", 0, 0, 1))), [0, 1], 7.0)
    [leak] = [f for f in found if f.id == "guard.W013"]
    assert "(and 39 more dropped sends)" in leak.title and "isend #39" in leak.title  # the oldest named
    assert leak.data["count"] == 40 and len(leak.detail.splitlines()) <= 12


def test_p2p_places_count_per_group_direction_peer_and_tag():
    recorder = Recorder()
    seqs = [recorder.next_p2p_seq("0", op, peer, tag) for op, peer, tag in
            [("isend", 1, 7), ("send", 1, 0), ("isend", 1, 7), ("send_object_list", 1, 0), ("recv", 1, 7),
             ("irecv", 1, 7), ("recv", "any", 7)]]
    assert seqs == [0, 0, 1, 1, 0, 1, 0]
    assert recorder.receive_counts() == {"counts": [["0", 1, 7, 2], ["0", "any", 7, 1]], "complete": True}


def test_a_full_table_leaves_new_places_unnumbered_and_says_its_counts_are_not_complete():
    recorder = Recorder()
    for tag in range(MAX_P2P_KEYS):
        recorder.next_p2p_seq("0", "recv", 1, tag)
    assert recorder.next_p2p_seq("0", "recv", 1, 0) == 1       # a key already counted goes on
    assert recorder.next_p2p_seq("0", "send", 1, 0) == -1      # a new one is not counted from 0
    shown = recorder.receive_counts()
    assert shown["complete"] is False and len(shown["counts"]) == 64 and shown["counts"][-1] == ["0", 1, 0, 2]


def test_a_batch_numbers_each_op_as_a_lone_call_and_dropped_works_carry_age_and_backend():
    recorder = Recorder(clock=lambda: 100.0)
    recorder.next_p2p_seq("0", "isend", 1, 3)
    ops = [SimpleNamespace(op=SimpleNamespace(__name__="isend"), peer=1, tag=3, tensor=None),
           SimpleNamespace(op=SimpleNamespace(__name__="irecv"), peer=1, tag=3, tensor=None)]
    batch = CallRecord("batch_isend_irecv", "0", -1, params={"ops": "isend:1,irecv:1"}, site="a.py:5", started=90.0)
    parts = batch_parts(batch, ops, recorder)
    assert [(p.op, p.seq, p.params) for p in parts] == [("isend", 1, {"peer": 1, "tag": 3}),
                                                        ("irecv", 0, {"peer": 1, "tag": 3})]
    [entry] = published(parts[:1], 100.0, lambda group, devices: "gloo")
    assert (entry["age_s"], entry["backend"], entry["seq"], entry["site"]) == (10.0, "gloo", 1, "a.py:5")
