"""What a main thread's Python stack waits in, told from what its frames are: the rule `stacks` and the guard share."""

# torch's collectives are Python functions of torch/distributed/distributed_c10d.py
# (all_reduce, barrier, recv, all_gather_object -> all_gather ...): the outermost such frame is
# what the user called, and FSDP's frames around it say which of FSDP's collectives it is.
# DDP's gradient all-reduce has no Python frame of its own: it runs inside `loss.backward()`
# (autograd's engine: torch/autograd/graph.py's _engine_run_backward, torch/autograd/__init__.py's
# backward on older torch), where the main thread waits in the reducer. A main thread idle inside
# backward is DDP's all-reduce when the model is DDP and the process uses no GPU (on a GPU the
# main thread also sleeps in backward while the device computes); a busy backward is computing.
# Who reads the stack decides what "idle" and "the model is DDP" rest on: `stacks` reads another
# process with py-spy (its idle flag, --locals, native frames: distdoctor.stacks.collective),
# the guard reads its own process (the main thread's CPU time and kernel state, the frames'
# objects: distdoctor.embedded.guard.mainthread). Frames are given innermost first, each with
# `file`, `function` and, from py-spy, `native` (a C/C++ frame: never matched here).

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from distdoctor.diagnosis.frames import is_user_file

C10D_FILE = re.compile(r"(^|[/\\])torch[/\\]distributed[/\\]distributed_c10d\.py$")
BACKWARD_FILE = re.compile(r"(^|[/\\])torch[/\\]autograd[/\\](graph|__init__)\.py$")
DDP_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\]parallel[/\\]distributed\.py$")
FSDP_FILE = re.compile(r"(^|[/\\])torch[/\\]distributed[/\\](fsdp|_composable[/\\]fsdp)[/\\]")
# distributed_c10d functions that are not a collective the user waits in.
NOT_OPS = frozenset({"wrapper", "_get_default_group", "get_rank", "get_world_size", "is_initialized", "_rank_not_in_group",
                     "_check_single_tensor", "_check_tensor_list", "_warn_not_in_group", "_get_group_size",
                     "_canonicalize_group_rank", "_coalescing_manager", "_store_based_barrier",
                     "_new_process_group_helper"})
DDP_INIT = frozenset({"_verify_param_shape_across_processes", "_sync_module_states", "_sync_params_and_buffers",
                      "__init__"})
# Models whose backward or forward holds collectives, by their class name.
DDP_TYPES = ("DistributedDataParallel",)

BACKWARD_DDP = "backward (DDP's gradient all-reduce)"
_MAX_SOURCE_BYTES = 1 << 20
_DDP_NAME = re.compile(rb"\bDistributedDataParallel\b")


@dataclass(frozen=True)
class Reading:
    """What the stack shows the thread doing, as far as it can be told."""

    op: str | None = None          # the wait, named as the user would know it; None: in none, or cannot tell
    note: str = ""                 # how it was told, or what could not be told
    may_spin: bool = False         # the CPU may spin here without progress (its CPU time is no evidence)


def outermost(frames: Sequence[Any], pattern: re.Pattern, exclude: frozenset[str] = frozenset()) -> Any | None:
    """The outermost Python frame in a file matching pattern (frames innermost first)."""
    for frame in reversed(frames):
        if not getattr(frame, "native", False) and pattern.search(frame.file) and frame.function not in exclude:
            return frame
    return None


def in_backward(frames: Sequence[Any]) -> bool:
    """Inside `loss.backward()`: autograd's engine is on the stack."""
    return outermost(frames, BACKWARD_FILE) is not None


def fsdp_context(frames: Sequence[Any]) -> str | None:
    """Which of FSDP's collectives FSDP's own frames (FSDP2's fully_shard or FSDP1) are in."""
    names = [f.function.rsplit(".", 1)[-1] for f in frames if not getattr(f, "native", False) and FSDP_FILE.search(f.file)]
    if not names:
        return None
    if any("reduce" in n or "post_backward" in n for n in names):
        return "FSDP's gradient reduce-scatter, in backward"
    if any("all_gather" in n or "unshard" in n for n in names):
        phase = ("before forward" if any("pre_forward" in n for n in names) else
                 "in backward" if any("pre_backward" in n or "backward" in n for n in names) else "")
        return "FSDP's parameter all-gather" + (f", {phase}" if phase else "")
    return None


def fsdp_wait(frames: Sequence[Any], *, idle: bool, gpu: bool | None) -> Reading | None:
    """Idle in FSDP's own frames outside any c10d call: the Work.wait() of FSDP's async collective
    when the process uses no GPU (there is no stream to wait for); otherwise it cannot tell (a
    Work.wait() or a stream wait). None when the stack is not idle in FSDP."""
    fsdp = fsdp_context(frames)
    if fsdp is None or not idle:
        return None
    if gpu is False:
        return Reading(fsdp, f"idle in {fsdp} of a process that uses no GPU: the Work.wait() of FSDP's collective")
    return Reading(None, f"idle in {fsdp} outside any c10d call (Work.wait() or a stream wait): which cannot tell")


def python_wait(frames: Sequence[Any]) -> Reading | None:
    """A wait that has a Python frame of its own: a c10d function (what the user called, with
    FSDP's context), DDP's construction (its parameter check and broadcast); None otherwise."""
    c10d = outermost(frames, C10D_FILE, NOT_OPS)
    if c10d is not None:
        if c10d.function == "init_process_group":
            return Reading("init_process_group (rendezvous)")
        fsdp = fsdp_context(frames)
        return Reading(f"{c10d.function} ({fsdp})" if fsdp else c10d.function)
    ddp = outermost(frames, DDP_FILE)
    if ddp is not None and ddp.function in DDP_INIT:
        return Reading("DistributedDataParallel() (parameter check and broadcast)")
    return None


def backward_wait(frames: Sequence[Any], *, idle: bool, ddp: bool | str, gpu: bool | None,
                  native: bool = False) -> Reading | None:
    """Inside `loss.backward()`: DDP's gradient all-reduce, computing, or cannot tell; None when the
    stack is not in backward. idle: the thread uses no CPU; ddp: the rank's model is known to be
    DDP (a text: how that is known); gpu: its process uses a GPU (None: not known); native: the
    frames include C/C++ ones, and none of them showed a collective."""
    if not in_backward(frames):
        return None
    if native and idle:
        return Reading(None, "idle inside loss.backward() with no collective among any thread's native frames: waiting "
                             "for autograd's other threads (on a GPU, the device's work) — not a collective (cannot tell "
                             "more)")
    if native:
        return Reading(None, "in backward, with no collective among its native frames: computing")
    if not idle:
        return Reading(None, "in backward and on a CPU: computing, not waiting")
    if gpu:
        return Reading(None, "idle inside loss.backward() of a process that uses a GPU, where the main thread also "
                             "sleeps while the device computes: whether it waits in DDP's all-reduce cannot tell "
                             "without --native")
    if ddp:
        seen = ddp if isinstance(ddp, str) else "seen among its frames' variables"
        return Reading(BACKWARD_DDP, f"its main thread is idle inside loss.backward() of a DistributedDataParallel model "
                                     f"({seen}): DDP's gradient all-reduce (--native shows the c10d::Reducer frame "
                                     "that confirms it)")
    return Reading(None, "idle inside loss.backward(), but no DistributedDataParallel model was seen among its frames' "
                         "variables: whether it waits in a collective cannot tell without --native")


# A training loop written at module level has no function frame whose variables name the model;
# its script's source does: a user's file that names DistributedDataParallel wraps its model in it.
@lru_cache(maxsize=256)
def _names_ddp(path: str, mtime_ns: int) -> bool:
    try:
        with open(path, "rb") as fh:
            return bool(_DDP_NAME.search(fh.read(_MAX_SOURCE_BYTES)))
    except OSError:
        return False


def file_names_ddp(path: str) -> bool:
    """True when the file (the user's, readable here; not torch's or an installed package's) names
    DistributedDataParallel; read at most 1 MiB, once per modification time."""
    if not is_user_file(path):
        return False
    try:
        return _names_ddp(path, os.stat(path).st_mtime_ns)
    except OSError:
        return False
