"""Each kind of wait told from a real stack: py-spy dumps recorded from real ranks (tests/stacks/dumps/)."""

# dumps/gloo/: recorded on this project's test machine by tests/stacks/dumps/record.py (torch 2.13 CPU,
# py-spy 0.4.3, gloo), rank 0 stopped in each wait while rank 1 sleeps. dumps/cuda-handmade/: written
# by hand (no GPU here; meta.json says how); the CUDA cases are real dumps recorded on an H100
# (tests/gpu/recorded/). NCCL on two GPUs has no recording: see the note at the end.

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distdoctor.stacks import pyspy
from distdoctor.stacks.collective import BACKWARD_DDP, DDP_TYPES, STORE_WAIT, read_wait
from distdoctor.stacks.procs import RankProcess
from distdoctor.stacks.proc_state import Clock, ProcState
from distdoctor.stacks.snapshots import Facts, Read, build

DUMPS = Path(__file__).parent / "dumps"


def main_thread(name: str, folder: str = "gloo") -> pyspy.Thread:
    path = DUMPS / folder / name
    if not path.exists():
        pytest.skip(f"{folder}/{name} not recorded (tests/stacks/dumps/record.py)")
    threads = pyspy.parse(path.read_text())
    return next(t for t in threads if t.is_main)


def reading(name: str, folder: str = "gloo", *, gpu: bool = False, every_thread: bool = False):
    thread = main_thread(name, folder)
    others = pyspy.parse((DUMPS / folder / name).read_text()) if every_thread else ()
    ddp = any(t in thread.wrappers for t in DDP_TYPES)
    return read_wait(thread, native=name.endswith(".native.json"), ddp=ddp, gpu=gpu, others=others)


# (case, what py-spy --locals alone tells, what --native tells) for the rank that waits (rank 0).
GLOO = [
    ("ddp_backward", BACKWARD_DDP, BACKWARD_DDP),
    ("fsdp2_all_gather", "all_gather_single (FSDP's parameter all-gather, before forward)", None),
    ("fsdp2_reduce", "reduce_scatter_single (FSDP's gradient reduce-scatter, in backward)", None),
    ("fsdp1_reduce", "reduce_scatter_single (FSDP's gradient reduce-scatter, in backward)", None),
    ("barrier", "barrier", "barrier"),
    ("store_wait", None, STORE_WAIT),
    ("recv", "recv", "recv"),
    ("work_wait", None, "Work.wait() of an async collective"),
]


@pytest.mark.parametrize("case, plain, native", GLOO, ids=[c[0] for c in GLOO])
def test_the_waiting_rank_on_gloo(case, plain, native):
    got = reading(f"{case}.rank0.json")
    assert got.op == plain, got
    if plain is None:
        assert "cannot tell" in got.note or not got.note
    got_native = reading(f"{case}.rank0.native.json")
    assert got_native.op == (native or plain), got_native
    assert not got.may_spin and not got_native.may_spin


@pytest.mark.parametrize("case", [c[0] for c in GLOO])
def test_the_sleeping_rank_waits_in_nothing(case):
    assert reading(f"{case}.rank1.json").op is None
    assert reading(f"{case}.rank1.native.json").op is None


def test_the_model_type_comes_from_the_frames_variables_and_nothing_else_is_kept():
    thread = main_thread("ddp_backward.rank0.json")
    assert thread.wrappers == frozenset({"DistributedDataParallel"})
    assert main_thread("fsdp2_all_gather.rank0.json").wrappers <= {"FSDPSequential", "FSDPLinear"}
    assert "repr" not in json.dumps(thread.to_dict())  # the report keeps frames, never a variable's value


GPU = Path(__file__).resolve().parents[1] / "gpu" / "recorded"


def recorded_gpu(job: str, rank: int, native: bool, read: int = 0) -> tuple[pyspy.Thread, tuple[pyspy.Thread, ...]]:
    """A read recorded on an H100 (tests/gpu/recorded/README.md): its main thread and every thread."""
    path = GPU / job / f"rank{rank}-{read}{'-native' if native else ''}.json"
    if not path.exists():
        pytest.skip(f"{path} not in this checkout")
    threads = pyspy.parse(json.loads(path.read_text())["stdout"])
    return next(t for t in threads if t.is_main), threads


@pytest.mark.parametrize("job", ["cuda_busy", "nccl_one_rank"])
def test_a_cuda_synchronisation_under_item_cannot_tell_and_its_cpu_is_no_evidence(job):
    # A healthy GPU job (no collective pending): the CPU spins in cudaStreamSynchronize, py-spy says active.
    main, threads = recorded_gpu(job, 0, native=True)
    got = read_wait(main, native=True, gpu=True, others=threads)
    assert got.op is None and got.may_spin and "cannot tell" in got.note and "cudaStreamSynchronize" in got.note
    # Without --native the same moment is a line on a CPU; a GPU process's CPU time is no evidence.
    plain, _ = recorded_gpu(job, 0, native=False)
    read = Read(RankProcess(pid=4242, rank=0), pyspy.Dump(threads=(plain,)), ProcState("running"), Clock("R", 12.0), 1.0)
    snap = build(read, Facts(gpu=True), host="gpu-node").snapshot
    assert snap.in_collective is None and snap.may_spin and any("uses a GPU" in n for n in snap.notes)


def test_ddp_on_a_gpu_waits_on_autograds_device_thread_which_native_frames_show_in_the_reducer():
    main, threads = recorded_gpu("ddp_gloo_cuda_straggler", 0, native=True)
    got = read_wait(main, native=True, gpu=True, others=threads)
    assert got.op == BACKWARD_DDP and "autograd's device thread" in got.note and "c10d::Reducer" in got.note
    plain, threads = recorded_gpu("ddp_gloo_cuda_straggler", 0, native=False)
    got = read_wait(plain, native=False, ddp=True, gpu=True, others=threads)
    assert got.op is None and "uses a GPU" in got.note and "cannot tell" in got.note
    late, threads = recorded_gpu("ddp_gloo_cuda_straggler", 1, native=True)
    assert read_wait(late, native=True, gpu=True, others=threads).op is None


def test_gloo_on_cuda_tensors_waits_in_its_collective():
    for native in (False, True):
        main, threads = recorded_gpu("gloo_cuda_straggler", 0, native=native)
        assert read_wait(main, native=native, gpu=True, others=threads).op == "all_reduce"


def test_nccls_work_wait_is_a_wait():
    # Hand-made (dumps/cuda-handmade/meta.json): no recording of WorkNCCL::wait yet.
    assert reading("nccl_work_wait.rank0.native.json", "cuda-handmade").op == "Work.wait() of an async NCCL collective"


# NCCL: no separate cases. Seven NCCL cases waited here for dumps/nccl/ (record.py --backend nccl), which
# needs two GPUs (NCCL refuses two ranks on one: tests/gpu/recorded/nccl_two_ranks_one_gpu), and so always
# skipped. What each would have checked is checked above on real dumps:
# - barrier, recv: told by their Python frame in distributed_c10d.py, whatever the backend (the gloo dumps);
# - store_wait: the c10d store has no backend (the gloo dump);
# - work_wait_blocking: WorkNCCL::wait (test_nccls_work_wait_is_a_wait, the hand-made dump);
# - cuda_item, cuda_compute_item: a CUDA synchronisation under .item() (the H100 dumps cuda_busy and nccl_one_rank);
# - ddp_backward: DDP on a GPU is the H100 dump ddp_gloo_cuda_straggler (the reducer on autograd's device
#   thread); with NCCL the reducer's all-reduce does not block the CPU in backward at all (the CPU waits
#   later, at a CUDA synchronisation: "cannot tell"), so that case's expectation was not a recording's.
