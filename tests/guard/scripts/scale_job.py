"""A DDP loop on gloo with many ranks, guarded from a warmed-up start: one rank sleeps before a step
(the straggler) or none does (the healthy twin). argv: late rank (-1: none), sleep s, hang timeout s, steps."""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import distdoctor

late, sleep_s, hang_timeout, steps = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
loss_fn, optimizer = nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.001)
# Every rank is up before the guard starts: on a loaded 2-core machine 48 ranks take tens of seconds to
# import torch, and that start-up skew is a real stall of its own, not the one measured here.
dist.barrier()
distdoctor.guard(hang_timeout=hang_timeout)
for step in range(steps):
    if rank == late and step == 3:
        print(f"rank {rank} sleeps from {time.time():.3f}", flush=True)
        time.sleep(sleep_s)  # LINE:sleep
    optimizer.zero_grad()
    loss = loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5))
    loss.backward()  # LINE:backward
    optimizer.step()
    time.sleep(0.5)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
