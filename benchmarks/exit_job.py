"""A healthy 4-rank DDP loop on gloo that ends as most scripts do (destroy_process_group, no barrier): exit_abort.py's job."""

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
dist.destroy_process_group()
