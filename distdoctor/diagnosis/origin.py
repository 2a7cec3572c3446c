"""Whether an exception came out of torch.distributed (a peer's failure seen here) or from the rank's own code."""

# A peer that died, raised or left makes this rank's next collective fail: that failure is a
# consequence, and the cause is elsewhere. What decides is where the exception was raised, never
# its words: a user's `TimeoutError('Read timed out.')` (what `requests` raises on a slow storage
# read) or an `OSError` from a file system is that rank's own failure at its own line, whatever it
# says. torch.distributed raises in two ways:
#   - its own error types: DistError and its subclasses (DistBackendError, DistNetworkError,
#     DistStoreError; the NCCL and store failures);
#   - a C++ error surfaced as RuntimeError whose message starts with the C++ source location it
#     was raised at (`[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error ...`, also
#     out of `loss.backward()` when DDP's reducer ran the collective): a location inside gloo, c10d
#     or NCCL is torch.distributed's.
# Anything else (the user's exceptions, a library's, torch's own argument checks) is the rank's own.

from __future__ import annotations

import re
from typing import Iterable

DIST_ERRORS = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
_CPP_LOCATION = re.compile(r"^\[(?P<file>[^\]\s]+\.(?:cc|cpp|cu|cuh|h|hpp)):\d+\]")
_DIST_SOURCES = ("/gloo/", "gloo/", "/c10d/", "c10d/", "/distributed/", "ProcessGroup", "nccl", "NCCL", "Store.c")


def cpp_location(message: str) -> str | None:
    """The C++ source file a c10::Error / gloo::Exception message says it was raised at, if any."""
    match = _CPP_LOCATION.match(message.lstrip())
    return match.group("file") if match else None


def from_torch_distributed(type_names: Iterable[str], message: str) -> bool:
    """True when the exception (its class and base class names, innermost first) was raised by
    torch.distributed: a DistError, or a C++ error raised in gloo, c10d or NCCL code."""
    names = list(type_names)
    if DIST_ERRORS.intersection(names):
        return True
    if "RuntimeError" not in names:
        return False
    where = cpp_location(message or "")
    return where is not None and any(part in where for part in _DIST_SOURCES)


def exception_origin_is_distributed(exc: BaseException) -> bool:
    """from_torch_distributed for a live exception (its class hierarchy is known)."""
    names = [cls.__name__ for cls in type(exc).__mro__]
    return from_torch_distributed(names, str(exc))
