"""The policy's proof, without a process group: a hang is stuck only when no rank's connections moved,
point-to-point waits are a deadlock only in a cycle, a watched stall ends no earlier than torch and is a
warning while it lasts; the watchdog's own faults are named and backed off; the recorder is read again."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest

from distdoctor.core.findings import Severity
from distdoctor.diagnosis.diagnose import diagnose
from distdoctor.diagnosis.snapshot import RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot, Transport
from distdoctor.embedded.guard import policy, transport
from distdoctor.embedded.guard.channel import SideChannel
from distdoctor.embedded.guard.crash import CrashHook
from distdoctor.embedded.guard.flight import RETRY_FIRST_S, FlightRecorder
from distdoctor.embedded.guard.record import CallRecord, Recorder
from distdoctor.embedded.guard.stall import Backoff, Stall
from distdoctor.embedded.guard.watch import EpisodeWatch

from test_guard_episodes import FakeClock, FakeHost, MemoryStore, call, state, wait_until
from test_guard_job_units import fake_c10d


def in_collective(rank: int, seq: int = 9, group: str = "0", idle_s: float | None = None, op: str = "all_reduce",
                  members: tuple[int, ...] = (), age_s: float = 40.0) -> RankSnapshot:
    pending = PendingOp(op, seq, ((1 << 20,),), ("Float",), "scheduled", age_s)
    progress = GroupProgress(group, members, last_enqueued=seq, last_completed=seq - 1, pending=pending)
    moved = Transport(idle_s=idle_s, bytes=4_000_000, connections=1) if idle_s is not None else \
        Transport(note="backend nccl: cannot be read here")
    frame = Frame("train.py", 17, "step")
    return RankSnapshot(rank, status=RUNNING, groups=(progress,), stack=(frame,), where=frame, transport=moved)


def in_p2p(rank: int, op: str, peer: int | None) -> RankSnapshot:
    frame = Frame("train.py", 30, "exchange")
    pending = PendingOp(op, None, ((4,),), ("float32",), peer=peer)
    return RankSnapshot(rank, status=RUNNING, groups=(GroupProgress("0", pending=pending),), stack=(frame,), where=frame)


def test_every_rank_in_one_collective_is_stuck_only_when_no_rank_moved_data_for_30_s():
    stuck = diagnose([in_collective(r, idle_s=35.0) for r in range(4)], waited_s=40.0)
    assert [f.id for f in stuck] == ["job.E009"] and stuck[0].data["proven"] is True
    assert "nothing moves: no rank's connections received data for 35.0 s" in stuck[0].detail
    assert policy.cannot_finish(stuck) is stuck[0]
    # Half a stall of 5 s (the old window) or 15 s without data is no proof: TCP's backoff after a
    # link's outage is that silent, then delivers. Watched, and looked at again.
    for idle, waited in ((2.6, 5.0), (15.0, 20.0), (29.0, 40.0)):
        early = diagnose([in_collective(r, idle_s=idle) for r in range(4)], waited_s=waited)
        assert [f.id for f in early] == ["job.E009"] and early[0].data["proven"] is False, (idle, waited)
        assert f"no rank's connections received data for {idle:.1f} s: not yet proof that it is stuck" in early[0].detail
        assert policy.cannot_finish(early) is None
    # A stall of 100 s needs half of it silent (50 s): more than the floor; half is at most 60 s.
    assert diagnose([in_collective(r, idle_s=45.0, age_s=100.0) for r in range(2)], waited_s=100.0)[0].data["proven"] is False
    assert diagnose([in_collective(r, idle_s=60.0, age_s=900.0) for r in range(2)], waited_s=900.0)[0].data["proven"] is True
    # One rank of four whose connections carried data 0.3 s ago: slow, not stuck; watched, a warning.
    slow = diagnose([in_collective(r, idle_s=0.3 if r == 2 else 15.0) for r in range(4)], waited_s=20.0)
    assert [f.id for f in slow] == ["job.W011"] and slow[0].severity is Severity.WARNING
    assert slow[0].cause == "slow_link" and "rank 2's connections received data 0.3 s ago, 4.0 MB so far" in slow[0].detail
    assert policy.cannot_finish(slow) is None
    # NCCL (no socket shows its data) or a rank that could not be read: named, never proven, watched.
    unread = diagnose([in_collective(r, idle_s=15.0 if r else None) for r in range(2)], waited_s=20.0)
    assert [f.id for f in unread] == ["job.E009"] and unread[0].data["proven"] is False
    assert "could not be read on rank 0 (backend nccl: cannot be read here)" in unread[0].detail
    decision = judge(unread)
    assert decision.action == policy.WATCH and "that it no longer moves data is not proven" in decision.reason
    # A stack-told hang (stacks, explain: no transport at all) says nothing of motion, as before.
    told = diagnose([RankSnapshot(r, status=RUNNING, in_collective="all_reduce") for r in range(2)])
    assert told[0].id == "job.E009" and "moves" not in told[0].detail and told[0].data["proven"] is False


def test_a_collective_the_last_rank_just_entered_is_not_proven_stuck():
    """The late rank arrives as the ranks are asked: its data has not reached anyone yet."""
    arriving = [in_collective(r, idle_s=35.0) for r in range(3)]
    arriving[2] = RankSnapshot(2, status=RUNNING, groups=(GroupProgress(
        "0", last_enqueued=9, last_completed=8, pending=PendingOp("all_reduce", 9, ((1 << 20,),), ("Float",), "scheduled",
                                                                  0.4)),), transport=Transport(idle_s=35.0, bytes=10))
    [hang] = diagnose(arriving, waited_s=40.0)
    assert hang.id == "job.E009" and hang.data["proven"] is False and not policy.cannot_finish([hang])
    assert "rank 2 entered it 0.4 s ago: too recently to tell" in hang.detail
    # A look that finds the late rank arrived and the data moving is that stall ending, not a new verdict.
    [late] = diagnose([in_collective(0, idle_s=9.0), RankSnapshot(1, status=RUNNING, where=Frame("train.py", 12))])
    [slow] = diagnose([in_collective(r, idle_s=0.1) for r in range(2)], waited_s=10.0)
    assert policy.arriving([late], [slow]) and not policy.arriving([slow], [late])


def test_ranks_in_collectives_of_different_groups_are_a_deadlock_only_when_none_has_all_its_members():
    crossed = diagnose([in_collective(0, seq=3, group="1", members=(0, 1), idle_s=9.0),
                        in_collective(1, seq=7, group="0", members=(0, 1), idle_s=9.0)], waited_s=10.0)
    assert [f.id for f in crossed] == ["job.E006"] and "none of them has every member" in crossed[0].title
    assert policy.cannot_finish(crossed) is crossed[0]
    # Group 1 is ranks 0-1 and both are in it: it may complete (rank 2 waits for them), not a deadlock.
    waiting = diagnose([in_collective(0, seq=3, group="1", members=(0, 1), idle_s=0.2),
                        in_collective(1, seq=3, group="1", members=(0, 1), idle_s=0.2),
                        in_collective(2, seq=7, group="0", members=(0, 1, 2), idle_s=9.0)], waited_s=10.0)
    assert [f.id for f in waiting] == ["job.W011"]


def test_point_to_point_waits_are_a_deadlock_only_in_a_cycle_or_against_a_collective():
    cycle = diagnose([in_p2p(0, "recv", 1), in_p2p(1, "recv", 0)])
    assert cycle[0].id == "job.E006" and policy.cannot_finish(cycle)
    assert "rank 0 waits in recv from rank 1 (float32[4]) while rank 1 waits in recv from rank 0" in cycle[0].detail
    ring = diagnose([in_p2p(0, "recv", 1), in_p2p(1, "recv", 2), in_p2p(2, "recv", 0)])
    assert ring[0].id == "job.E006" and "ranks 0 -> 1 -> 2 -> 0 each wait for the next" in ring[0].detail
    against = diagnose([in_p2p(0, "recv", 1), in_collective(1, idle_s=9.0)], waited_s=10.0)
    assert against[0].id == "job.E006" and "while rank 1 waits in all_reduce #9" in against[0].detail
    # A send and the receive that matches it, merely slow: no deadlock; nothing proves it stuck.
    matched = diagnose([in_p2p(0, "send", 1), in_p2p(1, "recv", 0)])
    assert matched[0].id == "job.E009" and matched[0].data["proven"] is False and not policy.cannot_finish(matched)
    # A third rank waiting for one of the pair is waiting for a transfer in progress, not a cycle.
    chain = diagnose([in_p2p(0, "send", 1), in_p2p(1, "recv", 0), in_p2p(2, "recv", 1)])
    assert chain[0].id == "job.E009" and not policy.cannot_finish(chain)
    # py-spy's stacks know no peers: every rank receiving is still a deadlock (no rank sends) ...
    blind = diagnose([in_p2p(0, "recv", None), in_p2p(1, "recv", None)])
    assert blind[0].id == "job.E006" and "every rank receives and none sends" in blind[0].detail
    # ... while a send and a receive without peers cannot be told from a matched pair.
    unsure = diagnose([in_p2p(0, "send", None), in_p2p(1, "recv", None)])
    assert unsure[0].id == "job.E009" and not policy.cannot_finish(unsure)


def judge(findings, **given):
    values = {"world_known": True, "stall_since_at": 1000.0, "group_timeout_s": 30.0, "now_at": 1010.0, **given}
    return policy.judge(findings, "auto", **values)


def test_a_watched_stall_ends_no_earlier_than_the_groups_timeout_and_is_a_warning_until_then():
    [late] = diagnose([in_collective(0, idle_s=9.0), RankSnapshot(1, status=RUNNING, where=Frame("train.py", 12))])
    assert late.id == "job.E002" and late.severity is Severity.ERROR
    watched = judge([late])
    # The stall's start + the group's timeout + a grace, so that torch (whose timeout runs from the
    # collective's own start, up to a poll earlier) always ends it first.
    assert watched.action == policy.WATCH and watched.deadline_at == 1030.0 + policy.GRACE_S
    assert judge([late], now_at=1029.9).action == policy.WATCH  # a straggler arriving now still finishes
    assert judge([late], now_at=1030.0 + policy.GRACE_S).action == policy.END
    [shown] = policy.shown([late], watched)
    assert (shown.id, shown.severity, shown.title) == ("job.E002", Severity.WARNING, late.title)
    assert policy.shown([late], judge([late], now_at=1030.0 + policy.GRACE_S))[0].severity is Severity.ERROR
    assert policy.ended_by_torch(1032.0, [], now_at=1029.5, grace=2.0)
    assert not policy.ended_by_torch(1032.0, [], now_at=1028.5, grace=2.0)


def fake_dist(backends: dict) -> SimpleNamespace:
    """torch.distributed as transport.read_for sees it: groups named "0" (the default), "1", ... on ``backends``."""
    groups = {name: type("Group", (), {"name": name})() for name in backends}  # hashable, as torch's are
    c10d = SimpleNamespace(GroupMember=SimpleNamespace(WORLD=groups["0"]), _world=SimpleNamespace(pg_names={g: n for n, g in groups.items()}),
                           _get_default_store=lambda: SimpleNamespace(host="h", port=1))
    return SimpleNamespace(distributed_c10d=c10d, get_backend=lambda pg: backends[pg.name])


def test_the_proof_reads_the_stalled_groups_own_backend_for_its_ops_device():
    dist = fake_dist({"0": "gloo", "1": "nccl", "2": "cpu:gloo,cuda:nccl", "3": "storegroup"})
    recorder = Recorder()
    # An NCCL subgroup stalls while the default group is gloo: its traffic is on no socket, never read.
    assert "NVLink" in transport.read_for(dist, "1", recorder).note and transport.read_for(dist, "1").idle_s is None
    assert "is not known" in transport.read_for(dist, "3").note  # a backend a plugin registered
    assert "no process group named '7'" in transport.read_for(dist, "7").note
    # A multi-device group: the device of the guarded call that waits in it says which backend.
    assert "which of its backends" in transport.read_for(dist, "2", recorder).note  # no call: cannot tell
    waiting = CallRecord("all_reduce", "2", 0, shapes=((4,),), dtypes=("float32",), devices=("cuda",))
    recorder.begin(waiting)
    assert "NVLink" in transport.read_for(dist, "2", recorder).note
    waiting.devices = ("cpu",)
    on_cpu = transport.read_for(dist, "2", recorder)
    assert on_cpu.idle_s is not None or on_cpu.note.startswith("no TCP connection")  # gloo's: this process's connections read
    assert transport.group_backend(dist, "2", ("cpu",)) == "gloo" and transport.group_backend(dist, "7") is None
    assert transport.read_for(dist, None).note == transport.read_for(dist, "0").note  # the default group


def test_transport_reads_a_connections_idle_time_and_bytes_and_leaves_the_store_out():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        client.sendall(b"x" * 100_000)
        got = 0
        while got < 100_000:
            got += len(peer.recv(1 << 16))
        time.sleep(0.3)
        read = transport.read("gloo", excluded_ports=())
        assert read.connections >= 2 and read.idle_s is not None and 0.25 <= read.idle_s < 5
        assert read.bytes >= 100_000  # what the receiving end of this process got
        left_out = transport.read("gloo", excluded_ports={server.getsockname()[1]})
        assert left_out.connections == read.connections - 2
        assert transport.read("nccl", ()).idle_s is None and "NVLink" in transport.read("nccl", ()).note
        assert "which of its backends carries the stalled op is not known" in transport.read("cpu:gloo,cuda:nccl", ()).note
        assert transport.store_ports(SimpleNamespace(host="h", port=1234), env={"MASTER_PORT": "29500"}) == {1234, 29500}
    finally:
        for sock in (client, peer, server):
            sock.close()


def stalled_watch(host: FakeHost) -> tuple[EpisodeWatch, FakeClock]:
    """One rank's watchdog (hang timeout 4 s) whose guarded call has run for 5 s."""
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    watch = EpisodeWatch(host, recorder, SideChannel(MemoryStore(), "p"), hang_timeout=4, answer_s=0.05, poll_s=0.01,
                      on_hang="auto").start()
    recorder.begin(call())
    clock.now += 5
    return watch, clock


def test_a_crash_inside_the_diagnosis_is_named_as_such_and_its_looks_back_off():
    host = FakeHost(0, lambda: state(0, pending_seq=5))
    looks = []

    def broken(states, ranks, waited, world_known):
        looks.append(clock.now)
        raise KeyError("a diagnosis bug")

    host.decide = broken
    watch, clock = stalled_watch(host)
    try:
        assert wait_until(lambda: host.faults)
        time.sleep(0.3)  # about 30 polls
        assert [part for part, _ in host.faults] == ["diagnosis"] and isinstance(host.faults[0][1], KeyError)
        assert len(looks) == 1 and not host.shown  # no look every poll while the same stall holds
        clock.now += 1.1  # the back-off passed (hang_timeout / 4, at least 1 s): one more look
        assert wait_until(lambda: len(looks) == 2)
        time.sleep(0.2)
        assert len(looks) == 2 and watch.thread.is_alive()
    finally:
        watch.stop()


def test_a_look_that_finds_nothing_is_said_once_and_the_same_stall_is_looked_at_again_later_and_later():
    host = FakeHost(0, lambda: state(0))  # asked, this rank is in nothing: its own stall clock disagrees
    watch, clock = stalled_watch(host)
    try:
        assert wait_until(lambda: host.said)
        time.sleep(0.3)
        assert len([s for s in host.said if "cleared while the ranks were asked" in s]) == 1, host.said
        assert watch.board.latest() == 1  # one look asked
        for tries, step in ((2, 1.1), (3, 2.1), (4, 4.1)):  # 1 s, then 2 s, then 4 s: each retry twice as late
            clock.now += step - 0.2
            time.sleep(0.1)
            assert watch.backoff.tries == tries - 1  # not yet
            clock.now += 0.2
            assert wait_until(lambda: watch.backoff.tries == tries), (tries, watch.backoff.__dict__)
        assert len([s for s in host.said if "cleared while" in s]) == 1 and watch.ledger.read()[2] == 1
    finally:
        watch.stop()
    backoff = Backoff(1.0, 4.0)
    assert backoff.empty(Stall("0", 10.0), 0.0) == 1 and backoff.holds(Stall("0", 10.5), 0.9)
    assert not backoff.holds(Stall("0", 30.0), 0.9)  # a new stall is looked at at once


def test_a_failed_recorder_read_is_tried_again_with_backoff_and_a_good_read_brings_it_back():
    clock = FakeClock()
    fail = {"on": True}
    good = fake_c10d({"0": {"last_enqueued_collective": "9", "last_completed_collective": "8"}})
    c10d = SimpleNamespace(_dump_fr_trace_json=lambda **kw: (_ for _ in ()).throw(RuntimeError("busy"))
                           if fail["on"] else good._dump_fr_trace_json(**kw))
    fr = FlightRecorder(c10d, {}, clock=clock)
    assert fr.usable and fr.status() == {} and not fr.usable and "busy" in fr.problem
    clock.now += RETRY_FIRST_S
    assert fr.usable and fr.status() == {} and "2 times in a row" in fr.problem  # failed again: waits longer
    clock.now += RETRY_FIRST_S
    assert not fr.usable
    clock.now += RETRY_FIRST_S
    fail["on"] = False
    assert fr.usable and fr.status() == {"0": (9, 8)} and fr.usable and fr.problem == ""
    assert fr.off == ""  # never turned off for the run


def test_a_failed_calls_final_is_withdrawn_when_the_rank_goes_on_and_replaced_at_a_clean_end():
    store = MemoryStore()
    side = SideChannel(store, "p")
    recorder = Recorder()
    faults = []
    guard = SimpleNamespace(rank=1, world=2, recorder=recorder, flight=None, shut_down=False, concluded=False,
                            final_left=False, settings=SimpleNamespace(poll_s=0.01, answer_s=0.05),
                            watch=SimpleNamespace(side=side), fault=lambda part, exc: faults.append(part))

    def leave_final(value):
        guard.final_left = True
        side.put(side.key("final", 1), {**value, "final": True})

    guard.leave_final = leave_final
    guard.state = lambda status, **given: {"snapshot": RankSnapshot(1, status=status).to_dict()}
    guard.failed_wait = lambda tb: None
    hook = CrashHook(guard)
    recorder.end(recorder.begin(call()), failed=True)
    try:
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")
    except RuntimeError as exc:
        hook.verdict(exc, exc.__traceback__, [0, 1], call=call())
    assert side.there(side.key("final", 1)) and hook.provisional
    time.sleep(0.1)
    assert side.there(side.key("final", 1))  # no new call yet: it stands
    recorder.begin(call(6))  # the user's code caught the error and goes on
    assert wait_until(lambda: not side.there(side.key("final", 1)))
    assert not guard.final_left and not hook.provisional and not faults
    # Caught, and the rank then left without another call: its clean end replaces the final.
    hook.provisional, guard.final_left = True, True
    assert hook.withdrawn() and not hook.withdrawn()
    # Uncaught: the exception hook confirms the final (it stands at shutdown).
    hook.provisional = True
    guard.concluded = True
    hook.on_exception(RuntimeError("x"), None)
    assert not hook.withdrawn()
    threading.Event().wait(0.05)


def _leaving(status: str, error: BaseException) -> list[str]:
    """What a rank says when its final state (``status``) could not be left because of ``error``."""
    from distdoctor.embedded.guard.process import Guard

    noted: list[str] = []
    watch = SimpleNamespace(channel_error=None)

    def publish(kind, value):
        watch.channel_error = error
        return f"{type(error).__name__}: {error}"

    watch.publish = publish
    guard = SimpleNamespace(final_left=False, watch=watch, note=noted.append)
    Guard.leave_final(guard, {"snapshot": RankSnapshot(1, status=status).to_dict()})
    assert guard.final_left
    return noted


def test_a_rank_that_finished_after_the_stores_host_ended_says_nothing_of_its_final_state():
    # Every rank done, rank 0 (the store's host) out first: a rank reaching the store through a slow link found it
    # closed when it left its final state ("closed the connection", said on a healthy job). No peer can wait on it.
    from distdoctor.world.store_wire import StoreWireError

    closed = StoreWireError("the store at 127.0.0.1:45679 closed the connection ([Errno 32] Broken pipe)", gone=True)
    assert _leaving("finished", closed) == []
    # A store that does not answer in time may still be read by a peer; and a rank that raised says it either way.
    slow = StoreWireError("the store at 127.0.0.1:45679 did not answer within 2 s", timed_out=True)
    assert "was not left in the job's store" in _leaving("finished", slow)[0]
    assert "its final state (raised) was not left" in _leaving("raised", closed)[0]


def _answered_look(asked_s_ago: float) -> dict:
    """What rank 1's crash hook knows of rank 0 when rank 0's own watchdog owned the stall's episode and rank 1
    answered its look ``asked_s_ago`` seconds before torch's timeout raised on rank 1."""
    from distdoctor.embedded.guard.looks import Board

    side = SideChannel(MemoryStore(), "p")
    side.put(side.key("look", 3, "request"), {"rank": 0, "group": "0", "t": time.time() - asked_s_ago})
    evaluating = RankSnapshot(0, status=RUNNING, where=Frame("policy_job.py", 27, "evaluate"),
                              stack=(Frame("policy_job.py", 82, "<module>"), Frame("policy_job.py", 27, "evaluate")))
    side.publish("look/3/state", 0, {"snapshot": evaluating.to_dict(), "running": [], "dropped": []})
    board = Board(side, 1)
    board.answered = 3
    guard = SimpleNamespace(rank=1, world=2, watch=SimpleNamespace(own=None, latest=None, board=board, side=side))
    return CrashHook(guard)._last_seen()


def test_a_late_rank_seen_by_a_look_another_rank_asked_is_named_at_its_line_when_torch_ends_the_wait():
    seen = _answered_look(asked_s_ago=6.0)
    assert seen[0]["where"]["line"] == 27 and "as it answered the guard's look 3" in seen[0]["notes"]
    assert _answered_look(asked_s_ago=60.0) == {}  # an old look says nothing of now
