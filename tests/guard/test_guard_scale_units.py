"""The guard's side channel at scale, against real TCPStores: batched reads, the adaptive answer deadline,
and the bad input of big jobs (a rank that never connects, a slow store, answers after the verdict, a world
that changed between restarts, a rank that joins late)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest

from distdoctor.embedded.guard import cadence, channel, policy
from distdoctor.embedded.guard.channel import SideChannel, open_client
from distdoctor.embedded.guard.looks import Board
from distdoctor.embedded.guard.record import Recorder
from distdoctor.embedded.guard.watch import EpisodeWatch
from test_guard_episodes import FakeClock, FakeHost, call, state, wait_until

dist = pytest.importorskip("torch.distributed")


def tcp_store(libuv: bool = True):
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10),
                         use_libuv=libuv)


def side_of(server, prefix: str = "t", wrap=None) -> SideChannel:
    """A channel of its own on ``server``, connected (as the watchdog's is after its first poll)."""
    side = SideChannel(None, prefix, lambda: (wrap or (lambda s: s))(open_client("127.0.0.1", server.port)))
    side.client(wait_s=30)
    return side


class WithoutExtended:
    """A real store client seen as a store without torch's extended API (no append, multi_get, check)."""

    def __init__(self, store) -> None:
        self._store = store

    def __getattr__(self, name):
        if name in ("append", "multi_get", "check"):
            raise AttributeError(name)
        return getattr(self._store, name)


class Slow:
    """A store whose host answers slowly: every request takes ``delay_s`` more."""

    def __init__(self, store, delay_s: float) -> None:
        self._store, self.delay_s = store, delay_s

    def __getattr__(self, name):
        method = getattr(self._store, name)
        if not callable(method):
            return method

        def slowly(*args):
            time.sleep(self.delay_s)
            return method(*args)
        return slowly


@pytest.mark.parametrize("libuv", [True, False], ids=["libuv", "legacy"])
def test_a_read_of_hundreds_of_ranks_costs_a_few_requests_and_never_waits_for_a_missing_key(libuv):
    server = tcp_store(libuv)
    writer, reader = side_of(server), side_of(server)
    for rank in range(300):
        writer.publish("final", rank, {"rank": rank, "pad": "x" * 200})
    # torch's client sends set and append without waiting for a reply: a request with one (add) returns
    # once the store took every request before it on that connection.
    writer.count(writer.key("flushed"), 0)
    before = reader.traffic.total
    got = reader.read_many("final", range(300))
    assert sorted(got) == list(range(300)) and got[7]["rank"] == 7
    # The roster, then per 256 keys one check and one multi_get: not two requests per rank.
    assert reader.traffic.total - before <= 1 + 2 * math.ceil(300 / channel.MULTI_GET_CHUNK)
    assert reader.traffic.bytes_read > 300 * 200
    started = time.monotonic()
    assert reader.read_many("final", [1000, 1001]) == {} and reader.read_many("hello", range(4)) == {}
    assert reader.get_if_present(reader.key("nothing")) is None
    assert time.monotonic() - started < 2.0  # torch's get would wait the client's 5 s per missing key
    # An answer deleted after its rank was listed (a look long done) is read one by one, not waited for.
    for rank in range(4):
        writer.publish("look/1/state", rank, {"rank": rank})
    writer.forget([writer.key("look/1/state", 2)])
    writer.count(writer.key("flushed"), 0)
    started = time.monotonic()
    assert sorted(reader.read_many("look/1/state", range(4))) == [0, 1, 3]
    assert time.monotonic() - started < 2.0


def test_a_store_without_the_extended_api_gives_the_same_answers():
    server = tcp_store()
    plain = side_of(server, wrap=WithoutExtended)
    assert not hasattr(plain.talk, "append") and hasattr(server, "append")
    for rank in range(40):
        plain.publish("hello", rank, {"rank": rank})
    plain.count(plain.key("flushed"), 0)
    assert plain.roster("hello") == list(range(40))
    assert sorted(side_of(server).read_many("hello", range(50))) == list(range(40))
    assert sorted(plain.read_many("hello", range(50))) == list(range(40))


def test_the_answer_deadline_grows_with_the_world_and_the_measured_round_trip_and_stays_bounded():
    small = cadence.answer_wait(2, 1.5, 0.0001)
    big = cadence.answer_wait(4096, 1.5, 0.0001)
    slow = cadence.answer_wait(48, 1.5, 0.2)
    assert small.first_s < big.first_s < big.last_s <= cadence.MAX_ANSWER_S
    assert slow.first_s > cadence.answer_wait(48, 1.5, 0.001).first_s  # a slow store gets more time
    assert cadence.answer_wait(10 ** 6, 1.5, 1.0).last_s == cadence.MAX_ANSWER_S
    assert small.first_s >= 1.5 + cadence.quiet_interval_s(2)  # a quiet rank learns of the look at its next poll
    # Done once every rank answered (the caller's test), at the last deadline, or when answers stopped coming.
    assert not big.done(big.first_s - 0.1, 0.0) and big.done(big.last_s, 0.0)
    assert not big.done(big.first_s + 0.1, 0.0) and big.done(big.first_s + 0.1, big.gap_s)


def test_the_store_load_while_healthy_is_bounded_for_the_whole_job():
    for world in (2, 48, 256, 1024, 4096, 16384, 100_000):
        assert world / cadence.busy_interval_s(world) <= cadence.HEALTHY_JOB_RATE
        assert world / cadence.quiet_interval_s(world) <= max(world, cadence.QUIET_JOB_RATE)
        assert 1 / cadence.quiet_interval_s(world) <= 1.0  # at most one request per second per rank, ever
    assert 1 / cadence.busy_interval_s(4096) < 0.05
    assert cadence.quiet_after_s(120) == 10.0 and cadence.quiet_after_s(5) == 2.5


def ranks_on(server, hosts, recorders, clock, *, world: int, answer_s: float = 0.5, wrap=None):
    watches = {}
    for rank, host in hosts.items():
        side = SideChannel(None, "job", lambda: (wrap or (lambda s: s))(open_client("127.0.0.1", server.port)))
        side.client(wait_s=30)
        watches[rank] = EpisodeWatch(host, recorders[rank], side, hang_timeout=5, answer_s=answer_s, poll_s=0.02,
                                     on_hang="auto", world=world)
    return watches


def three_ranks(server, *, late_state=None, wrap=None, answer_s: float = 3.0):
    """Ranks 0 and 2 stall in all_reduce #5; rank 1 is outside any collective (the straggler)."""
    clock = FakeClock()
    recorders = {r: Recorder(clock=clock) for r in range(3)}
    hosts = {0: FakeHost(0, lambda: state(0, pending_seq=5), 1800),
             1: FakeHost(1, late_state or (lambda: state(1, where=("train.py", 12, "load"))), 1800),
             2: FakeHost(2, lambda: state(2, pending_seq=5), 1800)}
    for host in hosts.values():
        host.group_ranks = lambda name: [0, 1, 2]
    watches = ranks_on(server, hosts, recorders, clock, world=3, answer_s=answer_s, wrap=wrap)
    return clock, recorders, hosts, watches


def start(watches):
    for watch in watches.values():
        watch.start()


def stop(watches):
    for watch in watches.values():
        watch.stop()


def test_a_slow_store_gets_a_longer_answer_deadline_and_the_straggler_is_still_named_alone():
    server = tcp_store()
    clock, recorders, hosts, watches = three_ranks(server, wrap=lambda s: Slow(s, 0.15))
    start(watches)
    try:
        for rank in (0, 2):
            recorders[rank].begin(call())
        clock.now += 6
        assert wait_until(lambda: any(h.shown for h in hosts.values()), 60, clock=clock, watches=watches)
        [(findings, heading, decision)] = next(h.shown for h in hosts.values() if h.shown)
        assert (findings[0].id, findings[0].ranks) == ("job.E002", (1,)), findings[0].title
        assert findings[0].data["heard_from"] == 3 and "not_heard" not in findings[0].data
        assert decision.action == policy.WATCH
        assert wait_until(lambda: any(w.own is not None for w in watches.values()), 30)
        owner = next(w for w in watches.values() if w.own is not None)
        assert owner.side.traffic.rtt_s >= 0.1  # measured (0.15 s a request), and the deadline grew with it
        assert not any(h.faults for h in hosts.values())
    finally:
        stop(watches)


def test_an_answer_after_the_verdict_revises_it_and_silence_never_names_a_rank_missing():
    server = tcp_store()
    verdict_out = threading.Event()

    def late_answer():
        verdict_out.wait(60)  # rank 1 answers only after the first verdict: not heard from in time
        return state(1, where=("train.py", 12, "load"))

    clock, recorders, hosts, watches = three_ranks(server, late_state=late_answer)
    start(watches)
    try:
        for rank in (0, 2):
            recorders[rank].begin(call())
        clock.now += 6
        assert wait_until(lambda: any(h.shown for h in hosts.values()), 60, clock=clock, watches=watches)
        verdict_out.set()
        assert wait_until(lambda: sum(len(h.shown) for h in hosts.values()) >= 2, 60)
        owner = next(h for h in hosts.values() if h.shown)
        first, revised = owner.shown[0], owner.shown[1]
        # First: the waiting ranks, and rank 1 not heard from; no cause claimed, nothing ends.
        assert (first[0][0].id, first[0][0].ranks) == ("job.W010", (1,)), first[0][0].title
        assert first[0][0].data["not_heard"] == [1] and first[2].action == policy.WATCH
        assert all(f.id != "job.E004" for f in first[0])
        # Then its answer came: the verdict is revised to the straggler, said once more.
        assert (revised[0][0].id, revised[0][0].ranks) == ("job.E002", (1,)) and "revised" in revised[1]
        assert revised[0][0].data["heard_from"] == 3
    finally:
        verdict_out.set()
        stop(watches)


def test_a_rank_that_never_reaches_the_store_reports_alone_and_the_others_do_not_name_it(monkeypatch):
    monkeypatch.setattr(channel, "CONNECT_BUDGET_S", 0.0)
    server = tcp_store()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]  # nothing listens here once the socket is closed
    clock, recorders, hosts, watches = three_ranks(server)
    cut_off = SideChannel(None, "job", lambda: open_client("127.0.0.1", closed, timeout_s=1.0))
    monkeypatch.setattr(channel, "CONNECT_TIMEOUT_S", 1.0)
    watches[2] = EpisodeWatch(hosts[2], recorders[2], cut_off, hang_timeout=5, answer_s=3.0, poll_s=0.02,
                              on_hang="auto", world=3)
    start(watches)
    try:
        assert wait_until(lambda: cut_off.gave_up, 30)
        for rank in (0, 2):
            recorders[rank].begin(call())
        clock.now += 6
        assert wait_until(lambda: hosts[0].shown and hosts[2].shown, 60, clock=clock, watches=watches)
        # Rank 2 reports from its own view, said as such, and watches (it cannot see the others).
        alone, _, decision = hosts[2].shown[0]
        assert decision.action == policy.WATCH and hosts[2].faults[0][0] == "store channel"
        # Rank 0 names the straggler it heard from; rank 2, silent, is counted, never named missing.
        findings = hosts[0].shown[0][0]
        assert (findings[0].id, findings[0].ranks) == ("job.E002", (1,)), findings[0].title
        assert findings[0].data["not_heard"] == [2] and "published no hello" in findings[0].detail
    finally:
        stop(watches)


def test_a_world_that_changed_between_restarts_gets_a_channel_of_its_own(monkeypatch):
    server = tcp_store()
    # The job's own store client (torch's), under the prefix torchrun gives each attempt.
    client = dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                           timeout=timedelta(seconds=10))
    prefixes = []
    for restart, world in (("0", 4), ("1", 3)):
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", restart)
        default = dist.PrefixStore(f"/worker/attempt_{restart}", client)
        side = SideChannel.open(default, 1)
        for rank in range(world):
            side.hello(rank, {"rank": rank})
        client.add("flushed", 0)
        side.client(wait_s=30)
        prefixes.append(side)
    old, new = prefixes
    assert old.prefix != new.prefix
    assert old.roster("hello") == [0, 1, 2, 3] and new.roster("hello") == [0, 1, 2]
    assert sorted(new.read_many("hello", range(4))) == [0, 1, 2]  # rank 3 of the old world is not this world's


def test_a_rank_that_joins_late_answers_the_look_in_progress_and_not_the_ones_done():
    server = tcp_store()
    asker, done_by = side_of(server, "late"), side_of(server, "late")
    board = Board(asker, 0)
    look, mine = board.claim("0")
    assert mine and look == 1
    board.answer(1, state(0, pending_seq=5))
    board.publish(1, [], 0, policy.NONE, "cleared", None)  # look 1 is done
    clock = FakeClock()
    late = FakeHost(2, lambda: state(2, pending_seq=5))
    watch = EpisodeWatch(late, Recorder(clock=clock), side_of(server, "late"), hang_timeout=5, answer_s=0.5,
                         poll_s=0.02, on_hang="auto", world=3).start()
    try:
        assert wait_until(lambda: watch.board.news_seen is not None, 20)
        time.sleep(0.3)
        assert done_by.get_if_present(done_by.key("look/1/state", 2)) is None  # a finished look: not answered
        look, mine = Board(asker, 1).claim("0")  # a new look while rank 2 is there
        assert look == 2 and mine
        Board(asker, 1).bump()
        assert wait_until(lambda: done_by.get_if_present(done_by.key("look/2/state", 2)) is not None, 20)
    finally:
        watch.stop()


class _AskedBetween:
    """A rank's side channel on which another rank asks for a look of its own right after this rank's
    first read of the two a claim makes (the look count and the current look): the race of two ranks
    that stall at once in different calls (the soak's receive cycle: ranks 2-3 in recv, 0-1 in all_reduce)."""

    def __init__(self, side: SideChannel, other: Board) -> None:
        self.side, self.other, self.fired = side, other, False

    def __getattr__(self, name: str):
        return getattr(self.side, name)

    def _after_first_read(self, value):
        if not self.fired:
            self.fired = True
            self.other.claim("0")
        return value

    def count(self, key, delta=0):
        value = self.side.count(key, delta)
        return self._after_first_read(value) if delta == 0 and key == self.side.key("looks") else value

    def get_if_present(self, key):
        value = self.side.get_if_present(key)
        return self._after_first_read(value) if key == self.side.key("current") else value


def test_two_ranks_that_ask_at_once_share_one_look():
    server = tcp_store()
    first = Board(side_of(server, "once"), 2)  # rank 2, stalled in recv, asks between rank 0's two reads
    racing = _AskedBetween(side_of(server, "once"), first)
    look, mine = Board(racing, 0).claim("0")  # rank 0, stalled in all_reduce
    assert racing.fired
    assert (look, mine) == (1, False), "rank 0 asked a look of its own beside rank 2's: neither answers the other's"


def test_a_collectives_first_stalled_rank_joins_the_look_collecting_its_group_and_no_other():
    """The soak's receive cycle: rank 3 stalls in a receive and asks a look at the default group; rank 1,
    the first stalled in the all-reduce, joins it (one look hears every rank) instead of asking its own.
    A look at another group, or one already judged, is not joined."""
    server = tcp_store()
    asker = Board(side_of(server, "join"), 3)
    assert asker.claim("0") == (1, True)
    assert Board(side_of(server, "join"), 1).claim("0", same_group=True) == (1, False)
    assert Board(side_of(server, "join"), 2).claim("7", same_group=True) == (2, True)  # another group: its own
    asker.side.put(asker.side.key("current"), {"rank": 2, "group": "0", "t": time.time(), "look": 2, "phase": "watch"})
    assert Board(side_of(server, "join"), 1).claim("0", same_group=True) == (3, True)  # judged: not joined


FINALIZING = """
import os, signal, subprocess, sys, threading, time
from distdoctor.embedded.guard import channel
server = subprocess.Popen([sys.executable, "-c", "import sys, time, datetime, torch.distributed as d; "
                           "s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False, "
                           "timeout=datetime.timedelta(seconds=60)); print(s.port, flush=True); time.sleep(120)"],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
open(sys.argv[1], "w").write(str(server.pid))  # the test ends it by its PID, whatever happens
port = int(server.stdout.readline())
side = channel.SideChannel(None, "t", lambda: channel.open_client("127.0.0.1", port, 1.0))
side.client(wait_s=30.0)
os.kill(server.pid, signal.SIGSTOP)  # the store stops answering: the next request waits out its timeout

def watchdog():  # as the guard's watchdog does: ask the store for news
    try:
        side.count(side.key("news"), 0)
    except Exception:
        pass

threading.Thread(target=watchdog, daemon=True).start()
time.sleep(0.2)

class Late:
    def __del__(self):  # runs while the interpreter finalizes: the request times out meanwhile
        time.sleep(3)
        os.kill(server.pid, signal.SIGKILL)

late = Late()
print("script done", flush=True)
"""


def test_a_store_request_in_progress_when_the_interpreter_finalizes_does_not_abort_the_process(tmp_path):
    # A thread of the guard's inside torch's C++ client when the interpreter finalizes aborts the process as
    # it comes back ("terminate called without an active exception", exit -6) after a script that ended
    # well. The guard's client is plain Python: its thread comes back into C and ends; the exit stays clean.
    script, pid_file = tmp_path / "finalizing.py", tmp_path / "store.pid"
    script.write_text(FINALIZING)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    try:
        result = subprocess.run([sys.executable, str(script), str(pid_file)], env=env, capture_output=True, text=True,
                                timeout=120)
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), 9)
            except (ProcessLookupError, ValueError):
                pass
    assert "script done" in result.stdout, result.stderr[-2000:]
    assert "terminate called" not in result.stderr and result.returncode == 0, (result.returncode, result.stderr[-2000:])
