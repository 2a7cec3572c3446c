"""The watchdog's episodes over an in-memory store: opened past hang_timeout, watched or ended by the policy,
closed with who arrived after how long, detection going on after them; the record stays bounded."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from distdoctor.core.findings import Finding, Severity
from distdoctor.diagnosis.snapshot import RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot
from distdoctor.embedded.guard import cadence, episodes, policy
from distdoctor.embedded.guard.channel import SideChannel
from distdoctor.embedded.guard.findings import FAULT
from distdoctor.embedded.guard.record import CallRecord, Recorder
from distdoctor.embedded.guard.stall import Stall, StallClock
from distdoctor.embedded.guard.verdict import decide
from distdoctor.embedded.guard.watch import EpisodeWatch


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class MemoryStore:
    """The TCPStore calls the side channel makes, in memory (compare_set, add, check, delete_key): a store
    without torch's extended API (append and multi_get are made from these)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.broken = False

    def _ok(self) -> None:
        if self.broken:
            raise ConnectionResetError("the store is gone")

    def set(self, key, value):
        self._ok()
        with self.lock:
            self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        self._ok()
        return self.data[key]

    def check(self, keys):
        self._ok()
        return all(k in self.data for k in keys)

    def compare_set(self, key, expected, desired):
        self._ok()
        with self.lock:
            if key not in self.data and expected != "":  # as TCPStore: nothing set, the expected value back
                return expected.encode()
            if (key not in self.data and expected == "") or self.data.get(key) == expected.encode():
                self.data[key] = desired.encode()
            return self.data[key]

    def add(self, key, amount):
        self._ok()
        with self.lock:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            return value

    def delete_key(self, key):
        self._ok()
        with self.lock:
            return self.data.pop(key, None) is not None


def state(rank: int, pending_seq: int | None = None, where=("train.py", 30, "step"), done: int = 4) -> dict:
    pending = PendingOp("all_reduce", pending_seq, ((4,),), ("Float",), "scheduled", 7.0) if pending_seq is not None else None
    group = GroupProgress("0", (0, 1), last_enqueued=pending_seq if pending_seq is not None else done,
                          last_completed=done, pending=pending)
    frame = Frame(*where)
    snap = RankSnapshot(rank=rank, status=RUNNING, groups=(group,), stack=(frame,), where=frame, source="guard")
    return {"snapshot": snap.to_dict(), "running": [], "dropped": []}


class FakeHost:
    """What the watchdog asks of its Guard, recorded; `end` does not end the test process."""

    def __init__(self, rank: int, make_state, timeout_s: float | None = None) -> None:
        self.rank, self.started, self.make_state, self.timeout_s = rank, 0.0, make_state, timeout_s
        self.shown: list = []
        self.said: list[str] = []
        self.noted: list[str] = []
        self.ended: list = []
        self.faults: list = []
        self.concluded = False  # set by the watchdog once a verdict ends the job (the exception hook then stays quiet)
        self.concluded_at_end: list[bool] = []

    def state(self, group=None):
        return self.make_state()

    def group_ranks(self, name):
        return [0, 1]

    def group_timeout(self, name):
        return self.timeout_s

    def group_grace(self, name):
        return policy.grace_s("gloo")

    def decide(self, states, ranks, waited, world_known):
        return decide(states, ranks, waited, world_known=world_known)

    def show(self, findings, heading, ranks, decision):
        self.shown.append((findings, heading, decision))
        return "report"

    def say(self, line):
        self.said.append(line)

    def note(self, line):
        self.noted.append(line)

    def end(self, report, why, rendered_here, findings=None):
        self.concluded_at_end.append(self.concluded)
        self.ended.append((why, rendered_here, findings))

    def fault(self, part, exc):
        self.faults.append((part, exc))

    def stalls_changed(self):
        pass


def call(seq: int = 5) -> CallRecord:
    return CallRecord(op="all_reduce", group="0", seq=seq, shapes=((4,),), dtypes=("float32",), devices=("cpu",),
                      params={"op": "SUM"}, site="train.py:30", function="step")


def wait_until(predicate, timeout_s: float = 10.0, clock: "FakeClock | None" = None, watches=None) -> bool:
    """Whether ``predicate`` holds within ``timeout_s``. With the watchdogs' fake clock: a look that gave no verdict
    (its answers were not one moment, as on a loaded machine: CI once) is looked at again after a back-off in that
    clock, which moves only when the test moves it; the back-off's time is let pass, as it would in a job."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        if clock is not None:
            held = [w.backoff.until for w in watches.values() if w.backoff.stall is not None]
            if held and max(held) > clock.now:
                clock.now = max(held) + 0.01
        time.sleep(0.01)
    return predicate()


def two_ranks(on_hang: str, timeout_s: float | None = None):
    """Rank 0 stalls in a guarded all_reduce; rank 1 is outside any collective (a straggler)."""
    store, clock = MemoryStore(), FakeClock()
    recorders = {r: Recorder(clock=clock) for r in (0, 1)}
    stalled = {"on": False}
    hosts = {0: FakeHost(0, lambda: state(0, pending_seq=5) if stalled["on"] else state(0), timeout_s),
             1: FakeHost(1, lambda: state(1, where=("train.py", 12, "load")), timeout_s)}
    watches = {r: EpisodeWatch(hosts[r], recorders[r], SideChannel(store, "p"), hang_timeout=5, answer_s=1.0,
                            poll_s=0.01, on_hang=on_hang) for r in (0, 1)}
    for watch in watches.values():
        watch.start()

    def stall() -> int:
        stalled["on"] = True
        return recorders[0].begin(call())

    def clear(token: int) -> None:
        stalled["on"] = False
        recorders[0].end(token)

    return store, clock, hosts, watches, stall, clear


def test_a_straggler_is_reported_and_watched_then_closed_and_the_next_stall_is_reported_too():
    store, clock, hosts, watches, stall, clear = two_ranks("auto", timeout_s=1800)
    try:
        began, token = clock.now, stall()
        clock.now += 6
        assert wait_until(lambda: hosts[0].shown and watches[0].own is not None, clock=clock, watches=watches)
        [(findings, heading, decision)] = hosts[0].shown
        assert findings[0].id == "job.E002" and findings[0].ranks == (1,) and "[stall 1]" in heading
        assert decision.action == policy.WATCH and "1800 s" in decision.reason
        assert not hosts[0].ended and not hosts[1].ended  # a live rank outside the collective: nothing ends
        assert wait_until(lambda: watches[1].following is not None)
        clock.now += 3  # rank 1 arrives 9 s after the stall began (more if a look had to be taken again)
        first = clock.now - began
        clear(token)
        assert wait_until(lambda: watches[0].own is None)
        assert any(line.startswith(f"rank 1 arrived after {first:.1f} s (all_reduce #5 of the default group); stall 1 is "
                                   "over") for line in hosts[0].said), hosts[0].said
        records, omitted, total = watches[1].ledger.read()  # any rank reads every episode
        assert total == 1 and records[0]["seconds"] == pytest.approx(first) and records[0]["late_rank"] == 1
        assert records[0]["verdict"] == "job.E002" and records[0]["where"] == "train.py:12"
        # Detection goes on: a second stall later is a second episode.
        began, token = clock.now, stall()
        clock.now += 7
        assert wait_until(lambda: len(hosts[0].shown) == 2, clock=clock, watches=watches)
        assert "[stall 2]" in hosts[0].shown[1][1]
        second = clock.now - began
        clear(token)
        assert wait_until(lambda: watches[0].own is None)
        records, _, total = watches[0].ledger.read()
        assert total == 2 and [r["seconds"] for r in records] == [pytest.approx(first), pytest.approx(second)]
        assert not hosts[0].ended and not hosts[1].ended and not hosts[0].faults
    finally:
        for watch in watches.values():
            watch.stop()


@pytest.mark.parametrize("on_hang", ["exit", "report"])
def test_exit_ends_every_rank_at_the_first_verdict_and_report_never_ends(on_hang):
    store, clock, hosts, watches, stall, clear = two_ranks(on_hang, timeout_s=1800)
    try:
        stall()
        clock.now += 6
        assert wait_until(lambda: hosts[0].shown, clock=clock, watches=watches)
        if on_hang == "exit":
            assert wait_until(lambda: hosts[0].ended and hosts[1].ended)
            assert hosts[0].ended[0][1] is True  # rank 0 decided (its report is printed)
            # Concluded before the wait for the others: the error the others' end then raises here is not a new cause.
            assert hosts[0].concluded_at_end == [True] and hosts[1].concluded_at_end == [True]
            why, here, findings = hosts[1].ended[0]
            assert not here and findings[0].id == "job.E002"
            assert hosts[1].said[0].startswith("the job ends, on_hang='exit' (rank 0's verdict): job.E002 [straggler_rank] "
                                               "Rank 1 has not arrived"), hosts[1].said
        else:
            time.sleep(0.3)
            assert not hosts[0].ended and not hosts[1].ended
    finally:
        for watch in watches.values():
            watch.stop()


def three_ranks(reader_blocks: threading.Event):
    """Rank 0 stalls in a guarded all_reduce, rank 1 is a straggler, rank 2 waits in the all_reduce too; on_hang
    'exit'. Rank 2's first line of the end blocks (a slow reader: its poll comes later) until
    ``reader_blocks`` is set. Events, in order, in the list returned."""
    store, clock = MemoryStore(), FakeClock()
    recorders = {r: Recorder(clock=clock) for r in (0, 1, 2)}
    events: list[tuple[int, str]] = []
    hosts = {0: FakeHost(0, lambda: state(0, pending_seq=5)),
             1: FakeHost(1, lambda: state(1, where=("train.py", 12, "load"))),
             2: FakeHost(2, lambda: state(2, pending_seq=5))}
    for rank, host in hosts.items():
        host.group_ranks = lambda name: [0, 1, 2]
        said, ended = host.say, host.end

        def say(line, rank=rank, said=said):
            if rank == 2 and line.startswith("the job ends"):
                reader_blocks.wait(5.0)
            events.append((rank, "said"))
            said(line)

        def end(*args, rank=rank, ended=ended, **kwargs):
            events.append((rank, "ended"))
            ended(*args, **kwargs)
        host.say, host.end = say, end
    watches = {r: EpisodeWatch(hosts[r], recorders[r], SideChannel(store, "p"), hang_timeout=5, answer_s=1.0,
                               poll_s=0.01, on_hang="exit") for r in (0, 1, 2)}
    for watch in watches.values():
        watch.start()
    recorders[0].begin(call())
    return clock, hosts, watches, events


def test_a_rank_that_reads_the_end_waits_until_every_rank_that_answered_read_it():
    """The first rank to end makes the launcher stop the rest (torchrun's SIGTERM within 0.1 s): a rank that
    read the verdict ends only once the others that answered read it too, so each says why the job ends."""
    slow_reader = threading.Event()
    clock, hosts, watches, events = three_ranks(slow_reader)
    try:
        clock.now += 6
        assert wait_until(lambda: (1, "said") in events, clock=clock, watches=watches)
        time.sleep(0.5)  # rank 1 read the verdict; rank 2 has not said it yet
        assert (1, "ended") not in events and (0, "ended") not in events, events
        slow_reader.set()
        assert wait_until(lambda: all((r, "ended") in events for r in (0, 1, 2))), events
        assert events.index((2, "said")) < min(events.index((r, "ended")) for r in (0, 1, 2)), events
    finally:
        slow_reader.set()
        for watch in watches.values():
            watch.stop()


def test_a_reader_that_never_reads_the_end_holds_no_rank_past_the_bound():
    never = threading.Event()
    clock, hosts, watches, events = three_ranks(never)
    try:
        clock.now += 6
        assert wait_until(lambda: (1, "said") in events, clock=clock, watches=watches)
        began = time.monotonic()
        assert wait_until(lambda: (1, "ended") in events, timeout_s=cadence.ack_wait_s(3) + 5), events
        assert time.monotonic() - began < cadence.ack_wait_s(3) + 2
    finally:
        never.set()
        for watch in watches.values():
            watch.stop()


def test_a_watched_straggler_is_ended_at_the_groups_own_timeout_with_the_diagnosis():
    store, clock, hosts, watches, stall, clear = two_ranks("auto", timeout_s=30)
    try:
        stall()
        clock.now += 6
        assert wait_until(lambda: hosts[0].shown, clock=clock, watches=watches)
        assert hosts[0].shown[0][2].action == policy.WATCH and not hosts[0].ended
        deadline = hosts[0].shown[0][2].deadline_at
        assert deadline == pytest.approx(time.time() - 6 + 30 + policy.grace_s("gloo"), abs=2)  # the group's own timeout, no earlier
        watches[0].own.deadline_at = time.time()  # the group's timeout is here
        assert wait_until(lambda: hosts[0].ended and hosts[1].ended)
        assert hosts[0].shown[-1][2].action == policy.END and "timeout" in hosts[0].shown[-1][2].reason
    finally:
        for watch in watches.values():
            watch.stop()


def test_a_stall_that_clears_while_the_ranks_are_asked_ends_nothing():
    store, clock, hosts, watches, stall, clear = two_ranks("exit")
    hosts[0].make_state = lambda: state(0)  # by the time it is asked, rank 0 is no longer waiting
    try:
        stall()
        clock.now += 6
        assert wait_until(lambda: any("cleared while the ranks were asked" in s for s in hosts[0].said), clock=clock,
                          watches=watches)
        time.sleep(0.2)
        assert not hosts[0].ended and not hosts[1].ended and not hosts[0].shown
    finally:
        for watch in watches.values():
            watch.stop()


def test_a_fault_of_the_watchdog_is_said_and_the_watchdog_goes_on():
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    host = FakeHost(0, lambda: state(0, pending_seq=5))
    broken = SimpleNamespace(usable=True, status=lambda: 1 / 0)  # a recorder that raises on every poll
    watch = EpisodeWatch(host, recorder, None, hang_timeout=5, answer_s=0.1, poll_s=0.01, on_hang="auto", flight=broken)
    watch.start()
    try:
        assert wait_until(lambda: len(host.faults) >= 3)
        assert host.faults[0][0] == "watchdog" and isinstance(host.faults[0][1], ZeroDivisionError)
        assert watch.thread.is_alive()
    finally:
        watch.stop()
    assert FAULT.id == "guard.W012" and FAULT.cause == "unknown"


def test_the_store_gone_is_said_when_it_is_needed_and_the_stall_is_still_reported_from_this_rank():
    store, clock = MemoryStore(), FakeClock()
    recorder = Recorder(clock=clock)
    host = FakeHost(0, lambda: state(0, pending_seq=5))
    watch = EpisodeWatch(host, recorder, SideChannel(store, "p"), hang_timeout=5, answer_s=0.2, poll_s=0.01,
                      on_hang="auto").start()
    try:
        time.sleep(0.05)
        store.broken = True
        time.sleep(0.05)
        assert not host.faults  # a healthy run whose store went away at the end says nothing
        recorder.begin(call())
        clock.now += 6
        assert wait_until(lambda: host.shown)
        assert host.faults and host.faults[0][0] == "store channel"
        findings, _, decision = host.shown[0]
        # Seen from this rank alone, a late peer cannot be told from a dead one: watched, not ended.
        assert findings[0].id == "job.E009" and decision.action == policy.WATCH and not host.ended
    finally:
        watch.stop()


def test_the_policy_ends_only_what_cannot_finish():
    def finding(kind_id: str, **data) -> Finding:
        return Finding(id=kind_id, severity=Severity.ERROR, cause="unknown", title="t", ranks=(1,), data=data)

    judge = lambda fs, **kw: policy.judge(fs, "auto", **{"world_known": True, "stall_since_at": 0.0,
                                                        "group_timeout_s": 1800.0, "now_at": 10.0, **kw})
    for ending in ("job.E001", "job.E003", "job.E005", "job.E006", "job.E007", "job.E009", "guard.E009"):
        assert judge([finding(ending)]).action == policy.END, ending
    assert judge([finding("job.E002")]).action == policy.WATCH
    dead = {"missing": [1], "snapshots": [{"rank": 1, "status": "killed"}]}
    silent = {"missing": [1], "snapshots": [{"rank": 1, "status": "unreachable"}]}
    assert judge([finding("job.E004", **dead)]).action == policy.END
    assert judge([finding("job.E004", **silent)]).action == policy.WATCH
    assert judge([finding("job.E009")], world_known=False).action == policy.WATCH  # one rank's view only
    assert judge([finding("job.E002")], now_at=1800.0).action == policy.WATCH   # torch ends it first
    assert judge([finding("job.E002")], now_at=1800.0 + policy.GRACE_S).action == policy.END  # the backstop
    assert judge([finding("job.E002")], group_timeout_s=None).deadline_at is None
    assert judge([], now_at=1.0).action == policy.NONE


def test_thousands_of_episodes_keep_a_bounded_record_with_a_summary_of_the_rest():
    ledger = episodes.Ledger(SideChannel(MemoryStore(), "p"))
    for n in range(episodes.MAX_KEPT + 300):
        ep = episodes.Episode(id=ledger.new_id(), owner=0, stall=Stall("0", 0.0), started_at=0.0, started_s=float(n),
                              seconds=2.0 + (40.0 if n == episodes.MAX_KEPT + 7 else 0.0))
        ledger.keep(ep)
    records, omitted, total = ledger.read()
    document = episodes.stalls_document(records, omitted, total)
    assert total == episodes.MAX_KEPT + 300 and len(records) == episodes.MAX_KEPT
    assert document[-1]["omitted"] == 300 and document[-1]["seconds"] == pytest.approx(300 * 2.0 + 40.0)
    assert document[-1]["longest"]["seconds"] == pytest.approx(42.0)
    line = episodes.summary_line(records, omitted, total)
    assert line.startswith(f"{episodes.MAX_KEPT + 300} stalls past the hang timeout in this run, "
                           f"{(episodes.MAX_KEPT + 300) * 2.0 + 40.0:.1f} s waited in all; the longest 42.0 s")


def test_the_stall_clock_starts_again_when_a_group_moves():
    clock = StallClock()
    assert clock.update({"0": (5, 5)}, 0.0) is None
    assert clock.update({"0": (6, 5)}, 1.0) == Stall("0", 1.0)
    assert clock.update({"0": (6, 5)}, 4.0) == Stall("0", 1.0)
    assert clock.update({"0": (7, 6)}, 5.0) == Stall("0", 5.0)  # progress: the clock starts again
    assert clock.update({"0": (9, 6)}, 6.0) == Stall("0", 5.0)  # more enqueued (NCCL), none completed: still stalled
    assert clock.update({"0": (9, 9)}, 9.0) is None            # gloo caught up: nothing pending


def test_a_report_directory_that_cannot_be_written_is_said_once_and_nothing_raises(tmp_path, capsys):
    from distdoctor.embedded.guard import evidence

    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the directory should be")
    for _ in range(3):
        assert evidence.write_stalls(str(blocked), [{"episode": 1}]) is None
    err = capsys.readouterr().err
    assert err.count("distdoctor guard: cannot write") == 1 and "stalls.json" in err


def test_a_watched_straggler_that_raises_is_reported_again_and_the_job_ends():
    """What the stall is changed (the late rank raised): reported again at once, and it cannot finish."""
    from distdoctor.diagnosis.snapshot import RAISED, RaisedError

    store, clock, hosts, watches, stall, clear = two_ranks("auto", timeout_s=1800)
    try:
        stall()
        clock.now += 6
        assert wait_until(lambda: hosts[0].shown and watches[0].own is not None, clock=clock, watches=watches)
        assert hosts[0].shown[0][2].action == policy.WATCH
        raised = RankSnapshot(1, status=RAISED, error=RaisedError("TimeoutError", "Read timed out.",
                                                                  Frame("train.py", 12, "load"), time.time()))
        watches[1].publish("final", {"snapshot": raised.to_dict(), "final": True})
        assert wait_until(lambda: hosts[0].ended)
        findings, heading, decision = hosts[0].shown[-1]
        assert heading.startswith("stall 1 changed after") and decision.action == policy.END
        assert findings[0].id == "job.E001" and findings[0].ranks == (1,)
        records, _, _ = watches[0].ledger.read()
        assert records[0]["verdict"] == "job.E001" and records[0]["reports"] == 2 and records[0]["action"] == "end"
    finally:
        for watch in watches.values():
            watch.stop()
