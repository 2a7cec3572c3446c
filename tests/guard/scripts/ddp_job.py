"""The DDP tutorial's training loop (or FSDP's) with one fault chosen by argv; it knows nothing of distdoctor.

Faults: straggler, raise, kill, uneven. pauses is a healthy job that only pauses: rank 1 takes 0.3 s for
each of the first 20 batches (a slow data loader), then rank 0 saves a checkpoint alone for 8 s; anything
else (healthy) runs clean."""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

fault = sys.argv[1]
wrapper = sys.argv[2] if len(sys.argv) > 2 else "ddp"
store_file = sys.argv[3] if len(sys.argv) > 3 else ""
if store_file:  # a FileStore job: torchrun's RANK / WORLD_SIZE, a file instead of the TCPStore
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))
if wrapper == "fsdp":
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(net)
else:
    model = DDP(net)
loss_fn = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.001)


def _save_snapshot(seconds):
    """The DDP tutorial's rank-0-only checkpoint: rank 0 writes it alone while the others go on."""
    time.sleep(seconds)  # LINE:checkpoint


steps = 6 + (1 if fault == "uneven" and rank == world - 1 else 0)  # the last rank got one batch more
steps = 22 if fault == "pauses" else steps
for step in range(steps):
    if fault == "pauses" and rank == 1 and step < 20:
        time.sleep(0.3)  # LINE:loader (a slow data loader: every step, each shorter than any timeout)
    if fault == "pauses" and rank == 0 and step == 20:
        _save_snapshot(8.0)
    if fault == "straggler" and rank == 1 and step == 3:
        print(f"rank 1 sleeps from {time.time():.3f}", flush=True)
        time.sleep(120)  # LINE:sleep
    if fault == "raise" and rank == 1 and step == 3:
        raise ValueError(f"bad batch at step {step}")  # LINE:raise
    if fault == "kill" and rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # LINE:kill
    optimizer.zero_grad()
    loss = loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5))
    loss.backward()  # LINE:backward
    optimizer.step()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
