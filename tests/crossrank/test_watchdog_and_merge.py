"""The watchdog's contract (fires once, after on_expire, even when on_expire blocks) and merging."""

from __future__ import annotations

import threading
import time

from distdoctor.world.rank_payload import device_mapping, merge_check_entries
from distdoctor.fakes import FakeProbes, fake_context, fake_gpus
from distdoctor.world.watchdog import WRITE_GRACE_S, Watchdog
from tests.conftest import measured_startup_s


def test_fires_on_expire_then_exits_3_once():
    exits, events = [], []
    done = threading.Event()

    def exit_(code):
        exits.append(code)
        done.set()

    dog = Watchdog(time.monotonic() + 0.1, lambda: events.append("report"), exit=exit_, grace_s=0.3).start()
    assert done.wait(2.0)
    time.sleep(0.4)  # the backstop timer must not exit a second time
    assert events == ["report"] and exits == [3] and dog.fired.is_set()


def test_a_blocked_on_expire_still_exits_after_the_grace():
    exits = []
    done = threading.Event()
    block = threading.Event()

    def exit_(code):
        exits.append(code)
        done.set()

    start = time.monotonic()
    Watchdog(start + 0.05, block.wait, exit=exit_, grace_s=0.3).start()
    assert done.wait(2.0 + measured_startup_s())
    assert 0.3 <= time.monotonic() - start < 1.5 + measured_startup_s() and exits == [3]
    block.set()


class _Exits:
    """The watchdog's exit, recorded: ``codes`` and an event set at the first."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.done = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.done.set()


def test_a_report_being_written_when_the_grace_runs_out_gets_more_time_once():
    """A loaded machine (a rank importing torch holds the interpreter) can make the partial report's
    writing outlast the grace: the hard exit then waits WRITE_GRACE_S more for it, once."""
    exits, printed = _Exits(), []

    def slow_write():
        dog.writing()
        time.sleep(0.6)  # longer than the grace below, shorter than the grace plus WRITE_GRACE_S
        printed.append("report")
        return 3

    dog = Watchdog(time.monotonic() + 0.05, slow_write, exit=exits, grace_s=0.3).start()
    assert exits.done.wait(2.0 + WRITE_GRACE_S + measured_startup_s())
    assert printed == ["report"] and exits.codes == [3]


def test_a_report_writer_that_never_ends_still_exits_after_the_extra_grace():
    exits, block = _Exits(), threading.Event()

    def stuck_write():
        dog.writing()
        block.wait()

    start = time.monotonic()
    dog = Watchdog(start + 0.05, stuck_write, exit=exits, grace_s=0.3).start()
    assert exits.done.wait(2.0 + WRITE_GRACE_S + measured_startup_s())
    assert 0.3 + WRITE_GRACE_S <= time.monotonic() - start and exits.codes == [3]
    block.set()


def test_cancelled_watchdog_never_fires():
    exits = []
    dog = Watchdog(time.monotonic() + 0.1, None, exit=exits.append).start()
    dog.cancel()
    time.sleep(0.3)
    assert exits == [] and not dog.fired.is_set()


def test_identical_check_results_merge_with_their_ranks():
    entries = [
        ([0], {"name": "a", "stage": "collective", "status": "pass", "duration_s": 0.1}),
        ([1], {"name": "a", "stage": "collective", "status": "pass", "duration_s": 0.3}),
        ([2], {"name": "a", "stage": "collective", "status": "fail", "duration_s": 0.2}),
        ([0, 1, 2], {"name": "r", "stage": "rendezvous", "status": "pass", "duration_s": 0.0}),
        ([0], {"name": "l", "stage": "local", "status": "pass", "duration_s": 0.0}),
    ]
    merged = merge_check_entries(entries)
    assert [e["stage"] for e in merged] == ["local", "rendezvous", "collective", "collective"]
    a_pass = next(e for e in merged if e["name"] == "a" and e["status"] == "pass")
    assert a_pass["ranks"] == [0, 1] and a_pass["duration_s"] == 0.3


def test_device_mapping_by_local_rank_with_fake_gpus():
    ctx = fake_context(env={"LOCAL_RANK": "2"}, probes=FakeProbes(gpu_list=fake_gpus(4)))
    assert device_mapping(ctx)["uuid"] == fake_gpus(4)[2].uuid
    one = fake_context(env={"LOCAL_RANK": "3"}, probes=FakeProbes(gpu_list=fake_gpus(1)))
    assert device_mapping(one)["index"] == 0
    beyond = fake_context(env={"LOCAL_RANK": "5"}, probes=FakeProbes(gpu_list=fake_gpus(2)))
    assert device_mapping(beyond) is None
    assert device_mapping(fake_context(probes=FakeProbes(gpu_list=[]))) is None


def _cut_off_report(marks: dict[str, float], cut_at: float):
    """The partial report of rank 1 of a 2-host world whose watchdog fired ``cut_at`` s after its start,
    having reached each of ``marks`` (the torch import, a stage) that many seconds after it."""
    from distdoctor.core.config import Config
    from distdoctor.world.rank_run import RankRun

    now = [1000.0]
    run = RankRun(Config(timeout=23.0), env={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "hosta",
                                             "MASTER_PORT": "29500"}, argv=[], clock=lambda: now[0],
                  started=1000.0, watchdog=False)
    for mark, at in marks.items():
        now[0] = 1000.0 + at
        run._import_torch() if mark == "torch" else run._enter_stage(mark)  # torch is imported here: instant
    now[0] = 1000.0 + cut_at
    (cut,) = [f for f in run._partial(None).findings if f.id == "core.E004"]
    return cut


def test_a_rank_cut_off_while_importing_torch_names_the_import_not_the_local_stage():
    # Both ranks of the partitioned 2-host scenario were cut off at 23 s (the suite, load 4-10) before
    # any check began: torch's import had taken the time. Their reports said "the local stage did not
    # finish" and nothing of where the time went, which read as a slow check.
    cut = _cut_off_report({"torch": 1.5}, 22.6)
    assert "importing torch.distributed" in cut.title and "local stage" not in cut.title, cut.title
    assert "start-up 1.5s, importing torch.distributed 21.1s." in cut.detail, cut.detail
    assert cut.data["stage"] == "local" and cut.data["stage_times"].startswith("start-up 1.5s")
    # Once the local stage has begun, it is the local stage's, and each phase has its own time.
    cut = _cut_off_report({"torch": 1.5, "local": 4.0}, 22.6)
    assert cut.title.startswith("The local stage did not finish"), cut.title
    assert "start-up 1.5s, importing torch.distributed 2.5s, the local stage 18.6s." in cut.detail, cut.detail
