"""Which torch.distributed operation a rank's main-thread stack is inside, named as the user called it."""

# torch's collectives are Python functions of torch/distributed/distributed_c10d.py
# (all_reduce, barrier, broadcast, all_gather_object -> all_gather ...): the outermost such frame
# is what the user called. DDP's gradient all-reduce has no Python frame of its own: it runs
# inside `loss.backward()` (torch/autograd/graph.py `_engine_run_backward`), and the main thread
# waits in c10d::Reducer::finalize_backward. With --native that frame is seen and the name is
# certain; without it, a main thread *idle* inside backward (py-spy: not on a CPU) is waiting, and
# the name says what the wait is when the model is DDP. A busy backward is computing, not waiting.

from __future__ import annotations

import re
from typing import Sequence

from distdoctor.stacks.pyspy import RawFrame, Thread

_C10D = re.compile(r"(^|[/\\])torch[/\\]distributed[/\\]distributed_c10d\.py$")
_BACKWARD = re.compile(r"(^|[/\\])torch[/\\]autograd[/\\](graph|__init__)\.py$")
_DDP = re.compile(r"(^|[/\\])torch[/\\]nn[/\\]parallel[/\\]distributed\.py$")
_NATIVE_WAIT = ("c10d::Reducer::", "ProcessGroupGloo", "ProcessGroupNCCL", "gloo::", "c10d::ProcessGroup")
# The CPU waiting for the GPU: where a rank of an NCCL job blocks while a collective on the GPU
# does not complete (NCCL's collectives are asynchronous to the CPU; the wait surfaces at the
# next synchronization: loss.item(), .cpu(), an event or stream synchronize).
_CUDA_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
              "cuEventSynchronize", "cuCtxSynchronize", "cudaMemcpy", "cuMemcpy")
CUDA_WAIT = "a CUDA synchronization (the GPU's queue, where NCCL's collectives run)"
# distributed_c10d functions that are not a collective the user waits in.
_NOT_OPS = frozenset({"wrapper", "_get_default_group", "get_rank", "get_world_size", "is_initialized", "_rank_not_in_group",
            "_check_single_tensor", "_check_tensor_list", "_warn_not_in_group", "_get_group_size",
            "_canonicalize_group_rank", "_coalescing_manager", "_store_based_barrier", "_new_process_group_helper"})
_DDP_INIT = {"_verify_param_shape_across_processes", "_sync_module_states", "_sync_params_and_buffers", "__init__"}

BACKWARD_DDP = "backward (DDP's gradient all-reduce)"


def _outermost(frames: Sequence[RawFrame], pattern: re.Pattern, exclude: frozenset[str] = frozenset()) -> RawFrame | None:
    """The outermost Python frame in a file matching pattern (frames innermost first)."""
    for frame in reversed(frames):
        if not frame.native and pattern.search(frame.file) and frame.function not in exclude:
            return frame
    return None


def in_collective(thread: Thread, *, native: bool) -> tuple[str | None, str]:
    """(the operation the thread waits in or None, a note on how it was told)."""
    frames = thread.frames
    c10d = _outermost(frames, _C10D, _NOT_OPS)
    if c10d is not None:
        if c10d.function == "init_process_group":
            return "init_process_group (rendezvous)", ""
        return c10d.function, ""
    ddp = _outermost(frames, _DDP)
    if ddp is not None and ddp.function in _DDP_INIT:
        return "DistributedDataParallel() (parameter check and broadcast)", ""
    if native and thread.idle:
        sync = next((f.function for f in frames if f.native and any(w in f.function for w in _CUDA_SYNC)), None)
        if sync is not None:
            return CUDA_WAIT, f"native frames show {sync}: the CPU waits for the GPU"
    backward = _outermost(frames, _BACKWARD)
    if backward is None:
        return None, ""
    if native:
        waits = [f.function for f in frames if f.native and any(w in f.function for w in _NATIVE_WAIT)]
        if any("c10d::Reducer::" in w for w in waits):
            return BACKWARD_DDP, "native frames show c10d::Reducer waiting for the gradient all-reduce"
        if waits:
            return "backward (a collective)", f"native frames show {waits[0]}"
        return None, "in backward, computing (no c10d frame in its native stack)"
    if thread.idle:
        return BACKWARD_DDP, ("its main thread is idle inside loss.backward(): waiting, which for a DDP model is the "
                              "gradient all-reduce (--native shows the c10d::Reducer frame that confirms it)")
    return None, "in backward and on a CPU: computing, not waiting"
