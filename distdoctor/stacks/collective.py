"""What a rank's main-thread stack is waiting in, told from what the stack is, not from where it happens to be."""

# torch's collectives are Python functions of torch/distributed/distributed_c10d.py
# (all_reduce, barrier, recv, all_gather_object -> all_gather ...): the outermost such frame is
# what the user called, and FSDP's frames around it say which of FSDP's collectives it is. Other
# waits have no Python frame of their own and are told by their C/C++ frames (--native) or not at
# all:
# - DDP's gradient all-reduce runs inside `loss.backward()`, where the main thread waits in
#   c10d::Reducer::finalize_backward (on a GPU the main thread waits in autograd's ReadyQueue::pop
#   and the reducer's wait is on autograd's device thread, which py-spy --native lists too: recorded
#   on an H100, tests/gpu/recorded/). Without --native, a main thread idle inside backward is DDP's
#   all-reduce only when the model is DDP (a DistributedDataParallel among its frames' variables,
#   which py-spy --locals reads; a script whose loop runs at module level has no frame variables
#   py-spy can read, and then its source naming DistributedDataParallel is the evidence) and the
#   process uses no GPU (on a GPU the main thread also sleeps
#   in backward while the device computes). A busy backward is computing.
# - Work.wait() of an async collective (c10d::Work::wait, WorkNCCL::wait), the c10d store's waits
#   (c10d::TCPStore): native frames only.
# - A CUDA synchronisation (cudaStreamSynchronize under loss.item(), .cpu(), an event) is a wait for
#   a collective only when one is pending on that stream, which py-spy cannot see: the reading says
#   it cannot tell, and that the CPU may spin there (its CPU time is then no evidence of progress).

from __future__ import annotations

from typing import Sequence

# The Python frames' part of the rule is shared with the guard, which reads its own process.
from distdoctor.diagnosis.waits import (BACKWARD_DDP, DDP_TYPES, Reading, backward_wait, fsdp_context, in_backward,
                                        python_wait)
from distdoctor.stacks.pyspy import RawFrame, Thread

__all__ = ["BACKWARD_DDP", "DDP_TYPES", "STORE_WAIT", "Reading", "fsdp_context", "in_collective", "read_wait"]

# Native frames of a wait on an async collective's Work, by backend.
_WORK_WAIT = (("WorkNCCL::wait", "NCCL"), ("WorkNCCL::synchronize", "NCCL"), ("ProcessGroupNCCL", "NCCL"),
              ("ProcessGroupGloo", "Gloo"), ("gloo::", "Gloo"), ("c10d::Work::wait", ""), ("c10d::ProcessGroup", ""))
_STORE = ("c10d::TCPStore::", "c10d::PrefixStore::", "c10d::detail::TCPClient", "c10d::Store::", "c10d::FileStore::",
          "c10d::HashStore::")
# The CPU waiting for the GPU: CUDA's runtime and driver synchronisations, and the copies that imply one.
_CUDA_SYNC = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
              "cuEventSynchronize", "cuCtxSynchronize", "cudaMemcpy", "cuMemcpy", "hipStreamSynchronize",
              "hipDeviceSynchronize", "hipMemcpy")
STORE_WAIT = "a c10d store wait (TCPStore)"


def _native(frames: Sequence[RawFrame], names: Sequence[str], *, outermost: bool = False) -> str | None:
    """The innermost (or outermost) native frame whose function names one of names."""
    ordered = reversed(frames) if outermost else frames
    return next((f.function for f in ordered if f.native and any(n in f.function for n in names)), None)


def _native_wait(thread: Thread, others: Sequence[Thread]) -> Reading | None:
    """A wait told by C/C++ frames alone: DDP's reducer, a Work, the store, a CUDA synchronisation."""
    frames = thread.frames
    reducer = _native(frames, ("c10d::Reducer::",))
    if reducer is not None:
        return Reading(BACKWARD_DDP, f"native frames show {reducer}: DDP's reducer waits for the gradient all-reduce")
    if thread.idle and in_backward(frames):
        # A CUDA backward: the main thread waits for autograd's device thread, which runs DDP's
        # reducer (a thread with no Python name: py-spy lists it for its native frames).
        helper = next((_native(t.frames, ("c10d::Reducer::",)) for t in others
                       if t is not thread and _native(t.frames, ("c10d::Reducer::",))), None)
        if helper is not None:
            return Reading(BACKWARD_DDP, f"its main thread waits for autograd's device thread, whose native frames "
                                         f"show {helper}: DDP's reducer waits for the gradient all-reduce")
    work = next(((f.function, backend) for f in frames if f.native for name, backend in _WORK_WAIT if name in f.function), None)
    if work is not None:
        fsdp = fsdp_context(frames)
        what = fsdp or f"Work.wait() of an async {work[1] + ' ' if work[1] else ''}collective"
        return Reading(what, f"native frames show {work[0]}", may_spin=_native(frames, _CUDA_SYNC) is not None)
    store = _native(frames, _STORE)
    if store is not None and thread.idle:
        return Reading(STORE_WAIT, f"native frames show {store}")
    sync = _native(frames, _CUDA_SYNC, outermost=True)  # the runtime's call (cudaStreamSynchronize), not the driver's
    if sync is not None:
        return Reading(None, f"in a CUDA synchronisation ({sync}): a wait for a collective only if one is pending on "
                             "that stream, which py-spy cannot see (cannot tell; the guard's flight recorder can)",
                       may_spin=True)
    return None


def read_wait(thread: Thread, *, native: bool, ddp: bool | str = False, gpu: bool = False,
              others: Sequence[Thread] = ()) -> Reading:
    """What the thread waits in (see the module's comment). ddp: the rank's model is known to be
    DDP (a text: how that is known); gpu: its process uses a GPU; others: the process's other threads (from the same dump)."""
    found = python_wait(thread.frames)
    if found is not None:
        return found
    if native:
        found = _native_wait(thread, others)
        if found is not None:
            return found
    fsdp = fsdp_context(thread.frames)
    if fsdp is not None and thread.idle and not native:
        return Reading(None, f"idle in {fsdp} outside any c10d call (Work.wait() or a stream wait): --native tells "
                             "which (cannot tell)")
    return backward_wait(thread.frames, idle=thread.idle, ddp=ddp, gpu=gpu, native=native) or Reading()


def in_collective(thread: Thread, *, native: bool, ddp: bool | str = False, gpu: bool = False,
                  others: Sequence[Thread] = ()) -> tuple[str | None, str]:
    """(the operation the thread waits in or None, a note on how it was told)."""
    found = read_wait(thread, native=native, ddp=ddp, gpu=gpu, others=others)
    return found.op, found.note
