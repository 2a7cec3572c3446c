"""Whether an exception came out of torch.distributed (a peer's failure seen here) or from the rank's own code."""

# A peer that died, raised or left makes this rank's next collective fail: that failure is a
# consequence, and the cause is elsewhere. What decides is where the exception was raised, never
# its words: a user's `TimeoutError('Read timed out.')` (what `requests` raises on a slow storage
# read), an `OSError` from a file system or a `RuntimeError("Timed out waiting for the dataset
# server")` at the user's own line is that rank's own failure, whatever it says. torch.distributed
# raises in three ways:
#   - its own error types: DistError and its subclasses (DistBackendError, DistNetworkError,
#     DistStoreError; the NCCL and store failures);
#   - a C++ error surfaced as RuntimeError whose message names the C++ source location it was
#     raised at (`[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error ...`, torch 1.x's
#     `NCCL error in: ../torch/lib/c10d/ProcessGroupNCCL.cpp:825, ...`, also out of
#     `loss.backward()` when DDP's reducer ran the collective): a location inside gloo, c10d or
#     NCCL is torch.distributed's;
#   - a RuntimeError raised while torch.distributed's Python code was the innermost frame (a
#     collective's `work.wait()` in distributed_c10d.py, a store wait in the rendezvous): release
#     builds of older torch print C++ errors without their location.
# Anything else raised in the user's code or a library is the rank's own; a RuntimeError whose
# innermost frame is torch's (not torch.distributed's) and which names no location, or an exception
# line read without its traceback, has an origin these texts cannot show (UNKNOWN): the caller
# decides by what else it knows (explain: whether the text is one torch.distributed prints).
# KeyboardInterrupt and torchelastic's SignalException are a signal sent from outside (the launcher
# ending its workers), never the rank's own failure.

from __future__ import annotations

import re
from typing import Iterable, Sequence

DIST_ERRORS = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
SIGNAL_TYPES = frozenset({"SignalException", "KeyboardInterrupt"})
DISTRIBUTED, OWN, UNKNOWN = "distributed", "own", "unknown"
_CPP_LOCATION = re.compile(r"^\[(?P<file>[^\]\s]+\.(?:cc|cpp|cu|cuh|h|hpp)):\d+\]")
# torch 1.x's NCCL and c10d errors: "NCCL error in: <file>:<line>, ..." / "... at <file>:<line>".
_CPP_LOCATION_IN = re.compile(r"\b(?:error in|at): (?P<file>[^\s,:]{1,300}\.(?:cc|cpp|cu|cuh|h|hpp)):\d+")
_DIST_SOURCES = ("/gloo/", "gloo/", "/c10d/", "c10d/", "/distributed/", "ProcessGroup", "nccl", "NCCL", "Store.c")
# torch.distributed's Python tree (a frame's file), and torch's tree as a whole.
_DIST_TREE = re.compile(r"(^|[/\\])torch[/\\]distributed[/\\]")
_TORCH_TREE = re.compile(r"(^|[/\\])torch[/\\]")


def cpp_location(message: str) -> str | None:
    """The C++ source file a c10::Error / gloo::Exception message says it was raised at, if any."""
    text = (message or "").lstrip()
    match = _CPP_LOCATION.match(text) or _CPP_LOCATION_IN.search(text[:400])
    return match.group("file") if match else None


def origin_of(type_names: Iterable[str], message: str, frame_files: Sequence[str] = (),
              traceback_read: bool = False, innermost_code: str = "") -> str:
    """DISTRIBUTED, OWN or UNKNOWN: where the exception (its class and base class names, innermost
    first; the files of its traceback's frames, innermost last) was raised.

    traceback_read: the frames given are the whole traceback (an exception read with its traceback,
    or a live one); without it, no frames say nothing about where it was raised. innermost_code: the
    source line of the innermost frame, when shown: a RuntimeError whose innermost frame is the
    user's and whose line is not a `raise` came out of a native call on that line (a store's or a
    Work's binding called directly), which may be torch.distributed's.
    """
    names = list(type_names)
    if DIST_ERRORS.intersection(names):
        return DISTRIBUTED
    where = cpp_location(message or "")
    runtime = "RuntimeError" in names
    if runtime and where is not None:
        return DISTRIBUTED if any(part in where for part in _DIST_SOURCES) else OWN
    innermost = frame_files[-1] if frame_files else ""
    if runtime and innermost and _DIST_TREE.search(innermost):
        return DISTRIBUTED
    if innermost and not runtime:
        return OWN  # raised in the user's code or a library: its own, whatever it says
    if innermost and not _TORCH_TREE.search(innermost) and innermost_code.lstrip().startswith("raise"):
        return OWN  # the user's (or a library's) own `raise RuntimeError(...)`
    if traceback_read and not runtime:
        return OWN  # torch.distributed raises its own types or RuntimeError
    return UNKNOWN


def from_torch_distributed(type_names: Iterable[str], message: str, frame_files: Sequence[str] = ()) -> bool:
    """True when the exception was raised by torch.distributed: a DistError, or a C++ error raised in
    gloo, c10d or NCCL code (by the location its message names, or torch.distributed's innermost frame)."""
    return origin_of(type_names, message, frame_files) == DISTRIBUTED


def exception_origin_is_distributed(exc: BaseException) -> bool:
    """from_torch_distributed for a live exception (its class hierarchy and traceback are known)."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    files = []
    tb = exc.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    return from_torch_distributed(names, str(exc), files)
