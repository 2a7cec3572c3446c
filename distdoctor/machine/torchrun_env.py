"""What torchrun sets in its workers' environment that whatever stands in for it must set alike."""

from __future__ import annotations

from typing import Mapping


def worker_thread_default(env: Mapping[str, str], nproc: int) -> dict[str, str]:
    """OMP_NUM_THREADS=1 when several workers start and the variable is unset, as torch/distributed/run.py
    does ("Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"); {} otherwise.
    N ranks with a thread per core each spin on one another's cores."""
    return {"OMP_NUM_THREADS": "1"} if nproc > 1 and "OMP_NUM_THREADS" not in env else {}
