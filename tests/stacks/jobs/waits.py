"""A 2-rank job that stops in one kind of wait on purpose, for recording real py-spy dumps: python waits.py CASE READY_DIR [BACKEND]."""

# Rank 1 sleeps (time.sleep) at the case's point; rank 0 goes on into the wait the case names and
# stays there, so `py-spy dump` on rank 0 shows that wait's real stack. With BACKEND nccl (a GPU
# machine) every tensor is on the rank's GPU and the CUDA cases run too. The cases:
#   ddp_backward      DDP's gradient all-reduce inside loss.backward()
#   fsdp2_all_gather  FSDP2 (fully_shard): the parameter all-gather before forward
#   fsdp2_reduce      FSDP2: the gradient reduce-scatter in backward (reshard_after_forward=False)
#   fsdp1_reduce      FSDP (FullyShardedDataParallel): the gradient reduce-scatter in backward
#   barrier           dist.barrier()
#   store_wait        the default store's wait() for a key no rank sets
#   recv              dist.recv from rank 1, which never sends
#   work_wait         all_reduce(async_op=True) and then Work.wait() (on a GPU, then synchronize())
#   work_wait_blocking (nccl) the same under TORCH_NCCL_BLOCKING_WAIT=1: WorkNCCL::wait itself waits
#   cuda_item         (nccl) an all_reduce queued on the GPU, then loss.item(): the CPU waits in a
#                     CUDA synchronisation with a collective pending on the stream
#   cuda_compute_item (nccl) no collective: GPU work, then .item(), in a loop (a healthy GPU job)

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

CASE, READY = sys.argv[1], sys.argv[2]
BACKEND = sys.argv[3] if len(sys.argv) > 3 else "gloo"


def ready(rank: int) -> None:
    with open(os.path.join(READY, f"rank{rank}"), "w") as fh:
        fh.write(str(os.getpid()))


def device() -> torch.device:
    if BACKEND == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def model_for(case: str, dev: torch.device) -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)).to(dev)
    if case.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            fully_shard(layer, reshard_after_forward=case == "fsdp2_all_gather")
        return fully_shard(model, reshard_after_forward=case == "fsdp2_all_gather")
    if case.startswith("fsdp1"):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=dev)
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model)


def stop_here(rank: int, step: int, point: str) -> None:
    """Rank 1 sleeps at the case's point; rank 0 goes on (into the wait)."""
    if step == 2 and point == {"fsdp2_reduce": "after_forward", "fsdp1_reduce": "after_forward",
                               "ddp_backward": "after_forward"}.get(CASE, "before_forward"):
        ready(rank)
        if rank == 1:
            time.sleep(3600)


def train(rank: int, dev: torch.device) -> None:
    model = model_for(CASE, dev)
    for step in range(10**6):
        stop_here(rank, step, "before_forward")
        loss = model(torch.randn(32, 64, device=dev)).sum()
        stop_here(rank, step, "after_forward")
        loss.backward()


def wait_alone(rank: int, dev: torch.device) -> None:
    ready(rank)
    if rank == 1:
        time.sleep(3600)
    if CASE == "barrier":
        dist.barrier()
    elif CASE == "store_wait":
        from torch.distributed.distributed_c10d import _get_default_store

        _get_default_store().wait(["distdoctor-never-set"], timedelta(seconds=3600))
    elif CASE == "recv":
        dist.recv(torch.zeros(4, device=dev), src=1)
    elif CASE in ("work_wait", "work_wait_blocking"):
        work = dist.all_reduce(torch.ones(4, device=dev), async_op=True)
        work.wait()  # NCCL: returns at once unless TORCH_NCCL_BLOCKING_WAIT=1 (work_wait_blocking)
        if dev.type == "cuda":
            torch.cuda.synchronize()  # the CPU waits for the stream the collective is pending on
    elif CASE == "cuda_item":
        total = torch.ones(1024, device=dev)
        dist.all_reduce(total)  # queued on the GPU; rank 1 never joins
        total.sum().item()      # the CPU waits here, in a CUDA synchronisation


def compute_items(rank: int, dev: torch.device) -> None:
    weights = torch.randn(4096, 4096, device=dev)
    for step in range(10**6):
        for _ in range(20):
            weights = torch.tanh(weights @ weights / 4096)
        weights.sum().item()
        if step == 2:
            ready(rank)


def main() -> None:
    dist.init_process_group(BACKEND, timeout=timedelta(seconds=3600))
    rank, dev = dist.get_rank(), device()
    if CASE in ("barrier", "store_wait", "recv", "work_wait", "work_wait_blocking", "cuda_item"):
        wait_alone(rank, dev)
    elif CASE == "cuda_compute_item":
        compute_items(rank, dev)
    else:
        train(rank, dev)


if __name__ == "__main__":
    main()
