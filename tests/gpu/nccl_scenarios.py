"""The guard's scenarios on NCCL: each rank on its own GPU (run by tests/gpu/test_guard_nccl.py)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import distdoctor
from distdoctor import GuardError


def _device() -> torch.device:
    torch.cuda.set_device(dist.get_rank())
    return torch.device("cuda", dist.get_rank())


def _raises(fn) -> GuardError:
    try:
        fn()
    except GuardError as exc:
        return exc
    raise AssertionError(f"no GuardError on rank {dist.get_rank()}")


def mismatches() -> None:
    device = _device()
    distdoctor.guard(verify="all")
    rank = dist.get_rank()
    shaped = torch.zeros((2, 3) if rank == 0 else (3, 2), device=device)
    err = _raises(lambda: dist.broadcast(shaped, src=0))
    assert [f.cause for f in err.report.findings] == ["shape_mismatch"], str(err)
    typed = torch.zeros(4, device=device, dtype=torch.float32 if rank == 0 else torch.float16)
    err = _raises(lambda: dist.all_reduce(typed))
    assert [f.cause for f in err.report.findings] == ["dtype_mismatch"], str(err)
    t = torch.ones(4, device=device)
    err = _raises(lambda: dist.broadcast(t, src=0) if rank == 0 else dist.all_reduce(t))
    assert [f.cause for f in err.report.findings] == ["collective_mismatch"], str(err)
    dist.all_reduce(t)  # the group still works
    torch.cuda.synchronize()
    assert t.tolist() == [2.0] * 4


def healthy() -> None:
    device = _device()
    g = distdoctor.guard(verify="all")
    for _ in range(20):
        t = torch.ones(8, device=device)
        dist.all_reduce(t)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        out = torch.zeros(16, device=device)
        dist.all_gather_into_tensor(out, t)
    torch.cuda.synchronize()
    time.sleep(0.6)  # the watchdog polls the NCCL Works: every call must have completed
    assert g.recorder.oldest_running() is None and g.findings == []


def straggler() -> None:
    device = _device()
    distdoctor.guard(hang_timeout=3)
    t = torch.ones(4, device=device)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if dist.get_rank() == 1:
        time.sleep(60)
    dist.all_reduce(t)  # returns at once on NCCL; the guard watches its Work
    torch.cuda.synchronize()
    raise AssertionError("the all_reduce completed although rank 1 sleeps")


def ddp_straggler() -> None:
    """DDP on NCCL; rank 1 sleeps before a step while rank 0's backward all-reduce waits (C++-issued)."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = _device()
    distdoctor.guard(hang_timeout=4)
    model = DDP(nn.Linear(10, 5).to(device), device_ids=[device.index])
    for step in range(6):
        if dist.get_rank() == 1 and step == 3:
            time.sleep(120)
        loss = model(torch.randn(20, 10, device=device)).sum()
        loss.backward()
        loss.item()  # logging: the host waits for the step
    raise AssertionError("the loop finished although rank 1 sleeps")


def slow_nccl_subgroup() -> None:
    """A gloo default group (idle) and an NCCL subgroup whose all_reduce waits ~8 s behind a kernel on
    rank 1's stream: every rank is in it past the hang timeout, and no socket shows NCCL's traffic. The
    guard must watch it (job.E009 not proven), never end it; the all_reduce completes."""
    device = _device()
    nccl = dist.new_group([0, 1], backend="nccl")
    distdoctor.guard(hang_timeout=3, on_hang="auto")
    t = torch.ones(4, device=device)
    dist.all_reduce(t, group=nccl)
    torch.cuda.synchronize()
    if dist.get_rank() == 1:
        started = time.monotonic()
        torch.cuda._sleep(100_000_000)  # calibrate: cycles per second on this GPU
        torch.cuda.synchronize()
        per_s = 100_000_000 / max(1e-3, time.monotonic() - started)
        torch.cuda._sleep(int(8 * per_s))  # the NCCL kernel below waits for this one
    dist.all_reduce(t, group=nccl)
    torch.cuda.synchronize()
    assert t.tolist() == [4.0] * 4, t
    time.sleep(2.0)  # the stall's owner closes its episode before the job ends
