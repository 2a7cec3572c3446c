"""Written for these tests in the style of pytorch/examples' ddp/ and multigpu.py (mp.spawn, one node)."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)  # expect: lint.I014


def demo_basic(rank, world_size):
    setup(rank, world_size)
    model = nn.Linear(10, 5).to(rank)
    ddp_model = DDP(model, device_ids=[rank])
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    optimizer.zero_grad()
    nn.MSELoss()(ddp_model(torch.randn(20, 10)), torch.randn(20, 5).to(rank)).backward()
    optimizer.step()
    if rank == 0:
        torch.save(ddp_model.state_dict(), "model.checkpoint")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(demo_basic, args=(world_size,), nprocs=world_size, join=True)
