"""The guard's parts without a process group: NCCL semantics with fake Works and tensors, the
verdict from rank snapshots, the settings (the watchdog's episodes: test_guard_episodes.py)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distdoctor.embedded.guard import findings as gf
from distdoctor.embedded.guard import GuardSettings, settings_from_env
from distdoctor.embedded.guard.calls import Verifier, make_record, run_call
from distdoctor.embedded.guard.channel import _tcp_store_address
from distdoctor.embedded.guard.launch import HOOK_DIR, guard_environment
from distdoctor.embedded.guard.record import CallRecord, Recorder, tensor_facts
from distdoctor.embedded.guard.sample import Sampler, verification_cost
from distdoctor.embedded.guard.verdict import decide
from distdoctor.embedded.guard.works import WorkTracker
from distdoctor.diagnosis.snapshot import FINISHED, RUNNING, Frame, GroupProgress, PendingOp, RankSnapshot


class FakeWork:
    """An NCCL Work: returned at once, completed later (when the stream gets there)."""

    def __init__(self) -> None:
        self.done, self.waits = False, 0

    def is_completed(self) -> bool:
        return self.done

    def wait(self, timeout=None) -> bool:
        self.waits += 1
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def cuda_record(op: str = "all_reduce", seq: int = 0) -> CallRecord:
    return CallRecord(op=op, group="0", seq=seq, shapes=((4,),), dtypes=("float32",), devices=("cuda",),
                      params={"op": "SUM"}, site="train.py:10", function="step")


# -- NCCL semantics (asynchronous Work, CUDA streams) -------------------------------------------------


def test_a_sync_nccl_collective_runs_as_async_and_stays_running_until_its_work_completes():
    work, calls = FakeWork(), []

    def all_reduce(tensor, op=None, group=None, async_op=False):
        calls.append(async_op)
        return work if async_op else None

    result, tracked = run_call(all_reduce, ("t",), {}, {"tensor": "t"}, cuda_record(), takes_async=True)
    assert calls == [True] and result is None and tracked is work and work.waits == 1
    clock = FakeClock()
    recorder = Recorder(clock=clock)
    token = recorder.begin(cuda_record())
    recorder.attach(token, work)
    recorder.poll()
    assert recorder.oldest_running() is not None  # enqueued, not completed: still running
    work.done = True
    recorder.poll()
    assert recorder.oldest_running() is None and recorder.completed == {"0": 0}


def test_a_user_async_op_is_returned_untouched_and_tracked_by_its_work():
    work = FakeWork()
    result, tracked = run_call(lambda *a, **k: work, ("t",), {"async_op": True}, {"async_op": True},
                               cuda_record(), takes_async=True)
    assert result is work and tracked is work and work.waits == 0


def test_cpu_tensors_run_as_torch_runs_them():
    result, tracked = run_call(lambda *a, **k: ("ran", k), ("t",), {}, {}, CallRecord("all_reduce", "0", 0, devices=("cpu",)),
                               takes_async=True)
    assert result == ("ran", {}) and tracked is None


def test_the_verification_of_an_nccl_group_exchanges_on_the_gpu():
    dist = SimpleNamespace(get_backend=lambda group: "nccl")
    fake_torch = SimpleNamespace(device=torch.device, cuda=SimpleNamespace(current_device=lambda: 3))
    assert Verifier(fake_torch, dist, None).device(None, "0") == torch.device("cuda", 3)
    dist.get_backend = lambda group: "cpu:gloo,cuda:nccl"
    assert Verifier(fake_torch, dist, None).device(None, "1") == torch.device("cpu")


def snap_state(rank, pending_seq=None, status=RUNNING, where=("train.py", 30, "step"), done=4, running=()):
    """What a rank publishes: its snapshot (default group at ``done``, maybe waiting in ``pending_seq``)."""
    pending = PendingOp("all_reduce", pending_seq, ((4,),), ("Float",), "scheduled", 7.0) if pending_seq is not None else None
    group = GroupProgress("0", (0, 1), last_enqueued=pending_seq if pending_seq is not None else done,
                          last_completed=done, pending=pending)
    frame = Frame(*where)
    snap = RankSnapshot(rank=rank, status=status, groups=(group,), stack=(frame,), where=frame, source="guard")
    return {"snapshot": snap.to_dict(), "running": [r.to_dict() for r in running], "dropped": []}


# -- the verdict from snapshots ---------------------------------------------------------------------


def test_a_rank_outside_any_collective_is_the_straggler_with_its_line():
    [f] = decide({0: snap_state(0, pending_seq=5), 1: snap_state(1, where=("train.py", 12, "load"))}, [0, 1], 7.0)
    assert f.id == "job.E002" and f.ranks == (1,) and "train.py:12" in f.title and "all_reduce #5" in f.title


def test_a_rank_that_left_is_uneven_inputs_and_one_with_no_snapshot_is_not_heard_from():
    finished = snap_state(1, status=FINISHED, done=3)
    [f] = decide({0: snap_state(0, pending_seq=5), 1: finished}, [0, 1], 7.0)
    assert f.id == "job.E003" and f.ranks == (1,) and f.data["heard_from"] == 2
    [f] = decide({0: snap_state(0, pending_seq=5)}, [0, 1], 7.0)
    # Silence alone names nobody: rank 1 is said to be not heard from, no cause is claimed.
    assert (f.id, f.cause, f.ranks) == ("job.W010", "unknown", (1,))
    assert f.data["heard_from"] == 1 and f.data["not_heard"] == [1] and "heard from 1 of 2 ranks" in f.detail


def test_verified_mismatches_name_every_differing_field():
    a = CallRecord("broadcast", "0", 2, shapes=((2, 3),), dtypes=("float32",), devices=("cpu",), params={"src": 0}, site="a.py:1")
    b = CallRecord("broadcast", "0", 2, shapes=((3, 2),), dtypes=("float64",), devices=("cuda",), params={"src": 1}, site="a.py:1")
    ids = [f.id for f in gf.mismatch_findings({0: a, 1: b}, {}, "0", [0, 1], 2)]
    assert ids == ["guard.E001", "guard.E002", "guard.E003", "guard.E004"]


def test_only_a_tcp_store_gives_a_side_channel():
    tcp = SimpleNamespace(host="node-a", port=29500)
    assert _tcp_store_address(SimpleNamespace(underlying_store=SimpleNamespace(underlying_store=tcp))) == ("node-a", 29500)
    assert _tcp_store_address(SimpleNamespace(underlying_store=None)) is None


# -- point-to-point Works, settings, the launcher environment ------------------------------------------


def test_a_dropped_work_is_reported_and_a_waited_one_is_not():
    class Work:
        def wait(self):
            return True

        def is_completed(self):
            return False

    dropped = []
    tracker = WorkTracker(Work, dropped.append, lambda record: (lambda failed: None))
    tracker.install()
    try:
        kept, lost = Work(), Work()
        tracker.track(kept, CallRecord("isend", "0", 0, site="a.py:1"))
        tracker.track(lost, CallRecord("irecv", "0", 0, site="a.py:2"))
        kept.wait()
        del lost
        assert [r.site for r in dropped] == ["a.py:2"]
        assert tracker.pending() == []
        del kept
        assert [r.site for r in dropped] == ["a.py:2"]
    finally:
        tracker.uninstall()


def test_settings_come_from_arguments_then_the_environment():
    s = settings_from_env({"DISTDOCTOR_HANG_TIMEOUT": "30", "DISTDOCTOR_REPORT_DIR": "/r"}, hang_timeout=5)
    assert (s.hang_timeout, s.report_dir, s.verify) == (5, "/r", "sample")
    with pytest.raises(ValueError, match="DISTDOCTOR_HANG_TIMEOUT"):
        settings_from_env({"DISTDOCTOR_HANG_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="verify"):
        settings_from_env({}, verify="every")
    assert (GuardSettings().verify_first, GuardSettings().verify_budget) == (8, 0.005)


def test_samples_are_spaced_by_the_largest_gap_any_rank_proposed():
    sampler = Sampler("sample", first=4, budget=0.01, max_gap=1000)
    # The first four calls, 4 ms apart, are verified; the time between calls is measured from them.
    assert [n for n, now in enumerate((0.0, 0.004, 0.008, 0.012)) if sampler.due("0", n, now)] == [0, 1, 2, 3]
    sampler.agreed("0", 3, [1], cost_s=0.002)  # a 2 ms exchange between calls 4 ms apart
    assert sampler.proposal("0") == 50  # 2 ms / (1 % of 4 ms)
    sampler.agreed("0", 4, [50, 80], cost_s=0.002)
    assert [n for n in range(5, 200) if sampler.due("0", n)][:1] == [84]
    assert Sampler("all", 0, 0.01, 10).due("0", 12345) and not Sampler("off", 8, 0.01, 10).due("0", 0)


def test_the_pace_between_verified_calls_ignores_a_pause():
    sampler = Sampler("sample", first=0, budget=0.01, max_gap=1000)
    now = 0.0
    for seq in range(0, 60, 10):  # verified every 10th call, 4 ms apart, then a 30 s checkpoint
        now += 0.040 if seq < 50 else 30.0
        assert sampler.due("0", seq, now)
        sampler.next["0"] = seq + 10  # as agreed() would set it
        assert not sampler.due("0", seq + 1, now)
    assert sampler.interval["0"] == pytest.approx(0.004)


def test_a_verification_costs_what_the_verified_call_took_beyond_a_plain_one():
    def call(start: float, end: float | None, verified: bool = False) -> CallRecord:
        record = CallRecord("all_reduce", "0", 0, started=start, ended=end)
        record.verified = verified
        return record

    plain = [call(0.0, 0.0004), call(1.0, 1.0005), call(2.0, 2.0006), call(3.0, None)]
    last = call(5.0, 5.0025, verified=True)  # 2.5 ms: 2 ms more than the median plain call
    assert verification_cost(last, plain + [last], exchange_s=0.001) == pytest.approx(0.002)
    assert verification_cost(last, plain, exchange_s=0.003) == 0.003  # never below the exchange seen now
    assert verification_cost(None, plain, exchange_s=0.001) == 0.001  # the first: nothing to compare yet
    assert verification_cost(last, [last], exchange_s=0.001) == 0.001


def _recorded_here(tensor):
    # The guarded wrapper passes its caller's frame while the call is running: this frame, here.
    frame = sys._getframe(0)
    record = make_record("all_reduce", {"tensor": tensor}, "0", lambda args, key: None, frame)
    return record, frame.f_lineno - 1


def test_a_record_works_out_its_line_when_read_and_it_is_the_calling_line():
    record, line = _recorded_here(torch.zeros(2, 3))
    assert record.where is not None  # nothing formatted on the hot path
    assert record.site.endswith(f"{Path(__file__).name}:{line}"), record.site
    assert record.function == "_recorded_here" and record.where is None
    assert (record.shapes, record.dtypes, record.devices, record.params) == (((2, 3),), ("float32",), ("cpu",),
                                                                             {"op": "SUM"})
    assert CallRecord.from_dict(record.to_dict()).site == record.site


def test_a_record_copies_and_compares_by_value():
    record, _ = _recorded_here(torch.zeros(4))
    waiting = record.copy(ended=None, site="a.py:1", function="wait")
    assert (waiting.site, waiting.function, waiting.op, waiting.shapes) == ("a.py:1", "wait", "all_reduce", ((4,),))
    assert record.copy() == record and waiting != record and record.site != "a.py:1"
    renamed, line = _recorded_here(torch.zeros(4))
    renamed.function = "step"  # setting one of the two keeps the other as the caller's code says
    assert renamed.function == "step" and renamed.site.endswith(f":{line}"), renamed.site


def test_tensor_facts_name_the_device_of_tensors_and_of_tensor_like_values():
    assert tensor_facts(torch.zeros(1, dtype=torch.float16, device="meta")) == ((1,), "float16", "meta")
    assert tensor_facts(SimpleNamespace(shape=(2,), dtype="torch.int8", device=SimpleNamespace(type="xla"))) == (
        (2,), "int8", "xla")
    assert tensor_facts(SimpleNamespace(shape=(2,), dtype="torch.int8")) == ((2,), "int8", "?")
    assert tensor_facts(object()) is None


def test_the_launcher_environment_puts_the_hook_first(tmp_path):
    env = guard_environment({"PYTHONPATH": "/mine"}, hang_timeout=7, report_dir=str(tmp_path))
    assert env["PYTHONPATH"].split(":")[0] == str(HOOK_DIR) and env["PYTHONPATH"].endswith("/mine")
    assert (env["DISTDOCTOR_GUARD"], env["DISTDOCTOR_HANG_TIMEOUT"]) == ("1", "7")
    assert (HOOK_DIR / "sitecustomize.py").exists()
