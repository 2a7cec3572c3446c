"""Rank bodies for test_recorder_dumps: real gloo worlds that leave torch's flight-recorder dumps behind."""

from __future__ import annotations

import json
import time


def dumps_after_dtype_mismatch(out: str) -> None:
    """Rank 0 all-reduces 3 float32, rank 1 3 int32 (as many bytes: gloo runs it); both dump, in both formats."""
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    rank = dist.get_rank()
    dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(3, dtype=torch.float32 if rank == 0 else torch.int32))
    time.sleep(0.5)  # gloo marks completion from its own thread
    with open(f"{out}/json/dump-{rank}.json", "w") as handle:
        json.dump(json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False)), handle)
    # The pickle that TORCH_FR_DUMP_TEMP_FILE=<prefix> would leave as <prefix><rank>.
    with open(f"{out}/pickle/nccl_trace_rank_{rank}", "wb") as handle:
        handle.write(_dump_fr_trace(includeCollectives=True, includeStackTraces=False, onlyActive=False))
