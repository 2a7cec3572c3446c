"""The pieces of `distdoctor stacks` on their own: naming the collective, py-spy's output, merging nodes."""

from __future__ import annotations

import json
import os
import signal

import pytest

from distdoctor.diagnosis.snapshot import RankSnapshot
from distdoctor.stacks import pyspy
from distdoctor.stacks.collective import BACKWARD_DDP, in_collective, read_wait
from distdoctor.stacks.job import JobView, judge, renumber
from distdoctor.stacks.proc_state import decode_wait_status
from distdoctor.stacks.slurm import json_objects, merge_reports

SITE = "/usr/lib/python3.11/site-packages/"


def frame(function, file, line=1, native=False):
    return pyspy.RawFrame(function, file, file.split("site-packages/")[-1], None if native else line, native)


def thread(*frames, idle=True):
    return pyspy.Thread("MainThread", 1, idle, False, tuple(frames))


USER = frame("main", "/job/train.py", 40)
BACKWARD = frame("_engine_run_backward", SITE + "torch/autograd/graph.py", 979)
C10D = SITE + "torch/distributed/distributed_c10d.py"


def test_the_outermost_c10d_function_is_the_operation_the_user_called():
    inner = frame("all_gather", C10D, 3000)
    outer = frame("all_gather_object", C10D, 3100)
    logger = frame("wrapper", SITE + "torch/distributed/c10d_logger.py", 83)
    assert in_collective(thread(inner, logger, outer, logger, USER), native=False)[0] == "all_gather_object"
    assert in_collective(thread(frame("barrier", C10D), USER), native=False)[0] == "barrier"
    init = thread(frame("_store_based_barrier", C10D), frame("init_process_group", C10D), USER)
    assert in_collective(init, native=False)[0] == "init_process_group (rendezvous)"


def test_backward_is_a_wait_only_for_a_ddp_model_idle_in_it_or_when_native_frames_show_the_reducer():
    assert in_collective(thread(BACKWARD, USER, idle=True), native=False, ddp=True)[0] == BACKWARD_DDP
    op, note = in_collective(thread(BACKWARD, USER, idle=True), native=False, ddp=False)
    assert op is None and "cannot tell" in note and "DistributedDataParallel" in note
    op, note = in_collective(thread(BACKWARD, USER, idle=True), native=False, ddp=True, gpu=True)
    assert op is None and "uses a GPU" in note  # the main thread sleeps in backward while the GPU computes
    assert in_collective(thread(BACKWARD, USER, idle=False), native=False, ddp=True)[0] is None
    reducer = frame("c10d::Reducer::finalize_backward", "libtorch_cpu.so", native=True)
    assert in_collective(thread(reducer, BACKWARD, USER, idle=False), native=True)[0] == BACKWARD_DDP
    compute = frame("at::native::addmm", "libtorch_cpu.so", native=True)
    assert in_collective(thread(compute, BACKWARD, USER, idle=True), native=True)[0] is None
    assert in_collective(thread(USER), native=False) == (None, "")


def test_py_spy_json_is_read_and_its_failures_classified():
    text = json.dumps([{"thread_name": "MainThread", "os_thread_id": 5, "active": False, "owns_gil": False, "frames": [
        {"name": "f", "filename": "/job/train.py", "module": None, "short_filename": "train.py", "line": 3},
        {"name": "clock_nanosleep", "filename": "/lib/libc.so.6", "module": "/lib/libc.so.6", "short_filename": "libc.so.6", "line": 0}]}])
    (main,) = pyspy.parse(text)
    assert main.idle and [f.native for f in main.frames] == [False, True] and main.frames[1].line is None
    with pytest.raises(ValueError):
        pyspy.parse("{}")
    # py-spy 0.4.3's own words (captured from real runs).
    assert pyspy.classify(1, "Error: Failed to find python version from target process\n")[0] == pyspy.NOT_PYTHON
    assert pyspy.classify(1, "Error: Failed to get process executable name. Check that the process is running.\n")[0] == pyspy.GONE
    assert pyspy.classify(1, "Permission Denied: Try running again with elevated permissions\n")[0] == pyspy.DENIED
    assert pyspy.classify(1, "Error: something new\n") == (pyspy.FAILED, "Error: something new")


def test_wait_statuses_decode_to_code_or_signal():
    assert decode_wait_status(7 << 8) == ("exited", 7)
    assert decode_wait_status(signal.SIGKILL) == ("killed", -9)


def test_processes_without_a_rank_are_numbered_after_the_ranks_and_say_so():
    snaps = renumber([RankSnapshot(rank=-1, pid=30), RankSnapshot(rank=0, pid=10), RankSnapshot(rank=-1, pid=20)])
    assert [(s.rank, s.pid) for s in snaps] == [(0, 10), (1, 20), (2, 30)]
    assert "numbered by PID order" in snaps[1].notes[-1]


def _node(host, ranks, *, world=4, stacks=None):
    """A node's JSON report: each rank read three times over a second, rank 1 outside any collective."""
    def snap(r, t):
        return RankSnapshot(rank=r, host=host, pid=100 + r, status="running", source="stacks", time=t,
                            stack=(stacks or {}).get(r, ()), in_collective=None if r == 1 else "all_reduce",
                            cpu_s=1.0, proc_state="S")
    snaps = [snap(r, 1.0) for r in ranks]
    view = JobView("node-a:29500", snaps, {}, [], world, False, "torchrun", [host],
                   history={r: [snap(r, t) for t in (0.0, 0.5, 1.0)] for r in ranks})
    return {"findings": [{"id": "stacks.W003", "severity": "warning", "cause": "unknown", "title": "partial"}],
            "data": {"stacks": {"jobs": [view.to_dict()], "nodes": [host]}}}


def test_node_reports_merge_into_one_job_judged_once():
    text = json.dumps(_node("node-a", [0, 1])) + "\nsrun: warning\n" + json.dumps(_node("node-b", [2, 3]))
    reports = json_objects(text)
    jobs, findings, nodes = merge_reports(reports, whole=True)
    assert nodes == ["node-a", "node-b"] and findings == []  # the nodes' partial views are judged again
    (job,) = jobs
    assert [s.rank for s in job.snapshots] == [0, 1, 2, 3] and job.whole
    verdict = judge(job)
    late = next(f for f in verdict if f.id == "job.E002")
    assert late.ranks == (1,) and late.hosts == ("node-a",)
    assert "stacks.W003" not in [f.id for f in verdict]


def test_a_node_seen_alone_says_the_verdict_is_partial():
    (job,), _, _ = merge_reports([_node("node-a", [0, 1])], whole=False)
    partial = next(f for f in judge(job) if f.id == "stacks.W003")
    assert partial.title == "The verdict covers ranks 0-1 of 4 only"


def test_a_rank_with_no_process_anywhere_has_ended():
    (job,), _, _ = merge_reports([_node("node-a", [0, 1, 2])], whole=True)
    missing = next(f for f in judge(job) if f.id == "job.E004")
    assert missing.ranks == (3,) and "ended" in missing.title
    assert "no process of this rank on this node" in missing.detail


def test_a_cuda_synchronisation_alone_cannot_tell_and_may_spin():
    # Frame names of CUDA's runtime API (no GPU here; recorded GPU dumps: tests/stacks/test_waits.py).
    sync = frame("cudaStreamSynchronize", "libcudart.so.12", native=True)
    item = frame("main", "/job/train.py", 50)
    found = read_wait(thread(sync, item, idle=True), native=True)
    assert found.op is None and found.may_spin and "cannot tell" in found.note
    assert read_wait(thread(sync, item, idle=True), native=False).op is None


def test_when_no_rank_is_in_a_collective_the_groups_say_how_to_see_gpu_waits():
    from distdoctor.diagnosis.snapshot import Frame
    from distdoctor.stacks.grouping import stack_groups

    snaps = [RankSnapshot(rank=r, status="running", stack=(Frame("train.py", 50, "main"),)) for r in range(2)]
    assert "run with --native" in stack_groups(snaps).detail
    assert "run with --native" not in stack_groups(snaps, native=True).detail
