"""A healthy 4-rank DDP loop on gloo that ends as most scripts do (destroy_process_group, no barrier): exit_abort.py's job."""

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(20):
    optimizer.zero_grad()
    nn.functional.mse_loss(model(torch.randn(8, 16)), torch.randn(8, 4)).backward()
    optimizer.step()
print(f"rank {rank} done", flush=True)
if sys.argv[1:] == ["barrier"]:  # every rank done before any tears down (exit_abort.py's -barrier kinds)
    dist.barrier()
if sys.argv[1:] == ["release"]:  # the model (which holds the process group) let go of first (-release kinds)
    del model, optimizer
dist.destroy_process_group()
if sys.argv[1:] == ["release"]:
    import gc

    gc.collect()
if sys.argv[1:] == ["pause"]:  # the GIL left free a moment before the interpreter finalizes (-pause kinds)
    import time

    time.sleep(0.2)
