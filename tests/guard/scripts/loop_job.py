"""A plain DDP loop on gloo, as a user writes it: no warm-up, the guard on from the process's start (`distdoctor
guard --`). argv: steps. The healthy job at scale: whatever its ranks' start-up skew, it must finish."""

import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1])
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    optimizer.zero_grad()
    model(torch.randn(20, 10)).sum().backward()
    optimizer.step()
    time.sleep(0.2)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
