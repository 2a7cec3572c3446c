# Run with: torchrun --standalone --nproc-per-node=2 train_preflight.py
import logging
import time

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import distdoctor

logging.basicConfig(level=logging.INFO)  # rank 0 logs one "distdoctor preflight: ok ..." line

# torch's arguments; a group that cannot form fails within 60 s, naming why.
distdoctor.init_process_group("gloo", rendezvous_timeout=60)

torch.manual_seed(0)  # the same seed on every rank
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
loader = DataLoader(data, sampler=DistributedSampler(data), batch_size=32)

# Raises distdoctor.PreflightError on every rank if anything is wrong; returns the report if not.
report = distdoctor.preflight(model=model, dataloader=loader, timeout=60)

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
# Let every rank finish before tearing down, then leave torch's gloo threads a moment to free their
# last work before the interpreter finalizes: without both, torch 2.13 + gloo + DDP aborted at exit
# ("terminate called without an active exception"; docs/api.md says how often).
torch.distributed.barrier()
torch.distributed.destroy_process_group()
time.sleep(0.2)
