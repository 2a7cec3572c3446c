"""Rank bodies for test_flight_recorder: real gloo worlds whose recorder dumps the tests read."""

from __future__ import annotations

import json
import time


def dump_after_mismatch(out: str) -> None:
    """Rank 0 all-reduces 3 float32, rank 1 3 int32: as many bytes, so gloo moves them anyway."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    dist.all_reduce(torch.ones(2))
    dist.all_reduce(torch.ones(3, dtype=torch.float32 if rank == 0 else torch.int32))
    _write(out, rank, _dump_once_completed())


def dump_while_waiting(out: str) -> None:
    """Rank 0 dumps from a thread while it waits in a barrier that rank 1 joins 2 s late."""
    import threading

    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace_json

    seen: dict = {}
    if dist.get_rank() == 0:
        def dump() -> None:
            time.sleep(1.0)
            seen.update(json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False)))
        thread = threading.Thread(target=dump)
        thread.start()
        dist.barrier()
        thread.join()
    else:
        time.sleep(2.0)
        dist.barrier()
    _write(out, dist.get_rank(), seen)


def dump_after_a_dropped_send(out: str) -> None:
    """Rank 0 posts an isend nobody receives (its Work dropped), then both ranks all-reduce three times:
    gloo's pg_status counts the send on rank 0 alone (its op numbers), the entries number collectives."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank == 0:
        dist.isend(torch.ones(4), dst=1, tag=7)
    for _ in range(3):
        dist.all_reduce(torch.ones(2))
    _write(out, rank, _dump_once_completed())
    dist.barrier()


def _dump_once_completed() -> dict:
    """The recorder's dump once it shows every call completed: gloo marks completion from its own
    thread, later than the call returns (a fixed 0.5 s was not enough under load); bounded by 30 s."""
    from torch._C._distributed_c10d import _dump_fr_trace_json

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = json.loads(_dump_fr_trace_json(includeCollectives=False, onlyActive=False)).get("pg_status", {})
        if all(int(g.get("last_completed_collective", -1)) >= int(g.get("last_enqueued_collective", 0))
               for g in status.values()):
            break
        time.sleep(0.05)
    return json.loads(_dump_fr_trace_json(includeCollectives=True, onlyActive=False))


def _write(out: str, rank: int, dump: dict) -> None:
    with open(f"{out}/dump-{rank}.json", "w") as handle:
        json.dump(dump, handle)
