# Run with: torchrun --standalone --nproc-per-node=2 catch_mismatch.py
import torch
import torch.distributed as dist
from torch import nn

import distdoctor

distdoctor.init_process_group("gloo")
rank = dist.get_rank()

torch.manual_seed(0)
width = 64 if rank == 1 else 32  # the bug: rank 1 reads another config
model = nn.Sequential(nn.Linear(16, width), nn.ReLU(), nn.Linear(width, 1))

try:
    distdoctor.preflight(model=model, timeout=30, wrap="later")  # DDP(model) comes after preflight
except distdoctor.PreflightError as error:
    # Raised on every rank, with the same report: no rank is left waiting in a collective.
    if rank == 0:
        print(error)  # the rendered report
    ids = sorted({finding.id for finding in error.report.findings})
    print(f"rank {rank}: preflight raised {ids}")
dist.destroy_process_group()
