"""A small training loop that fails the way SCENARIO says (torchrun, gloo): crash, uneven, straggler,
sigkill, ddp_uneven (a DDP model, rank 1 with one batch more), or healthy (no failure)."""

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

STEPS = 6
FAIL_STEP = 3


def main() -> None:
    scenario = os.environ["SCENARIO"]
    # The default group keeps torch's long timeout (a rank slow to import torch on a loaded machine
    # must not fail the start); the loop's group has the short one the scenarios are about.
    dist.init_process_group("gloo")
    if scenario == "ddp_uneven":
        ddp_loop()
        return
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=5))
    rank = dist.get_rank()
    steps = STEPS + (1 if scenario == "uneven" and rank == 1 else 0)
    for step in range(steps):
        if step == FAIL_STEP and rank == 1:
            if scenario == "crash":
                raise ValueError(f"bad batch on rank {rank}")
            if scenario == "straggler":
                time.sleep(30)
            if scenario == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
        t = torch.ones(4)
        dist.all_reduce(t, group=group)
        print(f"rank {rank} step {step} loss {t.sum().item():.1f}", flush=True)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


def ddp_loop() -> None:
    """DistributedDataParallel where rank 1's loader has one batch more: rank 0 leaves after its last
    batch, rank 1's backward then all-reduces gradients with a peer that is gone."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = STEPS + (1 if rank == 1 else 0)
    for step in range(batches):
        optimizer.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        optimizer.step()
        print(f"rank {rank} step {step} loss {loss.item():.3f}", flush=True)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if os.environ.get("RECORD"):
        from torch.distributed.elastic.multiprocessing.errors import record

        record(main)()
    else:
        main()
